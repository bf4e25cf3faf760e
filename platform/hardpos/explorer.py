"""The brittleness explorer: a static HTML page of the items where evaluated models disagree.

Numbers say how often a model is brittle; this page shows where. Given the per-item scores
of two or more evaluated models (each an ``evaluate`` stage's ``scores.parquet``) and the
benchmarks they were scored on, :func:`write_explorer` writes a self-contained folder
(the module's last two parts: the thumbnails and the HTML)::

    <out>/index.html      one page: inline CSS and JS, no server, no CDN, opens offline
    <out>/images/*.jpg    downscaled thumbnails (cropped to the item's box), referenced relatively

so the folder can be copied anywhere or logged to MLflow as an artifact and still open.

What the page shows, per benchmark: every item whose verdicts differ between the models
(the verdicts are :func:`hardpos.eval.metrics.verdicts`, the one per-item definition the
benchmark figures average), with its image, caption, hard negative and hard positive and
each model's three scores and outcome. Filters: benchmark, subset (REPLACE's attributes /
relations, swap, SugarCrepe(++) categories, a triplet file's subsets or kinds), each model's
own outcome, and the combination of all models' outcomes (e.g. ``HN-only: brittle (P<N) ·
HP+HN: correct``); every option shows how many rows it would show given the other filters.
Sorting: item order, or a model's margin ``s_p - s_n`` (lowest first: where the hard positive
falls furthest below the negative) or ``s_c - s_n``. Every disagreement is on the page, shown
``PAGE_ROWS`` at a time (previous / next), unless ``max_rows_per_benchmark`` caps them; the
page says how many disagreements each benchmark had and how many are on it.

A model's outcome on one item (strict comparisons: a tie counts against the model)::

    correct          s_c > s_n and s_p > s_n   (augmented-correct; without a positive: s_c > s_n)
    brittle (P<N)    s_c > s_n > s_p           (the hard positive falls below the negative)
    brittle (C<N)    s_p > s_n > s_c           (the caption falls below the negative)
    tie (P=N)        s_c > s_n, s_p == s_n
    wrong            the caption does not beat the negative and the item is not brittle

SugarCrepe++ rows also show each model's text-only verdict (the caption and the paraphrase
closer to each other than to the negative, by the text encoder alone) when the scores file
has the text cosines. Where the scores files carry the evaluate stage's blind baselines
(``blind_<model>_c/_n/_p``: text-only models that never see the image), every row shows each
blind model's outcome by the same definition, and a filter per blind model picks, e.g., the
items a blind model already gets right (``correct``) or those only the image can decide. Two models disagree on an item exactly when their outcomes differ (the outcome is a
one-to-one name for the verdict triple). Every text on the page (captions are user data,
model and benchmark names config values) is HTML-escaped, and filter values are short codes
(sort keys numbers), so no user text is ever compared or placed in script.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import html
import io
import json
import math
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow.parquet as pq

from hardpos import storage
from hardpos.config import require
from hardpos.data.images import load_image
from hardpos.eval import metrics
from hardpos.eval.items import Item
from hardpos.eval.metrics import TEXT_COLUMNS, text_only_correct, verdicts
from hardpos.eval.outputs import SCORES_FILE, blind_columns
from hardpos.eval.spec import BenchmarkSpec

INDEX_FILE = "index.html"
IMAGES_DIR = "images"


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
    world_dir: a synthetic world folder, as in the evaluate stage (adds its three benchmarks).
    max_rows_per_benchmark: at most this many disagreement rows per benchmark on the page,
        taken in turn from every outcome combination so rare ones are shown too (None: every
        disagreement; the page shows them a page of rows at a time).
    thumbnail_px: the longest side of the thumbnails copied next to the page.
    """

    enabled: bool = True
    evaluations: dict[str, str] = dataclasses.field(default_factory=dict)
    benchmarks: list[BenchmarkSpec] = dataclasses.field(default_factory=list)
    world_dir: str | None = None
    max_rows_per_benchmark: int | None = None
    thumbnail_px: int = 160

    def __post_init__(self) -> None:
        require(self.max_rows_per_benchmark is None or self.max_rows_per_benchmark >= 1, "max_rows_per_benchmark",
                "must be >= 1 (or null: every row)", self.max_rows_per_benchmark)
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
    cosines (shown on the page; disagreement is decided by the image verdicts only).
    ``blind``: (blind model, its outcome on the item) for every blind baseline the file has."""

    subset: str
    s_c: float
    s_n: float
    s_p: float | None = None
    text_only: bool | None = None
    blind: tuple[tuple[str, str], ...] = ()


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
    blind_models = [c[len("blind_"):-len("_c")] for c in cols if c.startswith("blind_") and c.endswith("_c")
                    and all(k in cols for k in blind_columns(c[len("blind_"):-len("_c")]))]
    blind = [_blind_outcomes(j, cols, blind_models) for j in range(n)]
    out: dict[str, dict[str, ItemScores]] = {}
    for (item_id, bench, subset, s_c, s_n, s_p), t, b in zip(zip(*(cols[c] for c in need)), text, blind):
        tot = None if None in t else bool(text_only_correct(*t))
        out.setdefault(bench, {})[str(item_id)] = ItemScores(subset, float(s_c), float(s_n),
                                                             None if s_p is None else float(s_p), tot, b)
    return out


def _blind_outcomes(j: int, cols: Mapping[str, list], models: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Row ``j``'s (blind model, outcome) pairs, for the blind models with scores on it."""
    out = []
    for m in models:
        c, n, p = (cols[k][j] for k in blind_columns(m))
        if c is not None and n is not None:
            out.append((m, outcome(ItemScores("", float(c), float(n), None if p is None else float(p)))))
    return tuple(out)


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
    orig, aug, brit = metrics.orig_correct(c, n), metrics.aug_correct(c, n, p), metrics.brittle(c, n, p)
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

    @property
    def blind(self) -> dict[str, str]:
        """blind model -> its outcome on the item (from the first model's file that has one)."""
        return dict(next((s.blind for s in self.scores if s.blind), ()))

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


