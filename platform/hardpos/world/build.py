"""The synthetic world: procedural scenes with exact ground truth (the embedded default's data).

A scene holds 1-3 objects, each a shape (circle, square, triangle, diamond, star) with a
colour, a size (small | large) and a position, drawn with Pillow on a dark background at
``image_size`` pixels.  No two objects of a scene share all of (shape, colour, size), so
every noun phrase names one object.

Captions come from a small grammar in a canonical surface form:

* list:      "a large red circle", "a large red circle and a small blue square",
             "a large red circle, a small blue square and a large green star"
             (objects named left to right);
* relation:  "a large red circle above a small blue square" with one of
             "to the left of" | "to the right of" | "above" | "below", true with a margin.

Meaning is exact and order-free: a list caption is true when distinct objects match its
noun phrases; a relation caption when some ordered pair of distinct matching objects
stands in that relation.  :func:`truth` evaluates any caption of the grammar, including the
non-canonical synonyms ("crimson", "big", "over", "left of") and conjunct
orders, against a scene and returns True / False / None (None: a relation within the
ambiguity margin, neither clearly true nor clearly false).

Perturbations (benchmark items are verified against the scene: caption and hard positive
true, hard negative false):

* REPLACE attribute: one colour or size changed (negative) / rewritten with its synonym (positive);
* REPLACE relation: the relation changed (negative) / rewritten with its synonym (positive);
  every word has two rare synonyms: finetuning's rule positives use one (``SYNONYMS``), the
  benchmark's headline positives the other (``UNSEEN_SYNONYMS``), and the ``*_seen`` subsets
  hold the same items with the finetuning synonym, reported beside them;
* SWAP: colours or sizes exchanged between two objects (negative) / two conjuncts
  exchanged with their attributes (positive).

``noncanonical_rate`` is the share of pretraining captions that use one non-canonical form
(a synonym or a reordered list); default 0.5%, so a model pretrained on the world knows
them only weakly, as CLIP knows LLM paraphrases.

Finetuning captions are canonical unless ``finetune_synonym_rate`` > 0: then each colour,
size and relation word is written with its finetuning synonym at that rate (form "synonym"),
so the rule engine's REPLACE positives go both ways and ``perturb positive_picks=mirrored``
can balance them; pretraining captions and benchmarks are the same at every rate.

Output layout (train / evaluate / demo read exactly this)::

    <out_dir>/world.json
    <out_dir>/images/<split>/<id>.png
    <out_dir>/pretrain.parquet      triplet rows, hard_negative/hard_positive null, source "world"
    <out_dir>/finetune.parquet      triplet rows, captions only
    <out_dir>/benchmark/replace_attribute.parquet
    <out_dir>/benchmark/replace_relation.parquet
    <out_dir>/benchmark/swap.parquet
    <out_dir>/benchmark/replace_attribute_seen.parquet   (the same items, finetuning synonyms)
    <out_dir>/benchmark/replace_relation_seen.parquet

Image paths in the files are relative to the file's folder.  Deterministic by seed.

Layout: this module builds benchmark items and writes / loads the world; the vocabulary,
config and scenes live in :mod:`hardpos.world.scene` and the caption grammar in
:mod:`hardpos.world.grammar`; import those names from there.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import random
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hardpos import storage
from hardpos.world.grammar import (Caption, render_caption, canonical_caption, finetune_synonyms,
                                  list_text, noncanonical, np_text, relation_negative, relation_twin,
                                  truth,
                                  vague)
from hardpos.world.scene import (BENCHMARK_FILES, BENCHMARKS, RELATIONS, SPLITS, SYNONYMS, UNSEEN_SYNONYMS, Scene,
                                 WorldConfig, render, sample_scene)
from hardpos.data.triplets import make_triplet, write_triplets


def benchmark_item(rng: random.Random, scene: Scene, cfg: WorldConfig, subset: str) -> dict | None:
    """(caption, hard_negative, hard_positive, slot) for one benchmark subset, verified; None if impossible."""
    objs = scene.objects
    if subset == "replace_attribute":
        cap = canonical_caption(rng, scene, cfg)
        if cap is None:
            return None
        i = rng.choice(cap.objects)
        attrs = ["color", "size"] if len(cfg.sizes) > 1 else ["color"]
        attr = rng.choice(attrs)
        value = getattr(objs[i], attr)
        pool = [v for v in (cfg.colors if attr == "color" else cfg.sizes) if v != value]
        rng.shuffle(pool)
        others: set[str] = set()
        if rng.random() < cfg.binding_negative_rate:
            # a binding negative: the new value is another object's in this scene, so every word of
            # the negative is true of some object and only the attribute-object binding is wrong
            # (a bag-of-words model cannot tell it from the caption); falls back to any value
            others = {getattr(o, attr) for k, o in enumerate(objs) if k != i}
            pool.sort(key=lambda v: v not in others)  # stable: the shuffled order within each group
        tries = []
        for new in pool:
            if cfg.binding_partial_captions and new in others:
                # the caption leaves out every object that has the new value, so the negative
                # drops none of the caption's own words: only binding tells the two apart
                keep = sorted((k for k in range(len(objs)) if k == i or getattr(objs[k], attr) != new),
                              key=lambda k: objs[k].cx)
                tries.append((Caption(list_text([np_text(objs[k]) for k in keep]), "list", keep), new))
        tries += [(cap, new) for new in pool]  # the full caption (the fallback when partial ones fail)
        for item_cap, new in tries:
            neg = render_caption(scene, item_cap, words={(i, attr): new})
            if truth(neg, scene, cfg) is False:
                def positive(table: dict[str, str]) -> tuple[str, str]:
                    return (render_caption(scene, item_cap, words={(i, attr): table[value]}),
                            f"attribute:{attr} {value}->{table[value]}")

                return _verified(scene, cfg, item_cap.text, neg, f"attribute:{attr} {value}->{new}",
                                 positive(UNSEEN_SYNONYMS), positive(SYNONYMS), item_cap.template)
        return None
    if subset == "replace_relation":
        cap = canonical_caption(rng, scene, cfg, template="relation")
        if cap is None:
            return None
        found = relation_negative(rng, scene, cap, cfg)
        if found is None:
            return None
        new, neg = found

        def positive(table: dict[str, str]) -> tuple[str, str]:
            return (render_caption(scene, cap, relation=table[cap.relation]),
                    f"relation:{cap.relation}->{table[cap.relation]}")

        return _verified(scene, cfg, cap.text, neg, f"relation:{cap.relation}->{new}", positive(UNSEEN_SYNONYMS),
                         positive(SYNONYMS), cap.template)
    if subset == "swap":
        if len(objs) < 2:
            return None
        cap = canonical_caption(rng, scene, cfg, template="list")
        pairs = list(itertools.combinations(range(len(cap.objects)), 2))
        rng.shuffle(pairs)
        attrs = ["color", "size"]
        rng.shuffle(attrs)
        for (pa, pb), attr in itertools.product(pairs, attrs):
            i, j = cap.objects[pa], cap.objects[pb]
            vi, vj = getattr(objs[i], attr), getattr(objs[j], attr)
            if vi == vj:
                continue
            neg = render_caption(scene, cap, words={(i, attr): vj, (j, attr): vi})
            if truth(neg, scene, cfg) is not False:
                continue
            order = list(cap.objects)
            x, y = rng.sample(range(len(order)), 2)
            order[x], order[y] = order[y], order[x]
            pos = render_caption(scene, cap, order=order)
            return _verified(scene, cfg, cap.text, neg, f"attributes:{attr} {vi}<->{vj}", (pos, "conjuncts"), None,
                             "list")
        return None
    raise ValueError(f"unknown benchmark subset {subset!r}")


def _verified(scene: Scene, cfg: WorldConfig, caption: str, neg: str, slot: str, positive: tuple[str, str],
              seen: tuple[str, str] | None, template: str) -> dict:
    """The item's record once the benchmark's contract is checked (caption and every positive
    true, negative false): ``hard_positive`` / ``positive_slot`` from ``positive`` (the unseen
    synonym's for REPLACE), ``seen_positive`` / ``seen_positive_slot`` from ``seen`` (the
    finetuning synonym's; None for SWAP)."""
    positives = [positive[0]] + ([seen[0]] if seen else [])
    if truth(caption, scene, cfg) is not True or truth(neg, scene, cfg) is not False or any(
            truth(p, scene, cfg) is not True for p in positives):
        raise AssertionError(f"unverified world item: {caption!r} / {positives!r} / {neg!r}")
    return {"caption": caption, "hard_negative": neg, "hard_positive": positive[0], "slot": slot,
            "positive_slot": positive[1], "seen_positive": seen[0] if seen else None,
            "seen_positive_slot": seen[1] if seen else None, "template": template}


# ---------------------------------------------------------------------- vocabulary / rules
def vocabulary(cfg: WorldConfig) -> dict:
    """The world's words, canonical and non-canonical, as written to world.json."""
    return {
        "colors": list(cfg.colors), "shapes": list(cfg.shapes), "sizes": list(cfg.sizes),
        "relations": list(RELATIONS),
        "synonyms": {w: SYNONYMS[w] for w in [*cfg.colors, *cfg.sizes, *RELATIONS]},
        "unseen_synonyms": {w: UNSEEN_SYNONYMS[w] for w in [*cfg.colors, *cfg.sizes, *RELATIONS]},
    }


# ---------------------------------------------------------------------- generation
def _split_rng(seed: int, split: str) -> random.Random:
    # independent, reproducible streams per split (held-out scenes never share a stream)
    return random.Random(f"hardpos-world:{seed}:{split}")


def generate_world(cfg: WorldConfig, out_dir: str) -> dict:
    """Generate the world under ``out_dir`` (local or s3://) and return stats + paths.

    s3:// outputs are generated in a local temporary folder and uploaded as a whole.
    """
    cfg.validate()
    if storage.is_s3(out_dir):
        with tempfile.TemporaryDirectory(prefix="hardpos-world-") as tmp:
            stats = _generate_local(cfg, Path(tmp))
            storage.upload_dir(tmp, out_dir)
        return _with_paths(stats, out_dir)
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    return _with_paths(_generate_local(cfg, path), str(path))


def _with_paths(stats: dict, out_dir: str) -> dict:
    paths = {"world": storage.join(out_dir, "world.json"),
             "pretrain": storage.join(out_dir, "pretrain.parquet"),
             "finetune": storage.join(out_dir, "finetune.parquet")}
    for b in BENCHMARK_FILES:
        paths[b] = storage.join(out_dir, "benchmark", f"{b}.parquet")
    return {**stats, "paths": paths}


def _generate_local(cfg: WorldConfig, out: Path) -> dict:
    started = time.perf_counter()
    cpu_started = time.process_time()  # CPU seconds of this process (all threads): comparable on a shared box
    timings: dict[str, float] = {}
    scenes: dict[str, list[Scene]] = {}
    counts = {"pretrain": cfg.n_pretrain, "finetune": cfg.n_finetune, "benchmark": cfg.n_benchmark}
    t0 = time.perf_counter()
    for split in SPLITS:
        rng = _split_rng(cfg.seed, split)
        scenes[split] = [sample_scene(rng, cfg) for _ in range(counts[split])]
    timings["sample_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rows: dict[str, list[dict]] = {"pretrain": [], "finetune": []}
    forms: dict[str, int] = {}
    pair_rng = _split_rng(cfg.seed, "pretrain:pairs")  # its own stream: without pairs the world is unchanged
    synonym_words = synonym_places = 0  # finetune_synonym_rate: words rewritten / words that could be
    for split in ("pretrain", "finetune"):
        rng = _split_rng(cfg.seed, split + ":captions")
        originals = scenes[split]
        scenes[split] = []  # in row order: each twin right after its original
        for k, scene in enumerate(originals):
            cap = canonical_caption(rng, scene, cfg)
            text, form = cap.text, "canonical"
            if split == "pretrain" and rng.random() < cfg.noncanonical_rate:
                text, form = noncanonical(rng, scene, cap)
            elif split == "pretrain" and cfg.vague_caption_rate and rng.random() < cfg.vague_caption_rate:
                text, form = vague(scene, cap), "vague"
            elif split == "finetune" and cfg.finetune_synonym_rate:
                # a stable hash per row and word, no draw from rng: the rest of the world is unchanged
                text, n = finetune_synonyms(scene, cap, cfg.finetune_synonym_rate, f"{cfg.seed}:{split}-{k:06d}")
                form = "synonym" if n else form
                synonym_words += n
                synonym_places += len(cap.objects) * 2 + (cap.template == "relation")
            entries = [(scene, text, form, cap.template)]
            if (split == "pretrain" and cfg.relation_pair_rate and form in ("canonical", "vague")
                    and cap.template == "relation" and pair_rng.random() < cfg.relation_pair_rate):
                twin = relation_twin(pair_rng, scene, cap, text, cfg)
                if twin is not None:
                    entries.append((twin[0], twin[1], f"twin_{twin[2]}", "relation"))
            for scene_, text_, form_, template in entries:
                idx = len(scenes[split])
                scenes[split].append(scene_)
                if split == "pretrain":
                    forms[form_] = forms.get(form_, 0) + 1
                extra = {"pair": k if len(entries) > 1 else None} if cfg.relation_pair_rate else {}
                rows[split].append(make_triplet(
                    image=f"images/{split}/{idx:06d}.png", caption=text_, kind="caption", source="world",
                    caption_id=f"{split}-{idx:06d}", split=split, template=template, form=form_,
                    n_objects=len(scene_.objects), scene=scene_.to_json(), **extra))
    bench: dict[str, list[dict]] = {b: [] for b in BENCHMARK_FILES}
    rng = _split_rng(cfg.seed, "benchmark:items")
    for k, scene in enumerate(scenes["benchmark"]):
        for subset in BENCHMARKS:
            item = benchmark_item(rng, scene, cfg, subset)
            if item is None:
                continue
            # a REPLACE item twice: its unseen synonym (the headline subset) and its finetuning one;
            # a SWAP positive exchanges conjuncts as the rule engine's finetuning positives do (seen)
            versions = [(subset, item["hard_positive"], item["positive_slot"], subset == "swap")]
            if item["seen_positive"] is not None:
                versions.append((f"{subset}_seen", item["seen_positive"], item["seen_positive_slot"], True))
            for name, positive, positive_slot, seen in versions:
                bench[name].append(make_triplet(
                    image=f"../images/benchmark/{k:06d}.png", caption=item["caption"],
                    hard_negative=item["hard_negative"], hard_positive=positive,
                    kind="swap" if subset == "swap" else "replace", source="world",
                    caption_id=f"benchmark-{k:06d}-{subset}", split="benchmark", subset=subset, slot=item["slot"],
                    positive_slot=positive_slot, positive_seen=seen, template=item["template"],
                    n_objects=len(scene.objects), verified=True, scene=scene.to_json()))
    timings["captions_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    if cfg.write_images:
        for split in SPLITS:
            folder = out / "images" / split
            if folder.exists():
                shutil.rmtree(folder)  # a re-run must not leave images of a bigger earlier world
            folder.mkdir(parents=True)
        _render_all(cfg, out, scenes)
    timings["render_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    write_triplets(rows["pretrain"], str(out / "pretrain.parquet"))
    write_triplets(rows["finetune"], str(out / "finetune.parquet"))
    (out / "benchmark").mkdir(exist_ok=True)
    for subset in BENCHMARK_FILES:
        write_triplets(bench[subset], str(out / "benchmark" / f"{subset}.parquet"))
    timings["write_s"] = time.perf_counter() - t0
    total = time.perf_counter() - started
    cpu_total = time.process_time() - cpu_started
    n_scenes = sum(len(v) for v in scenes.values())  # twins included
    # vague and twins use canonical words
    noncanon = sum(v for k, v in forms.items() if k not in ("canonical", "vague") and not k.startswith("twin_"))
    stats = {
        "scenes": counts,
        "benchmark_items": {b: len(v) for b, v in bench.items()},
        "pretrain_noncanonical": noncanon,
        "pretrain_noncanonical_share": round(noncanon / max(1, cfg.n_pretrain), 5),
        "pretrain_forms": forms,
        "objects_histogram": {str(n): sum(1 for s in itertools.chain(*scenes.values()) if len(s.objects) == n)
                              for n in range(cfg.min_objects, cfg.max_objects + 1)},
        "seconds": round(total, 3),
        "scenes_per_s": round(n_scenes / total, 1) if total > 0 else None,
        "cpu_seconds": round(cpu_total, 3),
        "scenes_per_cpu_s": round(n_scenes / cpu_total, 1) if cpu_total > 0 else None,
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }
    if cfg.relation_pair_rate:
        stats["pretrain_twins"] = len(scenes["pretrain"]) - cfg.n_pretrain
    if cfg.finetune_synonym_rate:
        stats["finetune_synonym_words"] = synonym_words
        stats["finetune_synonym_share"] = round(synonym_words / max(1, synonym_places), 5)
    world = {"config": dataclasses.asdict(cfg), "stats": stats, "vocabulary": vocabulary(cfg),
             "layout": {"images": "images/<split>/<id>.png", "splits": list(SPLITS),
                        "benchmarks": {b: f"benchmark/{b}.parquet" for b in BENCHMARK_FILES}}}
    (out / "world.json").write_text(json.dumps(world, indent=2) + "\n")
    return stats


def _render_all(cfg: WorldConfig, out: Path, scenes: dict[str, list[Scene]]) -> None:
    """Render and write every scene's PNG.

    Drawing a 64 px scene costs tens of microseconds; the PNG encode and the file write
    dominate, and both release the GIL, so a few threads overlap them without the start-up
    cost (and the CPU grab) of a process pool.
    """
    def one(job: tuple[str, int, Scene]) -> None:
        split, k, scene = job
        render(scene, cfg.image_size).save(out / "images" / split / f"{k:06d}.png", format="PNG", compress_level=1)

    jobs = [(split, k, scene) for split, items in scenes.items() for k, scene in enumerate(items)]
    if len(jobs) < 256:
        for job in jobs:
            one(job)
        return
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in pool.map(one, jobs, chunksize=64):
            pass


def load_world(world_dir: str) -> dict:
    """world.json of a generated world (local or s3://)."""
    return storage.read_json(storage.join(world_dir, "world.json"))


def config_from_world(world_dir: str) -> WorldConfig:
    """The WorldConfig a world was generated with."""
    return WorldConfig(**load_world(world_dir)["config"])


def world_dir_of(uri: str) -> str | None:
    """The synthetic world an input belongs to: ``uri`` itself when it is a world folder, the
    file's folder when that holds a ``world.json`` (e.g. ``<world>/finetune.parquet``), else None.

    The perturb stage and the generate stage's rule engine both decide "is this a world input,
    and which world" with this one function, so both use that world's own lexicon.
    """
    if storage.exists(storage.join(uri, "world.json")):
        return uri
    parent = uri.rsplit("/", 1)[0] if "/" in uri else "."
    return parent if storage.exists(storage.join(parent, "world.json")) else None
