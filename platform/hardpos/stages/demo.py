"""`hardpos demo` / `make demo`: the whole HardPos pipeline on the embedded default.

Every step is the real stage, run through :func:`hardpos.runtime.execute` on one local Ray,
and tracked as a child of this demo's MLflow run in one experiment (``hardpos-demo``):

1. ``world``     the synthetic world (pretrain / finetune / benchmark splits). A world folder
                 whose ``world.json`` config equals ``world`` is reused (second ``make demo``).
2. ``train``     skipped by default: the base is the CLIP that ships with the package
                 (``pretrained=base:hardpos-base``, pretrained once on this world, as real
                 CLIP weights are released once). ``from_scratch`` pretrains it here with the
                 same recipe: a small CLIP from scratch with the plain CLIP loss (w_pos = w_neg
                 = 0, no NegCLIP columns), first on a small curriculum world where relations
                 are learnable, then on this world's pretrain split: the stand-in for a
                 web-pretrained CLIP that has rarely seen non-canonical forms.
3. ``generate``  hard negatives + hard positives for the finetune split (rule engine; the
                 http / vllm engines are ``generate.engine.kind`` away).
4. ``train``     finetune the pretrained checkpoint on Ray Train, one run per ``variants``
                 entry (default: captions-only control, HN-only, HP+HN); ``full=true`` adds
                 the paper's w_neg grid through the ``sweep`` stage and HP+HN with one kind
                 of hard positive only (Table 1(d)). ``finetune.lora_rank`` finetunes with
                 LoRA instead of every weight.
5. ``evaluate``  every model (the pretrained base too) on the world's REPLACE (attribute,
                 relation) and SWAP benchmarks; ``full=true`` adds the WiSE-FT curves
                 (``interpolate`` stage) from the base to HP+HN and to HN-only, with
                 retrieval over pretraining pairs as the retention figure.
6. ``register``  the best finetuned model (mean augmented accuracy on REPLACE and SWAP) as
                 ``models:/<register_name>@champion``.
7. the Table-1-style comparison (``results.md``, ``results.json``) and a chart
   (``results.png``) in ``output_dir``, with the paper's signs judged against the noise
   floors a multi-seed calibration measured (``hardpos/resources/signs_noise.json``): a
   margin within its floor is "inside the noise"; plus the commands to open the MLflow UI
   on this store and to serve the champion.

Scale (scenes, steps, batch sizes, workers) is all config, so CI runs the same code small.
The job is in three parts, in this order: the config (:class:`Config` and its sections), the
steps (:class:`Pipeline`: how each stage the demo calls is configured, as a child of the
demo's MLflow run; the helpers they share) and the order they run in (:func:`run`, and
:func:`pretrain` / :func:`pretrain_base` for the base).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq

import hardpos.stages.world
from hardpos import plots, storage, tracking
from hardpos.config import ConfigError, JobConfig, ModelConfig, TrackingConfig
from hardpos.config.paths import resolve_tracking_uri
from hardpos.data.scene import BENCHMARKS, WorldConfig
from hardpos.data.world import load_world
from hardpos.eval.spec import RetrievalSpec
from hardpos.interpolate import check_alphas
from hardpos.models import bases, registry
from hardpos.paper import signs, table1
from hardpos.runtime import JobContext, execute, init_ray
from hardpos.stages import evaluate, generate, interpolate, register
from hardpos.tracking.redact import redact_text
from hardpos.train.config import (CheckpointSection, DataConfig, LoraSection, LossConfig, OptimConfig, ScalingSection,
                                   TrainConfig)


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
    lora_rank: LoRA rank of the phase's runs (0: full finetuning, the default;
        ``finetune.lora_rank=4`` finetunes every variant and the w_neg grid with TSVLC's
        adapters, see docs/paper-recipe.md).
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
    lora_rank: int = 0

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            raise ConfigError(f"lora_rank must be >= 0 (0: full finetuning), got {self.lora_rank}")
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
    positive_kinds: train with the hard positives of these kinds only (``replace``, ``swap``;
        None: all), the paper's Table 1(d).
    """

    name: str = "hp+hn"
    data: Literal["triplets", "captions"] = "triplets"
    w_pos: float = 1.0
    w_neg: float = 1.0
    negclip_columns: bool = True
    positive_kinds: list[str] | None = None