def cap_rows(rows: Sequence[Row], cap: int | None, models: Sequence[str]) -> list[Row]:
    """At most ``cap`` rows (None: all), taken in turn from each outcome combination (largest
    first), so a rare combination is not crowded out; returned in the input order (pure)."""
    if cap is None or len(rows) <= cap:
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
                   max_rows_per_benchmark: int | None = None, thumbnail_px: int = 160) -> ExplorerResult:
    """Write ``out_dir/index.html`` and ``out_dir/images/`` (a local folder; replaced if it
    exists) for ``models`` (label -> :func:`read_scores` output, at least two) and ``items``
    (benchmark -> its loaded :class:`Item` list). Benchmarks the models share but ``items``
    lacks are listed on the page as not shown; disagreeing items missing from ``items`` are
    counted, not shown. Raises :class:`ExplorerError` when no benchmark can be shown."""
    if max_rows_per_benchmark is not None and max_rows_per_benchmark < 1:
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


# --------------------------------------------------------------------------- thumbnails
def thumbnail_name(item: Item) -> str:
    """The thumbnail's file name: a digest of the image and crop (items sharing an image
    and crop share one file)."""
    key = json.dumps([item.image, list(item.crop) if item.crop else None])
    return hashlib.sha1(key.encode()).hexdigest()[:20] + ".jpg"


def _write_thumbnail(item: Item, dest: Path, size: int) -> bool:
    """Write the downscaled (cropped) image; False when it cannot be read."""
    try:
        img = load_image(item.image, item.crop)
        img.thumbnail((size, size))
        img.save(dest, format="JPEG", quality=82)
        return True
    except Exception:  # noqa: BLE001 - a missing/corrupt image is shown as such, never fatal
        return False


def write_thumbnails(items: Sequence[Item], images_dir: Path, size: int, threads: int = 4) -> dict[str, str]:
    """Thumbnails of ``items``' images under ``images_dir``; returns item image key ->
    relative path (``images/<name>``) for those written (unreadable images are absent)."""
    images_dir.mkdir(parents=True, exist_ok=True)
    todo: dict[str, Item] = {}
    for it in items:
        todo.setdefault(thumbnail_name(it), it)
    with cf.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        done = dict(zip(todo, pool.map(lambda kv: _write_thumbnail(kv[1], images_dir / kv[0], size), todo.items())))
    return {name: f"{IMAGES_DIR}/{name}" for name, ok in done.items() if ok}


