"""The synthetic world's vocabulary, configuration and scenes (what a world is made of).

Contract: :class:`WorldConfig` (the world's knobs and its vocabulary checks), the word tables
(``COLOR_RGB``, ``SYNONYMS``, ``UNSEEN_SYNONYMS``, ``RELATIONS``, ``SHAPES_ALL``, ``SIZE_SCALE``), the frozen
:class:`Obj` / :class:`Scene` records, :func:`sample_scene` (pure given the ``rng``) and
:func:`render` (a Pillow image of a scene).  No I/O: :mod:`hardpos.world.build` builds and
writes worlds from these.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

from hardpos.config import ConfigError

SPLITS = ("pretrain", "finetune", "benchmark")
#: the world's benchmark subsets (REPLACE positives from :data:`UNSEEN_SYNONYMS`)
BENCHMARKS = ("replace_attribute", "replace_relation", "swap")
#: the same REPLACE items with the finetuning synonyms (:data:`SYNONYMS`) as their positives
SEEN_BENCHMARKS = ("replace_attribute_seen", "replace_relation_seen")
#: every benchmark file a world folder holds
BENCHMARK_FILES = BENCHMARKS + SEEN_BENCHMARKS

COLOR_RGB = {
    "red": (220, 45, 40), "yellow": (235, 205, 40), "green": (40, 165, 70),
    "blue": (50, 95, 225), "purple": (145, 60, 185), "white": (235, 235, 235),
    "orange": (240, 135, 30), "pink": (240, 130, 180), "brown": (130, 80, 40), "gray": (140, 140, 140),
}
#: canonical word -> its rarer synonym seen in finetuning (the rule engine's REPLACE hard
#: positives; all are in the rule lexicon) and in the benchmark's "seen" REPLACE subsets
SYNONYMS = {
    "red": "crimson", "yellow": "golden", "green": "emerald", "blue": "sapphire", "purple": "violet",
    "white": "ivory", "orange": "tangerine", "pink": "rosy", "brown": "chestnut", "gray": "grey",
    "large": "big", "small": "little",
    "above": "over", "below": "beneath",
    "to the left of": "left of", "to the right of": "right of",
}
#: canonical word -> a second rare synonym that finetuning never sees (the world's lexicon for
#: the rules leaves it out): the benchmark's headline REPLACE hard positives, so a model's
#: invariance is measured on pairs it was not finetuned on. Pretraining uses both synonyms at
#: the same rate, as a web-pretrained CLIP has met both words.
UNSEEN_SYNONYMS = {
    "red": "scarlet", "yellow": "lemon", "green": "jade", "blue": "azure", "purple": "amethyst",
    "white": "snowy", "orange": "amber", "pink": "rose", "brown": "chocolate", "gray": "slate",
    "large": "sizable", "small": "miniature",
    "above": "higher than", "below": "lower than",
    "to the left of": "on the left of", "to the right of": "on the right of",
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
    colors: colour vocabulary (each must have a synonym in SYNONYMS and UNSEEN_SYNONYMS).
    shapes: shape vocabulary.
    sizes: size vocabulary (subset of small, large).
    relation_caption_rate: share of captions (of scenes with >= 2 objects) that use the
        relation template instead of the list template.
    noncanonical_rate: share of pretraining captions that use one non-canonical form
        (a synonym or a reordered list).
    finetune_synonym_rate: share of the colour, size and relation words of finetuning captions
        written with their finetuning synonym (SYNONYMS: "crimson", "little", "over"; never
        UNSEEN_SYNONYMS), each word on its own, chosen by a stable hash of the caption's row,
        text and word (no random draw: 0 leaves every file of the world as it was, and the
        pretraining captions and benchmarks never change with it). The rule engine's REPLACE
        positives then go both ways ("red" -> "crimson" and "crimson" -> "red"), so
        ``perturb positive_picks=mirrored`` can pair each substitution with its reverse: 0.5
        keeps the most. 0: finetuning captions use the canonical words only.
    binding_negative_rate: share of REPLACE-attribute benchmark items whose negative takes
        its new value from another object of the scene when one can ("a red circle and a
        blue square" -> "a blue circle and a blue square"): only the binding is wrong.
    vague_caption_rate: share of pretraining captions whose noun phrases name only the shape
        ("a circle above a square", "a circle and a square"), as web captions are often vague:
        they mention fewer attributes (a weaker attribute and binding signal) and, in a batch,
        a vague relation caption is often true of another image's objects but for the relation,
        so the relation words carry signal that fully described objects never need.
    binding_partial_captions: a binding REPLACE-attribute benchmark item (see
        binding_negative_rate) uses a caption that names the changed object but not the object
        whose value the negative takes ("a red circle" -> "a blue circle" in a scene that also
        holds a blue square), so the negative keeps every word of the caption true of the image:
        a bag-of-words model ties, only binding decides.  False: the caption names every object
        and the negative drops one of its own values (which a bag-of-words model notices).
    relation_pair_rate: share of pretraining scenes with a relation caption that get a mirrored
        twin right after them (the same objects mirrored along the relation's axis, captioned
        with the relation reversed or the two objects exchanged): a batch that holds both can
        only tell them apart by the relation, so contrastive pretraining has to learn relations
        (the rows share a ``pair`` id and follow each other; the base recipe keeps them in one
        batch by pretraining with ``shuffle_buffer=0``).
    shape_negatives: the rule engine may make a REPLACE hard negative by changing a shape
        ("circle" -> "square"); False leaves finetuning negatives to what needs binding or
        relations (colours, sizes, relations, attribute swaps): a changed shape is named by
        no object of the scene, so a bag-of-words model already rejects it.
    color_prior: share of objects whose colour is their shape's typical colour (shape k of
        ``shapes`` is typically ``colors[k % len(colors)]``); the rest draw a colour uniformly.
        A co-occurrence prior, as in web images (bananas are yellow): a replaced colour then
        often makes an atypical combination, which a text-only model can detect (the
        artefact strength of the negatives, ``python -m benchmarks.calibrate_artefacts``).
        0 draws every colour uniformly (and consumes no extra random numbers).
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
    finetune_synonym_rate: float = 0.0
    binding_negative_rate: float = 0.0
    binding_partial_captions: bool = False
    relation_pair_rate: float = 0.0
    shape_negatives: bool = True
    vague_caption_rate: float = 0.0
    color_prior: float = 0.0
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
        for name in ("relation_caption_rate", "noncanonical_rate", "binding_negative_rate", "vague_caption_rate",
                     "relation_pair_rate", "color_prior", "finetune_synonym_rate"):
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


def typical_color(cfg: WorldConfig, shape: str) -> str:
    """The colour ``color_prior`` favours for ``shape``: ``colors[k % len(colors)]`` for the k-th shape."""
    return cfg.colors[cfg.shapes.index(shape) % len(cfg.colors)]


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
            if cfg.color_prior and rng.random() < cfg.color_prior:
                color = typical_color(cfg, shape)
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


def mirror(scene: Scene, axis: str, size: int) -> Scene:
    """``scene`` with every object's centre mirrored across the image's middle along ``axis``
    ("x": left <-> right, "y": top <-> bottom); shapes are redrawn upright, so only positions change."""
    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")
    objs = tuple(dataclasses.replace(o, cx=round(size - o.cx, 2)) if axis == "x" else
                 dataclasses.replace(o, cy=round(size - o.cy, 2)) for o in scene.objects)
    return Scene(objs, scene.background)


def render(scene: Scene, size: int):
    """A Pillow RGB image of the scene."""
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

