"""Calibrate the synthetic world and measure the demo over seeds.

The commands::

    # the measurement: the real demo (every stage, Ray, MLflow) once per seed, then mean and
    # spread of every table cell over the seeds (results_seeds.md / .json / .png)
    python -m benchmarks.calibrate seeds seeds=[0,1,2] output_dir=outputs/calibrate [demo.key=value ...]

    # the README's counts: the preregistered checks on the confirmatory worlds (refuses until all
    # registered worlds are in); or, exploratory, the checks a seeds measurement's rows can judge
    python -m benchmarks.calibrate signs confirmatory=true
    python -m benchmarks.calibrate signs results=outputs/calibrate/results_seeds.json [output=signs.md]

    # two measurements on the same seeds side by side (e.g. full finetuning and LoRA): per model and
    # column each side's mean ± std, the paired difference and its two-sided paired t-test
    python -m benchmarks.calibrate pair a=outputs/calibrate/results_seeds.json \
        b=outputs/calibrate-lora/results_seeds.json a_name=full b_name=LoRA [output=lora-vs-full.md]

    # re-score finished checkpoints on another world's benchmark (e.g. a benchmark-only knob such as
    # binding_partial_captions: the checkpoints do not change, only the items do)
    python -m benchmarks.calibrate rescore world_dir=outputs/bench \
        'models={"pretrained": "base:hardpos-base", "hn-only": "outputs/demo/finetune/hn-only/model"}'

Every number comes from the product's own stages (``seeds`` runs the demo, ``rescore`` the
evaluate stage); this file only runs them and reads their rows.  Every key=value is parsed as YAML;
``seeds`` passes ``demo.<key>=<value>`` on to the demo config (e.g. ``demo.finetune.steps=200``).
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from scipy import stats

from benchmarks.calibrate_artefacts import ArtefactConfig, artefact_strength
from hardpos import plots
from hardpos.config import ModelConfig, load_config
from hardpos.markdown import table
from hardpos.paper import table1
from hardpos.paper import confirm
from hardpos.paper.figures import aggregate, p_text, paired_test
from hardpos.runtime import execute
from hardpos.stages import demo, evaluate


# --------------------------------------------------------------------------- rescore
@dataclasses.dataclass
class RescoreConfig:
    """Finished checkpoints scored on a world's benchmark by the evaluate stage, without training.

    world_dir: a world (its benchmark/ and images/benchmark/ are read).
    models: table name -> checkpoint (a local model folder, e.g. <demo>/finetune/hn-only/model,
        or any source the evaluate stage loads: base:, runs:/, models:/, s3://).
    arch: open_clip architecture of the checkpoints.
    output_dir: the evaluate stage's outputs go to <output_dir>/<name>.
    output: also write the rows as JSON here.
    """

    world_dir: str = "outputs/world"
    models: dict[str, str] = dataclasses.field(default_factory=dict)
    arch: str = "hardpos-demo"
    output_dir: str = "outputs/rescore"
    output: str | None = None


def rescore(cfg: RescoreConfig) -> dict[str, dict[str, float]]:
    """Score each checkpoint of ``models`` with the evaluate stage on the world's benchmarks;
    print the demo's table and return the rows."""

    if not cfg.models:
        raise ValueError("rescore: models is empty; give models={name: checkpoint, ...}")
    rows: dict[str, dict[str, float]] = {}
    for name, ckpt in cfg.models.items():
        ecfg = evaluate.Config(output_dir=str(Path(cfg.output_dir) / name), model_name=name,
                               model=ModelConfig(arch=cfg.arch, pretrained=ckpt), world_dir=cfg.world_dir)
        rows[name] = table1.table_row(execute("evaluate", ecfg)["metrics"])
    print(table1.markdown_table(rows, title=f"rescore: {cfg.world_dir}"))
    if cfg.output:
        Path(cfg.output).write_text(json.dumps({"config": dataclasses.asdict(cfg), "rows": rows}, indent=2))
    return rows


# --------------------------------------------------------------------------- signs
@dataclasses.dataclass
class SignsConfig:
    """The preregistered checks on a measurement.

    confirmatory: judge the preregistered confirmatory worlds (``python -m benchmarks.confirmatory
        report``: refuses until every registered world is in); the README's counts come from it.
    results: otherwise, a seeds measurement's ``results_seeds.json``: the checks its rows can
        judge, over its seeds, with the same test and correction, as an exploratory reading (the
        seeds share one world, so they say nothing across worlds).
    alpha: the level of the test and of Holm's correction.
    output: also write the Markdown here.
    """

    confirmatory: bool = False
    results: str = "outputs/calibrate/results_seeds.json"
    alpha: float = confirm.ALPHA
    output: str | None = None


def signs(cfg: SignsConfig) -> dict[str, Any]:
    """Print (and optionally write) the verdicts of the preregistered checks (see SignsConfig)."""
    if cfg.confirmatory:
        from benchmarks import confirmatory  # lazy: only this branch reads the preregistration

        return confirmatory.report(confirmatory.ReportConfig(output=cfg.output or ""))
    data = json.loads(Path(cfg.results).read_text())
    per_seed = data.get("per_seed") or []
    if len(per_seed) < 2:
        raise ValueError(f"{cfg.results}: {len(per_seed)} seed(s) of per-seed rows; a paired test needs at least 2")
    mean, std = aggregate(per_seed)
    checks = [c for c in confirm.all_checks(confirm.load_findings()) if all(confirm.judgeable(c, r) for r in per_seed)]
    verdicts = confirm.judge(checks, per_seed, cfg.alpha)
    n = confirm.counts(verdicts)
    seeds_ = data.get("seeds", list(range(len(per_seed))))
    md = (f"### Exploratory: {len(per_seed)} seeds {seeds_} of one world ({cfg.results})\n\n"
          + table1.markdown_table(mean, std) + "\n"
          + f"{n['held_holm']} of {n['distinct']} judgeable preregistered checks hold after Holm's correction "
            f"({n['held']} before it), with the seed as the unit: exploratory, not a confirmatory result.\n\n"
          + confirm.verdicts_table(verdicts))
    print(md)
    if cfg.output:
        Path(cfg.output).write_text(md)
    return {"verdicts": verdicts, "counts": n, "markdown": md}


# --------------------------------------------------------------------------- pair
@dataclasses.dataclass
class PairConfig:
    """Two seeds measurements side by side (e.g. full finetuning and LoRA), seed by seed.

    a / b: ``results_seeds.json`` files; only their common seeds and models are compared.
    a_name / b_name: the labels of the two in the table.
    models: rows to compare (default: every finetuned model both have, "pretrained" left out:
        both start from it).
    alpha: the two-sided paired t-test's level per cell.
    output: also write the Markdown here.
    """

    a: str = "outputs/calibrate/results_seeds.json"
    b: str = "outputs/calibrate-lora/results_seeds.json"
    a_name: str = "a"
    b_name: str = "b"
    models: list[str] | None = None
    alpha: float = confirm.ALPHA
    output: str | None = None


PAIR_COLUMNS = tuple(f"{bench}/{fig}" for bench in ("replace", "swap") for fig in ("orig_acc", "aug_acc", "brittleness"))


def _by_seed(path: str) -> dict[int, dict]:
    data = json.loads(Path(path).read_text())
    return dict(zip(data.get("seeds", []), data.get("per_seed", [])))


def paired_cells(a: dict[int, dict], b: dict[int, dict], models: list[str] | None = None,
                 alpha: float = confirm.ALPHA) -> list[dict[str, Any]]:
    """Per (model, column) over the seeds both have: each side's mean and std, the paired
    difference b - a (mean, std) and its two-sided paired t-test p, in percentage points.
    ``differs`` is p < alpha. Raises ValueError with fewer than 2 common seeds."""
    seeds_ = sorted(set(a) & set(b))
    if len(seeds_) < 2:
        raise ValueError(f"pair: {len(seeds_)} common seed(s) ({seeds_}); a paired test needs at least 2")
    common = [m for m in a[seeds_[0]] if all(m in a[k] and m in b[k] for k in seeds_)]
    rows = []
    for m in models or [m for m in common if m != "pretrained"]:
        if m not in common:
            raise ValueError(f"pair: model {m!r} is not in both measurements for seeds {seeds_}; both have {common}")
        for col in PAIR_COLUMNS:
            va = [100 * float(a[k][m][col]) for k in seeds_]
            vb = [100 * float(b[k][m][col]) for k in seeds_]
            test = paired_test([y - x for x, y in zip(va, vb)])
            if test.sd == 0:  # identical differences: no spread to test against
                p_two = 1.0 if test.mean == 0 else 0.0
            else:
                p_two = min(1.0, 2 * float(stats.t.sf(abs(test.t), test.n - 1)))
            rows.append({"model": m, "column": col, "seeds": seeds_, "a_mean": statistics.fmean(va),
                         "a_std": statistics.stdev(va), "b_mean": statistics.fmean(vb), "b_std": statistics.stdev(vb),
                         "diff_mean": test.mean, "diff_std": test.sd, "p": p_two, "differs": p_two < alpha})
    return rows


def pair(cfg: PairConfig) -> dict[str, Any]:
    """Print (and optionally write) :func:`paired_cells` of ``a`` and ``b`` as a table, with
    the number of tests and the false "differs" expected at ``alpha``."""
    rows = paired_cells(_by_seed(cfg.a), _by_seed(cfg.b), cfg.models, cfg.alpha)
    body = [[r["model"], r["column"], f"{r['a_mean']:.1f} ± {r['a_std']:.1f}", f"{r['b_mean']:.1f} ± {r['b_std']:.1f}",
             f"{r['diff_mean']:+.1f} ± {r['diff_std']:.1f}", p_text(r["p"]),
             "**differs**" if r["differs"] else "inside the noise"] for r in rows]
    n_diff = sum(r["differs"] for r in rows)
    md = (f"### {cfg.b_name} against {cfg.a_name}, seed by seed (seeds {rows[0]['seeds']})\n\n"
          + table(["model", "column", cfg.a_name, cfg.b_name, f"{cfg.b_name} - {cfg.a_name}", "paired t (two-sided)",
                   "verdict"], body)
          + f"\n{len(rows)} tests at alpha {cfg.alpha:g}: {n_diff} differ; about {len(rows) * cfg.alpha:.1f} would "
            f"by chance alone.\n")
    print(md)
    if cfg.output:
        Path(cfg.output).write_text(md)
    return {"rows": rows, "markdown": md}


# --------------------------------------------------------------------------- seeds
@dataclasses.dataclass
class SeedsConfig:
    """The demo over several seeds.

    seeds: one demo per seed; the seed is the training seed (and the world seed with vary_world).
    output_dir: demo outputs go to <output_dir>/seed<k>; the aggregate to results_seeds.*.
    vary_world: also use the seed as the world seed. The demo's default base is pretrained on
        world seed 0, so this needs ``demo.from_scratch=true`` (a base per seed, pretrained
        from scratch on that seed's world); by default every seed finetunes the shipped base
        on its world and only the training seed varies.
    demo: extra demo config overrides (dotted keys) for every seed; "{seed}" in a string
        value is replaced by the seed.
    resume: reuse a seed whose <output_dir>/seed<k>/summary.json says it finished (so an
        interrupted measurement continues); false reruns every seed.
    """

    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])
    output_dir: str = "outputs/calibrate"
    vary_world: bool = False
    demo: dict[str, Any] = dataclasses.field(default_factory=dict)
    resume: bool = True


