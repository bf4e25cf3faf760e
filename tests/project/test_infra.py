"""infra/: every deployment manifest parses, names entrypoints and configs that exist and
load, takes its settings from the ConfigMap/Secret, and agrees with pyproject's versions.

No Docker engine, Kubernetes or Ray cluster is needed: the files are parsed and checked
(the cluster launcher YAML and the Serve config against Ray's own schemas). Nothing here
skips: a manifest that names a stage, config or Serve import path that no longer exists
(renamed or deleted) fails its test with the name it could not find.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
from pathlib import Path
from typing import Any, Iterator

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same API from PyPI (a dev extra)
    import tomli as tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
KUBERAY = INFRA / "kuberay"
DOCKER = INFRA / "docker"
APP_ROOT = "/app"  # where the images put the repository (Dockerfile WORKDIR)

CONFIGMAP_NAME = "hardpos-config"
SECRET_NAME = "hardpos-secrets"
# Settings that must come from the ConfigMap/Secret, never be written into a manifest.
EXTERNAL_SETTINGS = {
    "MLFLOW_TRACKING_URI",
    "HARDPOS_S3_ENDPOINT_URL",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "RAY_AUTH_TOKEN",
    "HARDPOS_SERVE_TOKEN",
}
SECRET_KEYS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "RAY_AUTH_TOKEN", "HARDPOS_SERVE_TOKEN"}
# Packages whose versions the images must pin exactly (pyproject names them all).
MUST_PIN = {"ray", "torch", "torchvision", "open-clip-torch", "mlflow", "vllm"}
JOB_STAGES = ("generate", "train", "sweep")


# --------------------------------------------------------------------------- helpers
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def project_requirements() -> dict[str, Requirement]:
    """Every requirement of pyproject: dependencies and all extras, by canonical name."""
    project = pyproject()["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    out: dict[str, Requirement] = {}
    for text in reqs:
        req = Requirement(text)
        out[canonicalize_name(req.name)] = req
    return out


def constraints() -> dict[str, Version]:
    """infra/docker/constraints.txt as {canonical name: exact version}; only `==` pins."""
    pins: dict[str, Version] = {}
    for raw in (DOCKER / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"constraints.txt: {line!r} is not an exact pin"
        pins[canonicalize_name(req.name)] = Version(specs[0].version)
    return pins


def project_version() -> str:
    return pyproject()["project"]["version"]


def parse_dockerfile(path: Path) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """-> ([(INSTRUCTION, args)], ARG defaults), continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    args: dict[str, str] = {}
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped by Docker too
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        line = pending + stripped
        pending = ""
        instr, _, rest = line.partition(" ")
        instr = instr.upper()
        rest = rest.strip()
        instructions.append((instr, rest))
        if instr == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args.setdefault(key.strip(), value.strip().strip('"'))
    assert not pending, f"{path}: dangling line continuation"
    return instructions, args


def expand(text: str, variables: dict[str, str]) -> str:
    """${VAR} / $VAR -> value; unknown variables fail the test with their name."""

    def sub(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in variables, f"undefined variable ${{{name}}} in {text!r}"
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, text)


def base_image(path: Path) -> str:
    instructions, args = parse_dockerfile(path)
    froms = [rest for instr, rest in instructions if instr == "FROM"]
    assert len(froms) == 1, f"{path.name}: expected one FROM, got {froms}"
    return expand(froms[0].split()[0], args)


def ray_image_parts(image: str) -> tuple[str, str, str]:
    """rayproject/ray:<ray>-py<XY>-<flavor> -> (ray version, '3.XY', flavor)."""
    match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3(\d+)-(cpu|gpu|cu\d+)", image)
    assert match, f"{image!r} is not an official rayproject/ray:<version>-py3XX-<cpu|gpu|cuXXX> tag"
    return match.group(1), f"3.{match.group(2)}", match.group(3)


def load_yaml_docs(path: Path) -> list[Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path} is empty"
    return docs


def kuberay_objects() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(KUBERAY.glob("*.yaml")):
        out.extend((path, doc) for doc in load_yaml_docs(path))
    return out


def by_kind(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p, d in kuberay_objects() if d.get("kind") == kind]


