"""`ray.include_dashboard=true`: a local Ray starts its dashboard on 127.0.0.1 and HardPos prints
the address. Run in a fresh interpreter: the test session's own Ray is already up,
and `init_ray` is idempotent."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import urllib.request

import pytest

from tests.support import free_port

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import sys
    import ray
    from hardpos.config import RayConfig
    from hardpos.runtime import init_ray
    init_ray(RayConfig(include_dashboard=True, num_cpus=1), dashboard_port=int(sys.argv[1]))
    sys.stdin.readline()  # the test reads the printed address, then tells us it is done
    ray.shutdown()
""")


def test_include_dashboard_starts_it_on_loopback_and_prints_its_address():
    port = free_port()
    # a short private temp dir: Ray's socket paths under pytest's tmp_path exceed AF_UNIX's 107 bytes
    ray_tmp = tempfile.mkdtemp(prefix="hp-dash-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(port)], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        line = ""
        for line in proc.stderr:  # the first lines are Ray's own start-up, if any
            if line.startswith("[hardpos] Ray dashboard:"):
                break
        assert line.strip() == f"[hardpos] Ray dashboard: http://127.0.0.1:{port}", line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60) as response:
            assert response.status == 200
            assert b"<html" in response.read(2000).lower()
    finally:
        proc.stdin.write("done\n")
        proc.stdin.flush()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
