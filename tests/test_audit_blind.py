"""The blind-text audit: its classifier where the answer is known, its grouped folds, the sources
it reads, its grammar rules, and `hardpos audit` end to end with a real MLflow store."""
from __future__ import annotations

import json
import random

import pytest

from eval_util import write_replace_folder

from hardpos.audit.blind import (AuditError, AuditSettings, Edit, audit_edits, edit_kind, markdown_table, read_edits,
                                 read_source)
from hardpos.audit.config import TextModelConfig
from hardpos.audit.text_models import cross_validate, fit_logistic, group_folds
from hardpos.data.triplets import make_triplet, write_triplets
from hardpos.rules.english import grammar_hits
from hardpos.rules.textnorm import features

COLORS = ["red", "blue", "green", "yellow", "white", "black", "brown", "pink"]
THINGS = ["dog", "cat", "car", "bus", "chair", "table", "kite", "horse", "bench", "clock"]
PLACES = ["on the grass", "near a wall", "in a room", "by the road", "under a tree"]


def _caption(rng: random.Random) -> str:
    c1, c2 = rng.sample(COLORS, 2)
    t1, t2 = rng.sample(THINGS, 2)
    return f"a {c1} {t1} and a {c2} {t2} {rng.choice(PLACES)}"


def _pairs(n: int, marked: bool, seed: int = 0) -> tuple[list[str], list[str]]:
    """n (caption, edit) pairs. marked: every edit carries a word no caption has (an artefact a
    blind model must find); unmarked: the edit exchanges the two colours, a caption of the very
    same distribution (a blind model must stay at chance)."""
    rng = random.Random(seed)
    caps, edits = [], []
    for _ in range(n):
        cap = _caption(rng)
        words = cap.split()
        if marked:
            words[1] = "crimson"
        else:
            words[1], words[5] = words[5], words[1]
        caps.append(cap)
        edits.append(" ".join(words))
    return caps, edits


# ---------------------------------------------------------------------------- the classifier
def test_an_obvious_artefact_is_found_and_a_same_distribution_edit_is_not():
    marked = cross_validate(*_pairs(300, marked=True), steps=200)
    plain = cross_validate(*_pairs(300, marked=False), steps=200)
    assert marked.mean > 0.97 and marked.std < 0.03
    assert 0.4 < plain.mean < 0.6, plain.fold_accuracy
    assert len(marked.fold_accuracy) == 5 and marked.pairs == 300 and marked.groups == 300


def test_the_fit_learns_the_marker_and_ignores_unseen_words():
    caps, edits = _pairs(200, marked=True)
    model = fit_logistic(caps + edits, [0] * 200 + [1] * 200, steps=200)
    s = model.scores(["a crimson kite on the grass", "a red kite on the grass", "zebra zebra"])
    assert s[0] > 0 > s[1]
    assert "a crimson" in model.vocab and "zebra" not in model.vocab
    assert features("A dog.", 2) == ["<s>", "a", "dog", ".", "</s>", "<s> a", "a dog", "dog .", ". </s>"]
    assert features("a dog .", 1) == features("a dog.", 1)  # spacing before punctuation is no feature
    with pytest.raises(ValueError, match="labels"):
        fit_logistic(["a", "b"], [0, 2])


def test_folds_are_grouped_by_caption_balanced_and_seeded():
    groups = [f"caption {i // 3}" for i in range(300)]  # 100 captions, 3 edits each
    fold = group_folds(groups, 5, seed=0)
    for g in set(groups):
        assert len({f for f, h in zip(fold, groups) if h == g}) == 1  # no caption straddles folds
    sizes = [fold.count(f) for f in range(5)]
    assert sizes == [60] * 5
    assert fold == group_folds(groups, 5, seed=0) and fold != group_folds(groups, 5, seed=1)
    with pytest.raises(ValueError, match="cannot fill"):
        cross_validate(["a cat"] * 10, ["a dog"] * 10)  # one caption, five folds


def test_a_caption_with_many_edits_is_one_group():
    caps, edits = _pairs(40, marked=True)
    cv = cross_validate([c for c in caps for _ in range(3)], [e + f" {k}" for e in edits for k in range(3)], steps=50)
    assert cv.pairs == 120 and cv.groups == 40


