"""A new user's first mistakes, through the real CLI: each bad input fails fast, with exit 2
and one line that names the culprit, before anything is written that says "complete".

Every case runs ``python -m hardpos <stage> ...`` in a fresh subprocess (no network: the Hub
is marked offline with HF_HUB_OFFLINE=1, dead servers are closed ports on 127.0.0.1).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

# "Fails fast" is held by what the checks load, not by a wall clock (a clock fails on a busy
# machine, not on a slow check): a stage's config and checks load without torch, open_clip,
# Ray or MLflow (test_stage_configs_load_without_the_heavy_libraries), and a dead server costs
# one 2 s probe at most. Each case forks a child of a process that imported the CLI once.
HEAVY = ("torch", "open_clip", "ray", "mlflow")


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Good and bad input files, made once."""
    d = tmp_path_factory.mktemp("bad_inputs")
    (d / "img").mkdir()
    Image.new("RGB", (16, 16), "red").save(d / "img" / "a.png")
    row = {"image": ["img/a.png"], "caption": ["a dog"], "hard_negative": ["a cat"], "hard_positive": ["a puppy"]}
    pq.write_table(pa.table(row), d / "good.parquet")
    pq.write_table(pa.table({**row, "image": ["img/nope.png"]}), d / "noimage.parquet")
    pq.write_table(pa.table({"img": ["img/a.png"], "text": ["a dog"]}), d / "wrongcols.parquet")
    pq.write_table(pa.table({"image": pa.array([], pa.string()), "caption": pa.array([], pa.string())}),
                   d / "empty.parquet")
    (d / "corrupt.parquet").write_bytes(b"PAR1 this is not a parquet file")
    (d / "empty.jsonl").write_text("")
    (d / "notjson.jsonl").write_text("{this is not json\n")
    (d / "bad.yaml").write_text("batch_size: [1, 2\nepochs: 1\n")
    return d


DEAD_MLFLOW = f"http://127.0.0.1:{closed_port()}"
DEAD_S3 = f"http://127.0.0.1:{closed_port()}"

# (id, stage, args, culprit the one line must name, extra environment); {d} = the files folder
CASES = [
    ("missing-file", "train", ["data.train_path={d}/nope.parquet"], "data.train_path", {}),
    ("empty-parquet", "train", ["data.train_path={d}/empty.parquet"], "no rows", {}),
    ("empty-jsonl", "train", ["data.train_path={d}/empty.jsonl"], "no rows", {}),
    ("corrupt-parquet", "train", ["data.train_path={d}/corrupt.parquet"], "not a readable parquet", {}),
    ("jsonl-not-json", "train", ["data.train_path={d}/notjson.jsonl"], "not JSON", {}),
    ("wrong-columns", "train", ["data.train_path={d}/wrongcols.parquet"], "lacks column 'caption'", {}),
    ("image-missing", "train", ["data.train_path={d}/noimage.parquet"], "img/nope.png", {}),
    ("unknown-arch", "train", ["data.train_path={d}/good.parquet", "model.arch=ViT-Q-99"], "model.arch=ViT-Q-99", {}),
    ("unknown-tag", "train", ["data.train_path={d}/good.parquet", "model.arch=RN50", "model.pretrained=nosuchtag"],
     "model.pretrained=nosuchtag", {}),
    ("weights-offline", "train", ["data.train_path={d}/good.parquet", "model.arch=ViT-B-32", "model.pretrained=openai"],
     "could not fetch the 'openai' weights of ViT-B-32", {}),
    ("checkpoint-missing", "train", ["data.train_path={d}/good.parquet", "model.pretrained={d}/ckpt/model.pt"],
     "model.pretrained", {}),
    ("mlflow-unreachable", "train", ["data.train_path={d}/good.parquet", "tracking.enabled=true",
                                     f"tracking.tracking_uri={DEAD_MLFLOW}"], "tracking.tracking_uri", {}),
    ("s3-unreachable", "train", ["data.train_path=s3://bucket/train.parquet"], "HARDPOS_S3_ENDPOINT_URL",
     {"HARDPOS_S3_ENDPOINT_URL": DEAD_S3, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}),
    ("malformed-yaml", "train", ["--config", "{d}/bad.yaml"], "bad.yaml", {}),
    ("unknown-key", "train", ["data.train_pth={d}/good.parquet"], "train_pth", {}),
    ("wrong-type", "train", ["batch_size=many"], "batch_size", {}),
    ("negative-batch", "train", ["batch_size=-4"], "batch_size", {}),
    ("generate-empty", "generate", ["input={d}/empty.jsonl", "engine.kind=rules"], "no captions", {}),
    ("generate-missing", "generate", ["input={d}/nope.jsonl"], "input={d}/nope.jsonl", {}),
    ("generate-llm-down", "generate", ["input={d}/good.parquet", "engine.kind=http",
                                       f"engine.http.url={DEAD_MLFLOW}/v1/chat/completions"], "engine.http.url", {}),
    ("eval-unknown-kind", "evaluate", ["benchmarks=[{{name: b, kind: bogus, path: {d}/good.parquet}}]"], "bogus", {}),
    ("eval-missing", "evaluate", ["benchmarks=[{{name: b, kind: triplets, path: {d}/nope.parquet}}]"],
     "benchmarks.b.path", {}),
    ("sweep-train-config-missing", "sweep", ["train_config={d}/nope.yaml"], "train_config not found", {}),
    ("sweep-empty-triplets", "sweep", ["train_config=null", "train_overrides={{data: {{train_path: {d}/empty.parquet}}}}"],
     "no rows", {}),
    ("eval-empty", "evaluate", ["benchmarks=[{{name: b, kind: triplets, path: {d}/empty.parquet}}]"], "no rows", {}),
]


