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
                 relation) and SWAP benchmarks; ``full=true`` adds the WiSE-FT curves
                 (``interpolate`` stage) from the base to HP+HN and to HN-only, with
                 retrieval over pretraining pairs as the retention figure.
6. ``register``  the best finetuned model (mean augmented accuracy on REPLACE and SWAP) as
                 ``models:/<register_name>@champion``.
7. the Table-1-style comparison (``results.md``, ``results.json``) and a chart
   (``results.png``) in ``output_dir``, plus the commands to open the MLflow UI on this
   store and to serve the champion.

Scale (scenes, steps, batch sizes, workers) is all config, so CI runs the same code small.
The steps themselves (how each stage is configured) are :mod:`hardpos.demo_steps`.
"""
from __future__ import annotations

import dataclasses
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from hardpos import bases, registry, storage, tracking
from hardpos import report as R
from hardpos.config import ConfigError, JobConfig, TrackingConfig
from hardpos.data.world import WorldConfig
from hardpos.demo_steps import Pipeline, epochs_for, instructions, phase_key, say, slug, world_matches
from hardpos.interpolate import check_alphas
from hardpos.runtime import JobContext, init_ray
from hardpos.stages import register as reg
from hardpos.train.config import DataConfig

# the demo's steps under the names the tests and earlier callers use
_Pipeline, _say, _slug, _world_matches, _epochs_for = Pipeline, say, slug, world_matches, epochs_for


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
    shuffle_buffer: rows in each worker's local shuffle buffer (0: read the split in its
        own order, which keeps rows written side by side in one batch but at batch edges,
        e.g. a world's relation twins, ``world.relation_pair_rate``).
    checkpoint_every: a resumable phase (``pretrain_only``) checkpoints every this many steps
        (0: at epoch ends only), so a stopped run loses at most that many.
    """

    steps: int = 300
    batch_size: int = 64
    lr: float = 1e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    num_workers: int = 2
    cpus_per_worker: float = 0.5
    val_fraction: float = 0.0
    shuffle_buffer: int = 512
    checkpoint_every: int = 0

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0 (0: at epoch ends), got {self.checkpoint_every}")
        # The train stage's own data rule, checked at config load rather than at the phase's
        # first run (for the finetunes, minutes of pretraining later).
        DataConfig(shuffle_buffer=self.shuffle_buffer)


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
    # negatives without shape changes (a bag-of-words model already rejects those). Binding
    # items' captions leave the donor object out, so the negative keeps every word of the
    # caption and only binding tells them apart (the base's attribute accuracy 92.0 -> 72.5 on
    # seed 0, inside the paper's imperfect-base range; docs/calibration.md "Two more levers").
    return WorldConfig(seed=0, n_pretrain=20000, n_finetune=5000, n_benchmark=1000, binding_negative_rate=1.0,
                       binding_partial_captions=True, shape_negatives=False, vague_caption_rate=0.5)


