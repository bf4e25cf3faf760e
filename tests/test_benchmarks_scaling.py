"""The scaling suite (benchmarks.scaling): its rows on tiny sizes. The suite itself is its
own command (python -m benchmarks.scaling), never part of the default test run."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from benchmarks import scaling
from hardpos.config import ConfigError


def test_rows_on_tiny_sizes_carry_throughput_memory_and_growth(tmp_path):
    cfg = scaling.Config(output_dir=str(tmp_path), stages=["generate", "train"], generate_sizes=[10, 20, 40],
                         train_sizes=[4, 8, 16], image_size=16)
    calls = []

    def runner(stage, overrides, path):  # stands in for the child process: wall grows 1.5x per doubling
        calls.append((stage, overrides))
        size = {"generate": [10, 20, 40], "train": [4, 8, 16]}[stage][len([c for c in calls if c[0] == stage]) - 1]
        base = {"generate": 10, "train": 4}[stage]
        return {"wall_s": 2.0 * 1.5 ** {1: 0, 2: 1, 4: 2}[size // base], "peak_rss_mb": 100.0 + size}

    rows = scaling.suite(cfg, runner)
    assert [(r["stage"], r["size"], r["unit"]) for r in rows] == [
        ("generate", 10, "captions"), ("generate", 20, "captions"), ("generate", 40, "captions"),
        ("train", 4, "samples"), ("train", 8, "samples"), ("train", 16, "samples")]
    assert [r["wall_s"] for r in rows[:3]] == [2.0, 3.0, 4.5]
    assert [r["per_s"] for r in rows[:3]] == [5.0, 6.7, 8.9]
    assert [r["per_s_vs_smallest"] for r in rows[:3]] == [1.0, 1.34, 1.78]
    assert [r["peak_rss_mb"] for r in rows[3:]] == [104.0, 108.0, 116.0]
    assert [r["rss_vs_smallest"] for r in rows[3:]] == [1.0, 1.04, 1.12]
    # the inputs are real and of the case's size
    gen = dict(o.split("=", 1) for o in calls[1][1])
    assert gen["engine.kind"] == "rules" and sum(1 for _ in open(gen["input"])) == 20
    train = dict(o.split("=", 1) for o in calls[5][1])
    assert pq.read_metadata(train["data.train_path"]).num_rows == 16 and train["epochs"] == "1"
    table = scaling.format_rows(rows)
    assert "| generate | 40 captions | 4.5 | 8.9 | 140 | 1.78 | 1.27 |" in table
    captions = [json.loads(line)["caption"] for line in open(gen["input"])]
    assert len(set(captions)) > 10 and any(" and " in c for c in captions)


def test_sizes_must_grow():
    with pytest.raises(ConfigError, match="increasing"):
        scaling.Config(generate_sizes=[100, 10, 1000])
    with pytest.raises(ConfigError, match="unknown"):
        scaling.Config(stages=["perturb"])


def test_inputs_serial_baseline_decodes_every_row_of_the_files_layout(tmp_path):
    from benchmarks import inputs

    layouts = inputs.write_layouts(tmp_path, 5, 32, shard_rows=2)
    result = inputs.time_serial(layouts["files"], str(tmp_path / "files"), batch_size=2)
    assert (result["rows"], result["ok"]) == (5, 5) and result["rows_per_s"] > 0
    (tmp_path / "files" / "img" / "000003.jpg").write_bytes(b"not a jpeg")  # a bad image is counted, not fatal
    assert inputs.time_serial(layouts["files"], str(tmp_path / "files"))["ok"] == 4
