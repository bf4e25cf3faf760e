"""`hardpos audit`: how well a text-only model tells each kind of edit from its caption, with no image.

A blind-text audit of hard negatives and positives before any GPU hour is spent on them, with
two kinds of text model, each cross-fitted in folds grouped by original caption (a caption and
its edits never straddle folds): a logistic regression on word 1-2-grams (``ngram_lr``) and an
n-gram language model of the original captions (``caption_lm``). Per kind of edit (REPLACE
attribute / relation / object, SWAP, ...), negatives and positives apart: the classifier's
one-caption accuracy (mean ± std over folds), and the **pair** measure of both models (the
model picks which caption of the pair is the original: what a benchmark asks), with a 95%
interval; 50% is blind chance. Beside them, as a benchmark reads the source's items: the
text-only original / augmented accuracy and brittleness per subset (chance 50 / 33.3 / 33.3),
and simple grammar-rule hit counts. Edits a blind model spots teach a model to detect *that* a
caption was edited rather than to look at the image, and a benchmark made of them can be passed
on text alone. docs/blind-audit.md has the measured tables for the platform's rules and the
public benchmarks.

Inputs (``input=`` one source, or ``inputs=`` several side by side; local or s3://): a triplet
file (parquet/jsonl, e.g. the output of `perturb` or `generate`), a caption file with negatives
(NegCLIP tsv), or any benchmark file or folder the evaluate stage reads (REPLACE / SWAP /
SugarCrepe / SugarCrepe++: the release, one half of it such as ``swapped_data/``, or one file;
:mod:`hardpos.audit.blind` reads them all).

Output (``output_dir``): ``audit.md`` (the tables), ``audit.json`` (every row with its fold
accuracies and the hits per grammar rule; also the run's artifacts) and ``summary.json``.
MLflow metrics, in %: ``blind/<source>/<polarity>/<kind>`` (one caption) with ``.../std``,
``.../pair`` and ``.../pair_lm``; ``blind/<source>/<subset>/<model>/<figure>`` (the triplet
figures, with ``_lo`` / ``_hi``); ``grammar/<source>/<polarity>/<kind>`` (% of edits with a
grammar-rule hit).
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from typing import Any, Literal, get_args

from hardpos import preflight, storage, tracking
from hardpos.config import ConfigError, JobConfig, require
from hardpos.audit.config import FORMATS, POLARITIES, TextModelConfig
from hardpos.eval.spec import BenchmarkKind
from hardpos.rules.english import GRAMMAR_RULES
from hardpos.runtime import JobContext

#: a source's format: the benchmark kinds the evaluate stage reads, a caption file, or told from the path
Format = Literal["auto", "captions", BenchmarkKind]
assert set(get_args(Format)) == set(FORMATS)


@dataclasses.dataclass
class AuditSource:
    """One source of the audit.

    path: a triplet file (.parquet/.jsonl), a caption file with negatives (.tsv/.csv/.json) or
        a benchmark folder; local or s3://.
    name: its label in the table and the metrics (default: the file or folder name).
    format: "auto" (from the extension, a .json file's content, or the files a folder holds),
        or one of "triplets", "captions", "replace", "swap", "sugarcrepe", "sugarcrepe_pp".
    """

    path: str = ""
    name: str = ""
    format: Format = "auto"


@dataclasses.dataclass
class Config(JobConfig):
    """Blind-text audit job.

    input: one source to audit (a shorthand for ``inputs=[{path: ...}]``; both may be given).
    inputs: sources audited side by side, each {path, name, format}.
    output_dir: where audit.md, audit.json and summary.json go (local or s3://).
    polarities: which edits to audit: "negative" (hard negatives), "positive" (hard positives).
    pooled: also audit each polarity's kinds together (the "all" rows, where a source has several kinds).
    triplets: also the text-only figures as a benchmark reads the source's items (per subset
        and text model: original accuracy, and with hard positives augmented accuracy and
        brittleness, each with a 95% interval).
    text_models: the text models' settings and their cross-fitting folds (folds, ngrams, l2,
        steps, order, discount; the same section in ``hardpos debias`` and the evaluate stage's
        ``blind``).
    min_pairs: a kind with fewer distinct caption/edit pairs (a subset with fewer items) is
        listed but not measured.
    """

    input: str = ""
    inputs: list[AuditSource] = dataclasses.field(default_factory=list)
    output_dir: str = "outputs/audit"
    polarities: list[str] = dataclasses.field(default_factory=lambda: list(POLARITIES))
    pooled: bool = True
    triplets: bool = True
    text_models: TextModelConfig = dataclasses.field(default_factory=TextModelConfig)
    min_pairs: int = 20

    def __post_init__(self) -> None:
        require(self.min_pairs >= self.text_models.folds, "min_pairs",
                f"must be >= text_models.folds ({self.text_models.folds})", self.min_pairs)
        require(bool(self.polarities) and set(self.polarities) <= set(POLARITIES), "polarities",
                f"must be a non-empty subset of {list(POLARITIES)}", self.polarities)


def source_name(path: str) -> str:
    """A source's default label: its file name without the extension, or its folder's name."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"\.(parquet|jsonl|json|tsv|csv)$", "", last, flags=re.IGNORECASE) or path


