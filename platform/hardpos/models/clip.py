"""Loading, saving and encoding open_clip models: the one place every stage uses.

Model sources (``ModelConfig.pretrained``):

* ``None``                     random weights (tests, the synthetic world's "pretraining")
* an open_clip tag             ``openai``, ``laion2b_s34b_b79k`` ... (downloaded by open_clip)
* a local path                 a HardPos/open_clip checkpoint directory, or a weights file
* ``s3://...``                 the same, fetched through :mod:`hardpos.storage`
* ``hf-hub:org/name``          an open_clip model on the Hugging Face Hub (its
                               ``open_clip_config.json`` + weights), through open_clip's own
                               hub loader and the standard Hugging Face cache (``HF_HOME`` /
                               ``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1`` loads from the cache only)
* ``models:/name@alias`` / ``runs:/id/path``   an MLflow model logged by HardPos, looked up
                               in the store ``load_model(..., tracking_uri=)`` names
* ``base:<name>``               a base that ships with the package (:mod:`hardpos.models.bases`;
                               ``base:hardpos-base`` is the testbed's pretrained CLIP)

Checkpoint format (a directory): open_clip's own "local-dir" layout, so a plain
``open_clip.create_model_and_transforms("local-dir:DIR")`` loads it too:

* ``open_clip_config.json``      ``{"model_cfg": ..., "preprocess_cfg": ...}``
* ``open_clip_model.safetensors`` the state dict (safetensors: no pickle, safe to load)
* ``hardpos.json``               ``{"arch": ..., "source": ..., **metadata}``

QuickGELU: OpenAI's weights were trained with QuickGELU.  ``openai`` weights on a
non ``-quickgelu`` architecture get ``force_quick_gelu`` automatically, and the saved
config records ``quick_gelu`` so every later load (train, evaluate, serve) agrees.

Text encoding (:func:`encode_text`) runs the causal text tower on tokens trimmed to the
batch's longest caption instead of the full context (77 for CLIP).  With a causal mask
and end-of-text pooling this is exactly equal, and several times faster.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import open_clip
import torch
import torch.nn.functional as F
from open_clip.pretrained import download_pretrained_from_hf
from open_clip.push_to_hf_hub import save_config_for_hf
from open_clip.transformer import text_global_pool
from safetensors.torch import save_file

from hardpos import storage
from hardpos.config import ConfigError, ModelConfig
from hardpos.config.paths import resolve_tracking_uri
from hardpos.models import bases, weights
from hardpos.models.source import (BASE_PREFIX, CONFIG_NAME, META_NAME, MLFLOW_PREFIXES, WEIGHTS_NAME,
                                   WEIGHTS_SUFFIXES, hub_repo_id, is_hf_hub)
from hardpos.models.uri import download_model

log = logging.getLogger(__name__)





@dataclasses.dataclass
class LoadedModel:
    model: torch.nn.Module
    preprocess_train: Callable
    preprocess_val: Callable
    tokenizer: Callable
    arch: str
    model_cfg: dict[str, Any]
    meta: dict[str, Any]

    @property
    def context_length(self) -> int:
        return int(self.model_cfg.get("text_cfg", {}).get("context_length", 77))


# --------------------------------------------------------------------------- configs
def model_config_dict(arch: str, force_quick_gelu: bool = False) -> dict[str, Any]:
    """The open_clip model config of ``arch`` (a name, or ``hf-hub:org/name``: read from the hub repo)."""
    weights.register_model_configs()
    if is_hf_hub(arch):
        cfg = _hub_model_config(arch)
    else:
        cfg = open_clip.get_model_config(arch)
    if cfg is None:
        raise ValueError(f"unknown model architecture {arch!r}; known: {', '.join(open_clip.list_models())}")
    if force_quick_gelu:
        cfg["quick_gelu"] = True
    return cfg


# --------------------------------------------------------------------------- sources
def _is_checkpoint_dir(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG_NAME).is_file()


def find_checkpoint_dir(root: Path) -> Path | None:
    """The HardPos/open_clip checkpoint directory at or below ``root`` (shallowest)."""
    if _is_checkpoint_dir(root):
        return root
    hits = sorted(root.rglob(CONFIG_NAME), key=lambda p: len(p.parts))
    return hits[0].parent if hits else None


class HubModelError(RuntimeError):
    """An ``hf-hub:`` source could not be read (not in the cache while offline, no such repo, no config)."""


def _hub_config_path(source: str) -> Path:
    """The cached ``open_clip_config.json`` of a hub model (downloaded unless HF_HUB_OFFLINE is set)."""
    repo = hub_repo_id(source)
    try:
        return Path(download_pretrained_from_hf(repo, filename=CONFIG_NAME))
    except Exception as exc:  # huggingface_hub raises several types (offline, 404, gated, network)
        raise HubModelError(
            f"{source}: cannot read {CONFIG_NAME} from the Hugging Face Hub or its local cache "
            f"(HF_HUB_CACHE / HF_HOME; with HF_HUB_OFFLINE=1 only the cache is used): {exc}") from exc


def _hub_model_config(source: str) -> dict[str, Any]:
    return json.loads(_hub_config_path(source).read_text())["model_cfg"]


def hub_revision(source: str) -> str:
    """The commit of the hub snapshot a load used (the cache's ``snapshots/<commit>`` folder)."""
    return _hub_config_path(source).parent.name


def resolve_source(pretrained: str, *, tracking_uri: str | None = None) -> Path | str:
    """Turn any non-tag source into a local path; tags are returned unchanged.

    tracking_uri: the MLflow store (tracking + model registry) that ``models:/``,
        ``runs:/`` and ``mlflow-artifacts:`` sources are looked up in; stages pass their
        ``tracking.tracking_uri``. None -> ``$MLFLOW_TRACKING_URI``, else
        ``sqlite:///<cwd>/mlflow.db`` (where HardPos's stages log by default: the same file
        MLflow 3's own ``mlflow ui`` opens). MLflow's process-global URIs are neither read nor changed.
    ``hf-hub:org/name`` is returned unchanged (open_clip loads it through the Hugging Face
    cache); only its id's form is checked here (``ValueError``).
    Raises :class:`hardpos.models.uri.ModelNotFoundError` (naming the store) for an unknown
    registered model, alias, version or run; ``FileNotFoundError`` for a missing path.
    """
    if is_hf_hub(pretrained):
        hub_repo_id(pretrained)
        return pretrained
    if pretrained.startswith(BASE_PREFIX):
        return bases.resolve(pretrained)
    if pretrained.startswith(MLFLOW_PREFIXES):
        local = download_model(pretrained, resolve_tracking_uri(tracking_uri))
        found = find_checkpoint_dir(local)
        if found is None:
            raise FileNotFoundError(f"{pretrained}: no {CONFIG_NAME} found in the MLflow artifacts ({local})")
        return found
    if storage.is_s3(pretrained):
        # A single weights file, or a checkpoint directory (prefix).
        if pretrained.endswith(WEIGHTS_SUFFIXES):
            return storage.local_copy(pretrained)
        target = Path(tempfile.mkdtemp(prefix="hardpos-ckpt-"))
        storage.download_dir(pretrained, target)
        found = find_checkpoint_dir(target)
        if found is None:
            raise FileNotFoundError(f"{pretrained}: no {CONFIG_NAME} under this prefix")
        return found
    path = Path(pretrained).expanduser()
    if path.exists():
        if path.is_dir():
            found = find_checkpoint_dir(path)
            if found is None:
                raise FileNotFoundError(f"{pretrained}: a directory without {CONFIG_NAME}")
            return found
        return path
    if "/" in pretrained or pretrained.endswith(WEIGHTS_SUFFIXES):
        raise FileNotFoundError(f"model checkpoint not found: {pretrained}")
    return pretrained  # an open_clip pretrained tag


def load_model(cfg: ModelConfig, device: str | torch.device = "cpu", *, tracking_uri: str | None = None) -> LoadedModel:
    """Build the model described by ``cfg`` (see module docstring for sources).

    tracking_uri: the MLflow store MLflow sources (``models:/``, ``runs:/``) resolve in;
        a stage passes its ``tracking.tracking_uri`` (see :func:`resolve_source`).
    """
    weights.register_model_configs()
    source = resolve_source(cfg.pretrained, tracking_uri=tracking_uri) if cfg.pretrained else None
    meta: dict[str, Any] = {}
    tokenizer_name = cfg.arch
    if isinstance(source, Path) and source.is_dir():
        hp_meta = source / META_NAME
        meta = json.loads(hp_meta.read_text()) if hp_meta.is_file() else {}
        model_cfg = json.loads((source / CONFIG_NAME).read_text())["model_cfg"]
        arch = meta.get("arch", cfg.arch)
        model, pp_train, pp_val = open_clip.create_model_and_transforms(f"local-dir:{source}", device=device)
        tokenizer_name = f"local-dir:{source}"
    elif is_hf_hub(source) or is_hf_hub(cfg.arch):
        model, pp_train, pp_val, model_cfg, arch, meta = _load_hub_model(cfg, source, device)
        tokenizer_name = arch
    else:
        quick = cfg.force_quick_gelu
        if quick is None:
            quick = source == "openai" and not cfg.arch.endswith("-quickgelu")
        model_cfg = model_config_dict(cfg.arch, force_quick_gelu=bool(quick))
        arch = cfg.arch
        is_tag = isinstance(source, str) and not Path(source).exists()
        if is_tag:
            # weights not in the cache on an offline machine: one line now, not the hub's retries
            weights.check_model("model", cfg.arch, source)
        try:
            model, pp_train, pp_val = open_clip.create_model_and_transforms(
                cfg.arch,
                pretrained=str(source) if source is not None else None,
                force_quick_gelu=bool(quick),
                device=device,
                weights_only=True,
            )
        except RuntimeError as exc:
            if is_tag and "Failed to download" in str(exc):
                raise ConfigError(f"model.pretrained={source}: {weights.weights_message(cfg.arch, source)}") from exc
            raise
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    tokenizer = open_clip.get_tokenizer(tokenizer_name)
    meta.setdefault("arch", arch)
    meta.setdefault("source", cfg.pretrained or "random")
    return LoadedModel(model, pp_train, pp_val, tokenizer, arch, model_cfg, meta)


def _load_hub_model(cfg: ModelConfig, source: Path | str | None, device: str | torch.device):
    """Build a model whose architecture (and maybe weights) come from an ``hf-hub:`` repo.

    * ``pretrained=hf-hub:X``: X's config and weights (``arch`` ignored, like a checkpoint);
      a repo without weights is an error, never a silent random init.
    * ``arch=hf-hub:X``, ``pretrained`` None: X's architecture, random weights.
    * ``arch=hf-hub:X``, ``pretrained`` a weights file: X's architecture, that file's weights.
    Returns (model, preprocess_train, preprocess_val, model_cfg, arch, meta); ``arch`` is the
    ``hf-hub:`` name (what ``ModelConfig(arch=...)`` needs to rebuild the architecture) and
    ``meta`` records the hub revision the load read.
    """
    quick = bool(cfg.force_quick_gelu)
    hub = str(source) if is_hf_hub(source) else cfg.arch
    if source is not None and not is_hf_hub(source) and not isinstance(source, Path):
        raise ValueError(f"model.pretrained={cfg.pretrained!r} is an open_clip tag, which names weights of a built-in "
                         f"architecture, not of model.arch={cfg.arch!r}; use a weights file, or pretrained={hub!r}")
    model_cfg = model_config_dict(hub, force_quick_gelu=quick)  # HubModelError when unreadable
    try:
        model, pp_train, pp_val = open_clip.create_model_and_transforms(
            hub, load_weights=is_hf_hub(source), require_pretrained=is_hf_hub(source),
            force_quick_gelu=quick, device=device, weights_only=True)
    except (RuntimeError, OSError) as exc:
        raise HubModelError(f"{hub}: cannot load its weights from the Hugging Face Hub or its local cache: {exc}") from exc
    if isinstance(source, Path):
        open_clip.load_checkpoint(model, str(source), weights_only=True)
    meta = {"arch": hub, "hub_revision": hub_revision(hub)}
    return model, pp_train, pp_val, model_cfg, hub, meta


def save_checkpoint(model: torch.nn.Module, model_cfg: dict[str, Any], directory: str | os.PathLike,
                    meta: dict[str, Any] | None = None, weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``model`` in the checkpoint format above (local directory); ``weights``: the
    state dict to write instead of ``model``'s own (a LoRA model's merged weights)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = unwrap(model)
    weights = model.state_dict() if weights is None else weights
    state = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
    save_file(state, str(directory / WEIGHTS_NAME))
    save_config_for_hf(model, directory / CONFIG_NAME, model_config=model_cfg)
    (directory / META_NAME).write_text(json.dumps(meta or {}, indent=2, default=str))
    return directory


# --------------------------------------------------------------------------- encoding
def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The open_clip model inside DDP / wrappers."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def tokenize(tokenizer: Callable, texts: list[str]) -> torch.Tensor:
    """Tokenise and trim trailing all-padding columns (pad id 0): [B, L_batch]."""
    tokens = tokenizer(list(texts))
    return trim_tokens(tokens)


def trim_tokens(tokens: torch.Tensor) -> torch.Tensor:
    """Drop the padding columns after the longest sequence in the batch."""
    if tokens.numel() == 0:
        return tokens
    nonpad = (tokens != 0).any(dim=0).nonzero()
    length = int(nonpad.max()) + 1 if len(nonpad) else 1
    return tokens[:, :length]


def encode_text(model: torch.nn.Module, tokens: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """Text features for tokens of any length <= the context length.

    For open_clip's ``CLIP`` (causal text tower, end-of-text/argmax pooling) the
    positional embedding and causal mask are sliced to the batch length, which gives the
    same features as padding to the full context. Other towers get padded input.
    """
    m = unwrap(model)
    if isinstance(m, open_clip.CLIP) and m.attn_mask is not None and m.text_pool_type in ("argmax", "eos"):
        length = tokens.shape[1]
        cast_dtype = m.transformer.get_cast_dtype()
        x = m.token_embedding(tokens).to(cast_dtype)
        x = x + m.positional_embedding[:length].to(cast_dtype)
        x = m.transformer(x, attn_mask=m.attn_mask[:length, :length])
        x = m.ln_final(x)
        x = text_global_pool(x, tokens, m.text_pool_type, eos_token_id=getattr(m, "text_eos_id", None))
        if m.text_projection is not None:
            x = m.text_projection(x) if isinstance(m.text_projection, torch.nn.Linear) else x @ m.text_projection
        return F.normalize(x, dim=-1) if normalize else x
    context = getattr(m, "context_length", tokens.shape[1])
    if tokens.shape[1] < context:
        tokens = F.pad(tokens, (0, context - tokens.shape[1]))
    return m.encode_text(tokens, normalize=normalize)


def encode_image(model: torch.nn.Module, images: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    return unwrap(model).encode_image(images, normalize=normalize)
