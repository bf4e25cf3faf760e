"""The rules: everything that edits or judges a caption's words.

* :mod:`hardpos.rules.perturber` -- ``RulePerturber``: REPLACE and SWAP edits of a caption, and
  the seeded picks (``pick_triplet``, ``pick_balanced``, the per-process ``cached_perturber``).
  The rules are functions over a ``RuleContext`` (the lexicon and its derived word sets):
  :mod:`~hardpos.rules.context` (the context, lexicon matching and the token helpers the
  families share), :mod:`~hardpos.rules.replace` (REPLACE rules), :mod:`~hardpos.rules.swap`
  (SWAP rules); :mod:`~hardpos.rules.text` (tokens, records, text edits),
  :mod:`~hardpos.rules.balance` (n-gram balanced picks).
* :mod:`hardpos.rules.validate` -- accept or reject a generated hard positive/negative,
  with a reason. Its parts: :mod:`~hardpos.rules.wordclasses` (word classes for the SWAP
  checks), :mod:`~hardpos.rules.conjuncts` (``is_conjunct_swap``), :mod:`~hardpos.rules.textnorm`
  (comparison forms and word n-gram features).
* :mod:`hardpos.rules.english` -- the one place for English agreement: its word lists
  (determiners, counts, ...), determiner/number agreement and "still English" (run on every
  rule candidate and by the validator in every mode), "a"/"an", and the blind audit's
  grammar rules.
* :mod:`hardpos.rules.lexicon` -- the curated word classes and synonym tables the rules read;
  :mod:`hardpos.rules.paper_table` recovers the paper's REPLACE table from its release.

Nothing here imports Ray, torch, the synthetic world or the rest of the platform.
"""
