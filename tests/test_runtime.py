"""The layout guard, typed configs, the job contract and the MLflow helper."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hardpos import runtime, tracking
from hardpos.config import ConfigError, JobConfig, load_config
from hardpos.config.paths import resolve_tracking_uri

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- layout
def test_platform_is_the_standard_library_and_hardpos_imports():
    import platform

    import hardpos

    assert not (REPO / "platform" / "__init__.py").exists()
    assert hasattr(platform, "python_version"), "an importable platform/ package shadows the stdlib"
    assert Path(platform.__file__).parent != REPO / "platform"
    assert Path(hardpos.__file__).resolve().is_relative_to(REPO / "platform" / "hardpos")


def test_every_reserved_stage_has_a_thin_job_entrypoint():
    for stage in runtime.STAGES:
        text = (REPO / "jobs" / f"{stage}.py").read_text()
        assert f'main(["{stage}", *sys.argv[1:]])' in text


# --------------------------------------------------------------------------- configs
@dataclasses.dataclass
class _Loss:
    w_pos: float = 1.0
    w_neg: float = 1.0
    mode: str = "svlc"


@dataclasses.dataclass
class _Cfg(JobConfig):
    steps: int = 10
    names: list[str] = dataclasses.field(default_factory=lambda: ["a"])
    loss: _Loss = dataclasses.field(default_factory=_Loss)
    note: str | None = None


def test_yaml_then_dotted_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"steps": 5, "loss": {"w_neg": 0.25}, "output_dir": "x"}))
    cfg = load_config(_Cfg, path, ["loss.w_pos=0", "loss.w_neg=1e-3", "names=[replace,swap]", "note=null", "tracking.experiment=e1"])
    assert cfg.steps == 5
    assert cfg.loss == _Loss(w_pos=0.0, w_neg=0.001)
    assert isinstance(cfg.loss.w_pos, float)
    assert cfg.names == ["replace", "swap"]
    assert cfg.note is None and cfg.output_dir == "x" and cfg.tracking.experiment == "e1"


@pytest.mark.parametrize(
    "override, message",
    [
        ("stepz=3", "unknown config key(s) 'stepz'"),
        ("loss.w_nag=1", "unknown config key(s) 'loss.w_nag'"),
        ("steps=many", "steps: expected an integer"),
        ("steps=1.5", "steps: expected an integer"),
        ("loss.w_pos=[1]", "loss.w_pos: expected a number"),
        ("loss.w_pos=1e-3x", "loss.w_pos: expected a number"),
        ("names=abc", "names: expected a list"),
        ("loss=3", "loss: expected a mapping"),
        ("justakey", "not of the form dotted.key=value"),
        ("--stepz", "unknown config key(s) 'stepz'"),
        ("tracking.enabled=maybe", "tracking.enabled: expected true or false"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    from hardpos.cli import parse_args

    with pytest.raises(ConfigError) as info:
        load_config(_Cfg, None, parse_args([override])[1])
    assert message in str(info.value)


def test_bad_yaml_files_are_clear_errors(tmp_path):
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "broken.yaml").write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_Cfg, tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_Cfg, tmp_path / "broken.yaml")
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(_Cfg, tmp_path / "missing.yaml")


def test_every_yaml_config_in_the_repo_loads_into_its_stage():
    """jobs/configs/<stage>*.yaml must load into that stage's Config without errors."""
    files = sorted((REPO / "jobs" / "configs").glob("*.yaml"))
    # a count and the stages covered, not just "some": a folder emptied or thinned by a move fails here
    assert len(files) >= 10, f"jobs/configs holds {len(files)} *.yaml, expected at least 10: {[p.name for p in files]}"
    stages = {re.split(r"[_-]", p.stem)[0] for p in files}
    assert stages >= {"demo", "evaluate", "generate", "perturb", "sweep", "train", "world"}, sorted(stages)
    loaded = set()
    for path in files:
        stage = re.split(r"[_-]", path.stem)[0]
        module = runtime.stage_module(stage)
        load_config(module.Config, path)
        loaded.add(path.name)
    assert loaded == {p.name for p in files}


# --------------------------------------------------------------------------- tracking + contract
def test_execute_writes_summary_and_tracks_the_run(tmp_path, tracking_uri):
    cfg = load_config(_Cfg, None, [f"output_dir={tmp_path / 'out'}", "tracking.experiment=unit", "steps=7"])

    def run(cfg, ctx):
        ctx.log_metrics({"loss/total": 0.5, "nested": {"acc": 1.0}, "skip": "text"}, step=3)
        return {"steps_done": cfg.steps}

    summary = runtime.execute("demo", cfg, run_fn=run, quiet=True)
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk == summary and on_disk["steps_done"] == 7 and on_disk["status"] == "ok"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    run_info = client.get_run(summary["mlflow_run_id"])
    assert run_info.info.status == "FINISHED"
    assert run_info.data.params["steps"] == "7" and run_info.data.params["loss.w_neg"] == "1.0"
    assert run_info.data.metrics == {"loss/total": 0.5, "nested/acc": 1.0}
    assert client.get_metric_history(run_info.info.run_id, "loss/total")[0].step == 3
    artifacts = {a.path for a in client.list_artifacts(run_info.info.run_id)}
    assert {"summary.json", "config.yaml"} <= artifacts
    # artifacts land beside the database, not in the process's cwd
    assert (Path(tracking_uri[len("sqlite:///"):]).parent / "mlartifacts").is_dir()


