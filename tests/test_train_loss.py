"""The combined loss: hand-computed values, masks, exact zero weights, gradients into both
towers, the per-worker analogy scope, and multi-worker gather == one big batch."""
from __future__ import annotations

import math
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

from hardpos.train.config import LossConfig
from hardpos.train.loss import combined_loss, gather_features


# --------------------------------------------------------------------------- reference
def _dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def _ce(logits, target):
    m = max(logits)
    return m + math.log(sum(math.exp(v - m) for v in logits)) - logits[target]


def reference(I, T, N, P, s, cfg):
    """The loss definition written literally with Python lists and explicit subsets."""
    B = len(I)
    neg_idx = [i for i in range(B) if N[i] is not None]
    pos_idx = [i for i in range(B) if P[i] is not None]
    cols = [T[j] for j in range(B)] + ([N[j] for j in neg_idx] if cfg.negclip_columns and cfg.w_neg > 0 else [])
    i2t = [_ce([s * _dot(I[i], c) for c in cols], i) for i in range(B)]
    t2i = [_ce([s * _dot(T[i], I[j]) for j in range(B)], i) for i in range(B)]
    con = (sum(i2t) / B + sum(t2i) / B) / 2
    hn = [_ce([s * _dot(I[i], T[i]), s * _dot(I[i], N[i])], 0) for i in neg_idx]
    hn = sum(hn) / len(hn) if hn else 0.0
    if pos_idx:
        Pv = [P[j] for j in pos_idx]
        ip = [_ce([s * _dot(I[i], q) for q in Pv], k) for k, i in enumerate(pos_idx)]
        tp = [_ce([s * _dot(T[i], q) for q in Pv], k) for k, i in enumerate(pos_idx)]
        hp = (sum(ip) / len(ip) + sum(tp) / len(tp)) / 2
    else:
        hp = 0.0
    both = [i for i in neg_idx if i in pos_idx]
    pon = [_ce([s * _dot(I[i], P[i]), s * _dot(I[i], N[i])], 0) for i in both]
    pon = sum(pon) / len(pon) if pon else 0.0
    kl = []
    for i in pos_idx:
        a, b = s * _dot(I[i], T[i]), s * _dot(I[i], P[i])
        z = max(a, b) + math.log(math.exp(a - max(a, b)) + math.exp(b - max(a, b)))
        q = [math.exp(a - z), math.exp(b - z)]
        kl.append(sum(0.5 * math.log(0.5 / qi) for qi in q))
    kl = sum(kl) / len(kl) if kl else 0.0
    total = con + cfg.w_pos * hp + cfg.w_neg * hn + cfg.w_pos_over_neg * pon + cfg.w_kl * kl
    return {"total": total, "contrastive": con, "hard_negative": hn, "hard_positive": hp,
            "pos_over_neg": pon, "kl": kl}


def _tensors(I, T, N, P, s):
    d = len(I[0])
    zero = [0.0] * d
    return dict(
        image=torch.tensor(I, dtype=torch.float64),
        text=torch.tensor(T, dtype=torch.float64),
        negative=torch.tensor([n if n is not None else zero for n in N], dtype=torch.float64),
        positive=torch.tensor([p if p is not None else zero for p in P], dtype=torch.float64),
        neg_mask=torch.tensor([n is not None for n in N]),
        pos_mask=torch.tensor([p is not None for p in P]),
        logit_scale=torch.tensor(math.log(s)),
    )


def _random_batch(b=6, d=8, seed=0, neg_p=0.6, pos_p=0.5):
    g = torch.Generator().manual_seed(seed)
    feats = [F.normalize(torch.randn(b, d, generator=g), dim=-1) for _ in range(4)]
    neg_mask = torch.rand(b, generator=g) < neg_p
    pos_mask = torch.rand(b, generator=g) < pos_p
    neg_mask[0] = pos_mask[0] = True  # at least one of each
    feats[2] = feats[2] * neg_mask[:, None]
    feats[3] = feats[3] * pos_mask[:, None]
    return dict(image=feats[0], text=feats[1], negative=feats[2], positive=feats[3],
                neg_mask=neg_mask, pos_mask=pos_mask, logit_scale=torch.tensor(math.log(7.0)))


