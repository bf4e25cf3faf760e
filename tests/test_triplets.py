"""Triplet rows: construction, parquet/jsonl round trips (local and s3), image resolution."""
import json

import pytest

from hardpos.data.triplets import (TRIPLET_COLUMNS, TripletFileError, make_triplet, read_triplets,
                                   resolve_image, write_triplets)


def _rows():
    return [
        make_triplet(image="images/a.png", caption="a red circle", hard_negative="a blue circle",
                     hard_positive="", kind="replace", source="rule", caption_id=1, slot="attribute:color red->blue"),
        make_triplet(image="images/b.png", caption="a dog and a cat", hard_negative=None,
                     hard_positive="a cat and a dog", kind="swap", source="llm:tiny", caption_id="b"),
    ]


def test_make_triplet_nulls_empty_strings_and_orders_columns():
    row = _rows()[0]
    assert list(row)[:7] == list(TRIPLET_COLUMNS)
    assert row["hard_positive"] is None and row["caption_id"] == "1" and row["slot"] == "attribute:color red->blue"


@pytest.mark.parametrize("ext", ["parquet", "jsonl"])
def test_round_trip(tmp_path, ext):
    rows = _rows()
    uri = write_triplets(rows, str(tmp_path / f"t.{ext}"))
    back = read_triplets(uri)
    assert [{k: r.get(k) for k in TRIPLET_COLUMNS} for r in back] == [{k: r[k] for k in TRIPLET_COLUMNS} for r in rows]
    assert back[0]["slot"] == "attribute:color red->blue" and back[1]["slot"] is None


def test_s3_round_trip(s3_env):
    uri = write_triplets(_rows(), f"s3://{s3_env}/t/triplets.parquet")
    assert read_triplets(uri)[1]["hard_positive"] == "a cat and a dog"


def test_errors_name_the_file(tmp_path):
    with pytest.raises(TripletFileError, match="lacks column"):
        write_triplets([{"caption": "x"}], str(tmp_path / "x.jsonl"))
    with pytest.raises(TripletFileError, match=".parquet or .jsonl"):
        write_triplets(_rows(), str(tmp_path / "x.csv"))
    with pytest.raises(TripletFileError, match="not found"):
        read_triplets(str(tmp_path / "none.parquet"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"caption": "x", "image": "y"}) + "\n")
    with pytest.raises(TripletFileError, match=r"bad.jsonl: row 0 lacks column"):
        read_triplets(str(bad))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"caption": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(TripletFileError, match="bad.parquet: lacks column"):
        read_triplets(str(tmp_path / "bad.parquet"))


def test_resolve_image():
    assert resolve_image("/abs/a.png", "/base") == "/abs/a.png"
    assert resolve_image("s3://b/a.png", "/base") == "s3://b/a.png"
    assert resolve_image("images/a.png", "/w/world") == "/w/world/images/a.png"
    assert resolve_image("../images/benchmark/1.png", "/w/world/benchmark") == "/w/world/images/benchmark/1.png"
    assert resolve_image("VG_100K/1.jpg", "/base", image_root="/data/vg") == "/data/vg/VG_100K/1.jpg"
    assert resolve_image("../images/x.png", "s3://bkt/world/benchmark") == "s3://bkt/world/images/x.png"
    with pytest.raises(ValueError):
        resolve_image("", "/base")
