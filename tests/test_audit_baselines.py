"""Blind baselines: the two kinds of text model where the answer is known, the intervals, a
benchmark's text-only figures (one pinned by value on the synthetic world), and the evaluate
stage writing and logging them beside the model with a real MLflow store."""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from hardpos.audit.baselines import BlindResult, blind_baseline, flat_metrics, interval, standard_error
from hardpos.audit.config import BlindSettings, TextModelConfig
from hardpos.audit.text_models import CaptionLM, CharLM, cross_validate, lm_pair_correct
from hardpos.config import ConfigError
from hardpos.eval.items import Item

COLORS = ["red", "blue", "green", "yellow", "white", "black", "brown", "pink"]
THINGS = ["dog", "cat", "car", "bus", "chair", "table", "kite", "horse", "bench", "clock"]


def _items(n: int, marked: bool, positives: bool = True, seed: int = 0) -> list[Item]:
    """Benchmark items. marked: every negative carries a word no caption has ("crimson") and
    every positive a synonym captions never use ("scarlet" for red); unmarked: the negative
    exchanges the two colours (a caption of the very same distribution)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        c1, c2 = rng.sample(COLORS, 2)
        t1, t2 = rng.sample(THINGS, 2)
        cap = f"a {c1} {t1} and a {c2} {t2}"
        neg = f"a crimson {t1} and a {c2} {t2}" if marked else f"a {c2} {t1} and a {c1} {t2}"
        pos = f"a {c1} {t1} and a {c2} {t2} here" if not marked else f"a scarlet {t1} and a {c2} {t2}"
        out.append(Item(str(i), "s", "", cap, neg, pos if positives else None))
    return out


# ---------------------------------------------------------------------------- the language model
def test_the_caption_lm_is_a_distribution_and_prefers_ordinary_captions():
    caps = [f"a {c} {t} on the grass" for c in COLORS for t in THINGS]
    for order in (1, 2, 3):
        lm = CaptionLM(order).fit(caps)
        for history in [(), ("<s>",) * (order - 1), ("zebra",) * (order - 1), ("a", "red")[-(order - 1):] if order > 1 else ()]:
            total = sum(lm._prob(history, w) for w in lm.vocab) + lm._prob(history, "<never seen>")
            assert total == pytest.approx(1.0, abs=1e-9), (order, history)
    lm = CaptionLM(2).fit(caps)
    a, b, c = lm.logprob(["a red dog on the grass", "grass the on dog red a", "a crimson dog on the grass"])
    assert a > c > b  # an unseen word costs less than a scrambled sentence, both cost
    with pytest.raises(ValueError, match="order"):
        CaptionLM(0)
    with pytest.raises(ValueError, match="at least one"):
        CaptionLM().fit([])


def test_the_character_lm_is_a_distribution_and_its_ratio_reads_spelling():
    """The character model sums to one over its symbols; its ratio of true captions to edits
    (``char_lm``) spots edits whose new words all end alike ("-ish") where the captions' end
    otherwise ("-ly"), though every word occurs once; the word classifier, for which each is a
    word never seen in training, ties."""
    from hardpos.audit.baselines import text_scores

    lm = CharLM(3).fit([f"a {c} {t}" for c in COLORS for t in THINGS])
    for history in [("<s>", "<s>"), ("a", " "), ("q", "z")]:
        assert sum(lm._prob(history, w) for w in lm.vocab) + lm._prob(history, "?") == pytest.approx(1.0, abs=1e-9)
    rng = random.Random(0)
    caps, negs = [], []
    for i in range(200):
        c1, c2 = rng.sample(COLORS, 2)
        t1, t2 = rng.sample(THINGS, 2)
        caps.append(f"a {c1} {t1} and a {c2} zork{i}ly")
        negs.append(f"a {c1} {t1} and a {c2} zork{i}ish")
    settings = TextModelConfig(steps=200)
    s_c, s_n, _ = text_scores(caps, negs, [None] * 200, settings, 0, "char_lm")
    assert np.mean(s_c > s_n) > 0.95
    w_c, w_n, _ = text_scores(caps, negs, [None] * 200, settings, 0, "ngram_lr")
    assert np.mean(w_c > w_n) < 0.6  # the word n-grams of a new word carry no weight
    assert "character 3-gram" in settings.describe("char_lm")


def test_the_character_lm_by_hand_on_one_text():
    """Order 3, discount 0.5, fitted on "ab" alone (symbols a, b, </s>): every symbol of "ab"
    follows its seen history, p = 0.5 + 0.5 * (0.5 + 0.5 * (1/6 + 1/8)) = 79/96 at each of its
    three steps; "ba" meets no seen trigram, p(b | <s> <s>) = 7/96, then two unseen histories
    that back off to the bigram level, 7/48 each. Upper case and runs of spaces read as one."""
    lm = CharLM(3, 0.5).fit(["ab"])
    assert lm.tokens("  A  b ") == ["<s>", "<s>", "a", " ", "b", "</s>"]
    assert lm.vocab == {"a", "b", "</s>"}
    same, swapped = lm.logprob(["ab", "BA"])
    assert same == pytest.approx(3 * math.log(79 / 96), abs=1e-12)
    assert swapped == pytest.approx(math.log(7 / 96) + 2 * math.log(7 / 48), abs=1e-12)


def test_char_lm_scores_a_tiny_pair_set_by_value():
    """Two items in two folds (folds=2, discount 0.5): each is scored by the other's models,
    one of captions and one of edits. Item 1 is item 0 the other way round ("ab" -> "ba",
    "ba" -> "ab"), so what the other fold calls a true caption is this item's edit: each score
    is the ratio of the hand values above, and both pairs are wrong by the same gap; a
    positive is scored by the same ratio. The ratio is what results call ``char_lm``."""
    from hardpos.audit.baselines import text_scores
    from hardpos.audit.config import CHAR_LM, SELECTION_MODELS

    same, swapped = 3 * math.log(79 / 96), math.log(7 / 96) + 2 * math.log(7 / 48)
    settings = TextModelConfig(folds=2, discount=0.5)
    s_c, s_n, s_p = text_scores(["ab", "ba"], ["ba", "ab"], ["ab", None], settings, 0, CHAR_LM)
    assert s_c == pytest.approx([swapped - same] * 2, abs=1e-12)
    assert s_n == pytest.approx([same - swapped] * 2, abs=1e-12)
    assert s_p[0] == pytest.approx(swapped - same, abs=1e-12) and np.isnan(s_p[1])
    assert SELECTION_MODELS == ("ngram_lr", "caption_lm", "char_lm")
    assert settings.describe(CHAR_LM).startswith("character 3-gram language models of the true captions")
    with pytest.raises(ValueError, match="char_lm"):
        text_scores(["ab", "ba"], ["ba", "ab"], [None, None], settings, 0, "char_gpt")


def test_pair_measures_find_a_marked_edit_and_not_a_same_distribution_one():
    marked = _items(200, marked=True)
    plain = _items(200, marked=False)
    cv_m = cross_validate([it.caption for it in marked], [it.negative for it in marked], steps=200)
    cv_p = cross_validate([it.caption for it in plain], [it.negative for it in plain], steps=200)
    assert cv_m.pair_mean == 1.0 and cv_m.mean > 0.97
    assert 0.35 < cv_p.pair_mean < 0.65 and len(cv_p.pair_correct) == 200
    lm_m = lm_pair_correct([it.caption for it in marked], [it.negative for it in marked])
    lm_p = lm_pair_correct([it.caption for it in plain], [it.negative for it in plain])
    assert lm_m.mean() == 1.0 and 0.3 < lm_p.mean() < 0.7


# ---------------------------------------------------------------------------- intervals
def test_intervals_are_wilson_and_clustering_only_widens_them():
    x = np.array([1] * 90 + [0] * 10)
    lo, hi = interval(x, [str(i) for i in range(100)])
    assert (round(lo, 4), round(hi, 4)) == (0.8256, 0.9448)  # Wilson's 95% interval for 90/100
    # the same answers in ten captions of ten items each, all alike within a caption: wider
    clustered = [str(i // 10) for i in range(100)]
    lo_c, hi_c = interval(x, clustered)
    assert lo_c < lo and hi_c > hi
    assert standard_error(x, clustered) > standard_error(x, [str(i) for i in range(100)])
    assert interval(np.ones(50), [str(i) for i in range(50)])[1] == 1.0 and interval(np.ones(50), ["a"] * 50)[0] < 1.0


# ---------------------------------------------------------------------------- a benchmark's baseline
def test_a_benchmark_baseline_per_model_with_intervals_and_cached():
    items = _items(150, marked=True)
    settings = BlindSettings(text_models=TextModelConfig(steps=200))
    res = blind_baseline("marked", items, "pooled", settings)
    (lr, lm) = [r for r in res.rows() if r["subset"] == "all"]
    assert (lr["model"], lm["model"]) == ("ngram_lr", "caption_lm")
    assert lr["orig_acc"] == 1.0 and lr["aug_acc"] == 1.0 and lr["brittleness"] == 0.0
    # the language model saw neither "crimson" nor "scarlet": the positive ties its negative, and a tie counts against
    assert lm["orig_acc"] == 1.0 and lm["aug_acc"] == 0.0 and lr["orig_acc_lo"] < 1.0
    assert blind_baseline("marked", items, "pooled", settings) is res  # once per benchmark and settings
    flat = flat_metrics(res)
    assert flat["blind/marked/ngram_lr/orig_acc"] == 1.0 and "blind/marked/caption_lm/brittleness_hi" in flat
    assert not any(k.startswith("blind/marked/s/") for k in flat)  # one pooled subset: no per-subset keys
    assert res.correct("ngram_lr")["0"] is True
    assert "logistic regression" in res.models["ngram_lr"] and "Kneser-Ney" in res.models["caption_lm"]


def test_subsets_are_measured_apart_and_a_small_one_is_listed_not_measured():
    items = _items(100, marked=True) + [Item(f"x{i}", "tiny", "", f"a dog {i}", f"a cat {i}") for i in range(5)]
    res = blind_baseline("two", items, "mean_of_subsets", BlindSettings(text_models=TextModelConfig(steps=100)))
    by = {(r["subset"], r["model"]): r for r in res.rows()}
    assert by[("tiny", "ngram_lr")]["skipped"].startswith("5 items from 5 captions")
    assert by[("all", "ngram_lr")]["orig_acc"] == by[("s", "ngram_lr")]["orig_acc"] == 1.0
    assert "aug_acc" in by[("all", "ngram_lr")]
    assert np.isnan(res.scores["ngram_lr"][0][-1])
    with pytest.raises(ConfigError, match="models must be a non-empty subset"):
        BlindSettings(models=["gpt"])


def test_world_replace_attribute_blind_baseline_pinned(tmp_path):
    """The synthetic world's REPLACE-attribute benchmark (seed 0, 200 scenes): both text models
    near chance on the pair, and the language model, which never saw the benchmark's unseen
    synonyms, puts every positive below its negative (aug 0, brittleness = its pair accuracy)."""
    from hardpos.eval.benchmarks import load_benchmark
    from hardpos.eval.spec import BenchmarkSpec
    from hardpos.world.build import generate_world
    from hardpos.world.scene import WorldConfig

    world = str(tmp_path / "world")
    generate_world(WorldConfig(n_pretrain=0, n_finetune=0, n_benchmark=200, write_images=False), world)
    bench = load_benchmark(BenchmarkSpec("wra", "triplets", f"{world}/benchmark/replace_attribute.parquet"))
    res: BlindResult = blind_baseline("wra", bench.items, bench.aggregate)
    got = {r["model"]: {f: round(100 * r[f], 1) for f in ("orig_acc", "aug_acc", "brittleness")} for r in res.rows()}
    assert got == {"ngram_lr": {"orig_acc": 42.5, "aug_acc": 42.5, "brittleness": 57.5},
                   "caption_lm": {"orig_acc": 46.0, "aug_acc": 0.0, "brittleness": 46.0}}


# ---------------------------------------------------------------------------- the evaluate stage
def test_evaluate_reports_and_logs_blind_baselines_beside_the_model(tmp_path, tracking_uri):
    import mlflow
    import pyarrow.parquet as pq

    from hardpos.config import load_config
    from hardpos.eval.benchmarks import load_benchmark
    from hardpos.eval.spec import BenchmarkSpec
    from hardpos.runtime import execute
    from hardpos.stages import evaluate
    from hardpos.world.build import generate_world
    from hardpos.world.scene import WorldConfig

    world = tmp_path / "world"
    generate_world(WorldConfig(n_pretrain=0, n_finetune=0, n_benchmark=60, image_size=32), str(world))
    cfg = load_config(evaluate.Config, None, [f"output_dir={tmp_path / 'out'}", f"world_dir={world}", "device=cpu",
                                              "batch_size=16", "blind.text_models.steps=200"])
    summary = execute("evaluate", cfg, quiet=True)
    blind = summary["blind"]
    assert set(blind["models"]) == {"ngram_lr", "caption_lm"}
    bench = load_benchmark(BenchmarkSpec("world_replace_attribute", "triplets",
                                         str(world / "benchmark" / "replace_attribute.parquet")))
    direct = flat_metrics(blind_baseline(bench.name, bench.items, bench.aggregate, cfg.blind))
    for key, value in direct.items():
        assert blind["metrics"][key] == pytest.approx(value)
    run = mlflow.get_run(summary["mlflow_run_id"])
    assert run.data.metrics["blind/world_replace_attribute/ngram_lr/orig_acc"] == \
        pytest.approx(direct["blind/world_replace_attribute/ngram_lr/orig_acc"])
    assert "blind/world_swap/caption_lm/aug_acc_lo" in run.data.metrics
    assert not any(k.startswith("blind/") for k in summary["metrics"])  # the model's figures stay the model's
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Blind baselines (text only, no image" in report and "| blind: ngram_lr (no image) |" in report
    cols = pq.read_table(tmp_path / "out" / "scores.parquet").to_pydict()
    assert {"blind_ngram_lr_c", "blind_ngram_lr_n", "blind_ngram_lr_p", "blind_caption_lm_c"} <= set(cols)
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["blind"]["rows"] == blind["rows"]


# ---------------------------------------------------------------------------- the demo's and compare's tables
def test_the_demo_and_compare_tables_carry_the_blind_rows():
    from hardpos.eval.outputs import blind_rows
    from hardpos.paper import table1
    from hardpos.stages import compare, demo

    metrics = {"blind/world_replace_attribute/ngram_lr/orig_acc": 0.40, "blind/world_replace_relation/ngram_lr/orig_acc": 0.60,
               "blind/world_replace_attribute/ngram_lr/aug_acc": 0.30, "blind/world_swap/ngram_lr/orig_acc": 0.55,
               "blind/world_swap/caption_lm/orig_acc": 0.45, "blind/world_swap/ngram_lr/orig_acc_lo": 0.4,
               "blind/world_replace_attribute/attributes/n_items": 10.0}
    rows = blind_rows(metrics, demo.BLIND_COLUMNS, dict(table1.GROUPS))
    assert rows["blind: ngram_lr (no image)"]["replace/orig_acc"] == pytest.approx(0.5)  # the two REPLACE benchmarks
    assert "replace/aug_acc" not in rows["blind: ngram_lr (no image)"]  # one of them lacks it
    assert rows["blind: ngram_lr (no image)"]["world_replace_attribute/orig_acc"] == 0.4
    assert rows["blind: caption_lm (no image)"] == {"swap/orig_acc": 0.45}
    md = demo.blind_markdown(rows)
    assert "| blind: ngram_lr (no image) | 50.0 | - | - | 55.0 |" in md and "what the image added" in md
    assert demo.blind_markdown({}) == ""
    runs = [{"run_id": "a", "run_name": "hn-only", "status": "FINISHED", "replace/orig_acc": 0.9, "replace/aug_acc": 0.5,
             "blind/replace/ngram_lr/orig_acc": 0.93, "blind/replace/ngram_lr/aug_acc": 0.91},
            {"run_id": "b", "run_name": "hp+hn", "status": "FINISHED", "replace/orig_acc": 0.8, "replace/aug_acc": 0.7,
             "blind/replace/ngram_lr/orig_acc": 0.93, "blind/replace/ngram_lr/aug_acc": 0.91}]
    table, front = compare.compare_rows(runs, {"replace/aug_acc": "max"})
    assert front == [1]
    lines = table.splitlines()
    assert lines[-1].startswith("| blind: ngram_lr (no image) | 93.0 | 91.0 |") and lines[-1].endswith("|  |")
    assert sum("| yes |" in ln for ln in lines) == 1