@pytest.fixture(scope="module")
def warm_cli():
    """The CLI's modules imported once, so each case's forked child times the checks alone."""
    # lazy: importing the stages is this fixture's whole cost; collection stays cheap
    from hardpos import cli
    from hardpos.runtime import stage_module

    for stage in ("train", "generate", "evaluate", "sweep"):
        stage_module(stage)
    return cli


def run_forked(cli, stage: str, args: list[str], cwd: Path, env_extra: dict[str, str]) -> tuple[int, str, float]:
    """(exit code, stderr, seconds) of ``hardpos <stage> args`` run by cli.main in a forked child
    (its own process: environment, working folder, stdout/stderr are the child's alone)."""
    err_path = cwd / "stderr.txt"
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            for key in [k for k in os.environ if k.startswith(("MLFLOW_", "HARDPOS_S3", "AWS_"))]:
                del os.environ[key]
            os.environ.update({"HF_HUB_OFFLINE": "1", **env_extra})
            os.chdir(cwd)
            fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            sys.stderr = open(2, "w", closefd=False)
            code = cli.main([stage, *args])
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - anything escaping main is a failure the parent sees
            # lazy: only on the failure path
            import traceback
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 70)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err_path.read_text(), time.monotonic() - started


def run_cli(stage: str, args: list[str], cwd: Path, env_extra: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m hardpos <stage> args`` in a fresh interpreter (the imports included)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "HARDPOS_S3", "AWS_"))}
    env.update({"HF_HUB_OFFLINE": "1", **env_extra})
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hardpos", stage, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    return proc, time.monotonic() - started


@pytest.mark.parametrize("name,stage,args,culprit,env", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_fast_with_one_line(warm_cli, files, tmp_path, name, stage, args, culprit, env):
    out = tmp_path / "out"
    args = [a.format(d=files) for a in args]
    if not any(a.startswith("tracking.enabled") for a in args):
        args.append("tracking.enabled=false")
    code, stderr, _ = run_forked(warm_cli, stage, [*args, f"output_dir={out}"], tmp_path, env)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2, (code, stderr[-2000:])
    assert len(lines) == 1, stderr[-2000:]  # one line, no traceback
    assert culprit.format(d=files) in lines[0], lines[0]
    assert_nothing_complete(out)


def assert_nothing_complete(out: Path) -> None:
    written = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert not any("complete" in p.read_text(errors="replace").lower() or p.name == "summary.json" for p in written)


def test_the_issue_command_cold(files, tmp_path):
    """A new user's exact command in a fresh interpreter (imports and all): a missing training
    file is named before any weights are fetched, in one line, exit 2."""
    out = tmp_path / "out"
    proc, _ = run_cli("train", ["model.arch=ViT-B-32", "model.pretrained=openai", "data.train_path=/nonexistent.parquet",
                                   f"output_dir={out}"], tmp_path, {"HF_HUB_OFFLINE": ""})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines == [f"hardpos train: data.train_path=/nonexistent.parquet: triplet file not found; "
                     "check the path, or create it first"]
    assert not out.exists()


def test_stage_configs_load_without_the_heavy_libraries(files, tmp_path):
    """What the CLI imports before its checks (every stage's module, for its Config and --help)
    and the checks of a missing training file load none of torch, open_clip, Ray or MLflow:
    they take seconds to import, and a mistake on the command line should cost less."""
    script = f"""
import sys
from hardpos import cli, runtime
heavy = {HEAVY!r}
loaded = lambda: sorted(m for m in heavy if m in sys.modules)
for stage in runtime.STAGES:
    runtime.stage_module(stage)
    if loaded():
        print(f"import hardpos.stages.{{stage}}: {{loaded()}}")
        sys.exit(0)
code = cli.main(["train", "data.train_path={files}/nope.parquet", "tracking.enabled=false", "output_dir={tmp_path}/o"])
print(f"exit {{code}}: {{loaded()}}")
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "exit 2: []", proc.stdout + proc.stderr[-2000:]


def test_allow_empty_keeps_the_old_behaviour(files, tmp_path):
    """allow_empty=true: an empty caption file is not a preflight error (generate runs on nothing)."""
    # lazy: only this test needs the stage's config and the checks as functions
    from hardpos.config import ConfigError, load_config
    from hardpos.generate.stage import Config, check

    empty = [f"input={files}/empty.jsonl", "engine.kind=rules", "tracking.enabled=false"]
    with pytest.raises(ConfigError, match="no captions"):
        check(load_config(Config, None, empty))
    check(load_config(Config, None, [*empty, "allow_empty=true"]))  # no error


def test_a_stage_that_fails_later_says_so_in_one_line_and_verbose_gives_the_traceback(warm_cli, tmp_path):
    """Past the checks (the experiment is looked up when the stage runs): exit 1 and one line
    naming the error; --verbose adds the traceback."""
    args = [f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db", "experiment=nope", f"output_dir={tmp_path}/out"]
    code, stderr, _ = run_forked(warm_cli, "register", args, tmp_path, {})
    ours = [ln for ln in stderr.splitlines() if ln.startswith("hardpos register")]
    assert code == 1 and "Traceback" not in stderr, stderr[-2000:]
    assert ours == [f"hardpos register: failed: LookupError: MLflow experiment 'nope' does not exist at "
                    f"sqlite:///{tmp_path}/mlflow.db (--verbose shows the traceback)"]
    code, stderr, _ = run_forked(warm_cli, "register", [*args, "--verbose"], tmp_path, {})
    assert code == 70 and "Traceback" in stderr and "LookupError" in stderr  # raised out of main
