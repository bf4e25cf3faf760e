"""The brittleness explorer: a static HTML page of the items where evaluated models disagree.

Numbers say how often a model is brittle; this page shows where. Given the per-item scores
of two or more evaluated models (each an ``evaluate`` stage's ``scores.parquet``) and the
benchmarks they were scored on, :func:`write_explorer` writes a self-contained folder
(the thumbnails and the HTML are :mod:`hardpos.explorer_page`)::

    <out>/index.html      one page: inline CSS and JS, no server, no CDN, opens offline
    <out>/images/*.jpg    downscaled thumbnails (cropped to the item's box), referenced relatively

so the folder can be copied anywhere or logged to MLflow as an artifact and still open.

What the page shows, per benchmark: every item whose verdicts differ between the models
(the verdicts are :func:`hardpos.eval.metrics.verdicts`, the one per-item definition the
benchmark figures average), with its image, caption, hard negative and hard positive and
each model's three scores and outcome. Filters: benchmark, subset (REPLACE's attributes /
relations, swap, SugarCrepe(++) categories, a triplet file's kinds) and outcome -- one
option per combination of the models' outcomes present (e.g. ``HN-only: brittle (P<N) ·
HP+HN: correct``); every option shows how many rows it would show given the other filters.
Rows per benchmark are capped (``max_rows_per_benchmark``); the page says how many
disagreements each benchmark had and how many are shown.

A model's outcome on one item (strict comparisons: a tie counts against the model)::

    correct          s_c > s_n and s_p > s_n   (augmented-correct; without a positive: s_c > s_n)
    brittle (P<N)    s_c > s_n > s_p           (the hard positive falls below the negative)
    brittle (C<N)    s_p > s_n > s_c           (the caption falls below the negative)
    tie (P=N)        s_c > s_n, s_p == s_n
    wrong            the caption does not beat the negative and the item is not brittle

SugarCrepe++ rows also show each model's text-only verdict (the caption and the paraphrase
closer to each other than to the negative, by the text encoder alone) when the scores file
has the text cosines. Two models disagree on an item exactly when their outcomes differ (the outcome is a
one-to-one name for the verdict triple). Every text on the page (captions are user data,
model and benchmark names config values) is HTML-escaped.
"""
from __future__ import annotations

import dataclasses
import io
import shutil
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pyarrow.parquet as pq

from hardpos import storage
from hardpos.config import require
from hardpos.eval import metrics as M
from hardpos.eval.items import Item
from hardpos.eval.metrics import TEXT_COLUMNS, text_only_correct, verdicts
from hardpos.eval.report import SCORES_FILE
from hardpos.eval.spec import BenchmarkSpec
from hardpos.explorer_page import IMAGES_DIR, render_html, thumbnail_name, write_thumbnails  # noqa: F401 (re-exported)

INDEX_FILE = "index.html"


class ExplorerError(ValueError):
    """Bad input to the explorer: too few models, unreadable scores, nothing in common."""


@dataclasses.dataclass
class ExplorerConfig:
    """The brittleness explorer section of the compare stage.

    enabled: write ``explorer/`` when ``evaluations`` are given (False: never).
    evaluations: model label -> that model's evaluation: an ``evaluate`` stage's output_dir
        holding scores.parquet, the scores.parquet file itself (local or s3://), or
        ``runs:/<run_id>`` of an evaluate run in the job's tracking store; at least two.
        Empty: no explorer. The labels head the page's columns (e.g. ``HN-only``).
    benchmarks: the benchmarks those evaluations scored (the same list as the evaluate
        stage's ``benchmarks``): the page reads images and captions from them.
    world: a synthetic world folder, as in the evaluate stage (adds its three benchmarks).
    max_rows_per_benchmark: at most this many disagreement rows per benchmark on the page,
        taken in turn from every outcome combination so rare ones are shown too.
    thumbnail_px: the longest side of the thumbnails copied next to the page.
    """

    enabled: bool = True
    evaluations: dict[str, str] = dataclasses.field(default_factory=dict)
    benchmarks: list[BenchmarkSpec] = dataclasses.field(default_factory=list)
    world: str | None = None
    max_rows_per_benchmark: int = 200
    thumbnail_px: int = 160

    def __post_init__(self) -> None:
        require(self.max_rows_per_benchmark >= 1, "max_rows_per_benchmark", "must be >= 1", self.max_rows_per_benchmark)
        require(self.thumbnail_px >= 16, "thumbnail_px", "must be >= 16", self.thumbnail_px)
        require(not self.evaluations or len(self.evaluations) >= 2, "evaluations",
                "must name at least two models (label: evaluation folder) to compare", self.evaluations)

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.evaluations)


