"""The brittleness explorer (hardpos.explorer): which items it shows, what the page holds,
the compare stage writing and logging it, and the page in a real headless Chromium.

The browser test needs Debian's ``chromium`` and pip's ``playwright`` (driving the system
browser: no browser download; HARDPOS_CHROMIUM names another Chromium binary). Without them it skips,
unless HARDPOS_REQUIRE_BROWSER is set (CI sets it), where it fails instead.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hardpos import explorer
from hardpos.eval.benchmarks import load_benchmark
from hardpos.eval.spec import BenchmarkSpec
from tests.support.fixtures import PALETTE, draw_shape, write_rows

REPO = Path(__file__).resolve().parent.parent
EVIL = '<script>alert("x")</script> & <b>bold</b>'


# --------------------------------------------------------------------------- helpers
def _write_scores(path: Path, rows: list[tuple[str, str, str, float, float, float | None]],
                  text: list[tuple[float, float, float]] | None = None) -> Path:
    """A scores.parquet as the evaluate stage writes it: (item_id, benchmark, subset, s_c, s_n, s_p),
    plus SugarCrepe++'s text cosines (t_cp, t_cn, t_pn) per row when ``text`` is given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = list(zip(*rows))
    names = ("item_id", "benchmark", "subset", "s_c", "s_n", "s_p")
    data = {k: list(v) for k, v in zip(names, cols)}
    fields = [(k, pa.string() if k in names[:3] else pa.float64()) for k in names]
    if text is not None:
        data.update({k: list(v) for k, v in zip(("t_cp", "t_cn", "t_pn"), zip(*text))})
        fields += [(k, pa.float64()) for k in ("t_cp", "t_cn", "t_pn")]
    pq.write_table(pa.table(data, schema=pa.schema(fields)), path)
    return path


def _naive_outcome(c: float, n: float, p: float | None) -> str:
    """The outcome written out by hand (independent of hardpos.explorer.outcome)."""
    if p is None:
        return "correct" if c > n else "wrong"
    if c > n and p > n:
        return "correct"
    if c > n > p:
        return "brittle (P<N)"
    if p > n > c:
        return "brittle (C<N)"
    if c > n and p == n:
        return "tie (P=N)"
    return "wrong"


# Scores by item: (s_c, s_n, s_p) per model, chosen so each model's outcome is known.
SCORE_PATTERNS = {
    "correct": (0.30, 0.20, 0.25),
    "brittle (P<N)": (0.30, 0.20, 0.10),
    "brittle (C<N)": (0.10, 0.20, 0.30),
    "wrong": (0.10, 0.20, 0.15),
}


