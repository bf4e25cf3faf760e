"""What to evaluate: one benchmark, as a config section (shared by evaluate, train, sweep)."""
from __future__ import annotations

import dataclasses
from typing import Literal

BenchmarkKind = Literal["replace", "swap", "sugarcrepe", "sugarcrepe_pp", "triplets"]


@dataclasses.dataclass
class BenchmarkSpec:
    """One benchmark.

    name: the prefix of its metrics (``<name>/aug_acc``); e.g. ``replace``, ``swap``,
        ``sugarcrepe``, ``world_replace_attribute``.
    kind: the file format:
        ``replace``    the paper's ``data/`` + ``swapped_data/`` vl_checklist files (path =
                       the folder holding both; subsets attributes and relations);
        ``swap``       ARO VG-Attribution json paired with its swapped file (path = folder);
        ``sugarcrepe`` folder of the 7 SugarCrepe json files (no positives);
        ``sugarcrepe_pp`` folder of the 5 SugarCrepe++ json files (two positives per
                       image, and a text-only task; hardpos.eval.sugarcrepe_pp);
        ``triplets``   a triplet file (parquet/jsonl, the triplet row contract): caption,
                       hard_negative, hard_positive, image (the synthetic world's
                       benchmarks and any custom benchmark).
    path: file or folder (local or s3://).
    image_root: folder the benchmark's relative image paths are resolved against
        (None: relative to the benchmark file's folder).
    limit: evaluate only the first N items (None: all).
    cache_dir: where a ``triplets`` benchmark read from webdataset shards or inline-image
        parquet writes its images (None: ``$HARDPOS_IMAGE_CACHE`` or a folder in the
        system's temp dir); see :mod:`hardpos.eval.inline`.
    """

    name: str
    kind: BenchmarkKind = "triplets"
    path: str = ""
    image_root: str | None = None
    limit: int | None = None
    cache_dir: str | None = None


@dataclasses.dataclass
class RayDataConfig:
    """Ray Data engine settings (``engine=ray_data``).

    concurrency: number of model actors.
    batch_size: images per actor call.
    num_cpus / num_gpus: resources per actor (num_gpus > 0 puts each actor on a GPU).
    """

    concurrency: int = 1
    batch_size: int = 64
    num_cpus: float = 1.0
    num_gpus: float = 0.0
