"""The rules: rule-based hard negatives and positives, and the validator every generated
caption passes (the LLM's and the rules' alike).

* :mod:`hardpos.data.rules.perturber` -- ``RulePerturber``: REPLACE and SWAP edits of a caption.
  Its parts: :mod:`~hardpos.data.rules.text` (tokens, records, text edits),
  :mod:`~hardpos.data.rules.replace` (REPLACE rules), :mod:`~hardpos.data.rules.swap` (SWAP rules).
* :mod:`hardpos.data.rules.validate` -- accept or reject a generated hard positive/negative,
  with a reason. Its parts: :mod:`~hardpos.data.rules.wordclasses` (word classes for the SWAP
  checks), :mod:`~hardpos.data.rules.conjuncts` (``is_conjunct_swap``); text normalisation is
  :mod:`hardpos.data.textnorm`.
* :mod:`hardpos.data.rules.agreement` -- determiner/number agreement and "still English", run on
  every rule candidate and by the validator in every mode.

The word tables the rules read are :mod:`hardpos.data.lexicon`'s (and ``lemminflect``'s word
forms). Nothing here imports Ray, torch or the rest of the platform.
"""
