"""WiSE-FT: the trade-off curve between a base and a finetuned model, without training again.

For each ``alphas`` value the stage mixes the two models' weights,
theta(alpha) = (1 - alpha) * theta_base + alpha * theta_ft (:mod:`hardpos.interpolate.mix`; the
two must share an architecture, else a clear error before any evaluation), evaluates the mix
on the configured benchmarks and retention sets exactly as the evaluate stage scores a model
(:mod:`hardpos.eval.model_eval`), and writes under ``output_dir``:

* ``alpha_<a>/``  per mix: the evaluate stage's outputs (report.md, scores.parquet ...), the
  mixed checkpoint ``model/`` (open_clip local-dir format) and summary.json;
* ``curve.md``    the trade-off table (augmented accuracy, brittleness per benchmark,
  zero-shot / retrieval per retention set, one row per alpha);
* ``curve.json``  the same numbers, ``curve.png`` the plot.

MLflow: this run is the parent; each alpha is a child run (tag ``hardpos.stage=interpolate``,
its metrics, the mixed model logged like a trained model, so ``runs:/<child>/model`` loads
and the register stage can register it) with provenance tags ``hardpos.wise.base``,
``hardpos.wise.finetuned``, ``hardpos.wise.alpha`` and the same facts as ``model.wise.*``
params (the register stage copies a run's ``model.*`` params onto the model version).
``register_alpha=<a>`` registers that child's model here as
``models:/<register_name>@<register_alias>`` with the provenance tags on the version.

Example:
    python jobs/interpolate.py base.pretrained=base:hardpos-base \\
        finetuned.pretrained=outputs/demo/finetune/hp_hn/model world_dir=outputs/demo/world \\
        'alphas=[0, 0.25, 0.5, 0.75, 1]' register_alpha=0.5
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from hardpos import markdown, plots, preflight, storage, tracking
from hardpos.config import ConfigError, JobConfig, ModelConfig, TrackingConfig, require
from hardpos.config.paths import resolve_tracking_uri
from hardpos.eval import outputs
from hardpos.eval.benchmarks import check_benchmarks
from hardpos.eval.model_eval import evaluate_model, resolve_device, resolve_specs
from hardpos.eval.spec import BenchmarkSpec, Precision, RetentionConfig
from hardpos.interpolate.mix import check_alphas, interpolate_state, load_pair, state_of
from hardpos.models import registry, weights
from hardpos.models.uri import mlflow_client
from hardpos.runtime import JobContext, execute

if TYPE_CHECKING:
    import torch

    from hardpos.models.clip import LoadedModel

# The CLI imports this module for its Config: torch and open_clip load inside the functions
# that use them (`# lazy:` below), once a job runs.

#: retention figures shown in the curve (the per-alpha report.md has every figure)
RETENTION_FIGURES = ("top1", "i2t_r1", "t2i_r1")
PROVENANCE = ("hardpos.wise.base", "hardpos.wise.finetuned", "hardpos.wise.alpha")


@dataclasses.dataclass
class Config(JobConfig):
    """WiSE-FT interpolation between two models of the same architecture.

    base: the alpha = 0 endpoint (arch + pretrained: open_clip tag, checkpoint path, s3://,
        runs:/<id>/model, models:/<name>@<alias>; MLflow URIs are looked up in
        tracking.tracking_uri).
    finetuned: the alpha = 1 endpoint, of the same architecture as ``base`` (same forms).
    base_name: the base's label in the curve's title and the reports.
    finetuned_name: the finetuned model's label in the curve's title and the reports.
    alphas: mixing weights in [0, 1] (0 = base, 1 = finetuned), one child run each.
    benchmarks: benchmark files every mix is evaluated on, as in the evaluate stage.
    world_dir: a synthetic world's folder: adds its REPLACE attribute / relation and SWAP
        benchmarks to ``benchmarks``.
    retention: zero-shot classification and retrieval sets every mix is evaluated on (how much
        of the base's general ability each mix keeps), as in the evaluate stage.
    device: where the mixes are scored ("auto": a GPU when there is one), as in the evaluate stage.
    precision: scoring precision (fp32 by default), as in the evaluate stage.
    batch_size: images / captions encoded per batch.
    num_threads: image decoding threads.
    register_alpha: register this alpha's model (one of ``alphas``; None: register nothing)
        as models:/<register_name>@<register_alias>, with both parents and alpha as tags.
    register_name: the registered model name ``register_alpha``'s mix is registered under.
    register_alias: the alias that version gets (``models:/<register_name>@<register_alias>``
        loads it; Serve and the evaluate stage take that URI).
    """

    output_dir: str = "outputs/interpolate"
    tracking: TrackingConfig = dataclasses.field(default_factory=lambda: TrackingConfig(experiment="hardpos-interpolate"))
    base: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    finetuned: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    base_name: str = "base"
    finetuned_name: str = "finetuned"
    alphas: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    benchmarks: list[BenchmarkSpec] = dataclasses.field(default_factory=list)
    world_dir: str | None = None
    retention: RetentionConfig = dataclasses.field(default_factory=RetentionConfig)
    device: str = "auto"
    precision: Precision = "fp32"
    batch_size: int = 256
    num_threads: int = 4
    register_alpha: float | None = None
    register_name: str = "hardpos-clip-wise"
    register_alias: str = "wise"

    def __post_init__(self) -> None:
        try:
            self.alphas = check_alphas(self.alphas)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        require(self.batch_size >= 1, "batch_size", "must be >= 1", self.batch_size)
        require(self.num_threads >= 1, "num_threads", "must be >= 1", self.num_threads)
        if self.register_alpha is not None:
            require(any(math.isclose(self.register_alpha, a) for a in self.alphas), "register_alpha",
                    f"must be one of alphas {self.alphas}", self.register_alpha)


def alpha_label(alpha: float) -> str:
    """``0.25`` -> ``alpha_0.25`` (the per-alpha folder and, as ``alpha=0.25``, run name)."""
    return f"alpha_{alpha:g}"


def source_of(model: ModelConfig) -> str:
    """A model's provenance string: the absolute path of a local checkpoint, else the URI or
    tag as given, ``random <arch>`` for random weights."""
    if not model.pretrained:
        return f"random {model.arch}"
    path = Path(model.pretrained).expanduser()
    return str(path.resolve()) if path.exists() else model.pretrained


# --------------------------------------------------------------------------- the curve
def curve_columns(specs: Sequence[BenchmarkSpec], metrics: Mapping[str, float]) -> list[tuple[str, str]]:
    """[(header, metric key)]: original and augmented accuracy and brittleness per benchmark
    (original accuracy alone where a benchmark has no hard positives), then the retention
    figures present in ``metrics``."""
    cols: list[tuple[str, str]] = []
    for s in specs:
        if f"{s.name}/aug_acc" in metrics:
            cols += [(f"{s.name} orig", f"{s.name}/orig_acc"), (f"{s.name} aug", f"{s.name}/aug_acc"),
                     (f"{s.name} brittle", f"{s.name}/brittleness")]
        elif f"{s.name}/orig_acc" in metrics:
            cols.append((f"{s.name} orig", f"{s.name}/orig_acc"))
    for key in sorted(metrics):
        if key.startswith(("zeroshot/", "retrieval/")) and key.rsplit("/", 1)[-1] in RETENTION_FIGURES:
            cols.append((key, key))
    return cols


def curve_markdown(points: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], *, title: str) -> str:
    """The trade-off table: one row per alpha, figures in percent (:func:`hardpos.markdown.table`)."""
    rows = [[f"{p['alpha']:g}"] + [markdown.pct(p["metrics"].get(k)) for _, k in columns] for p in points]
    return "\n".join([f"### {title}", "", "alpha = 0 is the base, 1 the finetuned model; figures in %.", "",
                      markdown.table(["alpha"] + [h for h, _ in columns], rows), ""])


# --------------------------------------------------------------------------- the job
def _save_mix(model: torch.nn.Module, lm: LoadedModel, out_dir: str, meta: dict[str, Any], tmp: str) -> tuple[Path, str]:
    """Write the mixed checkpoint to a local folder and to ``<out_dir>/model`` (local or
    s3://); returns (local folder, its output URI)."""
    from hardpos.models.clip import save_checkpoint  # lazy: see the module's imports

    local = save_checkpoint(model, lm.model_cfg, Path(tmp) / "model", meta=meta)
    target = storage.join(out_dir, "model")
    if storage.is_s3(target) or Path(target).resolve() != local.resolve():
        storage.upload_dir(local, target)
    return local, target


def _one_alpha(alpha: float, model: torch.nn.Module, lf: LoadedModel, states: tuple[dict, dict],
               specs: Sequence[BenchmarkSpec], device: str, provenance: dict[str, str]):
    """The child run of one alpha (a ``run_fn`` for :func:`hardpos.runtime.execute`)."""
    # lazy: see the module's imports
    from hardpos.models.clip import unwrap

    def run_child(cfg: Config, ctx: JobContext) -> dict:
        unwrap(model).load_state_dict(interpolate_state(*states, alpha))
        report, retention = evaluate_model(model, lf, specs, device=device, batch_size=cfg.batch_size,
                                           num_threads=cfg.num_threads, precision=cfg.precision, retention=cfg.retention)
        metrics = {**report.metrics, **retention}
        name = f"{cfg.finetuned_name} alpha={alpha:g}"
        files = outputs.write_outputs(report, ctx.output_dir, model_name=name, retention=retention, device=device)
        ctx.log_metrics({**metrics, "alpha": alpha})
        model_uri = None
        with tempfile.TemporaryDirectory(prefix="hardpos-wise-") as tmp:
            meta = {"arch": lf.arch, "source": "wise-ft", **provenance}
            local, checkpoint = _save_mix(model, lf, ctx.output_dir, meta, tmp)
            if ctx.run is not None:
                ctx.run.set_tags(provenance)
                ctx.run.log_params({f"model.wise.{k.rsplit('.', 1)[-1]}": v for k, v in provenance.items()})
                for uri in files.values():  # the evaluate stage's outputs, as artifacts
                    copy = Path(tmp) / uri.rsplit("/", 1)[-1]
                    copy.write_bytes(storage.read_bytes(uri))
                    ctx.log_artifact(copy)
                model_uri, _ = ctx.run.log_model(local, durable_dir=checkpoint)
        return {"alpha": alpha, "metrics": metrics, "checkpoint": checkpoint, "model_uri": model_uri, "files": files}

    return run_child


def check(cfg: Config) -> None:
    """Before any work: like the evaluate stage's check, for both endpoints of the mix."""
    preflight.check_s3_endpoint([s.path for s in cfg.benchmarks]
                                + [cfg.base.pretrained, cfg.finetuned.pretrained, cfg.world_dir])
    check_benchmarks(cfg.benchmarks, cfg.world_dir, cfg.allow_empty)
    tracking.check_tracking(cfg.tracking)
    weights.check_model("base", cfg.base.arch, cfg.base.pretrained)
    weights.check_model("finetuned", cfg.finetuned.arch, cfg.finetuned.pretrained)


def run(cfg: Config, ctx: JobContext) -> dict:
    specs = resolve_specs(cfg.benchmarks, cfg.world_dir, cfg.retention)
    device = resolve_device(cfg.device)
    import torch  # lazy: see the module's imports

    torch.manual_seed(cfg.seed)  # random-weight endpoints are reproducible from the seed
    lb, lf = load_pair(cfg.base, cfg.finetuned, device=device, tracking_uri=cfg.tracking.tracking_uri)
    states = (state_of(lb.model), state_of(lf.model))
    del lb  # the mixes are loaded into the finetuned model's module, in place
    base_src, ft_src = source_of(cfg.base), source_of(cfg.finetuned)

    points: list[dict[str, Any]] = []
    for alpha in cfg.alphas:
        provenance = {"hardpos.wise.base": base_src, "hardpos.wise.finetuned": ft_src, "hardpos.wise.alpha": f"{alpha:g}"}
        child = dataclasses.replace(cfg, output_dir=ctx.path(alpha_label(alpha)), alphas=[alpha], register_alpha=None,
                                    tracking=dataclasses.replace(cfg.tracking, run_name=f"alpha={alpha:g}"))
        s = execute("interpolate", child, parent_run_id=ctx.run_id, quiet=True,
                    run_fn=_one_alpha(alpha, lf.model, lf, states, specs, device, provenance))
        points.append({"alpha": alpha, "run_id": s.get("mlflow_run_id"), "metrics": s["metrics"],
                       "checkpoint": s["checkpoint"], "model_uri": s.get("model_uri"), "output_dir": s["output_dir"]})
        print(f"[interpolate] alpha={alpha:g}: " + ", ".join(
            f"{k}={100 * v:.1f}" for k, v in s["metrics"].items() if k.endswith(("/aug_acc", "/brittleness", "/top1"))))

    columns = curve_columns(specs, points[0]["metrics"])
    title = f"WiSE-FT: {cfg.base_name} (alpha=0) -> {cfg.finetuned_name} (alpha=1)"
    md = curve_markdown(points, columns, title=title)
    files = {"curve_md": storage.write_text(ctx.path("curve.md"), md),
             "curve_json": storage.write_json(ctx.path("curve.json"), {"base": base_src, "finetuned": ft_src,
                                                                      "points": points})}
    with tempfile.TemporaryDirectory() as tmp:
        local = plots.curve_plot(points, columns, str(Path(tmp) / "curve.png"), title=title)
        files["curve_png"] = storage.write_bytes(ctx.path("curve.png"), Path(local).read_bytes())
        ctx.log_artifact(local)
        for key in ("curve_md", "curve_json"):
            copy = Path(tmp) / files[key].rsplit("/", 1)[-1]
            copy.write_bytes(storage.read_bytes(files[key]))
            ctx.log_artifact(copy)

    registered = None
    if cfg.register_alpha is not None:
        registered = register_point(cfg, points)
        print(f"registered alpha={cfg.register_alpha:g} as {registered['model_uri']} (version {registered['version']})")
    print("\n" + md)
    return {"base": base_src, "finetuned": ft_src, "alphas": cfg.alphas, "points": points, "columns": columns,
            "files": files, "registered": registered}


def register_point(cfg: Config, points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Register ``cfg.register_alpha``'s child-run model as ``register_name@register_alias``
    (:func:`hardpos.models.registry.register`), the provenance tags on the version."""
    point = next(p for p in points if math.isclose(p["alpha"], cfg.register_alpha))
    if not point.get("run_id") or not point.get("model_uri"):
        raise RuntimeError(f"alpha={cfg.register_alpha:g} has no tracked model to register (tracking disabled, or "
                           "the run was recorded locally); register it later with the register stage")
    client = mlflow_client(resolve_tracking_uri(cfg.tracking.tracking_uri))
    run = client.get_run(point["run_id"])
    provenance = {k: run.data.tags[k] for k in PROVENANCE if k in run.data.tags}
    reg = registry.register(client, run, cfg.register_name, cfg.register_alias, extra_tags=provenance)
    return {**dataclasses.asdict(reg), "model_uri": f"models:/{cfg.register_name}@{cfg.register_alias}",
            "provenance": provenance}
