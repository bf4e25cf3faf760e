"""Calibrate the synthetic world and measure the demo over seeds.

The commands::

    # cheap probe, Ray-free, one process: pretrain + finetune variants with the SAME model,
    # loss and evaluator code as the stages (hardpos.models.clip, hardpos.train.loss,
    # hardpos.eval.evaluator) on tensors decoded once; prints the Table-1-style comparison.
    python -m benchmarks.calibrate probe world_dir=outputs/world triplets=outputs/demo/generate/triplets.parquet \
        pretrain_steps=600 finetune_steps=150

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

``probe`` answers "is the world hard enough / does the mechanism show" in minutes; only the
``seeds`` numbers (the real pipeline) go into the README.  Every key=value is parsed as YAML;
``seeds`` passes ``demo.<key>=<value>`` on to the demo config (e.g. ``demo.finetune.steps=200``).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch
from PIL import Image
from scipy import stats

from benchmarks.calibrate_artefacts import ArtefactConfig, artefact_strength
from hardpos import plots
from hardpos.config import ModelConfig, load_config
from hardpos.eval.evaluator import run_benchmarks
from hardpos.eval.spec import BenchmarkSpec
from hardpos.markdown import table
from hardpos.models.clip import load_model, tokenize
from hardpos.paper import table1
from hardpos.paper import confirm
from hardpos.paper.figures import aggregate, p_text, paired_test
from hardpos.runtime import execute
from hardpos.stages import demo
from hardpos.train.config import LossConfig, OptimConfig
from hardpos.train.step import TripletCLIP, build_optimizer, build_scheduler, model_batch, train_step


# --------------------------------------------------------------------------- probe
@dataclasses.dataclass
class ProbeConfig:
    """Ray-free probe.

    world_dir: a generated world (pretrain.parquet, benchmark/*.parquet).
    triplets: the generate stage's triplets for the world's finetune split.
    arch: open_clip architecture (from scratch).
    seed: model init / batch order.
    pretrain_steps / pretrain_batch / pretrain_lr: the from-scratch phase (plain CLIP loss).
    finetune_steps / finetune_batch / finetune_lr: every variant's finetune.
    warmup: warmup steps of both phases.
    variants: name -> [w_pos, w_neg] (captions-only uses w = [0, 0] on captions without negatives).
    threads: torch CPU threads.
    pretrained: start from this checkpoint (e.g. a --from-scratch demo's <output_dir>/base/pretrain/model) and
        skip the pretraining phase.
    output: also write the rows (model -> table row) as JSON here (for aggregating seeds).
    keep_pairs: when the pretraining file has a ``pair`` column (a world with
        ``relation_pair_rate`` > 0), shuffle whole pairs so a relation twin lands in its
        original's batch; False shuffles rows (twins then rarely meet in a batch).
    base_cache: a state-dict file of the pretrained base: loaded when it exists (pretraining
        skipped), written after pretraining when it does not, so finetuning settings and
        benchmark variants are compared on one base (delete it when the world or arch changes).
    """

    world_dir: str = "outputs/world"
    triplets: str = "outputs/demo/generate/triplets.parquet"
    arch: str = "hardpos-tiny"
    seed: int = 0
    pretrain_steps: int = 600
    pretrain_batch: int = 128
    pretrain_lr: float = 5e-4
    finetune_steps: int = 150
    finetune_batch: int = 128
    finetune_lr: float = 1e-4
    warmup: int = 20
    variants: dict[str, list[float]] = dataclasses.field(
        default_factory=lambda: {"captions-only": [0.0, 0.0], "hn-only": [0.0, 1.0], "hp+hn": [1.0, 1.0]})
    threads: int = 2
    pretrained: str | None = None
    output: str | None = None
    base_cache: str | None = None
    keep_pairs: bool = True


def _load_images(paths: list[str], preprocess) -> "Any":

    return torch.stack([preprocess(Image.open(p).convert("RGB")) for p in paths])


def grouped_order(groups: list, generator) -> "Any":
    """A random row order in which rows sharing a non-None group id stay adjacent (whole
    groups are shuffled, a None row is a group of its own)."""

    units: list[list[int]] = []
    where: dict = {}
    for i, gid in enumerate(groups):
        if gid is None:
            units.append([i])
        elif gid in where:
            units[where[gid]].append(i)
        else:
            where[gid] = len(units)
            units.append([i])
    perm = torch.randperm(len(units), generator=generator).tolist()
    return torch.tensor([i for u in perm for i in units[u]], dtype=torch.long)


def _train(clip, images, caps, negs, poss, tokenizer, steps: int, batch: int, lr: float, warmup: int,
           w_pos: float, w_neg: float, negclip: bool, seed: int, log_every: int = 50,
           groups: list | None = None) -> None:
    """``steps`` steps of THE training step (:func:`hardpos.train.step.train_step`, as the
    train stage's workers run it: clipping at 1.0, warmup + cosine, logit_scale clamp) on
    tensors decoded once, one process, no Ray.  ``groups``: rows with one id stay in one
    batch (see :func:`grouped_order`; a group may straddle a batch boundary)."""

    optim = OptimConfig(lr=lr, weight_decay=0.1, beta1=0.9, beta2=0.98, eps=1e-6, warmup_steps=warmup, grad_clip=1.0)
    net = TripletCLIP(clip).train()
    opt = build_optimizer(clip, optim)
    sched = build_scheduler(opt, optim.warmup_steps, steps)
    loss_cfg = LossConfig(w_pos=w_pos, w_neg=w_neg, negclip_columns=negclip)
    g = torch.Generator().manual_seed(seed)
    n = len(caps)
    def new_order():
        return grouped_order(groups, g) if groups is not None else torch.randperm(n, generator=g)

    order = new_order()
    pos_i = 0
    t0 = time.time()
    for step in range(steps):
        if pos_i + batch > n:
            order, pos_i = new_order(), 0
        idx = order[pos_i:pos_i + batch].tolist()
        pos_i += batch
        has_n = torch.tensor([negs[i] is not None for i in idx])
        has_p = torch.tensor([poss[i] is not None for i in idx])
        texts = [caps[i] for i in idx] + [negs[i] or "" for i in idx] + [poss[i] or "" for i in idx]
        tok = tokenize(tokenizer, texts)
        b = len(idx)
        terms = train_step(net, model_batch(images[idx], tok[:b], tok[b:2 * b], tok[2 * b:], has_n, has_p),
                           loss_cfg, opt, sched, grad_clip=optim.grad_clip)
        if (step + 1) % log_every == 0 or step + 1 == steps:
            print(f"  step {step + 1}/{steps} loss {float(terms['total'].detach()):.3f} ({time.time() - t0:.0f}s)",
                  file=sys.stderr, flush=True)


def probe(cfg: ProbeConfig) -> dict[str, Any]:
    """Pretrain once, finetune every variant from the same weights, evaluate all; return the rows."""

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    world = Path(cfg.world_dir)
    lm = load_model(ModelConfig(arch=cfg.arch, pretrained=cfg.pretrained))
    cached = bool(cfg.base_cache) and Path(cfg.base_cache).exists()
    if cached:
        lm.model.load_state_dict(torch.load(cfg.base_cache, map_location="cpu"))
        print(f"base: {cfg.base_cache} (pretraining skipped)", file=sys.stderr)
    t0 = time.time()
    pre = [] if cfg.pretrained or cached else pq.read_table(world / "pretrain.parquet").to_pylist()
    pre_imgs = _load_images([str(world / r["image"]) for r in pre], lm.preprocess_val) if pre else None
    trip = pq.read_table(cfg.triplets, columns=["image", "caption", "hard_negative", "hard_positive"]).to_pylist()
    trip_base = Path(cfg.triplets).parent
    paths = sorted({r["image"] for r in trip})
    idx_of = {p: i for i, p in enumerate(paths)}
    ft_imgs_u = _load_images([p if Path(p).is_absolute() else str(trip_base / p) for p in paths], lm.preprocess_val)
    ft_imgs = ft_imgs_u[[idx_of[r["image"]] for r in trip]]
    cap_rows = {r["image"]: r["caption"] for r in trip}  # captions-only: one row per image
    cap_imgs = ft_imgs_u[[idx_of[p] for p in cap_rows]]
    print(f"decoded {len(pre)} pretrain + {len(paths)} finetune images in {time.time() - t0:.0f}s", file=sys.stderr)

    specs = _specs(world)

    def evaluate(model, name: str) -> dict[str, float]:
        model.eval()
        with torch.no_grad():
            m = run_benchmarks(model, lm.preprocess_val, lm.tokenizer, specs)
        model.train()
        row = table1.table_row(m)
        # each row as soon as it exists: a long probe that is stopped early still told something
        print(f"{name}: " + " ".join(f"{k} {100 * v:.1f}" for k, v in row.items() if k.endswith(
            ("orig_acc", "aug_acc", "brittleness"))), file=sys.stderr, flush=True)
        return row

    rows: dict[str, dict[str, float]] = {}
    if not cfg.pretrained and not cached:
        print(f"pretraining {cfg.pretrain_steps} steps ...", file=sys.stderr)
        nothing = [None] * len(pre)
        _train(lm.model, pre_imgs, [r["caption"] for r in pre], nothing, nothing, lm.tokenizer, cfg.pretrain_steps,
               cfg.pretrain_batch, cfg.pretrain_lr, cfg.warmup, 0.0, 0.0, False, cfg.seed,
               groups=[r.get("pair") for r in pre] if cfg.keep_pairs and "pair" in pre[0] else None)
        if cfg.base_cache:
            torch.save(lm.model.state_dict(), cfg.base_cache)
    rows["pretrained"] = evaluate(lm.model, "pretrained")
    base_state = copy.deepcopy(lm.model.state_dict())
    for name, (w_pos, w_neg) in cfg.variants.items():
        lm.model.load_state_dict(base_state)
        print(f"finetuning {name} (w_pos={w_pos}, w_neg={w_neg}) ...", file=sys.stderr)
        if w_pos == 0 and w_neg == 0:
            caps = list(cap_rows.values())
            none = [None] * len(caps)
            _train(lm.model, cap_imgs, caps, none, none, lm.tokenizer, cfg.finetune_steps, cfg.finetune_batch,
                   cfg.finetune_lr, cfg.warmup, 0.0, 0.0, False, cfg.seed + 1)
        else:
            _train(lm.model, ft_imgs, [r["caption"] for r in trip], [r["hard_negative"] for r in trip],
                   [r["hard_positive"] for r in trip], lm.tokenizer, cfg.finetune_steps, cfg.finetune_batch,
                   cfg.finetune_lr, cfg.warmup, w_pos, w_neg, True, cfg.seed + 1)
        rows[name] = evaluate(lm.model, name)
    print(table1.markdown_table(rows, title=f"probe: {json.dumps(dataclasses.asdict(cfg))}"))
    if cfg.output:
        Path(cfg.output).write_text(json.dumps({"config": dataclasses.asdict(cfg), "rows": rows}, indent=2))
    return rows


# --------------------------------------------------------------------------- rescore
@dataclasses.dataclass
class RescoreConfig:
    """Finished checkpoints scored on a world's benchmark, without training.

    world_dir: a world (only its benchmark/ and images/benchmark/ are read).
    models: table name -> checkpoint (a local model folder, e.g. <demo>/finetune/hn-only/model).
    arch: open_clip architecture of the checkpoints.
    threads: torch CPU threads.
    output: also write the rows as JSON here.
    """

    world_dir: str = "outputs/world"
    models: dict[str, str] = dataclasses.field(default_factory=dict)
    arch: str = "hardpos-demo"
    threads: int = 1
    output: str | None = None


def _specs(world: Path) -> list:

    return [BenchmarkSpec(name=f"world_{b}", kind="triplets", path=str(world / "benchmark" / f"{b}.parquet"))
            for b in ("replace_attribute", "replace_relation", "swap")]


def rescore(cfg: RescoreConfig) -> dict[str, dict[str, float]]:
    """Score each checkpoint of ``models`` with the evaluate stage's ``run_benchmarks``; print the
    demo's table (with the signs) and return the rows."""

    if not cfg.models:
        raise ValueError("rescore: models is empty; give models={name: checkpoint, ...}")
    torch.set_num_threads(cfg.threads)
    specs = _specs(Path(cfg.world_dir))
    rows: dict[str, dict[str, float]] = {}
    for name, ckpt in cfg.models.items():
        lm = load_model(ModelConfig(arch=cfg.arch, pretrained=ckpt))
        lm.model.eval()
        with torch.no_grad():
            rows[name] = table1.table_row(run_benchmarks(lm.model, lm.preprocess_val, lm.tokenizer, specs))
        print(f"{name}: scored", file=sys.stderr, flush=True)
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
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in ("probe", "seeds", "rescore", "signs", "pair"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "probe":
        probe(load_config(ProbeConfig, None, rest))
    elif cmd == "rescore":
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