# ---------------------------------------------------------------------------- grammar rules
@pytest.mark.parametrize("caption,edited,rules", [
    ("A child holding an umbrella.", "A child holding a umbrella.", ["article"]),
    ("a car in a field", "a car in an urban area with an Xbox and a unicorn", []),
    ("a man holding skis", "a man holding a skis", ["singular_det_plural_noun"]),
    ("two dogs on the grass", "two dog on the grass", ["count_singular_noun"]),
    ("a pair of skis in the snow", "a pair of ski in the snow", ["pair_of_singular"]),
    ("a cat on the table", "a cat on on the table", ["doubled_word"]),
    ("a plate of broccoli and rice", "a plate with a broccoli and rice", ["article_mass_noun"]),
    ("a bread knife on a board", "a bread knife near a board", []),
    ("a dog and a cat", "a cat and a dog", []),
    ("two dog stands by the road", "two dog stands near the road", []),  # "dog" modifies "stands"
    ("a umbrella on a table", "a umbrella on a chair", []),  # the caption's own slip is not the edit's
])
def test_grammar_rules_count_what_the_edit_breaks(caption, edited, rules):
    assert grammar_hits(caption, edited) == rules


# ---------------------------------------------------------------------------- sources
def test_kinds_from_the_triplet_columns():
    assert edit_kind("replace", "attribute:color red->blue") == "replace_attribute"
    assert edit_kind("replace", "relation:spatial above->below") == "replace_relation"
    assert edit_kind("swap", "objects:animate dog<->cat") == "swap_object"
    assert edit_kind("swap", "conjuncts:noun_phrases") == "swap"
    assert edit_kind("replace", None) == "replace"
    assert edit_kind("replace", "x", subset="replace_relation") == "replace_relation"
    assert edit_kind("caption") is None


def _triplets(path, n: int = 60) -> str:
    rng = random.Random(1)
    rows = []
    for i in range(n):
        cap = _caption(rng)
        w = cap.split()
        neg = " ".join([w[0], "crimson", *w[2:]])  # a marked REPLACE-attribute negative
        pos = " ".join([*w[4:7], "and", *w[0:3], *w[7:]])  # the two noun phrases exchanged
        rows.append(make_triplet(image=f"{i}.jpg", caption=cap, hard_negative=neg, hard_positive=pos, kind="replace"
                                 if i % 2 else "swap", source="rule", caption_id=i,
                                 negative_slot="attribute:color x->crimson" if i % 2 else "attributes:color a<->b",
                                 positive_slot="conjuncts:noun_phrases"))
    rows.append(make_triplet(image="x.jpg", caption="a dog", hard_negative="a dog.", kind="replace", source="rule",
                             caption_id="same"))  # no edit: counted apart
    return write_triplets(rows, str(path))


def test_read_edits_from_a_triplet_file_and_a_caption_file(tmp_path):
    edits, info = read_edits(_triplets(tmp_path / "t.jsonl"))
    assert info == {"format": "triplets", "edits": 120, "identical": 1}
    assert {(e.polarity, e.kind) for e in edits} == {("negative", "replace_attribute"), ("negative", "swap_attribute"),
                                                    ("positive", "replace"), ("positive", "swap")}
    tsv = tmp_path / "neg.tsv"
    tsv.write_text("\ttitle\tfilepath\tneg_caption\n0\tA dog and a cat.\tx.jpg\t['A cat and a dog .', 'A dog and a bird.']\n"
                   "1\tA red car.\ty.jpg\t['A red car.']\n")
    edits, info = read_edits(str(tsv))
    assert [(e.edited, e.kind) for e in edits] == [("A cat and a dog .", "swap"), ("A dog and a bird.", "replace")]
    assert info == {"format": "captions", "edits": 2, "identical": 1}


