"""One module per stage. Each defines ``Config`` (a :class:`hardpos.config.JobConfig`
dataclass) and ``run(cfg, ctx) -> dict`` (the summary); :func:`hardpos.runtime.execute`
adds the job contract around it. Ray, MLflow and I/O live here, at the edges; the maths
lives in the library modules these call. The ``train``, ``generate`` and ``interpolate`` stages
live in their own packages beside their libraries (:mod:`hardpos.train.stage`,
:mod:`hardpos.generate.stage`, :mod:`hardpos.interpolate.stage`: ``hardpos.runtime.STAGE_MODULES``);
:mod:`hardpos.stages.compose` holds the steps the demo and the base stage share."""
