"""Where a load level's CPU went: CPU time of every process on this machine, by group.

On two cores shared by the load client, the server, its proxy and Ray's own processes, a
request's latency pays for everyone's CPU, so the loadgen reports, per target and level, the
CPU milliseconds per request each group of processes spent while it ran:

* ``server``: the process that answers (the target's Serve replicas, or the plain peer);
* ``haproxy``: every HAProxy process (Serve's ingress, the bare ones in front of a peer);
* ``ray``: Ray's other processes (controller, HAProxy manager, proxy, idle replicas, raylet,
  GCS, dashboard);
* ``client``: the load generator itself;
* ``other``: the rest of the machine.

:func:`cpu_snapshot` reads each process's CPU time as the sum of its threads' on-CPU
nanoseconds (``/proc/<pid>/task/<tid>/schedstat``: exact, where ``/proc/<pid>/stat`` counts
10 ms ticks) with its command line; :func:`cpu_by_group` (pure) turns two snapshots into
milliseconds per request by group. Off Linux a snapshot is empty and so are the figures.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

__all__ = ["GROUPS", "ProcessCpu", "cpu_by_group", "cpu_snapshot", "group_of"]

GROUPS = ("server", "haproxy", "ray", "client", "other")

#: pid -> (on-CPU nanoseconds so far, command line with spaces between its arguments)
ProcessCpu = dict[int, tuple[int, str]]


def cpu_snapshot(proc: Path = Path("/proc")) -> ProcessCpu:
    """Every process's CPU time so far and its command line. A process that ends while it is
    read is left out, a thread that does counts 0 (what either spent is lost to the level)."""
    out: ProcessCpu = {}
    if not (proc / "self" / "task").is_dir():
        return out
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            tasks = list(os.scandir(f"{entry.path}/task"))
            with open(f"{entry.path}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # the process ended
        out[int(entry.name)] = (sum(_task_ns(task.path) for task in tasks), cmdline)
    return out


def _task_ns(task_dir: str) -> int:
    """One thread's on-CPU nanoseconds so far; 0 for a thread that ended while read."""
    try:
        with open(f"{task_dir}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def group_of(pid: int, cmdline: str, *, server_pids: Collection[int] = (), server_marks: Iterable[str] = (),
             client_pid: int | None = None) -> str:
    """The group (:data:`GROUPS`) of one process: ``server`` when its pid is one of
    ``server_pids`` or its command line contains one of ``server_marks`` (a Serve replica's
    process title names its app: ``ray::ServeReplica:<app>:<deployment>``), ``client`` when it
    is ``client_pid``, ``haproxy`` when its program is HAProxy, ``ray`` for Ray's processes
    (``ray::`` titles, programs and arguments under a ``ray`` folder), else ``other`` (pure)."""
    if pid in server_pids or any(mark in cmdline for mark in server_marks):
        return "server"
    if pid == client_pid:
        return "client"
    program = cmdline.split(" ", 1)[0]
    if os.path.basename(program) == "haproxy":
        return "haproxy"
    if cmdline.startswith("ray::") or "/ray/" in cmdline:
        return "ray"
    return "other"


def cpu_by_group(before: ProcessCpu, after: ProcessCpu, requests: int,
                 group: Callable[[int, str], str]) -> dict[str, float]:
    """CPU milliseconds per request each group spent between two snapshots (pure): a process
    in ``after`` alone counts from zero (it started in between); ``group(pid, cmdline)`` names
    each process's group from its command line in ``after`` (a Ray worker takes its actor's
    title when it becomes one). Empty when either snapshot is (off Linux) or no request was
    made."""
    if not before or not after or requests <= 0:
        return {}
    spent = dict.fromkeys(GROUPS, 0)
    for pid, (ns, cmdline) in after.items():
        start = before[pid][0] if pid in before else 0
        name = group(pid, cmdline)
        spent[name] = spent.get(name, 0) + max(0, ns - start)
    return {name: round(ns / 1e6 / requests, 4) for name, ns in spent.items()}