def test_failed_stage_marks_the_run_failed(tmp_path, tracking_uri):
    cfg = load_config(_Cfg, None, [f"output_dir={tmp_path}", "tracking.experiment=unit"])

    def boom(cfg, ctx):
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        runtime.execute("demo", cfg, run_fn=boom, quiet=True)
    runs = tracking.search_runs(tracking_uri, "unit")
    assert [r.info.status for r in runs] == ["FAILED"]
    assert not (tmp_path / "summary.json").exists()


def test_tracking_uri_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert resolve_tracking_uri() == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"  # MLflow 3's own default
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert resolve_tracking_uri() == "http://127.0.0.1:5000"
    # relative SQLite paths are made absolute where the config is read (workers run elsewhere)
    assert resolve_tracking_uri("sqlite:///x.db") == f"sqlite:///{tmp_path.resolve() / 'x.db'}"
    assert resolve_tracking_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"


@pytest.mark.integration  # runs jobs/demo.py in a subprocess
def test_cli_reports_config_errors_before_work(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "demo.py"), "no_such_key=1", f"output_dir={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "config error" in proc.stderr and "no_such_key" in proc.stderr
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.integration  # runs jobs/demo.py in a subprocess
def test_cli_help_lists_config_keys():
    proc = subprocess.run([sys.executable, str(REPO / "jobs" / "demo.py"), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert "output_dir: str" in proc.stdout and "tracking.tracking_uri" in proc.stdout
    # the demo's own defaults, not its section class's (PhaseConfig: lr 1e-4)
    from hardpos.stages.demo import Config as DemoConfig, PhaseConfig

    own = DemoConfig().pretrain
    assert own.lr != PhaseConfig().lr
    assert f"pretrain.steps: int = {own.steps}" in proc.stdout and f"pretrain.lr: float = {own.lr}" in proc.stdout


# --------------------------------------------------------------------------- console (hardpos.logs)
def test_hardpos_logger_gets_one_handler_and_the_verbose_switch(monkeypatch):
    import io
    import logging

    from hardpos import cli, logs

    out = io.StringIO()
    logger = logs.setup("info", stream=out)
    logs.setup("info", stream=out)  # idempotent: still one handler, no repeated lines
    logging.getLogger("hardpos.train.worker").info("step 1/2")
    logging.getLogger("hardpos.train.worker").debug("hidden at info")
    assert out.getvalue().count("step 1/2") == 1 and "hidden" not in out.getvalue()
    assert logger.propagate is False and logs.current_level() == "info"
    assert logs.ray_env("info")["RAY_DATA_DISABLE_PROGRESS_BARS"] == "1" and logs.ray_env("debug") == {}
    assert logs.ray_env("info")["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    assert Path(logs.ray_env("info")["RAY_DATA_LOGGING_CONFIG"]).is_file()
    assert logs.ray_init_kwargs("info")["logging_level"] == logging.ERROR
    assert logs.train_log_level("debug") == "INFO" and logs.train_log_level("info") == "WARNING"
    with pytest.raises(ValueError, match="expected one of debug, info"):
        logs.setup("loud")
    # --verbose / -v are log_level=debug; log_level is a key of every stage's config
    assert cli.parse_args(["--verbose", "seed=1"])[1] == ["log_level=debug", "seed=1"]
    assert load_config(JobConfig, None, cli.parse_args(["-v"])[1]).log_level == "debug"
    with pytest.raises(ConfigError, match="log_level"):
        load_config(JobConfig, None, ["log_level=loud"])
    logs.setup("info")  # back on the current sys.stderr, looked up per line
    assert logging.getLogger("hardpos").handlers[0].stream is sys.stderr
    assert logs.duration(75) == "1m15s" and logs.duration(3725) == "1h02m" and logs.duration(9.6) == "10s"


def test_training_progress_lines():
    from hardpos.train.worker import Progress

    p = Progress.for_run(total=95, start_step=0, global_batch=32, epochs=2, lines=10)
    p.started = 100.0
    assert p.every == 10 and p.line(9, 0, {"loss/total": 1.0}, now=101.0) is None
    line = p.line(20, 0, {"loss/total": 2.5, "loss/hard_negative": 0.25, "loss/kl": 0.0, "lr": 1e-5}, now=110.0)
    assert line == ("train step 20/95 (21%) epoch 1/2 | loss total 2.5000 hard_negative 0.2500 | "
                    "2.00 steps/s 64.0 samples/s | ETA 38s")
    assert p.line(95, 1, {"loss/total": 1.0}, now=147.5).endswith("ETA 0s")  # the last step always prints
    resumed = Progress.for_run(total=100, start_step=50, global_batch=8, epochs=1)
    resumed.started = 0.0
    assert resumed.line(60, 0, {}, now=2.0).endswith("| 5.00 steps/s 40.0 samples/s | ETA 8s")  # rates count from the resume