def sources(cfg: Config) -> list[AuditSource]:
    """The configured sources (``input`` first), names filled in; ConfigError when there is
    none or two share a name."""
    found = ([AuditSource(path=cfg.input)] if cfg.input else []) + list(cfg.inputs)
    if not found:
        raise ConfigError("input is required: a triplet file, a caption file with negatives or a benchmark folder "
                          "(or inputs=[{path: ...}, ...] for several)")
    out = []
    for i, s in enumerate(found):
        if not s.path:
            raise ConfigError(f"inputs.{i - bool(cfg.input)}.path is empty")
        out.append(dataclasses.replace(s, name=s.name or source_name(s.path)))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"sources need distinct names (set inputs.N.name), got {names}")
    return out


def _metric_key(*parts: str) -> str:
    """An MLflow metric name (letters, digits, ``_-./`` and spaces only)."""
    return "/".join(re.sub(r"[^A-Za-z0-9_.\- ]", "_", p) for p in parts)


def check(cfg: Config) -> None:
    """Before any work: every source exists (its format and contents are read by ``run``, before
    any classifier is fitted), then the tracking server."""
    paths = ([("input", cfg.input)] if cfg.input else []) + [(f"inputs.{i}.path", s.path) for i, s in enumerate(cfg.inputs)]
    preflight.check_s3_endpoint([p for _, p in paths] + [cfg.output_dir])
    for key, path in paths:
        if path and not storage.exists(path):
            preflight.fail(key, path, "source not found",
                           "give a triplet file, a caption file with negatives or a benchmark folder")
    tracking.check_tracking(cfg.tracking)


def run(cfg: Config, ctx: JobContext) -> dict:
    # lazy: the text models load scikit-learn (seconds); the CLI imports this module for its Config
    from hardpos.audit.baselines import FIGURES, blind_baseline
    from hardpos.audit.blind import (AuditError, AuditSettings, NoEditsError, Source, audit_edits, markdown_table,
                                     read_source)

    settings = AuditSettings(text_models=cfg.text_models, seed=cfg.seed, min_pairs=cfg.min_pairs)
    chosen = sources(cfg)
    read: list[tuple[AuditSource, Any]] = []
    for s in chosen:  # every source is read before any is audited: a bad one fails in seconds
        try:
            src = read_source(s.path, s.format)
        except NoEditsError as exc:
            if not cfg.allow_empty:
                raise ConfigError(f"{s.name}: {exc} (allow_empty=true audits it as empty)") from exc
            src = Source([], [], {"format": s.format, "edits": 0, "identical": None})
        except AuditError as exc:
            raise ConfigError(f"{s.name}: {exc}") from exc
        if src.edits and not any(e.polarity in cfg.polarities for e in src.edits):
            raise ConfigError(f"{s.name}: {s.path} has no {' or '.join(cfg.polarities)} edits "
                              f"(it has {sorted({e.polarity for e in src.edits})}); set polarities=")
        read.append((s, src))

    results = []
    metrics: dict[str, float] = {}
    models: dict[str, str] = {}
    for s, src in read:
        info = src.info
        print(f"audit: {s.name} ({info['format']}): {info['edits']} distinct edits, {info['identical']} equal to "
              f"their caption", file=sys.stderr)
        rows = audit_edits(src.edits, settings, polarities=cfg.polarities, pooled=cfg.pooled,
                           progress=lambda line, name=s.name: print(f"audit: {name} {line}", file=sys.stderr))
        triplet_rows = []
        if cfg.triplets and src.items:
            print(f"audit: {s.name} triplet figures: {len(src.items)} items", file=sys.stderr)
            base = blind_baseline(s.name, src.items, src.aggregate, settings.blind())
            triplet_rows = base.rows()
            models.update(base.models)
        results.append({"name": s.name, "path": s.path, **info, "rows": rows, "triplet_rows": triplet_rows})
        for r in rows:
            key = (s.name, r["polarity"], r["kind"])
            metrics[_metric_key("grammar", *key)] = r["grammar_hit_pct"]
            if r["skipped"] is None:
                metrics[_metric_key("blind", *key)] = r["accuracy_pct"]
                metrics[_metric_key("blind", *key, "std")] = r["std_pct"]
                metrics[_metric_key("blind", *key, "pair")] = r["pair_pct"]
                metrics[_metric_key("blind", *key, "pair_lm")] = r["lm_pair_pct"]
        for t in triplet_rows:
            for fig in FIGURES:
                for suffix in ("", "_lo", "_hi"):
                    if fig + suffix in t:
                        metrics[_metric_key("blind", s.name, t["subset"], t["model"], fig + suffix)] = \
                            round(100 * t[fig + suffix], 2)

    table = markdown_table(results)
    doc = {"settings": dataclasses.asdict(settings), "models": models,
           "grammar_rules": {name: what for name, (_, what) in GRAMMAR_RULES.items()}, "sources": results}
    md_uri = storage.write_text(ctx.path("audit.md"), table)
    json_uri = storage.write_text(ctx.path("audit.json"), json.dumps(doc, indent=2, ensure_ascii=False))
    ctx.log_metrics(metrics)
    if ctx.run is not None:
        ctx.run.log_text(table, "audit.md")
        ctx.run.log_json(doc, "audit.json")
    print(table)
    return {"sources": results, "models": models, "table": md_uri, "json": json_uri}
