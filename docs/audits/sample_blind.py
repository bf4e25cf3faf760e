#!/usr/bin/env python
"""Draw the blind hand audit of the ``perturb`` stage's picked hard negatives and positives.

    python docs/audits/sample_blind.py OUT.tsv --source DIR_OR_FILES... [--n 200] [--seed 36]
        [--rule-seed 0] [--previous LABELLED.tsv] [--exclude AUDIT.tsv ...] [--seeded-random]

Captions: the original ``caption`` field of SugarCrepe++'s five files (``replace_att.json``,
``replace_obj.json``, ``replace_rel.json``, ``swap_att.json``, ``swap_obj.json``), read in that
order; a folder stands for its five files. The draw shuffles the unique captions with
``--seed`` and keeps the first ``--n`` that get a picked negative and the first ``--n`` that get
a picked positive (:func:`hardpos.audit.hand.sample_stage_picks`: the stage's own pick, both
kinds, the stage's default seed 0 as ``--rule-seed``; its default balanced picks over all the
captions, or with ``--seeded-random`` the picks of ``balanced_picks=false``).

``--previous``: an earlier labelled blind audit. Rows whose caption and polarity were in it are
marked ``sample=same`` (else ``fresh``); a row whose edit is unchanged gets the earlier label
and reason; every other row is left for a person to label. ``--exclude``: never sample the
captions of these audit files (their ``caption`` column).
"""
from __future__ import annotations

import argparse
import sys

from hardpos.audit.hand import (audit_captions, read_blind_audit, sample_stage_picks, sugarcrepe_pp_captions,
                                write_blind_audit)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--source", nargs="+", required=True)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--rule-seed", type=int, default=0)
    ap.add_argument("--previous", default=None)
    ap.add_argument("--exclude", nargs="*", default=[])
    ap.add_argument("--seeded-random", action="store_true", help="the picks of balanced_picks=false")
    args = ap.parse_args(argv)

    rows, drawn = sample_stage_picks(sugarcrepe_pp_captions(args.source), n=args.n, seed=args.seed,
                                     rule_seed=args.rule_seed, skip=audit_captions(args.exclude),
                                     balanced=not args.seeded_random)
    reused = 0
    if args.previous:
        before = {(r["polarity"], r["caption"]): r for r in read_blind_audit(args.previous)}
        for r in rows:
            old = before.get((r["polarity"], r["caption"]))
            r["sample"] = "same" if old is not None else "fresh"
            if old is not None and old["edit"] == r["edit"]:
                r["label"], r["why"] = old["label"], old["why"]
                reused += 1
    write_blind_audit(args.out, rows)
    n_neg = sum(r["polarity"] == "negative" for r in rows)
    print(f"{n_neg} negatives and {len(rows) - n_neg} positives from {drawn} drawn captions -> {args.out}"
          + (f"; labels carried over for {reused} unchanged rows" if args.previous else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
