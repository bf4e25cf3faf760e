"""The embedded-default pipeline (placeholder slice until the end-to-end demo lands):
start a local Ray, build the tiny CLIP in a Ray task, score a caption against its
hard negative and hard positive, and track it all in the local MLflow store."""
from __future__ import annotations

import dataclasses

from hardpos.config import JobConfig, TrackingConfig
from hardpos.runtime import JobContext, init_ray


@dataclasses.dataclass
class Config(JobConfig):
    output_dir: str = "outputs/demo"
    tracking: TrackingConfig = dataclasses.field(default_factory=lambda: TrackingConfig(experiment="hardpos-demo"))


def _score(captions: list[str], seed: int) -> list[float]:
    import torch

    from hardpos.model import ModelConfig, encode_text, load_model, tokenize

    torch.manual_seed(seed)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    with torch.no_grad():
        feats = encode_text(lm.model.eval(), tokenize(lm.tokenizer, captions))
    return (feats[1:] @ feats[0]).tolist()


def run(cfg: Config, ctx: JobContext) -> dict:
    import ray

    init_ray(cfg.ray)
    captions = ["a red circle to the left of a blue square", "a blue circle to the left of a blue square",
                "a crimson circle to the left of a blue square"]
    sims = ray.get(ray.remote(_score).remote(captions, cfg.seed))
    ctx.log_metrics({"text_sim/negative": sims[0], "text_sim/positive": sims[1]})
    print(f"text similarity to the hard negative {sims[0]:.3f}, to the hard positive {sims[1]:.3f} (random tiny CLIP)")
    return {"text_sim_negative": sims[0], "text_sim_positive": sims[1]}
