"""The storage layer against a real S3 endpoint (moto's server on 127.0.0.1) and local disk."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hardpos import storage


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_roundtrip_list_and_dirs(kind, tmp_path, request):
    if kind == "s3":
        bucket = request.getfixturevalue("s3_env")
        base = f"s3://{bucket}/run1"
    else:
        base = str(tmp_path / "run1")
    storage.write_json(storage.join(base, "summary.json"), {"a": 1})
    storage.write_bytes(storage.join(base, "shards", "part-0.bin"), b"\x00\x01")
    assert storage.read_json(storage.join(base, "summary.json")) == {"a": 1}
    assert storage.read_bytes(storage.join(base, "shards/part-0.bin")) == b"\x00\x01"
    assert storage.exists(storage.join(base, "summary.json"))
    assert not storage.exists(storage.join(base, "nope.json"))
    assert [u.rsplit("/", 1)[-1] for u in storage.list_files(base)] == ["part-0.bin", "summary.json"]
    assert list(storage.list_files(base, suffix=".json")) == [storage.join(base, "summary.json")]
    with pytest.raises(FileNotFoundError, match="nope.json"):
        storage.read_bytes(storage.join(base, "nope.json"))
    assert storage.read_head(storage.join(base, "summary.json"), 4) == b'{\n  '
    storage.delete(storage.join(base, "shards/part-0.bin"))
    storage.delete(storage.join(base, "shards/part-0.bin"))  # a missing file is no error
    assert not storage.exists(storage.join(base, "shards/part-0.bin"))
    storage.write_bytes(storage.join(base, "shards", "part-0.bin"), b"\x00\x01")

    local = tmp_path / "up"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "w.txt").write_text("weights")
    storage.upload_dir(local, storage.join(base, "ckpt"))
    back = storage.download_dir(storage.join(base, "ckpt"), tmp_path / "down")
    assert (back / "sub" / "w.txt").read_text() == "weights"
    assert storage.local_copy(storage.join(base, "ckpt", "sub", "w.txt"), tmp_path / "cache").read_text() == "weights"


def test_missing_bucket_is_a_clear_error(s3_env):
    with pytest.raises(storage.StorageError, match="bucket does not exist"):
        storage.read_bytes("s3://no-such-bucket-hardpos/x.json")


def test_arrow_filesystem_reads_what_the_storage_layer_wrote(s3_env, tmp_path):
    table = pa.table({"caption": ["a red circle", "a blue square"], "n": [1, 2]})
    pq.write_table(table, tmp_path / "t.parquet")
    storage.write_bytes(f"s3://{s3_env}/data/t.parquet", (tmp_path / "t.parquet").read_bytes())
    fs, path = storage.arrow_filesystem(f"s3://{s3_env}/data/t.parquet")
    assert path == f"{s3_env}/data/t.parquet"
    assert pq.read_table(path, filesystem=fs).to_pylist() == table.to_pylist()


def test_non_utf8_text_is_a_clear_error(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"caption \xff\xfe")
    with pytest.raises(storage.StorageError, match="not valid utf-8"):
        storage.read_text(tmp_path / "bad.txt")


def test_join_and_split():
    assert storage.join("s3://b/p/", "a", "/c.json") == "s3://b/p/a/c.json"
    assert storage.split_s3("s3://b/p/a") == ("b", "p/a")
    with pytest.raises(storage.StorageError):
        storage.split_s3("/local/path")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_expand_reads_a_file_a_folder_and_a_glob_the_same_way_everywhere(kind, tmp_path, request):
    root = str(tmp_path) if kind == "local" else f"s3://{request.getfixturevalue('s3_env')}/in"
    for name in ("a.parquet", "b.JSONL", "notes.txt", "deep/c.parquet"):
        storage.write_text(storage.join(root, name), "x")
    assert storage.expand(storage.join(root, "notes.txt")) == [storage.join(root, "notes.txt")]
    assert storage.expand(root, (".parquet", ".jsonl")) == [storage.join(root, n) for n in ("a.parquet", "b.JSONL", "deep/c.parquet")]
    assert len(storage.expand(root)) == 4  # no suffixes: every file below
    assert storage.expand(storage.join(root, "*.parquet")) == [storage.join(root, "a.parquet")]
    assert storage.expand(storage.join(root, "nothing-*.parquet")) == []  # the caller names an empty glob
    assert storage.expand(storage.join(root, "deep"), (".jsonl",)) == []  # ... and an empty folder
    with pytest.raises(FileNotFoundError, match="not found"):
        storage.expand(storage.join(root, "absent.parquet"))


def test_arrow_filesystem_for_workers_carries_the_drivers_credentials_only_with_an_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("HARDPOS_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    settings = lambda fs: fs.__reduce__()[1][0]  # what a pickled copy carries  # noqa: E731
    fs, path = storage.arrow_filesystem("s3://b/k/x.parquet", for_workers=True)
    assert path == "b/k/x.parquet" and settings(fs)["endpoint_override"] == "127.0.0.1:9"
    driver_fs, _ = storage.arrow_filesystem("s3://b/k/x.parquet")
    # pickled into tasks, the workers' copy authenticates on its own; the driver's uses the chain
    assert settings(fs)["access_key"] == "AKIAEXAMPLE" and not settings(driver_fs)["access_key"]
    monkeypatch.delenv("HARDPOS_S3_ENDPOINT_URL")
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    aws_fs, _ = storage.arrow_filesystem("s3://b/k/x.parquet", for_workers=True)
    assert not settings(aws_fs)["access_key"]  # AWS proper: each node's own credential chain


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_expand_globs_mean_the_same_on_s3_as_on_disk(kind, tmp_path, request):
    root = str(tmp_path) if kind == "local" else f"s3://{request.getfixturevalue('s3_env')}/g"
    for name in ("x1.tar", "x2.tar", "x10.tar", "sub/x3.tar", "sub/deeper/x4.tar"):
        storage.write_text(storage.join(root, name), "x")
    names = lambda pattern: [f.rsplit("/", 1)[-1] for f in storage.expand(storage.join(root, pattern))]  # noqa: E731
    assert names("x?.tar") == ["x1.tar", "x2.tar"]
    assert names("x[!2]*.tar") == ["x1.tar", "x10.tar"]
    assert names("*/x*.tar") == ["x3.tar"]
    assert sorted(names("**/x*.tar")) == ["x1.tar", "x10.tar", "x2.tar", "x3.tar", "x4.tar"]