def _default_curriculum_world() -> WorldConfig:
    # The small world where the sin-cos tower learns relations (docs/calibration.md): 12 kinds of
    # object (6 colours x circle/square, one size), exactly two per scene, relation captions
    # mostly, each with its mirrored twin next to it (read in order: curriculum.shuffle_buffer=0)
    # so a batch can only tell the two apart by the relation. Its own seed: no scene of it is
    # a scene of the demo's world.
    return WorldConfig(seed=1000, n_pretrain=20000, n_finetune=0, n_benchmark=1000, min_objects=2, max_objects=2,
                       shapes=["circle", "square"], sizes=["large"], relation_caption_rate=0.75,
                       relation_pair_rate=1.0)


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
    curriculum: a pretraining phase before ``pretrain`` on ``curriculum_world``'s pretrain
        split (steps 0: none); ``pretrain`` then starts from its checkpoint.
    curriculum_world: the curriculum's world (default: a small one where relations are learnable).
    pretrain_only: make a base and stop: the world(s), the pretraining phase(s) (resumable:
        a stopped run continues from its latest checkpoint, a finished phase is kept), the
        base's evaluation, and the base written as float16 weights + manifest
        (:mod:`hardpos.bases`) under ``ship_to``.
    base_name: the base's name (its folder and ``<base_name>.json`` manifest).
    ship_to: where pretrain_only writes the base (None: <output_dir>/base; the package's
        bases folder is ``platform/hardpos/resources/bases``).
    pretrained: use this checkpoint (a local dir, s3://, runs:/ or models:/ URI) as the
        pretrained base and skip step 2 (e.g. an earlier demo's <output_dir>/pretrain/model,
        to compare finetuning settings on the same base); None pretrains from scratch. A base
        with a manifest (:mod:`hardpos.bases`) must have been pretrained on ``world``.
    finetune: the finetuning phase shared by every variant.
    variants: the finetuned models (default: captions-only control, HN-only, HP+HN).
    generate_engine: engine of the generate stage: rules | http | vllm (http/vllm need
        their settings; use the generate stage directly for those).
    full: also run the paper's w_neg grid (w_pos = 1, w_neg in 0..1) through the sweep stage,
        and the WiSE-FT curves (the interpolate stage) from the base to each ``wise_variants``.
    sweep_grid: the w_neg values of the full grid.
    wise_variants: full mode: the variants whose curve from the base is drawn (names of
        ``variants``; default HP+HN and HN-only).
    wise_alphas: full mode: the curves' mixing weights (0 = base, 1 = the variant).
    wise_retrieval_pairs: full mode: the curves' retention figure, image-text retrieval over
        this many pretraining-split (image, caption) pairs.
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
    curriculum: PhaseConfig = dataclasses.field(default_factory=lambda: PhaseConfig(steps=0, batch_size=32, lr=5e-4, warmup_steps=20, shuffle_buffer=0))
    curriculum_world: WorldConfig = dataclasses.field(default_factory=_default_curriculum_world)
    pretrain_only: bool = False
    base_name: str = "hardpos-base"
    ship_to: str | None = None
    variants: list[Variant] = dataclasses.field(default_factory=_default_variants)
    generate_engine: Literal["rules", "http", "vllm"] = "rules"
    full: bool = False
    sweep_grid: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    wise_variants: list[str] = dataclasses.field(default_factory=lambda: ["hp+hn", "hn-only"])
    wise_alphas: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    wise_retrieval_pairs: int = 1000
    register_name: str = "hardpos-clip"
    eval_batch_size: int = 256
    chart: bool = True

    def __post_init__(self) -> None:
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
        c = self.curriculum
        if c.steps < 0 or c.batch_size < 1 or c.num_workers < 1:
            raise ConfigError(f"curriculum: steps must be >= 0 (0: no curriculum), batch_size and num_workers >= 1, "
                              f"got steps={c.steps} batch_size={c.batch_size} num_workers={c.num_workers}")
        if c.steps and self.curriculum_world.n_pretrain < 1:
            raise ConfigError("curriculum_world.n_pretrain must be >= 1 when curriculum.steps > 0")
        if self.pretrain_only and self.pretrained:
            raise ConfigError(f"pretrain_only=true makes a base from scratch; drop pretrained={self.pretrained}")
        if not self.base_name or "/" in self.base_name or self.base_name.startswith("."):
            raise ConfigError(f"base_name={self.base_name!r}: must be a plain file name (no '/', not hidden)")
        # a shipped base is tied to the world it was pretrained on: fail now, not after the world is built
        manifest = bases.manifest_for(self.pretrained)
        if manifest is not None:
            bases.check_world(manifest, self.world, source=f"pretrained={self.pretrained}")
        try:
            self.wise_alphas = check_alphas(self.wise_alphas)
        except ValueError as exc:
            raise ConfigError(f"wise_alphas: {exc}") from exc
        unknown = [n for n in self.wise_variants if n not in names]
        if self.full and unknown:
            raise ConfigError(f"wise_variants: {unknown} are not variants ({names})")
        if self.wise_retrieval_pairs < 2:
            raise ConfigError(f"wise_retrieval_pairs must be >= 2, got {self.wise_retrieval_pairs}")


# --------------------------------------------------------------------------- the job
def run(cfg: Config, ctx: JobContext) -> dict:
    started = time.time()
    init_ray(cfg.ray)
    p = Pipeline(cfg, ctx)

    world_dir, reused = p.world()
    if cfg.pretrain_only:
        return pretrain_base(cfg, ctx, p, world_dir, started)

    if cfg.pretrained:
        say(f"2/7 pretrain: skipped, the base is pretrained={cfg.pretrained}")
        pre = {"checkpoint": cfg.pretrained, "mlflow_run_id": None, "model_uri": None}
    else:
        pre = pretrain(cfg, ctx, p, world_dir, resumable=False)
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
                    output_dir=ctx.path("finetune", slug(v.name)))
        models[v.name] = {"checkpoint": s["checkpoint"], "run_id": s["mlflow_run_id"], "model_uri": s.get("model_uri")}

    sweep_summary = None
    if cfg.full:
        sweep_summary = p.sweep(triplets, base_ckpt)
        for trial in sweep_summary.get("trials", []):
            if trial.get("checkpoint"):
                models[f"w_neg={trial['w_neg']:g}"] = {"checkpoint": trial["checkpoint"], "run_id": trial.get("run_id"),
                                                       "model_uri": None}

    rows: dict[str, dict[str, float]] = {}
    for name, m in models.items():
        ev = p.evaluate(name, m["checkpoint"], world_dir)
        rows[name] = R.table_row(ev["metrics"])
        m["eval_dir"] = ev["output_dir"]
    wise = {name: p.wise_curve(name, base_ckpt, models[name]["checkpoint"], world_dir)
            for name in (cfg.wise_variants if cfg.full else [])}

    # 6: the champion = best finetuned model by mean augmented accuracy (REPLACE, SWAP)
    candidates = [n for n in models if n != "pretrained" and models[n].get("run_id")]
    ranked = registry.rank(candidates, "objective", metrics_of=rows.__getitem__)  # the sweep's and register's ranking
    if not ranked:
        raise RuntimeError(f"no finetuned model has a finite objective to register: {candidates}")
    best = ranked[0]
    rcfg = reg.Config(output_dir=ctx.path("register"), seed=cfg.seed, tracking=p.tracking("register"), ray=cfg.ray,
                      name=cfg.register_name, run_id=models[best]["run_id"], experiment=cfg.tracking.experiment,
                      metric="objective", alias="champion", challenger_alias="")
    registered = p.execute("register", rcfg, f"6/7 register {best} as champion")

    # 7: the comparison
    title = (f"HardPos demo (world seed {cfg.world.seed}, train seed {cfg.seed}; {cfg.world.n_pretrain} pretrain / "
             f"{cfg.world.n_finetune} finetune scenes; {cfg.pretrain.steps} pretrain + {cfg.finetune.steps} finetune steps)")
    md = R.markdown_table(rows, title=title)  # ends with whether each of the paper's signs held
    if wise:
        md += "\n## WiSE-FT: mixing the base and a finetuned model (interpolate stage)\n\n" + "\n".join(
            storage.read_text(w["files"]["curve_md"]) for w in wise.values())
    files: dict[str, str] = {}
    results = {"rows": rows, "champion": best, "world_dir": world_dir, "world_reused": reused, "seed": cfg.seed,
               "world_seed": cfg.world.seed, "models": models, "timings_s": p.timings,
               "wise": {n: {"run_id": w["mlflow_run_id"], "output_dir": w["output_dir"], "points": w["points"]}
                        for n, w in wise.items()}}
    files["results_md"] = storage.write_text(ctx.path("results.md"), md)
    files["results_json"] = storage.write_json(ctx.path("results.json"), results)
    if cfg.chart:
        with tempfile.TemporaryDirectory() as tmp:
            local = R.write_chart(rows, str(Path(tmp) / "results.png"), title=title)  # the chart wraps it
            storage.write_bytes(ctx.path("results.png"), Path(local).read_bytes())
            ctx.log_artifact(local)
        files["chart"] = ctx.path("results.png")
    if not storage.is_s3(ctx.output_dir):  # artifacts are logged from local files
        for key in ("results_md", "results_json"):
            ctx.log_artifact(files[key])
    # MLflow metric names allow [A-Za-z0-9_-. :/]: "hp+hn" is logged as "hp_hn"
    ctx.log_metrics({f"{slug(m)}/{k}": v for m, row in rows.items() for k, v in row.items()})
    ctx.log_metrics({"champion/objective": rows[best]["objective"]})
    if ctx.run is not None:
        ctx.run.set_tags({"hardpos.champion": best, "hardpos.champion_run_id": models[best]["run_id"] or ""})

    uri = tracking.resolve_tracking_uri(cfg.tracking.tracking_uri)
    elapsed = time.time() - started
    print("\n" + md)
    print(instructions(uri, cfg, best, registered, files, elapsed))
    return {"rows": rows, "champion": best, "champion_model_uri": registered.get("model_uri"),
            "registered": registered.get("champion"), "models": models, "world_dir": world_dir, "world_reused": reused,
            "files": files, "timings_s": p.timings, "tracking_uri": uri, "sweep": sweep_summary,
            "wise": results["wise"], "pipeline_s": round(elapsed, 1)}


