"""The files a run's tracking queue keeps in its spill folder, and how they are read.

Per run and process (``<process>`` = host-pid-random, so restarted workers never collide):

* ``<run_id>.<process>.spill.jsonl``: records that overflowed memory while the server was
  away (the oldest ones; deleted once sent);
* ``<run_id>.<process>.undelivered.jsonl``: what was left when the queue closed (first
  line: a header naming the run and the tracking URI), for a restarted worker to adopt or
  for ``hardpos track replay`` to send;
* ``<run_id>.<process>.ledger.json``: the highest step queued per metric key, so a resumed
  worker knows which steps were logged even while the server is down;
* ``artifacts/<run_id>/<process>-<id>/<name>``: copies of queued artifacts (the caller's
  temporary file may vanish before the upload).

Where the files are. ``spill_dir`` is a local folder (``<output_dir>/tracking``; for an
``s3://`` output_dir a folder under the system temp directory, named in summary.json). A
Ray Train worker that ends while the server is down does not wait: it leaves its file there
and the driver adopts it and waits instead (one ``drain_timeout_s`` per job, not per
process). On a multi-node cluster the driver sees a worker's file only when the folder is
shared (or the worker ran on the driver's node); otherwise the file stays on the worker's
node, named in that worker's log line.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

UNDELIVERED_SUFFIX = ".undelivered.jsonl"
SPILL_SUFFIX = ".spill.jsonl"
LEDGER_SUFFIX = ".ledger.json"
# Run ids of runs recorded locally (the server was down at the start): replay creates the real run.
LOCAL_PREFIX = "local-"


def spill_folder(spill_dir: str | os.PathLike | None) -> Path:
    """``spill_dir``, or a shared default under the system temp directory when None."""
    return Path(spill_dir) if spill_dir else Path(tempfile.gettempdir()) / "hardpos-tracking"


def process_tag() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Atomically (temp file + rename): a reader never sees half a file."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every non-blank line as JSON; a bad line raises ValueError naming the file and line."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not a JSON line ({exc})") from exc
    return rows


def count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def drop_copy(spill_dir: Path, rel: str) -> None:
    """Remove an artifact copy (``artifacts/<run>/<id>/<name>``) and the folders it leaves empty."""
    folder = spill_dir / Path(rel).parent
    shutil.rmtree(folder, ignore_errors=True)
    for parent in (folder.parent, folder.parent.parent):
        with contextlib.suppress(OSError):
            parent.rmdir()


def write_undelivered(path: Path, header: dict, spill: tuple[Path, int] | None, done_seq: int,
                      rest: list[dict]) -> int:
    """Stream a queue's leftovers into ``path`` (header first): the spill file's lines from
    byte ``spill[1]`` on whose ``seq`` is past ``done_seq``, then ``rest`` -> records
    written. Written to a temp file and renamed; no file at all when nothing is left."""
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(json.dumps(header) + "\n")
        if spill is not None:
            with open(spill[0], encoding="utf-8") as fh:
                fh.seek(spill[1])
                for line in fh:
                    if json.loads(line)["seq"] > done_seq:
                        out.write(line)
                        n += 1
        for rec in rest:
            out.write(json.dumps(rec) + "\n")
            n += 1
    if n:
        os.replace(tmp, path)
    else:
        tmp.unlink()
    return n


def ledger_step(spill_dir: str | None, run_id: str, key: str) -> int:
    """The highest step of ``key`` any process queued for the run, from the ledgers (0: none)."""
    best = 0
    for path in spill_folder(spill_dir).glob(f"{glob.escape(run_id)}.*{LEDGER_SUFFIX}"):
        try:
            best = max(best, int(json.loads(path.read_text()).get(key, 0)))
        except (OSError, ValueError):
            continue
    return best


def undelivered_files(path: str | os.PathLike) -> list[Path]:
    """Undelivered files at ``path`` (a file, or a folder searched recursively)."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{path}: no such file or folder")
    return sorted(p.rglob(f"*{UNDELIVERED_SUFFIX}"))
