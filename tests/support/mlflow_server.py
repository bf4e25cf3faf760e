"""A real ``mlflow server`` on 127.0.0.1 that a test or a benchmark crashes and restarts.

SQLite backend (or any backend store URI, e.g. PostgreSQL) and local artifacts under one folder; the server runs in its own process
group, which :meth:`LocalMlflowServer.kill` SIGKILLs by id (the server forks a uvicorn
worker). Nothing else on the machine is touched; nothing runs at import time.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests


class LocalMlflowServer:
    """``mlflow server`` on 127.0.0.1 (SQLite + local artifacts under ``root``) that can be
    crashed and restarted on the same port and database. Stops only its own process group."""

    def __init__(self, root: str | os.PathLike, port: int | None = None, backend_store_uri: str | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        if port is None:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.db = self.root / "server.db"
        self.backend_store_uri = backend_store_uri  # None: the SQLite file above (e.g. a PostgreSQL URI)
        self.proc: subprocess.Popen | None = None

    @property
    def store(self) -> str:
        """The backing database: readable directly while the server is down."""
        return self.backend_store_uri or f"sqlite:///{self.db}"

    def start(self, wait: bool = True, timeout: float = 300) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.store,
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if requests.get(f"{self.url}/health", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}")
            time.sleep(0.3)
        raise RuntimeError(f"mlflow server on {self.url} did not answer /health within {timeout:.0f} s")

    def kill(self) -> None:
        """SIGKILL its process group (the server forks a uvicorn worker): a crash, not a goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None
