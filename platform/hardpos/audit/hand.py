"""Hand audits of rule hard positives: a repeatable sample, and the labelled file's rates.

An audit answers "how many REPLACE (or SWAP) hard positives that the rule engine would
write for real captions change the meaning?". :func:`sample_rule_positives` draws the sample the
way the generate stage does (one ``RulePerturber.pick(caption, "positive", "replace")``
per caption), from captions shuffled with a fixed seed, so the same command always
gives the same rows; a person then labels each row ``ok`` / ``wrong`` / ``doubtful``
with a short reason. :func:`read_audit` and :func:`audit_rates` read such a labelled
file back (tests use them to hold the after-fix audit to its bar).

Audit file (tab-separated, UTF-8, one header line): ``caption, positive, label, why``
plus ``slot`` (which lexicon rule made the positive) and ``sample`` (``same`` when the
caption was also in the previous audit's sample, ``fresh`` otherwise, ``""`` in a
first audit). :func:`sample_stage_picks` draws the blind audit of the perturb stage's picks
(both polarities; :data:`BLIND_COLUMNS`).

Regression report: a labelled file's :class:`Draw` run again with the current rules
(:func:`produced_rows`) and compared with its labels (:func:`regression_report`): per
polarity, the labelled rows the rules still produce, by label, and the new rows that await a
label; :func:`report_audits` does it for every file an audit folder's draws file names.
"""
from __future__ import annotations

import csv
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from hardpos.rules.lexicon import load_lexicon
from hardpos.rules.perturber import RulePerturber, cached_perturber, pick_balanced, pick_triplet

LABELS = ("ok", "wrong", "doubtful")
COLUMNS = ("caption", "positive", "label", "why", "slot", "sample")


@dataclass(frozen=True)
class SampleStats:
    """How the sample was drawn.

    drawn: captions taken from the shuffled order before ``n`` positives were found.
    with_positive: of those, how many got a REPLACE positive.
    coverage_all: share of ALL unique captions that get a positive of the kind (not only the drawn
        ones); NaN when the sample was drawn without measuring it.
    """

    drawn: int
    with_positive: int
    coverage_all: float


def unique_captions(captions: Iterable[str]) -> list[str]:
    """Non-empty captions, first occurrence kept, in input order (NegCLIP repeats a few)."""
    return list(dict.fromkeys(c for c in captions if c and c.strip()))


def sample_rule_positives(captions: Iterable[str], *, n: int = 320, seed: int = 15, rule_seed: int = 0,
                          perturber=None, skip: Iterable[str] = (), kind: str = "replace",
                          coverage: bool = True) -> tuple[list[dict], SampleStats]:
    """The first ``n`` captions, in an order shuffled by ``seed``, that get a picked ``kind``
    ("replace" or "swap") positive.

    Returns rows ``{"caption", "positive", "slot"}`` in sample order, and :class:`SampleStats`.
    The shuffle depends only on ``seed`` and the caption list, so re-running after a lexicon
    change walks the same captions first: the captions that still get a positive come back
    (with possibly a different positive), the ones that lost it are replaced by fresh captions
    further down the order.
    rule_seed: the perturber's seed (the generate stage's default is 0).
    skip: captions never sampled (those of earlier audits, for a held-out sample).
    kind: which rule positives: "replace" (synonyms) or "swap" (whole conjuncts exchanged).
    coverage: measure ``coverage_all`` (a pass over every caption); False leaves it NaN.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if kind not in ("replace", "swap"):
        raise ValueError(f"kind must be 'replace' or 'swap', got {kind!r}")
    if perturber is None:
        perturber = RulePerturber(seed=rule_seed)
    caps = unique_captions(captions)
    order = list(caps)
    random.Random(seed).shuffle(order)
    skipped = set(skip)
    order = [c for c in order if c not in skipped]
    rows: list[dict] = []
    drawn = 0
    for caption in order:
        if len(rows) == n:
            break
        drawn += 1
        p = perturber.pick(caption, "positive", kind)
        if p is not None:
            rows.append({"caption": caption, "positive": p.text, "slot": p.slot})
    if not coverage:
        return rows, SampleStats(drawn=drawn, with_positive=len(rows), coverage_all=float("nan"))
    covered = sum(perturber.pick(c, "positive", kind) is not None for c in caps)
    return rows, SampleStats(drawn=drawn, with_positive=len(rows), coverage_all=covered / len(caps) if caps else 0.0)


def write_audit(path: str | Path, rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> None:
    """Write rows (missing columns left empty, others dropped) as an audit TSV of ``columns``."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns, delimiter="\t", lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in columns})


