"""The confirmatory experiment: the preregistered checks on fresh worlds, judged once, as fixed.

The commands::

    # the check list as a reference page (docs/checks.md), from platform/hardpos/paper/checks.json
    python -m benchmarks.confirmatory checks [output=docs/checks.md]

    # run the preregistered worlds that have no rows yet (each: a world, its own base by the
    # shipped recipe, the default and --full finetunes, evaluation); resumable, one world at a time
    python -m benchmarks.confirmatory run [output_dir=outputs/confirmatory] [worlds=1]

    # judge the rows: refuses (exit 2) when the checks changed since the preregistration, or
    # when a row was run before it; says how many worlds are in and judges nothing until all are
    python -m benchmarks.confirmatory report [output=docs/confirmatory.md]

The preregistration (``platform/hardpos/resources/confirmatory/preregistration.json``) fixes the
checks (by the sha256 of the check file), the test, alpha, the correction, the world seeds, the
training seed of each, and the demo configuration. Each world's rows are written to
``resources/confirmatory/worlds/world<seed>.json`` with the commit they were run at and the
preregistration's commit, so anyone can recompute every p-value from the repository.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hardpos.config import load_config
from hardpos.paper import confirm

ROOT = Path(__file__).resolve().parents[1]
PREREGISTRATION = confirm.CONFIRMATORY_DIR / "preregistration.json"
WORLDS = confirm.CONFIRMATORY_DIR / "worlds"
EXIT_REFUSED = 2


class Refused(Exception):
    """The rows cannot be judged as preregistered (the message says why)."""


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def preregistration_commit(path: Path = PREREGISTRATION) -> str:
    """The commit that last changed the preregistration (empty when it is not committed)."""
    return _git("log", "-1", "--format=%H", "--", str(path.relative_to(ROOT)))


def check_unchanged(prereg: dict[str, Any], checks_path: Path = confirm.CHECKS_PATH) -> None:
    """Raise :class:`Refused` when the checks file is not the one the preregistration fixed."""
    now = confirm.checks_digest(checks_path)
    if now != prereg["checks_sha256"]:
        raise Refused(f"the checks changed since the preregistration ({checks_path.name} sha256 {now[:12]} != "
                      f"{prereg['checks_sha256'][:12]}): a confirmatory result judges only the preregistered checks")


# --------------------------------------------------------------------------- checks
@dataclasses.dataclass
class ChecksConfig:
    """The check list as Markdown.

    output: where to write it ("" prints it).
    """

    output: str = "docs/checks.md"


def checks(cfg: ChecksConfig) -> str:
    text = confirm.findings_markdown(confirm.load_findings(), confirm.not_tested())
    if cfg.output:
        Path(cfg.output).write_text(text)
    else:
        print(text)
    return text


# --------------------------------------------------------------------------- run
@dataclasses.dataclass
class RunConfig:
    """Run preregistered worlds that have no rows yet, in the preregistered order.

    output_dir: the demos' outputs go to <output_dir>/world<seed> (a finished one is reused).
    worlds: how many worlds to run in this call at most (0: all that are missing).
    """

    output_dir: str = "outputs/confirmatory"
    worlds: int = 0


def demo_overrides(prereg: dict[str, Any], world_seed: int, output_dir: str) -> list[str]:
    """The demo's key=value overrides for one preregistered world."""
    seed = prereg["training_seed"].get(str(world_seed), world_seed) if isinstance(prereg["training_seed"], dict) \
        else world_seed
    fixed = [f"{k}={json.dumps(v)}" for k, v in prereg["demo"].items()]
    return [*fixed, f"world.seed={world_seed}", f"seed={seed}", f"output_dir={output_dir}"]


