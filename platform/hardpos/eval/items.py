"""A benchmark as the evaluator sees it: :class:`Item` (one scored unit), :class:`Benchmark`
(the items and how their figures combine), :class:`BenchmarkError`, and the two helpers every
loader shares. The loaders (:mod:`hardpos.eval.benchmarks`, :mod:`hardpos.eval.sugarcrepe_pp`,
:mod:`hardpos.eval.inline`) import these from here, so none of them imports another."""
from __future__ import annotations

import dataclasses
from typing import Any, Literal

from hardpos import storage
from hardpos.eval.spec import BenchmarkSpec

Crop = tuple[float, float, float, float]  # x, y, w, h (pixels)


class BenchmarkError(ValueError):
    """A benchmark file is missing, malformed, or its paired files disagree."""


@dataclasses.dataclass(frozen=True)
class Item:
    """One scored unit. ``image`` is a resolved local path or s3:// URI."""

    item_id: str
    subset: str
    image: str
    caption: str
    negative: str
    positive: str | None = None
    crop: Crop | None = None

    @property
    def image_key(self) -> tuple[str, Crop | None]:
        """What makes two items share one image encoding: the file and the crop."""
        return (self.image, self.crop)


@dataclasses.dataclass
class Benchmark:
    """Items of one benchmark plus how its figures combine.

    aggregate: ``"mean_of_subsets"`` (REPLACE, SugarCrepe: the paper averages subsets
        unweighted) or ``"pooled"`` (all items together).
    rejected: annotation rows that could not become items, ``{"row", "reason", ...}``.
    """

    name: str
    kind: str
    items: list[Item]
    aggregate: Literal["mean_of_subsets", "pooled"] = "pooled"
    has_positives: bool = True
    rejected: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def subsets(self) -> list[str]:
        return list(dict.fromkeys(it.subset for it in self.items))


def read_json(uri: str) -> Any:
    """A benchmark's JSON file; :class:`BenchmarkError` naming it when it is missing or not JSON."""
    if not storage.exists(uri):
        raise BenchmarkError(f"benchmark file not found: {uri}")
    try:
        return storage.read_json(uri)
    except storage.StorageError as exc:  # not JSON / not UTF-8: say which file
        raise BenchmarkError(str(exc)) from exc


def image_root_of(spec: BenchmarkSpec, default: str) -> str:
    """The folder ``spec``'s relative image paths are resolved against: ``spec.image_root``, else ``default``."""
    return spec.image_root if spec.image_root is not None else default
