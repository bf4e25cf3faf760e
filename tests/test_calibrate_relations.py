"""The relation learnability probe: its rows say only the relation apart, its score
is the evaluator's rule, and a tiny run goes end to end."""
import random

import pytest
import torch

from benchmarks.calibrate_relations import RelationProbeConfig, relation_accuracy, relation_rows, run, training_world
from hardpos.config import ConfigError, ModelConfig
from hardpos.world.grammar import parse, truth
from hardpos.world.scene import WorldConfig
from hardpos.world.build import generate_world
from hardpos.models.clip import load_model, tokenize

CFG = WorldConfig(min_objects=2, max_objects=3)


def test_twin_rows_differ_only_by_the_relation():
    rows = relation_rows(random.Random(0), CFG, "twins", 40)
    assert len(rows) == 40
    for (s1, c1, n1), (s2, c2, n2) in zip(rows[::2], rows[1::2]):
        assert n1 is None and n2 is None
        # each caption true of its own scene and false of the twin's: only the relation decides
        assert truth(c1, s1, CFG) is True and truth(c2, s2, CFG) is True
        assert truth(c1, s2, CFG) is False and truth(c2, s1, CFG) is False
        # the same objects (mirrored), the same noun phrases
        assert sorted((o.shape, o.color, o.size) for o in s1.objects) == sorted(
            (o.shape, o.color, o.size) for o in s2.objects)
        (_, (a1, _, b1)), (_, (a2, _, b2)) = parse(c1, CFG), parse(c2, CFG)
        assert {a1, b1} == {a2, b2}


def test_hardneg_rows_change_only_the_relation_word():
    rows = relation_rows(random.Random(1), CFG, "hardneg", 30)
    for scene, cap, neg in rows:
        assert truth(cap, scene, CFG) is True and truth(neg, scene, CFG) is False
        (_, (a, r1, b)), (_, (a2, r2, b2)) = parse(cap, CFG), parse(neg, CFG)
        assert (a, b) == (a2, b2) and r1 != r2


def test_relation_accuracy_counts_ties_against_the_model():
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    images = torch.randn(3, 3, 32, 32)
    same = tokenize(lm.tokenizer, ["a red circle above a blue square"] * 3)
    assert relation_accuracy(lm.model, {"images": images, "caption": same, "negative": same}) == 0.0


def test_bad_mode_and_odd_batch_are_refused():
    with pytest.raises(ConfigError, match="mode"):
        RelationProbeConfig(mode="pairs").validate()
    with pytest.raises(ConfigError, match="batch"):
        RelationProbeConfig(batch=7).validate()


def test_a_tiny_run_scores_the_world_benchmark(tmp_path):
    generate_world(WorldConfig(seed=2, n_pretrain=0, n_finetune=0, n_benchmark=40), str(tmp_path))
    curve = run(RelationProbeConfig(world_dir=str(tmp_path), mode="hardneg", steps=2, batch=4, eval_every=1))
    assert [p["step"] for p in curve] == [0, 1, 2]
    assert all(0.0 <= p["relation_orig_acc"] <= 1.0 for p in curve)
    assert curve[-1]["loss"] > 0


def test_the_sincos_demo_arch_differs_from_hardpos_demo_only_in_its_fixed_2d_position_embedding():
    # the relation lever: the same tower with fixed 2-D sin-cos position embeddings
    # (learnt ones start at std ~0.1, too weak for a from-scratch model to find positions)
    learnt = load_model(ModelConfig(arch="hardpos-demo")).model.visual
    sincos = load_model(ModelConfig(arch="hardpos-demo-sincos")).model.visual
    assert learnt.positional_embedding.requires_grad and not sincos.positional_embedding.requires_grad
    assert learnt.positional_embedding.shape == sincos.positional_embedding.shape == (65, 96)
    # sin/cos values: every patch position distinct and of unit-scale magnitude
    pos = sincos.positional_embedding[1:]
    assert torch.cdist(pos, pos).fill_diagonal_(float("inf")).min() > 0.1
    assert float(pos.abs().max()) <= 1.0 + 1e-6 and float(pos.std()) > 0.4
    trainable = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)  # noqa: E731
    assert trainable(learnt) - trainable(sincos) == 65 * 96


def test_training_scenes_use_the_scored_worlds_vocabulary(tmp_path):
    # a restricted world (two colours, one shape, large only) is trained on its own words, so
    # the vocabulary ladder of docs/calibration.md can be rerun with jobs/world.py + this tool
    generate_world(WorldConfig(seed=3, n_pretrain=0, n_finetune=0, n_benchmark=30, colors=["red", "blue"],
                               shapes=["circle"], sizes=["large"], min_objects=2, max_objects=2), str(tmp_path))
    world = training_world(RelationProbeConfig(world_dir=str(tmp_path), min_objects=2, max_objects=2))
    assert (world.colors, world.shapes, world.sizes) == (["red", "blue"], ["circle"], ["large"])
    assert (world.min_objects, world.max_objects, world.seed) == (2, 2, 0)  # the probe's own
    rows = relation_rows(random.Random(0), world, "twins", 20)
    assert len(rows) == 20 and {(o.color, o.shape, o.size) for s, _, _ in rows for o in s.objects} == {
        ("red", "circle", "large"), ("blue", "circle", "large")}
