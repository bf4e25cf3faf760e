"""The brittleness explorer's page: thumbnails and the HTML (inline CSS/JS, no CDN).

:mod:`hardpos.explorer` selects the rows (which items the models disagree on, the cap) and
writes the folder; this module turns those rows into files: a downscaled thumbnail per image
(cropped to the item's box, named by a digest so items sharing an image share a file) and the
one self-contained ``index.html``. Split from the selection so each module holds one job; the
functions are pure apart from the thumbnail writes. Every text placed on the page is
HTML-escaped (captions are user data), and filter values are short codes, so no user text is
ever compared or placed in script.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import html
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from hardpos.data.images import load_image
from hardpos.eval.items import Item

if TYPE_CHECKING:  # types only: hardpos.explorer imports this module
    from hardpos.explorer import BenchmarkRows, Row

IMAGES_DIR = "images"

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

_JS = """
(function () {
  'use strict';
  var keys = ['benchmark', 'subset', 'outcome'];
  var rows = Array.prototype.slice.call(document.querySelectorAll('#items tbody tr'));
  var selects = {};
  keys.forEach(function (k) { selects[k] = document.getElementById('f-' + k); });
  function matches(row, skip) {
    for (var i = 0; i < keys.length; i++) {
      var k = keys[i], v = selects[k].value;
      if (k !== skip && v !== '' && row.getAttribute('data-' + k) !== v) { return false; }
    }
    return true;
  }
  function update() {
    var shown = 0;
    rows.forEach(function (row) {
      var ok = matches(row, null);
      row.hidden = !ok;
      if (ok) { shown++; }
    });
    keys.forEach(function (k) {
      var counts = {}, total = 0;
      rows.forEach(function (row) {
        if (matches(row, k)) {
          var v = row.getAttribute('data-' + k);
          counts[v] = (counts[v] || 0) + 1;
          total++;
        }
      });
      Array.prototype.forEach.call(selects[k].options, function (opt) {
        var n = opt.value === '' ? total : (counts[opt.value] || 0);
        opt.textContent = opt.getAttribute('data-label') + ' (' + n + ')';
      });
    });
    document.getElementById('shown').textContent = shown + ' of ' + rows.length + ' rows shown';
  }
  keys.forEach(function (k) { selects[k].addEventListener('change', update); });
  update();
}());
"""


def _select(key: str, title: str, values: Sequence[tuple[str, str]], counts: Mapping[str, int], total: int) -> str:
    """A filter: ``values`` = (code, label); codes are what the rows' data attributes hold."""
    opts = [f'<option value="" data-label="all">all ({total})</option>']
    opts += [f'<option value="{_e(code)}" data-label="{_e(label)}">{_e(label)} ({counts.get(code, 0)})</option>'
             for code, label in values]
    return f'<label>{_e(title)} <select id="f-{key}">{"".join(opts)}</select></label>'


def render_html(models: Sequence[str], tables: Mapping[str, BenchmarkRows], shown: Mapping[str, Sequence[Row]],
                items: Mapping[str, Mapping[str, Item]], thumbs: Mapping[str, str], *, cap: int,
                not_shown: Mapping[str, str] | None = None) -> str:
    """The page (pure): ``tables`` every benchmark's disagreements, ``shown`` the capped rows
    per benchmark, ``items`` benchmark -> item_id -> :class:`Item` (captions, image),
    ``thumbs`` thumbnail file name -> relative path, ``not_shown`` benchmark -> why it is not
    on the page (or only partly). Filter values are short codes (``b0``, ``s1``, ``o2``) so no user text is
    ever compared or placed in script; every text is escaped."""
    models = list(models)
    benches = list(shown)
    all_rows = [r for b in benches for r in shown[b]]
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
    for r in all_rows:
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
        body.append(f'<tr data-benchmark="{bcode[r.benchmark]}" data-subset="{scode[r.subset]}" '
                    f'data-outcome="{ocode[combo]}"><td>{_e(r.benchmark)}<br>{_e(r.subset)}'
                    f'<div class="id">{_e(r.item_id)}</div></td><td>{img}</td><td class="cap">{caps}</td>'
                    f'{"".join(cells)}</tr>')

    def counts(attr: Mapping[str, str], key) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in all_rows:
            code = attr[key(r)]
            out[code] = out.get(code, 0) + 1
        return out

    filters = " ".join([
        _select("benchmark", "Benchmark", [(bcode[b], b) for b in benches], counts(bcode, lambda r: r.benchmark), len(all_rows)),
        _select("subset", "Subset", [(scode[s], s) for s in subsets], counts(scode, lambda r: r.subset), len(all_rows)),
        _select("outcome", "Outcome", [(ocode[c], c) for c in combos], counts(ocode, lambda r: r.combination(models)),
                len(all_rows)),
    ])
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
        "closer to each other than either to the negative.</p>",
        f'<p class="note">At most {cap} rows per benchmark are shown (explorer.max_rows_per_benchmark), '
        "taken in turn from every outcome combination.</p>",
        "".join(summary),
        f'<div class="filters">{filters} <span id="shown">{len(all_rows)} of {len(all_rows)} rows shown</span></div>',
        f'<table id="items"><thead><tr>{"".join(head)}</tr></thead><tbody>',
        "\n".join(body),
        "</tbody></table>",
        f"<script>{_JS}</script>",
        "</body></html>",
    ])
