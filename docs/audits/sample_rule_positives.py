#!/usr/bin/env python
"""Regenerate the unlabelled sample of rule REPLACE hard positives for a hand audit.

    python docs/audits/sample_rule_positives.py CAPTIONS OUT.tsv [--n 320] [--seed 15]
        [--rule-seed 0] [--previous LABELLED.tsv] [--exclude AUDIT.tsv ...] [--kind replace|swap]

CAPTIONS: any caption source ``hardpos`` reads (the audits use the NegCLIP COCO
validation captions, ``valid_neg_clip.tsv``). The sample is the first ``--n`` captions
of a ``--seed`` shuffle that get a positive from ``RulePerturber(seed=--rule-seed).pick(
caption, "positive", "replace")``, as the generate stage picks them.

``--previous``: an earlier labelled audit. Rows whose caption was in it are marked
``sample=same`` (else ``fresh``), and a row whose caption AND positive are unchanged
gets the earlier label and reason (the same rewrite gets the same judgement); every
other row is left for a person to label. ``--exclude``: never sample the captions of these
audit files (a held-out sample). Prints the coverage of the whole caption set.
"""
from __future__ import annotations

import argparse
import sys

from hardpos.audit.hand import read_audit, sample_rule_positives, write_audit
from hardpos.data.captions.formats import read_captions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("captions")
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=320)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--rule-seed", type=int, default=0)
    ap.add_argument("--previous", default=None)
    ap.add_argument("--exclude", nargs="*", default=[])
    ap.add_argument("--kind", choices=("replace", "swap"), default="replace")
    args = ap.parse_args(argv)

    caps = [r["caption"] for r in read_captions(args.captions)]
    skip = {r["caption"] for path in args.exclude for r in read_audit(path, labelled=False)}
    rows, stats = sample_rule_positives(caps, n=args.n, seed=args.seed, rule_seed=args.rule_seed, skip=skip,
                                        kind=args.kind)
    reused = 0
    if args.previous:
        before = {r["caption"]: r for r in read_audit(args.previous)}
        for r in rows:
            old = before.get(r["caption"])
            r["sample"] = "same" if old is not None else "fresh"
            if old is not None and old["positive"] == r["positive"]:
                r["label"], r["why"] = old["label"], old["why"]
                reused += 1
    write_audit(args.out, rows)
    print(f"{len(rows)} rows from {stats.drawn} drawn captions -> {args.out}; "
          f"{args.kind.upper()}-positive coverage of all {len(set(caps))} unique captions: {stats.coverage_all:.1%}"
          + (f"; labels carried over for {reused} unchanged rows" if args.previous else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
