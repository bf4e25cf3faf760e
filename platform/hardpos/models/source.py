"""Model sources named as strings, read without torch: which kind a source is, and the file names
of a HardPos checkpoint folder.

A ``pretrained`` value is one of: an open_clip tag (``openai``), a local path, ``s3://...``,
``hf-hub:org/name``, an MLflow URI (``models:/name@alias``, ``runs:/id/path``) or a shipped base
(``base:<name>``). :mod:`hardpos.models.clip` loads each of them; what is here only parses, so the
CLI's checks and a config's validation answer before torch is imported.

A checkpoint folder is open_clip's own "local-dir" layout plus HardPos's metadata:
:data:`CONFIG_NAME`, :data:`WEIGHTS_NAME` and :data:`META_NAME`.
"""
from __future__ import annotations

from pathlib import Path

from hardpos import storage

CONFIG_NAME = "open_clip_config.json"
WEIGHTS_NAME = "open_clip_model.safetensors"
META_NAME = "hardpos.json"

MLFLOW_PREFIXES = ("models:/", "runs:/", "mlflow-artifacts:")
HF_HUB_PREFIX = "hf-hub:"  # open_clip's own schema for Hugging Face Hub models
BASE_PREFIX = "base:"  # a base that ships with the package (hardpos.models.bases)
WEIGHTS_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def is_hf_hub(source: str | None) -> bool:
    return bool(source) and str(source).startswith(HF_HUB_PREFIX)


def hub_repo_id(source: str) -> str:
    """``hf-hub:org/name`` -> ``org/name``; a malformed id is a ``ValueError`` naming the expected form."""
    repo = source[len(HF_HUB_PREFIX):]
    parts = repo.split("/")
    if not repo or len(parts) > 2 or not all(parts) or any(c.isspace() for c in repo):
        raise ValueError(f"{source!r}: expected hf-hub:<org>/<name> (a Hugging Face Hub model id)")
    return repo


def carries_architecture(pretrained: str) -> bool:
    """Whether the source brings its own architecture (a checkpoint folder, an hf-hub repo, an
    MLflow model, an S3 checkpoint, a shipped base), so a config's ``arch`` is not consulted."""
    return (pretrained.startswith((HF_HUB_PREFIX, "runs:/", "models:/", BASE_PREFIX)) or storage.is_s3(pretrained)
            or Path(pretrained).expanduser().is_dir())
