#!/usr/bin/env python
"""Regression report of the hand-labelled audits: what their labels still say about the current rules.

    python docs/audits/report.py [AUDIT.tsv ...] [--negclip valid_neg_clip.tsv]
        [--sugarcrepe-pp SUGARCREPE_PP_DIR] [--json OUT.json]

For each labelled audit file (all that ``draws.json`` names, or the ones given), its draw (the
command in README.md, recorded in ``draws.json``) is run again with the current rules
(:func:`hardpos.audit.hand.report_audits`). Per polarity it prints how many labelled rows the
rules still produce (same caption, same edit) and how they were labelled (ok / wrong / doubtful;
a blind audit's ungrammatical, not-different and meaning-changing rows count as wrong), how many
they no longer produce, and how many rows they now produce that await a label (label them with
the sampler's ``--previous``, which carries the labels of unchanged rows).

Without a draw's captions (``--negclip`` for the rule-positive audits, ``--sugarcrepe-pp`` for
the blind ones) its labelled captions are picked again one by one (``caption_local``: no
refill, so captions the draw would now take instead are not counted); a balanced blind draw
needs its captions and is reported as ``needs_captions``.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from hardpos.audit.hand import report_audits, sugarcrepe_pp_captions
from hardpos.data.captions.formats import read_captions

HERE = Path(__file__).resolve().parent
COLUMNS = ("file", "polarity", "mode", "labelled", "still", "ok", "wrong", "doubtful", "gone", "awaiting")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("audits", nargs="*", help="audit files of this folder (default: every file draws.json names)")
    ap.add_argument("--negclip", default=None, help="valid_neg_clip.tsv: the rule-positive audits' captions")
    ap.add_argument("--sugarcrepe-pp", default=None, help="SugarCrepe++'s folder: the blind audits' captions")
    ap.add_argument("--audit-dir", default=str(HERE), help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also write the report as JSON")
    args = ap.parse_args(argv)

    captions: dict[str, list[str]] = {}
    if args.negclip:
        captions["negclip"] = [r["caption"] for r in read_captions(args.negclip)]
    if args.sugarcrepe_pp:
        captions["sugarcrepe_pp"] = sugarcrepe_pp_captions([args.sugarcrepe_pp])
    names = [Path(a).name for a in args.audits] or None
    reports = report_audits(args.audit_dir, captions=captions, names=names)

    rows = []
    for rep in reports:
        if not rep.polarities:
            rows.append((rep.name, "-", rep.mode, *["-"] * 7))
        for pol, r in rep.polarities.items():
            rows.append((rep.name, pol, rep.mode, r.labelled, r.still_produced, r.ok, r.wrong, r.doubtful,
                         r.no_longer_produced, r.awaiting_label))
    widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *rows)]
    for row in (COLUMNS, *rows):
        print("  ".join(str(x).ljust(w) if i < 3 else str(x).rjust(w) for i, (x, w) in enumerate(zip(row, widths))))
    if args.json:
        Path(args.json).write_text(json.dumps([{"file": rep.name, "mode": rep.mode,
                                                "polarities": {p: asdict(r) for p, r in rep.polarities.items()}}
                                               for rep in reports], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
