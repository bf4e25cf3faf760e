"""`hardpos demo` / `make demo`: the whole HardPos pipeline on the embedded default.

Every step is the real stage, run through :func:`hardpos.runtime.execute` on one local Ray,
and tracked as a child of this demo's MLflow run in one experiment (``hardpos-demo``):

1. ``world``     the synthetic world (pretrain / finetune / benchmark splits). A world folder
                 whose ``world.json`` config equals ``world`` is reused (second ``make demo``).
2. ``base``      skipped by default: the base is the CLIP that ships with the package
                 (``pretrained=base:hardpos-base``, pretrained once on this world by the base
                 stage, as real CLIP weights are released once). ``from_scratch`` runs the
                 base stage here with the same recipe (``hardpos base --help``): a small CLIP
                 from scratch with the plain CLIP loss, first on a small curriculum world where
                 relations are learnable, then on this world's pretrain split: the stand-in for
                 a web-pretrained CLIP that has rarely seen non-canonical forms.
3. ``generate``  hard negatives + hard positives for the finetune split (rule engine; the
                 http / vllm engines are ``generate.engine.kind`` away).
4. ``train``     finetune the pretrained checkpoint on Ray Train, one run per ``variants``
                 entry (default: captions-only control, HN-only, HP+HN); ``full=true`` adds
                 the paper's w_neg grid through the ``sweep`` stage and HP+HN with one kind
                 of hard positive only (Table 1(d)). ``finetune.lora_rank`` finetunes with
                 LoRA instead of every weight.
5. ``evaluate``  every model (the pretrained base too) on the world's REPLACE (attribute,
                 relation) and SWAP benchmarks; ``full=true`` adds the WiSE-FT curves
                 (``interpolate`` stage) from the base to HP+HN and to HN-only, with
                 retrieval over pretraining pairs as the retention figure.
6. ``register``  the best finetuned model (mean augmented accuracy on REPLACE and SWAP) as
                 ``models:/<register_name>@champion``.
7. the Table-1-style comparison (``results.md``, ``results.json``) and a chart
   (``results.png``) in ``output_dir``, with the blind baselines under it (text-only models
   that never see the image, on the same benchmarks: :func:`blind_markdown`), every preregistered check this run's models can
   judge, each margin set against the confirmatory worlds' prediction interval
   (:func:`hardpos.paper.confirm.run_verdicts_markdown`): "as the confirmatory result",
   "inside the noise" or "against it"; plus the commands to open the MLflow UI on this store
   and to serve the champion.

Scale (scenes, steps, batch sizes, workers) is all config, so CI runs the same code small.
The job is in three parts, in this order: the config (:class:`Config` and its sections), the
steps (:class:`Pipeline`: how each stage the demo calls is configured, as a child of the
demo's MLflow run; the steps it shares with the base stage are :mod:`hardpos.stages.compose`'s) and
the order they run in (:func:`run`).
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq

import hardpos.stages.base
from hardpos import plots, storage, tracking
from hardpos.markdown import pct, table
from hardpos.stages.compose import (PhaseConfig, check_base_recipe, default_curriculum_world, default_world, epochs_for,
                             slug)
from hardpos.config import ConfigError, JobConfig, ModelConfig, TrackingConfig
from hardpos.config.paths import resolve_tracking_uri
from hardpos.world.scene import WorldConfig
from hardpos.eval.outputs import blind_rows
from hardpos.eval.spec import RetentionConfig, RetrievalSpec
from hardpos.generate import stage as generate
from hardpos.interpolate import stage as interpolate
from hardpos.interpolate.mix import check_alphas
from hardpos.models import bases, registry
from hardpos.paper import confirm, table1
from hardpos.runtime import JobContext, init_ray
from hardpos.serve.ingress import HAPROXY_FLAG, haproxy_available
from hardpos.stages import compose, register
from hardpos.tracking.redact import redact_text
from hardpos.train.config import LossConfig


@dataclasses.dataclass
class Variant:
    """One finetuned model.

    name: its label in the table, in MLflow (run name) and its output folder.
    data: "triplets" (the generate stage's output: caption + hard negative + hard positive)
        or "captions" (the world's finetune split, captions only: the control).
    loss: the train stage's loss, as it takes it (``loss.w_pos``, ``loss.w_neg``,
        ``loss.negclip_columns`` ...; see `hardpos train --help`); on captions only its
        hard-negative and hard-positive terms have nothing to act on.
    positive_kinds: train with the hard positives of these kinds only (``replace``, ``swap``;
        None: all), the paper's Table 1(d).
    """

    name: str = "hp+hn"
    data: Literal["triplets", "captions"] = "triplets"
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    positive_kinds: list[str] | None = None


def _default_variants() -> list[Variant]:
    return [Variant("captions-only", "captions", LossConfig(w_pos=0.0, w_neg=0.0, negclip_columns=False)),
            Variant("hn-only", "triplets", LossConfig(w_pos=0.0, w_neg=1.0)),
            Variant("hp+hn", "triplets", LossConfig(w_pos=1.0, w_neg=1.0))]


def kind_variants() -> list[Variant]:
    """The paper's Table 1(d): HP+HN with the hard positives of one kind only (``--full``)."""
    return [Variant("hp-replace+hn", "triplets", LossConfig(), ["replace"]),
            Variant("hp-swap+hn", "triplets", LossConfig(), ["swap"])]


@dataclasses.dataclass
class Config(JobConfig):
    """The end-to-end demo.

    output_dir: everything goes under it: world/ (unless world_dir), base/ (--from-scratch),
        generate/, finetune/<variant>/, eval/<model>/, register/, results.{md,json,png}.
    seed: seed of every training run (model init, shuffling); the world has its own seed.
    world: the synthetic world (scenes, vocabulary, noncanonical_rate ...; see `hardpos world --help`).
    world_dir: where the world lives (None: <output_dir>/world); reused when its world.json
        config equals ``world``.
    arch: the open_clip architecture of a base pretrained here (``from_scratch``); a
        checkpoint carries its own. With ``pretrain``, ``curriculum`` and ``curriculum_world``,
        the base stage's recipe (``hardpos base --help``); the defaults are the shipped base's.
    pretrain: the base's pretraining phase on the world's pretrain split (``from_scratch``).
    curriculum: the base's phase before ``pretrain`` on ``curriculum_world`` (steps 0: none).
    curriculum_world: the curriculum's world (default: a small one where relations are learnable).
    pretrained: the pretrained base every variant is finetuned from, skipping step 2: the
        base that ships with the package (``base:hardpos-base``, pretrained once on this
        world by the base stage, ``jobs/configs/base.yaml``), or any checkpoint (a local dir,
        s3://, runs:/ or models:/ URI; e.g. an earlier demo's <output_dir>/base/pretrain/model). None
        pretrains here from scratch. A base with a manifest (:mod:`hardpos.models.bases`) must have
        been pretrained on ``world``, and its weights must match the manifest's hash.
    from_scratch: pretrain the base here through the base stage (``curriculum`` then
        ``pretrain``: the shipped base's recipe, about 10 minutes on 2 cores) instead of starting
        from ``pretrained``; needed for any other ``world``. ``--from-scratch`` on the command line.
    finetune: the finetuning phase shared by every variant.
    variants: the finetuned models (default: captions-only control, HN-only, HP+HN).
    generate_engine: engine of the generate stage: rules | http | vllm (http/vllm need
        their settings; use the generate stage directly for those).
    full: also run the paper's w_neg grid (w_pos = 1, w_neg in 0..1) through the sweep stage,
        and the WiSE-FT curves (the interpolate stage) from the base to each ``wise_variants``.
    sweep_grid: the w_neg values of the full grid.
    kind_variants: full mode: also finetune HP+HN with the hard positives of one kind only
        (``hp-replace+hn``, ``hp-swap+hn``: the paper's Table 1(d), its sign 5).
    wise_variants: full mode: the variants whose curve from the base is drawn (names of
        ``variants``; default HP+HN and HN-only).
    wise_alphas: full mode: the curves' mixing weights (0 = base, 1 = the variant).
    wise_retrieval_pairs: full mode: the curves' retention figure, image-text retrieval over
        this many pretraining-split (image, caption) pairs.
    register_name: registered model name of the champion (serve/config.yaml serves
        models:/hardpos-clip@champion).
    eval_batch_size: batch size of the evaluate stage.
    chart: write results.png (matplotlib).
    tracking: one experiment for every run of the demo (children nest under the demo run).
    ray: local Ray (num_cpus: None = all cores) or a cluster address.
    """

    output_dir: str = "outputs/demo"
    tracking: TrackingConfig = dataclasses.field(default_factory=lambda: TrackingConfig(experiment="hardpos-demo"))
    world: WorldConfig = dataclasses.field(default_factory=default_world)
    world_dir: str | None = None
    arch: str = "hardpos-demo-sincos"
    pretrained: str | None = bases.DEFAULT_BASE
    from_scratch: bool = False
    pretrain: PhaseConfig = dataclasses.field(
        default_factory=lambda: PhaseConfig(steps=600, batch_size=32, lr=5e-5, warmup_steps=20, shuffle_buffer=0))
    finetune: PhaseConfig = dataclasses.field(default_factory=lambda: PhaseConfig(steps=150, batch_size=32, lr=3e-4, warmup_steps=20))
    curriculum: PhaseConfig = dataclasses.field(
        default_factory=lambda: PhaseConfig(steps=500, batch_size=32, lr=5e-4, warmup_steps=20, shuffle_buffer=0))
    curriculum_world: WorldConfig = dataclasses.field(default_factory=default_curriculum_world)
    variants: list[Variant] = dataclasses.field(default_factory=_default_variants)
    generate_engine: Literal["rules", "http", "vllm"] = "rules"
    full: bool = False
    sweep_grid: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    kind_variants: bool = True
    wise_variants: list[str] = dataclasses.field(default_factory=lambda: ["hp+hn", "hn-only"])
    wise_alphas: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    wise_retrieval_pairs: int = 1000
    register_name: str = "hardpos-clip"
    eval_batch_size: int = 256
    chart: bool = True

    def __post_init__(self) -> None:
        names = [v.name for v in self.variants]
        if not names:
            raise ConfigError("variants: need at least one finetuned model")
        if len(set(names)) != len(names) or "pretrained" in names:
            raise ConfigError(f"variants: names must be unique and not 'pretrained', got {names}")
        for v in self.variants:
            if not v.name or "/" in v.name:
                raise ConfigError(f"variants: name {v.name!r} must be non-empty without '/'")
        check_base_recipe(self.pretrain, self.curriculum, self.curriculum_world)
        f = self.finetune
        if f.steps < 1 or f.batch_size < 1 or f.num_workers < 1:
            raise ConfigError("finetune: steps, batch_size and num_workers must be >= 1")
        if self.from_scratch:
            if self.pretrained not in (None, bases.DEFAULT_BASE):
                raise ConfigError(f"from_scratch=true pretrains a base from scratch; drop pretrained={self.pretrained}")
            self.pretrained = None
        # a shipped base is tied to the world it was pretrained on: fail now, not after the world is built
        manifest = bases.manifest_for(self.pretrained)
        if manifest is not None:
            bases.check_world(manifest, self.world, source=f"pretrained={self.pretrained}")
        try:
            self.wise_alphas = check_alphas(self.wise_alphas)
        except ValueError as exc:
            raise ConfigError(f"wise_alphas: {exc}") from exc
        unknown = [n for n in self.wise_variants if n not in names]
        if self.full and unknown:
            raise ConfigError(f"wise_variants: {unknown} are not variants ({names})")
        if self.wise_retrieval_pairs < 2:
            raise ConfigError(f"wise_retrieval_pairs must be >= 2, got {self.wise_retrieval_pairs}")


# --------------------------------------------------------------------------- the steps
#: retention on the testbed: image-text retrieval over this many pretraining-split pairs
#: (the base's own task: finetuning that forgets it shows here)
RETRIEVAL_NAME = "pretrain1k"


class Pipeline(compose.Pipeline):
    """The shared steps (world, train, evaluate: :class:`hardpos.stages.compose.Pipeline`) plus the
    demo's own: generate, the base (from scratch), the w_neg grid and the WiSE-FT curves."""

    # 2 ------------------------------------------------------------------ the base
    def base(self, world_dir: str) -> dict:
        """A base pretrained from scratch by the base stage (its recipe from the demo's
        config; not shipped: the demo finetunes its full-precision checkpoint)."""
        cfg = self.cfg
        bcfg = hardpos.stages.base.Config(output_dir=self.ctx.path("base"), seed=cfg.seed, tracking=self.tracking("base"),
                                          ray=cfg.ray, world=cfg.world, world_dir=world_dir, arch=cfg.arch,
                                          curriculum=cfg.curriculum, curriculum_world=cfg.curriculum_world,
                                          pretrain=cfg.pretrain, ship=False, resume=False,
                                          eval_batch_size=cfg.eval_batch_size)
        return self.execute("base", bcfg, "2/7 pretrain a base from scratch (base stage)")

    # 3 ------------------------------------------------------------------ generate
    def generate(self, world_dir: str, regenerate: bool) -> dict:
        cfg = self.cfg
        gcfg = generate.Config(output_dir=self.ctx.path("generate"), seed=cfg.seed, tracking=self.tracking("generate"),
                               ray=cfg.ray, input=f"{world_dir}/finetune.parquet",
                               engine=dataclasses.replace(generate.EngineConfig(), kind=cfg.generate_engine),
                               # a new world invalidates earlier shards; an unchanged one resumes (nothing to do)
                               overwrite=regenerate)
        return self.execute("generate", gcfg, "3/7 generate hard negatives + positives")

    # 4 (full) ---------------------------------------------------------- the w_neg grid
    def sweep(self, triplets: str, base_ckpt: str) -> dict:
        """The paper's w_neg grid (w_pos = 1) through the sweep stage, from the same base."""
        # lazy: the sweep stage imports Ray Tune (seconds); only full=true runs it
        from hardpos.stages import sweep

        cfg, f = self.cfg, self.cfg.finetune
        overrides = {
            "model.arch": cfg.arch, "model.pretrained": base_ckpt, "data.train_path": triplets,
            "data.val_fraction": f.val_fraction, "data.shuffle_buffer": f.shuffle_buffer, "optim.lr": f.lr,
            "optim.warmup_steps": f.warmup_steps, "optim.weight_decay": f.weight_decay, "scaling.num_workers": f.num_workers,
            "scaling.cpus_per_worker": f.cpus_per_worker, "batch_size": f.batch_size, "max_steps": f.steps,
            "epochs": epochs_for(triplets, f), "seed": cfg.seed, "lora.rank": f.lora_rank,
            # Tune needs its objective per epoch (replace/aug_acc, swap/aug_acc); a 300-item slice
            # keeps that cheap. The table itself comes from the evaluate stage on every item.
            "eval_benchmarks": [{"name": n, "kind": "triplets", "path": f"{self.world_dir()}/benchmark/{s}.parquet",
                                 "limit": 300} for n, s in (("replace", "replace_attribute"), ("swap", "swap"))],
        }
        scfg = sweep.Config(output_dir=self.ctx.path("sweep"), seed=cfg.seed, tracking=self.tracking("sweep"), ray=cfg.ray,
                            train_config=None, train_overrides=overrides,
                            search_space={"loss.w_neg": {"grid_search": list(cfg.sweep_grid)}, "loss.w_pos": 1.0},
                            extra_trials=[], register=False, max_concurrent_trials=1)
        summary = self.execute("sweep", scfg, "4/7 full: the paper's w_neg grid (sweep stage)")
        trials = []
        for row in summary.get("rows", []):  # finished trial runs (hardpos.stages.compare.collect_runs rows)
            out_dir = row.get("param:output_dir")
            if not out_dir:
                continue
            trials.append({"w_neg": float(row.get("param:loss.w_neg", float("nan"))),
                           "checkpoint": f"{out_dir}/model", "run_id": row.get("run_id")})
        return {k: v for k, v in summary.items() if k not in ("rows", "table")} | {"trials": trials}

    # 5 (full) ---------------------------------------------------------- WiSE-FT curves
    def wise_curve(self, name: str, base_ckpt: str, checkpoint: str, world_dir: str) -> dict:
        """The interpolate stage from the base (alpha 0) to ``name`` (alpha 1) on the world's
        benchmarks, with retrieval over pretraining pairs as the retention figure."""
        cfg = self.cfg
        wcfg = interpolate.Config(output_dir=self.ctx.path("wise", slug(name)), seed=cfg.seed,
                                  tracking=self.tracking(f"wise-{name}"), ray=cfg.ray,
                                  base=ModelConfig(arch=cfg.arch, pretrained=base_ckpt),
                                  finetuned=ModelConfig(arch=cfg.arch, pretrained=checkpoint),
                                  base_name="pretrained", finetuned_name=name, alphas=list(cfg.wise_alphas), world_dir=world_dir,
                                  retention=RetentionConfig(retrieval=[self.retrieval_set(world_dir)]),
                                  batch_size=cfg.eval_batch_size, device="auto")
        return self.execute("interpolate", wcfg, f"5/7 full: WiSE-FT curve pretrained -> {name}")

    def retrieval_set(self, world_dir: str) -> RetrievalSpec:
        """The first ``wise_retrieval_pairs`` pretraining (image, caption) pairs as a jsonl
        retrieval set under <output_dir>/wise (written once per demo run)."""
        rows = pq.read_table(storage.local_copy(f"{world_dir}/pretrain.parquet"), columns=["image", "caption"])
        rows = rows.slice(0, self.cfg.wise_retrieval_pairs).to_pylist()
        uri = storage.write_text(self.ctx.path("wise", "retrieval_pretrain.jsonl"),
                                 "".join(json.dumps(r) + "\n" for r in rows))
        return RetrievalSpec(name=RETRIEVAL_NAME, captions=uri, image_root=world_dir)


# --------------------------------------------------------------------------- helpers
def instructions(uri: str, cfg: Config, best: str, registered: dict, files: dict, elapsed: float,
                 experiment_id: str | None = None) -> str:
    """What the demo prints at the end: the champion, where the table is, how to open the
    MLflow UI (on the experiment's runs, ``experiment_id``) and serve the champion, and a
    ready curl for one world image."""
    model_uri = registered.get("model_uri", f"models:/{cfg.register_name}@champion")
    # Serve's HAProxy ingress where Ray can find HAProxy (Linux); elsewhere its Python proxy
    haproxy_flag = f"{HAPROXY_FLAG}=1 " if haproxy_available() else ""
    lines = [
        f"Champion: {best} -> {model_uri} (version {registered.get('champion', {}).get('version')})",
        f"Table: {files.get('results_md')}   chart: {files.get('chart', '(disabled)')}",
        f"Pipeline time: {elapsed / 60:.1f} min",
        "",
        "Open the MLflow UI on this store (experiment %r, the demo run holds every stage as a child):" % cfg.tracking.experiment,
        f"  .venv/bin/mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000",
        f"  then {tracking.ui_runs_url('http://127.0.0.1:5000', experiment_id)}",
        "  (MLflow's model-training view: each run's datasets, source and logged model)",
        "",
        "Serve the champion (Ray Serve; Ctrl-C stops it; `serve status` / `serve shutdown -y` need the same RAY_AUTH_MODE):",
        f"  RAY_AUTH_MODE=token {haproxy_flag}MLFLOW_TRACKING_URI={uri} .venv/bin/serve run serve/config.yaml",
    ]
    if cfg.register_name != "hardpos-clip":
        lines.append(f"  (serve/config.yaml serves models:/hardpos-clip@champion: add args.model={model_uri})")
    img = None
    try:
        world_dir = cfg.world_dir or storage.join(files["results_md"].rsplit("/", 1)[0], "world")
        t = pq.read_table(f"{world_dir}/benchmark/swap.parquet", columns=["image", "caption", "hard_negative",
                                                                         "hard_positive"]).slice(0, 1).to_pylist()[0]
        img = str((Path(world_dir) / "benchmark" / t["image"]).resolve())
        caps = [t["caption"], t["hard_negative"], t["hard_positive"]]
    except Exception:  # noqa: BLE001 - the instructions are a convenience
        caps = ["a large red circle and a small blue square", "a large blue circle and a small red square",
                "a small blue square and a large red circle"]
    lines += [
        "then score a world image against its caption, hard negative and hard positive:",
        f"  curl -s http://127.0.0.1:8000/v1/score -F image=@{img or 'IMAGE.png'} "
        + " ".join(f"-F captions='{c}'" for c in caps),
        "  # or JSON: curl -s -H 'content-type: application/json' http://127.0.0.1:8000/v1/score "
        f"-d '{{\"image_b64\": \"'$(base64 -w0 {img or 'IMAGE.png'})'\", \"captions\": {json.dumps(caps)}}}'",
    ]
    return "\n".join(lines)


#: the demo table's cells the blind baselines fill (REPLACE = the mean of its two world benchmarks)
BLIND_COLUMNS = tuple(f"{g}/{f}" for g in ("replace", "swap") for f in table1.PERCENT) + table1.SUBSET_COLUMNS


def blind_markdown(blind: dict[str, dict[str, float]]) -> str:
    """The blind baselines under the demo's table: one row per text-only model, the same
    benchmarks and figures (%), with a line saying what they are (empty without baselines)."""
    if not blind:
        return ""
    head = ["blind model", "REPLACE orig", "REPLACE aug", "REPLACE brittle", "SWAP orig", "SWAP aug", "SWAP brittle",
            "attribute orig", "attribute aug", "attribute brittle", "relation orig", "relation aug", "relation brittle"]
    body = [[label, *(pct(row.get(c)) for c in BLIND_COLUMNS)] for label, row in blind.items()]
    return ("\nBlind baselines: text-only models that never see the image, on the same benchmarks (cross-fitted by "
            "caption; each evaluation's report.md has their 95% intervals). A model's figure above them is what the "
            "image added:\n\n" + table(head, body) + "\n")


def check(cfg: Config) -> None:
    """Before any work: the tracking server (this stage's inputs are read, and named in its errors, by ``run``)."""
    tracking.check_tracking(cfg.tracking)


# --------------------------------------------------------------------------- the job
def run(cfg: Config, ctx: JobContext) -> dict:
    started = time.time()
    base_dir = bases.local_base_dir(cfg.pretrained)
    if base_dir is not None and bases.manifest_path(base_dir).is_file():  # a base with a manifest: its weights are the manifest's
        bases.verify_base(base_dir)
    init_ray(cfg.ray)
    p = Pipeline(cfg, ctx)

    world_dir, reused = p.world()
    if cfg.pretrained:
        p.say(f"2/7 pretrain: skipped, the base is pretrained={cfg.pretrained} (--from-scratch pretrains one here)")
        pre = {"checkpoint": cfg.pretrained, "mlflow_run_id": None, "model_uri": None}
    else:
        pre = p.base(world_dir)
    base_ckpt = pre["checkpoint"]

    gen = p.generate(world_dir, regenerate=not reused)
    triplets = gen["outputs"].get("triplets")
    if not gen.get("complete") or not triplets:
        raise RuntimeError(f"generate stage did not finish (complete={gen.get('complete')}); rerun to resume")

    models: dict[str, dict[str, Any]] = {"pretrained": {"checkpoint": base_ckpt, "run_id": pre["mlflow_run_id"],
                                                        "model_uri": pre.get("model_uri")}}
    variants = list(cfg.variants)
    if cfg.full and cfg.kind_variants:
        variants += [v for v in kind_variants() if v.name not in {x.name for x in variants}]
    for k, v in enumerate(variants, 1):
        data = triplets if v.data == "triplets" else f"{world_dir}/finetune.parquet"
        kinds = f"; positives {'+'.join(v.positive_kinds)} only" if v.positive_kinds else ""
        # captions alone have no hard negatives to add as NegCLIP columns
        loss = dataclasses.replace(v.loss, negclip_columns=v.loss.negclip_columns and v.data == "triplets")
        s = p.train(v.name, f"4/7 finetune {v.name} ({k}/{len(variants)}; w_pos={loss.w_pos:g}, w_neg={loss.w_neg:g}{kinds})",
                    data, cfg.finetune, pretrained=base_ckpt, loss=loss,
                    output_dir=ctx.path("finetune", slug(v.name)),
                    positive_kinds=v.positive_kinds if v.data == "triplets" else None)
        models[v.name] = {"checkpoint": s["checkpoint"], "run_id": s["mlflow_run_id"], "model_uri": s.get("model_uri")}

    sweep_summary = None
    if cfg.full:
        sweep_summary = p.sweep(triplets, base_ckpt)
        for trial in sweep_summary.get("trials", []):
            if trial.get("checkpoint"):
                models[f"w_neg={trial['w_neg']:g}"] = {"checkpoint": trial["checkpoint"], "run_id": trial.get("run_id"),
                                                       "model_uri": None}

    rows: dict[str, dict[str, float]] = {}
    blind_metrics: dict[str, float] = {}  # the same for every model: the benchmarks' texts alone
    for name, m in models.items():
        ev = p.evaluate(name, m["checkpoint"], world_dir)
        rows[name] = table1.table_row(ev["metrics"])
        blind_metrics = blind_metrics or (ev.get("blind") or {}).get("metrics", {})
        m["eval_dir"] = ev["output_dir"]
    blind = blind_rows(blind_metrics, BLIND_COLUMNS, dict(table1.GROUPS))
    wise = {name: p.wise_curve(name, base_ckpt, models[name]["checkpoint"], world_dir)
            for name in (cfg.wise_variants if cfg.full else [])}

    # 6: the champion = best finetuned model by mean augmented accuracy (REPLACE, SWAP)
    candidates = [n for n in models if n != "pretrained" and models[n].get("run_id")]
    ranked = registry.rank(candidates, "objective", metrics_of=rows.__getitem__)  # the sweep's and register's ranking
    if not ranked:
        raise RuntimeError(f"no finetuned model has a finite objective to register: {candidates}")
    best = ranked[0]
    rcfg = register.Config(output_dir=ctx.path("register"), seed=cfg.seed, tracking=p.tracking("register"), ray=cfg.ray,
                           name=cfg.register_name, run_id=models[best]["run_id"], experiment=cfg.tracking.experiment,
                           metric="objective", alias="champion", challenger_alias="")
    registered = p.execute("register", rcfg, f"6/7 register {best} as champion")

    # 7: the comparison
    base = (f"base {cfg.pretrained}" if cfg.pretrained
            else f"{cfg.curriculum.steps} curriculum + " * bool(cfg.curriculum.steps) + f"{cfg.pretrain.steps} pretrain")
    how = f"LoRA rank {cfg.finetune.lora_rank}" if cfg.finetune.lora_rank else "full finetuning"
    title = (f"HardPos demo (world seed {cfg.world.seed}, train seed {cfg.seed}; {cfg.world.n_pretrain} pretrain / "
             f"{cfg.world.n_finetune} finetune scenes; {base} + {cfg.finetune.steps} finetune steps, {how})")
    # ends with the preregistered checks this run can judge, each margin set against the
    # confirmatory worlds' prediction interval (listed without a verdict until every world is in)
    md = table1.markdown_table(rows, title=title)
    md += blind_markdown(blind)
    verdicts = confirm.run_verdicts_markdown(rows)
    if verdicts:
        md += "\n" + verdicts
    if wise:
        md += "\n## WiSE-FT: mixing the base and a finetuned model (interpolate stage)\n\n" + "\n".join(
            storage.read_text(w["files"]["curve_md"]) for w in wise.values())
    files: dict[str, str] = {}
    results = {"rows": rows, "blind": blind, "champion": best, "world_dir": world_dir, "world_reused": reused, "seed": cfg.seed,
               "world_seed": cfg.world.seed, "models": models, "timings_s": p.timings,
               "wise": {n: {"run_id": w["mlflow_run_id"], "output_dir": w["output_dir"], "points": w["points"]}
                        for n, w in wise.items()}}
    files["results_md"] = storage.write_text(ctx.path("results.md"), md)
    files["results_json"] = storage.write_json(ctx.path("results.json"), results)
    if cfg.chart:
        with tempfile.TemporaryDirectory() as tmp:
            local = plots.write_chart(rows, str(Path(tmp) / "results.png"), title=title)  # the chart wraps it
            storage.write_bytes(ctx.path("results.png"), Path(local).read_bytes())
            ctx.log_artifact(local)
        files["chart"] = ctx.path("results.png")
    if not storage.is_s3(ctx.output_dir):  # artifacts are logged from local files
        for key in ("results_md", "results_json"):
            ctx.log_artifact(files[key])
    # MLflow metric names allow [A-Za-z0-9_-. :/]: "hp+hn" is logged as "hp_hn"
    ctx.log_metrics({f"{slug(m)}/{k}": v for m, row in rows.items() for k, v in row.items()})
    ctx.log_metrics({"champion/objective": rows[best]["objective"]})
    ctx.log_metrics({f"blind/{label.split(' ')[1]}/{k}": v for label, row in blind.items() for k, v in row.items()})
    if ctx.run is not None:
        ctx.run.set_tags({"hardpos.champion": best, "hardpos.champion_run_id": models[best]["run_id"] or ""})

    uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    elapsed = time.time() - started
    print("\n" + md)
    experiment_id = None
    if ctx.run is not None and not ctx.run.local:
        experiment_id = tracking.experiment_id_of(uri, ctx.run.run_id)
    print(redact_text(instructions(uri, cfg, best, registered, files, elapsed, experiment_id)))
    return {"rows": rows, "champion": best, "champion_model_uri": registered.get("model_uri"),
            "registered": registered.get("champion"), "models": models, "world_dir": world_dir, "world_reused": reused,
            "files": files, "timings_s": p.timings, "tracking_uri": uri, "sweep": sweep_summary,
            "wise": results["wise"], "pipeline_s": round(elapsed, 1)}