def run(cfg: RunConfig) -> list[int]:
    """Run the missing worlds; returns the seeds run. Refuses when the preregistration is not
    committed or the checks changed since."""
    # lazy: Ray, torch and the stages load only for `run` (`checks` and `report` stay light)
    from hardpos.runtime import execute
    from hardpos.stages import demo

    prereg = confirm.load_preregistration()
    check_unchanged(prereg)
    prereg_commit = preregistration_commit()
    if not prereg_commit or _git("status", "--porcelain", "--", str(PREREGISTRATION.relative_to(ROOT))):
        raise Refused("the preregistration has uncommitted changes: commit it before any confirmatory world runs")
    done = confirm.load_worlds()
    todo = [s for s in prereg["world_seeds"] if s not in done]
    if cfg.worlds:
        todo = todo[:cfg.worlds]
    WORLDS.mkdir(parents=True, exist_ok=True)
    for seed in todo:
        out = Path(cfg.output_dir) / f"world{seed}"
        overrides = demo_overrides(prereg, seed, str(out))
        print(f"confirmatory world {seed}: demo {' '.join(overrides)}", file=sys.stderr)
        started = time.time()
        summary = execute("demo", load_config(demo.Config, None, overrides))
        record = {"world_seed": seed, "training_seed": int(next(o for o in overrides if o.startswith("seed="))[5:]),
                  "commit": _git("rev-parse", "HEAD"),
                  # the worlds already written are the run's own output, not a change to the code
                  "dirty": bool(_git("status", "--porcelain", "--", "platform", f":!{WORLDS.relative_to(ROOT)}")),
                  "preregistration_commit": prereg_commit, "checks_sha256": prereg["checks_sha256"],
                  "overrides": overrides, "pipeline_s": round(time.time() - started, 1), "rows": summary["rows"]}
        (WORLDS / f"world{seed}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return todo


# --------------------------------------------------------------------------- report
@dataclasses.dataclass
class ReportConfig:
    """Judge the preregistered worlds' rows.

    output: also write the report here as Markdown ("" only prints it).
    json_output: also write the verdicts as JSON here ("" none).
    """

    output: str = ""
    json_output: str = ""


def judge_stored(prereg: dict[str, Any], prereg_commit: str, stored: dict[int, dict[str, Any]],
                 findings: list[confirm.Finding] | None = None) -> dict[str, Any]:
    """The verdicts over every preregistered world's stored rows. Raises :class:`Refused` when a
    row was run under another preregistration or from a dirty tree, when rows of worlds that
    were not preregistered are present, or when any preregistered world is missing (the checks
    are judged once, on all of them: no interim looks)."""
    wanted = list(prereg["world_seeds"])
    extra = sorted(set(stored) - set(wanted))
    if extra:
        raise Refused(f"rows of worlds that were not preregistered: {extra}")
    for seed, rec in stored.items():
        if rec["checks_sha256"] != prereg["checks_sha256"] or rec["preregistration_commit"] != prereg_commit:
            raise Refused(f"world {seed} was run under another preregistration ({rec['preregistration_commit'][:12]}"
                          f", now {prereg_commit[:12]})")
        if rec.get("dirty"):
            raise Refused(f"world {seed} was run from a tree with uncommitted changes under platform/")
    missing = [s for s in wanted if s not in stored]
    if missing:
        raise Refused(f"{len(stored)} of {len(wanted)} preregistered worlds are in (missing {missing}); the "
                      "checks are judged once, on all of them (`python -m benchmarks.confirmatory run`)")
    worlds = [stored[s]["rows"] for s in wanted]
    findings = findings if findings is not None else confirm.load_findings()
    verdicts = confirm.judge(confirm.all_checks(findings), worlds, prereg["alpha"])
    n = confirm.counts(verdicts)
    head = (f"{n['held_holm']} of {n['distinct']} distinct checks hold after Holm's correction "
            f"({n['held']} before it; {n['checks']} checks in all), over {len(worlds)} fresh worlds "
            f"(preregistration {prereg_commit[:12]}; one-sided paired t-test, the world as the unit, "
            f"alpha = {prereg['alpha']}).")
    return {"preregistration_commit": prereg_commit, "counts": n, "worlds": wanted,
            "markdown": head + "\n\n" + confirm.verdicts_table(verdicts), "verdicts": confirm.verdicts_json(verdicts)}


REPORT_HEAD = """# The confirmatory result

Every preregistered check judged on the stored rows of every preregistered world; made by
`python -m benchmarks.confirmatory report output=docs/confirmatory.md` (what the checks say and
the paper's words behind them: [checks.md](checks.md); what it means: [results.md](results.md)).

"""


def report(cfg: ReportConfig) -> dict[str, Any]:
    """Judge the repository's preregistered worlds (:func:`judge_stored`) and print the table."""
    prereg = confirm.load_preregistration()
    check_unchanged(prereg)
    result = judge_stored(prereg, preregistration_commit(), confirm.load_worlds())
    print(result["markdown"])
    if cfg.output:
        Path(cfg.output).write_text(REPORT_HEAD + result["markdown"])
    if cfg.json_output:
        Path(cfg.json_output).write_text(json.dumps({k: v for k, v in result.items() if k != "markdown"}, indent=1)
                                         + "\n")
    return result


COMMANDS = {"checks": (ChecksConfig, checks), "run": (RunConfig, run), "report": (ReportConfig, report)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else EXIT_REFUSED
    cls, fn = COMMANDS[argv[0]]
    try:
        fn(load_config(cls, None, argv[1:]))
    except Refused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