def _fixture_benchmarks(root: Path) -> tuple[list[BenchmarkSpec], dict[str, list]]:
    """Two benchmarks with drawn images: ``shapes`` (a triplet file, kinds attribute /
    relation; item 2's caption is hostile HTML) and ``scpp`` (SugarCrepe++'s five files)."""
    colours = list(PALETTE)
    rows = []
    for i in range(24):
        true, false = colours[i % len(colours)], colours[(i + 1) % len(colours)]
        shape = ("circle", "square")[i % 2]
        rows.append({"image": f"img/{true}_{shape}.png", "caption": f"a {true} {shape}",
                     "hard_negative": f"a {false} {shape}", "hard_positive": f"a {shape} that is {true}",
                     "kind": ("attribute", "relation")[(i // 2) % 2], "source": "test", "caption_id": str(i)})
    rows[2]["caption"] = EVIL  # item 2 is a disagreement (see _model_scores)
    shapes_dir = root / "shapes"
    for r in rows:
        colour, shape = Path(r["image"]).stem.split("_")
        if not (shapes_dir / r["image"]).exists():
            draw_shape(shapes_dir / r["image"], colour, shape, size=96)
    shapes = write_rows(shapes_dir, rows, images=False)
    scpp = root / "scpp"
    scpp.mkdir(parents=True)
    from hardpos.eval.formats import SUGARCREPE_PP_CATEGORIES as CATEGORIES
    for k, cat in enumerate(CATEGORIES):
        items = []
        for j in range(4):
            colour = colours[(k + j) % len(colours)]
            name = f"{colour}_scpp.png"
            if not (scpp / name).exists():
                draw_shape(scpp / name, colour, "circle", size=96)
            items.append({"id": j, "filename": name, "caption": f"a {colour} circle",
                          "caption2": f"a circle coloured {colour}", "negative_caption": f"a {colour} square"})
        (scpp / f"{cat}.json").write_text(json.dumps(items))
    specs = [BenchmarkSpec(name="shapes", kind="triplets", path=str(shapes)),
             BenchmarkSpec(name="scpp", kind="sugarcrepe_pp", path=str(scpp))]
    return specs, {s.name: load_benchmark(s).items for s in specs}


def _model_scores(items: dict[str, list], models: list[str]) -> dict[str, list[tuple]]:
    """Per model, score rows whose outcomes cycle through SCORE_PATTERNS at a model-dependent
    rate, so agreement and several outcome combinations both occur (deterministic)."""
    patterns = list(SCORE_PATTERNS.values())
    out: dict[str, list[tuple]] = {m: [] for m in models}
    for bench, its in items.items():
        for j, it in enumerate(its):
            for k, m in enumerate(models):
                c, n, p = patterns[(j * (k + 1) // 3) % len(patterns)]
                out[m].append((it.item_id, bench, it.subset, c, n, p))
    return out


def _evaluations(tmp_path: Path, items, models=("HN-only", "HP+HN")) -> dict[str, Path]:
    scores = _model_scores(items, list(models))
    return {m: _write_scores(tmp_path / "eval" / f"m{k}" / "scores.parquet", scores[m]).parent
            for k, m in enumerate(models)}


def _expected_combinations(evals: dict[str, Path]) -> dict[str, int]:
    """Outcome-combination label -> number of disagreeing items, from the files, by hand."""
    per_model = {m: pq.read_table(d / "scores.parquet").to_pylist() for m, d in evals.items()}
    models = list(per_model)
    out: dict[str, int] = {}
    for rows in zip(*per_model.values()):
        names = [_naive_outcome(r["s_c"], r["s_n"], r["s_p"]) for r in rows]
        if len(set(names)) > 1:
            label = " · ".join(f"{m}: {o}" for m, o in zip(models, names))
            out[label] = out.get(label, 0) + 1
    return out


# --------------------------------------------------------------------------- pure parts
@pytest.mark.parametrize(("scores", "name"), [
    ((0.3, 0.2, 0.25), "correct"), ((0.3, 0.2, 0.1), "brittle (P<N)"), ((0.1, 0.2, 0.3), "brittle (C<N)"),
    ((0.1, 0.2, 0.15), "wrong"), ((0.3, 0.2, 0.2), "tie (P=N)"), ((0.2, 0.2, 0.3), "wrong"),
    ((0.3, 0.2, None), "correct"), ((0.2, 0.2, None), "wrong"),
])
def test_outcome_names_each_verdict_triple(scores, name):
    assert explorer.outcome(explorer.ItemScores("s", *scores)) == name


def test_vectorised_outcomes_equal_the_per_item_outcome():
    """disagreements() names outcomes over arrays; it must agree with the per-item
    outcome (itself from metrics.verdicts) everywhere, ties and missing positives included."""
    import numpy as np

    rng = np.random.default_rng(0)
    c, n, p = (rng.integers(0, 4, 3000) / 4 for _ in range(3))  # coarse grid: many ties
    p[::7] = np.nan
    got = explorer.outcomes(c, n, p)
    want = [explorer.outcome(explorer.ItemScores("s", a, b, None if np.isnan(d) else d)) for a, b, d in zip(c, n, p)]
    assert list(got) == want
    assert set(want) == {"correct", "brittle (P<N)", "brittle (C<N)", "tie (P=N)", "wrong"}


def test_disagreements_of_three_models_by_hand():
    """A hand-made 3-model example: the rows are exactly the items whose outcomes differ
    between ANY two models; items some model lacks and benchmarks not every model scored
    are left out (and counted)."""
    S = explorer.ItemScores
    ok, brittle_p, brittle_c, wrong = (S("a", 0.3, 0.2, 0.25), S("a", 0.3, 0.2, 0.1),
                                       S("r", 0.1, 0.2, 0.3), S("r", 0.1, 0.2, 0.15))
    a = {"b": {"1": ok, "2": ok, "3": brittle_p, "4": wrong, "5": ok, "6": ok}, "only_a": {"1": ok}}
    b = {"b": {"1": ok, "2": ok, "3": brittle_p, "4": wrong, "5": brittle_p, "7": ok}}
    c = {"b": {"1": ok, "2": brittle_c, "3": brittle_p, "4": ok, "5": brittle_p, "6": wrong}}
    got = explorer.disagreements({"A": a, "B": b, "C": c})
    assert list(got) == ["b"]
    t = got["b"]
    assert [r.item_id for r in t.rows] == ["2", "4", "5"]  # 1 and 3 agree; 6 and 7 are not scored by all
    assert (t.n_common, t.n_partial) == (5, 2)
    assert got["b"].rows[1].outcomes == ("wrong", "wrong", "correct")
    assert got["b"].rows[2].combination(["A", "B", "C"]) == "A: correct · B: brittle (P<N) · C: brittle (P<N)"
    with pytest.raises(explorer.ExplorerError, match="at least two models"):
        explorer.disagreements({"A": a})
    with pytest.raises(explorer.ExplorerError, match="share no benchmark"):
        explorer.disagreements({"A": {"x": {}}, "B": {"y": {}}})


def test_cap_rows_takes_every_combination_in_turn():
    S = explorer.ItemScores
    rows = [explorer.Row("b", str(i), "s", (S("s", 0, 0, 0),) * 2, ("correct", "wrong") if i < 9 else ("wrong", "correct"))
            for i in range(10)]
    kept = explorer.cap_rows(rows, 4, ["A", "B"])
    assert [r.item_id for r in kept] == ["0", "1", "2", "9"]  # the single rare row is kept, input order kept
    assert explorer.cap_rows(rows, 50, ["A", "B"]) == rows


def test_page_escapes_text_selects_disagreements_and_links_existing_images(tmp_path):
    specs, items = _fixture_benchmarks(tmp_path / "bench")
    evals = _evaluations(tmp_path, items)
    models = {m: explorer.read_scores(str(d)) for m, d in evals.items()}
    res = explorer.write_explorer(models, items, tmp_path / "explorer", max_rows_per_benchmark=7)
    page = res.index.read_text(encoding="utf-8")
    expected = _expected_combinations(evals)
    n_dis = sum(expected.values())
    # the counts per benchmark: every disagreement counted, at most the cap shown, and the page says so
    assert sum(c["disagreements"] for c in res.counts.values()) == n_dis
    assert {b: c["shown"] for b, c in res.counts.items()} == {b: min(7, c["disagreements"]) for b, c in res.counts.items()}
    assert "At most 7 rows per benchmark are shown" in page
    assert page.count("<tr data-idx=") == sum(c["shown"] for c in res.counts.values())
    # every shown row really is a disagreement
    for rows in res.shown.values():
        assert all(len(set(r.outcomes)) > 1 for r in rows)
    # escaping: the hostile caption never appears raw; no markup from data
    assert "<script>alert" not in page and "<b>bold" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    assert page.count("<script>") == 1  # the page's own inline script only
    # offline: nothing external; every image relative and present
    assert not re.search(r'(src|href)="(https?:)?//', page)
    srcs = re.findall(r'<img src="([^"]+)"', page)
    assert srcs and all(not s.startswith("/") and (res.index.parent / s).is_file() for s in srcs)
    assert len(list((res.index.parent / "images").iterdir())) == len(set(srcs))
    # SugarCrepe++ categories are subsets; the outcome options are the combinations present
    subset_select = re.search(r'<select id="f-subset"[^>]*>(.*?)</select>', page).group(1)
    shown_subsets = {r.subset for rows in res.shown.values() for r in rows}
    assert set(re.findall(r'data-label="([^"]+)"', subset_select)) == shown_subsets | {"all"}
    assert {"attribute", "relation"} <= shown_subsets and shown_subsets & {"replace_att", "swap_att", "swap_obj"}
    shown_combos = {r.combination(res.models) for rows in res.shown.values() for r in rows}
    for combo in shown_combos:
        assert f'data-label="{html.escape(combo)}"' in page


def test_missing_benchmark_and_missing_image_are_said_not_fatal(tmp_path):
    specs, items = _fixture_benchmarks(tmp_path / "bench")
    evals = _evaluations(tmp_path, items)
    models = {m: explorer.read_scores(str(d)) for m, d in evals.items()}
    for it in items["shapes"]:
        if "red_circle" in it.image:
            Path(it.image).unlink(missing_ok=True)
    res = explorer.write_explorer(models, {"shapes": items["shapes"]}, tmp_path / "explorer")
    page = res.index.read_text(encoding="utf-8")
    assert "scpp: not shown: no benchmark configured for it." in page
    assert "image unavailable" in page
    assert list(res.shown) == ["shapes"]
    with pytest.raises(explorer.ExplorerError, match="none of the scored benchmarks"):
        explorer.write_explorer(models, {"other": []}, tmp_path / "explorer2")
    with pytest.raises(explorer.ExplorerError, match="no per-item scores"):
        explorer.read_scores(str(tmp_path / "nowhere"))


def test_real_sugarcrepe_pp_items_with_stand_in_images(shared_data, tmp_path):
    """The real SugarCrepe++ files (5 categories) with stand-in images: its items and
    paraphrases (the hard positives) reach the page, category by category."""
    from tests.support.fixtures import write_image

    spec = BenchmarkSpec(name="sugarcrepe_pp", kind="sugarcrepe_pp", path=str(shared_data / "sugarcrepe_pp"),
                         image_root=str(tmp_path / "coco"), limit=6)
    its = load_benchmark(spec).items
    for it in its:
        if not Path(it.image).exists():
            write_image(Path(it.image), (90, 140, 200), size=(64, 48))
    scores = _model_scores({"sugarcrepe_pp": its}, ["base", "tuned"])
    # text-only: "base" gets every item right, "tuned" none (its paraphrase is nearer the negative)
    text = {"base": [(0.9, 0.5, 0.4)] * len(its), "tuned": [(0.5, 0.6, 0.4)] * len(its)}
    evals = {m: _write_scores(tmp_path / m / "scores.parquet", rows, text[m]).parent for m, rows in scores.items()}
    res = explorer.write_explorer({m: explorer.read_scores(str(d)) for m, d in evals.items()}, {"sugarcrepe_pp": its},
                                  tmp_path / "explorer")
    page = res.index.read_text(encoding="utf-8")
    assert res.counts["sugarcrepe_pp"]["items"] == 30
    assert res.counts["sugarcrepe_pp"]["disagreements"] == sum(_expected_combinations(evals).values())
    row = res.shown["sugarcrepe_pp"][0]
    item = next(it for it in its if it.item_id == row.item_id)
    assert html.escape(item.positive) in page and html.escape(item.negative) in page
    assert row.scores[0].text_only is True and row.scores[1].text_only is False
    assert page.count("text-only: correct") == page.count("text-only: wrong") == len(res.shown["sugarcrepe_pp"])
    assert {r.subset for r in res.shown["sugarcrepe_pp"]} <= {"replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj"}


# --------------------------------------------------------------------------- the compare stage
def test_compare_stage_writes_and_logs_the_explorer_and_can_turn_it_off(tmp_path, tracking_uri):
    import mlflow

    from hardpos.config import ConfigError, load_config
    from hardpos.runtime import execute
    from hardpos.stages import compare

    specs, items = _fixture_benchmarks(tmp_path / "bench")
    evals = _evaluations(tmp_path, items)
    # the second model as an evaluate run tracked in MLflow (its scores.parquet logged at the root)
    client = mlflow.MlflowClient(tracking_uri)
    exp = client.create_experiment("h5-evals", artifact_location=str(tmp_path / "artifacts"))
    eval_run = client.create_run(exp).info.run_id
    client.log_artifact(eval_run, str(evals["HP+HN"] / "scores.parquet"))
    evals["HP+HN"] = f"runs:/{eval_run}"
    bench_yaml = "[" + ", ".join(f"{{name: {s.name}, kind: {s.kind}, path: '{s.path}'}}" for s in specs) + "]"
    evals_yaml = "{" + ", ".join(f"'{m}': '{d}'" for m, d in evals.items()) + "}"
    base = [f"tracking.experiment=h5-explorer-{tmp_path.name}", f"explorer.evaluations={evals_yaml}",
            f"explorer.benchmarks={bench_yaml}", "explorer.max_rows_per_benchmark=5"]
    cfg = load_config(compare.Config, None, [f"output_dir={tmp_path / 'out'}", *base])
    summary = execute("compare", cfg, quiet=True)
    index = tmp_path / "out" / "explorer" / "index.html"
    assert summary["explorer"]["index"] == str(index) and index.is_file()
    assert summary["runs"] == 0 and "table" not in summary  # no tracked runs: the explorer alone
    assert summary["explorer"]["models"] == ["HN-only", "HP+HN"]
    assert summary["explorer"]["benchmarks"]["shapes"]["shown"] == 5
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(summary["mlflow_run_id"], "explorer")}
    assert "explorer/index.html" in logged and "explorer/images" in logged
    off = load_config(compare.Config, None, [f"output_dir={tmp_path / 'off'}", *base, "explorer.enabled=false"])
    with pytest.raises(ConfigError, match="no finished runs"):
        execute("compare", off, quiet=True)
    assert not (tmp_path / "off" / "explorer").exists()
    gone = load_config(compare.Config, None, [f"output_dir={tmp_path / 'gone'}", *base,
                                              f"explorer.evaluations={{a: '{evals['HN-only']}', b: 'runs:/{'0' * 32}'}}"])
    with pytest.raises(ConfigError, match=f"cannot fetch scores.parquet of MLflow run {'0' * 32}"):
        execute("compare", gone, quiet=True)
    with pytest.raises(ConfigError, match="explorer.evaluations must name at least two models"):
        load_config(compare.Config, None, [f"explorer.evaluations={{only: {tmp_path}}}"])


# --------------------------------------------------------------------------- a real browser
CHROMIUM = os.environ.get("HARDPOS_CHROMIUM", "/usr/bin/chromium")  # Debian's package; another build by path
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def _need_browser():
    """The playwright module and Debian's Chromium, or skip (fail when HARDPOS_REQUIRE_BROWSER is set)."""
    why = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        why = "pip package playwright is not installed"
    if why is None and not Path(CHROMIUM).exists():
        why = f"{CHROMIUM} is absent (apt-get install chromium, or set HARDPOS_CHROMIUM)"
    if why:
        if os.environ.get("HARDPOS_REQUIRE_BROWSER"):
            pytest.fail(f"HARDPOS_REQUIRE_BROWSER is set but {why}")
        pytest.skip(why)


def _choose(page, key: str, label: str) -> None:
    """Pick the option of filter ``key`` whose label (before its count) is ``label``."""
    value = page.locator(f"#f-{key} option[data-label={json.dumps(label, ensure_ascii=False)}]").get_attribute("value")
    page.select_option(f"#f-{key}", value=value)


@pytest.mark.browser
def test_page_in_headless_chromium_filters_rows_without_console_errors(tmp_path):
    _need_browser()
    from playwright.sync_api import sync_playwright

    specs, items = _fixture_benchmarks(tmp_path / "bench")
    evals = _evaluations(tmp_path, items, models=("HN-only", "HP+HN", "base"))
    models = {m: explorer.read_scores(str(d)) for m, d in evals.items()}
    res = explorer.write_explorer(models, items, tmp_path / "explorer", max_rows_per_benchmark=1000)
    expected = _expected_combinations(evals)  # no cap hit: every disagreement is on the page
    total = sum(expected.values())
    combo, n_combo = max(expected.items(), key=lambda kv: (kv[1], kv[0]))
    assert 0 < n_combo < total  # the filter must change the visible rows
    n_scpp = len(res.shown["scpp"])

    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"requestfailed: {r.url}"))
            # the folder is self-contained: a copy elsewhere opens the same
            copied = shutil.copytree(res.index.parent, tmp_path / "copied" / "explorer")
            shutil.rmtree(res.index.parent)
            page.goto((copied / explorer.INDEX_FILE).as_uri(), wait_until="load")
            rows = page.locator("#items tbody tr")
            visible = "#items tbody tr:not([hidden])"
            assert rows.count() == total and page.locator(visible).count() == total
            assert page.locator("#shown").inner_text() == f"{total} of {total} rows match"
            # every image decoded from its relative path
            assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
            # the outcome filter: exactly the rows of that combination remain
            _choose(page, "outcome", combo)
            assert page.locator(visible).count() == n_combo
            assert page.locator("#shown").inner_text() == f"{n_combo} of {total} rows match"
            # counts per filter follow the other filters: the benchmark options now count that combination
            scpp_combo = sum(1 for r in res.shown["scpp"] if r.combination(res.models) == combo)
            assert page.locator("#f-benchmark option", has_text="scpp").inner_text() == f"scpp ({scpp_combo})"
            # back to every outcome, one benchmark
            page.select_option("#f-outcome", value="")
            _choose(page, "benchmark", "scpp")
            assert page.locator(visible).count() == n_scpp
            page.select_option("#f-benchmark", value="")
            _choose(page, "outcome", combo)
            shot = tmp_path / "explorer-screenshot.png"
            page.screenshot(path=str(shot), full_page=False)
        finally:
            browser.close()
    assert problems == []
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (REPO / "outputs").mkdir(exist_ok=True)
    shutil.copy(shot, REPO / "outputs" / "explorer-screenshot.png")


# --------------------------------------------------------------------------- for research: every row, per model, by margin
def _research_page(tmp_path: Path, n: int = 130):
    """Two models on one benchmark of ``n`` items (no images): HN-only's hard positive falls
    below the negative by a margin that grows with the item number; HP+HN is correct."""
    from hardpos.eval.items import Item

    items = {"bench": [Item(str(i), ("replace_attribute", "replace_relation")[i % 2], str(tmp_path / f"{i}.png"),
                            f"caption {i} <i>", f"negative {i}", f"positive {i}") for i in range(n)]}
    hn = {"bench": {str(i): explorer.ItemScores(items["bench"][i].subset, 0.5, 0.3, 0.3 - 0.001 * (i + 1)) for i in range(n)}}
    hp = {"bench": {str(i): explorer.ItemScores(items["bench"][i].subset, 0.5, 0.3, 0.4) for i in range(n)}}
    return explorer.write_explorer({"HN-only": hn, "HP+HN": hp}, items, tmp_path / "explorer")


def test_every_row_is_on_the_page_with_per_model_verdicts_and_margins(tmp_path):
    res = _research_page(tmp_path)
    page = res.index.read_text()
    assert page.count("<tr data-idx=") == 130 and res.counts["bench"] == {"items": 130, "disagreements": 130, "shown": 130}
    # a filter per model, holding that model's outcomes; a sort by each model's margins
    assert re.search(r'<select id="f-m0" data-filter="m0">.*brittle \(P&lt;N\) \(130\)', page)
    assert re.search(r'<select id="f-m1" data-filter="m1">.*correct \(130\)', page)
    assert '<option value="pm0">HN-only: s_p - s_n, lowest first' in page
    row = re.search(r'<tr data-idx="129"[^>]*>', page).group(0)
    assert 'data-m0="v1"' in row and 'data-m1="v0"' in row  # brittle (P<N) / correct
    assert 'data-pm0="-0.130000"' in row and 'data-pm1="0.100000"' in row and 'data-cm0="0.200000"' in row
    assert "page 1 of 3" in page and "Every disagreement is on the page, 50 rows at a time" in page
    assert "caption 1 &lt;i&gt;" in page and "caption 1 <i>" not in page
    # the world's REPLACE subsets name attribute and relation
    assert re.search(r'<select id="f-subset"[^>]*>.*replace_attribute.*replace_relation', page)


def test_blind_baselines_in_the_scores_files_give_a_filter_per_blind_model(tmp_path):
    """Scores files with the evaluate stage's blind columns: each row shows every blind model's
    outcome and a filter per blind model selects, e.g., the items a blind model already gets
    right; counted by hand from the files."""
    from hardpos.eval.outputs import blind_columns

    specs, items = _fixture_benchmarks(tmp_path / "bench")
    evals = _evaluations(tmp_path, {"shapes": items["shapes"]})
    for k, d in enumerate(evals.values()):
        table = pq.read_table(d / "scores.parquet")
        n = table.num_rows
        # blind ngram_lr: right on even items (caption and positive above the negative), wrong on odd ones (both
        # below); caption_lm only on the first model's file (the page takes the first it finds)
        even = [1.0 if j % 2 == 0 else 0.0 for j in range(n)]
        cols = dict(zip(blind_columns("ngram_lr"), (even, [0.5] * n, even)))
        if k == 0:
            cols.update(zip(blind_columns("caption_lm"), ([0.0] * n, [1.0] * n, [None] * n)))
        for name, values in cols.items():
            table = table.append_column(name, pa.array(values, pa.float64()))
        pq.write_table(table, d / "scores.parquet")
    models = {m: explorer.read_scores(str(d)) for m, d in evals.items()}
    first = next(iter(models.values()))["shapes"]
    assert first["0"].blind == (("ngram_lr", "correct"), ("caption_lm", "wrong")) and first["1"].blind[0] == ("ngram_lr", "wrong")
    res = explorer.write_explorer(models, items, tmp_path / "explorer")
    page = res.index.read_text()
    shown = res.shown["shapes"]
    right = sum(int(r.item_id) % 2 == 0 for r in shown)
    assert re.search(r'<select id="f-b0" data-filter="b0">.*correct \(%d\).*wrong \(%d\)' % (right, len(shown) - right), page)
    assert '<select id="f-b1" data-filter="b1">' in page and "blind caption_lm (no image)" in page
    row = re.search(r'<tr data-idx="0"[^>]*>', page).group(0)
    want = "v0" if int(shown[0].item_id) % 2 == 0 else f"v{explorer.OUTCOMES.index('wrong')}"
    assert f'data-b0="{want}"' in row and "blind ngram_lr: " in page


def test_a_world_benchmark_file_keeps_its_subset_column(tmp_path):
    """REPLACE attribute / relation are subsets of their own (the file's ``subset`` column),
    not both ``replace`` (its ``kind``)."""
    from hardpos.data.triplets import make_triplet, write_triplets

    rows = [make_triplet(image="a.png", caption="c", hard_negative="n", hard_positive="p", kind="replace",
                         source="world", caption_id=str(i), subset=sub) for i, sub in enumerate(["replace_attribute", "replace_relation"])]
    rows.append(make_triplet(image="a.png", caption="c", hard_negative="n", kind="swap", source="u", caption_id="2"))
    path = write_triplets(rows, str(tmp_path / "b.parquet"))
    bench = load_benchmark(BenchmarkSpec(name="b", kind="triplets", path=path))
    assert [it.subset for it in bench.items] == ["replace_attribute", "replace_relation", "swap"]


@pytest.mark.browser
def test_research_page_in_chromium_pages_filters_per_model_and_sorts_by_margin(tmp_path):
    _need_browser()
    from playwright.sync_api import sync_playwright

    res = _research_page(tmp_path)
    problems: list[str] = []
    visible = "#items tbody tr:not([hidden])"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
            page.goto(res.index.as_uri(), wait_until="load")
            first_ids = lambda: page.eval_on_selector_all(visible, "rs => rs.map(r => r.getAttribute('data-idx'))")  # noqa: E731
            assert page.locator(visible).count() == 50 and page.locator("#page").inner_text() == "page 1 of 3"
            assert first_ids()[:2] == ["0", "1"]
            # paging reaches every row
            seen = set(first_ids())
            for _ in range(2):
                page.click("#next")
                seen |= set(first_ids())
            assert len(seen) == 130 and page.locator(visible).count() == 30 and page.is_disabled("#next")
            # sort by HN-only's s_p - s_n, lowest first: the last item (largest fall) heads page 1
            page.select_option("#sort", value="pm0")
            assert page.locator("#page").inner_text() == "page 1 of 3" and first_ids()[:3] == ["129", "128", "127"]
            # a per-model filter: HP+HN correct keeps everything, HP+HN's other outcomes are absent
            _choose(page, "m1", "correct")
            assert page.locator("#shown").inner_text() == "130 of 130 rows match"
            _choose(page, "subset", "replace_relation")
            assert page.locator("#shown").inner_text() == "65 of 130 rows match" and first_ids()[0] == "129"
            assert page.locator("#f-m0 option", has_text="brittle (P<N)").inner_text() == "brittle (P<N) (65)"
        finally:
            browser.close()
    assert problems == []
