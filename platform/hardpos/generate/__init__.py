"""Hard-positive generation on Ray Data: the ``generate`` stage and its machinery.

* :mod:`hardpos.generate.stage`    -- the stage: ``Config``, ``check``, ``run`` (found through
  ``hardpos.runtime.STAGE_MODULES``).
* :mod:`hardpos.generate.prompts`  -- prompt templates as data (``load_prompts``).
* :mod:`hardpos.generate.engines`  -- the vllm / http / rules engines behind one contract, and
  every name of its parts: :mod:`~hardpos.generate.engine_config` (engine and sampling configs),
  :mod:`~hardpos.generate.vllm_engine` (the pure builders of the ``ray.data.llm`` processor),
  :mod:`~hardpos.generate.http_engine` (OpenAI-compatible client, many requests in flight per
  actor), :mod:`~hardpos.generate.flow` (its window and rate limits, pure),
  :mod:`~hardpos.generate.rules_engine` (the rule engine).
* :mod:`hardpos.generate.pipeline` -- the driver, and every name of its parts:
  :mod:`~hardpos.generate.planning` (inputs, shards, judging), :mod:`~hardpos.generate.join`
  (the triplet join), :mod:`~hardpos.generate.shard_files` (sharded resumable output, the
  streamed merge, webdataset shards).

The stage reads its captions with :mod:`hardpos.data.captions.stream` (files, folders, globs;
local or s3://; checked on the driver from their heads, read by Ray Data and kept in the cluster).

Its throughput benchmark is ``python -m benchmarks.generate_bench``, its scaling table
``python -m benchmarks.scaling`` (repository tools, not part of the package).

Nothing is imported eagerly (the CLI imports :mod:`~hardpos.generate.stage` to list its config
keys).
"""