# --------------------------------------------------------------------------- HTML
def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4f}"


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.4em;margin:0 0 .3em}
.note{color:#555;max-width:70em}
table{border-collapse:collapse}
.summary td,.summary th{border:1px solid #ccc;padding:.2em .6em;text-align:right}
.summary td:first-child,.summary th:first-child{text-align:left}
.filters{position:sticky;top:0;background:#f6f6f6;padding:.6em;margin:1em 0;border:1px solid #ddd;z-index:1}
.filters label{margin-right:1.2em}
.filters select{max-width:36em}
#shown{font-weight:600}
#items th,#items td{border-bottom:1px solid #e3e3e3;padding:.35em .5em;vertical-align:top;text-align:left}
#items thead th{background:#fafafa}
#items img{display:block;max-width:160px;max-height:160px;border:1px solid #ccc}
.noimg{width:120px;height:60px;display:flex;align-items:center;justify-content:center;background:#eee;color:#777;font-size:12px}
.cap b{display:inline-block;width:2.2em;color:#666;font-weight:600}
.cap div{margin-bottom:.2em}
.id{color:#777;font-size:12px}
.sc{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;white-space:nowrap}
.o{display:inline-block;padding:.05em .4em;border-radius:.3em;font-size:12px;margin-bottom:.2em}
.o-correct{background:#d7f2d7}
.o-brittle{background:#fbd5d5}
.o-wrong{background:#e6e6e6}
.o-tie{background:#fff1c2}
"""

#: the outcomes a model can have on an item (module doc), in the per-model filters' order
OUTCOMES = ("correct", "brittle (P<N)", "brittle (C<N)", "tie (P=N)", "wrong")
#: rows on one page of the table (the page holds every row; "previous" / "next" reach them all)
PAGE_ROWS = 50

_JS = """
(function () {
  'use strict';
  var PAGE = %d;
  var tbody = document.querySelector('#items tbody');
  var rows = Array.prototype.slice.call(tbody.querySelectorAll('tr'));
  var selects = Array.prototype.slice.call(document.querySelectorAll('select[data-filter]'));
  var sort = document.getElementById('sort');
  var page = 0;
  function idx(row) { return Number(row.getAttribute('data-idx')); }
  function matches(row, skip) {
    for (var i = 0; i < selects.length; i++) {
      var s = selects[i], v = s.value;
      if (s !== skip && v !== '' && row.getAttribute('data-' + s.getAttribute('data-filter')) !== v) { return false; }
    }
    return true;
  }
  function key(row) {
    if (sort.value === '') { return idx(row); }
    var a = row.getAttribute('data-' + sort.value);
    return a === null || a === '' ? Infinity : Number(a);  // no hard positive: last
  }
  function update(firstPage) {
    if (firstPage) { page = 0; }
    var matched = rows.filter(function (r) { return matches(r, null); });
    matched.sort(function (a, b) {
      var ka = key(a), kb = key(b);
      if (ka < kb) { return -1; }
      if (ka > kb) { return 1; }
      return idx(a) - idx(b);
    });
    var pages = Math.max(1, Math.ceil(matched.length / PAGE));
    if (page > pages - 1) { page = pages - 1; }
    if (page < 0) { page = 0; }
    rows.forEach(function (r) { r.hidden = true; });
    matched.forEach(function (r, i) {
      tbody.appendChild(r);
      r.hidden = !(i >= page * PAGE && i < (page + 1) * PAGE);
    });
    selects.forEach(function (s) {
      var counts = {}, total = 0, attr = 'data-' + s.getAttribute('data-filter');
      rows.forEach(function (r) {
        if (matches(r, s)) { var v = r.getAttribute(attr); counts[v] = (counts[v] || 0) + 1; total++; }
      });
      Array.prototype.forEach.call(s.options, function (opt) {
        var n = opt.value === '' ? total : (counts[opt.value] || 0);
        opt.textContent = opt.getAttribute('data-label') + ' (' + n + ')';
      });
    });
    document.getElementById('shown').textContent = matched.length + ' of ' + rows.length + ' rows match';
    document.getElementById('page').textContent = 'page ' + (page + 1) + ' of ' + pages;
    document.getElementById('prev').disabled = page === 0;
    document.getElementById('next').disabled = page >= pages - 1;
  }
  selects.forEach(function (s) { s.addEventListener('change', function () { update(true); }); });
  sort.addEventListener('change', function () { update(true); });
  document.getElementById('prev').addEventListener('click', function () { page--; update(false); });
  document.getElementById('next').addEventListener('click', function () { page++; update(false); });
  update(true);
}());
""" % PAGE_ROWS


def _select(key: str, title: str, values: Sequence[tuple[str, str]], counts: Mapping[str, int], total: int) -> str:
    """A filter: ``values`` = (code, label); codes are what the rows' ``data-<key>`` hold."""
    opts = [f'<option value="" data-label="all">all ({total})</option>']
    opts += [f'<option value="{_e(code)}" data-label="{_e(label)}">{_e(label)} ({counts.get(code, 0)})</option>'
             for code, label in values]
    return f'<label>{_e(title)} <select id="f-{key}" data-filter="{key}">{"".join(opts)}</select></label>'


def _margin(a: float | None, b: float) -> str:
    """A row's sort key ``a - b`` as text for a data attribute ("" without ``a``)."""
    return "" if a is None or math.isnan(a) else f"{a - b:.6f}"


def render_html(models: Sequence[str], tables: Mapping[str, BenchmarkRows], shown: Mapping[str, Sequence[Row]],
                items: Mapping[str, Mapping[str, Item]], thumbs: Mapping[str, str], *, cap: int | None,
                not_shown: Mapping[str, str] | None = None) -> str:
    """The page (pure): ``tables`` every benchmark's disagreements, ``shown`` the capped rows
    per benchmark, ``items`` benchmark -> item_id -> :class:`Item` (captions, image),
    ``thumbs`` thumbnail file name -> relative path, ``not_shown`` benchmark -> why it is not
    on the page (or only partly). Filter values are short codes (``b0``, ``s1``, ``o2``) so no user text is
    ever compared or placed in script; every text is escaped."""
    models = list(models)
    benches = list(shown)
    all_rows = [r for b in benches for r in shown[b]]
    blind_models = list(dict.fromkeys(m for r in all_rows for m in r.blind))
    subsets = list(dict.fromkeys(r.subset for r in all_rows))
    combos = list(dict.fromkeys(sorted(r.combination(models) for r in all_rows)))
    bcode = {b: f"b{i}" for i, b in enumerate(benches)}
    scode = {s: f"s{i}" for i, s in enumerate(subsets)}
    ocode = {c: f"o{i}" for i, c in enumerate(combos)}

    summary = ['<table class="summary"><thead><tr><th>benchmark</th><th>items scored by every model</th>'
               '<th>disagreements</th><th>shown</th></tr></thead><tbody>']
    for b, t in tables.items():
        partial = f" (+{t.n_partial} not scored by every model)" if t.n_partial else ""
        summary.append(f"<tr><td>{_e(b)}</td><td>{t.n_common}{_e(partial)}</td><td>{len(t.rows)}</td>"
                       f"<td>{len(shown.get(b, []))}</td></tr>")
    summary.append("</tbody></table>")
    for b, why in (not_shown or {}).items():
        summary.append(f'<p class="note">{_e(b)}: {_e(why)}.</p>')

    head = ["<th>item</th><th>image</th><th>caption (C) · hard negative (N) · hard positive (P)</th>"]
    head += [f"<th>{_e(m)}<br><span class=\"id\">s_c / s_n / s_p</span></th>" for m in models]
    body = []
    for idx, r in enumerate(all_rows):
        it = items[r.benchmark][r.item_id]
        name = thumbnail_name(it)
        img = (f'<img src="{_e(thumbs[name])}" alt="{_e(it.image.rsplit("/", 1)[-1])}">'
               if name in thumbs else '<div class="noimg">image unavailable</div>')
        caps = (f'<div><b>C</b>{_e(it.caption)}</div><div><b>N</b>{_e(it.negative)}</div>'
                f'<div><b>P</b>{_e(it.positive) if it.positive is not None else "—"}</div>')
        cells = []
        for s, o in zip(r.scores, r.outcomes):
            cells.append(f'<td><span class="o o-{o.split(" ")[0]}">{_e(o)}</span>'
                         f'<div class="sc">{_fmt(s.s_c)} / {_fmt(s.s_n)} / {_fmt(s.s_p)}</div>'
                         + ("" if s.text_only is None else
                            f'<div class="sc">text-only: {"correct" if s.text_only else "wrong"}</div>') + "</td>")
        combo = r.combination(models)
        per_model = "".join(f' data-m{i}="v{OUTCOMES.index(o)}" data-pm{i}="{_margin(sc.s_p, sc.s_n)}"'
                            f' data-cm{i}="{_margin(sc.s_c, sc.s_n)}"' for i, (sc, o) in enumerate(zip(r.scores, r.outcomes)))
        blind = r.blind
        per_model += "".join(f' data-b{i}="v{OUTCOMES.index(blind[m])}"' if m in blind else f' data-b{i}=""'
                             for i, m in enumerate(blind_models))
        blind_text = "".join(f'<div class="id">blind {_e(m)}: {_e(o)}</div>' for m, o in blind.items())
        body.append(f'<tr data-idx="{idx}" data-benchmark="{bcode[r.benchmark]}" data-subset="{scode[r.subset]}" '
                    f'data-outcome="{ocode[combo]}"{per_model}><td>{_e(r.benchmark)}<br>{_e(r.subset)}'
                    f'<div class="id">{_e(r.item_id)}</div>{blind_text}</td><td>{img}</td><td class="cap">{caps}</td>'
                    f'{"".join(cells)}</tr>')

    def counts(attr: Mapping[str, str], key) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in all_rows:
            code = attr[key(r)]
            out[code] = out.get(code, 0) + 1
        return out

    per_model_filters = []
    sort_options = ['<option value="">item order</option>']
    for i, m in enumerate(models):
        vcode = {o: f"v{k}" for k, o in enumerate(OUTCOMES)}
        present = [o for o in OUTCOMES if any(r.outcomes[i] == o for r in all_rows)]
        per_model_filters.append(_select(f"m{i}", m, [(vcode[o], o) for o in present],
                                         counts(vcode, lambda r, i=i: r.outcomes[i]), len(all_rows)))
        sort_options.append(f'<option value="pm{i}">{_e(m)}: s_p - s_n, lowest first (the positive furthest '
                            f'below the negative)</option>')
        sort_options.append(f'<option value="cm{i}">{_e(m)}: s_c - s_n, lowest first</option>')
    blind_filters = []
    vcode_b = {o: f"v{k}" for k, o in enumerate(OUTCOMES)}
    for i, m in enumerate(blind_models):
        present = [o for o in OUTCOMES if any(r.blind.get(m) == o for r in all_rows)]
        blind_counts: dict[str, int] = {}
        for r in all_rows:
            if m in r.blind:
                blind_counts[vcode_b[r.blind[m]]] = blind_counts.get(vcode_b[r.blind[m]], 0) + 1
        blind_filters.append(_select(f"b{i}", f"blind {m} (no image)", [(vcode_b[o], o) for o in present],
                                     blind_counts, len(all_rows)))
    filters = " ".join([
        _select("benchmark", "Benchmark", [(bcode[b], b) for b in benches], counts(bcode, lambda r: r.benchmark), len(all_rows)),
        _select("subset", "Subset", [(scode[s], s) for s in subsets], counts(scode, lambda r: r.subset), len(all_rows)),
        *per_model_filters,
        *blind_filters,
        _select("outcome", "All models' outcomes", [(ocode[c], c) for c in combos],
                counts(ocode, lambda r: r.combination(models)), len(all_rows)),
        f'<label>Sort <select id="sort">{"".join(sort_options)}</select></label>',
    ])
    pager = ('<button type="button" id="prev">previous</button> <span id="page">page 1 of '
             f'{max(1, -(-len(all_rows) // PAGE_ROWS))}</span> <button type="button" id="next">next</button>')
    model_list = ", ".join(_e(m) for m in models)
    return "\n".join([
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>HardPos brittleness explorer</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Brittleness explorer</h1>",
        f'<p class="note">Models: {model_list}. Each row is an item on which the models\' verdicts differ. '
        "Scores are cosine similarities of the image with the caption (s_c), the hard negative (s_n) and the "
        "hard positive (s_p). Outcomes: <b>correct</b> = caption and positive both beat the negative; "
        "<b>brittle (P&lt;N)</b> = s_c &gt; s_n &gt; s_p; <b>brittle (C&lt;N)</b> = s_p &gt; s_n &gt; s_c; "
        "<b>tie (P=N)</b> = s_c &gt; s_n = s_p; <b>wrong</b> = the caption does not beat the negative "
        "(without a hard positive: correct / wrong by the caption alone). Ties count against the model. "
        "<b>text-only</b> (SugarCrepe++, when scored): the text encoder alone puts the caption and the positive "
        "closer to each other than either to the negative. <b>blind</b> (when the evaluations carry blind "
        "baselines): the outcome of a text-only model that never sees the image, by the same definition; its "
        "filter keeps, e.g., the items a blind model already gets right.</p>",
        (f'<p class="note">At most {cap} rows per benchmark are shown (explorer.max_rows_per_benchmark), '
         "taken in turn from every outcome combination.</p>" if cap is not None else
         f'<p class="note">Every disagreement is on the page, {PAGE_ROWS} rows at a time (previous / next). '
         "Filter by each model's outcome, and sort by a margin: s_p - s_n lowest first puts the items where "
         "the hard positive falls furthest below the negative on top.</p>"),
        "".join(summary),
        f'<div class="filters">{filters} <span id="shown">{len(all_rows)} of {len(all_rows)} rows match</span> {pager}</div>',
        f'<table id="items"><thead><tr>{"".join(head)}</tr></thead><tbody>',
        "\n".join(body),
        "</tbody></table>",
        f"<script>{_JS}</script>",
        "</body></html>",
    ])
