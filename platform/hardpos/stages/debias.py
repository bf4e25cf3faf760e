"""`hardpos debias`: the subset of a benchmark (or a triplet file) that text-only models cannot decide.

SugarCrepe-style adversarial refinement (:mod:`hardpos.audit.debias`): per category, every
item's score gap from three different kinds of blind model (the word n-gram classifier, the
caption language model and a character language model ratio, cross-fitted by caption), binned
on a grid; items kept in equal numbers from each cell and its mirror cell (the larger side's
items picked to keep the edited words' counts balanced), so that every model prefers the
caption exactly as often as the edit. The result is verified by fresh cross-fits (fold
assignments the selection never used) of the selection models and of a held-out kind (a
character n-gram classifier), beside a random subset of the same size.

Input (``input=``): any benchmark file or folder the evaluate stage reads (REPLACE / SWAP /
SugarCrepe / SugarCrepe++: the release, one half of it or one file), or a triplet file
(parquet / jsonl; rows without a hard negative are not items and are left out).
``polarities``: ``[negative, positive]`` (default) balances the hard negatives and, where the
input has hard positives, the positives against their originals too; where the positives
cannot be balanced (REPLACE: each is a fixed rarer synonym, so a blind model nearly always
prefers the original and no mirror exists) the stage says so and why per category, writes its
report, and exits 2; ``polarities=[negative]`` balances the negatives only (the positives are
kept with their items, and the report shows how detectable they stay).

Output (``output_dir``): ``subset/``, the kept items in the input's own layout (file names,
folders, row format: ``evaluate`` reads it with the same kind, unchanged; the summary's
``benchmark`` says the path and kind); ``keep.jsonl`` (per item: its category, its gaps per
polarity and model, kept or not); ``report.md`` and ``report.json`` (per category: items
before and after, the rounds, and the pair measure of every model before, after and on the
random subset, with 95% intervals); ``summary.json``. MLflow metrics
``debias/<category>/items_before|items_after`` and
``debias/<category>/<polarity>/<model>/before|after|random`` (pair accuracy, %).
"""
from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Literal

from hardpos import preflight, storage, tracking
from hardpos.audit.config import HELDOUT_MODEL, MODELS, POLARITIES, SELECTION_MODELS, TextModelConfig
from hardpos.config import ConfigError, JobConfig, require
from hardpos.eval.spec import BenchmarkKind
from hardpos.markdown import md_text, table
from hardpos.runtime import JobContext

Format = Literal["auto", BenchmarkKind]


@dataclasses.dataclass
class Config(JobConfig):
    """Adversarial refinement job.

    input: a benchmark file or folder, or a triplet file (local or s3://).
    format: "auto" (from the path, a .json file's content or a folder's files), or a benchmark
        kind: "replace", "swap", "sugarcrepe", "sugarcrepe_pp", "triplets".
    output_dir: where subset/, keep.jsonl, report.md, report.json and summary.json go.
    polarities: which edits to balance: "negative" (caption against hard negative) and
        "positive" (caption against hard positive, where the input has them). Positives that
        cannot be balanced stop the job (exit 2) unless only "negative" is asked for.
    bins: quantile bins of a gap's size per model and polarity: the grid of mirror cells.
    rounds: at most this many rounds of selection (each reads the kept items' gaps from new
        cross-fits and stops when every selection model is within tolerance of chance or
        within the noise of its fits; a later round balances only the models still off chance).
    fits: fold assignments averaged into each item's gap (a steadier gap to select on).
    balance_ngrams: word n-grams (1..this) whose counts pick, inside a mirror cell, which items
        of the larger side are kept (a substitution kept one way tends to be kept the other
        way); 0 draws them at random (seeded).
    checks: fresh cross-fits (fold assignments the selection never used) the check averages over.
    tolerance: the distance from chance (a fraction: 0.03 = 3 points) at which a round is enough.
    min_keep: a polarity whose balance keeps less than this share of a category's items cannot
        be balanced there (said per category, with why).
    text_models: the text models' settings and their cross-fitting folds (folds, ngrams, l2,
        steps, order, discount; the same section in ``hardpos audit`` and the evaluate stage's
        ``blind``).
    min_items: a category with fewer items (or fewer captions than folds) is kept as it is.
    """

    input: str = ""
    format: Format = "auto"
    output_dir: str = "outputs/debias"
    polarities: list[str] = dataclasses.field(default_factory=lambda: list(POLARITIES))
    bins: int = 4
    rounds: int = 2
    fits: int = 3
    balance_ngrams: int = 1
    checks: int = 5
    tolerance: float = 0.03
    min_keep: float = 0.1
    text_models: TextModelConfig = dataclasses.field(default_factory=TextModelConfig)
    min_items: int = 20

    def __post_init__(self) -> None:
        require(bool(self.polarities) and set(self.polarities) <= set(POLARITIES) and "negative" in self.polarities,
                "polarities", "must be [negative] or [negative, positive]", self.polarities)
        require(self.bins >= 1, "bins", "must be >= 1", self.bins)
        require(self.rounds >= 1, "rounds", "must be >= 1", self.rounds)
        require(self.fits >= 1, "fits", "must be >= 1", self.fits)
        require(self.balance_ngrams >= 0, "balance_ngrams", "must be >= 0 (0: a seeded random draw)", self.balance_ngrams)
        require(self.checks >= 1, "checks", "must be >= 1", self.checks)
        require(0.0 <= self.tolerance < 0.5, "tolerance", "must be in [0, 0.5)", self.tolerance)
        require(0.0 <= self.min_keep <= 1.0, "min_keep", "must be in [0, 1]", self.min_keep)
        require(self.min_items >= self.text_models.folds, "min_items",
                f"must be >= text_models.folds ({self.text_models.folds})", self.min_items)