def containers(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container spec below ``node`` (pod templates at any depth), with its path."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for i, c in enumerate(value):
                    yield f"{where}.{key}[{i}]", c
            else:
                yield from containers(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from containers(value, f"{where}[{i}]")


def configmap_data() -> dict[str, str]:
    ((_, cm),) = by_kind("ConfigMap")
    return {k: str(v) for k, v in cm["data"].items()}


def secret_keys() -> set[str]:
    ((_, secret),) = by_kind("Secret")
    return set(secret.get("stringData", {})) | set(secret.get("data", {}))


def cluster_env() -> dict[str, str]:
    """What a HardPos pod sees: ConfigMap values + placeholder values for the Secret keys."""
    env = configmap_data()
    env.update({k: f"<{k}>" for k in secret_keys()})
    return env


def stage_exists(stage: str) -> bool:
    from hardpos import runtime

    return stage in runtime.STAGES and importlib.util.find_spec(
        runtime.STAGE_MODULES.get(stage, f"hardpos.stages.{stage}")) is not None


def stage_of_config(path: str) -> str:
    """jobs/configs/train_paper.yaml, jobs/configs/demo-small.yaml -> train, demo (the naming
    rule of jobs/configs: the stage, then ``_`` or ``-`` and a variant)."""
    return re.split(r"[_-]", Path(path).stem)[0]


def require_stage(stage: str, where: str) -> None:
    """Fail (never skip) unless ``stage`` is a HardPos stage with its module and entrypoint."""
    from hardpos.runtime import STAGES

    assert stage in STAGES, f"{where}: {stage!r} is not a HardPos stage ({', '.join(STAGES)})"
    assert stage_exists(stage), f"{where}: no stage {stage!r} (its module does not exist: renamed?)"
    assert (REPO / "jobs" / f"{stage}.py").is_file(), f"{where}: entrypoint jobs/{stage}.py does not exist (renamed?)"


def check_job_command(argv: list[str], where: str) -> dict[str, Any]:
    """``python jobs/<stage>.py [--config F] [k=v ...]`` -> the loaded config, as a dict.

    Paths are repo-relative (the jobs run with the repo, or the image's /app copy of it, as
    working_dir). Fails when the stage, its module or its entrypoint does not exist.
    """
    from hardpos.cli import parse_args
    from hardpos.config import load_config, to_dict
    from hardpos.runtime import stage_module

    assert argv[:1] == ["python"], f"{where}: entrypoint must start with `python`, got {argv[:2]}"
    script = argv[1]
    match = re.fullmatch(r"jobs/(\w+)\.py", script)
    assert match, f"{where}: {script!r} is not a repo-relative jobs/<stage>.py entrypoint"
    stage = match.group(1)
    require_stage(stage, where)
    config_file, overrides, _, _ = parse_args(argv[2:])
    if config_file is not None:
        assert not os.path.isabs(config_file), f"{where}: config path {config_file} must be repo-relative"
        assert (REPO / config_file).is_file(), f"{where}: config {config_file} does not exist"
        config_file = str(REPO / config_file)
    cfg = load_config(stage_module(stage).Config, config_file, overrides)
    return to_dict(cfg)


def config_paths_in(value: Any) -> Iterator[str]:
    """Strings in a resolved config that name a file under jobs/configs/."""
    if isinstance(value, dict):
        for v in value.values():
            yield from config_paths_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from config_paths_in(v)
    elif isinstance(value, str) and value.startswith("jobs/configs/"):
        yield value


def check_nested_configs(resolved: dict[str, Any], where: str) -> None:
    """A config that names another config (sweep's train_config) must name one that loads."""
    from hardpos.config import load_config
    from hardpos.runtime import stage_module

    for path in config_paths_in(resolved):
        stage = stage_of_config(path)
        require_stage(stage, f"{where}: {path}")
        assert (REPO / path).is_file(), f"{where}: names {path}, which does not exist"
        load_config(stage_module(stage).Config, str(REPO / path))


# --------------------------------------------------------------------------- names the manifests use
def test_every_stage_and_config_name_resolves():
    """Every stage has its module and entrypoint, and every jobs/configs file is named after a
    stage: a rename fails here (with the name) even where no manifest mentions it."""
    from hardpos.runtime import STAGES

    assert set(JOB_STAGES) <= set(STAGES)
    for stage in STAGES:
        require_stage(stage, "hardpos.runtime.STAGES")
    configs = sorted((REPO / "jobs" / "configs").glob("*.yaml"))
    assert configs, "jobs/configs holds no config files"
    for path in configs:
        require_stage(stage_of_config(str(path)), f"jobs/configs/{path.name}")


# --------------------------------------------------------------------------- every file parses
def test_every_infra_yaml_parses_and_k8s_objects_are_well_formed():
    files = sorted(INFRA.rglob("*.yaml")) + sorted(INFRA.rglob("*.yml"))
    assert {p.relative_to(INFRA).parts[0] for p in files} >= {"kuberay", "ray-cluster", "compose"}
    for path in files:
        load_yaml_docs(path)
    kinds = sorted(d["kind"] for _, d in kuberay_objects())
    assert kinds == ["ConfigMap", "RayCluster", "RayJob", "RayJob", "RayJob", "RayService", "Secret"]
    for path, doc in kuberay_objects():
        assert doc["apiVersion"] in ("v1", "ray.io/v1"), f"{path.name}: apiVersion {doc['apiVersion']}"
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), path.name
        assert doc["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "hardpos", path.name


# --------------------------------------------------------------------------- versions
def test_constraints_pin_core_packages_within_pyproject_ranges():
    pins = constraints()
    reqs = project_requirements()
    assert MUST_PIN <= set(pins), f"constraints.txt lacks pins for {sorted(MUST_PIN - set(pins))}"
    for name, version in pins.items():
        assert name in reqs, f"constraints.txt pins {name}, which pyproject does not require"
        assert reqs[name].specifier.contains(version, prereleases=True), (
            f"constraints.txt pins {name}=={version}, outside pyproject's {reqs[name]}"
        )
    # The stack this repository is verified on (DESIGN s.7); bump together with the images.
    assert pins["ray"] == Version("2.60.0")
    assert pins["mlflow"].release[:2] == (3, 17)
    assert pins["vllm"] == Version("0.33.0")
    # vllm 0.33.0's wheel metadata pins torch==2.14.0 and torchvision==0.29.0 exactly.
    assert (pins["torch"], pins["torchvision"]) == (Version("2.14.0"), Version("0.29.0"))


@pytest.mark.parametrize("name,flavors,extra", [
    ("Dockerfile.cpu", {"cpu"}, None),
    ("Dockerfile.gpu", {"gpu", "cu118", "cu121", "cu124", "cu125", "cu126", "cu128", "cu129", "cu130"}, "vllm"),
])
def test_dockerfile_base_image_install_and_sources(name, flavors, extra):
    path = DOCKER / name
    instructions, _ = parse_dockerfile(path)
    ray_version, python, flavor = ray_image_parts(base_image(path))
    pins = constraints()
    assert Version(ray_version) == pins["ray"], f"{name}: base image Ray {ray_version} != pinned {pins['ray']}"
    assert flavor in flavors, f"{name}: image flavor {flavor!r}"
    assert project_requirements()["ray"].specifier.contains(ray_version)
    requires_python = SpecifierSet(pyproject()["project"]["requires-python"])
    assert requires_python.contains(f"{python}.0"), f"{name}: Python {python} outside {requires_python}"

    # Every COPY source exists in the repo (the build context is the repository root).
    copied = []
    for instr, rest in instructions:
        if instr == "COPY":
            parts = [p for p in rest.split() if not p.startswith("--")]
            for src in parts[:-1]:
                assert (REPO / src).exists(), f"{name}: COPY source {src} does not exist"
                copied.append(src)
    assert {"pyproject.toml", "platform", "jobs", "serve", "infra/docker/constraints.txt"} <= set(copied)

    # HardPos is installed with the constraints file, with the vllm extra on GPU only.
    installs = [rest for instr, rest in instructions if instr == "RUN" and "pip install" in rest]
    assert len(installs) == 1, f"{name}: expected one pip install, got {installs}"
    cmd = shlex.split(installs[0])
    assert "-c" in cmd and cmd[cmd.index("-c") + 1] == f"{APP_ROOT}/infra/docker/constraints.txt"
    target = cmd[-1]
    assert target == (f"{APP_ROOT}[{extra}]" if extra else APP_ROOT), f"{name}: installs {target!r}"
    if extra:
        assert extra in pyproject()["project"]["optional-dependencies"]

    workdirs = [rest for instr, rest in instructions if instr == "WORKDIR"]
    assert workdirs and workdirs[-1] == APP_ROOT
    env = " ".join(rest for instr, rest in instructions if instr == "ENV")
    # The Serve app is in the installed package: no PYTHONPATH entry for it (nor for anything).
    assert "PYTHONPATH" not in env, f"{name}: sets PYTHONPATH; the installed hardpos package is enough"
    # The build's own smoke check asserts the same Ray version and imports the Serve app
    # from outside /app (so it cannot come from the copied sources).
    smoke = " ".join(rest for instr, rest in instructions if instr == "RUN" and "import" in rest)
    assert f"ray.__version__ == '{pins['ray']}'" in smoke
    assert "jobs/train.py --help" in smoke
    assert 'cd / && python -c "from hardpos.serve.app import build_app"' in smoke


def test_all_images_share_one_python_and_ray():
    parts = {name: ray_image_parts(base_image(DOCKER / name)) for name in ("Dockerfile.cpu", "Dockerfile.gpu")}
    assert len({p[:2] for p in parts.values()}) == 1, f"CPU and GPU images disagree: {parts}"
    python = parts["Dockerfile.cpu"][1]
    mlflow_base = base_image(DOCKER / "Dockerfile.mlflow")
    assert re.fullmatch(rf"python:{re.escape(python)}(-slim)?", mlflow_base), mlflow_base


def test_dockerignore_keeps_what_the_images_copy():
    for name in ("Dockerfile.cpu", "Dockerfile.gpu"):
        lines = (DOCKER / f"{name}.dockerignore").read_text().splitlines()
        assert "**" in lines, "the context starts empty (no venvs, outputs, data)"
        for src in ("pyproject.toml", "README.md", "platform/**", "jobs/**", "serve/**", "infra/docker/constraints.txt"):
            assert f"!{src}" in lines, f"{name}.dockerignore drops {src}"


def test_mlflow_server_image_matches_the_client_pin():
    instructions, _ = parse_dockerfile(DOCKER / "Dockerfile.mlflow")
    install = " ".join(rest for instr, rest in instructions if instr == "RUN" and "pip install" in rest)
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)(?:\[[a-z,]+\])?==([0-9][^\s\"]*)", install))
    assert Version(pins["mlflow"]) == constraints()["mlflow"], "MLflow server and client versions differ"
    # psycopg 3: the driver SQLAlchemy 2.1 uses for postgresql:// (psycopg2 alone stops the server at start)
    assert "psycopg" in pins and "psycopg2-binary" not in pins and "boto3" in pins, pins
    assert Version(pins["psycopg"]) == constraints()["psycopg"], "the image and the postgres extra differ"


# --------------------------------------------------------------------------- kubernetes
def test_k8s_images_are_the_versioned_hardpos_images():
    version = project_version()
    seen = set()
    for path, doc in kuberay_objects():
        for where, c in containers(doc):
            image = c["image"]
            match = re.fullmatch(r"(?:.+/)?hardpos-(cpu|gpu):(.+)", image)
            assert match, f"{path.name}{where}: {image!r} is not a HardPos image"
            assert match.group(2) == version, f"{path.name}{where}: tag {match.group(2)} != pyproject {version}"
            wants_gpu = "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
            assert (match.group(1) == "gpu") == wants_gpu, f"{path.name}{where}: {image} on a {'GPU' if wants_gpu else 'CPU'} pod"
            seen.add(match.group(1))
    assert seen == {"cpu", "gpu"}


def test_k8s_settings_come_from_the_configmap_and_secret():
    cm = configmap_data()
    for key in ("MLFLOW_TRACKING_URI", "HARDPOS_S3_ENDPOINT_URL", "HARDPOS_RUNS_URI"):
        assert cm.get(key), f"ConfigMap lacks {key}"
    assert cm["RAY_AUTH_MODE"] == "token"
    assert not SECRET_KEYS & set(cm), "credentials belong in the Secret"
    assert secret_keys() == SECRET_KEYS
    ((_, secret),) = by_kind("Secret")
    assert set(secret["stringData"].values()) == {"CHANGE_ME"}, "the Secret file is a template only"
    assert by_kind("ConfigMap")[0][1]["metadata"]["name"] == CONFIGMAP_NAME
    assert secret["metadata"]["name"] == SECRET_NAME

    count = 0
    for path, doc in kuberay_objects():
        pods = list(containers(doc))
        # The autoscaler sidecar talks to the GCS: it needs the token as well.
        for group in (doc.get("spec", {}), doc.get("spec", {}).get("rayClusterConfig", {})):
            if "autoscalerOptions" in group:
                pods.append((".autoscalerOptions", group["autoscalerOptions"]))
        for where, c in pods:
            count += 1
            refs = {(k, v["name"]) for ref in c.get("envFrom", []) for k, v in ref.items()}
            assert ("configMapRef", CONFIGMAP_NAME) in refs, f"{path.name}{where}: no envFrom ConfigMap"
            assert ("secretRef", SECRET_NAME) in refs, f"{path.name}{where}: no envFrom Secret"
            for env in c.get("env", []):
                assert env["name"] not in EXTERNAL_SETTINGS or "valueFrom" in env, (
                    f"{path.name}{where}: {env['name']} is hard-coded"
                )
    assert count >= 10  # heads, workers, submitters, autoscalers
    text = "\n".join(p.read_text() for p in KUBERAY.glob("*.yaml") if "secret" not in p.name)
    assert not re.search(r"AKIA[0-9A-Z]{16}", text), "an AWS access key is committed"


# Field names of the KubeRay ray.io/v1 API (json tags of raycluster/rayjob/rayservice
# types, including newer optional ones): a misspelt key is silently dropped by the API
# server's pruning, so catch it here. Required keys are those without `omitempty`.
KUBERAY_FIELDS = {
    "RayClusterSpec": ({"headGroupSpec"}, {
        "headGroupSpec", "workerGroupSpecs", "rayVersion", "enableInTreeAutoscaling", "autoscalerOptions",
        "headServiceAnnotations", "suspend", "gcsFaultToleranceOptions", "managedBy", "authOptions",
        "upgradeStrategy"}),
    "HeadGroupSpec": ({"rayStartParams", "template"}, {
        "serviceType", "headService", "enableIngress", "rayStartParams", "template", "resources", "labels"}),
    "WorkerGroupSpec": ({"groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"}, {
        "groupName", "replicas", "minReplicas", "maxReplicas", "numOfHosts", "rayStartParams", "template",
        "scaleStrategy", "idleTimeoutSeconds", "suspend", "resources", "labels"}),
    "AutoscalerOptions": (set(), {
        "resources", "image", "imagePullPolicy", "env", "envFrom", "volumeMounts", "securityContext",
        "idleTimeoutSeconds", "upscalingMode", "version"}),
    "RayJobSpec": (set(), {
        "activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate", "metadata",
        "clusterSelector", "submitterConfig", "managedBy", "deletionStrategy", "entrypoint", "runtimeEnvYAML",
        "jobId", "submissionMode", "entrypointResources", "entrypointNumCpus", "entrypointNumGpus",
        "ttlSecondsAfterFinished", "shutdownAfterJobFinishes", "suspend", "schedule"}),
    "RayServiceSpec": ({"rayClusterConfig"}, {
        "serveConfigV2", "rayClusterConfig", "serviceUnhealthySecondThreshold",
        "deploymentUnhealthySecondThreshold", "serveService", "upgradeStrategy", "excludeHeadPodFromServeSvc",
        "rayClusterDeletionDelaySeconds"}),
    "Container": ({"name", "image"}, {
        "name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports", "resources",
        "volumeMounts", "securityContext", "lifecycle", "livenessProbe", "readinessProbe", "startupProbe",
        "workingDir"}),
}


def check_fields(kind: str, obj: dict[str, Any], where: str) -> None:
    required, allowed = KUBERAY_FIELDS[kind]
    assert set(obj) <= allowed, f"{where}: unknown {kind} field(s) {sorted(set(obj) - allowed)}"
    assert required <= set(obj), f"{where}: {kind} lacks {sorted(required - set(obj))}"


def check_cluster_spec(spec: dict[str, Any], where: str) -> None:
    check_fields("RayClusterSpec", spec, where)
    check_fields("HeadGroupSpec", spec["headGroupSpec"], f"{where}.headGroupSpec")
    for i, group in enumerate(spec.get("workerGroupSpecs", [])):
        check_fields("WorkerGroupSpec", group, f"{where}.workerGroupSpecs[{i}]")
    if "autoscalerOptions" in spec:
        check_fields("AutoscalerOptions", spec["autoscalerOptions"], f"{where}.autoscalerOptions")
    assert all(isinstance(v, str) for g in [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
               for v in g["rayStartParams"].values()), f"{where}: rayStartParams values must be strings"


def test_kuberay_manifests_use_only_known_fields():
    for path, doc in kuberay_objects():
        kind, spec = doc["kind"], doc.get("spec")
        if kind == "RayCluster":
            check_cluster_spec(spec, path.name)
        elif kind == "RayJob":
            check_fields("RayJobSpec", spec, path.name)
            assert ("rayClusterSpec" in spec) != ("clusterSelector" in spec), f"{path.name}: a cluster or a selector"
            if "rayClusterSpec" in spec:
                check_cluster_spec(spec["rayClusterSpec"], f"{path.name}.rayClusterSpec")
        elif kind == "RayService":
            check_fields("RayServiceSpec", spec, path.name)
            check_cluster_spec(spec["rayClusterConfig"], f"{path.name}.rayClusterConfig")
        for where, c in containers(doc):
            check_fields("Container", c, f"{path.name}{where}")


def test_raycluster_cpu_head_and_autoscaled_gpu_group():
    ((path, rc),) = by_kind("RayCluster")
    ((_, svc),) = by_kind("RayService")
    for name, spec in ((path.name, rc["spec"]), ("rayservice.yaml", svc["spec"]["rayClusterConfig"])):
        assert Version(spec["rayVersion"]) == constraints()["ray"], name
        assert spec["enableInTreeAutoscaling"] is True, name
        head = spec["headGroupSpec"]
        assert head["rayStartParams"]["num-cpus"] == "0", f"{name}: the head runs drivers, not tasks"
        for _, c in containers(head):
            assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {}), f"{name}: GPU head"
            assert c["image"].split("/")[-1].startswith("hardpos-cpu:")
        groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
        assert "gpu" in groups, f"{name}: no GPU worker group"
        for gname, g in groups.items():
            assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], f"{name}/{gname}: bounds"
        gpu = groups["gpu"]
        assert gpu["maxReplicas"] > gpu["minReplicas"], f"{name}: GPU group cannot scale"
        for _, c in containers(gpu):
            limits = c["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) >= 1
            assert c["resources"]["requests"]["nvidia.com/gpu"] == limits["nvidia.com/gpu"]
    assert rc["spec"]["workerGroupSpecs"][-1]["minReplicas"] == 0, "GPU nodes scale from zero for jobs"


def test_rayjobs_cover_generate_train_sweep_on_the_cluster():
    jobs = {d["metadata"]["labels"]["hardpos.stage"]: d for _, d in by_kind("RayJob")}
    assert set(jobs) == set(JOB_STAGES)
    ((_, rc),) = by_kind("RayCluster")
    for stage, job in jobs.items():
        spec = job["spec"]
        assert spec["clusterSelector"] == {"ray.io/cluster": rc["metadata"]["name"]}, stage
        assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"working_dir": APP_ROOT}, stage
        assert spec["submitterPodTemplate"]["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("stage", JOB_STAGES)
def test_rayjob_entrypoint_exists_and_its_config_loads(stage):
    ((path, job),) = [(p, d) for p, d in by_kind("RayJob") if d["metadata"]["labels"]["hardpos.stage"] == stage]
    argv = shlex.split(expand(job["spec"]["entrypoint"], cluster_env()))
    assert argv[1] == f"jobs/{stage}.py", f"{path.name}: runs {argv[1]}"
    resolved = check_job_command(argv, path.name)
    assert resolved["output_dir"] == f"{configmap_data()['HARDPOS_RUNS_URI']}/{stage}"
    assert resolved["output_dir"].startswith("s3://"), "cluster jobs write to shared storage"
    check_nested_configs(resolved, path.name)


def test_rayservice_serve_config_is_valid_and_names_the_app():
    from ray.serve.schema import ServeDeploySchema

    ((path, svc),) = by_kind("RayService")
    serve_cfg = yaml.safe_load(svc["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve_cfg)  # Ray's own schema for `serve deploy`
    (app,) = serve_cfg["applications"]
    # The import path names a builder in the installed package (what the image's Serve imports:
    # no PYTHONPATH, no repository checkout); a renamed module or builder fails here.
    module, _, attr = app["import_path"].partition(":")
    assert module.startswith("hardpos."), f"{path.name}: {module} is not in the installed hardpos package"
    assert importlib.util.find_spec(module) is not None, f"{path.name}: module {module} does not exist"
    builder = getattr(importlib.import_module(module), attr, None)
    assert callable(builder), f"{path.name}: {module} defines no builder {attr!r}"
    from hardpos.serve.config import load_app_config

    served = load_app_config(app["args"])  # the builder's own validation (typos fail)
    assert served.model.startswith("models:/") and served.tracking_uri is None, "registry via the ConfigMap"
    assert served.model_deployment.num_gpus >= 1, "model replicas belong on the GPU group"
    assert served.auth_token_env in secret_keys(), "the bearer token comes from the Secret"
    # serve/config.yaml (the local deploy file) serves the same app with a superset of the keys.
    local = REPO / "serve" / "config.yaml"
    assert local.is_file(), "serve/config.yaml does not exist (renamed?)"
    ref = yaml.safe_load(local.read_text())
    ServeDeploySchema.model_validate(ref)
    ref_apps = [a for a in ref["applications"] if a["import_path"] == app["import_path"]]
    assert len(ref_apps) == 1, f"{path.name} imports {app['import_path']}; serve/config.yaml does not"
    (ref_app,) = ref_apps
    unknown = set(app.get("args") or {}) - set(ref_app.get("args") or {})
    assert not unknown, f"{path.name}: args {sorted(unknown)} are not in serve/config.yaml's args"
    ref_deployments = {d["name"] for d in ref_app.get("deployments", [])}
    for d in app.get("deployments", []):
        assert d["name"] in ref_deployments, f"{path.name}: no deployment {d['name']!r} in serve/config.yaml"


def test_top_level_serve_entry_module_is_the_packaged_app():
    """``serve run serve.app:build_app`` (the documented local command) must keep working: a
    renamed or removed serve/app.py fails here, as a renamed hardpos.serve.app fails above."""
    entry = REPO / "serve" / "app.py"
    assert entry.is_file(), "serve/app.py does not exist (renamed?): `serve run serve.app:build_app` breaks"
    spec = importlib.util.spec_from_file_location("_hardpos_serve_entry", entry)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from hardpos.serve.app import build_app

    assert module.build_app is build_app


# --------------------------------------------------------------------------- cluster launcher
def test_ray_cluster_launcher_yaml_is_valid_for_ray():
    from ray.autoscaler._private.util import prepare_config, validate_config

    path = INFRA / "ray-cluster" / "aws.yaml"
    raw = yaml.safe_load(path.read_text())
    validate_config(prepare_config(raw))  # Ray 2.60's launcher schema + its own checks
    assert raw["provider"]["type"] == "aws"
    types = raw["available_node_types"]
    assert types[raw["head_node_type"]]["resources"] == {"CPU": 0}
    version = project_version()
    assert raw["docker"]["head_image"].endswith(f"/hardpos-cpu:{version}")
    gpu_types = [t for t in types.values() if "gpu" in t.get("docker", {}).get("worker_image", "")]
    assert gpu_types, "no GPU worker type"
    for t in gpu_types:
        assert t["docker"]["worker_image"].endswith(f"/hardpos-gpu:{version}")
        assert t["node_config"]["InstanceType"].split(".")[0] in {"g4dn", "g5", "g6", "g6e", "p3", "p4d", "p5"}
        assert t["max_workers"] > t.get("min_workers", 0)
    # Token auth on every node, with the token file shipped beside the settings file.
    for cmd in raw["head_start_ray_commands"] + raw["worker_start_ray_commands"]:
        if "ray start" in cmd:
            assert "RAY_AUTH_MODE=token" in cmd and ". ~/hardpos.env" in cmd
    mounts = raw["file_mounts"]
    assert mounts["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert mounts["~/hardpos.env"] == "infra/ray-cluster/hardpos.env"
    assert (INFRA / "ray-cluster" / "hardpos.env.example").is_file()
    assert "hardpos.env" in (INFRA / "ray-cluster" / ".gitignore").read_text().split()
    example = dotenv(INFRA / "ray-cluster" / "hardpos.env.example")
    assert {"MLFLOW_TRACKING_URI", "RAY_AUTH_MODE"} <= set(example)
    assert example["RAY_SERVE_ENABLE_HA_PROXY"] == "1"  # the documented ingress, as Ray reads it ("1" only)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(example), "S3 access: instance profile"


# --------------------------------------------------------------------------- compose
def dotenv(path: Path) -> dict[str, str]:
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path.name}: bad line {raw!r}"
            out[key.strip()] = value.strip()
    return out


def compose() -> dict[str, Any]:
    return yaml.safe_load((INFRA / "compose" / "docker-compose.yaml").read_text())


def test_compose_stack_mlflow_postgres_minio():
    services = compose()["services"]
    assert {"postgres", "minio", "minio-init", "mlflow"} <= set(services)
    mlflow = services["mlflow"]
    cmd = mlflow["command"]
    backend = cmd[cmd.index("--backend-store-uri") + 1]
    artifacts = cmd[cmd.index("--artifacts-destination") + 1]
    assert backend.startswith("postgresql+psycopg://") and "@postgres:5432/" in backend  # the driver named
    assert artifacts.startswith("s3://")
    assert "--serve-artifacts" in cmd
    assert mlflow["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert mlflow["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert mlflow["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    assert "mlflow:*" in mlflow["environment"]["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")
    build = mlflow["build"]
    assert (INFRA / "compose" / build["context"] / build["dockerfile"]).resolve() == (DOCKER / "Dockerfile.mlflow")
    assert Version(mlflow["image"].split(":")[1]) == constraints()["mlflow"]
    # The init container creates the MLflow artifact bucket and the HardPos bucket.
    init_cmd = " ".join(services["minio-init"]["command"])
    assert "mc mb --ignore-existing" in init_cmd
    for var in ("HARDPOS_BUCKET", "MLFLOW_BUCKET"):
        assert f"$${{{var}}}" in init_cmd and var in services["minio-init"]["environment"]
    # ... and MLflow writes its artifacts to the bucket that the init container made.
    assert artifacts.startswith("s3://${MLFLOW_BUCKET")
    assert services["minio-init"]["environment"]["MLFLOW_BUCKET"] == artifacts[len("s3://"):].split("/")[0]
    # Ray on the HardPos image, wired to the stack by service names, token auth on.
    head = services["ray-head"]
    assert head["image"] == f"hardpos-cpu:{project_version()}"
    assert (INFRA / "compose" / head["build"]["context"] / head["build"]["dockerfile"]).resolve() == DOCKER / "Dockerfile.cpu"
    assert head["environment"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert head["environment"]["HARDPOS_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert "RAY_AUTH_TOKEN" in head["environment"]


def test_compose_publishes_on_loopback_only_and_every_variable_is_defined():
    text = (INFRA / "compose" / "docker-compose.yaml").read_text()
    for name, svc in compose()["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    env = dotenv(INFRA / "compose" / ".env.example")
    # ${VAR} without a default (bare or ${VAR:?message}) must be set in .env.example.
    for match in re.finditer(r"(?<!\$)\$\{(\w+)(:?[-?][^}]*)?\}", text):
        name, modifier = match.group(1), match.group(2) or ""
        if not modifier.lstrip(":").startswith("-"):
            assert name in env, f"compose needs {name}, which .env.example does not define"
    assert ".env" in (INFRA / "compose" / ".gitignore").read_text().split()


def test_env_example_points_hardpos_at_the_stack(monkeypatch):
    """The host-side half of .env.example really steers HardPos's storage and tracking."""
    from hardpos import storage
    from hardpos.config.paths import resolve_tracking_uri

    env = dotenv(INFRA / "compose" / ".env.example")
    services = compose()["services"]
    published = {
        name: {int(p.split(":")[2]) for p in svc.get("ports", [])} for name, svc in services.items()
    }
    for key in ("HARDPOS_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s3 = storage.endpoint_url()
    mlflow_uri = resolve_tracking_uri(None)
    assert s3 == "http://127.0.0.1:9000" and 9000 in published["minio"]
    assert mlflow_uri == "http://127.0.0.1:5000" and 5000 in published["mlflow"]
    # The host's S3 credentials are the stack's MinIO credentials.
    assert env["AWS_ACCESS_KEY_ID"] == env["MINIO_ROOT_USER"]
    assert env["AWS_SECRET_ACCESS_KEY"] == env["MINIO_ROOT_PASSWORD"]
    assert env["RAY_ADDRESS"].endswith(":8265") and 8265 in published["ray-head"]
    # The server signs presigned artifact URLs for its own S3 endpoint, a service name the host
    # cannot resolve: the host's MLflow client streams artifacts through the server instead.
    from urllib.parse import urlparse

    from mlflow.environment_variables import MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD

    assert urlparse(services["mlflow"]["environment"]["MLFLOW_S3_ENDPOINT_URL"]).hostname in services
    assert MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD.is_set() and MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD.get() is False


# --------------------------------------------------------------------------- README
def test_infra_readme_covers_every_path_and_its_commands_exist():
    text = (INFRA / "README.md").read_text()
    headings = [line.lower() for line in text.splitlines() if line.startswith("## ")]
    for topic in ("docker", "kuberay", "cluster launcher", "compose"):
        assert any(topic in h for h in headings), f"infra/README.md has no section on {topic}"
    assert re.search(r"ray job submit --address \S+ .*--working-dir \.", text)
    for needle in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE=disabled", "ray get-auth-token", "8265", "MLFLOW_TRACKING_URI"):
        assert needle in text, f"infra/README.md does not mention {needle}"
    for ref in sorted(set(re.findall(r"\binfra/[\w./-]+\w", text))):
        if ref.endswith(("hardpos.env", "compose/.env")):
            continue  # the user's own copies of the .example files
        assert (REPO / ref).exists(), f"infra/README.md names {ref}, which does not exist"
    commands = re.findall(r"python (jobs/\w+\.py(?: --config \S+)?)", text)
    assert commands
    for cmd in commands:
        argv = ["python", *shlex.split(cmd)]
        script_stage = re.match(r"jobs/(\w+)\.py", argv[1]).group(1)
        require_stage(script_stage, f"infra/README.md: {cmd}")
        if "--config" in argv:
            assert (REPO / argv[argv.index("--config") + 1]).is_file(), f"README names a missing config: {cmd}"
