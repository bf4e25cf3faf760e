"""One module per stage. Each defines ``Config`` (a :class:`hardpos.config.JobConfig`
dataclass) and ``run(cfg, ctx) -> dict`` (the summary); :func:`hardpos.runtime.execute`
adds the job contract around it. Ray, MLflow and I/O live here, at the edges; the maths
lives in the library modules these call. The ``train`` stage lives in its own package beside
its workers (:mod:`hardpos.train.stage`); :mod:`hardpos.stages.compose` holds the steps the
demo and the base stage share."""
