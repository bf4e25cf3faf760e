"""Entry module kept for ``serve run serve.app:build_app ...`` from the repository root.

The app itself is :mod:`hardpos.serve.app` in the installed package; ``serve/config.yaml``,
the RayService and the images import ``hardpos.serve.app:build_app`` directly.
"""
from hardpos.serve.app import build_app

__all__ = ["build_app"]