def read_audit(path: str | Path, *, labelled: bool = True) -> list[dict]:
    """An audit TSV; when ``labelled``, every row must carry a label in :data:`LABELS` and a reason."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = [c for c in ("caption", "positive", "label", "why") if c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    if not labelled:
        return rows
    for i, r in enumerate(rows, start=2):
        if r["label"] not in LABELS:
            raise ValueError(f"{path}:{i}: label must be one of {LABELS}, got {r['label']!r}")
        if not (r["why"] or "").strip():
            raise ValueError(f"{path}:{i}: a label needs its reason in 'why'")
    return rows


def audit_rates(rows: list[dict]) -> dict[str, float]:
    """Share of each label, plus ``n``."""
    n = len(rows)
    out: dict[str, float] = {"n": n}
    for label in LABELS:
        out[label] = sum(r["label"] == label for r in rows) / n if n else 0.0
    return out


# ---------------------------------------------------------------------- blind audit of stage picks
#: verdicts of a blind audit row, per polarity
BLIND_LABELS = {"negative": ("ok", "ungrammatical", "not_different", "doubtful"),
                "positive": ("ok", "changes_meaning", "doubtful")}
BLIND_COLUMNS = ("polarity", "caption", "edit", "label", "why", "kind", "slot", "sample")


#: SugarCrepe++'s five files, in the order the blind audit reads them
SUGARCREPE_PP_FILES = ("replace_att.json", "replace_obj.json", "replace_rel.json", "swap_att.json", "swap_obj.json")


def sugarcrepe_pp_captions(sources: Iterable[str | Path]) -> list[str]:
    """The original ``caption`` of every SugarCrepe++ item (a list of ``{id, filename, caption,
    caption2, negative_caption}``), file by file; a folder stands for its five files."""
    paths: list[Path] = []
    for src in sources:
        p = Path(src)
        paths += [p / f for f in SUGARCREPE_PP_FILES] if p.is_dir() else [p]
    out = []
    for p in paths:
        items = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(items, list) or not all(isinstance(i, dict) and "caption" in i for i in items):
            raise ValueError(f"{p}: not a SugarCrepe++ file (a list of items with a 'caption')")
        out += [i["caption"] for i in items]
    return out


def audit_captions(paths: Iterable[str | Path]) -> set[str]:
    """The ``caption`` column of audit TSVs (to leave them out of a new draw)."""
    out: set[str] = set()
    for path in paths:
        with open(path, newline="", encoding="utf-8") as f:
            out |= {r["caption"] for r in csv.DictReader(f, delimiter="\t")}
    return out


def sample_stage_picks(captions: Iterable[str], *, n: int = 200, seed: int = 36, rule_seed: int = 0,
                       perturber=None, skip: Iterable[str] = (), balanced: bool = True) -> tuple[list[dict], int]:
    """The hard negatives and positives the ``perturb`` stage would write for ``captions`` as its
    input (both kinds; ``balanced``: its default balanced picks over the whole list,
    :func:`pick_balanced`, else the seeded-random :func:`pick_triplet`), for captions in an
    order shuffled by ``seed``: the first ``n`` captions that get a negative give the negative
    rows, the first ``n`` that get a positive the positive rows.

    Returns (rows, captions drawn). Rows ``{"polarity", "caption", "edit", "kind", "slot"}``:
    negatives first, then positives, each in draw order. The shuffle depends only on ``seed``
    and the caption list, so the same command after a rule change walks the same captions
    first; a caption that lost its pick is replaced by the next one in the order.
    skip: captions never sampled (those of earlier audits).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if perturber is None:
        perturber = RulePerturber(seed=rule_seed)
    captions = list(captions)
    picks = _balanced_picks(perturber, captions, rule_seed) if balanced else {}
    order = unique_captions(captions)
    random.Random(seed).shuffle(order)
    skipped = set(skip)
    negs: list[dict] = []
    poss: list[dict] = []
    drawn = 0
    for caption in order:
        if len(negs) >= n and len(poss) >= n:
            break
        if caption in skipped:
            continue
        drawn += 1
        t = picks[caption] if balanced else pick_triplet(perturber, caption, rule_seed)
        if t["neg"] is not None and len(negs) < n:
            negs.append({"polarity": "negative", "caption": caption, "edit": t["neg"], "kind": t["kind"],
                         "slot": t["neg_slot"]})
        if t["pos"] is not None and len(poss) < n:
            poss.append({"polarity": "positive", "caption": caption, "edit": t["pos"], "kind": t["kind"],
                         "slot": t["pos_slot"]})
    return negs + poss, drawn


