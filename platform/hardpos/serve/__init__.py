"""The HardPos scoring service on Ray Serve (raw CLIP cosine scores over HTTP).

Modules (importing this package imports none of them):

* :mod:`hardpos.serve.config` -- the typed app configuration (``serve/config.yaml``'s ``args``).
* :mod:`hardpos.serve.errors` -- :class:`ServingError` (status + message), bearer auth, load errors.
* :mod:`hardpos.serve.requests` -- request parsing: bodies, payloads (through the schemas), images.
* :mod:`hardpos.serve.scoring` -- what a replica does without Ray: load, cache, score, verdicts.
* :mod:`hardpos.serve.batching` -- :class:`Batcher`: batches that form when the model is free.
* :mod:`hardpos.serve.schemas` -- the request models (the validation and ``/docs``), response shapes.
* :mod:`hardpos.serve.deployment` -- ``ScoringModel``: the model, batched (a deployment of its
  own only with ``colocate_model: false``; else the ingress's replicas hold it).
* :mod:`hardpos.serve.ingress` -- which ingress carries HTTP to the replicas (HAProxy or Serve's
  Python proxy, the cluster's choice) and the environment that picks HAProxy.
* :mod:`hardpos.serve.app` -- the ``ScoringAPI`` ingress and ``build_app``, the Serve builder
  (``import_path: hardpos.serve.app:build_app``).
"""
