"""What an evaluation is configured by: benchmarks, retention datasets, the arithmetic, the
Ray Data engine (config sections shared by evaluate, interpolate, train, sweep and the demo).

Pure dataclasses: the CLI loads them without importing torch, open_clip or Ray."""
from __future__ import annotations

import dataclasses
from typing import Literal, get_args

#: The benchmark formats (:mod:`hardpos.eval.formats` says what a path of each may be): the one
#: list every reader of benchmarks takes its formats from.
BenchmarkKind = Literal["replace", "swap", "sugarcrepe", "sugarcrepe_pp", "triplets"]
BENCHMARK_KINDS: tuple[str, ...] = get_args(BenchmarkKind)
#: kinds stored as a table of rows (parquet / jsonl / shards), checked for columns before a job starts
TABLE_KINDS = ("triplets",)
#: The encoders' arithmetic (hardpos.eval.encoding.precision_context).
Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


@dataclasses.dataclass
class BenchmarkSpec:
    """One benchmark.

    name: the prefix of its metrics (``<name>/aug_acc``); e.g. ``replace``, ``swap``,
        ``sugarcrepe``, ``world_replace_attribute``.
    kind: the file format:
        ``replace``    the paper's ``data/`` + ``swapped_data/`` vl_checklist files (path =
                       the folder holding both; subsets attributes and relations), or one
                       half / one file alone (no positives);
        ``swap``       ARO VG-Attribution json paired with its swapped file (path = folder),
                       or one half / the file alone;
        ``sugarcrepe`` folder of the 7 SugarCrepe json files, or one (no positives);
        ``sugarcrepe_pp`` folder of the 5 SugarCrepe++ json files, or one (two positives per
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


@dataclasses.dataclass
class ZeroShotSpec:
    """One zero-shot classification dataset.

    name: metric prefix (``zeroshot/<name>/top1``).
    root: ImageFolder directory (local or s3://): one sub-folder per class.
    classnames: the classifier's classes, in class-index order:
        ``"imagenet"`` (default) open_clip's 1000 ImageNet-1k names
            (``open_clip.IMAGENET_CLASSNAMES``);
        ``"folders"``  the folder names themselves, sorted, ``_`` -> space;
        a list of names, or a file (local or s3://): one name per line, or a ``.json`` list.
    templates: prompt templates, each with one ``{}`` for the class name:
        ``"openai"`` (default) the 80 OpenAI ImageNet templates, ``"simple"`` open_clip's 7
        (``open_clip.zero_shot_metadata``); a list, or a file as for classnames.
    limit: use only the first N images (sorted by path; None: all).

    How folders map to classes (named or listed classnames): folders named by integers
    (``0`` .. ``999``) are that class index, so a subset of the classes may be present;
    any other names are taken in sorted order and there must be exactly one folder per
    class. The standard ImageFolder layout of ImageNet val (1000 ``n01440764``-style wnid
    folders) is the second case: sorted wnids are the class-index order of open_clip's
    names, and ``classnames: imagenet`` insists on exactly those 1000 wnid folders.
    """

    name: str
    root: str
    classnames: str | list[str] = "imagenet"
    templates: str | list[str] = "openai"
    limit: int | None = None


@dataclasses.dataclass
class RetrievalSpec:
    """One image-text retrieval dataset.

    name: metric prefix (``retrieval/<name>/i2t_r1``).
    captions: a jsonl file of ``{"image": path, "caption": text}`` rows (several rows per
        image allowed) or a COCO captions json (``images[]`` + ``annotations[]``).
    image_root: folder image paths are relative to (None: the captions file's folder).
    limit: use only the first N images (None: all).
    """

    name: str
    captions: str
    image_root: str | None = None
    limit: int | None = None


@dataclasses.dataclass
class RetentionConfig:
    """Zero-shot retention checks (empty: none).

    zeroshot: ImageFolder classification datasets (name, root, classnames, templates, limit);
        classnames default to open_clip's 1000 ImageNet names (``imagenet``; or ``folders``,
        a list, a file) and templates to the 80 OpenAI ones (``openai``; or ``simple``, a
        list, a file).
    retrieval: image-text retrieval datasets (name, captions, image_root, limit).
    """

    zeroshot: list[ZeroShotSpec] = dataclasses.field(default_factory=list)
    retrieval: list[RetrievalSpec] = dataclasses.field(default_factory=list)
