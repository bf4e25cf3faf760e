"""The one list of benchmark formats: what a path of each kind may be (the release, one half of
it, one file), how a path's kind is told, and a subset written back that the loaders read
unchanged."""
from __future__ import annotations

import json

import pytest
from eval_util import write_replace_folder

from hardpos.eval.benchmarks import load_benchmark
from hardpos.eval.formats import detect_kind, json_kind, subset_files, write_subset
from hardpos.eval.items import BenchmarkError
from hardpos.eval.spec import BENCHMARK_KINDS, BenchmarkSpec
from tests.support import triplet_rows, write_rows

REPLACE = {"attributes": [("1", "a red car", "a blue car", "a crimson car"), ("2", "a tall man", "a short man", "a big man")],
           "relations": [("3", "a cat on a mat", "a cat under a mat", "a cat atop a mat")]}


def _sugarcrepe(root, cats=("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")):
    root.mkdir(parents=True, exist_ok=True)
    for k, cat in enumerate(cats):
        (root / f"{cat}.json").write_text(json.dumps(
            {str(i): {"filename": f"{i}.jpg", "caption": f"a dog number {i} in {cat}", "negative_caption": f"a cat {i}"}
             for i in range(k + 1)}))
    return root


def _scpp(root):
    root.mkdir(parents=True, exist_ok=True)
    for cat in ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"):
        (root / f"{cat}.json").write_text(json.dumps(
            [{"id": i, "filename": f"{i}.jpg", "caption": f"a dog {i}", "caption2": f"a puppy {i}",
              "negative_caption": f"a cat {i}"} for i in range(2)]))
    return root


def test_every_loader_is_a_listed_kind():
    from hardpos.eval.benchmarks import LOADERS

    assert set(LOADERS) == set(BENCHMARK_KINDS) == {"replace", "swap", "sugarcrepe", "sugarcrepe_pp", "triplets"}


def test_replace_release_half_and_single_file(tmp_path):
    root = write_replace_folder(tmp_path / "hp", REPLACE)
    assert detect_kind(str(root)) == "replace"
    full = load_benchmark(BenchmarkSpec("r", "replace", str(root)))
    assert [(it.item_id, it.positive) for it in full.items] == [("attributes/0", "a crimson car"),
                                                               ("attributes/1", "a big man"), ("relations/0", "a cat atop a mat")]
    half = root / "swapped_data"
    assert detect_kind(str(half)) == "replace"
    swapped = load_benchmark(BenchmarkSpec("s", "replace", str(half)))
    assert not swapped.has_positives and [(it.caption, it.negative) for it in swapped.items][0] == ("a crimson car", "a blue car")
    one = str(root / "data" / "vl_checklist_relations.json")
    assert detect_kind(one) == "replace" and subset_files("replace", one) == [("relations", one, None)]
    single = load_benchmark(BenchmarkSpec("o", "replace", one))
    assert [(it.item_id, it.subset, it.caption) for it in single.items] == [("relations/0", "relations", "a cat on a mat")]
    assert single.items[0].image == str(root / "data" / "data" / "VG_100K" / "3.jpg")  # relative to the file's folder


def test_sugarcrepe_folder_and_one_category_and_scpp(tmp_path):
    sc = _sugarcrepe(tmp_path / "sc")
    assert detect_kind(str(sc)) == "sugarcrepe" and detect_kind(str(sc / "swap_obj.json")) == "sugarcrepe"
    bench = load_benchmark(BenchmarkSpec("sc", "sugarcrepe", str(sc / "swap_obj.json")))
    assert [it.item_id for it in bench.items] == [f"swap_obj/{i}" for i in range(7)]
    pp = _scpp(tmp_path / "pp")
    assert detect_kind(str(pp)) == "sugarcrepe_pp" and detect_kind(str(pp / "replace_rel.json")) == "sugarcrepe_pp"
    one = load_benchmark(BenchmarkSpec("pp", "sugarcrepe_pp", str(pp / "replace_rel.json")))
    assert [(it.item_id, it.positive) for it in one.items] == [("replace_rel/0", "a puppy 0"), ("replace_rel/1", "a puppy 1")]
    assert json_kind([{"true_caption": "x", "false_caption": "y", "bbox_x": 1}]) == "swap"
    assert json_kind({"images": [], "annotations": []}) is None and json_kind([]) is None
    assert detect_kind(str(tmp_path / "nowhere")) is None
    (tmp_path / "empty").mkdir()
    assert detect_kind(str(tmp_path / "empty")) is None
    with pytest.raises(BenchmarkError, match="no vl_checklist_attributes.json"):
        subset_files("replace", str(tmp_path / "empty"))


def test_a_written_subset_is_read_back_unchanged_in_every_format(tmp_path):
    root = write_replace_folder(tmp_path / "hp", REPLACE)
    sc, pp = _sugarcrepe(tmp_path / "sc"), _scpp(tmp_path / "pp")
    trip = write_rows(tmp_path / "t", triplet_rows(6, seed=3))
    for kind, path, keep in (("replace", str(root), {"attributes/1", "relations/0"}),
                             ("replace", str(root / "data" / "vl_checklist_attributes.json"), {"attributes/0"}),
                             ("sugarcrepe", str(sc), {"swap_obj/3", "add_att/0"}),
                             ("sugarcrepe_pp", str(pp), {"swap_att/1"}),
                             ("triplets", str(trip), {"1", "4"})):
        before = {it.item_id: it for it in load_benchmark(BenchmarkSpec("b", kind, path)).items}
        out = write_subset(kind, path, keep, str(tmp_path / "out" / kind / str(len(keep))))
        assert detect_kind(out) == kind
        after = load_benchmark(BenchmarkSpec("b", kind, out)).items
        if kind == "triplets":  # row numbers are renumbered: compare the rows' texts
            assert [(it.caption, it.negative, it.positive) for it in after] == \
                [(before[i].caption, before[i].negative, before[i].positive) for i in sorted(keep, key=int)]
        elif kind == "replace" and out.endswith(".json"):
            assert [(it.caption, it.negative) for it in after] == [(before[i].caption, before[i].negative) for i in keep]
        else:
            kept = [it for it in before.values() if it.item_id in keep]
            assert [(it.item_id, it.caption, it.negative, it.positive) for it in after] == \
                [(it.item_id.replace("/1", "/0") if kind == "replace" else it.item_id, it.caption, it.negative, it.positive)
                 for it in kept]
