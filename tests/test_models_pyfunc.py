"""A logged HardPos model travels: it loads and predicts in a process where HardPos is not
installed, importing only what its logged requirements install, and carries a signature."""
from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import mlflow
import pytest
import torch
from packaging.markers import default_environment
from packaging.requirements import Requirement
from PIL import Image

from hardpos import tracking
from hardpos.config import ModelConfig, TrackingConfig
from hardpos.models.clip import encode_image, encode_text, load_model, save_checkpoint, tokenize
from hardpos.models.pyfunc import PIP_REQUIREMENTS, log_model

# Loads the model with the HardPos install taken off sys.path, predicts, and reports what it
# imported. Runs in a fresh interpreter: nothing of the test process leaks in.
FRESH_LOAD = r"""
import importlib.util, json, sys
sys.path = [p for p in sys.path if not p.rstrip("/").endswith("/platform")]
assert importlib.util.find_spec("hardpos") is None, "hardpos is still importable"
import mlflow.pyfunc, pandas as pd
model_dir, image = sys.argv[1], sys.argv[2]
model = mlflow.pyfunc.load_model(model_dir)
out = model.predict(pd.DataFrame({"image": [image, image, image + ".gone"],
                                  "caption": ["a red square", "a blue circle", "a red square"]}))
import hardpos
print(json.dumps({"hardpos": hardpos.__file__, "score": out["score"].tolist(), "error": out["error"].tolist(),
                  "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


# Imported when present, skipped when not (so not a requirement): starlette, under mlflow's
# gateway modules, tries python_multipart for form parsing.
OPTIONAL_IMPORTS = {"python_multipart", "multipart"}


def requirement_closure(names) -> set[str]:
    """Canonical names of ``names`` and every distribution they require (markers evaluated)."""
    env = dict(default_environment(), extra="")
    seen, todo = set(), [Requirement(n).name for n in names]
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for raw in metadata.requires(name) or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(req.name)
    return seen


def test_logged_model_loads_and_predicts_without_hardpos_installed(tmp_path, tracking_uri):
    torch.manual_seed(3)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    ckpt = save_checkpoint(lm.model, lm.model_cfg, tmp_path / "ckpt", {"arch": lm.arch})
    run = tracking.start_run(TrackingConfig(tracking_uri=tracking_uri, experiment="t-travel"), "t")
    uri = log_model(run, ckpt)
    tracking.end_run(run)

    # The model folder as a user would copy it elsewhere (no store, no HardPos checkout).
    model_dir = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "copied"),
                                                         tracking_uri=tracking_uri))
    info = mlflow.models.get_model_info(str(model_dir))
    assert [c["name"] for c in info.signature.inputs.to_dict()] == ["image", "caption"]
    assert [(c["name"], c["type"]) for c in info.signature.outputs.to_dict()] == [("score", "double"), ("error", "string")]
    assert (model_dir / "input_example.json").is_file()
    requirements = (model_dir / "requirements.txt").read_text().split()
    assert all("==" in r for r in requirements if not r.startswith("mlflow")), requirements  # pinned
    assert (model_dir / "code" / "hardpos" / "models" / "clip.py").is_file()
    # only the product travels: the package as installed, without byte-code caches
    code = model_dir / "code"
    assert sorted(p.name for p in code.iterdir()) == ["hardpos"]
    assert not list(code.rglob("__pycache__")) and not list(code.rglob("*.pyc"))
    assert (model_dir / "code" / "hardpos" / "resources" / "model_configs").is_dir()

    image = tmp_path / "red.png"
    Image.new("RGB", (32, 32), (200, 20, 20)).save(image)
    proc = subprocess.run([sys.executable, "-c", FRESH_LOAD, str(model_dir), str(image)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])

    assert Path(got["hardpos"]).resolve().is_relative_to(model_dir.resolve())  # the carried code ran
    assert got["error"][:2] == ["", ""] and "gone" in got["error"][2]
    with torch.no_grad():
        img = encode_image(lm.model.eval(), lm.preprocess_val(Image.open(image).convert("RGB"))[None])
        txt = encode_text(lm.model, tokenize(lm.tokenizer, ["a red square", "a blue circle"]))
    assert got["score"][:2] == pytest.approx((txt @ img[0]).tolist(), abs=1e-5)

    # Everything third-party the load imported is installed by the logged requirements.
    installable = requirement_closure(PIP_REQUIREMENTS)
    dists = metadata.packages_distributions()
    # A module name can belong to several distributions (namespaces such as google.*): one of
    # them being installed is enough.
    missing = {m: dists[m] for m in got["modules"] if m in dists and m not in sys.stdlib_module_names
               and "hardpos" not in dists[m] and m not in OPTIONAL_IMPORTS
               and not {d.lower().replace("_", "-") for d in dists[m]} & installable}
    assert missing == {}, f"imported, but the logged requirements do not install: {missing}"
