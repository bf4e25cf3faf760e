"""Models: naming, loading, saving, logging and registering open_clip CLIP models.

Read in this order (each module imports only those above it):

* :mod:`~hardpos.models.source`: what a ``pretrained`` string names (a tag, a path, ``s3://``,
  ``hf-hub:``, ``models:/`` / ``runs:/``, ``base:``) and a checkpoint folder's file names; no torch;
* :mod:`~hardpos.models.uri`: ``models:/`` and ``runs:/`` URIs in one MLflow store (resolve,
  download, pin an alias to its version); no torch;
* :mod:`~hardpos.models.bases`: the pretrained bases that ship with the package, and their manifests;
* :mod:`~hardpos.models.weights`: which architectures and weights exist and can be had offline
  (HardPos's bundled open_clip configs; the check a stage runs before loading);
* :mod:`~hardpos.models.clip`: load any source into an open_clip model, save a checkpoint, encode
  text and images (every stage, worker and Serve replica loads through it);
* :mod:`~hardpos.models.pyfunc`: a checkpoint as an MLflow pyfunc model (``log_model``), scored
  by ``mlflow.pyfunc.load_model(uri).predict``; :mod:`~hardpos.models.pyfunc_entry` is the file
  MLflow runs to load it;
* :mod:`~hardpos.models.registry`: rank runs, register the best, move aliases.
"""
