"""Caption readers on every supported format (tmp files + the real shared files)."""
import json

import pytest

from hardpos.data.captions import CaptionSourceError, read_captions


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
