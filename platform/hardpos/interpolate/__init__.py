"""WiSE-FT: mixing a finetuned model's weights with its base's, and the stage that scores the curve.

* :mod:`hardpos.interpolate.mix`   -- the pure weight mixing and its checks (no Ray, no I/O).
* :mod:`hardpos.interpolate.stage` -- the ``interpolate`` stage: every mixing weight evaluated,
  the curve tracked in MLflow and the chosen point registered.
"""