# --------------------------------------------------------------------------- the base
def pretrain(cfg: Config, ctx: JobContext, p: Pipeline, world_dir: str, *, resumable: bool) -> dict:
    """The pretraining phase(s): the curriculum on its small world (when ``curriculum.steps``),
    then ``pretrain`` on the demo's world from the curriculum's checkpoint. Returns the last
    phase's train summary.

    resumable: every phase runs under a name of its settings and continues from its latest
    checkpoint; a phase whose ``phase.json`` records the same settings as finished is not
    trained again (a stopped ``pretrain_only`` run picks up where it stopped).
    """
    start: str | None = None
    phases: list[tuple[str, str, str, PhaseConfig]] = []
    if cfg.curriculum.steps:
        cw_dir, _ = p.world(cfg.curriculum_world, ctx.path("curriculum_world"), "1/7 curriculum world")
        phases.append(("pretrained-curriculum", "2/7 pretrain (curriculum: the small world)",
                       f"{cw_dir}/pretrain.parquet", cfg.curriculum))
    phases.append(("pretrained", "2/7 pretrain a small CLIP" + (" (the demo's world)" if phases else " from scratch"),
                   f"{world_dir}/pretrain.parquet", cfg.pretrain))
    summary: dict = {}
    for name, label, data, phase in phases:
        out = ctx.path("pretrain" if name == "pretrained" else "pretrain-curriculum")
        key = phase_key(cfg.arch, cfg.seed, phase, data, start)
        marker = storage.join(out, "phase.json")
        done = storage.read_json(marker) if resumable and storage.exists(marker) else None
        if done and done.get("key") == key and storage.exists(storage.join(done["summary"]["checkpoint"], "open_clip_config.json")):
            say(f"{label}: finished earlier ({marker}), kept")
            summary = done["summary"]
        else:
            summary = p.train(name, label, data, phase, pretrained=start, w_pos=0.0, w_neg=0.0,
                              negclip_columns=False, output_dir=out, resumable=resumable)
            if resumable:
                storage.write_json(marker, {"key": key, "summary": summary})
        start = summary["checkpoint"]
    return summary


