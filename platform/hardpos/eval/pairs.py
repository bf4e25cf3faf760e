"""Cosine similarities for in-memory PIL images and caption strings (the Serve path).

Both functions go through exactly the evaluator's encoding (same preprocessing, batching
and precision); Serve asserts equality with these.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from PIL import Image

from hardpos.eval.encoding import check_precision, encode_captions, eval_mode, precision_context
from hardpos.eval.spec import Precision
from hardpos.models.clip import encode_image


def similarity_matrix(model, preprocess: Callable, tokenizer: Callable, images: Sequence["Image.Image"],
                      captions: Sequence[str], *, device="cpu", batch_size: int = 256,
                      precision: Precision = "fp32") -> np.ndarray:
    """Cosine similarities [len(images), len(captions)] for PIL images and caption strings,
    through the evaluator's own encoding path (same preprocessing, batching, precision)."""
    device = torch.device(device)
    check_precision(precision)
    with eval_mode(model):
        img_feats = []
        for start in range(0, len(images), batch_size):
            batch = torch.stack([preprocess(im.convert("RGB")) for im in images[start:start + batch_size]])
            with torch.no_grad(), precision_context(device, precision):
                img_feats.append(encode_image(model, batch.to(device), normalize=True).float().cpu())
        txt = encode_captions(model, tokenizer, list(captions), device=device, batch_size=batch_size, precision=precision)
    if not img_feats or len(captions) == 0:
        return np.zeros((len(images), len(captions)), dtype=np.float32)
    return (torch.cat(img_feats) @ txt.T).numpy()


def score_pairs(model, preprocess: Callable, tokenizer: Callable, images: Sequence["Image.Image"],
                captions: Sequence[str], *, device="cpu", batch_size: int = 256, precision: Precision = "fp32") -> np.ndarray:
    """Cosine similarity of ``images[i]`` with ``captions[i]`` for every i: shape [N].

    Distinct captions are encoded once (pass the same image object several times to score
    one image against several captions; it is encoded once per distinct object)."""
    if len(images) != len(captions):
        raise ValueError(f"score_pairs needs as many images as captions ({len(images)} != {len(captions)})")
    uniq_imgs: dict[int, int] = {}
    img_list = []
    for im in images:
        if id(im) not in uniq_imgs:
            uniq_imgs[id(im)] = len(img_list)
            img_list.append(im)
    uniq_caps = list(dict.fromkeys(captions))
    sims = similarity_matrix(model, preprocess, tokenizer, img_list, uniq_caps, device=device, batch_size=batch_size,
                             precision=precision)
    cap_idx = {c: i for i, c in enumerate(uniq_caps)}
    return np.array([sims[uniq_imgs[id(im)], cap_idx[c]] for im, c in zip(images, captions)], dtype=np.float64)

