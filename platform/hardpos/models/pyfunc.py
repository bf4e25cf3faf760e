"""A HardPos checkpoint as an MLflow model (what `evaluate`, the registry and Serve load).

Why ``mlflow.pyfunc`` with the checkpoint folder as an artifact, not ``mlflow.pytorch``:

* MLflow 3's ``mlflow.pytorch.log_model`` defaults to ``torch.export`` (``pt2``), which
  needs an input example and freezes the graph; a CLIP scorer takes images *and*
  variable-length text, and every HardPos consumer wants the open_clip model back (for
  batch-length text encoding, evaluation, further finetuning), not an exported graph.
* The legacy pickle format would make loading a registered model execute pickled code.
  Here the weights stay in the open_clip local-dir format (``open_clip_config.json`` +
  ``open_clip_model.safetensors`` + ``hardpos.json``: no pickle), stored as the pyfunc
  artifact ``checkpoint``; ``hardpos.models.clip.load_model(ModelConfig(pretrained=
  "models:/name@alias" | "runs:/<id>/model"), tracking_uri=STORE)`` downloads the model
  from that store and finds ``open_clip_config.json`` below it.
* The pyfunc itself is logged "from code" (``hardpos/models/pyfunc_entry.py``), so the
  MLmodel holds no cloudpickled Python object either.

``mlflow.pyfunc.load_model(uri).predict(df)`` scores (image, caption) pairs:
``df`` has columns ``image`` (local path or s3:// URI) and ``caption``; the result has a
``score`` column (cosine similarity) and ``error`` ("" or why an image failed).

A logged model travels: it carries a signature (those columns and types) and an input
example, the HardPos package itself as ``code_paths`` (MLflow puts it on ``sys.path`` at
load, so a fresh environment needs no HardPos install), and pip requirements pinned to the
versions it was logged with (:func:`pip_requirements`), so ``mlflow models serve`` or
``mlflow.pyfunc.load_model`` in a new virtual environment installs what loading imports.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.tracking import MlflowClient
from mlflow.types import ColSpec, Schema

from hardpos.config import ModelConfig
from hardpos.config.paths import resolve_tracking_uri
from hardpos.data.images import load_image
from hardpos.models.clip import encode_image, encode_text, load_model, tokenize
from hardpos.models.source import CONFIG_NAME
from hardpos.models.uri import use_tracking_uri

ARTIFACT_PATH = "model"
# What loading and predicting import (the model code is carried by code_paths, not pip):
# the scorer (torch, open_clip and its image transforms), checkpoint I/O, image reading
# (local or s3://) and the HardPos modules' own top-level imports. tests/test_models_clip.py checks
# that a load + predict in a fresh process imports nothing these do not install.
PIP_REQUIREMENTS = ("torch", "torchvision", "open_clip_torch", "safetensors", "pillow", "pandas", "numpy",
                    "pyarrow", "pyyaml", "requests", "boto3", "mlflow")
INPUT_EXAMPLE = {"image": ["images/0001.png"], "caption": ["a red circle to the left of a blue square"]}


def pip_requirements(names: tuple[str, ...] = PIP_REQUIREMENTS) -> list[str]:
    """``name==<installed version>`` for each distribution (unpinned when not installed).

    Pinned because a model's weights are only as reproducible as the code that reads them: a
    later open_clip or torch may change preprocessing or numerics.
    """
    out = []
    for name in names:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def signature():
    """The pyfunc's signature: (image: str, caption: str) -> (score: double, error: str)."""
    return ModelSignature(inputs=Schema([ColSpec("string", "image"), ColSpec("string", "caption")]),
                          outputs=Schema([ColSpec("double", "score"), ColSpec("string", "error")]))


class HardPosModel(mlflow.pyfunc.PythonModel):
    """Scores (image, caption) pairs with a HardPos/open_clip checkpoint."""

    def load_context(self, context) -> None:
        self.loaded = load_model(ModelConfig(pretrained=context.artifacts["checkpoint"]))
        self.loaded.model.eval()

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        # Annotated: an unannotated predict makes MLflow warn on every import of this module.
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


#: Parts of the package a logged model does not carry: byte-code caches. (The measuring tools
#: and test helpers are not in the package: they live in the repository's benchmarks/ and
#: tests/support/.)
NOT_SHIPPED = ("__pycache__", "*.pyc")


def product_code(dest: Path) -> Path:
    """A copy of the HardPos package under ``dest`` without :data:`NOT_SHIPPED`; returns it."""
    package = Path(__file__).resolve().parents[1]
    out = dest / package.name
    shutil.copytree(package, out, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    return out


def log_model(run: Any, checkpoint_dir: str | os.PathLike, tracking_uri: str | None = None) -> str:
    """Log ``checkpoint_dir`` as the MLflow model ``model`` of a run; returns ``runs:/<id>/model``.

    ``run`` is a :class:`hardpos.tracking.RunLogger` or a run id (then ``tracking_uri``, or
    the default resolution, names the store). The run's status is left as it was (MLflow's
    fluent API would otherwise mark it FINISHED), so this is safe inside a running stage.
    ``mlflow.register_model(uri, name)`` works on the returned URI.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"{checkpoint_dir}: not a checkpoint folder (no {CONFIG_NAME})")
    run_id = run if isinstance(run, str) else run.run_id
    uri = tracking_uri or (None if isinstance(run, str) else run.tracking_uri)
    uri = resolve_tracking_uri(uri)
    client = MlflowClient(uri)
    status = client.get_run(run_id).info.status
    code = Path(__file__).resolve().parent / "pyfunc_entry.py"
    # log_model works on MLflow's global "active run": point the global tracking URI at this
    # run's store only for the call.
    with tempfile.TemporaryDirectory(prefix="hardpos-code-") as tmp, \
            use_tracking_uri(uri), mlflow.start_run(run_id=run_id):
        mlflow.pyfunc.log_model(
            name=ARTIFACT_PATH,
            python_model=str(code),
            artifacts={"checkpoint": str(checkpoint_dir)},
            code_paths=[str(product_code(Path(tmp)))],  # the model carries the HardPos code it imports
            # explicit: MLflow's inference would load the model (slow) and miss lazy imports
            pip_requirements=pip_requirements(),
            signature=signature(),
            # a missing image is a per-row "error", so MLflow's check of the example never crashes
            input_example=pd.DataFrame(INPUT_EXAMPLE),
        )
    if status == "RUNNING":
        client.update_run(run_id, status="RUNNING")
    return f"runs:/{run_id}/{ARTIFACT_PATH}"
