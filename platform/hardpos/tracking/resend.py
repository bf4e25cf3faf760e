"""``hardpos track replay``: send the records a job could not deliver to their MLflow runs.

A queue that closes while the server is away leaves ``*.undelivered.jsonl`` files in its
spill folder (:mod:`hardpos.tracking.files`); :func:`replay` sends them later, oldest record
first. Resending is harmless (see "Exactly once" in :mod:`hardpos.tracking.transport`), so a
replay that fails half-way can simply be run again.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
from pathlib import Path

from mlflow.tracking import MlflowClient

# The module, not its names: tests swap transport.transport_for for a switchable one.
from hardpos.tracking import transport
from hardpos.tracking.files import (LEDGER_SUFFIX, LOCAL_PREFIX, UNDELIVERED_SUFFIX, drop_copy, read_jsonl,
                                    undelivered_files, write_jsonl)
from hardpos.tracking.store import ensure_experiment
from hardpos.tracking.transport import Rejected, Transient, deliver, fail_fast_http, log_model_now, next_unit

log = logging.getLogger("hardpos.tracking")


@dataclasses.dataclass
class ReplayReport:
    """What :func:`replay` sent."""

    files: int = 0
    runs: dict[str, str] = dataclasses.field(default_factory=dict)  # run id in the file -> run id in MLflow
    delivered: int = 0
    rejected: int = 0
    left: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)



def replay(path: str | os.PathLike, tracking_uri: str | None = None, timeout_s: float = 30.0) -> ReplayReport:
    """Send undelivered files to their runs, oldest record first; a file whose records all
    went is deleted, one that fails is rewritten with what is left (resending is harmless:
    see "Exactly once" above).

    ``tracking_uri`` overrides the URI each file names (the server moved). A run recorded
    locally (``local-...``: the server was down when the job started) is created first (same
    experiment, name, tags and start time); its new id is kept in ``<local id>.run.json``
    beside the file, so files of the same run replayed later land in the same run.
    """
    report = ReplayReport()
    files = undelivered_files(path)
    # Runs created locally first, parents before children (a child's parent tag may name a local run).
    parsed = []
    for f in files:
        rows = read_jsonl(f)
        if not rows or rows[0].get("kind") != "header":
            report.errors.append(f"{f}: no header line (not an undelivered tracking file)")
            continue
        parsed.append((f, rows[0], rows[1:]))
    parsed.sort(key=lambda item: (not any(r["kind"] == "create" for r in item[2]),
                                  any(str(v).startswith(LOCAL_PREFIX) for r in item[2] if r["kind"] == "create"
                                      for v in r.get("tags", {}).values()),
                                  str(item[0])))
    mapping = _known_local_runs(files)
    for f, header, rows in parsed:
        report.files += 1
        uri = tracking_uri or header["tracking_uri"]
        run_id = header["run_id"]
        try:
            if run_id.startswith(LOCAL_PREFIX):
                run_id = mapping.get(run_id) or _create_local_run(uri, run_id, rows, mapping, f.parent, timeout_s)
            report.runs[header["run_id"]] = run_id
        except Exception as exc:  # noqa: BLE001 - report and go on with the next file
            report.errors.append(f"{f}: cannot create run {run_id}: {type(exc).__name__}: {exc}"[:500])
            report.left += len(rows)
            continue
        left, delivered, rejected, error = _replay_rows(uri, run_id, rows, f.parent, timeout_s)
        report.delivered += delivered
        report.rejected += rejected
        if left:
            report.left += len(left)
            report.errors.append(f"{f}: {len(left)} record(s) left ({error})")
            write_jsonl(f, [header, *left])
        else:
            f.unlink()
            for rec in rows:
                if rec["kind"] == "artifact":
                    drop_copy(f.parent, rec["path"])
            run = glob.escape(header["run_id"])
            if not any(f.parent.glob(f"{run}.*{UNDELIVERED_SUFFIX}")):  # the run is complete in MLflow
                for ledger in f.parent.glob(f"{run}.*{LEDGER_SUFFIX}"):
                    ledger.unlink(missing_ok=True)
    return report


def _known_local_runs(files: list[Path]) -> dict[str, str]:
    mapping = {}
    for folder in {f.parent for f in files}:
        for p in folder.glob(f"{LOCAL_PREFIX}*.run.json"):
            try:
                mapping[p.name[: -len(".run.json")]] = json.loads(p.read_text())["run_id"]
            except (OSError, ValueError, KeyError):
                continue
    return mapping


def _create_local_run(uri: str, local_id: str, rows: list[dict], mapping: dict[str, str], folder: Path,
                      timeout_s: float) -> str:
    create = next((r for r in rows if r["kind"] == "create"), None)
    if create is None:
        raise ValueError(f"run {local_id} was recorded locally but this file does not say how to create it "
                         f"(replay the folder holding its driver's file first)")
    tags = {k: mapping.get(v, v) for k, v in create.get("tags", {}).items()}
    with fail_fast_http(timeout_s):
        exp_id = ensure_experiment(create["experiment"], uri)
        run = MlflowClient(uri).create_run(exp_id, start_time=create.get("start_time"), tags=tags,
                                           run_name=create.get("run_name"))
    run_id = run.info.run_id
    mapping[local_id] = run_id
    (folder / f"{local_id}.run.json").write_text(json.dumps({"run_id": run_id, "tracking_uri": uri}))
    return run_id


def _replay_rows(uri: str, run_id: str, rows: list[dict], folder: Path, timeout_s: float
                 ) -> tuple[list[dict], int, int, str | None]:
    """Send ``rows`` in order -> (rows not sent, delivered, rejected, last error)."""
    conn = transport.transport_for(uri, timeout_s)
    body = [r for r in rows if r["kind"] not in ("create",)]
    i, delivered, rejected = 0, 0, 0
    while i < len(body):
        if body[i]["kind"] == "model":
            try:
                log_model_now(uri, run_id, body[i]["dir"], timeout_s)
                delivered += 1
            except Exception as exc:  # noqa: BLE001
                return body[i:], delivered, rejected, f"log_model: {type(exc).__name__}: {str(exc)[:200]}"
            i += 1
            continue
        n = next_unit(body, i)
        unit = body[i:i + n]
        try:
            deliver(conn, run_id, unit, str(folder))
            delivered += n
        except Transient as exc:
            return body[i:], delivered, rejected, str(exc)[:300]
        except Rejected:
            for rec in unit:
                try:
                    deliver(conn, run_id, [rec], str(folder))
                    delivered += 1
                except Rejected as exc:
                    rejected += 1
                    log.warning("replay: the server refused a %s record (%s); dropped", rec["kind"], str(exc)[:200])
                except Transient as exc:
                    return body[body.index(rec, i):], delivered, rejected, str(exc)[:300]
        i += n
    return [], delivered, rejected, None
