"""A multi-node Ray cluster simulated on one machine, and the thread/kill helpers of the
resilience scenarios (:mod:`benchmarks.resilience`).

This module owns the cluster (start, add a node, SIGKILL a node by the PIDs Ray recorded,
tear down) and the process environment it needs (:func:`scoped_environ`); the scenarios and
their checks are in :mod:`benchmarks.resilience`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator

import ray
from ray.cluster_utils import Cluster

from tests.support import free_port


@contextlib.contextmanager
def scoped_environ(**values: str) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the ``with`` block and restore the whole mapping on
    exit (what the block added is removed, what it changed or removed is put back).

    Why the process environment at all: the simulated cluster's raylets, and their workers,
    inherit it when ``ray.cluster_utils.Cluster`` starts them; there is no per-node env
    argument. Restoring keeps that a private detail of the run.
    """
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)



class SimCluster:
    """A Ray cluster of separate raylets on this machine; the driver connects to its head.

    The head has 0 CPUs (drivers, GCS, Serve controller/proxy only), so every task and
    worker runs on a node this class can kill. ``kill`` stops one node's processes by the
    PIDs Ray started for it (never anything else on the machine). The environment it sets
    for its processes (``RAY_AUTH_MODE``, ``RAY_ADDRESS``) is restored by :meth:`close`.
    """

    def __init__(self, node_cpus: float = 1, node_resources: dict[str, float] | None = None, workers: int = 2):
        if ray.is_initialized():
            raise RuntimeError("the resilience run starts its own cluster: run it in a process without Ray")
        self._environ = contextlib.ExitStack()  # closed (the environment restored) in close()
        self._environ.enter_context(scoped_environ())
        try:
            self._start(node_cpus, node_resources, workers)
        except BaseException:
            self._environ.close()
            raise

    def _start(self, node_cpus: float, node_resources: dict[str, float] | None, workers: int) -> None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # loopback-only, private cluster
        self.node_cpus = node_cpus
        self.node_resources = dict(node_resources or {})
        self.gcs_port = free_port()
        self.cluster = Cluster(initialize_head=True, connect=False, head_node_args={
            "num_cpus": 0, "gcs_server_port": self.gcs_port,
            "dashboard_agent_listen_port": free_port(), "include_dashboard": False,
            "object_store_memory": 200 * 1024 * 1024,
        })
        # Every process of this cluster (raylets inherit this environment, their workers
        # too) must find *this* GCS: Ray's address auto-detection picks the newest of all
        # Rays on the machine (e.g. Ray Train's placement-group cleaner would watch another).
        os.environ["RAY_ADDRESS"] = self.cluster.address
        self.nodes = [self.add_node() for _ in range(workers)]
        ray.init(address=self.cluster.address)
        self.killed = 0

    def add_node(self, attempts: int = 3):
        # Ray gives a raylet 30 s (fixed) to register; on a loaded machine that can pass, so
        # retry (a late raylet still joins; the cluster's exit hook stops its processes).
        for attempt in range(attempts):
            try:
                return self.cluster.add_node(num_cpus=self.node_cpus, resources=dict(self.node_resources),
                                             object_store_memory=150 * 1024 * 1024)
            except Exception:
                if attempt == attempts - 1:
                    raise
                time.sleep(2)

    def node_by_id(self, node_id: str):
        for node in list(self.cluster.worker_nodes):
            if node.node_id == node_id:
                return node
        raise LookupError(f"no live worker node {node_id}")

    def kill(self, node, replace: bool = True):
        """SIGKILL one worker node's processes (raylet, agents: the PIDs Ray recorded when it
        started them; its worker processes exit with their raylet); optionally start a fresh
        node in its place. Safe from any thread (Cluster.remove_node is main-thread only)."""
        infos = [info for group in node.all_processes.values() for info in group]
        for info in infos:
            try:
                os.kill(info.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for info in infos:
            try:
                info.process.wait(timeout=30)  # reap: they are this process's children
            except Exception:
                pass
        node.all_processes = {}
        self.cluster.worker_nodes.discard(node)
        self.nodes = [n for n in self.nodes if n is not node]
        self.killed += 1
        if replace:
            self.nodes.append(self.add_node())

    def close(self) -> None:
        try:
            ray.shutdown()
        finally:
            try:
                self.cluster.shutdown()
            finally:
                self._environ.close()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run the work in a thread: node kills and node starts must stay in the main thread
    (Ray's node bookkeeping installs signal handlers)."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:  # re-raised by the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def kill_when(sim: SimCluster, thread: threading.Thread, ready: Callable[[], bool], victim: Callable[[], Any],
               timeout: float, what: str) -> dict[str, Any]:
    """Wait (main thread) until ``ready()``, then kill ``victim()`` and start a fresh node."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and thread.is_alive():
        if ready():
            node = victim()
            kill_t = time.time()
            sim.kill(node)
            return {"kill_t": kill_t}
        time.sleep(0.1)
    return {"killer_error": f"no kill: the work {'finished' if not thread.is_alive() else 'timed out'} "
                            f"before {what}"}
