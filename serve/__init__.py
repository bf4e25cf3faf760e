"""Deploy files of the HardPos scoring app: ``config.yaml`` (``serve run serve/config.yaml``).
The app is :mod:`hardpos.serve.app`. Imports nothing."""
