"""The testbed as a confirmatory experiment: preregistered checks, the world as the unit, Holm.

The checks (:data:`CHECKS_PATH`, ``paper/checks.json``) are every finding the paper states in
its text about the models the testbed trains, each quoted beside the comparisons it implies.
A check is one finding on one benchmark; it holds when every one of its comparisons does (a
"highest of a set" compares with every member), so its p-value is the largest of its
comparisons' (an intersection-union test, valid without correction inside the check).

How a set of worlds is judged (:func:`judge`), as the preregistration fixes it:

* the unit is a world: each fresh world seed has its own base, pretrained by the shipped
  recipe, and its own finetunes; a comparison's difference is paired within a world;
* a one-sided paired t-test per comparison (``scipy.stats.ttest_1samp`` on the differences
  in the paper's direction, ``alternative="greater"``), p of a check = max over its comparisons;
* Holm's step-down correction over the *distinct* checks at ``alpha`` (a check whose
  comparisons are another's is the same test and is counted once);
* both verdicts are reported: held before correction (p < alpha) and after (Holm's p < alpha).

One new run (:func:`one_run`): each comparison's margin is set against a prediction interval
from the confirmatory spread, ``t(1 - alpha/2, n - 1) x sd x sqrt(1 + 1/n)``: within it of
zero, "inside the noise"; beyond it on the confirmatory mean's side, "as the confirmatory
result"; on the other side, "against it".

Pure functions over rows (model -> ``<group>/<figure>`` -> value, fractions as
:func:`hardpos.paper.table1.table_row` writes them; ``<group>/drop`` = orig - aug is derived).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from scipy import stats

Rows = Mapping[str, Mapping[str, float]]

CHECKS_PATH = Path(__file__).with_name("checks.json")
#: the preregistration and the confirmatory worlds' rows (``worlds/world<seed>.json``)
CONFIRMATORY_DIR = Path(__file__).parents[1] / "resources" / "confirmatory"
ALPHA = 0.05
#: the figures a comparison may name (``drop``: original minus augmented accuracy)
FIGURES = ("orig_acc", "aug_acc", "brittleness", "drop", "mean_s_c", "mean_s_n", "mean_s_p")
GROUPS = ("replace", "replace_seen", "swap")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``a`` against ``b`` on ``column`` (``<group>/<figure>``): the paper's direction is a
    above b ("greater") or below ("less"); ``paper`` is the paper's own margin a - b in points
    (None where its tables do not report both)."""

    a: str
    b: str
    column: str
    direction: Literal["greater", "less"]
    paper: float | None = None

    def __post_init__(self) -> None:
        group, _, figure = self.column.partition("/")
        if group not in GROUPS or figure not in FIGURES:
            raise ValueError(f"comparison column {self.column!r}: want <{'|'.join(GROUPS)}>/<{'|'.join(FIGURES)}>")
        if self.direction not in ("greater", "less"):
            raise ValueError(f"comparison direction {self.direction!r}: want greater | less")
        if self.a == self.b:
            raise ValueError(f"comparison of {self.a!r} with itself")

    @property
    def sign(self) -> float:
        return 1.0 if self.direction == "greater" else -1.0

    def margin(self, rows: Rows) -> float:
        """a - b in points in this world's rows (KeyError naming what is missing)."""
        return 100 * (_value(rows, self.a, self.column) - _value(rows, self.b, self.column))

    def key(self) -> tuple[str, str, str, str]:
        return self.a, self.b, self.column, self.direction

    def text(self) -> str:
        op = ">" if self.direction == "greater" else "<"
        return f"{self.a} {op} {self.b} on {self.column}"


