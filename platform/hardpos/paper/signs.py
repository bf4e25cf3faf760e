"""Did this run show the paper's findings? One line per check: held, not held, or inside the noise.

The paper (Kamath et al., ECCV 2024) reports, for CLIP ViT-B/32 finetuned on COCO, Table 1
(the base, HN-only and HP+HN on REPLACE and SWAP; (d): hard positives of one kind only) and
Table 3 (the w_neg grid at w_pos = 1, on REPLACE and SWAP). The paper's signs are what those
tables show, no more (the paper's HN-only is *less* brittle than CLIP on REPLACE, 21.0 vs 23.2,
so "more brittle than the base" is not one of them):

1. HN-only raises original accuracy over the base (Table 1): REPLACE, SWAP;
2. HN-only's drop from original to augmented accuracy is larger than the base's (Table 1;
   paper: 18.2 vs 14.8 REPLACE, 13.8 vs 10.9 SWAP): REPLACE, SWAP;
3. HP+HN has higher augmented accuracy and lower brittleness than HN-only (Table 1): REPLACE, SWAP;
4. the w_neg grid (Table 3; ``--full``, rows ``w_neg=<v>``): original accuracy at w_neg = 1
   exceeds w_neg = 0, w_neg = 0 is the lowest of the grid and HN-only, HN-only has the highest
   original accuracy and the highest brittleness of them: REPLACE, SWAP;
5. hard positives of one kind improve invariance on that kind only (Table 1(d); ``--full``,
   rows ``hp-replace+hn`` and ``hp-swap+hn``): the brittleness they save against HN-only is
   larger on their own benchmark than on the other.

The testbed's own sanity checks are listed apart (:func:`sanity_checks`): the base is imperfect
but above chance on both REPLACE subsets (attribute and relation original accuracy in
[60, 85] %), and HN-only beats the captions-only control on original accuracy.

How a check is decided (margins in percentage points, the paper's own margin beside them):

* over seeds (``per_seed``: each seed's rows; the models of one seed share a world and a base,
  so the comparison is paired): a one-sided paired t-test of the per-seed differences at
  ``alpha`` (default 0.05); held when p < alpha. The line shows mean ± std, t, p and n.
  With k checks about k x alpha of them read "held" by chance when nothing is real; the
  Markdown says so under the list.
* one run (``floors``: a noise floor per check measured by a multi-seed calibration,
  :func:`floors_from`): held only when the margin passes its floor in the paper's direction
  AND the calibration found the check held (a single run never claims more than the seeds
  support); "inside the noise" when the margin is within the floor. Without a floor for a
  check, one run cannot tell: it reads "no noise floor" (never "held").
* only per-cell spreads (no per-seed rows): held when the mean difference exceeds the larger
  of the two cells' standard deviations (a rough rule, kept for old aggregates).

A "lowest / highest of the grid" check compares with the closest competitor (by mean). A range
check holds when the mean lies in the range. A check whose models are not in the rows is left
out. Pure functions over the rows; the t distribution is ``scipy.stats.t``; the mean ± std
over seeds of every cell is :func:`aggregate` (what the tables of several seeds show).
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence

from scipy import stats

Rows = Mapping[str, Mapping[str, float]]

BENCHMARKS = (("REPLACE", "replace"), ("SWAP", "swap"))
#: (label, metric prefix) of the REPLACE subsets checked by the base-range sanity check
SUBSETS = (("attribute", "world_replace_attribute"), ("relation", "world_replace_relation"))
BASE_RANGE = (0.60, 0.85)
#: the grid's rows are named ``w_neg=<value>`` (the demo's ``--full`` sweep, w_pos = 1)
GRID_PREFIX = "w_neg="
#: the demo's Table 1(d) rows: HP+HN trained with the hard positives of one kind only
KIND_MODELS = (("hp-replace+hn", "REPLACE", "replace"), ("hp-swap+hn", "SWAP", "swap"))
ALPHA = 0.05
#: one-sided standard normal quantile at ALPHA: a single run's floor is Z x the per-seed std
Z_ONE_SIDED = 1.6448536269514722
#: the noise floors the demo's single run is judged by (written by ``python -m benchmarks.calibrate signs``)
FLOORS_PATH = Path(__file__).parents[1] / "resources" / "signs_noise.json"


def p_text(p: float) -> str:
    """A p-value as a table prints it: three decimals, and "p < 0.001" below that."""
    return "p < 0.001" if p < 0.0005 else f"p = {p:.3f}"


#: The paper's Table 1 (CLIP ViT-B/32 finetuned on COCO): per model, per benchmark,
#: (original acc., augmented acc., brittleness) in %. Keys are the demo's model names.
PAPER_TABLE1: dict[str, dict[str, tuple[float, float, float]]] = {
    "pretrained": {"replace": (61.6, 46.8, 23.2), "swap": (60.5, 49.6, 21.7)},
    "hn-only": {"replace": (73.9, 55.7, 21.0), "swap": (74.3, 60.5, 25.1)},
    "hp+hn": {"replace": (69.0, 58.0, 16.9), "swap": (73.2, 61.1, 22.9)},
}
#: The paper's Table 3 (w_pos = 1): benchmark -> w_neg -> (original acc., augmented acc.,
#: brittleness) in %; w_neg = 1 is Table 1's HP+HN.
PAPER_TABLE3: dict[str, dict[float, tuple[float, float, float]]] = {
    "replace": {0.0: (58.5, 49.8, 15.8), 0.25: (66.0, 55.5, 16.6), 0.5: (67.3, 56.9, 16.4), 0.75: (68.2, 57.6, 16.6),
                1.0: PAPER_TABLE1["hp+hn"]["replace"]},
    "swap": {0.0: (64.1, 51.2, 25.0), 0.25: (71.6, 59.8, 22.8), 0.5: (72.5, 60.5, 22.8), 0.75: (72.9, 61.0, 22.7),
             1.0: PAPER_TABLE1["hp+hn"]["swap"]},
}
PAPER_TABLE3_REPLACE = PAPER_TABLE3["replace"]
FIGURE_INDEX = {"orig_acc": 0, "aug_acc": 1, "brittleness": 2}


# --------------------------------------------------------------------------- statistics
def aggregate(per_seed: Sequence[Mapping[str, Mapping[str, float]]]) -> tuple[dict, dict]:
    """Mean and (sample) standard deviation over seeds: (model -> col -> mean, model -> col -> std).

    Models present in every seed only; std is 0.0 for a single seed."""
    if not per_seed:
        raise ValueError("no seeds to aggregate")
    models = [m for m in per_seed[0] if all(m in s for s in per_seed)]
    mean: dict[str, dict[str, float]] = {}
    std: dict[str, dict[str, float]] = {}
    for m in models:
        cols = [c for c in per_seed[0][m] if all(c in s[m] for s in per_seed)]
        mean[m], std[m] = {}, {}
        for c in cols:
            vals = [float(s[m][c]) for s in per_seed]
            mu = sum(vals) / len(vals)
            mean[m][c] = mu
            std[m][c] = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return mean, std


@dataclasses.dataclass(frozen=True)
class Paired:
    """A one-sided paired t-test of per-seed differences (H1: mean > 0): n, mean, std, t, p."""

    n: int
    mean: float
    sd: float
    t: float
    p: float


def paired_test(diffs: Sequence[float]) -> Paired:
    """One-sided paired t-test that the mean of ``diffs`` is above 0 (needs n >= 2). Zero
    spread: p is 0 for a positive mean and 1 otherwise."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"paired_test needs at least 2 differences, got {n}")
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    if sd == 0:
        return Paired(n, mean, 0.0, math.copysign(math.inf, mean) if mean else 0.0, 0.0 if mean > 0 else 1.0)
    t = mean / (sd / math.sqrt(n))
    return Paired(n, mean, sd, t, float(stats.t.sf(t, n - 1)))


