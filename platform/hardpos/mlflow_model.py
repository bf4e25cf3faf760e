"""A HardPos checkpoint as an MLflow model (what `evaluate`, the registry and Serve load).

Why ``mlflow.pyfunc`` with the checkpoint folder as an artifact, not ``mlflow.pytorch``:

* MLflow 3's ``mlflow.pytorch.log_model`` defaults to ``torch.export`` (``pt2``), which
  needs an input example and freezes the graph; a CLIP scorer takes images *and*
  variable-length text, and every HardPos consumer wants the open_clip model back (for
  batch-length text encoding, evaluation, further finetuning), not an exported graph.
* The legacy pickle format would make loading a registered model execute pickled code.
  Here the weights stay in the open_clip local-dir format (``open_clip_config.json`` +
  ``open_clip_model.safetensors`` + ``hardpos.json``: no pickle), stored as the pyfunc
  artifact ``checkpoint``; ``hardpos.model.load_model(ModelConfig(pretrained=
  "models:/name@alias" | "runs:/<id>/model"), tracking_uri=STORE)`` downloads the model
  from that store and finds ``open_clip_config.json`` below it.
* The pyfunc itself is logged "from code" (``hardpos/train/pyfunc_model.py``), so the
  MLmodel holds no cloudpickled Python object either.

``mlflow.pyfunc.load_model(uri).predict(df)`` scores (image, caption) pairs:
``df`` has columns ``image`` (local path or s3:// URI) and ``caption``; the result has a
``score`` column (cosine similarity) and ``error`` ("" or why an image failed).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ARTIFACT_PATH = "model"
PIP_REQUIREMENTS = ("torch", "torchvision", "open_clip_torch", "safetensors", "pillow", "pandas")



def _pyfunc_class():
    import mlflow.pyfunc

    class HardPosModel(mlflow.pyfunc.PythonModel):
        """Scores (image, caption) pairs with a HardPos/open_clip checkpoint."""

        def load_context(self, context) -> None:
            from hardpos.model import ModelConfig, load_model

            self.loaded = load_model(ModelConfig(pretrained=context.artifacts["checkpoint"]))
            self.loaded.model.eval()

        def predict(self, context, model_input, params=None):
            import pandas as pd
            import torch

            from hardpos.model import encode_image, encode_text, tokenize
            from hardpos.train.data import load_image

            df = pd.DataFrame(model_input)
            missing = [c for c in ("image", "caption") if c not in df.columns]
            if missing:
                raise ValueError(f"predict: input lacks column(s) {missing}; needs image and caption")
            lm = self.loaded
            scores, errors = [float("nan")] * len(df), [""] * len(df)
            pixels, rows = [], []
            for i, uri in enumerate(df["image"]):
                try:
                    pixels.append(lm.preprocess_val(load_image(str(uri))))
                    rows.append(i)
                except Exception as exc:  # noqa: BLE001 - per-row reject, never a crash
                    errors[i] = f"{type(exc).__name__}: {exc}"[:300]
            if rows:
                with torch.no_grad():
                    img = encode_image(lm.model, torch.stack(pixels))
                    txt = encode_text(lm.model, tokenize(lm.tokenizer, [str(df["caption"].iloc[i]) for i in rows]))
                    for j, s in zip(rows, (img * txt).sum(-1).tolist()):
                        scores[j] = s
            return pd.DataFrame({"score": scores, "error": errors})

    return HardPosModel


def log_model(run: Any, checkpoint_dir: str | os.PathLike, tracking_uri: str | None = None) -> str:
    """Log ``checkpoint_dir`` as the MLflow model ``model`` of a run; returns ``runs:/<id>/model``.

    ``run`` is a :class:`hardpos.tracking.RunLogger` or a run id (then ``tracking_uri``, or
    the default resolution, names the store). The run's status is left as it was (MLflow's
    fluent API would otherwise mark it FINISHED), so this is safe inside a running stage.
    ``mlflow.register_model(uri, name)`` works on the returned URI.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    from hardpos import tracking
    from hardpos.model import CONFIG_NAME

    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{checkpoint_dir}: not a checkpoint folder (no {CONFIG_NAME})")
    run_id = run if isinstance(run, str) else run.run_id
    uri = tracking_uri or (None if isinstance(run, str) else run.tracking_uri)
    uri = tracking.resolve_tracking_uri(uri)
    client = MlflowClient(uri)
    status = client.get_run(run_id).info.status
    code = Path(__file__).parent / "train" / "pyfunc_model.py"
    # log_model works on MLflow's global "active run": point the global tracking URI at this
    # run's store only for the call.
    with tracking.use_tracking_uri(uri), mlflow.start_run(run_id=run_id):
        mlflow.pyfunc.log_model(
            name=ARTIFACT_PATH,
            python_model=str(code),
            artifacts={"checkpoint": str(checkpoint_dir)},
            pip_requirements=list(PIP_REQUIREMENTS),  # explicit: inference would load the model
        )
    if status == "RUNNING":
        client.update_run(run_id, status="RUNNING")
    return f"runs:/{run_id}/{ARTIFACT_PATH}"