def pretrain_base(cfg: Config, ctx: JobContext, p: Pipeline, world_dir: str, started: float) -> dict:
    """``pretrain_only``: pretrain (resumably), evaluate the base on the demo's world, write it
    as a shippable base (float16 weights + manifest, :func:`hardpos.bases.write_base`)."""
    pre = pretrain(cfg, ctx, p, world_dir, resumable=True)
    ev_base = p.evaluate("pretrained", pre["checkpoint"], world_dir)
    row = R.table_row(ev_base["metrics"])
    curriculum_row = None
    if cfg.curriculum.steps:
        ev_c = p.evaluate("pretrained-on-curriculum-world", pre["checkpoint"], ctx.path("curriculum_world"))
        curriculum_row = R.table_row(ev_c["metrics"])
    manifest = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "git": bases.git_commit(),
        "arch": cfg.arch,
        "seed": cfg.seed,
        "world": bases.world_dict(cfg.world),
        "curriculum_world": bases.world_dict(cfg.curriculum_world) if cfg.curriculum.steps else None,
        "phases": {"curriculum": dataclasses.asdict(cfg.curriculum) if cfg.curriculum.steps else None,
                   "pretrain": dataclasses.asdict(cfg.pretrain)},
        "final_loss": pre.get("final_metrics", {}).get("loss/total"),
        "benchmark": {"world": row, "curriculum_world": curriculum_row},
        "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s_this_invocation": round(time.time() - started, 1),
    }
    dest = cfg.ship_to or ctx.path("base")
    written = bases.write_base(pre["checkpoint"], dest, cfg.base_name, manifest)
    ctx.log_metrics({f"pretrained/{k}": v for k, v in row.items()})
    say(f"base {cfg.base_name}: {dest}/{cfg.base_name} ({written['weights']['bytes'] / 1e6:.1f} MB float16); "
        f"REPLACE attribute orig {100 * row['world_replace_attribute/orig_acc']:.1f}, relation orig "
        f"{100 * row['world_replace_relation/orig_acc']:.1f}, SWAP orig {100 * row['swap/orig_acc']:.1f}")
    return {"base": f"{dest}/{cfg.base_name}", "manifest": written, "rows": {"pretrained": row},
            "world_dir": world_dir, "timings_s": p.timings, "pipeline_s": round(time.time() - started, 1)}