# --------------------------------------------------------------------------- values
def test_hand_computed_two_sample_batch():
    # s = 1; sample 0 has a negative but no positive, sample 1 a positive but no negative.
    I = [[1.0, 0.0], [0.0, 1.0]]
    T = [[1.0, 0.0], [0.6, 0.8]]
    N = [[0.0, 1.0], None]
    P = [None, [0.8, 0.6]]
    cfg = LossConfig(w_pos=1.0, w_neg=0.5, w_pos_over_neg=0.0, w_kl=0.25)
    out = combined_loss(**_tensors(I, T, N, P, 1.0), cfg=cfg)
    # By hand: i2t row0 logits [1, .6, 0] (T0, T1, N0), row1 [0, .8, 1]; t2i row0 [1, 0],
    # row1 [.6, .8].
    lse = lambda *v: math.log(sum(math.exp(x) for x in v))  # noqa: E731
    con = ((lse(1, .6, 0) - 1 + lse(0, .8, 1) - .8) / 2 + (lse(1, 0) - 1 + lse(.6, .8) - .8) / 2) / 2
    hn = lse(1, 0) - 1                        # sample 0: [<I0,T0>, <I0,N0>] = [1, 0]
    hp = 0.0  # one valid positive: a 1-column softmax over its own column -> CE 0
    q1 = math.exp(.8) / (math.exp(.8) + math.exp(.6))  # softmax([<I1,T1>, <I1,P1>]) = [.8, .6]
    kl = 0.5 * math.log(0.5 / q1) + 0.5 * math.log(0.5 / (1 - q1))
    expected = {"contrastive": con, "hard_negative": hn, "hard_positive": hp, "pos_over_neg": 0.0,
                "kl": kl, "total": con + hp + 0.5 * hn + 0.25 * kl}
    for name, value in expected.items():
        assert float(out[name]) == pytest.approx(value, abs=1e-6), name
    assert float(out["contrastive"]) == pytest.approx(0.65145, abs=1e-4)  # worked on paper