# --------------------------------------------------------------------------- scores and rows
@dataclasses.dataclass(frozen=True)
class ItemScores:
    """One model's scores for one item (``s_p`` None without a hard positive).
    ``text_only``: SugarCrepe++'s text-only verdict when the scores file has the text
    cosines (shown on the page; disagreement is decided by the image verdicts only)."""

    subset: str
    s_c: float
    s_n: float
    s_p: float | None = None
    text_only: bool | None = None


# benchmark -> item_id -> scores
ModelScores = Mapping[str, Mapping[str, ItemScores]]


def read_scores(uri: str) -> dict[str, dict[str, ItemScores]]:
    """One model's per-item scores from an evaluation folder (its ``scores.parquet``) or the
    file itself, as ``{benchmark: {item_id: ItemScores}}``. Raises :class:`ExplorerError`
    naming the file when it is absent or lacks the score columns."""
    path = uri if uri.endswith(".parquet") else storage.join(uri, SCORES_FILE)
    if not storage.exists(path):
        raise ExplorerError(f"no per-item scores at {path} (give an evaluate stage's output_dir or its {SCORES_FILE})")
    cols = pq.read_table(io.BytesIO(storage.read_bytes(path))).to_pydict()
    need = ("item_id", "benchmark", "subset", "s_c", "s_n", "s_p")
    missing = [c for c in need if c not in cols]
    if missing:
        raise ExplorerError(f"{path}: missing column(s) {missing}; expected the evaluate stage's {SCORES_FILE}")
    n = len(cols["item_id"])
    text = list(zip(*(cols[c] for c in TEXT_COLUMNS))) if all(c in cols for c in TEXT_COLUMNS) else [(None,) * 3] * n
    out: dict[str, dict[str, ItemScores]] = {}
    for (item_id, bench, subset, s_c, s_n, s_p), t in zip(zip(*(cols[c] for c in need)), text):
        tot = None if None in t else bool(text_only_correct(*t))
        out.setdefault(bench, {})[str(item_id)] = ItemScores(subset, float(s_c), float(s_n),
                                                             None if s_p is None else float(s_p), tot)
    return out


def outcome(scores: ItemScores) -> str:
    """The model's outcome on one item (names in the module docstring), from
    :func:`hardpos.eval.metrics.verdicts`."""
    v = verdicts(scores.s_c, scores.s_n, scores.s_p)
    if v["correct_augmented"] is None:
        return "correct" if v["correct_original"] else "wrong"
    if v["correct_augmented"]:
        return "correct"
    if v["brittle"]:
        return "brittle (P<N)" if v["correct_original"] else "brittle (C<N)"
    return "tie (P=N)" if v["correct_original"] else "wrong"


def outcomes(s_c, s_n, s_p) -> np.ndarray:
    """:func:`outcome` for arrays of items (``s_p`` NaN without a positive), by the same
    per-item functions :func:`hardpos.eval.metrics.verdicts` uses; an array of names."""
    c, n, p = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (s_c, s_n, s_p))
    orig, aug, brit = M.orig_correct(c, n), M.aug_correct(c, n, p), M.brittle(c, n, p)
    named = np.where(aug, "correct", np.where(brit & orig, "brittle (P<N)", np.where(
        brit, "brittle (C<N)", np.where(orig, "tie (P=N)", "wrong")))).astype(object)
    no_p = np.isnan(p)
    named[no_p] = np.where(orig[no_p], "correct", "wrong")
    return named


@dataclasses.dataclass(frozen=True)
class Row:
    """One item on which the models disagree; ``scores`` and ``outcomes`` in model order."""

    benchmark: str
    item_id: str
    subset: str
    scores: tuple[ItemScores, ...]
    outcomes: tuple[str, ...]

    def combination(self, models: Sequence[str]) -> str:
        """The outcome filter's label: ``"HN-only: brittle (P<N) · HP+HN: correct"``."""
        return " · ".join(f"{m}: {o}" for m, o in zip(models, self.outcomes))


@dataclasses.dataclass
class BenchmarkRows:
    """A benchmark's disagreements: ``rows`` (all of them, in item order), ``n_common``
    items scored for every model, ``n_partial`` items some model did not score."""

    benchmark: str
    rows: list[Row]
    n_common: int
    n_partial: int