def check(cfg: Config) -> None:
    """Before any work: the input exists (its format and items are read by ``run``, before any
    model is fitted), then the tracking server."""
    if not cfg.input:
        raise ConfigError("input is required: a benchmark file or folder, or a triplet file")
    preflight.check_s3_endpoint([cfg.input, cfg.output_dir])
    if not storage.exists(cfg.input):
        preflight.fail("input", cfg.input, "not found", "give a benchmark file or folder, or a triplet file")
    tracking.check_tracking(cfg.tracking)


def _pct(x: dict[str, float]) -> str:
    return "" if x.get("n", 0) == 0 else f"{100 * x['acc']:.1f} [{100 * x['lo']:.1f}, {100 * x['hi']:.1f}]"


def report_markdown(rows: list[dict[str, Any]], models: dict[str, str], refused: dict[str, str], subset: str | None,
                    kind: str) -> str:
    """report.md: what each model is, the items per category before and after, and every
    model's pair measure before / after / on a random subset of the same size."""
    out = ["# Adversarial refinement (`hardpos debias`)", "",
           "Pair measure: the share of items whose caption a text-only model prefers to the edit (a tie counts one "
           "half, the chance of a guess; 50 = chance), in %, 95% interval. Selection models: "
           + ", ".join(f"`{m}`" for m in SELECTION_MODELS) + f"; held out (never used to select): `{HELDOUT_MODEL}`. Before: "
           "every item; after: the kept items; random: as many items drawn at random. All three read the same fresh "
           "cross-fits over the whole category (fold assignments no selection round used); each item counts the share "
           "of them that get it right.", ""]
    out += [f"- `{md_text(k)}`: {md_text(v)}" for k, v in models.items()] + [""]
    body = []
    for r in rows:
        v = r["verify"]
        if "skipped" in v:
            body.append([md_text(r["category"]), str(r["items_before"]), str(r["items_after"]), "", "", "", "",
                         md_text(v["skipped"])])
            continue
        for pol in POLARITIES:
            if pol not in v["before"]:
                continue
            for m in (*SELECTION_MODELS, HELDOUT_MODEL):
                body.append([md_text(r["category"]), str(r["items_before"]), str(r["items_after"]), pol + "s", m,
                             _pct(v["before"][pol][m]), _pct(v["after"][pol][m]), _pct(v["random"][pol][m])])
    out.append(table(["category", "items before", "items after", "edits", "model", "before", "after", "random subset"],
                     body))
    notes = [f"- {md_text(r['category'])}: {md_text(why)}" for r in rows for why in r["unbalanceable"].values()]
    notes += [f"- {md_text(r['category'])}: {md_text(r['skipped'])}" for r in rows if r.get("skipped")]
    if notes or refused:
        out += ["", "Not balanced:", "", *notes]
    out += ["", f"Subset ({kind}): {md_text(subset)}" if subset else "No subset written: the positives cannot be balanced "
            "(polarities=[negative] balances the negatives only)."]
    return "\n".join(out) + "\n"