def seeds(cfg: SeedsConfig) -> dict[str, Any]:
    """Run the demo per seed (each through runtime.execute) and aggregate mean / spread."""

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    per_seed, summaries = [], {}
    for s in cfg.seeds:
        # string values may name the seed: demo.pretrained=outputs/calibrate/seed{seed}/base/pretrain/model
        overrides = [f"{k}={json.dumps(v) if not isinstance(v, str) else v.replace('{seed}', str(s))}"
                     for k, v in cfg.demo.items()]
        overrides += [f"seed={s}", f"output_dir={out / f'seed{s}'}"]
        if cfg.vary_world:
            overrides.append(f"world.seed={s}")
        done = out / f"seed{s}" / "summary.json"
        if cfg.resume and done.exists() and json.loads(done.read_text()).get("status") == "ok":
            summary = json.loads(done.read_text())  # finished earlier: a rerun only adds missing seeds
            print(f"seed {s}: reusing {done}", file=sys.stderr)
        else:
            dcfg = load_config(demo.Config, None, overrides)
            summary = execute("demo", dcfg)
        per_seed.append(summary["rows"])
        summaries[s] = {"champion": summary["champion"], "pipeline_s": summary["pipeline_s"],
                        "timings_s": summary["timings_s"], "artefacts": seed_artefacts(out / f"seed{s}")}
        _write_aggregate(out, cfg, per_seed, summaries)
    return _write_aggregate(out, cfg, per_seed, summaries)