@pytest.mark.parametrize("negclip", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_literal_reference_on_random_batches(seed, negclip):
    batch = _random_batch(seed=seed)
    cfg = LossConfig(w_pos=0.7, w_neg=0.3, w_pos_over_neg=0.2, w_kl=0.1, negclip_columns=negclip)
    out = combined_loss(**batch, cfg=cfg)
    lists = {k: v.tolist() for k, v in batch.items() if k in ("image", "text", "negative", "positive")}
    N = [n if m else None for n, m in zip(lists["negative"], batch["neg_mask"].tolist())]
    P = [p if m else None for p, m in zip(lists["positive"], batch["pos_mask"].tolist())]
    ref = reference(lists["image"], lists["text"], N, P, 7.0, cfg)
    for name, value in ref.items():
        assert float(out[name]) == pytest.approx(value, abs=1e-5), name


def _tsvlc_positive_term(image, text, positive, s):
    """TSVLC's ``get_loss_pos_only`` (non-symmetric): one GPU's batch, every row with a positive."""
    target = torch.arange(len(image))
    return (F.cross_entropy(s * image @ positive.T, target) + F.cross_entropy(s * text @ positive.T, target)) / 2


def test_worker_analogy_scope_is_tsvlcs_per_gpu_positive_term():
    # Two workers of 4 rows, every row with a positive (as TSVLC's data): the "worker" scope on
    # the gathered batch is the mean of the per-GPU terms TSVLC computes before its gather.
    batch = _random_batch(b=8, seed=3, pos_p=1.1)
    s = 7.0
    per_gpu = [_tsvlc_positive_term(batch["image"][r], batch["text"][r], batch["positive"][r], s)
               for r in (slice(0, 4), slice(4, 8))]
    worker = combined_loss(**batch, cfg=LossConfig(analogy_scope="worker"), workers=2)
    glob = combined_loss(**batch, cfg=LossConfig(analogy_scope="global"), workers=2)
    assert float(worker["hard_positive"]) == pytest.approx(float(sum(per_gpu) / 2), abs=1e-6)
    # the global scope sees 8 columns, not 4: a different (larger) value on this batch
    assert float(glob["hard_positive"]) > float(worker["hard_positive"]) + 1e-3
    # every other term is untouched by the scope
    for name in ("contrastive", "hard_negative", "pos_over_neg", "kl"):
        assert float(worker[name]) == pytest.approx(float(glob[name]), abs=1e-7), name


def test_analogy_scopes_agree_on_one_worker():
    batch = _random_batch(seed=4)
    one = combined_loss(**batch, cfg=LossConfig(analogy_scope="worker"))
    assert float(one["hard_positive"]) == pytest.approx(
        float(combined_loss(**batch, cfg=LossConfig(analogy_scope="global"))["hard_positive"]), abs=1e-9)


def test_worker_blocks_must_split_the_batch_and_scope_is_checked():
    with pytest.raises(ValueError, match="do not split into 4 equal worker blocks"):
        combined_loss(**_random_batch(b=6), cfg=LossConfig(analogy_scope="worker"), workers=4)
    with pytest.raises(Exception, match="analogy_scope"):
        LossConfig(analogy_scope="gpu")


def test_plain_contrastive_equals_open_clip_clip_loss():
    from open_clip.loss import ClipLoss

    batch = _random_batch(seed=3)
    out = combined_loss(**batch, cfg=LossConfig(negclip_columns=False))
    ref = ClipLoss()(batch["image"], batch["text"], batch["logit_scale"].exp())
    assert float(out["contrastive"]) == pytest.approx(float(ref), abs=1e-6)


# --------------------------------------------------------------------------- masks
def test_batch_without_negatives_or_positives():
    batch = _random_batch(seed=4)
    batch["neg_mask"][:] = False
    batch["pos_mask"][:] = False
    batch["negative"] = torch.full_like(batch["negative"], float("nan"))  # never read
    batch["positive"] = torch.full_like(batch["positive"], float("nan"))
    image = batch["image"].clone().requires_grad_(True)
    batch["image"] = image
    out = combined_loss(**batch, cfg=LossConfig(w_pos_over_neg=1.0, w_kl=1.0))
    plain = combined_loss(**{**batch, "image": image}, cfg=LossConfig(negclip_columns=False))
    for name in ("hard_negative", "hard_positive", "pos_over_neg", "kl"):
        assert out[name].item() == 0.0, name
    # No negatives -> no NegCLIP columns -> the plain CLIP contrastive term.
    assert out["contrastive"].item() == pytest.approx(plain["contrastive"].item(), abs=1e-7)
    assert out["total"].item() == pytest.approx(out["contrastive"].item(), abs=1e-7)
    out["total"].backward()
    assert torch.isfinite(image.grad).all() and image.grad.abs().sum() > 0


def test_padding_rows_change_nothing():
    batch = _random_batch(b=5, seed=5)
    cfg = LossConfig(w_pos_over_neg=0.5, w_kl=0.5)
    base = combined_loss(**batch, cfg=cfg)
    padded = {k: (torch.cat([v, torch.randn(3, v.shape[1]).to(v.dtype)]) if v.ndim == 2
                  else torch.cat([v, torch.ones(3, dtype=v.dtype)]) if v.ndim == 1 else v)
              for k, v in batch.items()}
    row_mask = torch.tensor([True] * 5 + [False] * 3)
    out = combined_loss(**padded, cfg=cfg, row_mask=row_mask)
    for name in base:
        assert float(out[name]) == pytest.approx(float(base[name]), abs=1e-6), name


def test_zero_weight_removes_a_term_exactly():
    batch = _random_batch(seed=6)
    feats = batch["image"].clone().requires_grad_(True)
    out = combined_loss(**{**batch, "image": feats}, cfg=LossConfig(w_pos=1.0, w_kl=0.0, w_neg=0.5))
    (g0,) = torch.autograd.grad(out["total"], feats)
    feats2 = batch["image"].clone().requires_grad_(True)
    ref = combined_loss(**{**batch, "image": feats2}, cfg=LossConfig(w_pos=1.0, w_neg=0.5, w_kl=1.0))
    without = ref["contrastive"] + ref["hard_positive"] + 0.5 * ref["hard_negative"]
    (g1,) = torch.autograd.grad(without, feats2)
    assert float(ref["kl"]) > 0  # still computed and logged
    assert torch.equal(out["total"], without)
    assert torch.equal(g0, g1)


def test_w_neg_zero_means_no_hard_negatives_at_all():
    """The paper's "0 HN" row: no 2-way term AND no NegCLIP columns; the negatives' features
    get exactly zero gradient, whatever they hold."""
    batch = _random_batch(seed=8)
    assert bool(batch["neg_mask"].any())
    neg = batch["negative"].clone().requires_grad_(True)
    image = batch["image"].clone().requires_grad_(True)
    out = combined_loss(**{**batch, "negative": neg, "image": image}, cfg=LossConfig(w_pos=1.0, w_neg=0.0))
    g_neg, g_img = torch.autograd.grad(out["total"], [neg, image], allow_unused=True, materialize_grads=True)
    assert torch.count_nonzero(g_neg) == 0
    assert torch.count_nonzero(g_img) > 0
    assert float(out["hard_negative"]) > 0  # still computed and logged as a diagnostic
    # the total equals plain CLIP (no columns) + the positive term
    plain = combined_loss(**batch, cfg=LossConfig(w_pos=1.0, w_neg=1.0, negclip_columns=False))
    assert float(out["contrastive"]) == pytest.approx(float(plain["contrastive"]), abs=1e-6)
    assert float(out["total"]) == pytest.approx(float(plain["contrastive"] + plain["hard_positive"]), abs=1e-6)
    # any other negatives give the same total: they cannot influence it
    other = combined_loss(**{**batch, "negative": torch.randn_like(batch["negative"])},
                          cfg=LossConfig(w_pos=1.0, w_neg=0.0))
    assert torch.equal(other["total"], out["total"])


@pytest.mark.parametrize("w_neg", [0.25, 1.0])
def test_any_positive_w_neg_adds_the_negclip_columns_unweighted(w_neg):
    batch = _random_batch(seed=9)
    neg = batch["negative"].clone().requires_grad_(True)
    out = combined_loss(**{**batch, "negative": neg}, cfg=LossConfig(w_pos=1.0, w_neg=w_neg))
    (g,) = torch.autograd.grad(out["total"], neg)
    assert torch.count_nonzero(g) > 0
    # the columns do not scale with w_neg (TSVLC/SVLC): the contrastive term is the same at every w_neg > 0
    full = combined_loss(**batch, cfg=LossConfig(w_pos=1.0, w_neg=1.0))
    plain = combined_loss(**batch, cfg=LossConfig(w_pos=1.0, w_neg=w_neg, negclip_columns=False))
    assert float(out["contrastive"]) == pytest.approx(float(full["contrastive"]), abs=1e-6)
    assert float(out["contrastive"]) != pytest.approx(float(plain["contrastive"]), abs=1e-4)


def test_pos_over_neg_needs_hard_negatives():
    with pytest.raises(ValueError, match="w_pos_over_neg"):
        LossConfig(w_neg=0.0, w_pos_over_neg=0.5)


def test_negative_weight_is_rejected():
    from hardpos.config import ConfigError, load_config
    from hardpos.train.config import TrainConfig

    with pytest.raises(ValueError, match=r"^w_neg must be a finite number >= 0, got -1"):
        LossConfig(w_neg=-1)
    # loaded as the train config's section, the error names the full key
    with pytest.raises(ConfigError, match=r"^loss\.w_neg must be a finite number >= 0, got -1\.0$"):
        load_config(TrainConfig, None, ["loss.w_neg=-1"])


def test_shape_mismatch_is_a_clear_error():
    batch = _random_batch(seed=7)
    batch["positive"] = batch["positive"][:3]
    with pytest.raises(ValueError, match="positive has shape"):
        combined_loss(**batch)


def test_gradients_reach_both_towers_and_the_scale():
    from hardpos.config import ModelConfig
    from hardpos.models.clip import encode_image, encode_text, load_model, tokenize

    torch.manual_seed(0)
    lm = load_model(ModelConfig(arch="hardpos-tiny"))
    captions = ["a red circle", "a blue square", "a green triangle"]
    negs = ["a blue circle", "a red square", "a green circle"]
    poss = ["a crimson circle", "a navy square", "an emerald triangle"]
    tokens = tokenize(lm.tokenizer, captions + negs + poss)
    text = encode_text(lm.model, tokens)
    image = encode_image(lm.model, torch.randn(3, 3, 32, 32))
    out = combined_loss(image, text[:3], text[3:6], text[6:], torch.tensor([True, True, False]),
                        torch.tensor([True, False, True]), lm.model.logit_scale)
    out["total"].backward()
    m = lm.model
    assert m.visual.conv1.weight.grad.abs().sum() > 0
    assert m.token_embedding.weight.grad.abs().sum() > 0
    assert m.transformer.resblocks[0].attn.in_proj_weight.grad.abs().sum() > 0
    assert m.logit_scale.grad is not None and m.logit_scale.grad != 0


def test_logit_scale_clamp():
    from hardpos.config import ModelConfig
    from hardpos.models.clip import load_model
    from hardpos.train.loss import clamp_logit_scale

    m = load_model(ModelConfig(arch="hardpos-tiny")).model
    with torch.no_grad():
        m.logit_scale.fill_(9.0)
    clamp_logit_scale(m)
    assert float(m.logit_scale) == pytest.approx(math.log(100))
    with torch.no_grad():
        m.logit_scale.fill_(-2.0)
    clamp_logit_scale(m)
    assert float(m.logit_scale) == 0.0


# --------------------------------------------------------------------------- two workers
def _global_problem(seed=11, b=8, d=6):
    """A shared linear 'encoder' and one global batch of inputs with masks."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(d, d, generator=g, dtype=torch.float64)
    inputs = {k: torch.randn(b, d, generator=g, dtype=torch.float64) for k in ("image", "text", "negative", "positive")}
    masks = {"neg_mask": torch.tensor([1, 0, 1, 1, 0, 1, 0, 0]).bool(),
             "pos_mask": torch.tensor([0, 1, 1, 0, 1, 0, 0, 1]).bool(),
             "row_mask": torch.tensor([1, 1, 1, 1, 1, 1, 0, 1]).bool()}  # slot 6: a failed image
    return weight, inputs, masks


def _features(weight, inputs, masks, rows):
    feats = {k: F.normalize(inputs[k][rows] @ weight, dim=-1) for k in inputs}
    feats["negative"] = feats["negative"] * masks["neg_mask"][rows, None]
    feats["positive"] = feats["positive"] * masks["pos_mask"][rows, None]
    return {**feats, **{k: v[rows] for k, v in masks.items()}}


_CFG = dict(w_pos=1.0, w_neg=0.5, w_pos_over_neg=0.3, w_kl=0.2)


def _loss_case(rank, world, result_dir, scope):
    """One rank of the two-worker combined loss (analogy ``scope``) -> <scope>-<rank>.pt."""
    import torch.distributed as dist

    weight, inputs, masks = _global_problem()
    weight = weight.clone().requires_grad_(True)
    per = 8 // world
    local = _features(weight, inputs, masks, slice(rank * per, (rank + 1) * per))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecated torch collective on the way
        glob = gather_features(local)
    out = combined_loss(**{k: glob[k] for k in ("image", "text", "negative", "positive", "neg_mask", "pos_mask")},
                        logit_scale=torch.tensor(math.log(10.0)), cfg=LossConfig(**_CFG, analogy_scope=scope),
                        row_mask=glob["row_mask"], workers=world)
    out["total"].backward()
    grad = weight.grad.clone()
    dist.all_reduce(grad)  # what DDP does: average parameter gradients over ranks
    grad /= world
    torch.save({"loss": {k: float(v) for k, v in out.items()}, "grad": grad},
               os.path.join(result_dir, f"{scope}-{rank}.pt"))


@pytest.mark.integration  # two torch.distributed worker processes
@pytest.mark.parametrize("scope", ["global", "worker"])
def test_two_workers_equal_one_worker_on_the_same_global_batch(two_rank_results, scope):
    weight, inputs, masks = _global_problem()
    weight = weight.clone().requires_grad_(True)
    single = combined_loss(**{k: v for k, v in _features(weight, inputs, masks, slice(0, 8)).items() if k != "row_mask"},
                           logit_scale=torch.tensor(math.log(10.0)), cfg=LossConfig(**_CFG, analogy_scope=scope),
                           row_mask=masks["row_mask"], workers=2)
    single["total"].backward()

    for rank in range(2):
        res = torch.load(two_rank_results / f"{scope}-{rank}.pt", weights_only=True)
        for name, value in single.items():
            assert res["loss"][name] == pytest.approx(float(value), abs=1e-9), (rank, name)
        torch.testing.assert_close(res["grad"], weight.grad, rtol=1e-9, atol=1e-12)
    assert single["hard_negative"] > 0 and single["hard_positive"] > 0


# --------------------------------------------------------------------------- gather_with_grad
class _LinearNet(torch.nn.Module):
    """forward_loss's net contract with a shared linear 'encoder' (inputs stand in for tokens)."""

    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight.clone())

    def forward(self, images, text_tokens, neg_tokens, pos_tokens, neg_mask, pos_mask):
        enc = lambda x: F.normalize(x @ self.weight, dim=-1)  # noqa: E731
        return {"image": enc(images), "text": enc(text_tokens), "negative": enc(neg_tokens) * neg_mask[:, None],
                "positive": enc(pos_tokens) * pos_mask[:, None], "logit_scale": torch.tensor(math.log(10.0))}


