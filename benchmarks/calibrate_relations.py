"""Can the demo model learn spatial relations at all?  A Ray-free learnability probe.

The synthetic world's REPLACE-relation subset ("a red circle above a blue square" vs "... below
...") sits at chance for every model of the demo.  This tool separates "relations cannot be
learnt by this model / pipeline" from "the demo does not give them enough budget": it trains an
architecture from scratch on relation-only data drawn fresh every step, in which the relation is
what separates rows, and scores REPLACE-relation original accuracy on a world's benchmark every
``eval_every`` steps::

    python -m benchmarks.calibrate_relations world_dir=outputs/world mode=twins steps=1000

Modes (what a batch holds; every caption is a canonical relation caption, true of its scene):

* ``twins``    pairs (scene, its mirrored twin) whose captions differ only by the relation or by
               the order of the two noun phrases (:func:`hardpos.world.grammar.relation_twin`):
               plain contrastive loss; only the relation tells the two rows apart.
* ``hardneg``  one scene per row, with the benchmark's own kind of hard negative (the relation
               word changed, verified false): the contrastive loss with NegCLIP columns plus the
               2-way hard-negative term (``w_neg``), the most direct relation signal there is.
* ``plain``    one scene per row, no negative (the control: what pretraining on relation
               captions alone gives).

The same model, training step (:func:`hardpos.train.step.train_step`) and preprocessing as the
stages; images are rendered in memory (no files).  The score is the evaluator's rule (an item is
right when the image is closer to its caption than to its negative), on preprocessed images and
tokens held in memory, so a point of the curve costs seconds.
"""
from __future__ import annotations

import dataclasses
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow.parquet as pq
import torch
from PIL import Image

from hardpos.config import ConfigError, ModelConfig, load_config
from hardpos.world.grammar import canonical_caption, relation_negative, relation_twin
from hardpos.world.scene import Scene, WorldConfig, render, sample_scene
from hardpos.world.build import config_from_world
from hardpos.markdown import table
from hardpos.models.clip import encode_image, encode_text, load_model, tokenize
from hardpos.train.config import LossConfig, OptimConfig
from hardpos.train.step import TripletCLIP, build_optimizer, build_scheduler, model_batch, train_step

MODES = ("twins", "hardneg", "plain")


@dataclasses.dataclass
class RelationProbeConfig:
    """The learnability probe.

    world_dir: a generated world; only ``benchmark/replace_relation.parquet`` and its images are read.
    arch: open_clip architecture, trained from scratch.
    mode: what a batch holds (see the module docstring): twins | hardneg | plain.
    steps / batch / lr / warmup: the training run (warmup + cosine, as the stages).
    w_neg: weight of the 2-way hard-negative term in ``hardneg`` mode.
    eval_every: score the benchmark every this many steps (and after the last).
    min_objects / max_objects / relation_margin: the training scenes (as :class:`WorldConfig`); everything
        else (vocabulary, image size, jitter) is the scored world's (:func:`training_world`).
    seed: scenes, batch order and model init.
    threads: torch CPU threads.
    output: also write the curve as JSON here.
    """

    world_dir: str = "outputs/world"
    arch: str = "hardpos-demo"
    mode: str = "twins"
    steps: int = 1000
    batch: int = 64
    lr: float = 5e-4
    warmup: int = 20
    w_neg: float = 1.0
    eval_every: int = 100
    min_objects: int = 2
    max_objects: int = 3
    relation_margin: float = 0.1
    seed: int = 0
    threads: int = 1
    output: str | None = None

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.min_objects < 2:
            raise ConfigError(f"min_objects must be >= 2 (a relation needs two objects), got {self.min_objects}")
        if self.batch < 2 or self.batch % 2:
            raise ConfigError(f"batch must be an even number >= 2 (twins come in pairs), got {self.batch}")
        if self.steps < 1 or self.eval_every < 1:
            raise ConfigError("steps and eval_every must be >= 1")


def relation_rows(rng: random.Random, cfg: WorldConfig, mode: str, n: int) -> list[tuple[Scene, str, str | None]]:
    """``n`` training rows (scene, caption, negative or None) of ``mode``; pure given ``rng``.

    ``twins``: rows 2k and 2k+1 are a scene and its mirrored twin; ``hardneg``: every row has a
    negative; ``plain``: none has.
    """
    rows: list[tuple[Scene, str, str | None]] = []
    while len(rows) < n:
        scene = sample_scene(rng, cfg)
        cap = canonical_caption(rng, scene, cfg, template="relation")
        if cap is None:
            continue
        if mode == "twins":
            twin = relation_twin(rng, scene, cap, cap.text, cfg)
            if twin is not None:
                rows += [(scene, cap.text, None), (twin[0], twin[1], None)]
        elif mode == "hardneg":
            found = relation_negative(rng, scene, cap, cfg)
            if found is not None:
                rows.append((scene, cap.text, found[1]))
        else:
            rows.append((scene, cap.text, None))
    return rows[:n]