def seed_artefacts(seed_dir: Path) -> dict[str, dict[str, float]] | None:
    """The artefact strength of one seed's finetuning negatives (its generate stage's triplets)
    with word features ("words") and words + bigrams ("bigrams": a colour-shape combination is
    a bigram), None when the seed wrote none (e.g. a remote output_dir)."""
    triplets = seed_dir / "generate" / "triplets.parquet"
    if not triplets.exists():
        return None
    rows = pq.read_table(triplets, columns=["caption", "hard_negative", "hard_positive"]).to_pylist()
    return {name: artefact_strength(rows, ArtefactConfig(ngrams=n)) for name, n in (("words", 1), ("bigrams", 2))}


def artefact_line(found: list[dict[str, dict[str, float]]]) -> str:
    """One line under the sign table: the artefact strength (mean ± std over the seeds)."""
    def cell(features: str, key: str) -> str:
        vals = [100 * a[features][key] for a in found]
        spread = f" ± {statistics.stdev(vals):.1f}" if len(vals) > 1 else ""
        return f"{statistics.fmean(vals):.1f}{spread}"

    return ("Artefact strength of the finetuning negatives (a text-only classifier of caption vs hard negative, "
            "held-out accuracy, 50 = undetectable; `python -m benchmarks.calibrate_artefacts`): "
            + "; ".join(f"{label}: {cell(f, 'accuracy')}%, hard positives it calls negative "
                        f"{cell(f, 'positives_called_negative')}%" for f, label in (("words", "words"),
                                                                                     ("bigrams", "words + bigrams")))
            + ".")


