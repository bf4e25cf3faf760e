"""The synthetic world: procedural scenes with exact ground truth (DESIGN sections 6 and 8).

A scene holds 1-3 objects, each a shape (circle, square, triangle, diamond, star) with a
colour, a size (small | large) and a position, drawn with Pillow on a dark background at
``image_size`` pixels.  No two objects of a scene share all of (shape, colour, size), so
every noun phrase names one object.

Captions come from a small grammar in a canonical surface form:

* list:      "a large red circle", "a large red circle and a small blue square",
             "a large red circle, a small blue square and a large green star"
             (objects named left to right);
* relation:  "a large red circle above a small blue square" with one of
             "to the left of" | "to the right of" | "above" | "below", true with a margin.

Meaning is exact and order-free: a list caption is true when distinct objects match its
noun phrases; a relation caption when some ordered pair of distinct matching objects
stands in that relation.  :func:`truth` evaluates any caption of the grammar, including the
non-canonical synonyms ("crimson", "big", "over", "left of") and conjunct
orders, against a scene and returns True / False / None (None: a relation within the
ambiguity margin, neither clearly true nor clearly false).

Perturbations (benchmark items are verified against the scene: caption and hard positive
true, hard negative false):

* REPLACE attribute: one colour or size changed (negative) / rewritten with its synonym (positive);
* REPLACE relation: the relation changed (negative) / rewritten with its synonym (positive);
* SWAP: colours or sizes exchanged between two objects (negative) / two conjuncts
  exchanged with their attributes (positive).

``noncanonical_rate`` is the share of pretraining captions that use one non-canonical form
(a synonym or a reordered list); default 0.5%, so a model pretrained on the world knows
them only weakly, as CLIP knows LLM paraphrases.

Output layout (train / evaluate / demo read exactly this)::

    <out_dir>/world.json
    <out_dir>/images/<split>/<id>.png
    <out_dir>/pretrain.parquet      triplet rows, hard_negative/hard_positive null, source "world"
    <out_dir>/finetune.parquet      triplet rows, captions only
    <out_dir>/benchmark/replace_attribute.parquet
    <out_dir>/benchmark/replace_relation.parquet
    <out_dir>/benchmark/swap.parquet

Image paths in the files are relative to the file's folder.  Deterministic by seed.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hardpos import storage
from hardpos.config import ConfigError

SPLITS = ("pretrain", "finetune", "benchmark")
BENCHMARKS = ("replace_attribute", "replace_relation", "swap")

COLOR_RGB = {
    "red": (220, 45, 40), "yellow": (235, 205, 40), "green": (40, 165, 70),
    "blue": (50, 95, 225), "purple": (145, 60, 185), "white": (235, 235, 235),
    "orange": (240, 135, 30), "pink": (240, 130, 180), "brown": (130, 80, 40), "gray": (140, 140, 140),
}
#: canonical word -> its rarer synonym (the REPLACE hard positive); all are in the rule lexicon
SYNONYMS = {
    "red": "crimson", "yellow": "golden", "green": "emerald", "blue": "sapphire", "purple": "violet",
    "white": "ivory", "orange": "tangerine", "pink": "rosy", "brown": "chestnut", "gray": "grey",
    "large": "big", "small": "little",
    "above": "over", "below": "beneath",
    "to the left of": "left of", "to the right of": "right of",
}
RELATIONS = ("to the left of", "to the right of", "above", "below")
SHAPES_ALL = ("circle", "square", "triangle", "diamond", "star")
#: relative half-extent of an object per size word
SIZE_SCALE = {"small": 0.085, "large": 0.15}


@dataclass
class WorldConfig:
    """The synthetic world.

    seed: every random choice derives from it (scenes, captions, perturbations).
    image_size: rendered image side in pixels.
    n_pretrain: pretraining scenes (one caption each).
    n_finetune: finetuning scenes (one canonical caption each; negatives/positives are
        filled later by the perturb or generate stage).
    n_benchmark: held-out scenes; each yields at most one item per benchmark subset.
    min_objects: fewest objects in a scene (>= 1).
    max_objects: most objects in a scene (<= 3).
    colors: colour vocabulary (each must have a synonym in SYNONYMS).
    shapes: shape vocabulary.
    sizes: size vocabulary (subset of small, large).
    relation_caption_rate: share of captions (of scenes with >= 2 objects) that use the
        relation template instead of the list template.
    noncanonical_rate: share of pretraining captions that use one non-canonical form
        (a synonym or a reordered list).
    binding_negative_rate: share of REPLACE-attribute benchmark items whose negative takes
        its new value from another object of the scene when one can ("a red circle and a
        blue square" -> "a blue circle and a blue square"): only the binding is wrong.
    vague_caption_rate: share of pretraining captions whose noun phrases name only the shape
        ("a circle above a square", "a circle and a square"), as web captions are often vague:
        they mention fewer attributes (a weaker attribute and binding signal) and, in a batch,
        a vague relation caption is often true of another image's objects but for the relation,
        so the relation words carry signal that fully described objects never need.
    shape_negatives: the rule engine may make a REPLACE hard negative by changing a shape
        ("circle" -> "square"); False leaves finetuning negatives to what needs binding or
        relations (colours, sizes, relations, attribute swaps): a changed shape is named by
        no object of the scene, so a bag-of-words model already rejects it.
    relation_margin: a relation is "clearly true" when the centres differ by more than
        this fraction of the image along its axis (and "false" when they differ the other way).
    background_jitter: +- range of the background grey level (adds nuisance variation).
    color_jitter: +- per-channel range of each object's colour.
    write_images: False skips the PNGs (captions and ground truth only; fast tests).
    """

    seed: int = 0
    image_size: int = 64
    n_pretrain: int = 20000
    n_finetune: int = 5000
    n_benchmark: int = 1000
    min_objects: int = 1
    max_objects: int = 3
    colors: list[str] = field(default_factory=lambda: ["red", "yellow", "green", "blue", "purple", "white"])
    shapes: list[str] = field(default_factory=lambda: list(SHAPES_ALL))
    sizes: list[str] = field(default_factory=lambda: ["small", "large"])
    relation_caption_rate: float = 0.5
    noncanonical_rate: float = 0.005
    binding_negative_rate: float = 0.0
    shape_negatives: bool = True
    vague_caption_rate: float = 0.0
    relation_margin: float = 0.1
    background_jitter: int = 12
    color_jitter: int = 18
    write_images: bool = True

    def validate(self) -> None:
        """Raise ConfigError (a ValueError) naming the field for an impossible configuration."""
        if self.image_size < 16:
            raise ConfigError(f"image_size must be >= 16, got {self.image_size}")
        if not 1 <= self.min_objects <= self.max_objects <= 3:
            raise ConfigError(f"need 1 <= min_objects <= max_objects <= 3, got {self.min_objects}..{self.max_objects}")
        for name in ("n_pretrain", "n_finetune", "n_benchmark"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        for c in self.colors:
            if c not in COLOR_RGB:
                raise ConfigError(f"colors: unknown colour {c!r}; known: {sorted(COLOR_RGB)}")
        for s in self.shapes:
            if s not in SHAPES_ALL:
                raise ConfigError(f"shapes: unknown shape {s!r}; known: {list(SHAPES_ALL)}")
        for s in self.sizes:
            if s not in SIZE_SCALE:
                raise ConfigError(f"sizes: unknown size {s!r}; known: {list(SIZE_SCALE)}")
        if len(set(self.colors)) < 2 or len(set(self.shapes)) < 1 or len(set(self.sizes)) < 1:
            raise ConfigError("need at least 2 colours, 1 shape and 1 size")
        for name in ("relation_caption_rate", "noncanonical_rate", "binding_negative_rate", "vague_caption_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1]")
        if not 0.0 < self.relation_margin < 0.5:
            raise ConfigError("relation_margin must be in (0, 0.5)")


# ---------------------------------------------------------------------- scenes
@dataclass(frozen=True)
class Obj:
    shape: str
    color: str
    size: str
    cx: float  # centre, in pixels
    cy: float
    r: float  # half-extent, in pixels
    rgb: tuple[int, int, int]


@dataclass(frozen=True)
class Scene:
    objects: tuple[Obj, ...]
    background: int

    def to_json(self) -> str:
        return json.dumps({"background": self.background,
                           "objects": [dataclasses.asdict(o) for o in self.objects]}, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> "Scene":
        d = json.loads(text)
        return Scene(tuple(Obj(**{**o, "rgb": tuple(o["rgb"])}) for o in d["objects"]), d["background"])


def sample_scene(rng: random.Random, cfg: WorldConfig) -> Scene:
    """One scene: distinct (shape, colour, size) objects that do not overlap."""
    S = cfg.image_size
    while True:
        n = rng.randint(cfg.min_objects, cfg.max_objects)
        objs: list[Obj] = []
        keys: set[tuple[str, str, str]] = set()
        tries = 0
        while len(objs) < n and tries < 60:
            tries += 1
            shape, color, size = rng.choice(cfg.shapes), rng.choice(cfg.colors), rng.choice(cfg.sizes)
            if (shape, color, size) in keys:
                continue
            r = SIZE_SCALE[size] * S
            cx = rng.uniform(r + 1, S - r - 1)
            cy = rng.uniform(r + 1, S - r - 1)
            if any(math.hypot(cx - o.cx, cy - o.cy) < r + o.r + 2 for o in objs):
                continue
            j = cfg.color_jitter
            rgb = tuple(max(0, min(255, c + rng.randint(-j, j))) for c in COLOR_RGB[color])
            objs.append(Obj(shape, color, size, round(cx, 2), round(cy, 2), round(r, 2), rgb))  # type: ignore[arg-type]
            keys.add((shape, color, size))
        if len(objs) == n:
            return Scene(tuple(objs), 35 + rng.randint(-cfg.background_jitter, cfg.background_jitter))


def render(scene: Scene, size: int):
    """A Pillow RGB image of the scene."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (scene.background,) * 3)
    draw = ImageDraw.Draw(img)
    for o in scene.objects:
        x, y, r = o.cx, o.cy, o.r
        if o.shape == "circle":
            draw.ellipse([x - r, y - r, x + r, y + r], fill=o.rgb)
        elif o.shape == "square":
            q = r * 0.88  # same visual area class as the circle
            draw.rectangle([x - q, y - q, x + q, y + q], fill=o.rgb)
        elif o.shape == "triangle":
            draw.polygon([(x, y - r), (x + r, y + r * 0.8), (x - r, y + r * 0.8)], fill=o.rgb)
        elif o.shape == "diamond":
            draw.polygon([(x, y - r), (x + r, y), (x, y + r), (x - r, y)], fill=o.rgb)
        elif o.shape == "star":
            pts = []
            for k in range(10):
                rad = r if k % 2 == 0 else r * 0.45
                ang = -math.pi / 2 + k * math.pi / 5
                pts.append((x + rad * math.cos(ang), y + rad * math.sin(ang)))
            draw.polygon(pts, fill=o.rgb)
    return img


# ---------------------------------------------------------------------- grammar
_WORD_TO_CANON = {}
for _canon, _syn in SYNONYMS.items():
    _WORD_TO_CANON[_canon] = _canon
    _WORD_TO_CANON[_syn] = _canon
_REL_FORMS = sorted({r for r in RELATIONS} | {SYNONYMS[r] for r in RELATIONS}, key=len, reverse=True)


def np_text(o: Obj, *, color_word: str | None = None, size_word: str | None = None, shape_word: str | None = None) -> str:
    """"a large red circle" (words overridable for synonyms and perturbations)."""
    return f"a {size_word or o.size} {color_word or o.color} {shape_word or o.shape}"


def list_text(nps: list[str]) -> str:
    if len(nps) == 1:
        return nps[0]
    return ", ".join(nps[:-1]) + " and " + nps[-1]


def relation_value(rel: str, a: Obj, b: Obj, size: int) -> float:
    """Signed offset (fraction of the image) by which ``a rel b`` holds; > margin: clearly true."""
    if rel == "to the left of":
        d = b.cx - a.cx
    elif rel == "to the right of":
        d = a.cx - b.cx
    elif rel == "above":
        d = b.cy - a.cy
    elif rel == "below":
        d = a.cy - b.cy
    else:
        raise ValueError(f"unknown relation {rel!r}")
    return d / size


@dataclass(frozen=True)
class ParsedNP:
    shape: str | None
    color: str | None
    size: str | None


def _parse_np(text: str, cfg: WorldConfig) -> ParsedNP | None:
    words = text.split()
    if not words or words[0] not in ("a", "an"):
        return None
    shape = color = size = None
    for w in words[1:]:
        canon = _WORD_TO_CANON.get(w, w)
        if canon in cfg.shapes and shape is None:
            shape = canon
        elif canon in COLOR_RGB and color is None:
            color = canon
        elif canon in SIZE_SCALE and size is None:
            size = canon
        else:
            return None
    if shape is None or words[-1] != shape:
        return None
    return ParsedNP(shape, color, size)


def parse(caption: str, cfg: WorldConfig) -> tuple[str, Any] | None:
    """("list", [NP...]) or ("relation", (NP, rel, NP)); None when not in the grammar."""
    text = " ".join(caption.lower().strip().rstrip(".").split())
    for form in _REL_FORMS:
        marker = f" {form} "
        if marker in text:
            left, right = text.split(marker, 1)
            a, b = _parse_np(left, cfg), _parse_np(right, cfg)
            if a is None or b is None:
                return None
            return "relation", (a, _WORD_TO_CANON[form], b)
    parts = [p.strip() for chunk in text.split(" and ") for p in chunk.split(",")]
    if " and " not in text and len(parts) != 1:
        return None
    nps = [_parse_np(p, cfg) for p in parts]
    if not nps or any(n is None for n in nps):
        return None
    return "list", nps


def _matches(np_: ParsedNP, o: Obj) -> bool:
    return (np_.shape is None or np_.shape == o.shape) and (np_.color is None or np_.color == o.color) and (
        np_.size is None or np_.size == o.size)


def truth(caption: str, scene: Scene, cfg: WorldConfig) -> bool | None:
    """Is ``caption`` true of ``scene``?  True / False / None (ambiguous relation); raises
    ValueError when the caption is not in the world's grammar."""
    parsed = parse(caption, cfg)
    if parsed is None:
        raise ValueError(f"not a world caption: {caption!r}")
    kind, body = parsed
    objs = scene.objects
    if kind == "list":
        nps = body
        if len(nps) > len(objs):
            return False
        for perm in itertools.permutations(range(len(objs)), len(nps)):
            if all(_matches(n, objs[i]) for n, i in zip(nps, perm)):
                return True
        return False
    a_np, rel, b_np = body
    margin = cfg.relation_margin
    best = None
    for i, j in itertools.permutations(range(len(objs)), 2):
        if _matches(a_np, objs[i]) and _matches(b_np, objs[j]):
            v = relation_value(rel, objs[i], objs[j], cfg.image_size)
            best = v if best is None else max(best, v)
    if best is None:
        return False
    if best > margin:
        return True
    if best <= 0:
        return False
    return None


# ---------------------------------------------------------------------- captions
@dataclass
class Caption:
    text: str
    template: str  # "list" | "relation"
    objects: list[int]  # indices into scene.objects in mention order
    relation: str | None = None


def canonical_caption(rng: random.Random, scene: Scene, cfg: WorldConfig, template: str | None = None) -> Caption | None:
    """A canonical caption (list: left to right; relation: a clearly true pair)."""
    objs = scene.objects
    n = len(objs)
    if template is None:
        template = "relation" if n >= 2 and rng.random() < cfg.relation_caption_rate else "list"
    if template == "list":
        order = sorted(range(n), key=lambda i: objs[i].cx)
        return Caption(list_text([np_text(objs[i]) for i in order]), "list", order)
    if n < 2:
        return None
    options = []
    for i, j in itertools.permutations(range(n), 2):
        for rel in RELATIONS:
            if relation_value(rel, objs[i], objs[j], cfg.image_size) > cfg.relation_margin:
                options.append((i, j, rel))
    if not options:
        return None
    i, j, rel = rng.choice(options)
    return Caption(f"{np_text(objs[i])} {rel} {np_text(objs[j])}", "relation", [i, j], rel)


def _render_caption(scene: Scene, cap: Caption, words: dict[tuple[int, str], str] | None = None,
                    order: list[int] | None = None, relation: str | None = None) -> str:
    """Re-render ``cap`` with per-object word overrides, a new order, or a new relation word."""
    words = words or {}
    objs = scene.objects

    def np_of(i: int) -> str:
        return np_text(objs[i], color_word=words.get((i, "color")), size_word=words.get((i, "size")),
                       shape_word=words.get((i, "shape")))

    if cap.template == "list":
        return list_text([np_of(i) for i in (order or cap.objects)])
    i, j = cap.objects
    return f"{np_of(i)} {relation or cap.relation} {np_of(j)}"


def noncanonical(rng: random.Random, scene: Scene, cap: Caption) -> tuple[str, str]:
    """One non-canonical rewrite of a true caption (synonym or reordered list): (text, form)."""
    choices = ["color", "size"]
    if cap.template == "relation":
        choices.append("relation")
    elif len(cap.objects) >= 2:
        choices.append("order")
    what = rng.choice(choices)
    if what == "order":
        order = list(cap.objects)
        while order == cap.objects:
            rng.shuffle(order)
        return _render_caption(scene, cap, order=order), "order"
    if what == "relation":
        return _render_caption(scene, cap, relation=SYNONYMS[cap.relation]), "relation_synonym"
    i = rng.choice(cap.objects)
    value = getattr(scene.objects[i], what)
    return _render_caption(scene, cap, words={(i, what): SYNONYMS[value]}), f"{what}_synonym"


def vague(scene: Scene, cap: Caption) -> str:
    """``cap`` with every noun phrase reduced to its shape ("a circle above a square"); still true
    of the scene (the named objects exist, and the caption's own pair stands in its relation)."""
    objs = scene.objects
    if cap.template == "list":
        return list_text([f"a {objs[i].shape}" for i in cap.objects])
    i, j = cap.objects
    return f"a {objs[i].shape} {cap.relation} a {objs[j].shape}"


def benchmark_item(rng: random.Random, scene: Scene, cfg: WorldConfig, subset: str) -> dict | None:
    """(caption, hard_negative, hard_positive, slot) for one benchmark subset, verified; None if impossible."""
    objs = scene.objects
    if subset == "replace_attribute":
        cap = canonical_caption(rng, scene, cfg)
        if cap is None:
            return None
        i = rng.choice(cap.objects)
        attrs = ["color", "size"] if len(cfg.sizes) > 1 else ["color"]
        attr = rng.choice(attrs)
        value = getattr(objs[i], attr)
        pool = [v for v in (cfg.colors if attr == "color" else cfg.sizes) if v != value]
        rng.shuffle(pool)
        if rng.random() < cfg.binding_negative_rate:
            # a binding negative: the new value is another object's in this scene, so every word of
            # the negative is true of some object and only the attribute-object binding is wrong
            # (a bag-of-words model cannot tell it from the caption); falls back to any value
            others = {getattr(o, attr) for k, o in enumerate(objs) if k != i}
            pool.sort(key=lambda v: v not in others)  # stable: the shuffled order within each group
        for new in pool:
            neg = _render_caption(scene, cap, words={(i, attr): new})
            if truth(neg, scene, cfg) is False:
                pos = _render_caption(scene, cap, words={(i, attr): SYNONYMS[value]})
                return _verified(scene, cfg, cap.text, neg, pos, f"attribute:{attr} {value}->{new}",
                                 f"attribute:{attr} {value}->{SYNONYMS[value]}", cap.template)
        return None
    if subset == "replace_relation":
        cap = canonical_caption(rng, scene, cfg, template="relation")
        if cap is None:
            return None
        pool = [r for r in RELATIONS if r != cap.relation]
        rng.shuffle(pool)
        for new in pool:
            neg = _render_caption(scene, cap, relation=new)
            if truth(neg, scene, cfg) is False:
                pos = _render_caption(scene, cap, relation=SYNONYMS[cap.relation])
                return _verified(scene, cfg, cap.text, neg, pos, f"relation:{cap.relation}->{new}",
                                 f"relation:{cap.relation}->{SYNONYMS[cap.relation]}", cap.template)
        return None
    if subset == "swap":
        if len(objs) < 2:
            return None
        cap = canonical_caption(rng, scene, cfg, template="list")
        pairs = list(itertools.combinations(range(len(cap.objects)), 2))
        rng.shuffle(pairs)
        attrs = ["color", "size"]
        rng.shuffle(attrs)
        for (pa, pb), attr in itertools.product(pairs, attrs):
            i, j = cap.objects[pa], cap.objects[pb]
            vi, vj = getattr(objs[i], attr), getattr(objs[j], attr)
            if vi == vj:
                continue
            neg = _render_caption(scene, cap, words={(i, attr): vj, (j, attr): vi})
            if truth(neg, scene, cfg) is not False:
                continue
            order = list(cap.objects)
            x, y = rng.sample(range(len(order)), 2)
            order[x], order[y] = order[y], order[x]
            pos = _render_caption(scene, cap, order=order)
            return _verified(scene, cfg, cap.text, neg, pos, f"attributes:{attr} {vi}<->{vj}", "conjuncts", "list")
        return None
    raise ValueError(f"unknown benchmark subset {subset!r}")


def _verified(scene: Scene, cfg: WorldConfig, caption: str, neg: str, pos: str, slot: str, pos_slot: str,
              template: str) -> dict:
    # The benchmark's contract: checked here for every item, not assumed.
    if truth(caption, scene, cfg) is not True or truth(pos, scene, cfg) is not True or truth(neg, scene, cfg) is not False:
        raise AssertionError(f"unverified world item: {caption!r} / {pos!r} / {neg!r}")
    return {"caption": caption, "hard_negative": neg, "hard_positive": pos, "slot": slot,
            "positive_slot": pos_slot, "template": template}


# ---------------------------------------------------------------------- vocabulary / rules
def vocabulary(cfg: WorldConfig) -> dict:
    """The world's words, canonical and non-canonical, as written to world.json."""
    return {
        "colors": list(cfg.colors), "shapes": list(cfg.shapes), "sizes": list(cfg.sizes),
        "relations": list(RELATIONS),
        "synonyms": {w: SYNONYMS[w] for w in [*cfg.colors, *cfg.sizes, *RELATIONS]},
    }


def world_lexicon(cfg: WorldConfig | None = None):
    """The rule lexicon restricted to this world's words (so rule negatives stay in-vocabulary)."""
    from hardpos.data.lexicon import load_lexicon

    cfg = cfg or WorldConfig()
    voc = vocabulary(cfg)
    forms = set(voc["colors"]) | set(voc["shapes"]) | set(voc["sizes"]) | set(voc["relations"]) | set(voc["synonyms"].values())
    lex = load_lexicon(restrict_to=forms)
    if not cfg.shape_negatives:  # shapes stay nouns (binding and swaps need them), only their negatives go
        lex = dataclasses.replace(lex, negatives={k: v for k, v in lex.negatives.items() if k[0] not in voc["shapes"]})
    return lex


# ---------------------------------------------------------------------- generation
def _split_rng(seed: int, split: str) -> random.Random:
    # independent, reproducible streams per split (held-out scenes never share a stream)
    return random.Random(f"hardpos-world:{seed}:{split}")


def generate_world(cfg: WorldConfig, out_dir: str) -> dict:
    """Generate the world under ``out_dir`` (local or s3://) and return stats + paths.

    s3:// outputs are generated in a local temporary folder and uploaded as a whole.
    """
    cfg.validate()
    if storage.is_s3(out_dir):
        with tempfile.TemporaryDirectory(prefix="hardpos-world-") as tmp:
            stats = _generate_local(cfg, Path(tmp))
            storage.upload_dir(tmp, out_dir)
        return _with_paths(stats, out_dir)
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    return _with_paths(_generate_local(cfg, path), str(path))


def _with_paths(stats: dict, out_dir: str) -> dict:
    paths = {"world": storage.join(out_dir, "world.json"),
             "pretrain": storage.join(out_dir, "pretrain.parquet"),
             "finetune": storage.join(out_dir, "finetune.parquet")}
    for b in BENCHMARKS:
        paths[b] = storage.join(out_dir, "benchmark", f"{b}.parquet")
    return {**stats, "paths": paths}


def _generate_local(cfg: WorldConfig, out: Path) -> dict:
    from hardpos.data.triplets import make_triplet, write_triplets

    started = time.perf_counter()
    cpu_started = time.process_time()  # CPU seconds of this process (all threads): comparable on a shared box
    timings: dict[str, float] = {}
    scenes: dict[str, list[Scene]] = {}
    counts = {"pretrain": cfg.n_pretrain, "finetune": cfg.n_finetune, "benchmark": cfg.n_benchmark}
    t0 = time.perf_counter()
    for split in SPLITS:
        rng = _split_rng(cfg.seed, split)
        scenes[split] = [sample_scene(rng, cfg) for _ in range(counts[split])]
    timings["sample_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if cfg.write_images:
        for split in SPLITS:
            folder = out / "images" / split
            if folder.exists():
                shutil.rmtree(folder)  # a re-run must not leave images of a bigger earlier world
            folder.mkdir(parents=True)
        _render_all(cfg, out, scenes)
    timings["render_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rows: dict[str, list[dict]] = {"pretrain": [], "finetune": []}
    forms: dict[str, int] = {}
    for split in ("pretrain", "finetune"):
        rng = _split_rng(cfg.seed, split + ":captions")
        for k, scene in enumerate(scenes[split]):
            cap = canonical_caption(rng, scene, cfg)
            text, form = cap.text, "canonical"
            if split == "pretrain" and rng.random() < cfg.noncanonical_rate:
                text, form = noncanonical(rng, scene, cap)
            elif split == "pretrain" and cfg.vague_caption_rate and rng.random() < cfg.vague_caption_rate:
                text, form = vague(scene, cap), "vague"
            if split == "pretrain":
                forms[form] = forms.get(form, 0) + 1
            rows[split].append(make_triplet(
                image=f"images/{split}/{k:06d}.png", caption=text, kind="caption", source="world",
                caption_id=f"{split}-{k:06d}", split=split, template=cap.template, form=form,
                n_objects=len(scene.objects), scene=scene.to_json()))
    bench: dict[str, list[dict]] = {b: [] for b in BENCHMARKS}
    rng = _split_rng(cfg.seed, "benchmark:items")
    for k, scene in enumerate(scenes["benchmark"]):
        for subset in BENCHMARKS:
            item = benchmark_item(rng, scene, cfg, subset)
            if item is None:
                continue
            bench[subset].append(make_triplet(
                image=f"../images/benchmark/{k:06d}.png", caption=item["caption"],
                hard_negative=item["hard_negative"], hard_positive=item["hard_positive"],
                kind="swap" if subset == "swap" else "replace", source="world",
                caption_id=f"benchmark-{k:06d}-{subset}", split="benchmark", subset=subset, slot=item["slot"],
                positive_slot=item["positive_slot"], template=item["template"], n_objects=len(scene.objects),
                verified=True, scene=scene.to_json()))
    timings["captions_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    write_triplets(rows["pretrain"], str(out / "pretrain.parquet"))
    write_triplets(rows["finetune"], str(out / "finetune.parquet"))
    (out / "benchmark").mkdir(exist_ok=True)
    for subset in BENCHMARKS:
        write_triplets(bench[subset], str(out / "benchmark" / f"{subset}.parquet"))
    timings["write_s"] = time.perf_counter() - t0
    total = time.perf_counter() - started
    cpu_total = time.process_time() - cpu_started
    n_scenes = sum(counts.values())
    noncanon = sum(v for k, v in forms.items() if k not in ("canonical", "vague"))  # vague: canonical words
    stats = {
        "scenes": counts,
        "benchmark_items": {b: len(v) for b, v in bench.items()},
        "pretrain_noncanonical": noncanon,
        "pretrain_noncanonical_share": round(noncanon / max(1, cfg.n_pretrain), 5),
        "pretrain_forms": forms,
        "objects_histogram": {str(n): sum(1 for s in itertools.chain(*scenes.values()) if len(s.objects) == n)
                              for n in range(cfg.min_objects, cfg.max_objects + 1)},
        "seconds": round(total, 3),
        "scenes_per_s": round(n_scenes / total, 1) if total > 0 else None,
        "cpu_seconds": round(cpu_total, 3),
        "scenes_per_cpu_s": round(n_scenes / cpu_total, 1) if cpu_total > 0 else None,
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }
    world = {"config": dataclasses.asdict(cfg), "stats": stats, "vocabulary": vocabulary(cfg),
             "layout": {"images": "images/<split>/<id>.png", "splits": list(SPLITS),
                        "benchmarks": {b: f"benchmark/{b}.parquet" for b in BENCHMARKS}}}
    (out / "world.json").write_text(json.dumps(world, indent=2) + "\n")
    return stats


def _render_all(cfg: WorldConfig, out: Path, scenes: dict[str, list[Scene]]) -> None:
    """Render and write every scene's PNG.

    Drawing a 64 px scene costs tens of microseconds; the PNG encode and the file write
    dominate, and both release the GIL, so a few threads overlap them without the start-up
    cost (and the CPU grab) of a process pool.
    """
    from concurrent.futures import ThreadPoolExecutor

    def one(job: tuple[str, int, Scene]) -> None:
        split, k, scene = job
        render(scene, cfg.image_size).save(out / "images" / split / f"{k:06d}.png", format="PNG", compress_level=1)

    jobs = [(split, k, scene) for split, items in scenes.items() for k, scene in enumerate(items)]
    if len(jobs) < 256:
        for job in jobs:
            one(job)
        return
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in pool.map(one, jobs, chunksize=64):
            pass


def load_world(world_dir: str) -> dict:
    """world.json of a generated world (local or s3://)."""
    return storage.read_json(storage.join(world_dir, "world.json"))


def config_from_world(world_dir: str) -> WorldConfig:
    """The WorldConfig a world was generated with."""
    return WorldConfig(**load_world(world_dir)["config"])


def world_dir_of(uri: str) -> str | None:
    """The synthetic world an input belongs to: ``uri`` itself when it is a world folder, the
    file's folder when that holds a ``world.json`` (e.g. ``<world>/finetune.parquet``), else None.

    The perturb stage and the generate stage's rule engine both decide "is this a world input,
    and which world" with this one function, so both use that world's own lexicon.
    """
    if storage.exists(storage.join(uri, "world.json")):
        return uri
    parent = uri.rsplit("/", 1)[0] if "/" in uri else "."
    return parent if storage.exists(storage.join(parent, "world.json")) else None