# --------------------------------------------------------------------------- one check
Status = Literal["held", "not held", "inside the noise", "not held over seeds", "no noise floor"]


@dataclasses.dataclass(frozen=True)
class Sign:
    """One check on one benchmark.

    sign: "1".."5" (the paper's) or "S1", "S2" (the testbed's sanity checks); claim: what
    is checked, in words; benchmark: REPLACE | SWAP; held: whether it held here; value: the
    margin (a - b) or, for a range, the value, in percentage points (over seeds: the mean);
    noise: over seeds the std of the per-seed differences, for one run its noise floor (0.0:
    none); kind: the direction the paper shows; paper: the paper's own margin (or value) in
    points, None where it reports none; versus: for a "highest / lowest" check, the closest
    competitor; n, t, p: the paired test over seeds (n = 1 for one run); status: the verdict
    in words (see the module doc).
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
    n: int = 1
    t: float | None = None
    p: float | None = None
    status: str = ""

    @property
    def key(self) -> str:
        """The check's identity in a floors file: ``<sign>|<claim>|<benchmark>``."""
        return f"{self.sign}|{self.claim}|{self.benchmark}"

    @property
    def verdict(self) -> str:
        return self.status or ("held" if self.held else "not held")

    def line(self) -> str:
        fmt = "{:.1f}" if self.kind == "range" else "{:+.1f}"
        detail = fmt.format(self.value)
        if self.n > 1 and self.kind != "range":
            detail += f" ± {self.noise:.1f}, t = {self.t:.2f}, {p_text(self.p)}, n = {self.n}"
        elif self.n > 1:
            detail += f" ± {self.noise:.1f}, n = {self.n}"
        elif self.noise:
            detail += f", floor {self.noise:.1f}" if self.status else f" ± {self.noise:.1f}"
        if self.versus:
            detail += f" vs {self.versus}"
        if self.paper is not None:
            detail += "; paper " + fmt.format(self.paper)
        return f"{self.claim} ({self.benchmark}): {self.verdict} ({detail})"