def _write_aggregate(out: Path, cfg: SeedsConfig, per_seed, summaries) -> dict[str, Any]:

    mean, std = aggregate(per_seed)
    n = len(per_seed)
    title = f"mean ± std over {n} seed(s) {list(summaries)}"
    md = table1.markdown_table(mean, std, title=title)
    artefacts = [a for a in (summaries[s].get("artefacts") for s in summaries) if a]
    if artefacts:
        md += "\n" + artefact_line(artefacts) + "\n"
    (out / "results_seeds.md").write_text(md)
    result = {"seeds": list(summaries), "mean": mean, "std": std, "per_seed": per_seed, "runs": summaries,
              "artefacts": artefacts,
              "demo_overrides": cfg.demo}
    (out / "results_seeds.json").write_text(json.dumps(result, indent=2))
    plots.write_chart(mean, str(out / "results_seeds.png"), std, title=f"HardPos demo, {title}")
    print(md)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in ("seeds", "rescore", "signs", "pair"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "rescore":
        rescore(load_config(RescoreConfig, None, rest))
    elif cmd == "signs":
        signs(load_config(SignsConfig, None, rest))
    elif cmd == "pair":
        pair(load_config(PairConfig, None, rest))
    else:
        seeds(load_config(SeedsConfig, None, rest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
