"""SugarCrepe++ (benchmark kind ``sugarcrepe_pp``): two positives per image, and a text-only task.

SugarCrepe++ (Dumpala et al., NeurIPS 2024 Datasets & Benchmarks; github.com/Sri-Harsha/scpp)
gives each COCO val2017 image two positive captions -- the SugarCrepe caption and a lexically
different paraphrase -- and SugarCrepe's hard negative, in five categories.

Files (``BenchmarkSpec.path`` = the folder holding them)::

    <path>/{replace_att,replace_obj,replace_rel,swap_att,swap_obj}.json
    each a JSON list of {"id", "filename", "caption", "caption2", "negative_caption"}

``filename`` is a COCO val2017 file name, resolved against ``spec.image_root`` (e.g. the
folder ``val2017/`` unpacked from cocodataset.org's ``val2017.zip``) or, when that is None,
against ``<path>``. ``spec.limit`` keeps the first N items of *every* category.

Items map onto the platform's per-item scores: ``s_c = s(caption|i)``, ``s_p =
s(caption2|i)`` (the paraphrase is the hard positive), ``s_n = s(negative_caption|i)``, so
the paper's three figures come from :mod:`hardpos.eval.metrics` unchanged, per category and
as their unweighted mean (like SugarCrepe):

* ``orig_acc``     mean[s_c > s_n]
* ``aug_acc``      mean[s_c > s_n and s_p > s_n]  -- exactly SugarCrepe++'s image-to-text
                   score ("ITT": both positives closer to the image than the negative)
* ``brittleness``  mean[(s_c > s_n > s_p) or (s_p > s_n > s_c)]

plus the text-only task ("TOT"), which uses the text encoder alone. With ``t_cp =
cos(t(caption), t(caption2))``, ``t_cn = cos(t(caption), t(negative))`` and ``t_pn =
cos(t(caption2), t(negative))``:

* ``text_only_acc``  mean[t_cp > t_cn and t_cp > t_pn] -- the two positives are closer to
  each other than either is to the negative.

This is the definition the SugarCrepe++ authors' evaluation code follows
(``VLMs/test_NegCLIP.py`` and the other ``VLMs/test_*.py`` scripts in github.com/Sri-Harsha/scpp:
``if cos_p1p2 > cos_p1_neg and cos_p1p2 > cos_p2_neg: correct_text += 1``, where p1 is
``caption`` and p2 ``caption2``). Every comparison is strict, so a tie counts against the
model, as in the rest of the platform. The text-only figure needs no image, so it covers
every item, also those whose image is missing (``<name>/text_only_n_items`` counts them;
``<name>/n_excluded_items`` beside it says how many the image figures left out): without the
COCO images at all, the text-only figures are still reported.

Each distinct image and caption is encoded once (the evaluator's index scoring); the
text-only cosines are dot products of the same normalised caption features.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hardpos.data.triplets import resolve_image
from hardpos.eval.formats import subset_files
from hardpos.eval.items import Benchmark, BenchmarkError, Item, image_root_of, read_json
from hardpos.eval.spec import BenchmarkSpec

KIND = "sugarcrepe_pp"
TEXT_FIELDS = ("filename", "caption", "caption2", "negative_caption")


# --------------------------------------------------------------------------- loader
def _check_row(row: Any, uri: str, index: int) -> None:
    """A clear error naming the file, the item index and the field for a malformed item."""
    if not isinstance(row, dict):
        raise BenchmarkError(f"{uri} item {index}: expected an object with id, {', '.join(TEXT_FIELDS)}; "
                             f"got {type(row).__name__}")
    for field in ("id",) + TEXT_FIELDS:
        if field not in row:
            raise BenchmarkError(f"{uri} item {index}: missing field {field!r}")
    if isinstance(row["id"], bool) or not isinstance(row["id"], (int, str)):
        raise BenchmarkError(f"{uri} item {index}: field 'id' must be an integer or a string, got {row['id']!r}")
    for field in TEXT_FIELDS:
        value = row[field]
        if not isinstance(value, str) or not value.strip():
            raise BenchmarkError(f"{uri} item {index}: field {field!r} must be a non-empty string, got {value!r}")


def load(spec: BenchmarkSpec) -> Benchmark:
    """The five category files under ``spec.path`` as one :class:`Benchmark` (subsets = the
    categories, ``mean_of_subsets``). Item ids are ``<category>/<id>``. Raises
    :class:`BenchmarkError` for a missing or unparsable file, a file that is not a list, a
    malformed item (file, item index and field named) or an id repeated within a file."""
    items: list[Item] = []
    single = spec.path.lower().endswith(".json")
    root = image_root_of(spec, (spec.path.rsplit("/", 1)[0] if "/" in spec.path else ".") if single else spec.path)
    for cat, uri, _ in subset_files(KIND, spec.path):
        data = read_json(uri)
        if not isinstance(data, list):
            raise BenchmarkError(f"{uri}: expected a JSON list of {{id, {', '.join(TEXT_FIELDS)}}}, "
                                 f"got {type(data).__name__}")
        seen: dict[str, int] = {}
        for i, row in enumerate(data):
            _check_row(row, uri, i)
            key = str(row["id"])
            if key in seen:
                raise BenchmarkError(f"{uri} item {i}: id {row['id']!r} repeats item {seen[key]}")
            seen[key] = i
        rows = data if spec.limit is None else data[: spec.limit]
        for row in rows:
            items.append(Item(f"{cat}/{row['id']}", cat, resolve_image(row["filename"], root),
                              row["caption"], row["negative_caption"], row["caption2"]))
    return Benchmark(spec.name, KIND, items, aggregate="mean_of_subsets", has_positives=True)


# --------------------------------------------------------------------------- text-only task
def text_similarities(text_feats: Any, c_idx: Sequence[int], p_idx: Sequence[int], n_idx: Sequence[int]) -> dict[str, np.ndarray]:
    """Per-item text-text cosines ``{"t_cp", "t_cn", "t_pn"}`` (float64) from L2-normalised
    caption features ``text_feats`` [n_captions, D] and each item's row indices of its
    caption, positive and negative (the evaluator's caption index: each text encoded once)."""
    feats = np.asarray(text_feats.numpy() if hasattr(text_feats, "numpy") else text_feats, dtype=np.float64)
    c, p, n = (np.asarray(x, dtype=np.int64) for x in (c_idx, p_idx, n_idx))
    if (p < 0).any():
        raise ValueError("text_similarities: every SugarCrepe++ item has a positive (caption2); got an index < 0")

    def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (feats[a] * feats[b]).sum(-1)

    return {"t_cp": cos(c, p), "t_cn": cos(c, n), "t_pn": cos(p, n)}
