"""`hardpos demo` / `make demo`: the whole HardPos pipeline on the embedded default.

Every step is the real stage, run through :func:`hardpos.runtime.execute` on one local Ray,
and tracked as a child of this demo's MLflow run in one experiment (``hardpos-demo``):

1. ``world``     the synthetic world (pretrain / finetune / benchmark splits). A world folder
                 whose ``world.json`` config equals ``world`` is reused (second ``make demo``).
2. ``train``     "pretrain" a small CLIP from scratch on the pretrain split with the plain
                 CLIP loss (w_pos = w_neg = 0, no NegCLIP columns): the stand-in for a
                 web-pretrained CLIP that has rarely seen non-canonical forms.
3. ``generate``  hard negatives + hard positives for the finetune split (rule engine; the
                 http / vllm engines are ``generate.engine.kind`` away).
4. ``train``     finetune the pretrained checkpoint on Ray Train, one run per ``variants``
                 entry (default: captions-only control, HN-only, HP+HN); ``full=true`` adds
                 the paper's w_neg grid through the ``sweep`` stage.
5. ``evaluate``  every model (the pretrained base too) on the world's REPLACE (attribute,
                 relation) and SWAP benchmarks.
6. ``register``  the best finetuned model (mean augmented accuracy on REPLACE and SWAP) as
                 ``models:/<register_name>@champion``.
7. the Table-1-style comparison (``results.md``, ``results.json``) and a chart
   (``results.png``) in ``output_dir``, plus the commands to open the MLflow UI on this
   store and to serve the champion.

Scale (scenes, steps, batch sizes, workers) is all config, so CI runs the same code small.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from hardpos.config import JobConfig, TrackingConfig
from hardpos.data.world import WorldConfig
from hardpos.runtime import JobContext


@dataclasses.dataclass
class PhaseConfig:
    """One training phase on Ray Train (the pretraining, or every finetune).

    steps: global optimiser steps (epochs are derived: as many as the steps need).
    batch_size: samples per worker per step (global batch = batch_size * num_workers).
    lr: peak learning rate (linear warmup, cosine decay to 0 at ``steps``).
    warmup_steps: linear warmup steps.
    weight_decay: AdamW weight decay on weight matrices.
    num_workers: Ray Train workers (gloo on CPU).
    cpus_per_worker: CPUs reserved per worker (below cores / workers, so Ray Data's
        decode tasks keep a core).
    val_fraction: share of the split held out for a per-epoch validation loss (0: none;
        the benchmarks are the demo's evaluation).
    """

    steps: int = 300
    batch_size: int = 64
    lr: float = 1e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    num_workers: int = 2
    cpus_per_worker: float = 0.5
    val_fraction: float = 0.0


@dataclasses.dataclass
class Variant:
    """One finetuned model.

    name: its label in the table, in MLflow (run name) and its output folder.
    data: "triplets" (the generate stage's output: caption + hard negative + hard positive)
        or "captions" (the world's finetune split, captions only: the control).
    w_pos / w_neg: loss weights of the hard-positive / hard-negative terms.
    negclip_columns: hard negatives as extra contrastive columns (NegCLIP); ignored for captions.
    """

    name: str = "hp+hn"
    data: Literal["triplets", "captions"] = "triplets"
    w_pos: float = 1.0
    w_neg: float = 1.0
    negclip_columns: bool = True


def _default_variants() -> list[Variant]:
    return [Variant("captions-only", "captions", 0.0, 0.0, False),
            Variant("hn-only", "triplets", 0.0, 1.0, True),
            Variant("hp+hn", "triplets", 1.0, 1.0, True)]


def _default_world() -> WorldConfig:
    # The calibrated embedded default (README "Calibration"): vague "web" captions (half of the
    # pretraining captions name shapes only) so the base learns relations a little and binding
    # imperfectly; REPLACE-attribute negatives that only a binding-aware model rejects; finetuning
    # negatives without shape changes (a bag-of-words model already rejects those).
    return WorldConfig(seed=0, n_pretrain=20000, n_finetune=5000, n_benchmark=1000, binding_negative_rate=1.0,
                       shape_negatives=False, vague_caption_rate=0.5)


@dataclasses.dataclass
class Config(JobConfig):
    """The end-to-end demo.

    output_dir: everything goes under it: world/ (unless world_dir), pretrain/, generate/,
        finetune/<variant>/, eval/<model>/, register/, results.{md,json,png}.
    seed: seed of every training run (model init, shuffling); the world has its own seed.
    world: the synthetic world (scenes, vocabulary, noncanonical_rate ...; see `hardpos world --help`).
    world_dir: where the world lives (None: <output_dir>/world); reused when its world.json
        config equals ``world``.
    arch: the open_clip architecture trained from scratch (hardpos-demo: 64 px images in 8 x 8
        patches, so relations are visible; hardpos-tiny: 32 px in 4 x 4, for smoke tests).
    pretrain: the from-scratch "pretraining" phase (plain CLIP loss on the pretrain split).
    pretrained: use this checkpoint (a local dir, s3://, runs:/ or models:/ URI) as the
        pretrained base and skip step 2 (e.g. an earlier demo's <output_dir>/pretrain/model,
        to compare finetuning settings on the same base); None pretrains from scratch.
    finetune: the finetuning phase shared by every variant.
    variants: the finetuned models (default: captions-only control, HN-only, HP+HN).
    generate_engine: engine of the generate stage: rules | http | vllm (http/vllm need
        their settings; use the generate stage directly for those).
    full: also run the paper's w_neg grid (w_pos = 1, w_neg in 0..1) through the sweep stage.
    sweep_grid: the w_neg values of the full grid.
    register_name: registered model name of the champion (serve/config.yaml serves
        models:/hardpos-clip@champion).
    eval_batch_size: batch size of the evaluate stage.
    chart: write results.png (matplotlib).
    tracking: one experiment for every run of the demo (children nest under the demo run).
    ray: local Ray (num_cpus: None = all cores) or a cluster address.
    """

    output_dir: str = "outputs/demo"
    tracking: TrackingConfig = dataclasses.field(default_factory=lambda: TrackingConfig(experiment="hardpos-demo"))
    world: WorldConfig = dataclasses.field(default_factory=_default_world)
    world_dir: str | None = None
    arch: str = "hardpos-demo"
    pretrained: str | None = None
    pretrain: PhaseConfig = dataclasses.field(default_factory=lambda: PhaseConfig(steps=300, batch_size=32, lr=5e-4, warmup_steps=20))
    finetune: PhaseConfig = dataclasses.field(default_factory=lambda: PhaseConfig(steps=150, batch_size=32, lr=3e-4, warmup_steps=20))
    variants: list[Variant] = dataclasses.field(default_factory=_default_variants)
    generate_engine: Literal["rules", "http", "vllm"] = "rules"
    full: bool = False
    sweep_grid: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    register_name: str = "hardpos-clip"
    eval_batch_size: int = 256
    chart: bool = True

    def __post_init__(self) -> None:
        from hardpos.config import ConfigError

        names = [v.name for v in self.variants]
        if not names:
            raise ConfigError("variants: need at least one finetuned model")
        if len(set(names)) != len(names) or "pretrained" in names:
            raise ConfigError(f"variants: names must be unique and not 'pretrained', got {names}")
        for v in self.variants:
            if not v.name or "/" in v.name:
                raise ConfigError(f"variants: name {v.name!r} must be non-empty without '/'")
        for phase in ("pretrain", "finetune"):
            p = getattr(self, phase)
            if p.steps < 1 or p.batch_size < 1 or p.num_workers < 1:
                raise ConfigError(f"{phase}: steps, batch_size and num_workers must be >= 1")


# --------------------------------------------------------------------------- steps
class _Pipeline:
    """Runs the stages as children of the demo run and remembers their summaries."""

    def __init__(self, cfg: Config, ctx: JobContext):
        self.cfg, self.ctx = cfg, ctx
        self.timings: dict[str, float] = {}
        # Ray Train continues a run whose name already exists in its storage path, so a
        # second demo with other settings would silently keep the first one's finetunes:
        # every invocation trains under names of its own.
        self.invocation = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"

    def tracking(self, run_name: str) -> TrackingConfig:
        return dataclasses.replace(self.cfg.tracking, run_name=run_name)

    def execute(self, stage: str, cfg: Any, label: str) -> dict:
        from hardpos.runtime import execute

        t0 = time.time()
        _say(f"{label} ...")
        summary = execute(stage, cfg, parent_run_id=self.ctx.run_id)
        self.timings[label] = round(time.time() - t0, 1)
        _say(f"{label} done in {self.timings[label]:.0f}s")
        return summary

    # 1 ------------------------------------------------------------------ world
    def world(self) -> tuple[str, bool]:
        from hardpos import storage
        from hardpos.stages import world as world_stage

        cfg = self.cfg
        world_dir = cfg.world_dir or self.ctx.path("world")
        if _world_matches(world_dir, cfg.world):
            _say(f"1/7 world: reusing {world_dir} (its world.json matches the config)")
            self.timings["world"] = 0.0
            return world_dir, True
        wcfg = world_stage.Config(**dataclasses.asdict(cfg.world), output_dir=world_dir,
                                  tracking=self.tracking("world"), ray=cfg.ray)
        self.execute("world", wcfg, "1/7 world")
        if not storage.exists(storage.join(world_dir, "world.json")):
            raise RuntimeError(f"world stage wrote no world.json under {world_dir}")
        return world_dir, False

    # 2 / 4 ------------------------------------------------------------ training
    def train(self, name: str, label: str, data_path: str, phase: PhaseConfig, *, pretrained: str | None,
              w_pos: float, w_neg: float, negclip_columns: bool, output_dir: str) -> dict:
        from hardpos.train.data import DataConfig
        from hardpos.train.config import OptimConfig, ScalingSection, TrainConfig
        from hardpos.train.loss import LossConfig
        from hardpos.model import ModelConfig

        tcfg = TrainConfig(
            output_dir=output_dir, seed=self.cfg.seed, tracking=self.tracking(name), ray=self.cfg.ray,
            model=ModelConfig(arch=self.cfg.arch, pretrained=pretrained),
            data=DataConfig(train_path=data_path, val_fraction=phase.val_fraction),
            loss=LossConfig(w_pos=w_pos, w_neg=w_neg, negclip_columns=negclip_columns),
            optim=OptimConfig(lr=phase.lr, warmup_steps=phase.warmup_steps, weight_decay=phase.weight_decay),
            scaling=ScalingSection(num_workers=phase.num_workers, cpus_per_worker=phase.cpus_per_worker),
            # the loop stops at max_steps; enough epochs that the steps are always reached
            epochs=_epochs_for(data_path, phase), batch_size=phase.batch_size, max_steps=phase.steps,
            log_every=max(1, min(20, phase.steps // 10)), run_name=f"{_slug(name)}-{self.invocation}",
        )
        return self.execute("train", tcfg, label)

    # 3 ------------------------------------------------------------------ generate
    def generate(self, world_dir: str, regenerate: bool) -> dict:
        from hardpos.stages import generate as gen

        cfg = self.cfg
        gcfg = gen.Config(output_dir=self.ctx.path("generate"), seed=cfg.seed, tracking=self.tracking("generate"),
                          ray=cfg.ray, input=f"{world_dir}/finetune.parquet",
                          engine=dataclasses.replace(gen.EngineConfig(), kind=cfg.generate_engine),
                          # a new world invalidates earlier shards; an unchanged one resumes (nothing to do)
                          overwrite=regenerate)
        return self.execute("generate", gcfg, "3/7 generate hard negatives + positives")

    # 5 ------------------------------------------------------------------ evaluate
    def evaluate(self, name: str, checkpoint: str, world_dir: str) -> dict:
        from hardpos.model import ModelConfig
        from hardpos.stages import evaluate as ev

        ecfg = ev.Config(output_dir=self.ctx.path("eval", _slug(name)), seed=self.cfg.seed,
                         tracking=self.tracking(f"eval-{name}"), ray=self.cfg.ray,
                         model=ModelConfig(arch=self.cfg.arch, pretrained=checkpoint), model_name=name,
                         world=world_dir, batch_size=self.cfg.eval_batch_size, device="auto")
        return self.execute("evaluate", ecfg, f"5/7 evaluate {name}")


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _slug(name: str) -> str:
    """A file- and MLflow-safe form of a model name ("hp+hn" -> "hp_hn")."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _world_matches(world_dir: str, world: WorldConfig) -> bool:
    """True when ``world_dir`` holds a complete world generated with exactly ``world``."""
    from hardpos import storage
    from hardpos.data.world import BENCHMARKS, load_world

    try:
        meta = load_world(world_dir)
    except Exception:  # noqa: BLE001 - absent or unreadable: regenerate
        return False
    if meta.get("config") != json.loads(json.dumps(dataclasses.asdict(world))):
        return False
    files = ["pretrain.parquet", "finetune.parquet", *(f"benchmark/{b}.parquet" for b in BENCHMARKS)]
    return all(storage.exists(storage.join(world_dir, f)) for f in files)


def _epochs_for(data_path: str, phase: PhaseConfig) -> int:
    """Epochs so that ``phase.steps`` global steps fit (the loop stops at max_steps)."""
    import pyarrow.parquet as pq

    from hardpos import storage

    # local_copy returns a plain Path (no context manager: Python 3.13 removed Path's).
    rows = pq.ParquetFile(storage.local_copy(data_path)).metadata.num_rows
    rows = int(rows * (1.0 - phase.val_fraction) * 0.95)  # the val split is by hash: leave slack
    spe = max(1, rows // phase.num_workers // phase.batch_size)
    return max(1, math.ceil(phase.steps / spe))


# --------------------------------------------------------------------------- the job
def run(cfg: Config, ctx: JobContext) -> dict:
    from hardpos import registry
    from hardpos import report as R
    from hardpos import storage, tracking
    from hardpos.runtime import init_ray

    started = time.time()
    init_ray(cfg.ray)
    p = _Pipeline(cfg, ctx)

    world_dir, reused = p.world()

    if cfg.pretrained:
        _say(f"2/7 pretrain: skipped, the base is pretrained={cfg.pretrained}")
        pre = {"checkpoint": cfg.pretrained, "mlflow_run_id": None, "model_uri": None}
    else:
        pre = p.train("pretrained", "2/7 pretrain a small CLIP from scratch", f"{world_dir}/pretrain.parquet",
                      cfg.pretrain, pretrained=None, w_pos=0.0, w_neg=0.0, negclip_columns=False,
                      output_dir=ctx.path("pretrain"))
    base_ckpt = pre["checkpoint"]

    gen = p.generate(world_dir, regenerate=not reused)
    triplets = gen["outputs"].get("triplets")
    if not gen.get("complete") or not triplets:
        raise RuntimeError(f"generate stage did not finish (complete={gen.get('complete')}); rerun to resume")

    models: dict[str, dict[str, Any]] = {"pretrained": {"checkpoint": base_ckpt, "run_id": pre["mlflow_run_id"],
                                                        "model_uri": pre.get("model_uri")}}
    for k, v in enumerate(cfg.variants, 1):
        data = triplets if v.data == "triplets" else f"{world_dir}/finetune.parquet"
        s = p.train(v.name, f"4/7 finetune {v.name} ({k}/{len(cfg.variants)}; w_pos={v.w_pos:g}, w_neg={v.w_neg:g})",
                    data, cfg.finetune, pretrained=base_ckpt, w_pos=v.w_pos, w_neg=v.w_neg,
                    negclip_columns=v.negclip_columns and v.data == "triplets",
                    output_dir=ctx.path("finetune", _slug(v.name)))
        models[v.name] = {"checkpoint": s["checkpoint"], "run_id": s["mlflow_run_id"], "model_uri": s.get("model_uri")}

    sweep_summary = None
    if cfg.full:
        sweep_summary = _run_sweep(cfg, ctx, p, triplets, base_ckpt)
        for trial in sweep_summary.get("trials", []):
            if trial.get("checkpoint"):
                models[f"w_neg={trial['w_neg']:g}"] = {"checkpoint": trial["checkpoint"], "run_id": trial.get("run_id"),
                                                       "model_uri": None}

    rows: dict[str, dict[str, float]] = {}
    for name, m in models.items():
        ev = p.evaluate(name, m["checkpoint"], world_dir)
        rows[name] = R.table_row(ev["metrics"])
        m["eval_dir"] = ev["output_dir"]

    # 6: the champion = best finetuned model by mean augmented accuracy (REPLACE, SWAP)
    candidates = [n for n in models if n != "pretrained" and models[n].get("run_id")]
    ranked = registry.rank(candidates, "objective", metrics_of=rows.__getitem__)  # the sweep's and register's ranking
    if not ranked:
        raise RuntimeError(f"no finetuned model has a finite objective to register: {candidates}")
    best = ranked[0]
    from hardpos.stages import register as reg

    rcfg = reg.Config(output_dir=ctx.path("register"), seed=cfg.seed, tracking=p.tracking("register"), ray=cfg.ray,
                      name=cfg.register_name, run_id=models[best]["run_id"], experiment=cfg.tracking.experiment,
                      metric="objective", alias="champion", challenger_alias="")
    registered = p.execute("register", rcfg, f"6/7 register {best} as champion")

    # 7: the comparison
    title = (f"HardPos demo (world seed {cfg.world.seed}, train seed {cfg.seed}; {cfg.world.n_pretrain} pretrain / "
             f"{cfg.world.n_finetune} finetune scenes; {cfg.pretrain.steps} pretrain + {cfg.finetune.steps} finetune steps)")
    md = R.markdown_table(rows, title=title)  # ends with whether each of the paper's signs held
    out = Path(ctx.output_dir) if not storage.is_s3(ctx.output_dir) else None
    files: dict[str, str] = {}
    results = {"rows": rows, "champion": best, "world_dir": world_dir, "world_reused": reused, "seed": cfg.seed,
               "world_seed": cfg.world.seed, "models": models, "timings_s": p.timings}
    files["results_md"] = storage.write_text(ctx.path("results.md"), md)
    files["results_json"] = storage.write_json(ctx.path("results.json"), results)
    if cfg.chart:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            local = R.write_chart(rows, str(Path(tmp) / "results.png"), title=title[:90])
            storage.write_bytes(ctx.path("results.png"), Path(local).read_bytes())
            ctx.log_artifact(local)
        files["chart"] = ctx.path("results.png")
    for key in ("results_md", "results_json"):
        if out is not None:
            ctx.log_artifact(files[key])
    # MLflow metric names allow [A-Za-z0-9_-. :/]: "hp+hn" is logged as "hp_hn"
    ctx.log_metrics({f"{_slug(m)}/{k}": v for m, row in rows.items() for k, v in row.items()})
    ctx.log_metrics({"champion/objective": rows[best]["objective"]})
    if ctx.run is not None:
        ctx.run.set_tags({"hardpos.champion": best, "hardpos.champion_run_id": models[best]["run_id"] or ""})

    uri = tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)
    elapsed = time.time() - started
    print("\n" + md)
    print(_instructions(uri, cfg, best, registered, files, elapsed))
    return {"rows": rows, "champion": best, "champion_model_uri": registered.get("model_uri"),
            "registered": registered.get("champion"), "models": models, "world_dir": world_dir, "world_reused": reused,
            "files": files, "timings_s": p.timings, "tracking_uri": uri, "sweep": sweep_summary,
            "pipeline_s": round(elapsed, 1)}


def _run_sweep(cfg: Config, ctx: JobContext, p: _Pipeline, triplets: str, base_ckpt: str) -> dict:
    """The paper's w_neg grid (w_pos = 1) through the sweep stage, from the same base."""
    from hardpos.stages import sweep as sw

    f = cfg.finetune
    overrides = {
        "model.arch": cfg.arch, "model.pretrained": base_ckpt, "data.train_path": triplets,
        "data.val_fraction": f.val_fraction, "optim.lr": f.lr, "optim.warmup_steps": f.warmup_steps,
        "optim.weight_decay": f.weight_decay, "scaling.num_workers": f.num_workers,
        "scaling.cpus_per_worker": f.cpus_per_worker, "batch_size": f.batch_size, "max_steps": f.steps,
        "epochs": _epochs_for(triplets, f), "seed": cfg.seed,
        # Tune needs its objective per epoch (replace/aug_acc, swap/aug_acc); a 300-item slice
        # keeps that cheap. The table itself comes from the evaluate stage on every item.
        "eval_benchmarks": [{"name": n, "kind": "triplets", "path": f"{p_world(ctx, cfg)}/benchmark/{s}.parquet",
                             "limit": 300} for n, s in (("replace", "replace_attribute"), ("swap", "swap"))],
    }
    scfg = sw.Config(output_dir=ctx.path("sweep"), seed=cfg.seed, tracking=p.tracking("sweep"), ray=cfg.ray,
                     train_config=None, train_overrides=overrides,
                     search_space={"loss.w_neg": {"grid_search": list(cfg.sweep_grid)}, "loss.w_pos": 1.0},
                     extra_trials=[], register=False, max_concurrent_trials=1)
    summary = p.execute("sweep", scfg, "4/7 full: the paper's w_neg grid (sweep stage)")
    trials = []
    for row in summary.get("rows", []):  # finished trial runs (hardpos.compare.collect_runs rows)
        out_dir = row.get("param:output_dir")
        if not out_dir:
            continue
        trials.append({"w_neg": float(row.get("param:loss.w_neg", float("nan"))),
                       "checkpoint": f"{out_dir}/model", "run_id": row.get("run_id")})
    return {k: v for k, v in summary.items() if k not in ("rows", "table")} | {"trials": trials}


def p_world(ctx: JobContext, cfg: Config) -> str:
    return cfg.world_dir or ctx.path("world")


def _instructions(uri: str, cfg: Config, best: str, registered: dict, files: dict, elapsed: float) -> str:
    model_uri = registered.get("model_uri", f"models:/{cfg.register_name}@champion")
    lines = [
        f"Champion: {best} -> {model_uri} (version {registered.get('champion', {}).get('version')})",
        f"Table: {files.get('results_md')}   chart: {files.get('chart', '(disabled)')}",
        f"Pipeline time: {elapsed / 60:.1f} min",
        "",
        "Open the MLflow UI on this store (experiment %r, the demo run holds every stage as a child):" % cfg.tracking.experiment,
        f"  .venv/bin/mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000",
        "",
        "Serve the champion (Ray Serve; Ctrl-C stops it):",
        f"  MLFLOW_TRACKING_URI={uri} .venv/bin/serve run serve/config.yaml",
    ]
    if cfg.register_name != "hardpos-clip":
        lines.append(f"  (serve/config.yaml serves models:/hardpos-clip@champion: add args.model={model_uri})")
    img = None
    try:
        from hardpos import storage

        world_dir = cfg.world_dir or storage.join(files["results_md"].rsplit("/", 1)[0], "world")
        import pyarrow.parquet as pq

        t = pq.read_table(f"{world_dir}/benchmark/swap.parquet", columns=["image", "caption", "hard_negative",
                                                                         "hard_positive"]).slice(0, 1).to_pylist()[0]
        img = str((Path(world_dir) / "benchmark" / t["image"]).resolve())
        caps = [t["caption"], t["hard_negative"], t["hard_positive"]]
    except Exception:  # noqa: BLE001 - the instructions are a convenience
        caps = ["a large red circle and a small blue square", "a large blue circle and a small red square",
                "a small blue square and a large red circle"]
    lines += [
        "then score a world image against its caption, hard negative and hard positive:",
        f"  curl -s http://127.0.0.1:8000/v1/score -F image=@{img or 'IMAGE.png'} "
        + " ".join(f"-F captions='{c}'" for c in caps),
        "  # or JSON: curl -s -H 'content-type: application/json' http://127.0.0.1:8000/v1/score "
        f"-d '{{\"image_b64\": \"'$(base64 -w0 {img or 'IMAGE.png'})'\", \"captions\": {json.dumps(caps)}}}'",
    ]
    return "\n".join(lines)