def _net_batch(inputs, masks, rows):
    return {"images": inputs["image"][rows], "text_tokens": inputs["text"][rows],
            "neg_tokens": inputs["negative"][rows], "pos_tokens": inputs["positive"][rows],
            **{k: v[rows] for k, v in masks.items()}}


def _gwg_case(rank, world, result_dir, with_grad):
    """One rank of forward_loss with or without gather_with_grad -> gwg-<with_grad>-<rank>.pt."""
    import torch.distributed as dist

    from hardpos.train.step import forward_loss

    weight, inputs, masks = _global_problem()
    net = _LinearNet(weight)
    per = 8 // world
    terms = forward_loss(net, _net_batch(inputs, masks, slice(rank * per, (rank + 1) * per)),
                         LossConfig(**_CFG, gather_with_grad=with_grad))
    terms["total"].backward()
    grad = net.weight.grad.clone()
    dist.all_reduce(grad)  # DDP's average
    grad /= world
    torch.save({"total": float(terms["total"]), "grad": grad},
               os.path.join(result_dir, f"gwg-{with_grad}-{rank}.pt"))


def _all_cases_worker(rank, world, init_file, result_dir):
    """Every two-rank case in one gloo process group (spawning two processes that import torch
    costs about 4 s; one spawn serves the four tests)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for scope in ("global", "worker"):
            _loss_case(rank, world, result_dir, scope)
        for with_grad in (True, False):
            _gwg_case(rank, world, result_dir, with_grad)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    """The folder of every two-rank case's per-rank results (one spawn of 2 gloo ranks)."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("two-ranks")
    mp.start_processes(_all_cases_worker, args=(2, str(out / "init"), str(out)), nprocs=2, join=True,
                       start_method="spawn")
    return out