#: the last balanced picks made: (perturber, rule seed, captions, picks); several draws of one
#: caption set (held-out draws with other seeds) share them
_LAST_BALANCED: list[tuple] = []


def _balanced_picks(perturber, captions: list[str], rule_seed: int) -> dict[str, dict]:
    """Caption -> the stage's balanced pick over the whole of ``captions`` (the first row of a
    repeated caption, as the stage writes it first); depends on no draw seed, so it is reused
    while the perturber, rule seed and captions are the same."""
    key = tuple(captions)
    if _LAST_BALANCED and _LAST_BALANCED[0][0] is perturber and _LAST_BALANCED[0][1:3] == (rule_seed, key):
        return _LAST_BALANCED[0][3]
    kept = [c for c in captions if isinstance(c, str) and c.strip()]  # what the stage perturbs
    made = [perturber.candidates(c) for c in kept]
    results, _ = pick_balanced(kept, made, rule_seed, perturber.seed)
    picks: dict[str, dict] = {}
    for c, r in zip(kept, results):
        picks.setdefault(c, r)
    _LAST_BALANCED[:] = [(perturber, rule_seed, key, picks)]
    return picks


def write_blind_audit(path: str | Path, rows: list[dict]) -> None:
    """Write rows (missing columns left empty) as a blind-audit TSV (:data:`BLIND_COLUMNS`)."""
    write_audit(path, rows, BLIND_COLUMNS)


def read_blind_audit(path: str | Path, *, labelled: bool = True) -> list[dict]:
    """A blind-audit TSV; when ``labelled``, every row must carry a verdict of its polarity
    (:data:`BLIND_LABELS`) and a reason."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise ValueError(f"{path}: no rows")
    missing = [c for c in BLIND_COLUMNS if c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    for i, r in enumerate(rows, start=2):
        if r["polarity"] not in BLIND_LABELS:
            raise ValueError(f"{path}:{i}: polarity must be 'negative' or 'positive', got {r['polarity']!r}")
        if not labelled:
            continue
        if r["label"] not in BLIND_LABELS[r["polarity"]]:
            raise ValueError(f"{path}:{i}: a {r['polarity']}'s label must be one of {BLIND_LABELS[r['polarity']]}, "
                             f"got {r['label']!r}")
        if not (r["why"] or "").strip():
            raise ValueError(f"{path}:{i}: a label needs its reason in 'why'")
    return rows


def blind_counts(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Per polarity: ``n`` and the count of each label."""
    out: dict[str, dict[str, int]] = {}
    for pol, labels in BLIND_LABELS.items():
        mine = [r for r in rows if r["polarity"] == pol]
        out[pol] = {"n": len(mine), **{lab: sum(r["label"] == lab for r in mine) for lab in labels}}
    return out


# ---------------------------------------------------------------------- regression report
#: what each label of a rule-positive or blind audit counts as in a regression report
VERDICT_OF = {"ok": "ok", "doubtful": "doubtful", "wrong": "wrong", "changes_meaning": "wrong",
              "ungrammatical": "wrong", "not_different": "wrong"}
