"""One copy of the small-data helpers the tests and the measuring tools share.

Colour triplets ("a red circle" / hard negative "a blue circle" / hard positive "a crimson
circle") over tiny Pillow-drawn images: cheap enough for a CPU test, structured enough that
a model can learn them. Images are written next to the triplet file and the rows name them
by relative path, as the train and evaluate stages expect.
"""
from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

# The one palette (the tests' and the resilience run's copies had drifted: green was
# (30, 200, 30) in one of them). Distinct, saturated colours so even a tiny model separates them.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 190, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20),
}
SYNONYMS = {"red": "crimson", "green": "emerald", "blue": "navy", "yellow": "golden"}
SHAPES = ("circle", "square")
_BACKGROUND = (245, 245, 245)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it; a race with other binders
    is possible but rare, so callers bind it promptly)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_image(path: Path, colour: tuple[int, int, int] = (128, 128, 128), size: tuple[int, int] = (8, 8)) -> Path:
    """A solid-colour image at ``path`` (format by suffix; parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


def draw_shape(path: Path, colour: str, shape: str, size: int = 32) -> Path:
    """A ``PALETTE[colour]`` circle or square on a light background, ``size`` px square."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    img = Image.new("RGB", (size, size), _BACKGROUND)
    draw = ImageDraw.Draw(img)
    box = (6, 6, size - 6, size - 6)
    (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=PALETTE[colour])
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def write_triplets(folder: Path, n: int = 64, seed: int = 0, *, bad: int = 0, fmt: str = "parquet"
                   ) -> tuple[Path, list[dict]]:
    """A training triplet file ``folder/triplets.{fmt}`` (parquet or jsonl) -> (path, rows).

    ``bad`` rows whose image is missing (even j) or corrupt (odd j) come first, so they land
    in the first batches rather than a dropped tail; then ``n`` good rows over drawn shapes
    (image paths relative to the file), drawn with ``random.Random(seed)``. Every 4th good
    row lacks a hard positive and every 5th a hard negative (both are optional columns).
    """
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"fmt must be 'parquet' or 'jsonl', got {fmt!r}")
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        colour, shape = rng.choice(list(PALETTE)), rng.choice(SHAPES)
        other = rng.choice([c for c in PALETTE if c != colour])
        rel = f"images/{colour}_{shape}.png"
        if not (folder / rel).exists():
            draw_shape(folder / rel, colour, shape)
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
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(b"not a png")
        bad_rows.append({"image": rel, "caption": "a red circle", "hard_negative": "a blue circle",
                         "hard_positive": None, "kind": "replace", "source": "rule", "caption_id": f"bad{j}"})
    rows = bad_rows + rows
    return write_rows(folder, rows, f"triplets.{fmt}", images=False), rows


def triplet_rows(n: int, seed: int = 0, image_dir: str = "images") -> list[dict]:
    """``n`` benchmark rows: 'a red square' vs 'a blue square' vs 'a square that is red',
    each naming the image ``{image_dir}/{colour}.png`` (relative to the row file)."""
    rng = random.Random(seed)
    names = list(PALETTE)
    rows = []
    for i in range(n):
        true, false = rng.sample(names, 2)
        rows.append({
            "image": f"{image_dir}/{true}.png", "caption": f"a {true} square", "hard_negative": f"a {false} square",
            "hard_positive": f"a square that is {true}", "kind": "replace", "source": "test", "caption_id": str(i),
        })
    return rows


def write_rows(folder: Path, rows: list[dict], name: str = "bench.jsonl", images: bool = True) -> Path:
    """Write ``rows`` to ``folder/name`` (parquet when the name ends in .parquet, else jsonl).

    With ``images``, every image a row names that does not exist yet is written as a solid
    8 px square of the palette colour its file stem names (grey for other stems).
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if images:
        for r in rows:
            if not (folder / r["image"]).exists():
                write_image(folder / r["image"], PALETTE.get(Path(r["image"]).stem, (100, 100, 100)))
    return path