def with_drop(rows: Rows) -> dict[str, dict[str, float]]:
    """``rows`` plus ``<benchmark>/drop`` = original - augmented accuracy (sign 2's figure)."""
    out = {}
    for model, row in rows.items():
        row = dict(row)
        for _, group in BENCHMARKS:
            if f"{group}/orig_acc" in row and f"{group}/aug_acc" in row:
                row[f"{group}/drop"] = float(row[f"{group}/orig_acc"]) - float(row[f"{group}/aug_acc"])
        out[model] = row
    return out


def paper_figures(model: str, group: str) -> tuple[float, float, float] | None:
    """The paper's (original acc., augmented acc., brittleness) in % for one of the demo's models
    (case-insensitive; ``w_neg=<v>`` from Table 3) on ``group`` ("replace" | "swap"), None
    where the paper reports none."""
    key = model.lower()
    if key in PAPER_TABLE1:
        return PAPER_TABLE1[key][group]
    if key.startswith(GRID_PREFIX):
        try:
            return PAPER_TABLE3[group].get(_grid_value(key))
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


def _grid_value(name: str) -> float:
    return float(name[len(GRID_PREFIX):])


Diff = Callable[[Rows], float]


@dataclasses.dataclass
class _Judge:
    """Decides every check of one call the same way (over seeds, one run with floors, spreads)."""

    rows: Rows
    spreads: Rows
    per_seed: Sequence[Rows]
    floors: Mapping[str, Mapping[str, float]] | None
    alpha: float

    def decide(self, sign: str, claim: str, bench: str, kind: str, diff: Diff, needs: Sequence[tuple[str, str]],
               paper: float | None, spread_cells: Sequence[tuple[str, str]] = ()) -> Sign:
        value = 100 * diff(self.rows)
        direction = 1.0 if kind == "greater" else -1.0
        seeds = [r for r in self.per_seed if all(m in r and c in r[m] for m, c in needs)]
        base = dict(sign=sign, claim=claim, benchmark=bench, value=round(value, 6), kind=kind, paper=paper)
        if len(seeds) >= 2:
            diffs = [direction * 100 * diff(r) for r in seeds]
            test = paired_test(diffs)
            held = test.p < self.alpha
            return Sign(**base, held=held, noise=round(test.sd, 6), n=test.n, t=round(direction * test.t, 6),
                        p=round(test.p, 6))
        if self.floors is not None:
            key = f"{sign}|{claim}|{bench}"
            entry = self.floors.get(key)
            if entry is None:
                return Sign(**base, held=False, status="no noise floor")
            floor = float(entry["floor"])
            directed = direction * value
            if abs(value) <= floor:
                return Sign(**base, held=False, noise=round(floor, 6), status="inside the noise")
            if directed > floor and not entry.get("held", False):
                return Sign(**base, held=False, noise=round(floor, 6), status="not held over seeds")
            return Sign(**base, held=directed > floor, noise=round(floor, 6),
                        status="held" if directed > floor else "not held")
        noise = 100 * max((float(self.spreads.get(m, {}).get(c, 0.0)) for m, c in spread_cells), default=0.0)
        return Sign(**base, held=direction * value > noise, noise=round(noise, 6))


