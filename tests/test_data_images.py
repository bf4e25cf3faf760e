"""One triplet file whose images are http:// URLs on a real server (127.0.0.1): it trains
(the train stage on Ray Train workers) and it evaluates (the evaluate stage) with every
image found. The package has one image resolver (URIs with a scheme are left as they are)
and one loader (local, s3://, http(s)://) for training, evaluation and retention alike."""
from __future__ import annotations

import functools
import http.server
import io
import threading

import pytest
from PIL import Image

from hardpos import runtime
from hardpos.config import load_config
from hardpos.data.images import load_image
from hardpos.data.triplets import resolve_image, write_triplets
from hardpos.stages import evaluate
from hardpos.train.config import TrainConfig
from tests.support import free_port

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}


@pytest.fixture
def image_server(tmp_path):
    """The colour squares served over HTTP; yields (base URL, paths requested)."""
    folder = tmp_path / "served"
    folder.mkdir()
    for name, rgb in COLOURS.items():
        img = Image.new("RGB", (40, 40), (250, 250, 250))
        img.paste(rgb, (8, 8, 32, 32))
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        (folder / f"{name}.png").write_bytes(buf.getvalue())
    seen: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            seen.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), functools.partial(Handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


def _triplets(base: str, path, n: int = 24) -> str:
    names = list(COLOURS)
    rows = [{"image": f"{base}/{names[i % 4]}.png", "caption": f"a {names[i % 4]} square",
             "hard_negative": f"a {names[(i + 1) % 4]} square", "hard_positive": f"a square that is {names[i % 4]}",
             "kind": "replace", "source": "test", "caption_id": str(i)} for i in range(n)]
    return write_triplets(rows, str(path))


def test_uris_with_a_scheme_are_left_alone_and_load(image_server, tmp_path):
    base, _ = image_server
    assert resolve_image(f"{base}/red.png", "/some/folder") == f"{base}/red.png"
    assert resolve_image("red.png", "/x", image_root=f"{base}/") == f"{base}/red.png"
    assert resolve_image("../red.png", f"{base}/sub") == f"{base}/red.png"
    img = load_image(f"{base}/red.png", crop=(8, 8, 10, 10))
    assert img.size == (10, 10) and img.getpixel((2, 2)) == COLOURS["red"]
    with pytest.raises(FileNotFoundError, match="404"):
        load_image(f"{base}/absent.png")


def test_a_triplet_file_of_http_images_trains_and_evaluates(ray_session, image_server, tmp_path, tracking_uri):
    base, seen = image_server
    path = _triplets(base, tmp_path / "data" / "triplets.parquet")
    cfg = load_config(TrainConfig, None, [
        "model.arch=hardpos-tiny", "batch_size=4", "max_steps=3", "scaling.num_workers=2", "data.val_fraction=0",
        "data.shuffle_buffer=0", "epochs=1", f"data.train_path={path}", f"output_dir={tmp_path / 'train'}",
        "tracking.experiment=http-images"])
    trained = runtime.execute("train", cfg, quiet=True)
    assert trained["status"] == "ok" and trained["steps"] == 3 and trained["train_rows"] == 24
    assert {p for p in seen} == {f"/{c}.png" for c in COLOURS}  # the workers fetched over HTTP

    ecfg = load_config(evaluate.Config, None, [
        "model.arch=hardpos-tiny", f"model.pretrained={trained['checkpoint']}", f"output_dir={tmp_path / 'eval'}",
        f"benchmarks=[{{name: web, kind: triplets, path: '{path}'}}]",
        "tracking.experiment=http-images"])
    report = runtime.execute("evaluate", ecfg, quiet=True)
    bench = report["benchmarks"]["web"]
    assert bench["n_items"] == 24 and bench["n_missing_images"] == 0 and bench["n_excluded_items"] == 0
    assert 0.0 <= report["metrics"]["web/orig_acc"] <= 1.0