VERDICTS = ("ok", "wrong", "doubtful")
#: how an audit file's rows were drawn: :func:`sample_rule_positives` ("rule_positives"),
#: :func:`sample_stage_picks` ("stage_picks"), or every candidate of its captions ("candidates")
SAMPLERS = ("rule_positives", "stage_picks", "candidates")
#: the caption sets the audits draw from (the report command names their files)
SOURCES = ("negclip", "sugarcrepe_pp")


@dataclass(frozen=True)
class Draw:
    """How a labelled audit file was drawn, so that the current rules can draw it again.

    sampler: one of :data:`SAMPLERS`; source: one of :data:`SOURCES`.
    seed, n: the shuffle's seed and the rows per polarity (:func:`sample_rule_positives`,
        :func:`sample_stage_picks`; unused by "candidates").
    kind: "replace" or "swap" ("rule_positives" and "candidates": the positives' kind).
    balanced: "stage_picks" only: the stage's balanced picks (else seeded-random).
    include_benchmark_pairs: the lexicon the file was drawn with (the opt-in of
        :func:`hardpos.rules.lexicon.load_lexicon`).
    exclude: audit files (names or globs in the audit's folder) whose captions the draw skips.
    """

    sampler: str
    source: str
    seed: int = 0
    n: int = 0
    kind: str = "replace"
    balanced: bool = False
    include_benchmark_pairs: bool = False
    exclude: tuple[str, ...] = ()

    def __post_init__(self):
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        if self.kind not in ("replace", "swap"):
            raise ValueError(f"kind must be 'replace' or 'swap', got {self.kind!r}")
        if self.sampler != "candidates" and self.n < 1:
            raise ValueError(f"a {self.sampler} draw needs n >= 1, got {self.n}")

    @property
    def caption_local(self) -> bool:
        """Whether each caption's rows depend on that caption alone (not on the other captions'
        picks), so its labelled captions can be re-picked without the source caption set."""
        return not (self.sampler == "stage_picks" and self.balanced)


