"""`hardpos base`: pretrain a small CLIP from scratch on a synthetic world and write it as a base.

The testbed's stand-in for a web-pretrained CLIP (``base:hardpos-base`` ships with the package;
this stage is how it was made, and how to make another for another world). Every step is a real
stage run as a child of this stage's MLflow run (:mod:`hardpos.stages.compose`):

1. ``world``     the synthetic world (reused when its ``world.json`` matches), and the
                 curriculum's small world when ``curriculum.steps > 0``;
2. ``train``     the plain CLIP loss (w_pos = w_neg = 0, no NegCLIP columns) from random
                 weights: first ``curriculum`` on the small world, where the sin-cos tower
                 learns relations, then ``pretrain`` on the world's pretrain split from the
                 curriculum's checkpoint. Resumable: a stopped run continues from its latest
                 checkpoint (every ``checkpoint_every`` steps) and a finished phase is kept;
3. ``evaluate``  the base on the world's benchmarks (and the curriculum world's);
4. the base written as float16 weights plus a manifest (:mod:`hardpos.models.bases`: the
   command, the config, the git commit, the world, the benchmark numbers) under ``ship_to``.

The demo's ``--from-scratch`` runs this stage with ``ship=false`` and finetunes its
full-precision checkpoint.
"""
from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from hardpos import storage, tracking
from hardpos.stages.compose import (PhaseConfig, Pipeline, check_base_recipe, default_curriculum_world, default_world,
                             phase_key)
from hardpos.config import ConfigError, JobConfig, TrackingConfig
from hardpos.world.scene import WorldConfig
from hardpos.models import bases
from hardpos.paper import table1
from hardpos.runtime import JobContext, init_ray
from hardpos.train.config import LossConfig

#: pretraining's loss: plain CLIP contrastive (no hard negatives, no hard positives, no NegCLIP columns)
PLAIN_CLIP_LOSS = LossConfig(w_pos=0.0, w_neg=0.0, negclip_columns=False)


@dataclasses.dataclass
class Config(JobConfig):
    """Pretrain a base CLIP on a synthetic world.

    output_dir: everything goes under it: world/ (unless world_dir), curriculum_world/,
        pretrain-curriculum/, pretrain/, eval/, base/ (unless ship_to).
    seed: seed of the training runs (model init, shuffling); the worlds have their own seeds.
    world: the synthetic world the base is pretrained on, and recorded in its manifest: a demo
        that finetunes the base must use the same world (``hardpos world --help`` for its keys).
    world_dir: where the world lives (None: <output_dir>/world); reused when its world.json
        config equals ``world``.
    arch: the open_clip architecture (hardpos-demo-sincos: 64 px images in 8 x 8 patches with
        fixed 2-D sin-cos positions, so relations are learnable; hardpos-tiny: 32 px in 4 x 4,
        for smoke tests).
    curriculum: the phase on ``curriculum_world``'s pretrain split before ``pretrain``
        (steps 0: none).
    curriculum_world: the curriculum's world (default: a small one where relations are learnable).
    pretrain: the phase on ``world``'s pretrain split (read in order by default, so each
        relation twin stays beside its original).
    name: the base's name (its folder and ``<name>.json`` manifest).
    ship_to: where the base is written (None: <output_dir>/base; the package's own bases
        folder is ``platform/hardpos/resources/bases``).
    ship: evaluate the base and write it (float16 weights + manifest); false: pretrain only
        (the demo's ``--from-scratch`` finetunes the full-precision checkpoint).
    resume: continue a stopped phase from its latest checkpoint and keep a finished one
        (false: every invocation trains afresh under names of its own).
    eval_batch_size: batch size of the evaluate stage.
    """

    output_dir: str = "outputs/base"
    tracking: TrackingConfig = dataclasses.field(default_factory=lambda: TrackingConfig(experiment="hardpos-base"))
    world: WorldConfig = dataclasses.field(default_factory=default_world)
    world_dir: str | None = None
    arch: str = "hardpos-demo-sincos"
    curriculum: PhaseConfig = dataclasses.field(default_factory=lambda: PhaseConfig(
        steps=500, batch_size=32, lr=5e-4, warmup_steps=20, shuffle_buffer=0, checkpoint_every=100))
    curriculum_world: WorldConfig = dataclasses.field(default_factory=default_curriculum_world)
    pretrain: PhaseConfig = dataclasses.field(default_factory=lambda: PhaseConfig(
        steps=600, batch_size=32, lr=5e-5, warmup_steps=20, shuffle_buffer=0, checkpoint_every=100))
    name: str = "hardpos-base"
    ship_to: str | None = None
    ship: bool = True
    resume: bool = True
    eval_batch_size: int = 256

    def __post_init__(self) -> None:
        check_base_recipe(self.pretrain, self.curriculum, self.curriculum_world)
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"name={self.name!r}: must be a plain file name (no '/', not hidden)")


