"""Did this run show the paper's findings? One line per sign, "yes" or "no", with the margin.

The paper (Kamath et al., ECCV 2024, Tables 1 and 3) makes these claims; the demo's
results state each one for the rows it measured, so a change that breaks the effect is
visible in ``make demo``'s output (e.g. "HN-only more brittle than base (REPLACE): yes (+6.1)"):

a. the pretrained base is imperfect but not at chance on both REPLACE subsets: attribute
   and relation original accuracy each in [60, 85] %;
b. HN-only finetuning raises original accuracy over the base (REPLACE, SWAP);
c. HN-only is *more* brittle than the base (REPLACE, SWAP): the central finding;
d. HP+HN has higher augmented accuracy and lower brittleness than HN-only (REPLACE, SWAP);
e. with the w_neg grid (``--full``): original accuracy at w_neg = 1 exceeds w_neg = 0, and
   w_neg = 0 (hard positives only) is no better than the base (REPLACE, SWAP).

Margins are percentage points. Over several seeds a difference "holds" only when the mean
difference exceeds its noise ("no better than" fails only when the difference exceeds it):
with the per-seed rows (``per_seed``) the noise is the standard deviation of the per-seed
differences (a paired comparison: the models of one seed share a world and a base, so a
world that is harder for every model does not hide a consistent effect); with only the
per-cell spreads (``spreads``) it is the larger of the two cells' standard deviations. A
range sign holds when the mean lies in the range. A sign whose models are not in the rows is left
out (the w_neg grid exists only with ``--full``). Pure functions over the rows.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Literal, Mapping, Sequence

Rows = Mapping[str, Mapping[str, float]]

BENCHMARKS = (("REPLACE", "replace"), ("SWAP", "swap"))
#: (label, metric prefix) of the REPLACE subsets checked by sign (a)
SUBSETS = (("attribute", "world_replace_attribute"), ("relation", "world_replace_relation"))
BASE_RANGE = (0.60, 0.85)


@dataclasses.dataclass(frozen=True)
class Sign:
    """One sign checked on one benchmark.

    sign: "a".."e"; claim: what the paper says, in words; benchmark: REPLACE | SWAP;
    held: whether it held here; value: the margin (a - b) or, for a range, the value, in
    percentage points; noise: the std it had to beat (0.0 for a single run).
    """

    sign: str
    claim: str
    benchmark: str
    held: bool
    value: float
    noise: float = 0.0
    kind: Literal["greater", "less", "not_greater", "range"] = "greater"

    def line(self) -> str:
        if self.kind == "range":
            detail = f"{self.value:.1f}" + (f" ± {self.noise:.1f}" if self.noise else "")
        else:
            detail = f"{self.value:+.1f}" + (f", std {self.noise:.1f}" if self.noise else "")
        return f"{self.claim} ({self.benchmark}): {'yes' if self.held else 'no'} ({detail})"


def _noise(spreads: Rows, per_seed: Sequence[Rows], a: str, b: str, col: str) -> float:
    """The std the difference a - b (points) must beat: of the paired per-seed differences
    when two or more seeds have both cells, else the larger of the two cells' spreads."""
    paired = [100 * (float(r[a][col]) - float(r[b][col])) for r in per_seed
              if a in r and b in r and col in r[a] and col in r[b]]
    if len(paired) >= 2:
        return statistics.stdev(paired)
    return 100 * max(float(spreads.get(a, {}).get(col, 0.0)), float(spreads.get(b, {}).get(col, 0.0)))


def _compare(sign: str, claim: str, bench: str, kind: str, rows: Rows, spreads: Rows, a: str, b: str, col: str,
             per_seed: Sequence[Rows] = ()) -> Sign:
    diff = 100 * (float(rows[a][col]) - float(rows[b][col]))
    noise = _noise(spreads, per_seed, a, b, col)
    held = {"greater": diff > noise, "less": -diff > noise, "not_greater": diff <= noise}[kind]
    return Sign(sign, claim, bench, bool(held), round(diff, 6), round(noise, 6), kind)  # type: ignore[arg-type]


def paper_signs(rows: Rows, spreads: Rows | None = None, *, per_seed: Sequence[Rows] = (), base: str = "pretrained",
                hn_only: str = "hn-only", hp_hn: str = "hp+hn", w_neg0: str = "w_neg=0",
                w_neg1: str = "w_neg=1") -> list[Sign]:
    """Every sign (see the module doc) the rows can check, in order a..e.

    ``rows``: model -> :func:`hardpos.report.table_row` (fractions); ``spreads``: model ->
    the same keys' std over seeds (None or missing: a single run, the margin must be > 0);
    ``per_seed``: the rows of each seed (``rows`` is their mean), for paired noise.
    The model names default to the demo's (its variants and the ``--full`` grid's rows).
    """
    spreads = spreads or {}
    out: list[Sign] = []
    if base in rows:
        lo, hi = BASE_RANGE
        for label, prefix in SUBSETS:
            col = f"{prefix}/orig_acc"
            if col in rows[base]:
                v = float(rows[base][col])
                out.append(Sign("a", f"base {label} orig in [{100 * lo:.0f}, {100 * hi:.0f}]", "REPLACE",
                                lo <= v <= hi, round(100 * v, 6), round(100 * float(spreads.get(base, {}).get(col, 0.0)), 6),
                                "range"))
    checks = [
        ("b", "HN-only orig above base", "greater", hn_only, base, "orig_acc"),
        ("c", "HN-only more brittle than base", "greater", hn_only, base, "brittleness"),
        ("d", "HP+HN aug above HN-only", "greater", hp_hn, hn_only, "aug_acc"),
        ("d", "HP+HN less brittle than HN-only", "less", hp_hn, hn_only, "brittleness"),
        ("e", f"orig at {w_neg1} above {w_neg0}", "greater", w_neg1, w_neg0, "orig_acc"),
        ("e", f"{w_neg0} orig no better than base", "not_greater", w_neg0, base, "orig_acc"),
    ]
    for sign, claim, kind, a, b, fig in checks:
        if a not in rows or b not in rows:
            continue
        for bench, group in BENCHMARKS:
            col = f"{group}/{fig}"
            if col in rows[a] and col in rows[b]:
                out.append(_compare(sign, claim, bench, kind, rows, spreads, a, b, col, per_seed))
    return out


def signs_markdown(signs: list[Sign]) -> str:
    """The signs as a Markdown list under a heading that counts how many held ("" if none)."""
    if not signs:
        return ""
    held = sum(s.held for s in signs)
    lines = [f"The paper's signs in this run ({held} of {len(signs)} hold; margins in points):", ""]
    if any(s.noise for s in signs):
        lines[0] = lines[0][:-1] + "; over seeds a difference holds only when it exceeds its std over seeds):"
    lines += [f"- ({s.sign}) {s.line()}" for s in signs]
    return "\n".join(lines) + "\n"