@dataclasses.dataclass(frozen=True)
class Check:
    """One finding on one benchmark: ``id`` (unique), ``finding`` (its id in the list),
    ``claim`` (in words), ``benchmark`` (REPLACE | SWAP), ``comparisons`` (all must hold)."""

    id: str
    finding: str
    claim: str
    benchmark: str
    comparisons: tuple[Comparison, ...]

    def key(self) -> frozenset:
        """What makes two checks the same test: the same set of comparisons."""
        return frozenset(c.key() for c in self.comparisons)

    def models(self) -> set[str]:
        return {m for c in self.comparisons for m in (c.a, c.b)}


@dataclasses.dataclass(frozen=True)
class Finding:
    """A finding in the paper's words: ``quote`` (verbatim), ``where`` (section or table), and
    the checks it implies."""

    id: str
    quote: str
    where: str
    checks: tuple[Check, ...]


def load_findings(path: str | Path | None = None) -> list[Finding]:
    """The findings and their checks from a checks file (default :data:`CHECKS_PATH`).
    Raises ValueError naming a malformed entry or a repeated check id."""
    data = json.loads(Path(path or CHECKS_PATH).read_text())
    out, ids = [], set()
    for f in data["findings"]:
        checks = []
        for c in f["checks"]:
            if c["id"] in ids:
                raise ValueError(f"check id {c['id']!r} repeats")
            ids.add(c["id"])
            comps = tuple(Comparison(**x) for x in c["comparisons"])
            if not comps:
                raise ValueError(f"check {c['id']}: no comparisons")
            checks.append(Check(c["id"], f["id"], c["claim"], c["benchmark"], comps))
        out.append(Finding(f["id"], f["quote"], f["where"], tuple(checks)))
    return out


def all_checks(findings: Sequence[Finding]) -> list[Check]:
    return [c for f in findings for c in f.checks]


def checks_digest(path: str | Path | None = None) -> str:
    """sha256 of the checks file's bytes: what a preregistration pins."""
    return hashlib.sha256(Path(path or CHECKS_PATH).read_bytes()).hexdigest()


def load_preregistration(folder: str | Path | None = None) -> dict[str, Any]:
    """The preregistration (``preregistration.json`` in ``folder``, default :data:`CONFIRMATORY_DIR`)."""
    return json.loads((Path(folder or CONFIRMATORY_DIR) / "preregistration.json").read_text())


def load_worlds(folder: str | Path | None = None) -> dict[int, dict[str, Any]]:
    """World seed -> its stored record (``rows`` and provenance) from ``<folder>/worlds``."""
    out = {}
    for f in sorted((Path(folder or CONFIRMATORY_DIR) / "worlds").glob("world*.json")):
        rec = json.loads(f.read_text())
        out[int(rec["world_seed"])] = rec
    return out


def _value(rows: Rows, model: str, column: str) -> float:
    group, _, figure = column.partition("/")
    row = rows[model]
    if figure == "drop":
        return float(row[f"{group}/orig_acc"]) - float(row[f"{group}/aug_acc"])
    return float(row[column])


def judgeable(check: Check, rows: Rows) -> bool:
    """Whether ``rows`` hold every model and column the check compares."""
    try:
        for c in check.comparisons:
            c.margin(rows)
    except KeyError:
        return False
    return True


# --------------------------------------------------------------------------- over worlds
@dataclasses.dataclass(frozen=True)
class Tested:
    """One comparison over worlds: the per-world margins in points (a - b), their mean and sd,
    the one-sided paired t and p in the paper's direction."""

    comparison: Comparison
    margins: tuple[float, ...]
    mean: float
    sd: float
    t: float
    p: float