def disagreements(models: Mapping[str, ModelScores]) -> dict[str, BenchmarkRows]:
    """Per benchmark scored by every model, the items whose outcomes differ between any two
    models (pure). Items are those every model scored, in the first model's order; the
    subset is the first model's. Raises :class:`ExplorerError` for fewer than two models or
    no benchmark in common."""
    names = list(models)
    if len(names) < 2:
        raise ExplorerError(f"the explorer compares at least two models, got {len(names)}: {names}")
    first = models[names[0]]
    common = [b for b in first if all(b in models[m] for m in names[1:])]
    if not common:
        raise ExplorerError("the models' scores share no benchmark: "
                            + "; ".join(f"{m}: {sorted(models[m])}" for m in names))
    out: dict[str, BenchmarkRows] = {}
    for bench in common:
        per_model = [models[m][bench] for m in names]
        ids = [i for i in per_model[0] if all(i in s for s in per_model[1:])]
        n_all = len(set().union(*(set(s) for s in per_model)))
        # vectorised over the items (a scalar verdicts() call per item and model costs ~5 s on REPLACE)
        named = np.stack([outcomes(*_score_arrays([s[i] for i in ids])) for s in per_model]) if ids else np.empty((len(names), 0))
        differ = (named != named[0]).any(axis=0)
        per_item = list(zip(*named.tolist()))
        rows = [Row(bench, ids[j], per_model[0][ids[j]].subset, tuple(s[ids[j]] for s in per_model), per_item[j])
                for j in np.flatnonzero(differ).tolist()]
        out[bench] = BenchmarkRows(bench, rows, n_common=len(ids), n_partial=n_all - len(ids))
    return out


def _score_arrays(scores: Sequence[ItemScores]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """s_c, s_n, s_p as float arrays (s_p NaN without a positive)."""
    return (np.array([x.s_c for x in scores], dtype=np.float64), np.array([x.s_n for x in scores], dtype=np.float64),
            np.array([np.nan if x.s_p is None else x.s_p for x in scores], dtype=np.float64))


def cap_rows(rows: Sequence[Row], cap: int, models: Sequence[str]) -> list[Row]:
    """At most ``cap`` rows, taken in turn from each outcome combination (largest first), so
    a rare combination is not crowded out; returned in the input order (pure)."""
    if len(rows) <= cap:
        return list(rows)
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.combination(models), []).append(i)
    queues = sorted(groups.values(), key=len, reverse=True)
    keep: list[int] = []
    depth = 0
    while len(keep) < cap:
        for q in queues:
            if depth < len(q) and len(keep) < cap:
                keep.append(q[depth])
        depth += 1
    return [rows[i] for i in sorted(keep)]


# --------------------------------------------------------------------------- the folder
@dataclasses.dataclass
class ExplorerResult:
    """What :func:`write_explorer` wrote: the page, per-benchmark counts, the rows shown."""

    index: Path
    counts: dict[str, dict[str, int]]
    shown: dict[str, list[Row]]
    models: list[str]


def write_explorer(models: Mapping[str, ModelScores], items: Mapping[str, Sequence[Item]], out_dir: str | Path, *,
                   max_rows_per_benchmark: int = 200, thumbnail_px: int = 160) -> ExplorerResult:
    """Write ``out_dir/index.html`` and ``out_dir/images/`` (a local folder; replaced if it
    exists) for ``models`` (label -> :func:`read_scores` output, at least two) and ``items``
    (benchmark -> its loaded :class:`Item` list). Benchmarks the models share but ``items``
    lacks are listed on the page as not shown; disagreeing items missing from ``items`` are
    counted, not shown. Raises :class:`ExplorerError` when no benchmark can be shown."""
    if max_rows_per_benchmark < 1:
        raise ExplorerError(f"max_rows_per_benchmark must be >= 1, got {max_rows_per_benchmark}")
    names = list(models)
    tables = disagreements(models)
    by_id = {b: {it.item_id: it for it in its} for b, its in items.items()}
    not_shown = {b: "not shown: no benchmark configured for it" for b in tables if b not in by_id}
    if len(not_shown) == len(tables):
        raise ExplorerError(f"none of the scored benchmarks {sorted(tables)} is configured "
                            f"(configured: {sorted(items)}); the page needs their images and captions")
    shown: dict[str, list[Row]] = {}
    counts: dict[str, dict[str, int]] = {}
    for b, t in tables.items():
        if b in not_shown:
            continue
        known = [r for r in t.rows if r.item_id in by_id[b]]
        if len(known) < len(t.rows):
            not_shown[b] = f"{len(t.rows) - len(known)} disagreeing item(s) not in the configured benchmark, not shown"
        shown[b] = cap_rows(known, max_rows_per_benchmark, names)
        counts[b] = {"items": t.n_common, "disagreements": len(t.rows), "shown": len(shown[b])}
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    thumbs = write_thumbnails([by_id[r.benchmark][r.item_id] for b in shown for r in shown[b]],
                              out / IMAGES_DIR, thumbnail_px)
    page = render_html(names, {b: tables[b] for b in shown}, shown, by_id, thumbs, cap=max_rows_per_benchmark,
                       not_shown=not_shown)
    index = out / INDEX_FILE
    index.write_text(page, encoding="utf-8")
    return ExplorerResult(index=index, counts=counts, shown=shown, models=names)
