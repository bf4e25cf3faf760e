"""Hard-positive generation on Ray Data (the ``generate`` stage's machinery).

* :mod:`hardpos.generate.prompts`  -- prompt templates as data (``load_prompts``).
* :mod:`hardpos.generate.engines`  -- the vllm / http / rules engines behind one contract,
  and the pure builders of the ``ray.data.llm`` processor configs.
* :mod:`hardpos.generate.pipeline` -- the driver, and every name of its parts:
  :mod:`~hardpos.generate.planning` (inputs, shards, judging), :mod:`~hardpos.generate.join`
  (the triplet join), :mod:`~hardpos.generate.shard_files` (sharded resumable output).

Its throughput benchmark is :mod:`hardpos.perf.generate_bench` (measuring tools live apart).

Nothing is imported eagerly (the CLI imports the stage module to list its config keys).
"""
