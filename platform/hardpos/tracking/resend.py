"""``hardpos track replay``: send the records a job could not deliver to their MLflow runs.

A journal that closes while the server is away leaves a ``*.undelivered.jsonl`` file in
its spill folder (:mod:`hardpos.tracking.journal`); :func:`replay` sends it later with the
journal's own shipper (:func:`~hardpos.tracking.journal.read_unit`,
:func:`~hardpos.tracking.journal.send_unit`), oldest record first, moving the file's cursor
past every request the server took. A replay that stops half-way resumes at the cursor when
run again (and resending is harmless anyway: "Exactly once" in
:mod:`hardpos.tracking.transport`).
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
from hardpos.tracking.journal import (LEDGER_SUFFIX, LOCAL_PREFIX, UNDELIVERED_SUFFIX, drop_journal, load_cursor,
                                      read_header, read_unit, records_after, save_cursor, send_unit,
                                      undelivered_files)
from hardpos.tracking.redact import is_redacted, redact_text
from hardpos.tracking.store import ensure_experiment
from hardpos.tracking.transport import Transient, fail_fast_mlflow, log_model_now

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
    went is deleted, one that stops keeps its cursor (the next replay starts there).

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
        try:
            header, start = read_header(f)
            parsed.append((f, header, records_after(f, load_cursor(f, start))))
        except ValueError as exc:
            report.errors.append(f"{exc} (not an undelivered tracking file)")
    parsed.sort(key=lambda item: (not any(r["kind"] == "create" for r in item[2]),
                                  any(str(v).startswith(LOCAL_PREFIX) for r in item[2] if r["kind"] == "create"
                                      for v in r.get("tags", {}).values()),
                                  str(item[0])))
    mapping = _known_local_runs(files)
    for f, header, rows in parsed:
        report.files += 1
        uri = tracking_uri or _usable_uri(header["tracking_uri"])
        if uri is None:
            report.errors.append(f"{f}: its tracking URI {header['tracking_uri']} was recorded without its password; "
                                 "give the real one with --tracking-uri or $MLFLOW_TRACKING_URI")
            report.left += len(rows)
            continue
        run_id = header["run_id"]
        try:
            if run_id.startswith(LOCAL_PREFIX):
                run_id = mapping.get(run_id) or _create_local_run(uri, run_id, rows, mapping, f.parent, timeout_s)
            report.runs[header["run_id"]] = run_id
        except Exception as exc:  # noqa: BLE001 - report and go on with the next file
            report.errors.append(f"{f}: cannot create run {run_id}: {type(exc).__name__}: {exc}"[:500])
            report.left += len(rows)
            continue
        left, delivered, rejected, error = _ship_file(uri, run_id, f, timeout_s)
        report.delivered += delivered
        report.rejected += rejected
        if left:
            report.left += left
            report.errors.append(f"{f}: {left} record(s) left ({error})")
        else:
            drop_journal(f)
            run = glob.escape(header["run_id"])
            if not any(f.parent.glob(f"{run}.*{UNDELIVERED_SUFFIX}")):  # the run is complete in MLflow
                for ledger in f.parent.glob(f"{run}.*{LEDGER_SUFFIX}"):
                    ledger.unlink(missing_ok=True)
    return report


def _usable_uri(recorded: str) -> str | None:
    """The URI a file names, or (its password was redacted) ``$MLFLOW_TRACKING_URI`` when that
    is the same server; None when there is no usable one."""
    if not is_redacted(recorded):
        return recorded
    env = os.environ.get("MLFLOW_TRACKING_URI", "")
    return env if env and redact_text(env) == recorded else None


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
    fail_fast_mlflow()
    exp_id = ensure_experiment(create["experiment"], uri)
    run = MlflowClient(uri).create_run(exp_id, start_time=create.get("start_time"), tags=tags,
                                       run_name=create.get("run_name"))
    run_id = run.info.run_id
    mapping[local_id] = run_id
    (folder / f"{local_id}.run.json").write_text(json.dumps({"run_id": run_id, "tracking_uri": redact_text(uri)}))
    return run_id


def _ship_file(uri: str, run_id: str, path: Path, timeout_s: float) -> tuple[int, int, int, str | None]:
    """Ship ``path`` from its cursor with the journal's shipper -> (records left, delivered,
    rejected, the error that stopped it)."""
    conn = transport.transport_for(uri, timeout_s)
    _, start = read_header(path)
    offset, end = load_cursor(path, start), path.stat().st_size
    delivered = rejected = 0
    while offset < end:
        unit, after = read_unit(path, offset, end)
        if not unit:
            break
        try:
            if unit[0]["kind"] == "create":   # done before shipping (the run exists now)
                pass
            elif unit[0]["kind"] == "model":
                try:
                    log_model_now(uri, run_id, unit[0]["dir"], timeout_s)
                except Exception as exc:  # noqa: BLE001 - left for the next replay
                    raise Transient(f"log_model: {type(exc).__name__}: {str(exc)[:200]}") from exc
                delivered += 1
            else:
                d, r = send_unit(conn, run_id, unit, path.parent, _refused)
                delivered, rejected = delivered + d, rejected + r
        except Transient as exc:
            return len(records_after(path, offset)), delivered, rejected, str(exc)[:300]
        offset = after
        save_cursor(path, offset)
    return 0, delivered, rejected, None


def _refused(rec: dict, exc: Exception) -> None:
    log.warning("replay: the server refused a %s record (%s); dropped", rec["kind"], str(exc)[:200])
