"""Shipped pretrained bases: the testbed's CLIP, pretrained once and committed with a manifest.

A base is two things side by side under a folder (the package's ``resources/bases`` for the
ones that ship):

* ``<name>/``      a HardPos checkpoint directory (:mod:`hardpos.models.clip`'s format, so
                   ``pretrained=<folder>/<name>`` loads it like any other checkpoint), its
                   weights stored as float16 to keep the file small (a float16 weight widens
                   to float32 exactly when loaded);
* ``<name>.json``  its manifest: how it was made (the exact command, the config, the git
                   commit, the seed), the sha256 of its weights file, the world config it was
                   pretrained on (and the curriculum world's, if any), and its benchmark numbers.

The world in the manifest is the contract between a base and the demo that finetunes it:
:func:`check_world` refuses a demo whose world differs from the one the base was pretrained
on, since the demo's benchmark is that world's held-out split (a base pretrained on another
world would be scored on scenes it was never meant for, or on its own training scenes).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hardpos.config import ConfigError
from hardpos.world.scene import WorldConfig
from hardpos.models.source import BASE_PREFIX, CONFIG_NAME, META_NAME, WEIGHTS_NAME

#: where the bases that ship with the package live
BASES_DIR = Path(__file__).resolve().parents[1] / "resources" / "bases"
MANIFEST_VERSION = 1
#: ``base:<name>`` names a base that ships with the package (``model.pretrained=base:hardpos-base``)
#: the testbed's base, the demo's default ``pretrained``
DEFAULT_BASE = "base:hardpos-base"


def shipped() -> list[str]:
    """The names of the bases that ship with the package (sorted)."""
    return sorted(p.stem for p in BASES_DIR.glob("*.json")) if BASES_DIR.is_dir() else []


def resolve(pretrained: str) -> Path:
    """The checkpoint folder of a shipped base named ``base:<name>``.

    Raises ValueError for a source without the ``base:`` scheme and FileNotFoundError,
    naming the bases that do ship, for an unknown name."""
    if not pretrained.startswith(BASE_PREFIX):
        raise ValueError(f"{pretrained!r} does not name a shipped base ({BASE_PREFIX}<name>)")
    name = pretrained[len(BASE_PREFIX):].strip("/")
    path = BASES_DIR / name
    if not name or "/" in name or not (path / "open_clip_config.json").is_file():
        raise FileNotFoundError(f"{pretrained}: no shipped base named {name!r} (shipped: {shipped() or 'none'}; "
                                f"they live in {BASES_DIR})")
    return path


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git_commit(cwd: str | Path | None = None) -> dict[str, Any]:
    """{"commit": HEAD or None, "dirty": bool or None} of the repository at ``cwd`` (the
    package's source tree by default); None values when git or the repository is absent."""
    cwd = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(status.strip())}


def world_dict(world: WorldConfig | dict) -> dict[str, Any]:
    """A world config as the JSON-plain dict a manifest stores (lists, not tuples)."""
    raw = dataclasses.asdict(world) if isinstance(world, WorldConfig) else dict(world)
    return json.loads(json.dumps(raw))


