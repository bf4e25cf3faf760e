"""Caption readers on every supported format (tmp files + the real shared files)."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hardpos.data.captions import CaptionSourceError
from hardpos.data.captions.formats import read_captions


def test_coco_captions_json(tmp_path):
    coco = {"images": [{"id": 7, "file_name": "000007.jpg"}, {"id": 9, "file_name": "000009.jpg"}],
            "annotations": [{"id": 101, "image_id": 7, "caption": "A dog on a couch."},
                            {"id": 102, "image_id": 9, "caption": "Two cats."},
                            {"id": 103, "image_id": 9, "caption": ""}]}
    path = tmp_path / "captions_train2017.json"
    path.write_text(json.dumps(coco))
    assert read_captions(str(path)) == [
        {"caption_id": "101", "caption": "A dog on a couch.", "image": "000007.jpg", "negatives": []},
        {"caption_id": "102", "caption": "Two cats.", "image": "000009.jpg", "negatives": []},
        {"caption_id": "103", "caption": "", "image": "000009.jpg", "negatives": []},  # empty kept for the caller
    ]
    assert len(read_captions(str(path), limit=2)) == 2


def test_jsonl_json_list_and_parquet(tmp_path):
    rows = [{"id": "a", "caption": "a red car", "image": "x.png", "hard_negative": "a blue car"},
            {"id": "b", "caption": "a blue bus"}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    (tmp_path / "c.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"caption_id": 5, "text": "a green tree", "filepath": "t.jpg"}]),
                   tmp_path / "c.parquet")
    want = [{"caption_id": "a", "caption": "a red car", "image": "x.png", "negatives": ["a blue car"]},
            {"caption_id": "b", "caption": "a blue bus", "image": None, "negatives": []}]
    assert read_captions(str(tmp_path / "c.jsonl")) == want
    assert read_captions(str(tmp_path / "c.json")) == want
    assert read_captions(str(tmp_path / "c.parquet")) == [{"caption_id": "5", "caption": "a green tree", "image": "t.jpg",
                                                                  "negatives": []}]
    (tmp_path / "strings.json").write_text(json.dumps(["one", "two"]))
    assert [r["caption_id"] for r in read_captions(str(tmp_path / "strings.json"))] == ["0", "1"]


def test_negclip_tsv_and_sugarcrepe_json(tmp_path):
    tsv = ("\ttitle\tfilepath\tneg_caption\tneg_image\n"
           "0\tA child holding an umbrella.\tcoco/val2014/a.jpg\t['x']\t[1, 2]\n"
           "1\tA narrow kitchen.\tcoco/val2014/b.jpg\t['y']\t[3]\n")
    (tmp_path / "neg.tsv").write_text(tsv)
    assert read_captions(str(tmp_path / "neg.tsv")) == [
        {"caption_id": "0", "caption": "A child holding an umbrella.", "image": "coco/val2014/a.jpg", "negatives": ["x"]},
        {"caption_id": "1", "caption": "A narrow kitchen.", "image": "coco/val2014/b.jpg", "negatives": ["y"]}]
    sc = {"0": {"filename": "000000565045.jpg", "caption": "Blue bathroom.", "negative_caption": "White bathroom."}}
    (tmp_path / "swap_att.json").write_text(json.dumps(sc))
    assert read_captions(str(tmp_path / "swap_att.json")) == [
        {"caption_id": "0", "caption": "Blue bathroom.", "image": "000000565045.jpg", "negatives": ["White bathroom."]}]


@pytest.mark.parametrize("name,content,match", [
    ("missing.json", None, "not found"),
    ("positives.txt", "A man strolling.\nNone\n", "not a caption source"),
    ("nocap.jsonl", '{"id": 1, "label": "x"}\n', "no caption column"),
    ("nocap.tsv", "a\tb\n1\t2\n", "no caption column"),
    ("bad.json", "{not json", "not valid JSON"),
    ("bad.jsonl", '{"caption": "ok"}\nnope\n', "line 2 is not JSON"),
    ("weird.json", '{"foo": 1}', "neither COCO"),
    ("data.xyz", "hello", "unknown caption format"),
])
def test_bad_sources_raise_clear_errors(tmp_path, name, content, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(CaptionSourceError, match=match) as err:
        read_captions(str(path))
    assert name in str(err.value)


def test_non_utf8_is_refused(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"caption": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(CaptionSourceError, match="not UTF-8"):
        read_captions(str(path))


def test_s3_source(s3_env, tmp_path):
    from hardpos import storage

    uri = f"s3://{s3_env}/caps/c.jsonl"
    storage.write_text(uri, '{"caption": "a cat", "image": "c.jpg"}\n')
    assert read_captions(uri) == [{"caption_id": "0", "caption": "a cat", "image": "c.jpg", "negatives": []}]
    with pytest.raises(CaptionSourceError, match="not found"):
        read_captions(f"s3://{s3_env}/caps/none.jsonl")


def test_real_shared_files(shared_data):
    neg = read_captions(str(shared_data / "negclip" / "valid_neg_clip.tsv"))
    assert len(neg) == 4839
    assert neg[0] == {"caption_id": "0", "caption": "A child holding a flowered umbrella and petting a yak.",
                      "image": "coco/val2014/COCO_val2014_000000184613.jpg",
                      "negatives": ["A umbrella holding a flowered child and petting a yak .",
                                    "A child petting a flowered umbrella and holding a yak ."]}
    total = 0
    for path in sorted((shared_data / "sugar_crepe").glob("*.json")):
        rows = read_captions(str(path))
        assert rows and all(r["caption"] and r["image"].endswith(".jpg") for r in rows)
        total += len(rows)
    assert total == 7511
    att = read_captions(str(shared_data / "hard_positives" / "data" / "vl_checklist_attributes.json"), limit=1)
    assert att == [{"caption_id": "2401814", "caption": "walking elephant", "image": "data/VG_100K_2/2401814.jpg",
                    "negatives": []}]


# --------------------------------------------------------------------------- streaming sources (generate)
def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_glob_folder_or_file_resolves_to_sorted_files_with_one_column_map(tmp_path):
    from hardpos.data.captions.stream import resolve_source

    (tmp_path / "caps").mkdir()
    for i in (2, 0, 1):
        _jsonl(tmp_path / "caps" / f"part-{i}.jsonl", [{"id": f"{i}-a", "title": "a red bus", "filepath": "x.jpg"}])
    (tmp_path / "caps" / "README.md").write_text("not a caption file")
    src = resolve_source(str(tmp_path / "caps" / "part-*.jsonl"))
    assert [p.rsplit("/", 1)[-1] for p in src.files] == ["part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]
    assert src.fmt == "jsonl" and (src.columns.caption, src.columns.caption_id, src.columns.image) == (
        "title", "id", "filepath")
    assert resolve_source(str(tmp_path / "caps")).files == src.files  # a folder: its caption files only
    one = resolve_source(str(tmp_path / "caps" / "part-1.jsonl"))
    assert one.files == (str(tmp_path / "caps" / "part-1.jsonl"),)


def test_bad_sources_are_named_errors_before_any_work(tmp_path):
    from hardpos.data.captions.stream import resolve_source

    with pytest.raises(CaptionSourceError, match=r"glob .*nothing-\*\.jsonl matches no file"):
        resolve_source(str(tmp_path / "nothing-*.jsonl"))
    with pytest.raises(CaptionSourceError, match="caption source not found"):
        resolve_source(str(tmp_path / "missing.jsonl"))
    _jsonl(tmp_path / "a.jsonl", [{"caption": "a cat", "image": "c.jpg"}])
    _jsonl(tmp_path / "b.jsonl", [{"text": "a dog", "image": "d.jpg"}])
    with pytest.raises(CaptionSourceError, match=r"mixed schemas: .*a\.jsonl.*'caption'.*b\.jsonl.*'text'"):
        resolve_source(str(tmp_path / "*.jsonl"))
    (tmp_path / "nocap").mkdir()
    _jsonl(tmp_path / "nocap" / "c.jsonl", [{"image": "c.jpg", "label": 3}])
    with pytest.raises(CaptionSourceError, match=r"c\.jsonl: no caption column"):
        resolve_source(str(tmp_path / "nocap"))
    (tmp_path / "mixed").mkdir()
    pq.write_table(pa.table({"caption": ["a cat"]}), tmp_path / "mixed" / "x.parquet")
    _jsonl(tmp_path / "mixed" / "y.jsonl", [{"caption": "a dog"}])
    with pytest.raises(CaptionSourceError, match="mixes file formats"):
        resolve_source(str(tmp_path / "mixed"))
    (tmp_path / "latin.jsonl").write_bytes('{"caption": "A caf\u00e9."}\n'.encode("latin-1"))
    with pytest.raises(CaptionSourceError, match="not UTF-8"):
        resolve_source(str(tmp_path / "latin.jsonl"))
    (tmp_path / "nocol.tsv").write_text("filepath\tneg_caption\na.jpg\t[]\n")
    with pytest.raises(CaptionSourceError, match="no caption column"):
        resolve_source(str(tmp_path / "nocol.tsv"))
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 nope")
    with pytest.raises(CaptionSourceError, match="not a readable parquet file"):
        resolve_source(str(tmp_path / "bad.parquet"))


def test_shard_slices_span_blocks_and_fill_missing_ids_with_the_index():
    from hardpos.data.captions.stream import CAPTION_SCHEMA, CaptionBlocks, caption_rows

    blocks = CaptionBlocks(refs=["r0", "r1", "r2"], rows=[3, 2, 4], fingerprint="f")
    assert blocks.num_captions == 9
    assert blocks.pieces(0, 3) == [(0, 0, 3)]
    assert blocks.pieces(2, 6) == [(0, 2, 3), (1, 0, 2), (2, 0, 1)]
    assert blocks.pieces(8, 9) == [(2, 3, 4)]
    t0 = pa.Table.from_pylist([{"caption_id": "x", "caption": "a", "image": None, "negatives": ["n"]},
                               {"caption_id": None, "caption": "b", "image": "/i.jpg", "negatives": None}],
                              schema=CAPTION_SCHEMA)
    t1 = pa.Table.from_pylist([{"caption_id": None, "caption": "c", "image": None, "negatives": []}],
                              schema=CAPTION_SCHEMA)
    rows = caption_rows([t0, t1], [(0, 1, 2), (1, 0, 1)], start=7)
    assert rows == [{"caption_id": "7", "caption": "b", "image": "/i.jpg", "negatives": [], "index": 7},
                    {"caption_id": "8", "caption": "c", "image": None, "negatives": [], "index": 8}]


def test_normalise_batch_maps_columns_resolves_images_and_parses_negatives(tmp_path):
    from hardpos.data.captions.formats import column_map
    from hardpos.data.captions.stream import normalise_batch

    path = str(tmp_path / "caps.jsonl")
    batch = pa.table({"title": ["a cat", None], "filepath": ["im/c.jpg", ""], "neg_caption": ["['a dog']", None],
                      "path": [path, path]})
    cm = column_map(batch.column_names, path)
    rows = normalise_batch(batch, cm, path, None).to_pylist()
    assert rows == [{"caption_id": None, "caption": "a cat", "image": str(tmp_path / "im" / "c.jpg"),
                     "negatives": ["a dog"]},
                    {"caption_id": None, "caption": "", "image": None, "negatives": []}]
