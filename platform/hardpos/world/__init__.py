"""The synthetic world: procedural scenes with exact ground truth (the embedded default's data).

* :mod:`hardpos.world.scene`   -- the world's config, vocabulary, scenes and rendering.
* :mod:`hardpos.world.grammar` -- the caption grammar: surface forms, parser and exact truth.
* :mod:`hardpos.world.build`   -- building a world folder (splits, benchmarks, images) and reading it back.
* :mod:`hardpos.world.lexicon` -- the rule lexicon restricted to a world, and its cached perturber.

Only this package knows the world; the rules it perturbs with are :mod:`hardpos.rules`.
"""
