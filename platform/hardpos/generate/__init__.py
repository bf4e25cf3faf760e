"""Hard-positive generation on Ray Data (the ``generate`` stage's machinery).

* :mod:`hardpos.generate.prompts`  -- prompt templates as data (``load_prompts``).
* :mod:`hardpos.generate.engines`  -- the vllm / http / rules engines behind one contract,
  and the pure builders of the ``ray.data.llm`` processor configs.
* :mod:`hardpos.generate.pipeline` -- planning, validation, sharded resumable output, the
  triplet join.

Its throughput benchmark is :mod:`hardpos.perf.generate_bench` (measuring tools live apart).

Nothing is imported eagerly (the CLI imports the stage module to list its config keys).
"""
