"""Stages that run other stages: the steps the demo and the base stage share.

A composing stage (``demo``, ``base``) runs each step as a real stage through
:func:`hardpos.runtime.execute`, as a child of its own MLflow run, configured from its own
settings: the world (reused when its ``world.json`` matches), a training phase on Ray Train
(:class:`PhaseConfig`; resumable under a name of its settings) and an evaluation.
:class:`Pipeline` holds those steps and their timings; the demo adds its own (generate, the
sweep, the WiSE-FT curves) in a subclass.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
import uuid
from typing import Any

import pyarrow.parquet as pq

from hardpos import storage
from hardpos.config import ConfigError, ModelConfig, TrackingConfig
from hardpos.world.scene import BENCHMARK_FILES, WorldConfig
from hardpos.world.build import load_world
from hardpos.runtime import JobContext, execute
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
    checkpoint_every: a resumable phase (the base stage's) checkpoints every this many steps
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


def check_base_recipe(pretrain: PhaseConfig, curriculum: PhaseConfig, curriculum_world: WorldConfig) -> None:
    """The rules a base's recipe obeys wherever it is configured (the base stage, the demo's
    ``--from-scratch``): ConfigError naming the phase otherwise."""
    if pretrain.steps < 1 or pretrain.batch_size < 1 or pretrain.num_workers < 1:
        raise ConfigError("pretrain: steps, batch_size and num_workers must be >= 1")
    c = curriculum
    if c.steps < 0 or c.batch_size < 1 or c.num_workers < 1:
        raise ConfigError(f"curriculum: steps must be >= 0 (0: no curriculum), batch_size and num_workers >= 1, "
                          f"got steps={c.steps} batch_size={c.batch_size} num_workers={c.num_workers}")
    if c.steps and curriculum_world.n_pretrain < 1:
        raise ConfigError("curriculum_world.n_pretrain must be >= 1 when curriculum.steps > 0")


def default_world() -> WorldConfig:
    """The demo's world, the one the shipped base was pretrained on."""
    # The calibrated embedded default (README "Calibration"): vague "web" captions (half of the
    # pretraining captions name shapes only) so the base learns relations a little and binding
    # imperfectly; REPLACE-attribute negatives that only a binding-aware model rejects; finetuning
    # negatives without shape changes (a bag-of-words model already rejects those). Binding
    # items' captions leave the donor object out, so the negative keeps every word of the
    # caption and only binding tells them apart (the base's attribute accuracy 92.0 -> 72.5 on
    # seed 0, inside the paper's imperfect-base range; docs/calibration.md).
    # Relation twins in pretraining (each relation caption's mirrored scene next to it, read in
    # order) keep the relations the base learnt in its curriculum while it learns this world;
    # they change the pretrain split only (their own random stream).
    return WorldConfig(seed=0, n_pretrain=20000, n_finetune=5000, n_benchmark=1000, binding_negative_rate=1.0,
                       binding_partial_captions=True, shape_negatives=False, vague_caption_rate=0.5,
                       relation_pair_rate=1.0)


def default_curriculum_world() -> WorldConfig:
    """The small world of the base's pretraining curriculum."""
    # The small world where the sin-cos tower learns relations (docs/calibration.md): 12 kinds of
    # object (6 colours x circle/square, one size), exactly two per scene, relation captions
    # mostly, each with its mirrored twin next to it (read in order: curriculum.shuffle_buffer=0)
    # so a batch can only tell the two apart by the relation. Its own seed: no scene of it is
    # a scene of the demo's world.
    return WorldConfig(seed=1000, n_pretrain=20000, n_finetune=0, n_benchmark=1000, min_objects=2, max_objects=2,
                       shapes=["circle", "square"], sizes=["large"], relation_caption_rate=0.75,
                       relation_pair_rate=1.0)


