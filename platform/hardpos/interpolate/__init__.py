"""Weight-space interpolation (WiSE-FT), one module per job:

* :mod:`.mix` -- the mix of two state dicts, the checks that two models can be mixed, and
  loading both endpoints (pure, Ray-free; torch loads with the models);
* :mod:`.stage` -- the ``interpolate`` stage: each mix scored as the evaluate stage scores a
  model (:mod:`hardpos.eval.model_eval`), tracked as a child run, the trade-off curve.

Import the submodules directly; this package imports nothing on its own.
"""
