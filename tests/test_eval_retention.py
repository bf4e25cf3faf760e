"""Zero-shot classification and image-text retrieval on small generated data: exact
recall arithmetic on hand-built similarity matrices, and the end-to-end path."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from eval_util import tiny_model

from hardpos.eval import retention
from tests.support import PALETTE, write_image


@pytest.fixture(scope="module")
def lm():
    return tiny_model(seed=0)


def test_topk_hits_strict_ranks():
    sims = np.array([[0.9, 0.1, 0.2],    # target 0 best          -> rank 0
                     [0.5, 0.5, 0.1],    # target 1 tied with 0   -> rank 1 (tie counts against)
                     [0.3, 0.2, 0.1]])   # target 2 worst         -> rank 2
    hits = retention.topk_hits(sims, np.array([0, 1, 2]), ks=(1, 2, 3))
    assert hits[1].tolist() == [True, False, False]
    assert hits[2].tolist() == [True, True, False]
    assert hits[3].tolist() == [True, True, True]


def _image_folder(root):
    for colour, rgb in PALETTE.items():
        for k in range(2):
            write_image(root / colour / f"{k}.png", tuple(max(0, c - 20 * k) for c in rgb))
    (root / "README.txt").write_text("not an image")
    return root


def test_zero_shot_matches_a_direct_computation(tmp_path, lm):
    root = _image_folder(tmp_path / "folder")
    spec = retention.ZeroShotSpec("colours", str(root), classnames="folders", templates=["a photo of a {}.", "a {} thing"])
    out = retention.zero_shot(lm.model, lm.preprocess_val, lm.tokenizer, spec, batch_size=3)
    assert out["zeroshot/colours/n_images"] == 8 and out["zeroshot/colours/n_classes"] == 4
    assert out["zeroshot/colours/top5"] == 1.0  # 4 classes: always within the top 5
    # reference: per-template full-context encoding, mean, renormalise; argmax
    from PIL import Image

    names = sorted(PALETTE)
    model = lm.model.eval()
    with torch.no_grad():
        cls = torch.stack([torch.nn.functional.normalize(model.encode_text(lm.tokenizer([t.format(c) for t in spec.templates]), normalize=True).mean(0), dim=0) for c in names])
        correct = 0
        for ci, c in enumerate(names):
            for k in range(2):
                f = model.encode_image(lm.preprocess_val(Image.open(root / c / f"{k}.png").convert("RGB"))[None], normalize=True)
                correct += int((f @ cls.T).argmax() == ci)
    assert out["zeroshot/colours/top1"] == pytest.approx(correct / 8)
    with pytest.raises(retention.RetentionError, match="2 class names for 4"):
        retention.zero_shot(lm.model, lm.preprocess_val, lm.tokenizer, retention.ZeroShotSpec("x", str(root), classnames=["a", "b"]))
    with pytest.raises(retention.RetentionError, match="no class folders"):
        retention.zero_shot(lm.model, lm.preprocess_val, lm.tokenizer, retention.ZeroShotSpec("x", str(tmp_path / "empty")))
    with pytest.raises(retention.RetentionError, match="1000 class names for 4 class folders"):  # the ImageNet default
        retention.zero_shot(lm.model, lm.preprocess_val, lm.tokenizer, retention.ZeroShotSpec("x", str(root)))


def test_zero_shot_defaults_are_open_clips_imagenet_names_and_openai_templates():
    import open_clip
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES, SIMPLE_IMAGENET_TEMPLATES

    spec = retention.ZeroShotSpec("imagenet", "/data/imagenet/val")
    assert (spec.classnames, spec.templates) == ("imagenet", "openai")
    names, templates = retention.resolve_classnames(spec.classnames), retention.resolve_templates(spec.templates)
    assert len(names) == 1000 and names == list(open_clip.IMAGENET_CLASSNAMES)
    assert names[0] == "tench" and names[999] == "toilet paper"
    assert len(templates) == 80 and templates[0] == "a bad photo of a {}."
    # the format strings give exactly open_clip's prompts (its templates are callables)
    for name in ("tench", "great white shark", "toilet paper"):
        assert [t.format(name) for t in templates] == [f(name) for f in OPENAI_IMAGENET_TEMPLATES]
    assert [t.format("x") for t in retention.resolve_templates("simple")] == [f("x") for f in SIMPLE_IMAGENET_TEMPLATES]
    assert len(SIMPLE_IMAGENET_TEMPLATES) == 7
    assert retention.resolve_classnames("folders") is None


def test_class_embeddings_equal_open_clips_zero_shot_classifier(lm):
    """HardPos's recipe (trimmed tokens, batched whole classes) == build_zero_shot_classifier
    on the model itself at full context."""
    import open_clip

    names = list(open_clip.IMAGENET_CLASSNAMES[:5])
    model = lm.model.eval()
    ours = retention.class_embeddings(model, lm.tokenizer, names, retention.resolve_templates("openai"), batch_size=170)  # 2 classes/pass
    ref = open_clip.build_zero_shot_classifier(model, lm.tokenizer, names, open_clip.OPENAI_IMAGENET_TEMPLATES,
                                               num_classes_per_batch=None, device="cpu").T
    assert ours.shape == (5, 64) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(5))
    # and it is the mean of the normalised template embeddings, renormalised
    with torch.no_grad():
        per = model.encode_text(lm.tokenizer([t.format(names[2]) for t in retention.resolve_templates("openai")]), normalize=True)
    torch.testing.assert_close(ours[2], torch.nn.functional.normalize(per.mean(0), dim=0), atol=1e-5, rtol=0)


def test_folder_layouts_map_to_class_indices():
    wnids = [f"n{i:08d}" for i in range(1000)]
    assert retention.folder_class_indices(sorted(wnids), 1000, require_wnids=True) == list(range(1000))
    assert retention.folder_class_indices(sorted(["0", "10", "2", "999"]), 1000) == [0, 10, 2, 999]  # numeric, not text order
    assert retention.folder_class_indices(["b", "a"], 2) == [0, 1]
    with pytest.raises(retention.RetentionError, match="out of range"):
        retention.folder_class_indices(["0", "5"], 5)
    with pytest.raises(retention.RetentionError, match="3 class names for 2 class folders"):
        retention.folder_class_indices(["a", "b"], 3)
    with pytest.raises(retention.RetentionError, match="wnid"):
        retention.folder_class_indices(sorted(wnids[:-1] + ["toilet_paper"]), 1000, require_wnids=True)


def test_zero_shot_default_spec_on_imagenet_style_folders(tmp_path, lm, monkeypatch):
    """The default spec end to end on index-named folders (a subset of the classes): the
    classifier covers every class name, folder k is class k. open_clip's name list is cut
    to 6 classes (1000 x 80 prompts take minutes on a tiny CPU model)."""
    import open_clip.zero_shot_metadata as meta
    from PIL import Image

    names = list(meta.IMAGENET_CLASSNAMES[:6])
    monkeypatch.setattr(meta, "IMAGENET_CLASSNAMES", tuple(names))
    for cls, colour in (("1", "red"), ("4", "blue"), ("5", "green")):
        write_image(tmp_path / "val" / cls / "a.png", PALETTE[colour])
    out = retention.zero_shot(lm.model, lm.preprocess_val, lm.tokenizer, retention.ZeroShotSpec("inet", str(tmp_path / "val")), batch_size=200)
    assert out["zeroshot/inet/n_classes"] == 6 and out["zeroshot/inet/n_templates"] == 80 and out["zeroshot/inet/n_images"] == 3
    model = lm.model.eval()
    cls = retention.class_embeddings(model, lm.tokenizer, names, retention.resolve_templates("openai"))
    with torch.no_grad():
        feats = torch.cat([model.encode_image(lm.preprocess_val(Image.open(tmp_path / "val" / c / "a.png").convert("RGB"))[None],
                                              normalize=True) for c in ("1", "4", "5")])
    sims = (feats @ cls.T).numpy()
    assert out["zeroshot/inet/top1"] == pytest.approx(np.mean(sims.argmax(1) == [1, 4, 5]))
    assert out["zeroshot/inet/top5"] == pytest.approx(np.mean(retention.topk_hits(sims, np.array([1, 4, 5]), ks=(5,))[5]))


def test_custom_class_names_and_templates_from_lists_and_files(tmp_path, lm):
    root = _image_folder(tmp_path / "folder")
    names = ["sky", "leaf", "crimson", "lemon"]  # one per sorted folder: blue, green, red, yellow
    listed = retention.zero_shot(lm.model, lm.preprocess_val, lm.tokenizer,
                                 retention.ZeroShotSpec("c", str(root), classnames=names, templates=["a {} patch", "{}"]))
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n\n")
    (tmp_path / "templates.json").write_text(json.dumps(["a {} patch", "{}"]))
    from_files = retention.zero_shot(lm.model, lm.preprocess_val, lm.tokenizer,
                                     retention.ZeroShotSpec("c", str(root), classnames=str(tmp_path / "names.txt"),
                                                                   templates=str(tmp_path / "templates.json")))
    assert from_files == listed and listed["zeroshot/c/n_classes"] == 4 and listed["zeroshot/c/n_templates"] == 2
    assert retention.resolve_classnames(str(tmp_path / "names.txt")) == names
    for bad, match in [("imagenet21k", "neither one of imagenet, folders"), ([], "empty list")]:
        with pytest.raises(retention.RetentionError, match=match):
            retention.resolve_classnames(bad)
    for bad, match in [("a photo of a {}.", "as a list"), ("openia", "neither one of openai, simple"),
                       (["no placeholder"], "exactly one"), (["{} and {}"], "exactly one")]:
        with pytest.raises(retention.RetentionError, match=match):
            retention.resolve_templates(bad)


def test_retrieval_recalls_and_missing_images(tmp_path, lm):
    folder = tmp_path / "ret"
    rows = []
    for i, colour in enumerate(PALETTE):
        write_image(folder / "img" / f"{colour}.png", PALETTE[colour])
        rows += [{"image": f"img/{colour}.png", "caption": f"a {colour} square"},
                 {"image": f"img/{colour}.png", "caption": f"something {colour}"}]
    rows.append({"image": "img/missing.png", "caption": "never scored"})
    (folder / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = retention.retrieval(lm.model, lm.preprocess_val, lm.tokenizer, retention.RetrievalSpec("toy", str(folder / "captions.jsonl")))
    assert out["retrieval/toy/n_images"] == 4 and out["retrieval/toy/n_captions"] == 8 and out["retrieval/toy/n_missing_images"] == 1
    for k in (1, 5, 10):
        assert 0.0 <= out[f"retrieval/toy/i2t_r{k}"] <= 1.0 and 0.0 <= out[f"retrieval/toy/t2i_r{k}"] <= 1.0
    assert out["retrieval/toy/t2i_r5"] == 1.0 and out["retrieval/toy/i2t_r10"] == 1.0  # 4 images / 8 captions
    # i2t R@1 by hand: the image's best own caption beats every other image's caption
    from PIL import Image

    from hardpos.eval.pairs import score_pairs

    imgs = [Image.open(folder / "img" / f"{c}.png") for c in PALETTE]
    caps = [r["caption"] for r in rows[:-1]]
    sims = np.stack([score_pairs(lm.model, lm.preprocess_val, lm.tokenizer, [im] * len(caps), caps) for im in imgs])
    own = np.repeat(np.arange(4), 2)
    i2t1 = np.mean([sims[i, own == i].max() > sims[i, own != i].max() for i in range(4)])
    t2i1 = np.mean([sims[own[j], j] > np.delete(sims[:, j], own[j]).max() for j in range(8)])
    assert out["retrieval/toy/i2t_r1"] == pytest.approx(i2t1) and out["retrieval/toy/t2i_r1"] == pytest.approx(t2i1)


def test_retrieval_reads_coco_captions(tmp_path):
    coco = {"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}],
            "annotations": [{"image_id": 1, "caption": "x"}, {"image_id": 2, "caption": "y"}, {"image_id": 1, "caption": "z"}]}
    (tmp_path / "c.json").write_text(json.dumps(coco))
    assert retention.read_caption_pairs(str(tmp_path / "c.json")) == [("a.jpg", "x"), ("b.jpg", "y"), ("a.jpg", "z")]
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(retention.RetentionError, match="COCO captions"):
        retention.read_caption_pairs(str(tmp_path / "bad.json"))


def test_retrieval_reads_jsonl_pairs_and_names_bad_lines(tmp_path):
    good = tmp_path / "c.jsonl"
    good.write_text('{"image": "a.jpg", "caption": "x"}\n\n{"image": "b.jpg", "caption": "y"}\n')
    assert retention.read_caption_pairs(str(good)) == [("a.jpg", "x"), ("b.jpg", "y")]
    for name, text, match in [("bad.jsonl", '{"image": "a.jpg", "caption": "x"}\n{oops\n', "line 2 is not JSON"),
                              ("list.jsonl", '["a.jpg", "x"]\n', "line 1 is not a JSON object"),
                              ("nocap.jsonl", '{"image": "a.jpg", "caption": ""}\n', "row 1 needs non-empty")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(retention.RetentionError, match=match):
            retention.read_caption_pairs(str(tmp_path / name))
