"""The rule lexicon a world's captions are perturbed with, and the process's cached perturber.

Contract: :func:`world_lexicon` restricts the shipped rule lexicon to one world's words;
:func:`rule_lexicon` resolves a world folder (or none: the full lexicon) to its lexicon;
:func:`world_perturber` is the per-process cached :class:`~hardpos.rules.perturber.RulePerturber`
for (seed, world) that the ``perturb`` stage, the rule engine and the judge's rule negatives share.
"""
from __future__ import annotations

import dataclasses

from hardpos.rules.lexicon import Lexicon, load_lexicon
from hardpos.rules.perturber import RulePerturber, cached_perturber
from hardpos.world.build import config_from_world, vocabulary
from hardpos.world.scene import WorldConfig


def world_lexicon(cfg: WorldConfig | None = None) -> Lexicon:
    """The rule lexicon restricted to this world's words (so rule negatives stay in-vocabulary),
    with every finetuning synonym's positive back to its canonical word."""
    cfg = cfg or WorldConfig()
    voc = vocabulary(cfg)
    forms = set(voc["colors"]) | set(voc["shapes"]) | set(voc["sizes"]) | set(voc["relations"]) | set(voc["synonyms"].values())
    # Finetuning's REPLACE positives are the world's finetuning synonyms (``SYNONYMS``, the
    # vocabulary's "synonyms"), several of which the real REPLACE table shares ("red"->"crimson"),
    # so its pairs are let in; the unseen synonyms the benchmark's headline positives use are
    # not among the forms, so the rules never write them.
    lex = load_lexicon(include_benchmark_pairs=True, restrict_to=forms)
    # In the world a finetuning synonym means its word exactly (the grammar reads "golden" as
    # "yellow"), so a caption that uses it (``finetune_synonym_rate``) gets the positive back to the
    # canonical word, which the full lexicon leaves out for real captions where the synonym has
    # other senses ("golden" -> "yellow": "golden retriever"). A caption of canonical words never
    # meets these entries: worlds without synonyms in finetuning get the same triplets.
    positives = {k: list(v) for k, v in lex.positives.items()}
    for (form, cls), targets in lex.positives.items():
        syn = voc["synonyms"].get(form)
        if any(t == syn for t, _ in targets) and all(t != form for t, _ in positives.get((syn, cls), ())):
            positives.setdefault((syn, cls), []).append((form, "world"))
    # Likewise a synonym's negatives may be written with synonyms too ("over" -> "below" or
    # "beneath"), so balanced picks can keep the negatives' synonyms as frequent as the captions'
    # (canonical words' negatives stay canonical: the same triplets without synonyms).
    synonyms = set(voc["synonyms"].values())
    negatives = {k: tuple(dict.fromkeys([*v, *(voc["synonyms"][t] for t in v if t in voc["synonyms"])]))
                 if k[0] in synonyms else v for k, v in lex.negatives.items()}
    lex = dataclasses.replace(lex, positives={k: tuple(v) for k, v in positives.items()}, negatives=negatives)
    if not cfg.shape_negatives:  # shapes stay nouns (binding and swaps need them), only their negatives go
        lex = dataclasses.replace(lex, negatives={k: v for k, v in lex.negatives.items() if k[0] not in voc["shapes"]})
    return lex


def rule_lexicon(world_dir: str | None, include_benchmark_pairs: bool = False) -> Lexicon:
    """The rule lexicon: the synthetic world's (restricted to its words), or the full one
    without (by default) or with the REPLACE benchmark's substitution pairs."""
    if not world_dir:
        return load_lexicon(include_benchmark_pairs=include_benchmark_pairs)
    return world_lexicon(config_from_world(world_dir))


def world_perturber(seed: int, world_dir: str | None, include_benchmark_pairs: bool = False) -> RulePerturber:
    """The process's cached :class:`RulePerturber` for ``seed`` over :func:`rule_lexicon`'s lexicon
    (the fused rules -> judge stages share it, so its rule negatives hit its per-caption cache)."""
    return cached_perturber(seed, (world_dir, include_benchmark_pairs),
                            lambda: rule_lexicon(world_dir, include_benchmark_pairs))
