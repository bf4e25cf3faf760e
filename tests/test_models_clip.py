"""hardpos.models.clip (the one loader/encoder) and hardpos.models.pyfunc (the logged model)."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from hardpos.config import ConfigError, ModelConfig
from hardpos.models import weights
from hardpos.models.clip import encode_text, load_model, save_checkpoint, tokenize, trim_tokens
from hardpos.models.source import CONFIG_NAME

CAPTIONS = ["a red circle to the left of a blue square", "a dog", "two crimson triangles above a small green circle"]


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("arch", ["hardpos-tiny", "ViT-B-32"])
def test_batch_length_text_encoding_equals_full_context(arch):
    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch=arch))
    model = lm.model.eval()
    full = lm.tokenizer(CAPTIONS)  # padded to the context length (77 for ViT-B-32)
    trimmed = tokenize(lm.tokenizer, CAPTIONS)
    assert full.shape[1] == lm.context_length and trimmed.shape[1] < 16
    with torch.no_grad():
        ref = model.encode_text(full, normalize=True)
        ours = encode_text(model, trimmed)
    assert (ours - ref).abs().max().item() <= 1e-6


def test_trim_tokens_keeps_the_longest_sequence():
    tokens = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 0, 0, 0]])
    assert trim_tokens(tokens).tolist() == [[5, 6, 7], [5, 6, 0]]


def test_checkpoint_roundtrip_local_and_s3(tmp_path, s3_env):
    from hardpos import storage

    torch.manual_seed(1)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    ckpt = save_checkpoint(lm.model, lm.model_cfg, tmp_path / "ckpt", {"arch": lm.arch, "note": "x"})
    assert {p.name for p in ckpt.iterdir()} == {"open_clip_config.json", "open_clip_model.safetensors", "hardpos.json"}
    local = load_model(ModelConfig(pretrained=str(ckpt)))
    assert _same_state(local.model, lm.model) and local.meta["note"] == "x" and local.arch == "hardpos-tiny"
    uri = f"s3://{s3_env}/models/tiny"
    storage.upload_dir(ckpt, uri)
    remote = load_model(ModelConfig(pretrained=uri))
    assert _same_state(remote.model, lm.model) and remote.meta["note"] == "x"
    # Plain open_clip loads the same folder too (open_clip's local-dir format).
    import open_clip

    plain = open_clip.create_model(f"local-dir:{ckpt}")
    assert _same_state(plain, lm.model)


def test_quick_gelu_is_automatic_for_openai_weights(monkeypatch):
    import open_clip

    calls = []
    real = open_clip.create_model_and_transforms

    def fake(arch, pretrained=None, force_quick_gelu=False, **kwargs):
        calls.append((arch, pretrained, force_quick_gelu))
        return real("hardpos-tiny", force_quick_gelu=force_quick_gelu)

    monkeypatch.setattr(open_clip, "create_model_and_transforms", fake)
    monkeypatch.setattr(weights, "hub_offline", lambda: False)  # the weights are faked, not fetched
    lm = load_model(ModelConfig(arch="ViT-B-32", pretrained="openai"))  # no download: faked
    assert calls[-1] == ("ViT-B-32", "openai", True) and lm.model_cfg.get("quick_gelu") is True
    load_model(ModelConfig(arch="ViT-B-32-quickgelu", pretrained="openai"))
    assert calls[-1] == ("ViT-B-32-quickgelu", "openai", False)  # the arch already has it
    load_model(ModelConfig(arch="ViT-B-32", pretrained="laion2b_s34b_b79k"))
    assert calls[-1][2] is False
    load_model(ModelConfig(arch="ViT-B-32", pretrained="laion2b_s34b_b79k", force_quick_gelu=True))
    assert calls[-1][2] is True


def test_saved_quick_gelu_survives_reload(tmp_path):
    from open_clip.transformer import QuickGELU

    lm = load_model(ModelConfig(arch="hardpos-tiny", force_quick_gelu=True))
    assert any(isinstance(m, QuickGELU) for m in lm.model.modules())
    ckpt = save_checkpoint(lm.model, lm.model_cfg, tmp_path / "q")
    assert json.loads((ckpt / CONFIG_NAME).read_text())["model_cfg"]["quick_gelu"] is True
    again = load_model(ModelConfig(pretrained=str(ckpt)))
    assert any(isinstance(m, QuickGELU) for m in again.model.modules())


def test_missing_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="model checkpoint not found"):
        load_model(ModelConfig(pretrained=str(tmp_path / "nope" / "model.safetensors")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="without open_clip_config.json"):
        load_model(ModelConfig(pretrained=str(tmp_path / "empty")))


# --------------------------------------------------------------------------- MLflow model
def test_mlflow_model_roundtrip_runs_registry_and_pyfunc(tmp_path, tracking_uri, monkeypatch):
    import mlflow
    import pandas as pd
    from mlflow.tracking import MlflowClient
    from PIL import Image

    from hardpos import tracking
    from hardpos.config import TrackingConfig
    from hardpos.models.pyfunc import log_model

    torch.manual_seed(2)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    ckpt = save_checkpoint(lm.model, lm.model_cfg, tmp_path / "ckpt", {"arch": lm.arch, "step": 7})
    run = tracking.start_run(TrackingConfig(tracking_uri=tracking_uri, experiment="t-model"), "t")
    uri = log_model(run, ckpt)
    assert uri == f"runs:/{run.run_id}/model"
    client = MlflowClient(tracking_uri)
    assert client.get_run(run.run_id).info.status == "RUNNING"  # untouched by log_model

    from_run = load_model(ModelConfig(pretrained=uri))
    assert _same_state(from_run.model, lm.model) and from_run.meta["step"] == 7

    mlflow.set_tracking_uri(tracking_uri)
    version = mlflow.register_model(uri, "hardpos-test")
    client.set_registered_model_alias("hardpos-test", "champion", version.version)
    champion = load_model(ModelConfig(pretrained="models:/hardpos-test@champion"))
    assert _same_state(champion.model, lm.model)

    # The pyfunc scores (image, caption) pairs; a missing image is a per-row reject.
    Image.new("RGB", (32, 32), (200, 20, 20)).save(tmp_path / "red.png")
    # Loading prepends the model's carried code to sys.path: keep it from leaking into later tests.
    monkeypatch.setattr(sys, "path", list(sys.path))
    pyfunc = mlflow.pyfunc.load_model(uri)
    df = pd.DataFrame({"image": [str(tmp_path / "red.png"), str(tmp_path / "red.png"), str(tmp_path / "gone.png")],
                       "caption": ["a red square", "a blue circle", "a red square"]})
    out = pyfunc.predict(df)
    assert out["error"].tolist()[:2] == ["", ""] and "gone.png" in out["error"][2]
    with torch.no_grad():
        from hardpos.models.clip import encode_image

        img = encode_image(lm.model.eval(), lm.preprocess_val(Image.open(tmp_path / "red.png").convert("RGB"))[None])
        txt = encode_text(lm.model, tokenize(lm.tokenizer, ["a red square", "a blue circle"]))
    assert out["score"][:2].tolist() == pytest.approx((txt @ img[0]).tolist(), abs=1e-5)
    tracking.end_run(run)


def test_log_model_rejects_a_folder_without_a_checkpoint(tmp_path, tracking_uri):
    from hardpos.models.pyfunc import log_model

    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        log_model("0" * 32, tmp_path, tracking_uri)


# --------------------------------------------------------------------------- hf-hub: sources
def _hub_cache(root, repo: str, ckpt, *, weights: str | None = "open_clip_model.safetensors", rev: str = "a" * 40):
    """A Hugging Face hub cache (the layout huggingface_hub writes) holding ``repo`` at ``rev``."""
    import shutil

    folder = root / f"models--{repo.replace('/', '--')}"
    snap = folder / "snapshots" / rev
    snap.mkdir(parents=True)
    shutil.copy(ckpt / CONFIG_NAME, snap / CONFIG_NAME)
    if weights:
        shutil.copy(ckpt / "open_clip_model.safetensors", snap / weights)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(rev)
    return root


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """HF_HUB_CACHE -> a tmp dir, HF_HUB_OFFLINE=1: any download attempt fails instead of reaching the network."""
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these once at import; point its constants at them too.
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hf_hub_pretrained_and_arch_load_from_a_local_hub_cache(tmp_path, offline_hub):
    torch.manual_seed(3)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    ckpt = save_checkpoint(lm.model, lm.model_cfg, tmp_path / "ckpt")
    _hub_cache(offline_hub, "org/tiny-clip", ckpt)

    hub = load_model(ModelConfig(arch="ViT-B-32", pretrained="hf-hub:org/tiny-clip"))  # arch ignored: the repo's
    assert _same_state(hub.model, lm.model)
    assert hub.arch == "hf-hub:org/tiny-clip" and hub.meta["source"] == "hf-hub:org/tiny-clip"
    assert hub.meta["hub_revision"] == "a" * 40 and hub.model_cfg == lm.model_cfg
    assert tokenize(hub.tokenizer, CAPTIONS).tolist() == tokenize(lm.tokenizer, CAPTIONS).tolist()

    # arch=hf-hub: the repo's architecture with random weights (pretrained None), like any arch.
    torch.manual_seed(4)
    random_arch = load_model(ModelConfig(arch="hf-hub:org/tiny-clip"))
    assert random_arch.model_cfg == lm.model_cfg and random_arch.meta["source"] == "random"
    assert random_arch.model.state_dict().keys() == lm.model.state_dict().keys()
    assert not _same_state(random_arch.model, lm.model)
    # ... or with a weights file's weights.
    from_file = load_model(ModelConfig(arch="hf-hub:org/tiny-clip", pretrained=str(ckpt / "open_clip_model.safetensors")))
    assert _same_state(from_file.model, lm.model)
    # A checkpoint saved from a hub model records the hub name as its arch and reloads.
    again = load_model(ModelConfig(pretrained=str(save_checkpoint(hub.model, hub.model_cfg, tmp_path / "c2", hub.meta))))
    assert again.arch == "hf-hub:org/tiny-clip" and _same_state(again.model, lm.model)


def test_hf_hub_legacy_bin_weights_and_clear_errors(tmp_path, offline_hub):
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    ckpt = save_checkpoint(lm.model, lm.model_cfg, tmp_path / "ckpt")
    # open_clip's older hub uploads carry a torch pickle, open_clip_pytorch_model.bin, and no safetensors.
    _hub_cache(offline_hub, "org/bin-clip", ckpt, weights=None)
    snap = next((offline_hub / "models--org--bin-clip" / "snapshots").iterdir())
    torch.save(lm.model.state_dict(), snap / "open_clip_pytorch_model.bin")
    assert _same_state(load_model(ModelConfig(pretrained="hf-hub:org/bin-clip")).model, lm.model)

    from hardpos.models.clip import HubModelError

    with pytest.raises(HubModelError, match="hf-hub:org/absent.*HF_HUB_OFFLINE"):
        load_model(ModelConfig(pretrained="hf-hub:org/absent"))  # not cached, offline: no download
    _hub_cache(offline_hub, "org/config-only", ckpt, weights=None)
    with pytest.raises(HubModelError, match="weights"):  # never a silent random init
        load_model(ModelConfig(pretrained="hf-hub:org/config-only"))
    with pytest.raises(ValueError, match="expected hf-hub:<org>/<name>"):
        load_model(ModelConfig(pretrained="hf-hub:"))
    with pytest.raises(ValueError, match="open_clip tag"):
        load_model(ModelConfig(arch="hf-hub:org/bin-clip", pretrained="openai"))


def test_weights_that_cannot_be_fetched_fail_at_once_in_one_line(monkeypatch):
    """An open_clip tag whose weights are not cached, on a machine without the Hub: a
    ConfigError with the one line that says what to do, in well under a second (no retries)."""
    # lazy: the timing is this test's alone
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_model(ModelConfig(arch="ViT-B-32", pretrained="openai"))
    assert time.monotonic() - started < 5.0
    assert str(info.value) == (
        "model.pretrained=openai: could not fetch the 'openai' weights of ViT-B-32: no network? pass a local file, "
        "an s3:// checkpoint or an hf-hub: id in a local cache; HF_HUB_OFFLINE=1 makes this fail at once")
