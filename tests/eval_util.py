"""Helpers for the evaluation tests: stand-in images, a tiny model, REPLACE/SWAP folders.

Triplet rows, their images and the colour palette live in :mod:`tests.support` (one copy
shared with the other tests and the measuring tools in benchmarks/)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable


def stand_in_images(root: Path, rel_paths: Iterable[str], size=(8, 8)) -> int:
    """Tiny images at every distinct relative path (a cheap stand-in for Visual Genome/COCO).
    The colour varies with the path so images differ."""
    from PIL import Image

    made = 0
    for rel in sorted(set(rel_paths)):
        path = root / rel
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        h = hash(rel) & 0xFFFFFF
        Image.new("RGB", size, (h & 255, (h >> 8) & 255, (h >> 16) & 255)).save(path)
        made += 1
    return made


def tiny_model(seed: int = 0):
    import torch

    from hardpos.config import ModelConfig
    from hardpos.models.clip import load_model

    torch.manual_seed(seed)
    return load_model(ModelConfig(arch="hardpos-tiny"))


def write_replace_folder(root: Path, subsets: dict[str, list[tuple[str, str, str, str]]]) -> Path:
    """A REPLACE folder: subsets = {"attributes": [(image_id, true, false, positive), ...], ...}
    -> data/ and swapped_data/ files in the paper's format, image paths data/VG_100K/<id>.jpg."""
    for sub, rows in subsets.items():
        orig = [{"image_id": i, "true_caption": t, "false_caption": f, "image_path": f"data/VG_100K/{i}.jpg"} for i, t, f, _ in rows]
        swapped = [{"image_id": i, "true_caption": p, "false_caption": f, "image_path": f"data/VG_100K/{i}.jpg"} for i, _, f, p in rows]
        for folder, data in (("data", orig), ("swapped_data", swapped)):
            (root / folder).mkdir(parents=True, exist_ok=True)
            (root / folder / f"vl_checklist_{sub}.json").write_text(json.dumps(data))
    return root
