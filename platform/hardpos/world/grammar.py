"""The caption grammar of the synthetic world: how a scene is said, parsed and judged true.

Contract: noun-phrase and list surface forms (:func:`np_text`, :func:`list_text`), the
relation margin (:func:`relation_value`), the parser (:func:`parse`) and exact truth
(:func:`truth`: True / False / None within the ambiguity margin), and the caption builders
(:func:`canonical_caption`, :func:`noncanonical`, :func:`finetune_synonyms`, :func:`vague`,
:func:`relation_twin`).
Pure functions of their arguments; :mod:`hardpos.world.build` captions its scenes with them.
"""
from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass
from typing import Any

from hardpos.world.scene import (COLOR_RGB, RELATIONS, SIZE_SCALE, SYNONYMS, UNSEEN_SYNONYMS, Obj, Scene, WorldConfig,
                                 mirror)

# ---------------------------------------------------------------------- grammar
_WORD_TO_CANON = {}
for _table in (SYNONYMS, UNSEEN_SYNONYMS):
    for _canon, _syn in _table.items():
        _WORD_TO_CANON[_canon] = _canon
        _WORD_TO_CANON[_syn] = _canon
#: each relation's converse ("a above b" == "b below a") and the image axis it is about
OPPOSITE = {"to the left of": "to the right of", "to the right of": "to the left of", "above": "below", "below": "above"}
AXIS = {"to the left of": "x", "to the right of": "x", "above": "y", "below": "y"}
_REL_FORMS = sorted({r for r in RELATIONS} | {t[r] for t in (SYNONYMS, UNSEEN_SYNONYMS) for r in RELATIONS},
                    key=len, reverse=True)


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


def render_caption(scene: Scene, cap: Caption, words: dict[tuple[int, str], str] | None = None,
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


def pretraining_synonym(word: str, text: str) -> str:
    """The synonym a pretraining caption ``text`` uses for ``word``: the finetuning one
    (:data:`SYNONYMS`) or the one finetuning never sees (:data:`UNSEEN_SYNONYMS`), half each,
    chosen by a stable hash of the caption and the word (no draw from the split's random
    stream, so every other caption of the world is the same whichever synonym is chosen)."""
    digest = hashlib.sha256(f"{text}\x00{word}".encode()).digest()
    return (SYNONYMS if digest[0] % 2 == 0 else UNSEEN_SYNONYMS)[word]


def finetune_synonyms(scene: Scene, cap: Caption, rate: float, key: str) -> tuple[str, int]:
    """``cap`` with each of its colour, size and relation words written with its finetuning
    synonym (:data:`SYNONYMS`) with probability ``rate``, each word on its own: (text, how many
    words were rewritten). The choice is a stable hash of ``key`` (the row), the caption and the
    word's place, not a draw from the split's random stream, so every other caption of the world
    is the same whatever the rate; ``rate`` 0 returns the caption itself."""
    if rate <= 0:
        return cap.text, 0

    def chosen(place: str) -> bool:
        digest = hashlib.sha256(f"finetune-synonym\x00{key}\x00{cap.text}\x00{place}".encode()).digest()
        return int.from_bytes(digest[:8], "big") < rate * 2 ** 64

    words = {(i, attr): SYNONYMS[getattr(scene.objects[i], attr)]
             for i in cap.objects for attr in ("color", "size") if chosen(f"{i}:{attr}")}
    relation = SYNONYMS[cap.relation] if cap.template == "relation" and cap.relation and chosen("relation") else None
    n = len(words) + (relation is not None)
    return (render_caption(scene, cap, words=words, relation=relation) if n else cap.text), n


def noncanonical(rng: random.Random, scene: Scene, cap: Caption) -> tuple[str, str]:
    """One non-canonical rewrite of a true caption (synonym or reordered list): (text, form).
    A synonym is either of the word's two (:func:`pretraining_synonym`)."""
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
        return render_caption(scene, cap, order=order), "order"
    if what == "relation":
        return render_caption(scene, cap, relation=pretraining_synonym(cap.relation, cap.text)), "relation_synonym"
    i = rng.choice(cap.objects)
    value = getattr(scene.objects[i], what)
    return render_caption(scene, cap, words={(i, what): pretraining_synonym(value, cap.text)}), f"{what}_synonym"


def relation_negative(rng: random.Random, scene: Scene, cap: Caption, cfg: WorldConfig) -> tuple[str, str] | None:
    """The REPLACE-relation hard negative of a relation caption: (new relation, negative text),
    the first of the other relations (in ``rng``'s order) whose caption is verified false of
    ``scene``; None when every other relation is true or ambiguous there."""
    pool = [r for r in RELATIONS if r != cap.relation]
    rng.shuffle(pool)
    for new in pool:
        neg = render_caption(scene, cap, relation=new)
        if truth(neg, scene, cfg) is False:
            return new, neg
    return None


def vague(scene: Scene, cap: Caption) -> str:
    """``cap`` with every noun phrase reduced to its shape ("a circle above a square"); still true
    of the scene (the named objects exist, and the caption's own pair stands in its relation)."""
    objs = scene.objects
    if cap.template == "list":
        return list_text([f"a {objs[i].shape}" for i in cap.objects])
    i, j = cap.objects
    return f"a {objs[i].shape} {cap.relation} a {objs[j].shape}"



def relation_twin(rng: random.Random, scene: Scene, cap: Caption, text: str, cfg: WorldConfig) -> tuple[Scene, str, str] | None:
    """A mirrored twin of a relation caption's scene: (twin scene, twin caption, how).

    The twin holds the same objects mirrored along the relation's axis; its caption either keeps
    the noun phrases' order and takes the converse relation ("a above b" -> "a below b", how
    "relation") or keeps the relation and exchanges the objects ("b above a", how "order").
    ``text`` is the caption as written (canonical or vague); the twin caption uses the same
    noun-phrase form.  None unless the twin caption is true of the twin and false of ``scene``
    and ``text`` is false of the twin (so a batch holding both can only match them by the relation).
    """
    if cap.template != "relation" or cap.relation is None:
        return None
    twin = mirror(scene, AXIS[cap.relation], cfg.image_size)
    i, j = cap.objects
    how = rng.choice(("relation", "order"))
    twin_cap = (Caption("", "relation", [i, j], OPPOSITE[cap.relation]) if how == "relation"
                else Caption("", "relation", [j, i], cap.relation))
    is_vague = text == vague(scene, cap)
    twin_text = vague(twin, twin_cap) if is_vague else render_caption(twin, twin_cap)
    try:
        ok = (truth(twin_text, twin, cfg) is True and truth(twin_text, scene, cfg) is False
              and truth(text, twin, cfg) is False)
    except ValueError:  # not in the grammar (cannot happen for world captions; be safe)
        return None
    return (twin, twin_text, how) if ok else None