def _bench(world_dir: str, preprocess: Callable, tokenizer: Callable) -> dict[str, Any]:
    path = Path(world_dir) / "benchmark" / "replace_relation.parquet"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no REPLACE-relation benchmark; generate the world first (jobs/world.py)")
    items = pq.read_table(path, columns=["image", "caption", "hard_negative"]).to_pylist()
    images = torch.stack([preprocess(Image.open(path.parent / r["image"]).convert("RGB")) for r in items])
    return {"images": images, "caption": tokenize(tokenizer, [r["caption"] for r in items]),
            "negative": tokenize(tokenizer, [r["hard_negative"] for r in items])}


def relation_accuracy(model: torch.nn.Module, bench: dict[str, Any]) -> float:
    """Share of items whose image is closer to the caption than to the negative (the evaluator's
    ``orig_acc`` rule: a tie counts against the model)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        imgs = bench["images"]
        feats = torch.cat([encode_image(model, imgs[i:i + 256]) for i in range(0, len(imgs), 256)])
        s_c = (feats * encode_text(model, bench["caption"])).sum(-1)
        s_n = (feats * encode_text(model, bench["negative"])).sum(-1)
    model.train(was_training)
    return float((s_c > s_n).float().mean())


def training_world(cfg: RelationProbeConfig) -> WorldConfig:
    """The world the training scenes are drawn from: the scored world's own config (its
    vocabulary, image size and rendering jitter), so a restricted world (``jobs/world.py
    colors=[red,blue] ...``) is trained and scored on the same words and pixels; the seed,
    object counts and relation margin are the probe's own."""
    world = dataclasses.replace(config_from_world(cfg.world_dir), seed=cfg.seed, min_objects=cfg.min_objects,
                                max_objects=cfg.max_objects, relation_margin=cfg.relation_margin)
    world.validate()
    return world


def run(cfg: RelationProbeConfig) -> list[dict[str, float]]:
    """Train ``cfg.arch`` from scratch on relation-only rows; return the curve
    ``[{"step", "relation_orig_acc", "loss"}, ...]`` (step 0: the untrained model)."""
    cfg.validate()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    world = training_world(cfg)
    rng = random.Random(f"hardpos-relations:{cfg.seed}")
    lm = load_model(ModelConfig(arch=cfg.arch))
    bench = _bench(cfg.world_dir, lm.preprocess_val, lm.tokenizer)
    use_neg = cfg.mode == "hardneg"
    optim = OptimConfig(lr=cfg.lr, warmup_steps=cfg.warmup, grad_clip=1.0)
    net = TripletCLIP(lm.model).train()
    opt = build_optimizer(lm.model, optim)
    sched = build_scheduler(opt, optim.warmup_steps, cfg.steps)
    loss_cfg = LossConfig(w_pos=0.0, w_neg=cfg.w_neg if use_neg else 0.0, negclip_columns=use_neg)
    curve = [{"step": 0, "relation_orig_acc": relation_accuracy(lm.model, bench), "loss": float("nan")}]
    print(f"step 0: relation orig {100 * curve[0]['relation_orig_acc']:.1f}", file=sys.stderr, flush=True)
    losses: list[float] = []
    t0 = time.time()
    for step in range(1, cfg.steps + 1):
        rows = relation_rows(rng, world, cfg.mode, cfg.batch)
        # preprocess_val, as the probe and the evaluator: at the model's own image size it is
        # exactly to-tensor + normalise (no crop that could move or cut an object)
        images = torch.stack([lm.preprocess_val(render(s, world.image_size)) for s, _, _ in rows])
        has_n = torch.tensor([n is not None for _, _, n in rows])
        b = len(rows)
        tok = tokenize(lm.tokenizer, [c for _, c, _ in rows] + [n or "" for _, _, n in rows] + [""] * b)
        terms = train_step(net, model_batch(images, tok[:b], tok[b:2 * b], tok[2 * b:], has_n,
                                            torch.zeros(b, dtype=torch.bool)), loss_cfg, opt, sched, grad_clip=1.0)
        losses.append(float(terms["total"].detach()))
        if step % cfg.eval_every == 0 or step == cfg.steps:
            point = {"step": step, "relation_orig_acc": relation_accuracy(lm.model, bench),
                     "loss": float(np.mean(losses[-cfg.eval_every:]))}
            curve.append(point)
            print(f"step {step}: relation orig {100 * point['relation_orig_acc']:.1f} loss {point['loss']:.3f} "
                  f"({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    if cfg.output:
        Path(cfg.output).write_text(json.dumps({"config": dataclasses.asdict(cfg), "curve": curve}, indent=2))
    return curve


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    curve = run(load_config(RelationProbeConfig, None, argv))
    print(table(["step", "relation orig %", "loss"],
                [[p["step"], f"{100 * p['relation_orig_acc']:.1f}", f"{p['loss']:.3f}"] for p in curve]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
