"""Training checkpoints: save, load, and find the one to resume from (no Ray).

A training checkpoint is a folder holding ``model/`` (the open_clip local-dir format of
:func:`hardpos.models.clip.save_checkpoint`, loadable on its own as ``model.pretrained``) and
``train_state.pt`` (``step``, ``epoch``, the optimiser's and the scheduler's state dicts and,
for a LoRA run, the adapters under ``lora``; ``model/`` then holds the merged weights).
Ray Train names the folders ``checkpoint_<zero-padded step>`` (:mod:`hardpos.train.worker`),
so the newest sorts last.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow.fs

import torch
from safetensors.torch import load_file

from hardpos import storage
from hardpos.models.clip import save_checkpoint
from hardpos.models.source import WEIGHTS_NAME
from hardpos.train import lora

STATE_NAME = "train_state.pt"
MODEL_DIR = "model"


def save_train_checkpoint(directory: str | os.PathLike, clip: torch.nn.Module, model_cfg: dict, meta: dict,
                          state: dict) -> Path:
    """Write ``model/`` (open_clip local-dir format) + ``train_state.pt`` into ``directory``.

    A LoRA model (:mod:`hardpos.train.lora`) writes its merged weights to ``model/`` (a plain
    open_clip checkpoint) and its adapters to ``train_state.pt`` under ``lora``."""
    directory = Path(directory)
    if lora.has_lora(clip):
        save_checkpoint(clip, model_cfg, directory / MODEL_DIR, meta, weights=lora.merged_state_dict(clip))
        state = {**state, "lora": lora.adapter_state(clip)}
    else:
        save_checkpoint(clip, model_cfg, directory / MODEL_DIR, meta)
    torch.save(state, directory / STATE_NAME)
    return directory


def load_train_state(directory: str | os.PathLike, clip: torch.nn.Module) -> dict:
    """Load the checkpoint's model into ``clip``; return the training state.

    Full finetuning: the weights of ``directory/model``. LoRA (``clip`` carries adapters):
    the adapters saved in ``train_state.pt``; the frozen weights are ``clip``'s own (the
    same ``model.pretrained`` the run started from), not ``model/``, which holds them merged.
    Raises FileNotFoundError when ``directory`` holds no ``train_state.pt``, ValueError when
    the checkpoint and ``clip`` disagree on LoRA (one has adapters, the other not).
    """
    directory = Path(directory)
    state_file = directory / STATE_NAME
    if not state_file.is_file():
        raise FileNotFoundError(f"{directory}: not a HardPos training checkpoint (no {STATE_NAME})")
    # weights_only: a checkpoint may come from anywhere (s3, a colleague); no pickle code runs.
    state = torch.load(state_file, map_location="cpu", weights_only=True)
    adapted, saved = lora.has_lora(clip), "lora" in state
    if adapted != saved:
        raise ValueError(f"{directory}: the checkpoint was trained {'with' if saved else 'without'} LoRA and this "
                         f"run {'uses' if adapted else 'does not use'} it; resume with the same lora.rank")
    if adapted:
        lora.load_adapter_state(clip, state.pop("lora"))
    else:
        clip.load_state_dict(load_file(str(directory / MODEL_DIR / WEIGHTS_NAME)))
    return state


def load_remote_train_state(filesystem: pyarrow.fs.FileSystem, path: str, clip: torch.nn.Module) -> dict:
    """:func:`load_train_state` of the checkpoint folder ``path`` on ``filesystem`` (a Ray
    ``Checkpoint``'s pair); a folder not on the local filesystem is first copied into a
    temporary folder of this process's own.

    Not ``Checkpoint.as_directory()``: it shares one download folder between the workers of
    a node, guarded by a lock taken without waiting, so a worker that takes the lock after
    another finished downloads again into the folder the other is reading, which then sees
    a truncated ``train_state.pt``.
    """
    if isinstance(filesystem, pyarrow.fs.LocalFileSystem):
        return load_train_state(path, clip)
    with tempfile.TemporaryDirectory(prefix="hardpos-resume-") as tmp:
        pyarrow.fs.copy_files(path, tmp, source_filesystem=filesystem)
        return load_train_state(tmp, clip)


def find_resume_checkpoint(uri: str) -> str:
    """The checkpoint folder ``uri`` names: itself, or the newest ``checkpoint_*`` below it
    (local or s3://). Raises FileNotFoundError when there is none."""
    if storage.exists(storage.join(uri, STATE_NAME)):
        return uri.rstrip("/")
    states = [f for f in storage.list_files(uri) if f.endswith("/" + STATE_NAME)]
    if not states:
        raise FileNotFoundError(f"resume_from={uri}: no {STATE_NAME} at or below it (not a HardPos training checkpoint)")
    # Checkpoint folders are named checkpoint_<zero-padded step>: the last sorts last.
    return sorted(states, key=lambda f: (f.rsplit("/", 2)[-2], f))[-1].rsplit("/", 1)[0]