@pytest.mark.integration  # two torch.distributed worker processes
@pytest.mark.parametrize("with_grad", [True, False])
def test_gather_with_grad_weighs_the_contrastive_term_as_stated(two_rank_results, with_grad):
    """2 gloo ranks: with gradient the averaged update is the full-batch gradient; without
    (TSVLC) it is 1/W of the contrastive part plus the full gradient of the other terms."""
    from hardpos.train.step import forward_loss

    weight, inputs, masks = _global_problem()
    net = _LinearNet(weight)
    single = forward_loss(net, _net_batch(inputs, masks, slice(0, 8)), LossConfig(**_CFG))
    g_full = torch.autograd.grad(single["total"], net.weight, retain_graph=True)[0]
    g_con = torch.autograd.grad(single["contrastive"], net.weight)[0]
    world = 2
    expected = g_full if with_grad else g_full - g_con + g_con / world

    for rank in range(world):
        res = torch.load(two_rank_results / f"gwg-{with_grad}-{rank}.pt", weights_only=True)
        assert res["total"] == pytest.approx(float(single["total"]), abs=1e-9)  # the same loss value either way
        # the loss works in float32, and the two paths round differently
        torch.testing.assert_close(res["grad"], expected, rtol=1e-5, atol=1e-6)
    # the two settings really differ here, far beyond that tolerance
    assert float((g_con / world).abs().max()) > 1e-2
