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
    bad.write_text(json.dumps({"caption": "x"}) + "\n")
    with pytest.raises(TripletFileError, match=r"bad.jsonl: row 0 lacks column\(s\) \['image'\]"):
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


@pytest.mark.parametrize("ext", ["parquet", "jsonl"])
def test_join_choice_columns_round_trip(tmp_path, ext):
    """The generate join's record of its positive choice (ints, null on negative-only rows)
    survives a file, also when a whole file has no positive (an all-null column)."""
    chosen = make_triplet(image="a.png", caption="a dog and a cat", hard_negative="a cat and a hat",
                          hard_positive="a cat and a dog", kind="swap", source="rule", caption_id="0",
                          n_positives=2, positive_kinds="replace,swap", positive_index=1)
    neg_only = make_triplet(image="b.png", caption="a bus", hard_negative="a car", kind="replace", source="rule",
                            caption_id="1", n_positives=0, positive_kinds="", positive_index=None)
    assert neg_only["positive_kinds"] is None  # "" is null here too
    back = read_triplets(write_triplets([chosen, neg_only], str(tmp_path / f"t.{ext}")))
    assert [(r["n_positives"], r["positive_kinds"], r["positive_index"]) for r in back] == [
        (2, "replace,swap", 1), (0, None, None)]
    only_neg = read_triplets(write_triplets([neg_only], str(tmp_path / f"n.{ext}")))
    assert (only_neg[0]["n_positives"], only_neg[0]["positive_index"]) == (0, None)


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_a_users_file_needs_only_the_documented_columns(tmp_path, ext):
    """image, caption, hard_negative, hard_positive (+ kind), as docs/stages.md and --help say:
    source and caption_id get their defaults; a value the file has is kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"image": "a.png", "caption": "a red circle", "hard_negative": "a blue circle", "hard_positive": None},
            {"image": "b.png", "caption": "a cat and a dog", "hard_negative": "x", "hard_positive": "a dog and a cat"}]
    path = tmp_path / f"mine.{ext}"
    if ext == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    back = read_triplets(str(path))
    assert [(r["source"], r["caption_id"], r["kind"]) for r in back] == [("dataset:mine", "0", None), ("dataset:mine", "1", None)]
    assert back[1]["hard_positive"] == "a dog and a cat" and back[0]["hard_positive"] is None
    (tmp_path / "own.jsonl").write_text(json.dumps({**rows[0], "source": "llm:x", "caption_id": "c7", "kind": "swap"}) + "\n")
    assert {k: read_triplets(str(tmp_path / "own.jsonl"))[0][k] for k in ("source", "caption_id", "kind")} == \
        {"source": "llm:x", "caption_id": "c7", "kind": "swap"}