def pretrain(cfg: Config, ctx: JobContext, p: Pipeline, world_dir: str) -> dict:
    """The pretraining phase(s): the curriculum on its small world (when ``curriculum.steps``),
    then ``pretrain`` on the world from the curriculum's checkpoint. Returns the last phase's
    train summary.

    With ``cfg.resume`` every phase runs under a name of its settings and continues from its
    latest checkpoint; a phase whose ``phase.json`` records the same settings as finished is
    not trained again (a stopped run picks up where it stopped).
    """
    start: str | None = None
    phases: list[tuple[str, str, str, PhaseConfig]] = []
    if cfg.curriculum.steps:
        cw_dir, _ = p.world(cfg.curriculum_world, ctx.path("curriculum_world"), "1/3 curriculum world")
        phases.append(("pretrained-curriculum", "2/3 pretrain (curriculum: the small world)",
                       f"{cw_dir}/pretrain.parquet", cfg.curriculum))
    phases.append(("pretrained", "2/3 pretrain a small CLIP" + (" (the world itself)" if phases else " from scratch"),
                   f"{world_dir}/pretrain.parquet", cfg.pretrain))
    summary: dict = {}
    for name, label, data, phase in phases:
        out = ctx.path("pretrain" if name == "pretrained" else "pretrain-curriculum")
        key = phase_key(cfg.arch, cfg.seed, phase, data, start)
        marker = storage.join(out, "phase.json")
        done = storage.read_json(marker) if cfg.resume and storage.exists(marker) else None
        if done and done.get("key") == key and storage.exists(storage.join(done["summary"]["checkpoint"], "open_clip_config.json")):
            p.say(f"{label}: finished earlier ({marker}), kept")
            summary = done["summary"]
        else:
            summary = p.train(name, label, data, phase, pretrained=start,
                              loss=PLAIN_CLIP_LOSS, output_dir=out, resumable=cfg.resume)
            if cfg.resume:
                storage.write_json(marker, {"key": key, "summary": summary})
        start = summary["checkpoint"]
    return summary


def check(cfg: Config) -> None:
    """Before any work: the tracking server (the worlds are made here, nothing is read)."""
    tracking.check_tracking(cfg.tracking)


def run(cfg: Config, ctx: JobContext) -> dict:
    started = time.time()
    init_ray(cfg.ray)
    p = Pipeline(cfg, ctx)
    world_dir, _ = p.world(label="1/3 world")
    pre = pretrain(cfg, ctx, p, world_dir)
    out: dict[str, Any] = {"checkpoint": pre["checkpoint"], "mlflow_run_id": pre.get("mlflow_run_id"),
                           "model_uri": pre.get("model_uri"), "world_dir": world_dir, "timings_s": p.timings}
    if not cfg.ship:
        return out | {"pipeline_s": round(time.time() - started, 1)}
    row = table1.table_row(p.evaluate("pretrained", pre["checkpoint"], world_dir, "3/3 evaluate the base")["metrics"])
    curriculum_row = None
    if cfg.curriculum.steps:
        ev_c = p.evaluate("pretrained-on-curriculum-world", pre["checkpoint"], ctx.path("curriculum_world"),
                          "3/3 evaluate the base on the curriculum world")
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
    written = bases.write_base(pre["checkpoint"], dest, cfg.name, manifest)
    ctx.log_metrics({f"pretrained/{k}": v for k, v in row.items()})
    p.say(f"base {cfg.name}: {dest}/{cfg.name} ({written['weights']['bytes'] / 1e6:.1f} MB float16); "
          f"REPLACE attribute orig {100 * row['world_replace_attribute/orig_acc']:.1f}, relation orig "
          f"{100 * row['world_replace_relation/orig_acc']:.1f}, SWAP orig {100 * row['swap/orig_acc']:.1f}")
    return out | {"base": f"{dest}/{cfg.name}", "manifest": written, "rows": {"pretrained": row},
                  "pipeline_s": round(time.time() - started, 1)}