def read_draws(path: str | Path) -> dict[str, Draw]:
    """The draws file of an audit folder: JSON ``{audit file name: {Draw's fields}}`` (keys that
    start with "_" are comments). ValueError names a bad entry."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out: dict[str, Draw] = {}
    for name, spec in data.items():
        if name.startswith("_"):
            continue
        try:
            out[name] = Draw(**{**spec, "exclude": tuple(spec.get("exclude", ()))})
        except TypeError as e:
            raise ValueError(f"{path}: {name}: {e}") from None
        except ValueError as e:
            raise ValueError(f"{path}: {name}: {e}") from None
    return out


def read_labelled(path: str | Path) -> list[dict]:
    """A labelled audit of either format as rows ``{polarity, caption, edit, label, why}``: a
    rule-positive audit (:func:`read_audit`; every row a positive) or a blind audit
    (:func:`read_blind_audit`)."""
    with open(path, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f, delimiter="\t"), [])
    if "polarity" in header:
        return [{k: r[k] for k in ("polarity", "caption", "edit", "label", "why")} for r in read_blind_audit(path)]
    return [{"polarity": "positive", "caption": r["caption"], "edit": r["positive"], "label": r["label"],
             "why": r["why"]} for r in read_audit(path)]


def excluded_captions(draw: Draw, audit_dir: str | Path) -> set[str]:
    """The captions of the audit files ``draw.exclude`` names (globs in ``audit_dir``)."""
    folder = Path(audit_dir)
    paths = sorted({p for pattern in draw.exclude for p in folder.glob(pattern)})
    missing = [pattern for pattern in draw.exclude if not any(folder.glob(pattern))]
    if missing:
        raise ValueError(f"{folder}: no audit file matches {missing}")
    return audit_captions(paths)


def produced_rows(draw: Draw, *, captions: Iterable[str] | None = None, labelled: Iterable[dict] = (),
                  skip: Iterable[str] = (), perturber=None) -> list[dict]:
    """The rows ``{polarity, caption, edit, slot}`` the current rules produce for ``draw``.

    captions: the draw's source captions: the draw is run again (the same shuffle walks the same
        captions first; a caption whose pick is gone is replaced by the next that has one).
        None: only the captions of ``labelled`` rows, each picked again for the polarities it
        was labelled for, with no refill (a draw whose rows are :attr:`Draw.caption_local`;
        ValueError for a balanced draw, whose picks depend on the whole caption set).
    skip: captions the draw never takes (:func:`excluded_captions`).
    perturber: a ``RulePerturber`` of the draw's lexicon; default: made from ``draw``.
    "candidates" draws produce every positive of ``draw.kind`` of the labelled rows' captions.
    """
    if perturber is None:
        perturber = RulePerturber(seed=0, lexicon=load_lexicon(include_benchmark_pairs=draw.include_benchmark_pairs))
    labelled = list(labelled)
    own = unique_captions(r["caption"] for r in labelled)
    if draw.sampler == "candidates":
        return [{"polarity": "positive", "caption": c, "edit": p.text, "slot": p.slot}
                for c in own for p in perturber.hard_positives(c) if p.kind == draw.kind]
    if captions is None:
        if not draw.caption_local:
            raise ValueError("a balanced draw's picks depend on the whole caption set: give its captions")
        if draw.sampler == "rule_positives":
            picks = ((c, perturber.pick(c, "positive", draw.kind)) for c in own)
            return [{"polarity": "positive", "caption": c, "edit": p.text, "slot": p.slot} for c, p in picks if p]
        wanted = {(r["polarity"], r["caption"]) for r in labelled}
        out = []
        for c in own:
            t = pick_triplet(perturber, c, perturber.seed)
            out += [{"polarity": pol, "caption": c, "edit": t[key], "slot": t[key + "_slot"]}
                    for pol, key in (("negative", "neg"), ("positive", "pos"))
                    if t[key] is not None and (pol, c) in wanted]
        return out
    if draw.sampler == "rule_positives":
        rows, _ = sample_rule_positives(captions, n=draw.n, seed=draw.seed, perturber=perturber, skip=skip,
                                        kind=draw.kind, coverage=False)
        return [{"polarity": "positive", "caption": r["caption"], "edit": r["positive"], "slot": r["slot"]}
                for r in rows]
    rows, _ = sample_stage_picks(captions, n=draw.n, seed=draw.seed, perturber=perturber, skip=skip,
                                 balanced=draw.balanced)
    return [{k: r[k] for k in ("polarity", "caption", "edit", "slot")} for r in rows]


@dataclass(frozen=True)
class Regression:
    """What one polarity of a labelled audit says about the current rules.

    labelled: the file's rows of this polarity.
    still_produced: of them, the rows the current rules still produce (same caption, same edit).
    ok / wrong / doubtful: the still-produced rows by verdict (:data:`VERDICT_OF`: a blind
        audit's "ungrammatical", "not_different" and "changes_meaning" count as wrong).
    labels: the still-produced rows by the file's own label.
    no_longer_produced: labelled rows the rules no longer produce (``labelled - still_produced``).
    awaiting_label: rows the rules now produce that the file holds no label for.
    """

    polarity: str
    labelled: int
    still_produced: int
    ok: int
    wrong: int
    doubtful: int
    labels: dict[str, int]
    no_longer_produced: int
    awaiting_label: int

    @property
    def wrong_rate(self) -> float:
        """Wrong rows among the still-produced ones (0.0 when none is still produced)."""
        return self.wrong / self.still_produced if self.still_produced else 0.0

    @property
    def doubtful_rate(self) -> float:
        """Doubtful rows among the still-produced ones (0.0 when none is still produced)."""
        return self.doubtful / self.still_produced if self.still_produced else 0.0

    @property
    def still_share(self) -> float:
        """Share of the labelled rows still produced (0.0 for an empty polarity)."""
        return self.still_produced / self.labelled if self.labelled else 0.0


def regression_report(labelled: Iterable[dict], produced: Iterable[dict]) -> dict[str, Regression]:
    """Per polarity present in either input: how many ``labelled`` rows (``{polarity, caption,
    edit, label}``, :func:`read_labelled`) are among the ``produced`` rows
    (:func:`produced_rows`), matched on (polarity, caption, edit), by label; and how many
    produced rows await a label. A row repeated in either input counts once."""
    labelled = list({(r["polarity"], r["caption"], r["edit"]): r for r in labelled}.values())
    made = {(r["polarity"], r["caption"], r["edit"]) for r in produced}
    known = {(r["polarity"], r["caption"], r["edit"]) for r in labelled}
    unknown = [r["label"] for r in labelled if r["label"] not in VERDICT_OF]
    if unknown:
        raise ValueError(f"labels {sorted(set(unknown))} are none of {sorted(VERDICT_OF)}")
    out: dict[str, Regression] = {}
    for pol in sorted({k[0] for k in known | made}):
        mine = [r for r in labelled if r["polarity"] == pol]
        still = [r for r in mine if (pol, r["caption"], r["edit"]) in made]
        verdicts = Counter(VERDICT_OF[r["label"]] for r in still)
        out[pol] = Regression(
            polarity=pol, labelled=len(mine), still_produced=len(still),
            ok=verdicts["ok"], wrong=verdicts["wrong"], doubtful=verdicts["doubtful"],
            labels=dict(sorted(Counter(r["label"] for r in still).items())),
            no_longer_produced=len(mine) - len(still),
            awaiting_label=sum(1 for k in made if k[0] == pol and k not in known))
    return out


#: how :func:`report_audits` got a file's produced rows
REPORT_MODES = ("redrawn", "caption_local", "needs_captions")


@dataclass(frozen=True)
class AuditReport:
    """The regression report of one labelled audit file.

    name: the file's name in its folder.
    mode: "redrawn" (its draw run again over its source captions), "caption_local" (no source
        given: its labelled captions picked again, no refill; :func:`produced_rows`) or
        "needs_captions" (a balanced draw with no source given: nothing measured).
    polarities: polarity -> :class:`Regression` (empty when nothing was measured).
    """

    name: str
    mode: str
    polarities: dict[str, Regression]


def report_audits(audit_dir: str | Path, *, captions: dict[str, list[str]] | None = None,
                  names: Iterable[str] | None = None, draws_file: str = "draws.json") -> list[AuditReport]:
    """The regression report of every labelled audit file that ``audit_dir``'s draws file names
    (or of ``names`` among them), in the draws file's order.

    captions: source (:data:`SOURCES`) -> its captions, in the order the draws read them; a
        file whose source is missing is reported caption-local where its draw allows it.
    One perturber per lexicon serves every file (:func:`hardpos.rules.perturber.cached_perturber`),
    so the candidates of a caption are made once. ValueError for a name the draws file lacks.
    """
    folder = Path(audit_dir)
    draws = read_draws(folder / draws_file)
    wanted = list(draws) if names is None else list(names)
    unknown = [n for n in wanted if n not in draws]
    if unknown:
        raise ValueError(f"{folder / draws_file} names no draw for {unknown}")
    captions = captions or {}
    out = []
    for name in wanted:
        draw = draws[name]
        labelled = read_labelled(folder / name)
        rules = cached_perturber(0, ("audit", draw.include_benchmark_pairs),
                                 lambda: load_lexicon(include_benchmark_pairs=draw.include_benchmark_pairs))
        source = captions.get(draw.source)
        if source is not None and draw.sampler != "candidates":
            made = produced_rows(draw, captions=source, labelled=labelled, skip=excluded_captions(draw, folder),
                                 perturber=rules)
            mode = "redrawn"
        elif draw.caption_local:
            made = produced_rows(draw, labelled=labelled, perturber=rules)
            mode = "redrawn" if draw.sampler == "candidates" else "caption_local"
        else:
            out.append(AuditReport(name, "needs_captions", {}))
            continue
        out.append(AuditReport(name, mode, regression_report(labelled, made)))
    return out
