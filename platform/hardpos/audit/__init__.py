"""Audits: how much of an edit a reader without the image can see, and hand-audit samples.

* :mod:`hardpos.audit.blind`       -- the blind-text audit of any caption/edit data (``hardpos audit``).
* :mod:`hardpos.audit.text_models` -- the text-only models it fits (cross-fitted by caption).
* :mod:`hardpos.audit.hand`        -- repeatable samples of rule positives for a person to label,
  the labelled files' rates, and their regression report (what the labels still say about the
  current rules).
"""