def test_bad_sources_are_named_errors(tmp_path):
    with pytest.raises(AuditError, match="not found"):
        read_edits(str(tmp_path / "none.parquet"))
    (tmp_path / "caps.jsonl").write_text(json.dumps({"caption": "a dog"}) + "\n")
    with pytest.raises(AuditError, match="lacks column"):
        read_edits(str(tmp_path / "caps.jsonl"))  # captions without edits are no triplet file
    (tmp_path / "caps.tsv").write_text("title\nA dog.\n")
    with pytest.raises(AuditError, match="no edits to audit.*hardpos perturb"):
        read_edits(str(tmp_path / "caps.tsv"))
    write_triplets([make_triplet(image="a.jpg", caption="a dog", kind="none", source="rule", caption_id=0)],
                   str(tmp_path / "empty.parquet"))
    with pytest.raises(AuditError, match="no hard_negative or hard_positive"):
        read_edits(str(tmp_path / "empty.parquet"))
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(AuditError, match="not a readable parquet"):
        read_edits(str(tmp_path / "bad.parquet"))
    (tmp_path / "folder").mkdir()
    with pytest.raises(AuditError, match="set format="):
        read_edits(str(tmp_path / "folder"))
    with pytest.raises(AuditError, match="format must be"):
        read_edits(str(tmp_path / "caps.tsv"), "xml")


def test_a_kind_with_too_few_pairs_is_listed_not_measured():
    caps, edits = _pairs(30, marked=True)
    group = [Edit(c, e, "negative", "replace_attribute") for c, e in zip(caps, edits)]
    group += [Edit(c, e, "negative", "swap_object") for c, e in zip(caps[:8], edits[:8])]
    rows = audit_edits(group, AuditSettings(text_models=TextModelConfig(steps=100)))
    assert [(r["kind"], r["pairs"]) for r in rows] == [("all", 38), ("replace_attribute", 30), ("swap_object", 8)]
    assert rows[1]["accuracy_pct"] > 95 and rows[2]["accuracy_pct"] is None and "min_pairs=20" in rows[2]["skipped"]
    table = markdown_table([{"name": "mine", "rows": rows}])
    assert "| mine | negatives | swap_object | 8 | 8 | not measured (8 pairs) |  |  | 0 (0.0%) |" in table


# ---------------------------------------------------------------------------- the stage
def test_audit_stage_end_to_end_with_mlflow(tmp_path, tracking_uri):
    from mlflow.tracking import MlflowClient

    from hardpos import runtime
    from hardpos.stages.audit import Config

    src = _triplets(tmp_path / "t.parquet")
    cfg = Config(input=src, output_dir=str(tmp_path / "out"), text_models=TextModelConfig(steps=100))
    summary = runtime.execute("audit", cfg, quiet=True)
    (result,) = summary["sources"]
    assert result["name"] == "t" and result["edits"] == 120
    rows = {(r["polarity"], r["kind"]): r for r in result["rows"]}
    assert set(rows) == {("negative", "all"), ("negative", "replace_attribute"), ("negative", "swap_attribute"),
                         ("positive", "all"), ("positive", "replace"), ("positive", "swap")}
    assert rows[("negative", "replace_attribute")]["accuracy_pct"] > 90  # the marked negatives
    assert rows[("negative", "replace_attribute")]["pair_pct"] == 100.0  # and every pair, by both kinds of model
    assert rows[("negative", "replace_attribute")]["lm_pair_pct"] == 100.0
    assert rows[("positive", "all")]["accuracy_pct"] < 80  # exchanged phrases: the same words
    out = tmp_path / "out"
    assert json.loads((out / "audit.json").read_text())["sources"][0]["rows"] == result["rows"]
    assert "| t | negatives | replace_attribute | 30 | 30 |" in (out / "audit.md").read_text()
    run = MlflowClient(tracking_uri).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.params["text_models.folds"] == "5"
    assert run.data.metrics["blind/t/negative/replace_attribute"] == rows[("negative", "replace_attribute")]["accuracy_pct"]
    assert "blind/t/negative/all/std" in run.data.metrics and "grammar/t/positive/swap" in run.data.metrics
    assert run.data.metrics["blind/t/negative/replace_attribute/pair"] == 100.0
    assert "blind/t/negative/replace_attribute/pair_lm" in run.data.metrics
    # the triplet figures, as a benchmark reads the file's items (subsets: the negatives' kinds)
    triplet = {(r["subset"], r["model"]): r for r in result["triplet_rows"]}
    assert triplet[("replace_attribute", "ngram_lr")]["orig_acc"] == 1.0
    assert run.data.metrics["blind/t/replace_attribute/ngram_lr/orig_acc"] == 100.0
    assert summary["models"]["caption_lm"].startswith("word 2-gram language model")
    assert "| t | replace_attribute | ngram_lr | 30 | 100.0 [" in (out / "audit.md").read_text()
    artifacts = {a.path for a in MlflowClient(tracking_uri).list_artifacts(run.info.run_id)}
    assert {"audit.md", "audit.json", "summary.json", "config.yaml"} <= artifacts