def _cells(model: str, col: str) -> list[tuple[str, str]]:
    """The table cells a figure reads (``drop``: its original and augmented accuracy)."""
    group, fig = col.split("/", 1)
    return [(model, f"{group}/orig_acc"), (model, f"{group}/aug_acc")] if fig == "drop" else [(model, col)]


def _compare(j: _Judge, sign: str, claim: str, bench: str, kind: str, a: str, b: str, col: str,
             versus: str | None = None) -> Sign:
    """a - b on ``col``; "greater" is the paper's direction when a is above b, "less" below."""
    group, fig = col.split("/", 1)
    found = j.decide(sign, claim, bench, kind, lambda r: float(r[a][col]) - float(r[b][col]),
                     [(a, col), (b, col)], _paper_margin(a, b, group, fig), _cells(a, col) + _cells(b, col))
    return dataclasses.replace(found, versus=versus) if versus else found


def _extreme(j: _Judge, sign: str, claim: str, bench: str, model: str, others: Sequence[str], col: str,
             highest: bool) -> Sign | None:
    """``model`` has the highest (or lowest) ``col`` of ``model`` + ``others``: compared with the
    closest competitor (the other with the highest, or lowest, mean)."""
    rows = j.rows
    if model not in rows or not others or any(col not in rows[o] for o in (model, *others)):
        return None
    pick = max if highest else min
    rival = pick(others, key=lambda o: float(rows[o][col]))
    found = _compare(j, sign, claim, bench, "greater" if highest else "less", model, rival, col, versus=rival)
    # the paper's margin to its own closest competitor among the same models
    group, fig = col.split("/", 1)
    reported = [(o, _paper_value(o, group, fig)) for o in others]
    own, known = _paper_value(model, group, fig), [(o, v) for o, v in reported if v is not None]
    paper = None
    if own is not None and len(known) == len(others):
        paper = round(own - pick(known, key=lambda ov: ov[1])[1], 6)
    return dataclasses.replace(found, paper=paper)


def _judge(rows: Rows, spreads: Rows | None, per_seed: Sequence[Rows],
           floors: Mapping[str, Mapping[str, float]] | None, alpha: float) -> _Judge:
    return _Judge(with_drop(rows), spreads or {}, [with_drop(r) for r in per_seed], floors, alpha)


