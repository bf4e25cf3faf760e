"""Web-scale inputs: webdataset tar shards and parquet with inline image
bytes, read through real Ray Data for training and evaluation; corrupt samples counted and
skipped; bad sources named before any rows are read; per-row seeded augmentation."""
from __future__ import annotations

import functools
import http.server
import io
import json
import sys
import tarfile
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import torch
from PIL import Image

from hardpos.config import ModelConfig
from hardpos.data.captions import SourceError
from hardpos.data.captions.training import read_rows, resolve_files
from hardpos.models.clip import load_model
from hardpos.train.data import DataError, Preprocess, read_triplets_dataset, row_seed
from tests.support import free_port

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}


def _image_bytes(colour: str, fmt: str = "JPEG", size: int = 40) -> bytes:
    img = Image.new("RGB", (size, size), (250, 250, 250))
    img.paste(COLOURS[colour], (8, 8, size - 8, size - 8))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shard(path: Path, samples: list[dict]) -> Path:
    """A webdataset shard: each sample dict maps member suffix -> bytes (key ``__key__``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for s in samples:
            for suffix, data in s.items():
                if suffix != "__key__":
                    _add(tar, f"{s['__key__']}.{suffix}", data)
    return path


def good_sample(key: str, colour: str, other: str, *, fmt: str = "jpg", with_json: bool = True) -> dict:
    s = {"__key__": key, fmt: _image_bytes(colour, "PNG" if fmt == "png" else "JPEG"), "txt": f"a {colour} square".encode()}
    if with_json:
        s["json"] = json.dumps({"hard_negative": f"a {other} square", "hard_positive": f"a square that is {colour}"}).encode()
    return s


@pytest.fixture(scope="module")
def tiny():
    return load_model(ModelConfig())


@pytest.fixture
def shards(tmp_path):
    """Two shards: 6 good samples (jpg/png, one without json) + 3 corrupt ones."""
    a = write_shard(tmp_path / "wds" / "train-000.tar", [
        good_sample("s000", "red", "blue"), good_sample("s001", "green", "red", fmt="png"),
        {"__key__": "s002", "jpg": b"\xff\xd8 not a jpeg", "txt": b"a broken image",        # corrupt image bytes
         "json": b'{"hard_negative": "a whole image"}'},
        good_sample("s003", "blue", "yellow", with_json=False)])
    b = write_shard(tmp_path / "wds" / "train-001.tar", [
        good_sample("s100", "yellow", "green"),
        {"__key__": "s101", "jpg": _image_bytes("red"), "txt": b"\xff\xfe not utf-8"},      # corrupt caption
        {"__key__": "s102", "jpg": _image_bytes("red"), "txt": b"a red square", "json": b"{not json"},
        good_sample("s103", "green", "blue"), good_sample("s104", "red", "green")])
    return tmp_path / "wds", [a, b]


def _rows(ds) -> dict[str, dict]:
    return {r["image"].rsplit("#", 1)[-1]: r for r in ds.take_all()}


def _preprocess_all(ds, udf, batch_size=4) -> dict[str, dict]:
    """Run ``udf`` through Ray Data over ``ds``; output rows keyed by ``key|caption``."""
    # _WithIds lives in this test module, which Ray's workers cannot import: ship it by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return {row["_id"]: row for row in ds.map_batches(_WithIds(udf), batch_size=batch_size,
                                                      batch_format="numpy").iter_rows()}


class _WithIds:
    """``udf``'s output plus each row's ``key|caption`` (which rows the tensors belong to)."""

    def __init__(self, udf):
        self.udf = udf

    def __call__(self, batch):
        out = self.udf(batch)
        out["_id"] = np.array([f"{k}|{c}" for k, c in zip(batch["key"], batch["caption"])], dtype=object)
        return out


# --------------------------------------------------------------------------- webdataset
def test_webdataset_shards_train_rows_with_corrupt_samples_counted(ray_session, shards, tiny):
    folder, _ = shards
    ds = read_triplets_dataset(str(folder / "train-*.tar"))
    rows = _rows(ds)
    assert len(rows) == 9
    assert rows["s000"]["caption"] == "a red square" and rows["s000"]["hard_negative"] == "a blue square"
    assert rows["s000"]["hard_positive"] == "a square that is red" and rows["s000"]["image_bytes"][:2] == b"\xff\xd8"
    assert rows["s003"]["hard_negative"] is None and rows["s003"]["error"] == ""        # json is optional
    assert "UnicodeDecodeError" in rows["s101"]["error"] and "JSONDecodeError" in rows["s102"]["error"]
    assert rows["s002"]["error"] == ""                                                  # bytes only fail at decode
    assert rows["s000"]["key"].startswith("crc:")                                       # identity = the image bytes

    udf = Preprocess(tiny.preprocess_val, tiny.tokenizer, 32, str(folder))
    out = udf({k: np.array([r[k] for r in rows.values()], dtype=object) for k in rows["s000"]})
    by_key = dict(zip(rows, zip(out["ok"], out["error"])))
    assert sorted(k for k, (ok, _) in by_key.items() if not ok) == ["s002", "s101", "s102"]  # shards may arrive in either order
    assert "train-000.tar#s002" in by_key["s002"][1] and "UnidentifiedImageError" in by_key["s002"][1]
    good = [i for i, k in enumerate(rows) if by_key[k][0]]
    assert out["image"][good].std() > 0 and out["has_neg"].tolist() == [rows[k]["hard_negative"] is not None for k in rows]


def test_webdataset_errors_are_named_before_reading(ray_session, tmp_path):
    with pytest.raises(SourceError, match="the glob matches no files"):
        read_rows(str(tmp_path / "nothing-*.tar"))
    no_txt = write_shard(tmp_path / "bad" / "a.tar", [{"__key__": "k0", "jpg": _image_bytes("red"), "json": b"{}"}])
    with pytest.raises(SourceError, match=r"a\.tar: shard without the caption field.*\['jpg', 'json'\]"):
        read_rows(str(no_txt))
    with pytest.raises(DataError, match="shard without the caption field"):  # the training reader says the same
        read_triplets_dataset(str(tmp_path / "bad"))
    no_img = write_shard(tmp_path / "bad2" / "a.tar", [{"__key__": "k0", "txt": b"a caption"}])
    with pytest.raises(SourceError, match="no image"):
        read_rows(str(no_img))
    (tmp_path / "mix").mkdir()
    pq.write_table(pa.table({"image": ["x.png"], "caption": ["c"]}), tmp_path / "mix" / "a.parquet")
    write_shard(tmp_path / "mix" / "b.tar", [good_sample("k", "red", "blue")])
    with pytest.raises(SourceError, match=r"mixed input layouts: .*a\.parquet is parquet but .*b\.tar is webdataset"):
        read_rows(str(tmp_path / "mix"))


# --------------------------------------------------------------------------- parquet inline
def test_parquet_with_inline_images_and_mixed_schemas(ray_session, tmp_path, tiny):
    caps = ["a red square", "a green square", "a blue square"]
    imgs = [_image_bytes(c) for c in ("red", "green", "blue")]
    folder = tmp_path / "inline"
    folder.mkdir()
    pq.write_table(pa.table({"image_bytes": pa.array(imgs[:2] + [b"garbage"], pa.binary()), "caption": caps,
                             "hard_negative": ["a blue square", None, "a red square"],
                             "hard_positive": [None, "a square that is green", None]}), folder / "part-0.parquet")
    ds, layout = read_rows(str(folder))
    rows = sorted(ds.take_all(), key=lambda r: r["caption"])
    assert layout == "inline" and [r["caption"] for r in rows] == sorted(caps)
    assert rows[1]["image_bytes"] == imgs[1] and rows[1]["hard_positive"] == "a square that is green"
    assert len({r["key"] for r in rows}) == 3 and all(r["key"].startswith("crc:") for r in rows)
    udf = Preprocess(tiny.preprocess_val, tiny.tokenizer, 32, str(folder))
    out = udf({k: np.array([r[k] for r in rows], dtype=object) for k in rows[0]})
    assert out["ok"].tolist() == [False, True, True]          # "a blue square" carries the garbage bytes
    assert "UnidentifiedImageError" in out["error"][0]

    # Hugging Face's {bytes, path} struct column named image is inline too
    hf = tmp_path / "hf.parquet"
    pq.write_table(pa.table({"image": [{"bytes": imgs[0], "path": "red.jpg"}], "caption": [caps[0]]}), hf)
    (row,) = read_rows(str(hf))[0].take_all()
    assert row["image_bytes"] == imgs[0] and row["image"] == "red.jpg" and row["hard_negative"] is None

    pq.write_table(pa.table({"image_bytes": pa.array(imgs[:1], pa.binary()), "caption": [1]}), folder / "part-1.parquet")
    with pytest.raises(SourceError, match=r"mixed schemas: .*part-1\.parquet differs from .*part-0\.parquet in column\(s\)"):
        read_rows(str(folder))
    pq.write_table(pa.table({"image_bytes": pa.array(imgs[:1], pa.binary())}), tmp_path / "nocap.parquet")
    with pytest.raises(SourceError, match=r"lacks column\(s\) \['caption'\]"):
        read_rows(str(tmp_path / "nocap.parquet"))


# --------------------------------------------------------------------------- fetching
def test_images_by_url_are_fetched_concurrently(tmp_path, tiny):
    """Rows naming http:// images: one decode task fetches them over a thread pool."""
    (tmp_path / "img").mkdir()
    for c in COLOURS:
        (tmp_path / "img" / f"{c}.jpg").write_bytes(_image_bytes(c))
    seen: list[str] = []
    in_flight, peak = [0], [0]
    lock = threading.Lock()

    class Slow(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
                seen.append(self.path)
            threading.Event().wait(0.3)
            try:
                super().do_GET()
            finally:
                with lock:
                    in_flight[0] -= 1

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()),
                                             functools.partial(Slow, directory=str(tmp_path / "img")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        names = list(COLOURS) + ["absent"]
        batch = {"image": np.array([f"{base}/{c}.jpg" for c in names], dtype=object),
                 "caption": np.array([f"a {c} square" for c in names], dtype=object),
                 "hard_negative": np.array([None] * 5, dtype=object), "hard_positive": np.array([None] * 5, dtype=object)}
        out = Preprocess(tiny.preprocess_val, tiny.tokenizer, 32, str(tmp_path), fetch_threads=8)(batch)
    finally:
        server.shutdown()
    assert out["ok"].tolist() == [True] * 4 + [False] and "404" in out["error"][4]
    assert sorted(seen) == sorted(f"/{c}.jpg" for c in names)
    assert peak[0] >= 3  # the GETs overlapped (each takes 0.3 s server-side)


# --------------------------------------------------------------------------- seeded augmentation
def test_augmentation_is_seeded_per_row_independent_of_batching(ray_session, shards, tiny):
    folder, _ = shards
    ds = read_triplets_dataset(str(folder)).filter(lambda r: r["error"] == "" and r["key"] != "")
    aug = tiny.preprocess_train  # RandomResizedCrop: draws from the global generators per call

    def run(seed, batch_size):
        out = _preprocess_all(ds, Preprocess(aug, tiny.tokenizer, 32, str(folder), seed=seed), batch_size=batch_size)
        return {k: torch.as_tensor(v["image"]) for k, v in out.items() if v["ok"]}

    a, b, c = run(7, 4), run(7, 3), run(8, 4)
    assert len(a) == 5 and a.keys() == b.keys() == c.keys()  # s000 and s104 are the same image and caption
    assert all(torch.equal(a[k], b[k]) for k in a)             # same seed, different blocks/batches: same tensors
    assert sum(not torch.equal(a[k], c[k]) for k in a) >= 4    # another seed: other crops
    assert row_seed(7, 0, "k", "c") == row_seed(7, 0, "k", "c") != row_seed(7, 1, "k", "c")


def test_resolve_files_forms(tmp_path):
    write_shard(tmp_path / "s" / "a.tar", [good_sample("k", "red", "blue")])
    write_shard(tmp_path / "s" / "b.tar", [good_sample("k", "red", "blue")])
    assert [Path(p).name for p in resolve_files(str(tmp_path / "s"))] == ["a.tar", "b.tar"]
    assert [Path(p).name for p in resolve_files(str(tmp_path / "s" / "b*.tar"))] == ["b.tar"]
    with pytest.raises(SourceError, match="training data not found"):
        resolve_files(str(tmp_path / "absent.tar"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="holds no .parquet, .jsonl or .tar files"):
        resolve_files(str(tmp_path / "empty"))


# --------------------------------------------------------------------------- evaluation
def test_triplets_benchmark_from_shards_scores_like_image_files(ray_session, shards, tmp_path, tiny, caplog):
    """kind=triplets on webdataset shards: same scores as the same images as files; corrupt
    samples rejected with their reason, undecodable bytes reported as corrupt images;
    throughput logged on the hardpos.eval logger."""
    from hardpos.data.triplets import write_triplets
    from hardpos.eval.evaluator import evaluate_benchmarks
    from hardpos.eval.spec import BenchmarkSpec

    folder, _ = shards
    spec = BenchmarkSpec("wds", "triplets", str(folder / "*.tar"), cache_dir=str(tmp_path / "cache"))
    with caplog.at_level("INFO", logger="hardpos.eval"):
        res = evaluate_benchmarks(tiny.model, tiny.preprocess_val, tiny.tokenizer, [spec]).results[0]
    # rows in file order: s000 s001 s002(bad bytes) s003(no json -> no negative) s100 s101(bad txt) s102(bad json) s103 s104
    assert [r["row"] for r in res.rejected_rows] == [3, 5, 6]
    assert res.rejected_rows[0]["reason"] == "no_negative" and "UnicodeDecodeError" in res.rejected_rows[1]["reason"]
    assert res.excluded_items == ["2"] and len(res.missing_images) == 1 and "corrupt" in res.missing_images[0]["error"]
    assert res.item_ids == ["0", "1", "4", "7", "8"]
    assert any("wds: 6 items in" in m and "items/s" in m for m in caplog.messages)

    # The same samples as image files + a triplet file: identical scores.
    rows = []
    for key, colour, other in (("s000", "red", "blue"), ("s001", "green", "red"), ("s100", "yellow", "green"),
                               ("s103", "green", "blue"), ("s104", "red", "green")):
        fmt = "png" if key == "s001" else "jpg"
        (tmp_path / "files").mkdir(exist_ok=True)
        (tmp_path / "files" / f"{key}.{fmt}").write_bytes(_image_bytes(colour, "PNG" if fmt == "png" else "JPEG"))
        rows.append({"image": f"{key}.{fmt}", "caption": f"a {colour} square", "hard_negative": f"a {other} square",
                     "hard_positive": f"a square that is {colour}", "kind": None, "source": "test", "caption_id": key})
    write_triplets(rows, str(tmp_path / "files" / "bench.parquet"))
    ref = evaluate_benchmarks(tiny.model, tiny.preprocess_val, tiny.tokenizer,
                              [BenchmarkSpec("files", "triplets", str(tmp_path / "files" / "bench.parquet"))]).results[0]
    np.testing.assert_allclose(res.s_c, ref.s_c, rtol=0, atol=1e-6)
    np.testing.assert_allclose(res.s_n, ref.s_n, rtol=0, atol=1e-6)
    np.testing.assert_allclose(res.s_p, ref.s_p, rtol=0, atol=1e-6)
    assert len(list((tmp_path / "cache").iterdir())) == 6  # one file per distinct image (s000 and s104: same bytes)


def test_build_datasets_streams_shards_and_splits_by_image(ray_session, shards, tiny):
    """The training driver's datasets from shards: every sample on exactly one side of the
    split, corrupt ones reaching the worker as ok=False rows (counted there)."""
    from hardpos.train.config import DataConfig
    from hardpos.train.data import build_datasets

    folder, _ = shards
    cfg = DataConfig(train_path=str(folder / "train-*.tar"), val_fraction=0.3, shuffle_buffer=0)
    ds = build_datasets(cfg, tiny.preprocess_train, tiny.preprocess_val, tiny.tokenizer, 32, batch_size=4, seed=3)
    assert ds.train_rows + ds.val_rows == 9 and ds.train_rows > 0
    ok = errors = 0
    for part in (ds.train, ds.val):
        for batch in (part.iter_batches(batch_size=None, batch_format="numpy") if part is not None else ()):
            ok += int(batch["ok"].sum())
            errors += int((~batch["ok"]).sum())
    assert (ok, errors) == (6, 3)
