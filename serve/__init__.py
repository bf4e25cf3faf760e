"""The HardPos Ray Serve scoring app (see ``serve/app.py``). Imports nothing heavy."""