class Pipeline:
    """Runs stages as children of the calling stage's MLflow run and remembers their timings.

    ``cfg`` is the calling stage's config: the steps read the settings they share from it
    (``seed``, ``ray``, ``tracking``, ``arch``, ``world``, ``world_dir``, ``eval_batch_size``).
    """

    def __init__(self, cfg: Any, ctx: JobContext | None):
        self.cfg, self.ctx = cfg, ctx
        self.timings: dict[str, float] = {}
        # Ray Train continues a run whose name already exists in its storage path, so a
        # second demo with other settings would silently keep the first one's finetunes:
        # every invocation trains under names of its own.
        self.invocation = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"

    def tracking(self, run_name: str) -> TrackingConfig:
        return dataclasses.replace(self.cfg.tracking, run_name=run_name)

    def say(self, msg: str) -> None:
        say(msg, self.ctx.stage if self.ctx is not None else "demo")

    def execute(self, stage: str, cfg: Any, label: str) -> dict:
        t0 = time.time()
        self.say(f"{label} ...")
        summary = execute(stage, cfg, parent_run_id=self.ctx.run_id)
        self.timings[label] = round(time.time() - t0, 1)
        self.say(f"{label} done in {self.timings[label]:.0f}s")
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
            self.say(f"{label}: reusing {world_dir} (its world.json matches the config)")
            self.timings.setdefault(label, 0.0)
            return world_dir, True
        # lazy: a stage module imports this one
        import hardpos.stages.world

        wcfg = hardpos.stages.world.Config(**dataclasses.asdict(world), output_dir=world_dir,
                                           tracking=self.tracking("world"), ray=cfg.ray)
        self.execute("world", wcfg, label)
        if not storage.exists(storage.join(world_dir, "world.json")):
            raise RuntimeError(f"world stage wrote no world.json under {world_dir}")
        return world_dir, False

    # 2 / 4 ------------------------------------------------------------ training
    def train(self, name: str, label: str, data_path: str, phase: PhaseConfig, *, pretrained: str | None,
              loss: LossConfig, output_dir: str, resumable: bool = False,
              positive_kinds: list[str] | None = None) -> dict:
        """One training run of the train stage on Ray Train, with ``loss`` as the stage takes it.

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
                self.say(f"{label}: resuming from {resume}")
        tcfg = TrainConfig(
            output_dir=output_dir, seed=self.cfg.seed, tracking=self.tracking(name), ray=self.cfg.ray,
            model=ModelConfig(arch=self.cfg.arch, pretrained=pretrained),
            data=DataConfig(train_path=data_path, val_fraction=phase.val_fraction,
                            shuffle_buffer=phase.shuffle_buffer, positive_kinds=positive_kinds),
            loss=loss,
            lora=LoraSection(rank=phase.lora_rank),
            optim=OptimConfig(lr=phase.lr, warmup_steps=phase.warmup_steps, weight_decay=phase.weight_decay),
            scaling=ScalingSection(num_workers=phase.num_workers, cpus_per_worker=phase.cpus_per_worker),
            # the loop stops at max_steps; enough epochs that the steps are always reached
            epochs=epochs_for(data_path, phase), batch_size=phase.batch_size, max_steps=phase.steps,
            log_every=max(1, min(20, phase.steps // 10)), run_name=run_name, checkpoint=ckpt, resume_from=resume,
        )
        return self.execute("train", tcfg, label)

    # 5 ------------------------------------------------------------------ evaluate
    def evaluate(self, name: str, checkpoint: str, world_dir: str, label: str | None = None) -> dict:
        # lazy: a stage module imports this one
        from hardpos.stages import evaluate

        ecfg = evaluate.Config(output_dir=self.ctx.path("eval", slug(name)), seed=self.cfg.seed,
                               tracking=self.tracking(f"eval-{name}"), ray=self.cfg.ray,
                               model=ModelConfig(arch=self.cfg.arch, pretrained=checkpoint), model_name=name,
                               world_dir=world_dir, batch_size=self.cfg.eval_batch_size, device="auto")
        return self.execute("evaluate", ecfg, label or f"5/7 evaluate {name}")


# --------------------------------------------------------------------------- helpers
def say(msg: str, stage: str = "demo") -> None:
    """One progress line on stderr: ``[<stage> HH:MM:SS] msg``."""
    print(f"[{stage} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def slug(name: str) -> str:
    """A file- and MLflow-safe form of a model name ("hp+hn" -> "hp_hn")."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def world_matches(world_dir: str, world: WorldConfig) -> bool:
    """True when ``world_dir`` holds a complete world generated with exactly ``world``."""
    try:
        meta = load_world(world_dir)
    except Exception:  # noqa: BLE001 - absent or unreadable: regenerate
        return False
    stored = meta.get("config")
    if not isinstance(stored, dict):
        return False
    # a key the world.json lacks was added later with a default that changes nothing
    # (finetune_synonym_rate=0): such a world is the one the default generates
    defaults = json.loads(json.dumps(dataclasses.asdict(WorldConfig())))
    if {**defaults, **stored} != json.loads(json.dumps(dataclasses.asdict(world))):
        return False
    files = ["pretrain.parquet", "finetune.parquet", *(f"benchmark/{b}.parquet" for b in BENCHMARK_FILES)]
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
