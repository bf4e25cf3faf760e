"""The setup both training-step benchmarks share (:mod:`benchmarks.train_bench`,
:mod:`benchmarks.tracking_bench`): a model, THE training step's wrapper and optimiser
(:mod:`hardpos.train.step`), and one synthetic batch of triplets, built the same way so
that the two benchmarks time the same step.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from hardpos.config import ModelConfig
from hardpos.models.clip import LoadedModel, load_model, tokenize
from hardpos.train.config import OptimConfig
from hardpos.train.step import TripletCLIP, build_optimizer

COLOURS = ("red", "blue", "green", "yellow", "purple", "orange")
SHAPES = ("circle", "square", "triangle", "star")


def synthetic_batch(lm: LoadedModel, batch_size: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random images and shape captions with a swap negative and a paraphrase positive ->
    ``(images, text, neg, pos)`` padded to the context length, then ``(text, neg, pos)``
    trimmed to the batch's length (what the training loop feeds)."""
    g = torch.Generator().manual_seed(seed)
    size = lm.model.visual.image_size
    size = size[0] if isinstance(size, (tuple, list)) else int(size)
    images = torch.randn(batch_size, 3, size, size, generator=g)
    caps, negs, poss = [], [], []
    for i in range(batch_size):
        c, d = COLOURS[i % len(COLOURS)], COLOURS[(i + 1) % len(COLOURS)]
        s, t = SHAPES[i % len(SHAPES)], SHAPES[(i + 1) % len(SHAPES)]
        caps.append(f"a {c} {s} to the left of a small {d} {t}")
        negs.append(f"a {d} {s} to the left of a small {c} {t}")
        poss.append(f"a small {d} {t} to the right of a {c} {s}")
    full = lm.tokenizer(caps + negs + poss)  # padded to the context length
    trimmed = tokenize(lm.tokenizer, caps + negs + poss)
    b = batch_size
    return images, full[:b], full[b:2 * b], full[2 * b:], trimmed[:b], trimmed[b:2 * b], trimmed[2 * b:]


@dataclasses.dataclass
class StepSetup:
    """What a step benchmark times: ``net`` (the training wrapper of ``lm.model``, in train
    mode), ``opt`` (the training loop's optimiser for ``optim``) and one synthetic batch."""

    lm: LoadedModel
    net: Any
    optim: OptimConfig
    opt: torch.optim.Optimizer
    images: torch.Tensor
    padded: tuple[torch.Tensor, torch.Tensor, torch.Tensor]    # text, neg, pos at the context length
    trimmed: tuple[torch.Tensor, torch.Tensor, torch.Tensor]   # the same, trimmed to the batch length


def step_setup(arch: str = "hardpos-tiny", batch_size: int = 32, device: str = "cpu", lr: float = 1e-6,
               seed: int = 0) -> StepSetup:
    """Seeded: the same weights and batch on every call with the same arguments."""
    torch.manual_seed(seed)
    lm = load_model(ModelConfig(arch=arch), device=device)
    lm.model.train()
    optim = OptimConfig(lr=lr)
    images, t77, n77, p77, tb, nb, pb = (x.to(device) for x in synthetic_batch(lm, batch_size, seed))
    return StepSetup(lm, TripletCLIP(lm.model), optim, build_optimizer(lm.model, optim), images, (t77, n77, p77),
                     (tb, nb, pb))