def paired_one_sided(comparison: Comparison, worlds: Sequence[Rows]) -> Tested:
    """The one-sided paired t-test of ``comparison`` over ``worlds`` (n >= 2). Zero spread:
    p = 0 when every margin is in the paper's direction, else 1."""
    margins = tuple(comparison.margin(w) for w in worlds)
    n = len(margins)
    if n < 2:
        raise ValueError(f"a paired test needs at least 2 worlds, got {n}")
    directed = [comparison.sign * m for m in margins]
    mean = sum(margins) / n
    sd = math.sqrt(sum((m - mean) ** 2 for m in margins) / (n - 1))
    if sd == 0.0:
        t, p = (math.inf if mean * comparison.sign > 0 else -math.inf if mean else 0.0), (
            0.0 if mean * comparison.sign > 0 else 1.0)
    else:
        res = stats.ttest_1samp(directed, 0.0, alternative="greater")
        t, p = float(res.statistic), float(res.pvalue)
    return Tested(comparison, margins, mean, sd, t, p)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (monotone, capped at 1)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One check over worlds: its comparisons' tests, p (the largest), Holm's p over the
    distinct checks, and the held flags at ``alpha`` before and after correction.
    ``same_as``: the id of the earlier check that is the same test (this one is then not
    counted again; its p_holm is that check's)."""

    check: Check
    tests: tuple[Tested, ...]
    p: float
    p_holm: float
    alpha: float
    same_as: str | None = None

    @property
    def held(self) -> bool:
        return self.p < self.alpha

    @property
    def held_holm(self) -> bool:
        return self.p_holm < self.alpha


def judge(checks: Sequence[Check], worlds: Sequence[Rows], alpha: float = ALPHA) -> list[Verdict]:
    """Every check over ``worlds`` (each world's rows), in the order given. Every check must be
    judgeable in every world (ValueError naming the first that is not): a preregistered check
    is never left out."""
    for c in checks:
        for k, w in enumerate(worlds):
            if not judgeable(c, w):
                raise ValueError(f"check {c.id} ({c.claim}, {c.benchmark}) cannot be judged on world {k}: "
                                 f"its rows lack one of {sorted(c.models())}")
    first: dict[frozenset, str] = {}
    tested: dict[str, tuple[Tested, ...]] = {}
    pvals: dict[str, float] = {}
    for c in checks:
        tests = tuple(paired_one_sided(cmp, worlds) for cmp in c.comparisons)
        tested[c.id] = tests
        pvals[c.id] = max(t.p for t in tests)
        first.setdefault(c.key(), c.id)
    distinct = [c.id for c in checks if first[c.key()] == c.id]
    adjusted = dict(zip(distinct, holm([pvals[i] for i in distinct])))
    out = []
    for c in checks:
        lead = first[c.key()]
        out.append(Verdict(c, tested[c.id], pvals[c.id], adjusted[lead], alpha, None if lead == c.id else lead))
    return out


def counts(verdicts: Sequence[Verdict]) -> dict[str, int]:
    """How many distinct checks there are and how many held, before and after Holm."""
    distinct = [v for v in verdicts if v.same_as is None]
    return {"checks": len(verdicts), "distinct": len(distinct), "held": sum(v.held for v in distinct),
            "held_holm": sum(v.held_holm for v in distinct)}


def power_per_check(effect: float, sd: float, n: int, alpha: float) -> float:
    """The probability that a one-sided one-sample t-test at ``alpha`` rejects with ``n`` units
    when the true mean difference is ``effect`` (> 0, the paper's direction) and its sd ``sd``
    (noncentral t)."""
    if n < 2 or sd <= 0:
        return 1.0 if effect > 0 else 0.0
    df = n - 1
    crit = stats.t.ppf(1 - alpha, df)
    return float(stats.nct.sf(crit, df, effect / sd * math.sqrt(n)))


# --------------------------------------------------------------------------- one run
@dataclasses.dataclass(frozen=True)
class OneRun:
    """One comparison in one new run: its margin (points), the confirmatory mean, the
    prediction half-width and the verdict (see the module doc)."""

    comparison: Comparison
    margin: float
    mean: float
    half_width: float
    verdict: str


def prediction_half_width(sd: float, n: int, alpha: float = ALPHA) -> float:
    """Half-width of a two-sided (1 - alpha) prediction interval for one new world's margin
    from n worlds with spread ``sd``: t(1 - alpha/2, n - 1) x sd x sqrt(1 + 1/n)."""
    if n < 2:
        raise ValueError(f"a prediction interval needs at least 2 worlds, got {n}")
    return float(stats.t.ppf(1 - alpha / 2, n - 1)) * sd * math.sqrt(1 + 1 / n)


def one_run(comparison: Comparison, rows: Rows, tested: Tested, alpha: float = ALPHA) -> OneRun:
    """This run's margin on ``comparison`` set against the confirmatory worlds' spread."""
    margin = comparison.margin(rows)
    h = prediction_half_width(tested.sd, len(tested.margins), alpha)
    if abs(margin) <= h:
        verdict = "inside the noise"
    elif (margin > 0) == (tested.mean > 0):
        verdict = "as the confirmatory result"
    else:
        verdict = "against it"
    return OneRun(comparison, margin, tested.mean, h, verdict)


# --------------------------------------------------------------------------- text
def p_text(p: float) -> str:
    return "p < 0.001" if p < 0.0005 else f"p = {p:.3f}"


def not_tested(path: str | Path | None = None) -> list[dict[str, str]]:
    """What the paper states about these models that no check tests, each with the reason."""
    return json.loads(Path(path or CHECKS_PATH).read_text()).get("not_tested", [])


def findings_markdown(findings: Sequence[Finding], untested: Sequence[Mapping[str, str]] = ()) -> str:
    """The check list as a reference page: each finding's quote, then its checks and their
    comparisons with the paper's own margins, then what is stated but not tested and why
    (what ``docs/checks.md`` holds)."""
    out = ["# The preregistered checks", "",
           "Every finding the paper states in its text about the models the testbed trains, quoted, with the "
           "comparisons it implies. A check is one finding on one benchmark and holds only when every one of "
           "its comparisons does (one-sided paired t-test over worlds; its p is the largest of its "
           "comparisons'); Holm's correction runs over the distinct checks. Margins are a - b in points; "
           "\"paper\" is the paper's own margin from its tables (CLIP ViT-B/32 finetuned on COCO), where it "
           "reports both models. Generated from `platform/hardpos/paper/checks.json` by "
           "`python -m benchmarks.confirmatory checks`.", ""]
    for f in findings:
        out += [f"## {f.id} ({f.where})", "", f"> {f.quote}", ""]
        for c in f.checks:
            out.append(f"- **{c.id}** ({c.benchmark}) {c.claim}:")
            for cmp in c.comparisons:
                paper = f"; paper {cmp.paper:+.1f}" if cmp.paper is not None else "; paper: not reported"
                out.append(f"  - {cmp.text()}{paper}")
        out.append("")
    if untested:
        out += ["## Stated, not tested", ""]
        for u in untested:
            out += [f"- \"{u['part']}\": {u['why']}.", "", f"  > {u['quote']}", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def verdicts_table(verdicts: Sequence[Verdict]) -> str:
    """One Markdown row per check: its comparisons' mean ± sd (points) and p, the check's p,
    Holm's p and both verdicts."""
    head = "| check | benchmark | claim | margins (mean ± sd, p; paper) | p | Holm p | held | held after Holm |"
    lines = [head, "|" + "---|" * 8]
    for v in verdicts:
        parts = []
        for t in v.tests:
            paper = f"; paper {t.comparison.paper:+.1f}" if t.comparison.paper is not None else ""
            parts.append(f"{t.comparison.a} vs {t.comparison.b} {t.comparison.column}: {t.mean:+.1f} ± {t.sd:.1f}, "
                         f"{p_text(t.p)}{paper}")
        same = f" (same test as {v.same_as})" if v.same_as else ""
        lines.append(f"| {v.check.id}{same} | {v.check.benchmark} | {v.check.claim} | {'<br>'.join(parts)} | "
                     f"{v.p:.4f} | {v.p_holm:.4f} | {'yes' if v.held else 'no'} | {'yes' if v.held_holm else 'no'} |")
    return "\n".join(lines) + "\n"


def verdicts_json(verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    return [{"id": v.check.id, "finding": v.check.finding, "benchmark": v.check.benchmark, "claim": v.check.claim,
             "p": v.p, "p_holm": v.p_holm, "held": v.held, "held_holm": v.held_holm, "same_as": v.same_as,
             "comparisons": [{**dataclasses.asdict(t.comparison), "margins": list(t.margins), "mean": t.mean,
                              "sd": t.sd, "t": t.t, "p": t.p} for t in v.tests]} for v in verdicts]


#: which of the paper's tables a model's rows stand for (what a run's heading names)
TABLE_OF = {"pretrained": "Table 1", "hn-only": "Table 1", "hp+hn": "Table 1", "hp-replace+hn": "Table 1(d)",
            "hp-swap+hn": "Table 1(d)"}
GRID_PREFIX = "w_neg="


def tables_trained(rows: Rows) -> list[str]:
    """The paper's tables whose models are in ``rows`` (the w_neg grid is Table 3)."""
    found = {TABLE_OF[m] for m in rows if m in TABLE_OF} | ({"Table 3"} if any(
        m.startswith(GRID_PREFIX) for m in rows) else set())
    return sorted(found)


def run_verdicts_markdown(rows: Rows, findings: Sequence[Finding] | None = None, *,
                          folder: str | Path | None = None) -> str:
    """One run's checks as Markdown: every preregistered check its rows can judge, each
    comparison's margin set against the confirmatory worlds' prediction interval
    (:func:`one_run`), and the check's verdict: "against it" when any comparison is,
    "as the confirmatory result" when all are, else "inside the noise". Until every
    preregistered world is in, the margins are listed with no verdict."""
    findings = list(findings) if findings is not None else load_findings()
    prereg = load_preregistration(folder)
    stored = load_worlds(folder)
    worlds = [stored[s]["rows"] for s in prereg["world_seeds"] if s in stored]
    complete = len(worlds) == len(prereg["world_seeds"])
    checks = [c for c in all_checks(findings) if judgeable(c, rows)]
    if not checks:
        return ""
    alpha = float(prereg["alpha"])
    head = (f"The preregistered checks this run can judge ({', '.join(tables_trained(rows))} models; margins a - b "
            "in points):")
    out = [head, ""]
    for c in checks:
        if not complete:
            margins = "; ".join(f"{cmp.a} vs {cmp.b} {cmp.column} {cmp.margin(rows):+.1f}" for cmp in c.comparisons)
            out.append(f"- {c.id} ({c.benchmark}) {c.claim}: {margins}")
            continue
        runs = [one_run(cmp, rows, paired_one_sided(cmp, worlds), alpha) for cmp in c.comparisons]
        verdicts = {r.verdict for r in runs}
        verdict = ("against it" if "against it" in verdicts else "as the confirmatory result"
                   if verdicts == {"as the confirmatory result"} else "inside the noise")
        detail = "; ".join(f"{r.comparison.a} vs {r.comparison.b} {r.comparison.column} {r.margin:+.1f} "
                           f"(confirmatory {r.mean:+.1f} ± {r.half_width:.1f})" for r in runs)
        out.append(f"- {c.id} ({c.benchmark}) {c.claim}: {verdict} ({detail})")
    out.append("")
    if complete:
        out.append(f"Each margin is set against a {100 * (1 - alpha):.0f}% prediction interval for one new world from the "
                   f"{len(worlds)} confirmatory worlds (t at {len(worlds) - 1} df x sd x sqrt(1 + 1/n)): within it of "
                   "zero, inside the noise; beyond it, as the confirmatory result when on its side, else against it.")
    else:
        out.append(f"Not judged: the confirmatory run has {len(worlds)} of {len(prereg['world_seeds'])} preregistered "
                   "worlds; one run's margins are judged against their spread once every world is in.")
    return "\n".join(out) + "\n"
