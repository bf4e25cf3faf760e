"""The checks every stage shares (hardpos.preflight), on files written here: pure, no Ray."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hardpos import preflight
from hardpos.config import ConfigError

COLUMNS = (("caption",), ("image",))


def test_a_wrong_image_root_fails_but_a_few_missing_images_do_not(tmp_path):
    (tmp_path / "b.png").write_bytes(b"png")
    # the first row's image is missing, a later one exists: the readers count and skip it
    pq.write_table(pa.table({"image": ["a.png", "b.png"], "caption": ["x", "y"]}), tmp_path / "ok.parquet")
    preflight.check_table("data.train_path", str(tmp_path / "ok.parquet"), columns=COLUMNS, what="triplet file")
    (tmp_path / "ok.jsonl").write_text("".join(json.dumps({"image": i, "caption": "x"}) + "\n" for i in ("a.png", "b.png")))
    preflight.check_table("data.train_path", str(tmp_path / "ok.jsonl"), columns=COLUMNS, what="triplet file")
    # none of the first rows' images exists: a wrong image_root, one line with the fix
    pq.write_table(pa.table({"image": ["a.png", "c.png"], "caption": ["x", "y"]}), tmp_path / "bad.parquet")
    with pytest.raises(ConfigError, match=r"data.train_path=.*bad.parquet: none of the first 2 rows' images exist "
                                          r"\(e.g. 'a.png': .*a.png\); set image_root"):
        preflight.check_table("data.train_path", str(tmp_path / "bad.parquet"), columns=COLUMNS, what="triplet file")
    # the same file with the right image_root passes
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "c.png").write_bytes(b"png")
    preflight.check_table("data.train_path", str(tmp_path / "bad.parquet"), columns=COLUMNS, what="triplet file",
                          image_root=str(tmp_path / "imgs"))


def test_empty_and_column_errors_name_the_key(tmp_path):
    pq.write_table(pa.table({"image": pa.array([], pa.string()), "caption": pa.array([], pa.string())}),
                   tmp_path / "empty.parquet")
    with pytest.raises(ConfigError, match=r"k=.*empty.parquet: triplet file has no rows; .*allow_empty=true"):
        preflight.check_table("k", str(tmp_path / "empty.parquet"), columns=COLUMNS, what="triplet file")
    preflight.check_table("k", str(tmp_path / "empty.parquet"), columns=COLUMNS, what="triplet file", allow_empty=True)
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "nocap.parquet")
    with pytest.raises(ConfigError, match=r"lacks column 'caption' \(has \['text'\]\); rename the column to 'caption'"):
        preflight.check_table("k", str(tmp_path / "nocap.parquet"), columns=COLUMNS, what="triplet file")
    with pytest.raises(ConfigError, match=r"k=.*none.parquet: triplet file not found"):
        preflight.check_table("k", str(tmp_path / "none.parquet"), columns=COLUMNS, what="triplet file")


def test_the_benchmark_check_names_a_missing_world_or_benchmark(tmp_path):
    from hardpos.eval.benchmarks import check_benchmarks
    from hardpos.eval.spec import BenchmarkSpec

    with pytest.raises(ConfigError, match=r"world_dir=.*nowhere: world folder not found; run `hardpos world` first"):
        check_benchmarks([], str(tmp_path / "nowhere"), allow_empty=False)
    spec = BenchmarkSpec(name="mine", kind="triplets", path=str(tmp_path / "none.parquet"))
    with pytest.raises(ConfigError, match=r"benchmarks\.mine\.path=.*none.parquet: triplets benchmark file not found"):
        check_benchmarks([spec], None, allow_empty=False)