def run(cfg: Config, ctx: JobContext) -> dict:
    # lazy: the text models load scikit-learn (seconds); the CLI imports this module for its Config
    import numpy as np

    from hardpos.audit.blind import AuditError, read_source
    from hardpos.audit.config import BlindSettings
    from hardpos.audit.debias import DebiasSettings, debias, verify
    from hardpos.eval.formats import write_subset
    from hardpos.eval.items import BenchmarkError

    try:
        src = read_source(cfg.input, cfg.format)
    except AuditError as exc:
        raise ConfigError(f"input={cfg.input}: {exc}") from exc
    kind = src.info["format"]
    if kind == "captions":
        raise ConfigError(f"input={cfg.input}: a caption file is no benchmark to refine; give a benchmark file or "
                          "folder or a triplet file")
    items = src.items
    blind = BlindSettings(text_models=cfg.text_models, seed=cfg.seed, min_items=cfg.min_items)
    settings = DebiasSettings(blind=blind, polarities=tuple(cfg.polarities), bins=cfg.bins, rounds=cfg.rounds,
                              fits=cfg.fits, tolerance=cfg.tolerance, min_keep=cfg.min_keep, seed=cfg.seed,
                              balance_ngrams=cfg.balance_ngrams, checks=cfg.checks)
    print(f"debias: {cfg.input} ({kind}): {len(items)} items", file=sys.stderr)
    cats = debias(items, settings)
    rows, keep_lines, metrics = [], [], {}
    kept_ids: set[str] = set()
    for c in cats:
        its = [it for it in items if it.subset == c.name]
        v = verify(its, c.kept, settings, seed=cfg.seed + 1000)
        print(f"debias: {c.name}: {len(its)} -> {int(c.kept.sum())} items", file=sys.stderr)
        rows.append({"category": c.name, "items_before": len(its), "items_after": int(c.kept.sum()), "rounds": c.rounds,
                     "skipped": c.skipped, "unbalanceable": c.unbalanceable, "verify": v})
        metrics[f"debias/{c.name}/items_before"] = len(its)
        metrics[f"debias/{c.name}/items_after"] = int(c.kept.sum())
        for label in ("before", "after", "random"):
            for pol in POLARITIES:
                for m, x in v.get(label, {}).get(pol, {}).items():
                    if x["n"]:
                        metrics[f"debias/{c.name}/{pol}/{m}/{label}"] = round(100 * x["acc"], 2)
        for j, it in enumerate(its):
            g = {pol: {m: (None if np.isnan(c.gaps[(pol, m)][j]) else float(c.gaps[(pol, m)][j]))
                       for m in SELECTION_MODELS if (pol, m) in c.gaps} for pol in POLARITIES if (pol, MODELS[0]) in c.gaps}
            keep_lines.append(json.dumps({"item_id": it.item_id, "category": c.name, "kept": bool(c.kept[j]), "gaps": g}))
        kept_ids.update(it.item_id for it, k in zip(its, c.kept) if k)
    refused = {r["category"]: r["unbalanceable"]["positive"] for r in rows
               if "positive" in r["unbalanceable"] and "positive" in cfg.polarities}
    models = {m: cfg.text_models.describe(m) for m in (*SELECTION_MODELS, HELDOUT_MODEL)}
    subset = None
    if not refused:
        try:
            subset = write_subset(kind, cfg.input, kept_ids, ctx.path("subset"))
        except BenchmarkError as exc:
            raise ConfigError(f"input={cfg.input}: {exc}") from exc
    md = report_markdown(rows, models, refused, subset, kind)
    doc = {"input": cfg.input, "format": kind, "models": models, "categories": rows,
           "benchmark": {"kind": kind, "path": subset} if subset else None}
    files = {"keep": storage.write_text(ctx.path("keep.jsonl"), "\n".join(keep_lines) + "\n"),
             "report": storage.write_text(ctx.path("report.md"), md),
             "report_json": storage.write_text(ctx.path("report.json"), json.dumps(doc, indent=2))}
    ctx.log_metrics(metrics)
    if ctx.run is not None:
        ctx.run.log_text(md, "report.md")
        ctx.run.log_json(doc, "report.json")
    print(md)
    if refused:
        raise ConfigError("the hard positives cannot be balanced (" + "; ".join(
            f"{k}: {v}" for k, v in refused.items()) + f"); the report is in {files['report']}. "
            "polarities=[negative] balances the negatives only")
    return {"format": kind, "items_before": len(items), "items_after": len(kept_ids), "benchmark": doc["benchmark"],
            "categories": rows, "models": models, "files": files}