def test_text_model_settings_are_one_section_with_one_set_of_defaults_in_every_stage():
    """audit, debias and the evaluate stage's blind baselines take the text models' settings as
    the same section (``text_models``; evaluate's under ``blind``), its defaults from one
    dataclass, and a bad value is named with its full key in each."""
    from hardpos.config import ConfigError, load_config
    from hardpos.stages import audit, debias, evaluate

    where = {audit.Config: "text_models", debias.Config: "text_models", evaluate.Config: "blind.text_models"}
    for stage, key in where.items():
        default = load_config(stage, None, [])
        section = default.text_models if key == "text_models" else default.blind.text_models
        assert section == TextModelConfig()
        cfg = load_config(stage, None, [f"{key}.l2=0.01", f"{key}.order=3"])
        section = cfg.text_models if key == "text_models" else cfg.blind.text_models
        assert (section.l2, section.order, section.steps) == (0.01, 3, TextModelConfig().steps)
        with pytest.raises(ConfigError, match=rf"^{key}\.discount must be in \(0, 1\), got 1\.5$"):
            load_config(stage, None, [f"{key}.discount=1.5"])


def test_audit_cli_refuses_bad_input_before_work(tmp_path, capsys):
    from hardpos import cli

    assert cli.main(["audit", f"input={tmp_path}/none.parquet", "tracking.enabled=false"]) == 2
    assert "input=" in capsys.readouterr().err
    assert cli.main(["audit", "tracking.enabled=false", f"output_dir={tmp_path}/o"]) == 2
    assert "input is required" in capsys.readouterr().err
    assert cli.main(["audit", "input=x.parquet", "text_models.folds=1"]) == 2
    assert "text_models.folds must be >= 2" in capsys.readouterr().err
    (tmp_path / "caps.tsv").write_text("title\nA dog.\n")
    assert cli.main(["audit", f"input={tmp_path}/caps.tsv", "tracking.enabled=false", f"output_dir={tmp_path}/o"]) == 2
    assert "no edits to audit" in capsys.readouterr().err
    assert cli.main(["audit", f"input={tmp_path}/caps.tsv", "tracking.enabled=false", f"output_dir={tmp_path}/o",
                     "allow_empty=true"]) == 0  # listed with no rows
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["sources"][0]["rows"] == []


def _replace_release(root, n: int = 30):
    rng = random.Random(4)
    subsets = {}
    for sub in ("attributes", "relations"):
        rows = []
        for i in range(n):
            cap = _caption(rng)
            w = cap.split()
            rows.append((f"{sub}{i}", cap, " ".join([w[0], "crimson", *w[2:]]), " ".join([w[0], "scarlet", *w[2:]])))
        subsets[sub] = rows
    return write_replace_folder(root, subsets)


def test_audit_reads_one_benchmark_file_or_half_a_release(tmp_path):
    """Any benchmark file or folder the evaluate stage reads: the release, one half of it
    (swapped_data/ alone: the hard positive against the negative), or one file."""
    root = _replace_release(tmp_path / "hp")
    full = read_source(str(root))
    assert full.info["format"] == "replace" and full.aggregate == "mean_of_subsets" and len(full.items) == 60
    assert {(e.polarity, e.kind) for e in full.edits} == {("negative", "replace_attribute"), ("negative", "replace_relation"),
                                                         ("positive", "replace_attribute"), ("positive", "replace_relation")}
    half = read_source(str(root / "swapped_data"))
    assert half.info["format"] == "replace" and {e.polarity for e in half.edits} == {"negative"}
    assert half.items[0].caption.split()[1] == "scarlet" and half.items[0].positive is None
    one = read_source(str(root / "data" / "vl_checklist_relations.json"))
    assert one.info["format"] == "replace" and {it.subset for it in one.items} == {"relations"}