def write_base(checkpoint_dir: str | Path, dest: str | Path, name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write the checkpoint at ``checkpoint_dir`` as base ``name`` under ``dest``.

    The weights are cast to float16 (integer/bool buffers stay as they are); the config and
    HardPos metadata files are copied. ``manifest`` (command, config, world, benchmark ...) is
    completed with the name, the weights' file name, size, dtype and sha256, and written to
    ``<dest>/<name>.json``. Returns the completed manifest. Overwrites an earlier base of that name.
    """
    # lazy: the demo's Config checks a base's manifest at config load (manifest_for,
    # check_world), which must not wait for torch
    import torch
    from safetensors.torch import load_file, save_file

    src = Path(checkpoint_dir)
    if not (src / CONFIG_NAME).is_file() or not (src / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"{src}: not a HardPos checkpoint directory (needs {CONFIG_NAME} and {WEIGHTS_NAME})")
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"base name {name!r} must be a plain file name (no '/', not hidden)")
    dest = Path(dest)
    out = dest / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    state = load_file(str(src / WEIGHTS_NAME))
    half = {k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    save_file(half, str(out / WEIGHTS_NAME))
    for extra in (CONFIG_NAME, META_NAME):
        if (src / extra).is_file():
            shutil.copy2(src / extra, out / extra)
    weights = out / WEIGHTS_NAME
    full = {"manifest_version": MANIFEST_VERSION, "name": name, **manifest,
            "weights": {"file": f"{name}/{WEIGHTS_NAME}", "dtype": "float16", "bytes": weights.stat().st_size,
                        "sha256": sha256_file(weights)}}
    (dest / f"{name}.json").write_text(json.dumps(full, indent=2, sort_keys=False, default=str) + "\n")
    return full


def manifest_path(base_dir: str | Path) -> Path:
    """The manifest beside a base's checkpoint folder: ``<parent>/<folder name>.json``."""
    p = Path(base_dir)
    return p.parent / f"{p.name.rstrip('/')}.json"


def local_base_dir(pretrained: str | None) -> Path | None:
    """The local folder ``pretrained`` names when it may be a base: a shipped base's
    (``base:<name>``, ConfigError when none ships by that name) or a local path; None for an
    MLflow/S3/hub source or nothing."""
    if pretrained and pretrained.startswith(BASE_PREFIX):
        try:
            return resolve(pretrained)
        except FileNotFoundError as exc:
            raise ConfigError(f"pretrained={exc}") from exc
    if not pretrained or "://" in pretrained or ":" in pretrained.split("/", 1)[0]:
        return None
    return Path(pretrained).expanduser()


def manifest_for(pretrained: str | None) -> dict[str, Any] | None:
    """The manifest of ``pretrained`` when it is a shipped base (``base:<name>``) or a local base
    folder that has one, else None (any other checkpoint, an MLflow/S3/hub source, or nothing)."""
    base_dir = local_base_dir(pretrained)
    path = manifest_path(base_dir) if base_dir is not None else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"pretrained={pretrained}: its manifest {path} is not valid JSON ({exc})") from exc


def verify_base(base_dir: str | Path) -> dict[str, Any]:
    """The manifest of the base at ``base_dir``, after checking its weights' sha256 against it.
    Raises FileNotFoundError (no manifest or weights) or ValueError (hash mismatch)."""
    base_dir = Path(base_dir)
    mpath = manifest_path(base_dir)
    if not mpath.is_file():
        raise FileNotFoundError(f"{base_dir}: no manifest {mpath}")
    manifest = json.loads(mpath.read_text())
    weights = mpath.parent / manifest["weights"]["file"]
    if not weights.is_file():
        raise FileNotFoundError(f"{mpath}: its weights file {weights} is missing")
    digest = sha256_file(weights)
    if digest != manifest["weights"]["sha256"]:
        raise ValueError(f"{weights}: sha256 {digest} differs from its manifest's {manifest['weights']['sha256']} "
                         f"({mpath}); the weights were changed after the base was written")
    return manifest


def world_differences(manifest: dict[str, Any], world: WorldConfig | dict) -> dict[str, tuple[Any, Any]]:
    """{key: (the manifest's value, the given world's value)} for every world key that differs.

    A key the manifest lacks (a world setting added after the base was made) counts as its
    default: every new world setting defaults to the behaviour before it existed."""
    expected, got = {**world_dict(WorldConfig()), **(manifest.get("world") or {})}, world_dict(world)
    return {k: (expected.get(k), got.get(k)) for k in sorted(set(expected) | set(got)) if expected.get(k) != got.get(k)}


def check_world(manifest: dict[str, Any], world: WorldConfig | dict, *, source: str = "the base") -> None:
    """Raise ConfigError, naming every differing key, unless ``world`` is exactly the world
    the base of ``manifest`` was pretrained on."""
    if "world" not in manifest:
        raise ConfigError(f"{source}: its manifest records no world config; re-create it with the base stage (`hardpos base`)")
    diff = world_differences(manifest, world)
    if diff:
        shown = "; ".join(f"world.{k}={got!r} but the base was pretrained on {want!r}" for k, (want, got) in diff.items())
        raise ConfigError(f"{source} ({manifest.get('name', '?')}) was pretrained on another world: {shown}. "
                          f"Use the base's world (drop these overrides), or pretrain a base for this world "
                          f"(the demo's --from-scratch; `hardpos base` makes one to ship)")