def paper_signs(rows: Rows, spreads: Rows | None = None, *, per_seed: Sequence[Rows] = (),
                floors: Mapping[str, Mapping[str, float]] | None = None, alpha: float = ALPHA,
                base: str = "pretrained", hn_only: str = "hn-only", hp_hn: str = "hp+hn") -> list[Sign]:
    """Every one of the paper's signs (see the module doc) the rows can check, in order 1..5.

    ``rows``: model -> :func:`hardpos.paper.table1.table_row` (fractions; over seeds their mean);
    ``per_seed``: the rows of each seed, for the paired test; ``floors``: check key ->
    ``{"floor": points, "held": bool}`` for a single run (:func:`load_floors`); ``spreads``:
    model -> the same keys' std over seeds, used only without ``per_seed`` and ``floors``.
    The model names default to the demo's (its variants, the ``--full`` grid's ``w_neg=<v>``
    rows and the Table 1(d) rows :data:`KIND_MODELS`).
    """
    j = _judge(rows, spreads, per_seed, floors, alpha)
    rows = j.rows
    out: list[Sign] = []
    pairs = [
        ("1", "HN-only orig above base", "greater", hn_only, base, "orig_acc"),
        ("2", "HN-only drops more from orig to aug than base", "greater", hn_only, base, "drop"),
        ("3", "HP+HN aug above HN-only", "greater", hp_hn, hn_only, "aug_acc"),
        ("3", "HP+HN less brittle than HN-only", "less", hp_hn, hn_only, "brittleness"),
    ]
    for sign, claim, kind, a, b, fig in pairs:
        if a not in rows or b not in rows:
            continue
        for bench, group in BENCHMARKS:
            col = f"{group}/{fig}"
            if col in rows[a] and col in rows[b]:
                out.append(_compare(j, sign, claim, bench, kind, a, b, col))
    grid = sorted((m for m in rows if m.startswith(GRID_PREFIX)), key=_grid_value)
    w0, w1 = f"{GRID_PREFIX}0", f"{GRID_PREFIX}1"
    if w0 in grid and w1 in grid:
        rest = [m for m in grid if m != w0] + ([hn_only] if hn_only in rows else [])
        for bench, group in BENCHMARKS:
            col = f"{group}/orig_acc"
            out.append(_compare(j, "4", f"orig at {w1} above {w0}", bench, "greater", w1, w0, col))
            found = [_extreme(j, "4", f"{w0} lowest orig of the grid and HN-only", bench, w0, rest, col, highest=False)]
            if hn_only in rows:
                found += [_extreme(j, "4", "HN-only highest orig of the grid", bench, hn_only, grid, col, highest=True),
                          _extreme(j, "4", "HN-only most brittle of the grid", bench, hn_only, grid,
                                   f"{group}/brittleness", highest=True)]
            out += [s for s in found if s is not None]
    if hn_only in rows:
        for model, bench, own in KIND_MODELS:
            if model not in rows:
                continue
            other = "swap" if own == "replace" else "replace"
            cols = (f"{own}/brittleness", f"{other}/brittleness")
            if not all(c in rows[m] for c in cols for m in (model, hn_only)):
                continue

            def saved(r: Rows, m: str = model) -> float:  # brittleness saved against HN-only, own minus other
                return ((float(r[hn_only][cols[0]]) - float(r[m][cols[0]]))
                        - (float(r[hn_only][cols[1]]) - float(r[m][cols[1]])))

            out.append(j.decide("5", f"{model} saves more brittleness on {bench} than on the other benchmark",
                                bench, "greater", saved, [(mm, c) for mm in (model, hn_only) for c in cols], None,
                                [(mm, c) for mm in (model, hn_only) for c in cols]))
    return out


def sanity_checks(rows: Rows, spreads: Rows | None = None, *, per_seed: Sequence[Rows] = (),
                  floors: Mapping[str, Mapping[str, float]] | None = None, alpha: float = ALPHA,
                  base: str = "pretrained", captions_only: str = "captions-only", hn_only: str = "hn-only") -> list[Sign]:
    """The testbed's own checks, not the paper's: S1 the base is imperfect but above chance on
    both REPLACE subsets (original accuracy in [60, 85] %, the mean over seeds); S2 HN-only
    beats the captions-only control on original accuracy (decided as the paper's signs are)."""
    j = _judge(rows, spreads, per_seed, floors, alpha)
    rows = j.rows
    out: list[Sign] = []
    if base in rows:
        lo, hi = BASE_RANGE
        for label, prefix in SUBSETS:
            col = f"{prefix}/orig_acc"
            if col in rows[base]:
                v = float(rows[base][col])
                vals = [100 * float(r[base][col]) for r in j.per_seed if base in r and col in r[base]]
                out.append(Sign("S1", f"base {label} orig in [{100 * lo:.0f}, {100 * hi:.0f}]", "REPLACE",
                                lo <= v <= hi, round(100 * v, 6),
                                round(statistics.stdev(vals), 6) if len(vals) > 1 else 0.0, "range",
                                n=max(1, len(vals))))
    if hn_only in rows and captions_only in rows:
        for bench, group in BENCHMARKS:
            col = f"{group}/orig_acc"
            if col in rows[hn_only] and col in rows[captions_only]:
                out.append(_compare(j, "S2", "HN-only orig above captions-only", bench, "greater", hn_only,
                                    captions_only, col))
    return out


