"""Image encoding as Ray Data ``map_batches`` over model actors (large benchmarks, clusters).

The distinct ``(image, crop)`` keys of a benchmark become a Ray dataset; a pool of
actors, each holding the model, decodes, preprocesses and encodes its batches; the
driver gathers ``(index, feature, error)`` rows back into the evaluator's feature matrix.
Text encoding stays on the driver (captions are cheap). The actors get the driver's
exact weights through the object store and encode in the same ``precision`` (fp32 unless
asked), so scores equal the local engine's.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import ray
import ray.data
import torch

from hardpos.config import ModelConfig
from hardpos.eval.encoding import check_precision, encode_image_keys
from hardpos.eval.spec import RayDataConfig
from hardpos.models.clip import load_model, unwrap


class _ImageEncoderActor:
    """Ray Data callable class: builds the model once, encodes batches of image keys."""

    def __init__(self, arch: str, quick_gelu: bool, state_box: list, device: str, precision: str = "fp32"):
        lm = load_model(ModelConfig(arch=arch, force_quick_gelu=quick_gelu), device="cpu")
        lm.model.load_state_dict(ray.get(state_box[0]))
        self.device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = lm.model.to(self.device).eval()
        self.preprocess = lm.preprocess_val
        self.precision = precision

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        keys = [(str(img), tuple(float(v) for v in crop) if crop is not None and len(crop) else None)
                for img, crop in zip(batch["image"], batch["crop"])]
        feats, failures = encode_image_keys(self.model, self.preprocess, keys, device=self.device,
                                            batch_size=len(keys), num_threads=2, precision=self.precision)
        return {"idx": batch["idx"], "feature": feats.numpy(),
                "error": np.array([failures.get(i, "") for i in range(len(keys))], dtype=object)}


def ray_image_encoder(model, arch: str, model_cfg: dict, cfg: RayDataConfig | None = None,
                      device: str = "auto", precision: str = "fp32"
                      ) -> Callable[[Sequence[tuple]], tuple[np.ndarray, dict[int, str]]]:
    """An ``image_encoder`` for :func:`hardpos.eval.evaluator.evaluate_benchmarks` that runs
    on Ray Data. ``model`` is the driver's model (its weights are shipped to the actors);
    ``arch``/``model_cfg`` come from :class:`hardpos.models.clip.LoadedModel`; ``precision`` is
    the actors' (pass the evaluator's). Ray must be initialised."""
    check_precision(precision)
    cfg = cfg or RayDataConfig()
    state = {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}
    state_box = [ray.put(state)]  # boxed: Ray must not resolve it before the actor asks
    quick = bool(model_cfg.get("quick_gelu", False))

    def encode(keys: Sequence[tuple]) -> tuple[np.ndarray, dict[int, str]]:
        if not keys:
            return np.zeros((0, 1), dtype=np.float32), {}
        rows = [{"idx": i, "image": k[0], "crop": list(k[1]) if k[1] is not None else []} for i, k in enumerate(keys)]
        ds = ray.data.from_items(rows).map_batches(
            _ImageEncoderActor,
            fn_constructor_kwargs={"arch": arch, "quick_gelu": quick, "state_box": state_box, "device": device,
                                   "precision": precision},
            batch_size=cfg.batch_size, concurrency=cfg.concurrency, num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus,
            batch_format="numpy",
        )
        feats: np.ndarray | None = None
        failures: dict[int, str] = {}
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            f = np.stack(batch["feature"]) if batch["feature"].dtype == object else batch["feature"]
            if feats is None:
                feats = np.zeros((len(keys), f.shape[1]), dtype=np.float32)
            for i, vec, err in zip(batch["idx"], f, batch["error"]):
                if err:
                    failures[int(i)] = str(err)
                else:
                    feats[int(i)] = vec
        assert feats is not None
        return feats, failures

    return encode