def test_audit_stage_on_one_benchmark_file_reports_pair_and_triplet_figures(tmp_path):
    from hardpos import runtime
    from hardpos.config import TrackingConfig
    from hardpos.stages.audit import Config

    root = _replace_release(tmp_path / "hp")
    summary = runtime.execute("audit", Config(input=str(root), output_dir=str(tmp_path / "out"),
                                              text_models=TextModelConfig(steps=100),
                                              tracking=TrackingConfig(enabled=False)), quiet=True)
    (result,) = summary["sources"]
    triplet = {(r["subset"], r["model"]): r for r in result["triplet_rows"]}
    # the marked negatives: every pair to the classifier; the language model never saw either rare word, so each
    # positive ties its negative (aug 0) while the caption beats the negative
    assert triplet[("attributes", "ngram_lr")]["orig_acc"] == 1.0
    assert triplet[("all", "caption_lm")]["orig_acc"] == 1.0 and triplet[("all", "caption_lm")]["aug_acc"] == 0.0
    pos = {r["kind"]: r for r in result["rows"] if r["polarity"] == "positive"}
    assert pos["replace_attribute"]["lm_pair_pct"] == 100.0  # a rare synonym: the original is the likelier caption


# ---------------------------------------------------------------------------- the real files
@pytest.mark.slow
def test_pair_measure_on_the_real_files_reads_half_a_release_and_one_file(shared_data):
    """The pair measure is above the one-caption figure (SugarCrepe replace_rel); the REPLACE
    release's swapped half and one SugarCrepe file are sources of their own."""
    src = read_source(str(shared_data / "sugar_crepe" / "replace_rel.json"))
    assert src.info["format"] == "sugarcrepe" and {e.kind for e in src.edits} == {"replace_relation"}
    (row,) = audit_edits(src.edits, AuditSettings())
    assert row["pair_pct"] > row["accuracy_pct"] + 5, row
    half = read_source(str(shared_data / "hard_positives" / "swapped_data"))
    assert half.info["format"] == "replace" and len(half.items) == 10_575 + 16_868


def test_sugarcrepe_read_per_category_and_its_swap_obj_near_chance(shared_data):
    edits, info = read_edits(str(shared_data / "sugar_crepe"))
    kinds = {}
    for e in edits:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    assert info["format"] == "sugarcrepe" and sum(kinds.values()) == info["edits"] > 7400
    assert set(kinds) == {"replace_attribute", "replace_object", "replace_relation", "swap_attribute", "swap_object",
                          "add_attribute", "add_object"}
    assert {e.polarity for e in edits} == {"negative"}
    swap_obj = [e for e in edits if e.kind == "swap_object"]
    (row,) = audit_edits(swap_obj, AuditSettings(text_models=TextModelConfig(steps=200)))
    assert row["pairs"] == len(swap_obj) > 200
    assert 40 < row["accuracy_pct"] < 65  # its authors filtered for exactly this


def test_audit_stage_reads_and_writes_s3(tmp_path, s3_env):
    from hardpos import runtime, storage
    from hardpos.config import TrackingConfig
    from hardpos.stages.audit import Config

    src = f"s3://{s3_env}/in/t.jsonl"
    storage.write_text(src, open(_triplets(tmp_path / "t.jsonl")).read())
    out = f"s3://{s3_env}/out/audit"
    summary = runtime.execute("audit", Config(input=src, output_dir=out, text_models=TextModelConfig(steps=50),
                                              polarities=["negative"],
                                              tracking=TrackingConfig(enabled=False)), quiet=True)
    assert [r["kind"] for r in summary["sources"][0]["rows"]] == ["all", "replace_attribute", "swap_attribute"]
    assert "| t | negatives | replace_attribute | 30 | 30 |" in storage.read_text(f"{out}/audit.md")
    assert json.loads(storage.read_text(f"{out}/summary.json"))["sources"] == summary["sources"]
