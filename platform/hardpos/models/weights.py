"""Which architectures and pretrained weights exist, and whether they can be had offline.

HardPos ships open_clip configs of its own (``hardpos-tiny``, ``hardpos-demo``: the testbed's
CLIP) that :func:`register_model_configs` adds to open_clip's list. :func:`check_model` is what a
stage runs before loading a model: an unknown architecture, a missing checkpoint or shipped base,
an unknown pretrained tag, or weights that are not cached on a machine that cannot reach the
Hugging Face Hub cost one line naming the key and the fix, not a minute of the hub client's
retries. Every error is :func:`hardpos.preflight.fail`'s ``key=value: problem; fix``.
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from hardpos import preflight, storage
from hardpos.config import ConfigError
from hardpos.models import bases
from hardpos.models.source import BASE_PREFIX, HF_HUB_PREFIX, WEIGHTS_SUFFIXES, carries_architecture, is_hf_hub

HUB_HOST = "huggingface.co"
TRUTHY = ("1", "true", "yes", "on")
_CONFIG_DIR = Path(__file__).resolve().parents[1] / "resources" / "model_configs"


def register_model_configs() -> None:
    """Register HardPos's bundled open_clip configs (idempotent, no I/O beyond the package)."""
    # lazy: open_clip imports torch (seconds); the CLI's checks import this module
    import open_clip

    known = set(open_clip.list_models())
    for path in sorted(_CONFIG_DIR.glob("*.json")):
        if path.stem not in known:
            open_clip.add_model_config(path)


def hub_offline() -> bool:
    """True when the Hugging Face Hub cannot be reached: HF_HUB_OFFLINE is set, or one TCP
    probe of the hub host (``HF_ENDPOINT`` when set) fails within ``hardpos.preflight.PROBE_TIMEOUT_S``."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUTHY:
        return True
    return preflight.reachable(os.environ.get("HF_ENDPOINT") or f"https://{HUB_HOST}") is not None


def _cached(repo_file: tuple[str, str] | None, url: str | None) -> bool:
    """Whether open_clip would find these weights without the network."""
    if repo_file is not None:
        # lazy: huggingface_hub only to read its cache index
        from huggingface_hub import try_to_load_from_cache

        repo, filename = repo_file
        found = try_to_load_from_cache(repo, filename)
        if isinstance(found, str) and os.path.exists(found):
            return True
    if url:
        cache = Path(os.path.expanduser("~/.cache/clip"))
        return (cache / os.path.basename(urlparse(url).path)).exists()
    return False


def weights_message(arch: str, tag: str) -> str:
    """The one line for weights that cannot be fetched (also raised by :func:`hardpos.models.clip.load_model`)."""
    return (f"could not fetch the {tag!r} weights of {arch}: no network? pass a local file, an s3:// checkpoint or "
            "an hf-hub: id in a local cache; HF_HUB_OFFLINE=1 makes this fail at once")


def check_model(key: str, arch: str, pretrained: str | None) -> None:
    """``arch`` is a known architecture; ``pretrained`` exists (a path / s3 object), is a tag of
    ``arch``, or an ``hf-hub:`` id -- and weights not in the local cache can be fetched."""
    # lazy: open_clip imports torch (seconds); only model-loading stages need it
    import open_clip
    from open_clip import pretrained as oc_pretrained

    register_model_configs()
    if not is_hf_hub(arch) and arch not in open_clip.list_models() and not (pretrained and carries_architecture(pretrained)):
        close = [m for m in open_clip.list_models() if m.lower().startswith(arch.lower()[:5])][:6]
        preflight.fail(f"{key}.arch", arch, "unknown architecture",
                       f"use one of open_clip.list_models() (e.g. {', '.join(close) or 'ViT-B-32, RN50'}), hardpos-tiny, "
                       "or hf-hub:<org>/<name>")
    if not pretrained:
        return
    if pretrained.startswith(BASE_PREFIX):
        try:
            bases.resolve(pretrained)
        except FileNotFoundError:
            preflight.fail(f"{key}.pretrained", pretrained, "no such shipped base",
                           f"use one of {bases.shipped() or '(none ship)'} (in {bases.BASES_DIR})")
        return
    if storage.is_s3(pretrained) or pretrained.startswith(("runs:/", "models:/")):
        return  # checked by the S3/tracking probes; the download itself names what is missing
    if is_hf_hub(pretrained):
        repo = pretrained[len(HF_HUB_PREFIX):]
        if not _cached((repo, "open_clip_config.json"), None) and hub_offline():
            preflight.fail(f"{key}.pretrained", pretrained,
                           "not in the local Hugging Face cache and the hub cannot be reached",
                           "download it on a machine with network (HF_HOME is the cache), or pass a local file")
        return
    if "/" in pretrained or pretrained.endswith(WEIGHTS_SUFFIXES) or Path(pretrained).exists():
        if not Path(pretrained).expanduser().exists():
            preflight.fail(f"{key}.pretrained", pretrained, "no such file or folder", "pass an existing checkpoint path")
        return
    if is_hf_hub(arch):
        return  # the model module explains a tag given with an hf-hub: architecture
    cfg = oc_pretrained.get_pretrained_cfg(arch, pretrained)
    if not cfg:
        tags = oc_pretrained.list_pretrained_tags_by_model(arch)
        preflight.fail(f"{key}.pretrained", pretrained, f"not a pretrained tag of {arch}",
                       f"use one of {tags or ['(none: pass a checkpoint path)']}")
    parts = (cfg.get("hf_hub") or "").rstrip("/").split("/")
    repo = "/".join(parts[:2]) if len(parts) >= 2 else None
    names = ["/".join(parts[2:])] if len(parts) > 2 else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
    if any(_cached((repo, n), None) for n in names if repo) or _cached(None, cfg.get("url")):
        return
    if hub_offline():
        error = ConfigError(f"{key}.pretrained={pretrained}: {weights_message(arch, pretrained)}")
        error.key = f"{key}.pretrained"
        raise error
