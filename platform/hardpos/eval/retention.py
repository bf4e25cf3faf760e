"""Retention (the paper's Table 10 guard against catastrophic forgetting).

* Zero-shot classification over an ImageFolder-style directory (``root/<class>/<image>``):
  each class's text embedding is the re-normalised mean of its prompt-template
  embeddings (CLIP's recipe); an image is top-k correct when its class is among the k
  most similar classes. Figures ``top1``, ``top5`` (fractions).
* Image-text retrieval over a captions file + images: image->text R@k is the fraction of
  images with at least one of their own captions in the top k; text->image R@k the
  fraction of captions whose image is in the top k. ``i2t_r{1,5,10}``, ``t2i_r{1,5,10}``.

Images and captions go through the evaluator's encoders (each encoded once, batched,
no-grad); unreadable images are counted (``n_missing_images``) and left out. Ranks are
strict: a tie with a wrong candidate counts against the model, like the benchmarks.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import PurePosixPath
from typing import Any, Callable

import numpy as np

from hardpos import storage

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")
DEFAULT_TEMPLATES = ["a photo of a {}."]


class RetentionError(ValueError):
    """A retention dataset is missing or malformed."""


@dataclasses.dataclass
class ZeroShotSpec:
    """One zero-shot classification dataset.

    name: metric prefix (``zeroshot/<name>/top1``).
    root: ImageFolder directory (local or s3://): one sub-folder per class.
    classnames: display names in sorted-folder order (None: folder names, ``_`` -> space).
    templates: prompt templates with one ``{}`` for the class name.
    limit: use only the first N images (sorted by path; None: all).
    """

    name: str
    root: str
    classnames: list[str] | None = None
    templates: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_TEMPLATES))
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


def _dirname(uri: str) -> str:
    return uri.rsplit("/", 1)[0] if "/" in uri else "."


def list_image_folder(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """(class folder names sorted, [(image uri, class index)]) of an ImageFolder directory."""
    root = root.rstrip("/")
    files = [f for f in storage.list_files(root) if f.lower().endswith(IMAGE_SUFFIXES)]
    samples, classes = [], []
    for f in files:
        rel = PurePosixPath(f[len(root):].lstrip("/").replace("\\", "/"))
        if len(rel.parts) < 2:
            continue  # images directly in root belong to no class
        classes.append(rel.parts[0])
        samples.append((f, rel.parts[0]))
    names = sorted(set(classes))
    if not names:
        raise RetentionError(f"{root}: no class folders with images (expected root/<class>/<image>)")
    index = {c: i for i, c in enumerate(names)}
    return names, sorted((f, index[c]) for f, c in samples)


def topk_hits(sims: np.ndarray, targets: np.ndarray, ks=(1, 5)) -> dict[int, np.ndarray]:
    """Per row: is the target among the k highest? Strict: rank = number of candidates
    scoring >= the target, excluding the target itself (ties count against the model)."""
    target_scores = sims[np.arange(len(targets)), targets]
    rank = (sims >= target_scores[:, None]).sum(axis=1) - 1
    return {k: rank < k for k in ks}


def class_embeddings(model, tokenizer: Callable, classnames: list[str], templates: list[str], *, device="cpu",
                     batch_size: int = 256):
    """[n_classes, D]: mean of the normalised template embeddings, re-normalised."""
    import torch.nn.functional as F

    from hardpos.eval.evaluator import encode_captions

    if not templates or any("{}" not in t for t in templates):
        raise RetentionError(f"every prompt template needs one '{{}}' for the class name: {templates}")
    prompts = [t.format(c) for c in classnames for t in templates]
    feats = encode_captions(model, tokenizer, prompts, device=device, batch_size=batch_size)
    feats = feats.view(len(classnames), len(templates), -1).mean(dim=1)
    return F.normalize(feats, dim=-1)


def zero_shot(model, preprocess: Callable, tokenizer: Callable, spec: ZeroShotSpec, *, device="cpu",
              batch_size: int = 256, num_threads: int = 4) -> dict[str, float]:
    """``{"zeroshot/<name>/top1": ..., "/top5", "/n_images", "/n_classes", "/n_missing_images"}``."""
    from hardpos.eval.evaluator import encode_image_keys, eval_mode

    folders, samples = list_image_folder(spec.root)
    if spec.limit is not None:
        samples = samples[: spec.limit]
    names = spec.classnames or [f.replace("_", " ") for f in folders]
    if len(names) != len(folders):
        raise RetentionError(f"{spec.name}: {len(names)} class names for {len(folders)} class folders")
    with eval_mode(model):
        cls = class_embeddings(model, tokenizer, names, spec.templates, device=device, batch_size=batch_size)
        feats, failures = encode_image_keys(model, preprocess, [(f, None) for f, _ in samples], device=device,
                                            batch_size=batch_size, num_threads=num_threads)
    ok = np.array([i not in failures for i in range(len(samples))], dtype=bool)
    targets = np.array([c for _, c in samples], dtype=np.int64)[ok]
    sims = (feats[ok] @ cls.T).numpy() if ok.any() else np.zeros((0, len(names)))
    hits = topk_hits(sims, targets, ks=(1, 5))
    p = f"zeroshot/{spec.name}"
    return {f"{p}/top1": float(hits[1].mean()) if len(targets) else 0.0,
            f"{p}/top5": float(hits[5].mean()) if len(targets) else 0.0,
            f"{p}/n_images": int(len(targets)), f"{p}/n_classes": len(names), f"{p}/n_missing_images": len(failures)}


def read_caption_pairs(uri: str) -> list[tuple[str, str]]:
    """``[(image, caption)]`` from a jsonl of {image, caption} or a COCO captions json."""
    if not storage.exists(uri):
        raise RetentionError(f"captions file not found: {uri}")
    text = storage.read_text(uri)
    if uri.endswith(".jsonl"):
        rows = storage.parse_jsonl(text, uri, RetentionError)
        for n, row in enumerate(rows, 1):
            if not row.get("image") or not row.get("caption"):
                raise RetentionError(f"{uri}: row {n} needs non-empty 'image' and 'caption'")
        return [(str(row["image"]), str(row["caption"])) for row in rows]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RetentionError(f"{uri}: not JSON: {exc}") from exc
    if not isinstance(data, dict) or "images" not in data or "annotations" not in data:
        raise RetentionError(f"{uri}: expected .jsonl rows or a COCO captions json with images[] and annotations[]")
    files = {img["id"]: img["file_name"] for img in data["images"]}
    return [(files[a["image_id"]], a["caption"]) for a in data["annotations"] if a["image_id"] in files]


def retrieval(model, preprocess: Callable, tokenizer: Callable, spec: RetrievalSpec, *, device="cpu",
              batch_size: int = 256, num_threads: int = 4) -> dict[str, float]:
    """``retrieval/<name>/{i2t,t2i}_r{1,5,10}`` plus counts."""
    from hardpos.data.triplets import resolve_image
    from hardpos.eval.evaluator import encode_captions, encode_image_keys, eval_mode

    pairs = read_caption_pairs(spec.captions)
    base = _dirname(spec.captions)
    images = list(dict.fromkeys(img for img, _ in pairs))
    if spec.limit is not None:
        images = images[: spec.limit]
    img_index = {img: i for i, img in enumerate(images)}
    pairs = [(img, cap) for img, cap in pairs if img in img_index]
    if not pairs:
        raise RetentionError(f"{spec.name}: no captions")
    with eval_mode(model):
        ifeats, failures = encode_image_keys(model, preprocess, [(resolve_image(i, base, spec.image_root), None) for i in images],
                                             device=device, batch_size=batch_size, num_threads=num_threads)
        captions = [c for _, c in pairs]
        tfeats = encode_captions(model, tokenizer, captions, device=device, batch_size=batch_size)
    ok_img = np.array([i not in failures for i in range(len(images))], dtype=bool)
    new_index = np.cumsum(ok_img) - 1  # position of each kept image among the kept ones
    cap_img = np.array([img_index[img] for img, _ in pairs], dtype=np.int64)
    keep_cap = ok_img[cap_img]
    I, T = ifeats[ok_img].numpy(), tfeats[keep_cap].numpy()
    cap_img = new_index[cap_img[keep_cap]]
    sims = I @ T.T  # [n_img, n_cap]
    p = f"retrieval/{spec.name}"
    out: dict[str, Any] = {f"{p}/n_images": int(len(I)), f"{p}/n_captions": int(len(T)), f"{p}/n_missing_images": len(failures)}
    if len(I) == 0:
        return out
    ks = (1, 5, 10)
    t2i = topk_hits(sims.T, cap_img, ks)
    # image -> text: the image's best-scoring own caption decides; its rank is the number
    # of other images' captions scoring >= it (ties count against the model).
    own = cap_img[None, :] == np.arange(len(I))[:, None]
    best = np.where(own, sims, -np.inf).max(axis=1)
    i2t_rank = ((sims >= best[:, None]) & ~own).sum(axis=1)
    for k in ks:
        out[f"{p}/i2t_r{k}"] = float((i2t_rank < k).mean())
        out[f"{p}/t2i_r{k}"] = float(t2i[k].mean())
    return out
