"""`hardpos world`: generate the synthetic world (scenes, images, captions, verified benchmarks).

Writes the layout documented in :mod:`hardpos.world.build` under ``output_dir`` (local or
s3://) and returns the counts, the share of non-canonical pretraining captions and the
generation speed (scenes/s).  Pure CPU work in this process: rendering is threaded, and
starting Ray would cost more than it saves at this size.
"""
from __future__ import annotations

import dataclasses

from hardpos import preflight, tracking
from hardpos.config import JobConfig
from hardpos.world.scene import WorldConfig
from hardpos.world.build import generate_world
from hardpos.runtime import JobContext


@dataclasses.dataclass
class Config(WorldConfig, JobConfig):
    """Synthetic world job.

    output_dir: where the world is written (local path or s3://bucket/prefix).
    seed: the world's seed (scenes, captions, benchmark perturbations).
    image_size: rendered image side in pixels (default 64).
    n_pretrain / n_finetune / n_benchmark: scenes per split (benchmark scenes are held out).
    min_objects / max_objects: objects per scene (1..3).
    colors / shapes / sizes: the vocabulary (see hardpos.world.build for what is known).
    relation_caption_rate: share of captions using "X above Y" instead of "X and Y".
    noncanonical_rate: share of pretraining captions with one synonym or reordered list (default 0.005).
    finetune_synonym_rate: share of finetuning captions' colour / size / relation words written with
        their finetuning synonym (default 0: canonical words; 0.5 lets perturb positive_picks=mirrored
        balance the REPLACE positives).
    relation_margin: fraction of the image by which a relation must hold to be "true".
    background_jitter / color_jitter: nuisance variation of the rendering.
    write_images: false writes captions and ground truth only.
    """

    output_dir: str = "outputs/world"

    def __post_init__(self) -> None:
        # WorldConfig.validate's checks run when the config is built, as every config's do
        self.validate()


def world_config(cfg: Config) -> WorldConfig:
    """The WorldConfig part of the stage config."""
    return WorldConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(WorldConfig)})


def check(cfg: Config) -> None:
    """Before any work: the S3 endpoint (an s3:// output_dir) and the tracking server; a world reads nothing."""
    preflight.check_s3_endpoint([cfg.output_dir])
    tracking.check_tracking(cfg.tracking)


def run(cfg: Config, ctx: JobContext) -> dict:
    wc = world_config(cfg)  # validated when cfg was built (Config.__post_init__)
    stats = generate_world(wc, ctx.output_dir)
    metrics = {f"items/{k}": v for k, v in stats["benchmark_items"].items()}
    metrics.update({f"scenes/{k}": v for k, v in stats["scenes"].items()})
    metrics["scenes_per_s"] = stats["scenes_per_s"] or 0.0
    metrics["pretrain_noncanonical_share"] = stats["pretrain_noncanonical_share"]
    ctx.log_metrics(metrics)
    total = sum(stats["scenes"].values())
    print(f"world: {total} scenes in {stats['seconds']:.1f}s ({stats['scenes_per_s']} scenes/s wall, "
          f"{stats['scenes_per_cpu_s']} per CPU-second); "
          f"benchmark items {stats['benchmark_items']}; non-canonical pretrain captions "
          f"{stats['pretrain_noncanonical']} ({100 * stats['pretrain_noncanonical_share']:.2f}%)")
    return stats
