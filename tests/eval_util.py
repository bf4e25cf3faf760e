"""Helpers for the evaluation tests: tiny images, triplet files, REPLACE/SWAP folders."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Iterable

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}


def write_image(path: Path, colour=(128, 128, 128), size=(8, 8)) -> Path:
    """A small solid PNG/JPEG at ``path`` (parents created)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


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


def triplet_rows(n: int, seed: int = 0, image_dir: str = "images") -> list[dict]:
    """n colour triplets: 'a red square' vs 'a blue square' vs 'a crimson square'-style rows,
    with image paths relative to the triplet file's folder."""
    rng = random.Random(seed)
    names = list(COLOURS)
    rows = []
    for i in range(n):
        true, false = rng.sample(names, 2)
        rows.append({
            "image": f"{image_dir}/{true}.png", "caption": f"a {true} square", "hard_negative": f"a {false} square",
            "hard_positive": f"a square that is {true}", "kind": "replace", "source": "test", "caption_id": str(i),
        })
    return rows


def write_triplets(folder: Path, rows: list[dict], name: str = "bench.jsonl", images: bool = True) -> Path:
    """Write rows as jsonl (or parquet by suffix) plus their images (named by colour)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if images:
        for r in rows:
            colour = Path(r["image"]).stem
            if not (folder / r["image"]).exists():
                write_image(folder / r["image"], COLOURS.get(colour, (100, 100, 100)))
    return path


def tiny_model(seed: int = 0):
    import torch

    from hardpos.model import ModelConfig, load_model

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
