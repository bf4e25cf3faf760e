"""The data layer: caption sources, triplet files, the caption validator, the rule
perturbation engine and the synthetic world.

Modules (import the one you need; nothing here is imported eagerly so the CLI stays fast):

* :mod:`hardpos.data.captions`  -- caption sources: :mod:`~hardpos.data.captions.formats` (every
  caption format, ``read_captions(uri)``), :mod:`~hardpos.data.captions.stream` (a source at scale,
  read by Ray Data: the generate stage's input), :mod:`~hardpos.data.captions.training` (captions
  with their images for training and evaluation: triplet files, inline parquet, webdataset).
* :mod:`hardpos.data.triplets`  -- the triplet row contract: make/read/write.
* :mod:`hardpos.data.rules.validate`  -- accept/reject a generated hard positive/negative with a reason.
  Its parts: :mod:`hardpos.data.textnorm` (normalisation), :mod:`hardpos.data.rules.wordclasses`
  (word classes for SWAP checks), :mod:`hardpos.data.rules.conjuncts` (``is_conjunct_swap``).
* :mod:`hardpos.data.rules.perturber`   -- ``RulePerturber``: rule-based hard negatives and positives.
  Its parts: :mod:`hardpos.data.rules.text` (tokens, records, text edits),
  :mod:`hardpos.data.rules.replace` (REPLACE rules), :mod:`hardpos.data.rules.swap` (SWAP rules).
* :mod:`hardpos.data.lexicon`   -- the curated word classes and synonym tables the rules use.
* :mod:`hardpos.data.world`     -- the procedural synthetic world with exact ground truth.
  Its parts: :mod:`hardpos.data.scene` (config, vocabulary, scenes, rendering),
  :mod:`hardpos.data.grammar` (caption grammar, parser, truth).
"""
