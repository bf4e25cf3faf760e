"""The demo's steps (:mod:`hardpos.stages.demo`): each one a real stage, run through
:func:`hardpos.runtime.execute` as a child of the demo's MLflow run, plus the helpers they
share (world reuse, epoch count, names) and the closing instructions.

Kept apart from the demo's config and orchestration so each module does one job: this one
knows how to configure every stage the demo calls, the stage module only decides the order.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from hardpos import storage
from hardpos.config import ModelConfig, TrackingConfig
from hardpos.data.world import BENCHMARKS, WorldConfig, load_world
from hardpos.eval.spec import RetrievalSpec
from hardpos.runtime import JobContext, execute
from hardpos.stages import evaluate as ev
from hardpos.stages import generate as gen
from hardpos.stages import interpolate as wise
from hardpos.stages import world as world_stage
from hardpos.train.config import CheckpointSection, DataConfig, LossConfig, OptimConfig, ScalingSection, TrainConfig

if TYPE_CHECKING:  # annotations only: the demo's config module imports this one
    from hardpos.stages.demo import Config, PhaseConfig

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
        wcfg = world_stage.Config(**dataclasses.asdict(world), output_dir=world_dir,
                                  tracking=self.tracking("world"), ray=cfg.ray)
        self.execute("world", wcfg, label)
        if not storage.exists(storage.join(world_dir, "world.json")):
            raise RuntimeError(f"world stage wrote no world.json under {world_dir}")
        return world_dir, False

    # 2 / 4 ------------------------------------------------------------ training
    def train(self, name: str, label: str, data_path: str, phase: PhaseConfig, *, pretrained: str | None,
              w_pos: float, w_neg: float, negclip_columns: bool, output_dir: str, resumable: bool = False) -> dict:
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
                            shuffle_buffer=phase.shuffle_buffer),
            loss=LossConfig(w_pos=w_pos, w_neg=w_neg, negclip_columns=negclip_columns),
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
        gcfg = gen.Config(output_dir=self.ctx.path("generate"), seed=cfg.seed, tracking=self.tracking("generate"),
                          ray=cfg.ray, input=f"{world_dir}/finetune.parquet",
                          engine=dataclasses.replace(gen.EngineConfig(), kind=cfg.generate_engine),
                          # a new world invalidates earlier shards; an unchanged one resumes (nothing to do)
                          overwrite=regenerate)
        return self.execute("generate", gcfg, "3/7 generate hard negatives + positives")

    # 4 (full) ---------------------------------------------------------- the w_neg grid
    def sweep(self, triplets: str, base_ckpt: str) -> dict:
        """The paper's w_neg grid (w_pos = 1) through the sweep stage, from the same base."""
        # lazy: the sweep stage imports Ray Tune (seconds); only full=true runs it
        from hardpos.stages import sweep as sw

        cfg, f = self.cfg, self.cfg.finetune
        overrides = {
            "model.arch": cfg.arch, "model.pretrained": base_ckpt, "data.train_path": triplets,
            "data.val_fraction": f.val_fraction, "data.shuffle_buffer": f.shuffle_buffer, "optim.lr": f.lr,
            "optim.warmup_steps": f.warmup_steps, "optim.weight_decay": f.weight_decay, "scaling.num_workers": f.num_workers,
            "scaling.cpus_per_worker": f.cpus_per_worker, "batch_size": f.batch_size, "max_steps": f.steps,
            "epochs": epochs_for(triplets, f), "seed": cfg.seed,
            # Tune needs its objective per epoch (replace/aug_acc, swap/aug_acc); a 300-item slice
            # keeps that cheap. The table itself comes from the evaluate stage on every item.
            "eval_benchmarks": [{"name": n, "kind": "triplets", "path": f"{self.world_dir()}/benchmark/{s}.parquet",
                                 "limit": 300} for n, s in (("replace", "replace_attribute"), ("swap", "swap"))],
        }
        scfg = sw.Config(output_dir=self.ctx.path("sweep"), seed=cfg.seed, tracking=self.tracking("sweep"), ray=cfg.ray,
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
        ecfg = ev.Config(output_dir=self.ctx.path("eval", slug(name)), seed=self.cfg.seed,
                         tracking=self.tracking(f"eval-{name}"), ray=self.cfg.ray,
                         model=ModelConfig(arch=self.cfg.arch, pretrained=checkpoint), model_name=name,
                         world=world_dir, batch_size=self.cfg.eval_batch_size, device="auto")
        return self.execute("evaluate", ecfg, f"5/7 evaluate {name}")

    # 5 (full) ---------------------------------------------------------- WiSE-FT curves
    def wise_curve(self, name: str, base_ckpt: str, checkpoint: str, world_dir: str) -> dict:
        """The interpolate stage from the base (alpha 0) to ``name`` (alpha 1) on the world's
        benchmarks, with retrieval over pretraining pairs as the retention figure."""
        cfg = self.cfg
        wcfg = wise.Config(output_dir=self.ctx.path("wise", slug(name)), seed=cfg.seed,
                           tracking=self.tracking(f"wise-{name}"), ray=cfg.ray,
                           base=ModelConfig(arch=cfg.arch, pretrained=base_ckpt),
                           finetuned=ModelConfig(arch=cfg.arch, pretrained=checkpoint),
                           base_name="pretrained", finetuned_name=name, alphas=list(cfg.wise_alphas), world=world_dir,
                           retention=ev.RetentionConfig(retrieval=[self.retrieval_set(world_dir)]),
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


def instructions(uri: str, cfg: Config, best: str, registered: dict, files: dict, elapsed: float) -> str:
    """What the demo prints at the end: the champion, where the table is, how to open the
    MLflow UI and serve the champion, and a ready curl for one world image."""
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