def _default_variants() -> list[Variant]:
    return [Variant("captions-only", "captions", 0.0, 0.0, False),
            Variant("hn-only", "triplets", 0.0, 1.0, True),
            Variant("hp+hn", "triplets", 1.0, 1.0, True)]


def kind_variants() -> list[Variant]:
    """The paper's Table 1(d): HP+HN with the hard positives of one kind only (``--full``)."""
    return [Variant("hp-replace+hn", "triplets", 1.0, 1.0, True, ["replace"]),
            Variant("hp-swap+hn", "triplets", 1.0, 1.0, True, ["swap"])]


def _default_world() -> WorldConfig:
    # The calibrated embedded default (README "Calibration"): vague "web" captions (half of the
    # pretraining captions name shapes only) so the base learns relations a little and binding
    # imperfectly; REPLACE-attribute negatives that only a binding-aware model rejects; finetuning
    # negatives without shape changes (a bag-of-words model already rejects those). Binding
    # items' captions leave the donor object out, so the negative keeps every word of the
    # caption and only binding tells them apart (the base's attribute accuracy 92.0 -> 72.5 on
    # seed 0, inside the paper's imperfect-base range; docs/calibration.md "Two more levers").
    # Relation twins in pretraining (each relation caption's mirrored scene next to it, read in
    # order) keep the relations the base learnt in its curriculum while it learns this world;
    # they change the pretrain split only (their own random stream).
    return WorldConfig(seed=0, n_pretrain=20000, n_finetune=5000, n_benchmark=1000, binding_negative_rate=1.0,
                       binding_partial_captions=True, shape_negatives=False, vague_caption_rate=0.5,
                       relation_pair_rate=1.0)


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
    arch: the open_clip architecture a base is pretrained as from scratch (hardpos-demo-sincos:
        64 px images in 8 x 8 patches with fixed 2-D sin-cos positions, so relations are
        learnable; hardpos-tiny: 32 px in 4 x 4, for smoke tests). A checkpoint carries its own.
    pretrain: the from-scratch "pretraining" phase (plain CLIP loss on the pretrain split; read
        in order by default, so each relation twin stays beside its original).
    curriculum: a pretraining phase before ``pretrain`` on ``curriculum_world``'s pretrain
        split (steps 0: none); ``pretrain`` then starts from its checkpoint. The defaults of
        both are the shipped base's recipe.
    curriculum_world: the curriculum's world (default: a small one where relations are learnable).
    pretrain_only: make a base and stop: the world(s), the pretraining phase(s) (resumable:
        a stopped run continues from its latest checkpoint, a finished phase is kept), the
        base's evaluation, and the base written as float16 weights + manifest
        (:mod:`hardpos.models.bases`) under ``ship_to``.
    base_name: the base's name (its folder and ``<base_name>.json`` manifest).
    ship_to: where pretrain_only writes the base (None: <output_dir>/base; the package's
        bases folder is ``platform/hardpos/resources/bases``).
    pretrained: the pretrained base every variant is finetuned from, skipping step 2: the
        base that ships with the package (``base:hardpos-base``, pretrained once on this
        world by ``jobs/configs/demo-base.yaml``), or any checkpoint (a local dir, s3://,
        runs:/ or models:/ URI; e.g. an earlier demo's <output_dir>/pretrain/model). None
        pretrains here from scratch. A base with a manifest (:mod:`hardpos.models.bases`) must have
        been pretrained on ``world``, and its weights must match the manifest's hash.
    from_scratch: pretrain the base here (``curriculum`` then ``pretrain``: the shipped base's
        recipe, about 10 minutes on 2 cores) instead of starting from ``pretrained``; needed
        for any other ``world``. ``--from-scratch`` on the command line.
    finetune: the finetuning phase shared by every variant.
    variants: the finetuned models (default: captions-only control, HN-only, HP+HN).
    generate_engine: engine of the generate stage: rules | http | vllm (http/vllm need
        their settings; use the generate stage directly for those).
    full: also run the paper's w_neg grid (w_pos = 1, w_neg in 0..1) through the sweep stage,
        and the WiSE-FT curves (the interpolate stage) from the base to each ``wise_variants``.
    sweep_grid: the w_neg values of the full grid.
    kind_variants: full mode: also finetune HP+HN with the hard positives of one kind only
        (``hp-replace+hn``, ``hp-swap+hn``: the paper's Table 1(d), its sign 5).
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
    arch: str = "hardpos-demo-sincos"
    pretrained: str | None = bases.DEFAULT_BASE
    from_scratch: bool = False
    pretrain: PhaseConfig = dataclasses.field(
        default_factory=lambda: PhaseConfig(steps=600, batch_size=32, lr=5e-5, warmup_steps=20, shuffle_buffer=0))
    finetune: PhaseConfig = dataclasses.field(default_factory=lambda: PhaseConfig(steps=150, batch_size=32, lr=3e-4, warmup_steps=20))
    curriculum: PhaseConfig = dataclasses.field(
        default_factory=lambda: PhaseConfig(steps=500, batch_size=32, lr=5e-4, warmup_steps=20, shuffle_buffer=0))
    curriculum_world: WorldConfig = dataclasses.field(default_factory=_default_curriculum_world)
    pretrain_only: bool = False
    base_name: str = "hardpos-base"
    ship_to: str | None = None
    variants: list[Variant] = dataclasses.field(default_factory=_default_variants)
    generate_engine: Literal["rules", "http", "vllm"] = "rules"
    full: bool = False
    sweep_grid: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    kind_variants: bool = True
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
        if self.pretrain_only or self.from_scratch:
            if self.pretrained not in (None, bases.DEFAULT_BASE):
                flag = "pretrain_only=true" if self.pretrain_only else "from_scratch=true"
                raise ConfigError(f"{flag} pretrains a base from scratch; drop pretrained={self.pretrained}")
            self.pretrained = None
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


# --------------------------------------------------------------------------- the steps
#: retention on the testbed: image-text retrieval over this many pretraining-split pairs
#: (the base's own task: finetuning that forgets it shows here)
RETRIEVAL_NAME = "pretrain1k"


class Pipeline:
    """Runs the stages as children of the demo run and remembers their timings."""

    def __init__(self, cfg: Config, ctx: JobContext | None):
        self.cfg, self.ctx = cfg, ctx
        self.timings: dict[str, float] = {}
        # Ray Train continues a run whose name already exists in its storage path, so a
        # second demo with other settings would silently keep the first one's finetunes:
        # every invocation trains under names of its own.
        self.invocation = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"

    def tracking(self, run_name: str) -> TrackingConfig:
        return dataclasses.replace(self.cfg.tracking, run_name=run_name)

    def execute(self, stage: str, cfg: Any, label: str) -> dict:
        t0 = time.time()
        say(f"{label} ...")
        summary = execute(stage, cfg, parent_run_id=self.ctx.run_id)
        self.timings[label] = round(time.time() - t0, 1)
        say(f"{label} done in {self.timings[label]:.0f}s")
        return summary

    def world_dir(self) -> str:
        return self.cfg.world_dir or self.ctx.path("world")

    # 1 ------------------------------------------------------------------ world
    def world(self, world: WorldConfig | None = None, world_dir: str | None = None,
              label: str = "1/7 world") -> tuple[str, bool]:
        """(the world folder, reused?): an existing world whose world.json matches is kept.

        world / world_dir: another world than the demo's own (the pretraining curriculum's)."""
        cfg = self.cfg
        world = world or cfg.world
        world_dir = world_dir or self.world_dir()
        if world_matches(world_dir, world):
            say(f"{label}: reusing {world_dir} (its world.json matches the config)")
            self.timings.setdefault(label, 0.0)
            return world_dir, True
        wcfg = hardpos.stages.world.Config(**dataclasses.asdict(world), output_dir=world_dir,
                                           tracking=self.tracking("world"), ray=cfg.ray)
        self.execute("world", wcfg, label)
        if not storage.exists(storage.join(world_dir, "world.json")):
            raise RuntimeError(f"world stage wrote no world.json under {world_dir}")
        return world_dir, False

    # 2 / 4 ------------------------------------------------------------ training
    def train(self, name: str, label: str, data_path: str, phase: PhaseConfig, *, pretrained: str | None,
              w_pos: float, w_neg: float, negclip_columns: bool, output_dir: str, resumable: bool = False,
              positive_kinds: list[str] | None = None) -> dict:
        """One training run of the train stage on Ray Train.

        resumable: the run is named after what it trains (:func:`phase_key`: arch, seed, phase,
            data, start), checkpoints every ``phase.checkpoint_every`` steps and continues from
            its latest checkpoint under ``output_dir`` when a stopped run of the same settings
            left one; False: a name of this invocation's own (a fresh run every time).
        """
        run_name, resume, ckpt = f"{slug(name)}-{self.invocation}", None, CheckpointSection()
        if resumable:
            run_name = f"{slug(name)}-{phase_key(self.cfg.arch, self.cfg.seed, phase, data_path, pretrained)}"
            ckpt = CheckpointSection(every_steps=phase.checkpoint_every, num_to_keep=2)
            resume = latest_checkpoint(storage.join(output_dir, "ray_train", run_name))
            if resume:
                say(f"{label}: resuming from {resume}")
        tcfg = TrainConfig(
            output_dir=output_dir, seed=self.cfg.seed, tracking=self.tracking(name), ray=self.cfg.ray,
            model=ModelConfig(arch=self.cfg.arch, pretrained=pretrained),
            data=DataConfig(train_path=data_path, val_fraction=phase.val_fraction,
                            shuffle_buffer=phase.shuffle_buffer, positive_kinds=positive_kinds),
            loss=LossConfig(w_pos=w_pos, w_neg=w_neg, negclip_columns=negclip_columns),
            lora=LoraSection(rank=phase.lora_rank),
            optim=OptimConfig(lr=phase.lr, warmup_steps=phase.warmup_steps, weight_decay=phase.weight_decay),
            scaling=ScalingSection(num_workers=phase.num_workers, cpus_per_worker=phase.cpus_per_worker),
            # the loop stops at max_steps; enough epochs that the steps are always reached
            epochs=epochs_for(data_path, phase), batch_size=phase.batch_size, max_steps=phase.steps,
            log_every=max(1, min(20, phase.steps // 10)), run_name=run_name, checkpoint=ckpt, resume_from=resume,
        )
        return self.execute("train", tcfg, label)

    # 3 ------------------------------------------------------------------ generate
    def generate(self, world_dir: str, regenerate: bool) -> dict:
        cfg = self.cfg
        gcfg = generate.Config(output_dir=self.ctx.path("generate"), seed=cfg.seed, tracking=self.tracking("generate"),
                               ray=cfg.ray, input=f"{world_dir}/finetune.parquet",
                               engine=dataclasses.replace(generate.EngineConfig(), kind=cfg.generate_engine),
                               # a new world invalidates earlier shards; an unchanged one resumes (nothing to do)
                               overwrite=regenerate)
        return self.execute("generate", gcfg, "3/7 generate hard negatives + positives")

    # 4 (full) ---------------------------------------------------------- the w_neg grid
    def sweep(self, triplets: str, base_ckpt: str) -> dict:
        """The paper's w_neg grid (w_pos = 1) through the sweep stage, from the same base."""
        # lazy: the sweep stage imports Ray Tune (seconds); only full=true runs it
        from hardpos.stages import sweep

        cfg, f = self.cfg, self.cfg.finetune
        overrides = {
            "model.arch": cfg.arch, "model.pretrained": base_ckpt, "data.train_path": triplets,
            "data.val_fraction": f.val_fraction, "data.shuffle_buffer": f.shuffle_buffer, "optim.lr": f.lr,
            "optim.warmup_steps": f.warmup_steps, "optim.weight_decay": f.weight_decay, "scaling.num_workers": f.num_workers,
            "scaling.cpus_per_worker": f.cpus_per_worker, "batch_size": f.batch_size, "max_steps": f.steps,
            "epochs": epochs_for(triplets, f), "seed": cfg.seed, "lora.rank": f.lora_rank,
            # Tune needs its objective per epoch (replace/aug_acc, swap/aug_acc); a 300-item slice
            # keeps that cheap. The table itself comes from the evaluate stage on every item.
            "eval_benchmarks": [{"name": n, "kind": "triplets", "path": f"{self.world_dir()}/benchmark/{s}.parquet",
                                 "limit": 300} for n, s in (("replace", "replace_attribute"), ("swap", "swap"))],
        }
        scfg = sweep.Config(output_dir=self.ctx.path("sweep"), seed=cfg.seed, tracking=self.tracking("sweep"), ray=cfg.ray,
                            train_config=None, train_overrides=overrides,
                            search_space={"loss.w_neg": {"grid_search": list(cfg.sweep_grid)}, "loss.w_pos": 1.0},
                            extra_trials=[], register=False, max_concurrent_trials=1)
        summary = self.execute("sweep", scfg, "4/7 full: the paper's w_neg grid (sweep stage)")
        trials = []
        for row in summary.get("rows", []):  # finished trial runs (hardpos.stages.compare.collect_runs rows)
            out_dir = row.get("param:output_dir")
            if not out_dir:
                continue
            trials.append({"w_neg": float(row.get("param:loss.w_neg", float("nan"))),
                           "checkpoint": f"{out_dir}/model", "run_id": row.get("run_id")})
        return {k: v for k, v in summary.items() if k not in ("rows", "table")} | {"trials": trials}

    # 5 ------------------------------------------------------------------ evaluate
    def evaluate(self, name: str, checkpoint: str, world_dir: str) -> dict:
        ecfg = evaluate.Config(output_dir=self.ctx.path("eval", slug(name)), seed=self.cfg.seed,
                               tracking=self.tracking(f"eval-{name}"), ray=self.cfg.ray,
                               model=ModelConfig(arch=self.cfg.arch, pretrained=checkpoint), model_name=name,
                               world_dir=world_dir, batch_size=self.cfg.eval_batch_size, device="auto")
        return self.execute("evaluate", ecfg, f"5/7 evaluate {name}")

    # 5 (full) ---------------------------------------------------------- WiSE-FT curves
    def wise_curve(self, name: str, base_ckpt: str, checkpoint: str, world_dir: str) -> dict:
        """The interpolate stage from the base (alpha 0) to ``name`` (alpha 1) on the world's
        benchmarks, with retrieval over pretraining pairs as the retention figure."""
        cfg = self.cfg
        wcfg = interpolate.Config(output_dir=self.ctx.path("wise", slug(name)), seed=cfg.seed,
                                  tracking=self.tracking(f"wise-{name}"), ray=cfg.ray,
                                  base=ModelConfig(arch=cfg.arch, pretrained=base_ckpt),
                                  finetuned=ModelConfig(arch=cfg.arch, pretrained=checkpoint),
                                  base_name="pretrained", finetuned_name=name, alphas=list(cfg.wise_alphas), world_dir=world_dir,
                                  retention=evaluate.RetentionConfig(retrieval=[self.retrieval_set(world_dir)]),
                                  batch_size=cfg.eval_batch_size, device="auto")
        return self.execute("interpolate", wcfg, f"5/7 full: WiSE-FT curve pretrained -> {name}")

    def retrieval_set(self, world_dir: str) -> RetrievalSpec:
        """The first ``wise_retrieval_pairs`` pretraining (image, caption) pairs as a jsonl
        retrieval set under <output_dir>/wise (written once per demo run)."""
        rows = pq.read_table(storage.local_copy(f"{world_dir}/pretrain.parquet"), columns=["image", "caption"])
        rows = rows.slice(0, self.cfg.wise_retrieval_pairs).to_pylist()
        uri = storage.write_text(self.ctx.path("wise", "retrieval_pretrain.jsonl"),
                                 "".join(json.dumps(r) + "\n" for r in rows))
        return RetrievalSpec(name=RETRIEVAL_NAME, captions=uri, image_root=world_dir)


# --------------------------------------------------------------------------- helpers
def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def slug(name: str) -> str:
    """A file- and MLflow-safe form of a model name ("hp+hn" -> "hp_hn")."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def world_matches(world_dir: str, world: WorldConfig) -> bool:
    """True when ``world_dir`` holds a complete world generated with exactly ``world``."""
    try:
        meta = load_world(world_dir)
    except Exception:  # noqa: BLE001 - absent or unreadable: regenerate
        return False
    if meta.get("config") != json.loads(json.dumps(dataclasses.asdict(world))):
        return False
    files = ["pretrain.parquet", "finetune.parquet", *(f"benchmark/{b}.parquet" for b in BENCHMARKS)]
    return all(storage.exists(storage.join(world_dir, f)) for f in files)


def phase_key(arch: str, seed: int, phase: PhaseConfig, data_path: str, pretrained: str | None) -> str:
    """A short hash of everything a training phase's result depends on (for resumable names):
    the same settings continue a stopped run, other settings start a run of their own."""
    raw = json.dumps({"arch": arch, "seed": seed, "phase": dataclasses.asdict(phase), "data": data_path,
                      "pretrained": pretrained}, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:10]


def latest_checkpoint(run_dir: str) -> str | None:
    """The newest training checkpoint under a Ray Train run folder, or None (no run yet, or
    stopped before its first checkpoint)."""
    if not storage.exists(run_dir):
        return None
    # lazy: the demo's modules load with its Config (the CLI's checks); torch with the job
    from hardpos.train.checkpoint import find_resume_checkpoint

    try:
        return find_resume_checkpoint(run_dir)
    except FileNotFoundError:
        return None


def epochs_for(data_path: str, phase: PhaseConfig) -> int:
    """Epochs so that ``phase.steps`` global steps fit (the loop stops at max_steps)."""
    # local_copy returns a plain Path (no context manager: Python 3.13 removed Path's).
    rows = pq.ParquetFile(storage.local_copy(data_path)).metadata.num_rows
    rows = int(rows * (1.0 - phase.val_fraction) * 0.95)  # the val split is by hash: leave slack
    spe = max(1, rows // phase.num_workers // phase.batch_size)
    return max(1, math.ceil(phase.steps / spe))


def instructions(uri: str, cfg: Config, best: str, registered: dict, files: dict, elapsed: float,
                 experiment_id: str | None = None) -> str:
    """What the demo prints at the end: the champion, where the table is, how to open the
    MLflow UI (on the experiment's runs, ``experiment_id``) and serve the champion, and a
    ready curl for one world image."""
    model_uri = registered.get("model_uri", f"models:/{cfg.register_name}@champion")
    lines = [
        f"Champion: {best} -> {model_uri} (version {registered.get('champion', {}).get('version')})",
        f"Table: {files.get('results_md')}   chart: {files.get('chart', '(disabled)')}",
        f"Pipeline time: {elapsed / 60:.1f} min",
        "",
        "Open the MLflow UI on this store (experiment %r, the demo run holds every stage as a child):" % cfg.tracking.experiment,
        f"  .venv/bin/mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000",
        f"  then {tracking.ui_runs_url('http://127.0.0.1:5000', experiment_id)}",
        "  (MLflow's model-training view: each run's datasets, source and logged model)",
        "",
        "Serve the champion (Ray Serve; Ctrl-C stops it; `serve status` / `serve shutdown -y` need the same RAY_AUTH_MODE):",
        f"  RAY_AUTH_MODE=token MLFLOW_TRACKING_URI={uri} .venv/bin/serve run serve/config.yaml",
    ]
    if cfg.register_name != "hardpos-clip":
        lines.append(f"  (serve/config.yaml serves models:/hardpos-clip@champion: add args.model={model_uri})")
    img = None
    try:
        world_dir = cfg.world_dir or storage.join(files["results_md"].rsplit("/", 1)[0], "world")
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


def check(cfg: Config) -> None:
    """Before any work: the tracking server (this stage's inputs are read, and named in its errors, by ``run``)."""
    tracking.check_tracking(cfg.tracking)


# --------------------------------------------------------------------------- the job
def run(cfg: Config, ctx: JobContext) -> dict:
    started = time.time()
    base_dir = bases.local_base_dir(cfg.pretrained)
    if base_dir is not None and bases.manifest_path(base_dir).is_file():  # a base with a manifest: its weights are the manifest's
        bases.verify_base(base_dir)
    init_ray(cfg.ray)
    p = Pipeline(cfg, ctx)

    world_dir, reused = p.world()
    if cfg.pretrain_only:
        return pretrain_base(cfg, ctx, p, world_dir, started)

    if cfg.pretrained:
        say(f"2/7 pretrain: skipped, the base is pretrained={cfg.pretrained} (--from-scratch pretrains one here)")
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
    variants = list(cfg.variants)
    if cfg.full and cfg.kind_variants:
        variants += [v for v in kind_variants() if v.name not in {x.name for x in variants}]
    for k, v in enumerate(variants, 1):
        data = triplets if v.data == "triplets" else f"{world_dir}/finetune.parquet"
        kinds = f"; positives {'+'.join(v.positive_kinds)} only" if v.positive_kinds else ""
        s = p.train(v.name, f"4/7 finetune {v.name} ({k}/{len(variants)}; w_pos={v.w_pos:g}, w_neg={v.w_neg:g}{kinds})",
                    data, cfg.finetune, pretrained=base_ckpt, w_pos=v.w_pos, w_neg=v.w_neg,
                    negclip_columns=v.negclip_columns and v.data == "triplets",
                    output_dir=ctx.path("finetune", slug(v.name)),
                    positive_kinds=v.positive_kinds if v.data == "triplets" else None)
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
        rows[name] = table1.table_row(ev["metrics"])
        m["eval_dir"] = ev["output_dir"]
    wise = {name: p.wise_curve(name, base_ckpt, models[name]["checkpoint"], world_dir)
            for name in (cfg.wise_variants if cfg.full else [])}

    # 6: the champion = best finetuned model by mean augmented accuracy (REPLACE, SWAP)
    candidates = [n for n in models if n != "pretrained" and models[n].get("run_id")]
    ranked = registry.rank(candidates, "objective", metrics_of=rows.__getitem__)  # the sweep's and register's ranking
    if not ranked:
        raise RuntimeError(f"no finetuned model has a finite objective to register: {candidates}")
    best = ranked[0]
    rcfg = register.Config(output_dir=ctx.path("register"), seed=cfg.seed, tracking=p.tracking("register"), ray=cfg.ray,
                           name=cfg.register_name, run_id=models[best]["run_id"], experiment=cfg.tracking.experiment,
                           metric="objective", alias="champion", challenger_alias="")
    registered = p.execute("register", rcfg, f"6/7 register {best} as champion")

    # 7: the comparison
    base = (f"base {cfg.pretrained}" if cfg.pretrained
            else f"{cfg.curriculum.steps} curriculum + " * bool(cfg.curriculum.steps) + f"{cfg.pretrain.steps} pretrain")
    how = f"LoRA rank {cfg.finetune.lora_rank}" if cfg.finetune.lora_rank else "full finetuning"
    title = (f"HardPos demo (world seed {cfg.world.seed}, train seed {cfg.seed}; {cfg.world.n_pretrain} pretrain / "
             f"{cfg.world.n_finetune} finetune scenes; {base} + {cfg.finetune.steps} finetune steps, {how})")
    # ends with the paper's signs, each margin judged by the noise floor the calibration measured
    # (no floors file: every margin reads "no noise floor", never "held")
    md = table1.markdown_table(rows, title=title, floors=signs.load_floors() or {"checks": {}})
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
            local = plots.write_chart(rows, str(Path(tmp) / "results.png"), title=title)  # the chart wraps it
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

    uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    elapsed = time.time() - started
    print("\n" + md)
    experiment_id = None
    if ctx.run is not None and not ctx.run.local:
        experiment_id = tracking.experiment_id_of(uri, ctx.run.run_id)
    print(redact_text(instructions(uri, cfg, best, registered, files, elapsed, experiment_id)))
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
    as a shippable base (float16 weights + manifest, :func:`hardpos.models.bases.write_base`)."""
    pre = pretrain(cfg, ctx, p, world_dir, resumable=True)
    ev_base = p.evaluate("pretrained", pre["checkpoint"], world_dir)
    row = table1.table_row(ev_base["metrics"])
    curriculum_row = None
    if cfg.curriculum.steps:
        ev_c = p.evaluate("pretrained-on-curriculum-world", pre["checkpoint"], ctx.path("curriculum_world"))
        curriculum_row = table1.table_row(ev_c["metrics"])
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
