"""A real PostgreSQL server on 127.0.0.1 for tests: ``initdb`` + ``postgres`` on a free port.

Binaries from ``$PATH`` or ``/usr/lib/postgresql/<version>/bin`` (Debian's ``postgresql``
package); :func:`binaries` says why when there are none (the tests skip with that reason).
PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user
(``runuser``) in a folder of its own under the system temp dir (a pytest ``tmp_path`` is
root-only). Password authentication (scram) for the one user, on TCP only. The server runs in
its own process group, which :meth:`LocalPostgres.stop` ends; nothing else is touched.
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

NAMES = ("initdb", "pg_ctl", "postgres")


def binaries() -> tuple[Path | None, str]:
    """(the folder holding initdb/pg_ctl/postgres, "") or (None, why not)."""
    found = shutil.which("initdb")
    candidates = [Path(os.path.realpath(found)).parent] if found else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for folder in candidates:
        if all((folder / n).is_file() for n in NAMES):
            return folder, ""
    return None, ("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in "
                  "/usr/lib/postgresql/*/bin (Debian: apt-get install postgresql)")


def _run_as() -> list[str]:
    """The prefix that runs a command as a non-root user (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        raise RuntimeError("running as root without runuser: cannot start PostgreSQL as another user")
    return ["runuser", "-u", "postgres", "--"]


class LocalPostgres:
    """``postgres`` on 127.0.0.1:``port`` with one database and one password user."""

    def __init__(self, user: str = "mlflow", password: str = "mlflow", database: str = "mlflow",
                 port: int | None = None) -> None:
        self.bin, why = binaries()
        if self.bin is None:
            raise RuntimeError(why)
        self.user, self.password, self.database = user, password, database
        if port is None:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix="hardpos-pg-"))
        self.data = self.root / "data"
        self.proc: subprocess.Popen | None = None

    def uri(self, driver: str = "") -> str:
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    def _chown(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            for p in self.root.rglob("*"):
                shutil.chown(p, "postgres", "postgres")

    def init(self) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        self._chown()
        subprocess.run([*_run_as(), str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user,
                        f"--pwfile={pwfile}", "-A", "scram-sha-256", "--no-sync", "-E", "UTF8", "--locale=C"],
                       check=True, capture_output=True, text=True, timeout=300)
        pwfile.unlink()

    def start(self, timeout: float = 120) -> None:
        if not self.data.exists():
            self.init()
        self.proc = subprocess.Popen(
            [*_run_as(), str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port), "-h", "127.0.0.1",
             "-k", str(self.root), "-c", "fsync=off", "-c", "max_connections=50"],
            stdout=subprocess.DEVNULL, stderr=open(self.root / "server.log", "ab"), start_new_session=True)
        self.wait_ready(timeout)
        if not getattr(self, "_created", False):
            self._create_database()
            self._created = True

    def wait_ready(self, timeout: float = 120) -> None:
        import psycopg  # lazy: the postgres extra; binaries() and the skip reason need no driver

        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                psycopg.connect(self._dsn("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"postgres exited with {self.proc.returncode}: "
                                       f"{(self.root / 'server.log').read_text()[-1000:]}") from None
                time.sleep(0.3)
        raise RuntimeError(f"postgres on 127.0.0.1:{self.port} did not accept connections within {timeout:.0f} s")

    def _dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} password={self.password} dbname={database}"

    def _create_database(self) -> None:
        import psycopg  # lazy: the postgres extra; binaries() and the skip reason need no driver

        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{self.database}"')

    def stop(self) -> None:
        """Stop the server (SIGINT: PostgreSQL's fast shutdown) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