# --------------------------------------------------------------------------- noise floors
def floors_from(per_seed: Sequence[Rows], *, alpha: float = ALPHA, source: str = "") -> dict:
    """The noise floors a single run is judged by, from a multi-seed measurement: per check
    (:attr:`Sign.key`) the std of its per-seed paired differences, the floor (``Z_ONE_SIDED``
    x that std: a one-run margin beyond it is unlikely at ``alpha`` when nothing is real),
    the mean and whether the paired test held. Raises ValueError with fewer than 2 seeds."""
    if len(per_seed) < 2:
        raise ValueError(f"noise floors need at least 2 seeds, got {len(per_seed)}")
    mean, _ = aggregate(per_seed)
    checks = {}
    for s in paper_signs(mean, per_seed=per_seed, alpha=alpha) + sanity_checks(mean, per_seed=per_seed, alpha=alpha):
        if s.kind == "range":
            continue
        checks[s.key] = {"sd": round(s.noise, 4), "floor": round(Z_ONE_SIDED * s.noise, 4), "mean": round(s.value, 4),
                         "p": s.p, "held": bool(s.held)}
    return {"source": source, "seeds": len(per_seed), "alpha": alpha, "z": Z_ONE_SIDED, "checks": checks}


def load_floors(path: str | Path | None = None) -> dict | None:
    """A floors file (default :data:`FLOORS_PATH`), or None when there is none."""
    p = Path(path) if path else FLOORS_PATH
    return json.loads(p.read_text()) if p.is_file() else None


# --------------------------------------------------------------------------- Markdown
def _counts_note(signs: Sequence[Sign], alpha: float) -> str:
    k = len([s for s in signs if s.kind != "range"])
    return (f"{k} checks, each a one-sided paired t-test over seeds at alpha = {alpha:g}: if no effect were real, "
            f"about {k * alpha:.1f} of them would read \"held\" by chance (no correction for multiple checks).")


def signs_markdown(signs: list[Sign], sanity: Sequence[Sign] = (), *, alpha: float = ALPHA,
                   floors: Mapping | None = None) -> str:
    """The paper's signs as a Markdown list under a heading that counts how many held, the
    number of checks and the false "held" expected at ``alpha`` (over seeds) or the noise
    floors' source (one run), then the sanity checks apart ("" if there is nothing)."""
    if not signs and not sanity:
        return ""
    over_seeds = any(s.n > 1 for s in signs)
    held = sum(s.held for s in signs)
    out: list[str] = []
    if signs:
        out += [f"The paper's signs (Tables 1 and 3) in {'these seeds' if over_seeds else 'this run'} "
                f"({held} of {len(signs)} held; margins in points, the paper's beside them):", ""]
        out += [f"- ({s.sign}) {s.line()}" for s in signs]
        out.append("")
        if over_seeds:
            out.append(_counts_note(signs, alpha))
        elif floors and floors.get("checks"):
            out.append(f"One run: a margin counts only beyond its noise floor ({floors.get('z', Z_ONE_SIDED):.2f} x the "
                       f"std of that check's paired differences over the {floors.get('seeds')} seeds of "
                       f"{floors.get('source') or 'the calibration'}), and only where those seeds held it; within "
                       "the floor it is inside the noise.")
        else:
            out.append("One run and no measured noise floor: no margin here can be told from seed noise.")
    if sanity:
        out += ["", "The testbed's own sanity checks (not the paper's signs):", ""]
        out += [f"- ({s.sign}) {s.line()}" for s in sanity]
    return "\n".join(out) + "\n"
