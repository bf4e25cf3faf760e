"""Retention (the paper's Table 10 guard against catastrophic forgetting).

* Zero-shot classification over an ImageFolder-style directory (``root/<class>/<image>``):
  each class's text embedding is the re-normalised mean of its normalised prompt-template
  embeddings, computed by open_clip's own ``build_zero_shot_classifier`` (CLIP's recipe);
  an image is top-k correct when its class is among the k most similar classes. Figures
  ``top1``, ``top5`` (fractions). By default the classes are ImageNet-1k with open_clip's
  class names (``classnames: imagenet``) and the 80 OpenAI prompt templates
  (``templates: openai``); see :class:`ZeroShotSpec` for custom lists and the folder layout.
* Image-text retrieval over a captions file + images: image->text R@k is the fraction of
  images with at least one of their own captions in the top k; text->image R@k the
  fraction of captions whose image is in the top k. ``i2t_r{1,5,10}``, ``t2i_r{1,5,10}``.

Images and captions go through the evaluator's encoders (each encoded once, batched,
no-grad, in the evaluator's ``precision``: fp32 unless asked); unreadable images are
counted (``n_missing_images``) and left out. Ranks are strict: a tie with a wrong
candidate counts against the model, like the benchmarks.
"""
from __future__ import annotations

import json
import re
from pathlib import PurePosixPath
from typing import Any, Callable

import numpy as np
import open_clip
import torch
from open_clip import zero_shot_metadata  # names read at call time (tests shorten the list)

from hardpos import storage
from hardpos.data.triplets import resolve_image
from hardpos.eval.encoding import check_precision, encode_captions, encode_image_keys, eval_mode, precision_context
from hardpos.eval.spec import RetrievalSpec, ZeroShotSpec
from hardpos.models.clip import encode_text, trim_tokens

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")
CLASSNAME_SETS = ("imagenet", "folders")  # named values of ZeroShotSpec.classnames
TEMPLATE_SETS = ("openai", "simple")      # named values of ZeroShotSpec.templates
_WNID = re.compile(r"n\d{8}")


class RetentionError(ValueError):
    """A retention dataset is missing or malformed."""






def _read_name_list(uri: str, what: str) -> list[str]:
    """Strings from a ``.json`` list or a text file (one per line, blank lines skipped)."""
    if not storage.exists(uri):
        return []  # the caller names what was expected
    text = storage.read_text(uri)
    if uri.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RetentionError(f"{what} file {uri}: not JSON: {exc}") from exc
        if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
            raise RetentionError(f"{what} file {uri}: expected a JSON list of strings")
        return data
    return [line.strip() for line in text.splitlines() if line.strip()]


def resolve_classnames(classnames: str | list[str]) -> list[str] | None:
    """The class names a :class:`ZeroShotSpec` asks for; None for ``"folders"`` (the
    folder names decide). Raises :class:`RetentionError` for unknown names, missing or
    empty files and empty lists."""
    if isinstance(classnames, str):
        if classnames == "imagenet":
            return list(zero_shot_metadata.IMAGENET_CLASSNAMES)
        if classnames == "folders":
            return None
        names = _read_name_list(classnames, "classnames")
        if not names:
            raise RetentionError(f"classnames: {classnames!r} is neither one of {', '.join(CLASSNAME_SETS)} "
                                 f"nor a non-empty file of names (one per line, or a .json list)")
        return names
    names = [str(c) for c in classnames]
    if not names:
        raise RetentionError("classnames: an empty list (use 'folders' for the folder names)")
    return names


def resolve_templates(templates: str | list[str]) -> list[str]:
    """The prompt templates a :class:`ZeroShotSpec` asks for, as ``str.format`` strings
    with one ``{}``. open_clip's named sets are callables; ``t("{}")`` turns each into
    the equivalent format string (identical prompts for every class name)."""
    if isinstance(templates, str):
        if templates in TEMPLATE_SETS:
            named = (zero_shot_metadata.OPENAI_IMAGENET_TEMPLATES if templates == "openai"
                     else zero_shot_metadata.SIMPLE_IMAGENET_TEMPLATES)
            out = [t("{}") for t in named]
        elif "{}" in templates:
            raise RetentionError(f"templates: give a single template as a list: [{templates!r}]")
        else:
            out = _read_name_list(templates, "templates")
            if not out:
                raise RetentionError(f"templates: {templates!r} is neither one of {', '.join(TEMPLATE_SETS)} "
                                     f"nor a non-empty file of templates (one per line, or a .json list)")
    else:
        out = [str(t) for t in templates]
    if not out or any(t.count("{}") != 1 for t in out):
        raise RetentionError(f"every prompt template needs exactly one '{{}}' for the class name: {out}")
    return out


