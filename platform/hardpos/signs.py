"""Did this run show the paper's findings? One line per sign, "held" or "not held", with the margin.

The paper (Kamath et al., ECCV 2024) reports, for CLIP ViT-B/32 finetuned on COCO, Table 1
(the base, HN-only and HP+HN on REPLACE and SWAP) and Table 3 (the w_neg grid at w_pos = 1).
The signs are what those tables show, no more (the paper's HN-only is *less* brittle than
CLIP on REPLACE, 21.0 vs 23.2, so "more brittle" is not one of them):

1. the pretrained base is imperfect but above chance on both REPLACE subsets: attribute and
   relation original accuracy each in [60, 85] %;
2. HN-only raises original accuracy over the base, and by more than the captions-only control
   does (the negatives teach something the captions alone do not): REPLACE, SWAP;
3. HN-only's drop from original to augmented accuracy is larger than the base's (paper:
   18.2 vs 14.8 REPLACE, 13.8 vs 10.9 SWAP): REPLACE, SWAP;
4. HP+HN has higher augmented accuracy and lower brittleness than HN-only: REPLACE, SWAP;
5. with the w_neg grid (``--full``, rows ``w_neg=<v>``): original accuracy at w_neg = 1 exceeds
   w_neg = 0, w_neg = 0 is the lowest of the grid and HN-only, and HN-only has the highest
   original accuracy and the highest brittleness of them: REPLACE, SWAP.

Margins are percentage points, each with the paper's own margin beside it where the paper
reports one. Over several seeds a difference holds only when the mean difference exceeds its
noise: with the per-seed rows (``per_seed``) the noise is the standard deviation of the
per-seed differences (a paired comparison: the models of one seed share a world and a base,
so a world that is harder for every model does not hide a consistent effect); with only the
per-cell spreads (``spreads``) it is the larger of the two cells' standard deviations. A
"lowest / highest of the grid" sign compares with the closest competitor. A range sign holds
when the mean lies in the range. A sign whose models are not in the rows is left out (the
w_neg grid exists only with ``--full``). Pure functions over the rows.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Literal, Mapping, Sequence

Rows = Mapping[str, Mapping[str, float]]

BENCHMARKS = (("REPLACE", "replace"), ("SWAP", "swap"))
#: (label, metric prefix) of the REPLACE subsets checked by sign 1
SUBSETS = (("attribute", "world_replace_attribute"), ("relation", "world_replace_relation"))
BASE_RANGE = (0.60, 0.85)
#: the grid's rows are named ``w_neg=<value>`` (the demo's ``--full`` sweep, w_pos = 1)
GRID_PREFIX = "w_neg="

#: The paper's Table 1 (CLIP ViT-B/32 finetuned on COCO): per model, per benchmark,
#: (original acc., augmented acc., brittleness) in %. Keys are the demo's model names.
PAPER_TABLE1: dict[str, dict[str, tuple[float, float, float]]] = {
    "pretrained": {"replace": (61.6, 46.8, 23.2), "swap": (60.5, 49.6, 21.7)},
    "hn-only": {"replace": (73.9, 55.7, 21.0), "swap": (74.3, 60.5, 25.1)},
    "hp+hn": {"replace": (69.0, 58.0, 16.9), "swap": (73.2, 61.1, 22.9)},
}
#: The paper's Table 3 (REPLACE; w_pos = 1): w_neg -> (original acc., augmented acc.,
#: brittleness) in %; w_neg = 1 is Table 1's HP+HN.
PAPER_TABLE3_REPLACE: dict[float, tuple[float, float, float]] = {
    0.0: (58.5, 49.8, 15.8), 0.25: (66.0, 55.5, 16.6), 0.5: (67.3, 56.9, 16.4), 0.75: (68.2, 57.6, 16.6),
    1.0: PAPER_TABLE1["hp+hn"]["replace"],
}
FIGURE_INDEX = {"orig_acc": 0, "aug_acc": 1, "brittleness": 2}


@dataclasses.dataclass(frozen=True)
class Sign:
    """One sign checked on one benchmark.

    sign: "1".."5"; claim: what the paper shows, in words; benchmark: REPLACE | SWAP;
    held: whether it held here; value: the margin (a - b) or, for a range, the value, in
    percentage points; noise: the std it had to beat (0.0 for a single run); paper: the
    paper's own margin (or value) in points, None where it reports none; versus: for a
    "highest / lowest" sign, the closest competitor the margin is taken to.
    """

    sign: str
    claim: str
    benchmark: str
    held: bool
    value: float
    noise: float = 0.0
    kind: Literal["greater", "less", "range"] = "greater"
    paper: float | None = None
    versus: str | None = None

    def line(self) -> str:
        fmt = "{:.1f}" if self.kind == "range" else "{:+.1f}"
        detail = fmt.format(self.value) + (f" ± {self.noise:.1f}" if self.noise else "")
        if self.versus:
            detail += f" vs {self.versus}"
        if self.paper is not None:
            detail += "; paper " + fmt.format(self.paper)
        return f"{self.claim} ({self.benchmark}): {'held' if self.held else 'not held'} ({detail})"


def with_drop(rows: Rows) -> dict[str, dict[str, float]]:
    """``rows`` plus ``<benchmark>/drop`` = original - augmented accuracy (sign 3's figure)."""
    out = {}
    for model, row in rows.items():
        row = dict(row)
        for _, group in BENCHMARKS:
            if f"{group}/orig_acc" in row and f"{group}/aug_acc" in row:
                row[f"{group}/drop"] = float(row[f"{group}/orig_acc"]) - float(row[f"{group}/aug_acc"])
        out[model] = row
    return out


def _noise(spreads: Rows, per_seed: Sequence[Rows], a: str, b: str, col: str) -> float:
    """The std the difference a - b (points) must beat: of the paired per-seed differences
    when two or more seeds have both cells, else the larger of the two cells' spreads (for
    ``drop``, of the original and augmented cells)."""
    paired = [100 * (float(r[a][col]) - float(r[b][col])) for r in per_seed
              if a in r and b in r and col in r[a] and col in r[b]]
    if len(paired) >= 2:
        return statistics.stdev(paired)
    group, fig = col.rsplit("/", 1)
    cols = [f"{group}/orig_acc", f"{group}/aug_acc"] if fig == "drop" else [col]
    return 100 * max(float(spreads.get(m, {}).get(c, 0.0)) for m in (a, b) for c in cols)


def paper_figures(model: str, group: str) -> tuple[float, float, float] | None:
    """The paper's (original acc., augmented acc., brittleness) in % for one of the demo's models
    (case-insensitive; ``w_neg=<v>`` from Table 3, REPLACE only) on ``group`` ("replace" |
    "swap"), None where the paper reports none."""
    key = model.lower()
    if key in PAPER_TABLE1:
        return PAPER_TABLE1[key][group]
    if key.startswith(GRID_PREFIX) and group == "replace":
        try:
            return PAPER_TABLE3_REPLACE.get(_grid_value(key))
        except ValueError:  # not a grid row after all ("w_neg=x")
            return None
    return None


def _paper_value(model: str, group: str, fig: str) -> float | None:
    """The paper's figure (%) for one of the demo's models, None where it reports none."""
    t = paper_figures(model, group)
    if t is None:
        return None
    return t[0] - t[1] if fig == "drop" else t[FIGURE_INDEX[fig]]


def _paper_margin(a: str, b: str, group: str, fig: str) -> float | None:
    va, vb = _paper_value(a, group, fig), _paper_value(b, group, fig)
    return round(va - vb, 6) if va is not None and vb is not None else None


def _compare(sign: str, claim: str, bench: str, kind: str, rows: Rows, spreads: Rows, a: str, b: str, col: str,
             per_seed: Sequence[Rows] = ()) -> Sign:
    """a - b on ``col``; "greater" holds when it exceeds its noise, "less" when -(a - b) does."""
    diff = 100 * (float(rows[a][col]) - float(rows[b][col]))
    noise = _noise(spreads, per_seed, a, b, col)
    held = diff > noise if kind == "greater" else -diff > noise
    group, fig = col.split("/", 1)
    return Sign(sign, claim, bench, bool(held), round(diff, 6), round(noise, 6), kind,  # type: ignore[arg-type]
                _paper_margin(a, b, group, fig))


def _grid_value(name: str) -> float:
    return float(name[len(GRID_PREFIX):])


def _extreme(sign: str, claim: str, bench: str, rows: Rows, spreads: Rows, per_seed: Sequence[Rows], model: str,
             others: Sequence[str], col: str, highest: bool) -> Sign | None:
    """``model`` has the highest (or lowest) ``col`` of ``model`` + ``others``: compared with the
    closest competitor (the other with the highest, or lowest, mean)."""
    if model not in rows or not others or any(col not in rows[o] for o in (model, *others)):
        return None
    pick = max if highest else min
    rival = pick(others, key=lambda o: float(rows[o][col]))
    found = _compare(sign, claim, bench, "greater" if highest else "less", rows, spreads, model, rival, col, per_seed)
    # the paper's margin to its own closest competitor among the same models
    group, fig = col.split("/", 1)
    reported = [(o, _paper_value(o, group, fig)) for o in others]
    own, known = _paper_value(model, group, fig), [(o, v) for o, v in reported if v is not None]
    paper = None
    if own is not None and len(known) == len(others):
        paper = round(own - pick(known, key=lambda ov: ov[1])[1], 6)
    return dataclasses.replace(found, paper=paper, versus=rival)


def paper_signs(rows: Rows, spreads: Rows | None = None, *, per_seed: Sequence[Rows] = (), base: str = "pretrained",
                captions_only: str = "captions-only", hn_only: str = "hn-only", hp_hn: str = "hp+hn") -> list[Sign]:
    """Every sign (see the module doc) the rows can check, in order 1..5.

    ``rows``: model -> :func:`hardpos.report.table_row` (fractions); ``spreads``: model ->
    the same keys' std over seeds (None or missing: a single run, the margin must be > 0);
    ``per_seed``: the rows of each seed (``rows`` is their mean), for paired noise.
    The model names default to the demo's (its variants and the ``--full`` grid's
    ``w_neg=<v>`` rows).
    """
    spreads = spreads or {}
    rows = with_drop(rows)
    per_seed = [with_drop(r) for r in per_seed]
    out: list[Sign] = []
    if base in rows:
        lo, hi = BASE_RANGE
        for label, prefix in SUBSETS:
            col = f"{prefix}/orig_acc"
            if col in rows[base]:
                v = float(rows[base][col])
                out.append(Sign("1", f"base {label} orig in [{100 * lo:.0f}, {100 * hi:.0f}]", "REPLACE",
                                lo <= v <= hi, round(100 * v, 6), round(100 * float(spreads.get(base, {}).get(col, 0.0)), 6),
                                "range"))
    pairs = [
        ("2", "HN-only orig above base", "greater", hn_only, base, "orig_acc"),
        ("2", "HN-only orig above captions-only", "greater", hn_only, captions_only, "orig_acc"),
        ("3", "HN-only drops more from orig to aug than base", "greater", hn_only, base, "drop"),
        ("4", "HP+HN aug above HN-only", "greater", hp_hn, hn_only, "aug_acc"),
        ("4", "HP+HN less brittle than HN-only", "less", hp_hn, hn_only, "brittleness"),
    ]
    for sign, claim, kind, a, b, fig in pairs:
        if a not in rows or b not in rows:
            continue
        for bench, group in BENCHMARKS:
            col = f"{group}/{fig}"
            if col in rows[a] and col in rows[b]:
                out.append(_compare(sign, claim, bench, kind, rows, spreads, a, b, col, per_seed))
    grid = sorted((m for m in rows if m.startswith(GRID_PREFIX)), key=_grid_value)
    w0, w1 = f"{GRID_PREFIX}0", f"{GRID_PREFIX}1"
    if w0 in grid and w1 in grid:
        rest = [m for m in grid if m != w0] + ([hn_only] if hn_only in rows else [])
        for bench, group in BENCHMARKS:
            col = f"{group}/orig_acc"
            out.append(_compare("5", f"orig at {w1} above {w0}", bench, "greater", rows, spreads, w1, w0, col, per_seed))
            found = [_extreme("5", f"{w0} lowest orig of the grid and HN-only", bench, rows, spreads, per_seed, w0,
                              rest, col, highest=False)]
            if hn_only in rows:
                found += [_extreme("5", "HN-only highest orig of the grid", bench, rows, spreads, per_seed, hn_only,
                                   grid, col, highest=True),
                          _extreme("5", "HN-only most brittle of the grid", bench, rows, spreads, per_seed, hn_only,
                                   grid, f"{group}/brittleness", highest=True)]
            out += [s for s in found if s is not None]
    return out


def signs_markdown(signs: list[Sign]) -> str:
    """The signs as a Markdown list under a heading that counts how many held ("" if none)."""
    if not signs:
        return ""
    held = sum(s.held for s in signs)
    head = f"The paper's signs in this run ({held} of {len(signs)} held; margins in points, the paper's beside them"
    head += "; over seeds a difference holds only when it exceeds its std over seeds):" if any(s.noise for s in signs) else "):"
    return "\n".join([head, ""] + [f"- ({s.sign}) {s.line()}" for s in signs]) + "\n"
