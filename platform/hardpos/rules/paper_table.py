"""Recover the paper's REPLACE hard-positive replacement table from its released files.

The hard_positives release (github.com/amitakamath/hard_positives) ships the REPLACE
benchmark twice: ``data/vl_checklist_{attributes,relations}.json`` (original caption vs
hard negative) and ``swapped_data/...`` (hard positive vs the *same* hard negative), row
by row.  The hard positive was made by a fixed word/phrase replacement, so diffing the
two ``true_caption`` columns word by word recovers that table exactly:

* one contiguous word-level difference per row (all but a handful of rows);
* a deletion/insertion (``on top of`` -> ``on``) is widened by one word on the left so
  both sides are phrases;
* pairs seen in fewer than :data:`MIN_ROWS` rows are the release's substring accidents
  (``covered`` -> ``covecrimson``, ``wetsuit`` -> ``dampsuit``) and are dropped;
* when the release replaced ``riding`` by ``traveling on`` and a caption already had
  "riding on", the diff shows ``riding`` -> ``traveling``; such a pair, whose target is a
  prefix of a more frequent target for the same source, is folded into that one.

:func:`derive_table` does this; the shipped ``resources/lexicons/paper_replace_table.json``
is its output (a test re-derives it from the release's files and compares).
"""
from __future__ import annotations

import difflib
import json
from collections import Counter
from pathlib import Path

MIN_ROWS = 5
SUBSETS = ("attributes", "relations")
TABLE_FILE = Path(__file__).resolve().parent.parent / "resources" / "lexicons" / "paper_replace_table.json"


def _diff(a: str, b: str) -> tuple[str, str] | None:
    ta, tb = a.split(), b.split()
    ops = [op for op in difflib.SequenceMatcher(a=ta, b=tb, autojunk=False).get_opcodes() if op[0] != "equal"]
    if len(ops) != 1:
        return None
    _, a0, a1, b0, b1 = ops[0]
    if (a0 == a1 or b0 == b1) and a0 > 0 and b0 > 0:
        a0, b0 = a0 - 1, b0 - 1  # widen an insertion/deletion by the word before it
    return " ".join(ta[a0:a1]).lower(), " ".join(tb[b0:b1]).lower()


def derive_subset(original_rows: list[dict], positive_rows: list[dict]) -> list[dict]:
    """``[{"from", "to", "rows"}]`` for one subset, most frequent first."""
    if len(original_rows) != len(positive_rows):
        raise ValueError(f"row counts differ: {len(original_rows)} vs {len(positive_rows)}")
    counts: Counter = Counter()
    for orig, pos in zip(original_rows, positive_rows):
        if orig["false_caption"] != pos["false_caption"]:
            raise ValueError(f"rows are not paired: {orig['false_caption']!r} vs {pos['false_caption']!r}")
        pair = _diff(orig["true_caption"], pos["true_caption"])
        if pair and pair[0] and pair[1]:
            counts[pair] += 1
    kept = {pair: n for pair, n in counts.items() if n >= MIN_ROWS}
    for (src, dst), n in list(kept.items()):
        longer = [(d, m) for (s, d), m in kept.items() if s == src and d != dst and d.startswith(dst + " ") and m > n]
        if longer:
            kept[(src, longer[0][0])] += kept.pop((src, dst))
    return [{"from": s, "to": d, "rows": n} for (s, d), n in sorted(kept.items(), key=lambda kv: (-kv[1], kv[0]))]


def derive_table(hard_positives_dir: str | Path) -> dict:
    """The replacement table from ``<dir>/data`` and ``<dir>/swapped_data``."""
    root = Path(hard_positives_dir)
    table: dict = {
        "provenance": {
            "source": "github.com/amitakamath/hard_positives (Kamath et al., ECCV 2024, arXiv 2409.17958)",
            "method": "word-level diff of true_caption in data/vl_checklist_<subset>.json vs "
                      "swapped_data/vl_checklist_<subset>.json, row by row (hardpos.rules.paper_table)",
            "min_rows": MIN_ROWS,
        },
    }
    for subset in SUBSETS:
        orig = json.loads((root / "data" / f"vl_checklist_{subset}.json").read_text())
        pos = json.loads((root / "swapped_data" / f"vl_checklist_{subset}.json").read_text())
        table[subset] = derive_subset(orig, pos)
        table["provenance"][f"{subset}_rows"] = len(orig)
    return table


def load_table() -> dict:
    """The shipped table (no shared data needed)."""
    return json.loads(TABLE_FILE.read_text())


if __name__ == "__main__":  # regenerate: python -m hardpos.rules.paper_table <the release's hard_positives folder>
    import sys

    TABLE_FILE.write_text(json.dumps(derive_table(sys.argv[1]), indent=1) + "\n")
    print(f"wrote {TABLE_FILE}")