def folder_class_indices(folders: list[str], n_classes: int, name: str = "zeroshot",
                         require_wnids: bool = False) -> list[int]:
    """The class index of each of the sorted class ``folders`` (pure; the layout rules are
    in :class:`ZeroShotSpec`): integer names are the index itself, other names their
    position in sorted order (then there must be ``n_classes`` of them)."""
    if all(f.isdigit() for f in folders):
        index = [int(f) for f in folders]
        if max(index) >= n_classes:
            raise RetentionError(f"{name}: class folder {max(index)} is out of range for {n_classes} class names")
        return index
    if len(folders) != n_classes:
        raise RetentionError(f"{name}: {n_classes} class names for {len(folders)} class folders (name the folders "
                             f"by class index 0..{n_classes - 1} to use a subset of the classes, or set "
                             f"classnames: folders to classify among the folders' own names)")
    if require_wnids and not all(_WNID.fullmatch(f) for f in folders):
        odd = next(f for f in folders if not _WNID.fullmatch(f))
        raise RetentionError(f"{name}: classnames 'imagenet' needs the ImageNet val layout (one n01440764-style wnid "
                             f"folder per class, or folders 0..999); found folder {odd!r}")
    return list(range(len(folders)))


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


class _TextTower:
    """The one method ``open_clip.build_zero_shot_classifier`` calls (``encode_text``),
    routed through HardPos's text path: tokens trimmed to the batch's longest prompt
    (equal to the full context, see :func:`hardpos.models.clip.encode_text`), the evaluator's
    ``precision``, float32 features."""

    def __init__(self, model, device, precision: str):
        self.model, self.device, self.precision = model, device, precision

    def encode_text(self, tokens, normalize: bool = True):
        with precision_context(self.device, self.precision):
            return encode_text(self.model, trim_tokens(tokens), normalize=normalize).float()


def class_embeddings(model, tokenizer: Callable, classnames: list[str], templates: list[str], *, device="cpu",
                     batch_size: int = 256, precision: str = "fp32"):
    """[n_classes, D] float32 on CPU: open_clip's ``build_zero_shot_classifier`` (mean of
    the normalised template embeddings, re-normalised), transposed; about ``batch_size``
    prompts per forward pass (whole classes at a time)."""
    check_precision(precision)
    templates = resolve_templates(list(templates))
    if not classnames:
        raise RetentionError("class_embeddings: no class names")
    weights = open_clip.build_zero_shot_classifier(
        _TextTower(model, torch.device(device), precision), tokenizer, list(classnames), templates,
        num_classes_per_batch=max(1, batch_size // len(templates)), device=device, use_tqdm=False)
    return weights.T.float().cpu().contiguous()


def zero_shot(model, preprocess: Callable, tokenizer: Callable, spec: ZeroShotSpec, *, device="cpu",
              batch_size: int = 256, num_threads: int = 4, precision: str = "fp32") -> dict[str, float]:
    """``{"zeroshot/<name>/top1": ..., "/top5", "/n_images", "/n_classes", "/n_templates",
    "/n_missing_images"}``; ``n_classes`` is the classifier's size (1000 for ImageNet, also
    when only some class folders are present)."""
    names = resolve_classnames(spec.classnames)
    templates = resolve_templates(spec.templates)
    folders, samples = list_image_folder(spec.root)
    if names is None:
        names = [f.replace("_", " ") for f in folders]
        index = list(range(len(folders)))
    else:
        index = folder_class_indices(folders, len(names), spec.name, require_wnids=spec.classnames == "imagenet")
    if spec.limit is not None:
        samples = samples[: spec.limit]
    with eval_mode(model):
        cls = class_embeddings(model, tokenizer, names, templates, device=device, batch_size=batch_size,
                               precision=precision)
        feats, failures = encode_image_keys(model, preprocess, [(f, None) for f, _ in samples], device=device,
                                            batch_size=batch_size, num_threads=num_threads, precision=precision)
    ok = np.array([i not in failures for i in range(len(samples))], dtype=bool)
    targets = np.array([index[c] for _, c in samples], dtype=np.int64)[ok]
    sims = (feats[ok] @ cls.T).numpy() if ok.any() else np.zeros((0, len(names)))
    hits = topk_hits(sims, targets, ks=(1, 5))
    p = f"zeroshot/{spec.name}"
    return {f"{p}/top1": float(hits[1].mean()) if len(targets) else 0.0,
            f"{p}/top5": float(hits[5].mean()) if len(targets) else 0.0,
            f"{p}/n_images": int(len(targets)), f"{p}/n_classes": len(names), f"{p}/n_templates": len(templates),
            f"{p}/n_missing_images": len(failures)}


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
              batch_size: int = 256, num_threads: int = 4, precision: str = "fp32") -> dict[str, float]:
    """``retrieval/<name>/{i2t,t2i}_r{1,5,10}`` plus counts."""
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
                                             device=device, batch_size=batch_size, num_threads=num_threads,
                                             precision=precision)
        captions = [c for _, c in pairs]
        tfeats = encode_captions(model, tokenizer, captions, device=device, batch_size=batch_size, precision=precision)
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
