"""Helpers for the training tests: small triplet files with Pillow-drawn shape images."""
from __future__ import annotations

import random
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "green": (30, 190, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}
SYNONYMS = {"red": "crimson", "green": "emerald", "blue": "navy", "yellow": "golden"}
SHAPES = ("circle", "square")


def draw(path: Path, colour: str, shape: str, size: int = 32) -> None:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (245, 245, 245))
    d = ImageDraw.Draw(img)
    box = (6, 6, size - 6, size - 6)
    (d.ellipse if shape == "circle" else d.rectangle)(box, fill=COLOURS[colour])
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)


def write_triplets(folder: Path, n: int = 64, seed: int = 0, *, bad: int = 0, fmt: str = "parquet") -> tuple[Path, list[dict]]:
    """``bad`` rows whose image is missing or corrupt, then ``n`` good triplet rows (image
    paths relative to the file). Every 4th good row lacks a positive, every 5th a negative."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        colour, shape = rng.choice(list(COLOURS)), rng.choice(SHAPES)
        other = rng.choice([c for c in COLOURS if c != colour])
        rel = f"images/{colour}_{shape}.png"
        if not (folder / rel).exists():
            draw(folder / rel, colour, shape)
        rows.append({
            "image": rel,
            "caption": f"a {colour} {shape}",
            "hard_negative": None if i % 5 == 4 else f"a {other} {shape}",
            "hard_positive": None if i % 4 == 3 else f"a {SYNONYMS[colour]} {shape}",
            "kind": "replace", "source": "rule", "caption_id": str(i),
        })
    bad_rows = []
    for j in range(bad):
        if j % 2 == 0:
            rel = f"images/missing_{j}.png"
        else:
            rel = f"images/corrupt_{j}.png"
            (folder / rel).write_bytes(b"not a png")
        bad_rows.append({"image": rel, "caption": "a red circle", "hard_negative": "a blue circle",
                         "hard_positive": None, "kind": "replace", "source": "rule", "caption_id": f"bad{j}"})
    rows = bad_rows + rows  # first, so they land in the first batches (not a dropped tail)
    path = folder / f"triplets.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        import json

        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows
