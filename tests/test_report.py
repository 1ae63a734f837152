import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import committed, committed_files
from lmperf.report import e2e, flash_attention, render
from lmperf.report.format import Spread, fmt, table
from lmperf.report.sections import SECTIONS, Inputs

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "results" / "h100-80gb-hbm3"
BARS = render.bars_from_config(REPO / "config" / "config.yaml")


def run(results, tmp_path, scale="full", promised=None):
    return render.render(results, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", scale, BARS, promised)


def inputs(results: Path, bars=BARS) -> Inputs:
    return Inputs(results=results, frames={s.name: render.load_section(results, s.name) for s in SECTIONS},
                  bars=bars, out_dir=results)


def rows(study, size):
    return pd.read_csv(FIXTURE / "e2e" / study / f"{size}.csv")


def test_views_hold_the_csv_numbers():
    view = e2e.view(inputs(FIXTURE))
    df = rows("variants", "2.7B")
    step = df[(df.case_id == "2.7B-ctx256-bf16-compiled-train-warmup5") & (df.metric == "step_ms")].iloc[0]
    train = view["variants_train"].set_index(["size", "dtype", "compile"])
    # the median with the 20% / 80% quantiles of the step's samples (numpy's linear quantiles)
    q20, median, q80 = np.quantile([float(x) for x in step["samples"].split(";")], [0.2, 0.5, 0.8])
    got = train.loc[("2.7B", "bf16", "compiled"), "step ms"]
    assert tuple(got) == pytest.approx((median, step["std"], q20, q80), rel=1e-5) and got.center == step["median"]
    assert str(got).count("[") == 1  # shown as median [q20, q80]
    assert view["peaks"] == {"fp32": 67.0, "bf16": 989.0}  # the rows' peak_tflops column
    # MFU against the bf16 peak in every row: a bf16 row's own MFU, an fp32 row's TFLOP/s / 989
    case = lambda cid, metric: df[(df.case_id == cid) & (df.metric == metric)].iloc[0]["median"]
    fp32 = "2.7B-ctx256-fp32-compiled-forward-warmup5"
    forward = view["variants_forward"].set_index(["size", "dtype", "compile"])
    assert forward.loc[("2.7B", "fp32", "compiled"), "MFU % of bf16 peak"] == pytest.approx(
        100 * case(fp32, "tflops") / 989.0)
    assert forward.loc[("2.7B", "fp32", "compiled"), "MFU % of fp32 peak"] == case(fp32, "mfu_pct")
    assert forward.loc[("2.7B", "bf16", "compiled"), "MFU % of bf16 peak"] == case(
        "2.7B-ctx256-bf16-compiled-forward-warmup5", "mfu_pct")
    assert pd.isna(forward.loc[("2.7B", "bf16", "compiled"), "MFU % of fp32 peak"])
    # the section's answer is against the bf16 peak; the fp32 share of its own peak comes second
    every = pd.concat([pd.read_csv(p) for p in (FIXTURE / "e2e").rglob("*.csv")])
    bf16 = every[(every.metric == "mfu_pct") & (every.dtype == "bf16") & (every["mode"] == "train")]
    best = view["best_mfu"]
    assert best["train"]["value"] == bf16["median"].max() and best["train"]["dtype"] == "bf16"
    assert best["other_dtype"]["value"] == case(fp32, "mfu_pct") and best["other_dtype"]["mode"] == "forward"
    assert best["other_dtype"]["bf16_value"] == pytest.approx(100 * case(fp32, "tflops") / 989.0)


def test_prose_ratio_is_computed_from_the_csvs():
    df = pd.concat([rows("variants", "small"), rows("variants", "2.7B")])
    ok = df[df["status"] == "ok"]
    f = ok[ok.metric == "forward_ms"].set_index("case_id")["median"]  # ratios of medians, not means
    b = ok[ok.metric == "backward_ms"].set_index("case_id")["median"]
    ratio = (b / f.reindex(b.index)).dropna()
    got = e2e.view(inputs(FIXTURE))["backward_over_forward"]
    assert got["n"] == len(ratio) and got["mean"] == pytest.approx(ratio.mean())


def test_case_count_is_per_study():
    frames = [pd.read_csv(p) for p in (FIXTURE / "e2e").rglob("*.csv")]
    n = sum(f["case_id"].nunique() for f in frames)  # one file per study and size
    n_bad = sum(f.drop_duplicates("case_id")["status"].ne("ok").sum() for f in frames)
    view = e2e.view(inputs(FIXTURE))
    assert (view["n_cases"], view["n_failures"]) == (n, n_bad)


def test_oom_cases_are_shown_with_their_status():
    view = e2e.view(inputs(FIXTURE))
    context = view["context"].set_index(["size", "context", "dtype"])
    assert context.loc[("2.7B", 1024, "fp32"), "step ms"] == "oom"
    assert "2.7B-ctx1024-bf16-eager-train-warmup5" in set(view["failures"].query("status == 'oom'")["case_id"])


def test_the_environment_section_holds_the_environment_file():
    from lmperf.report import env as env_view
    facts = pd.read_csv(FIXTURE / "env" / "env.csv")
    view = env_view.view(inputs(FIXTURE))
    assert view["facts"] == dict(zip(facts["key"], facts["value"].astype(str)))
    # the file's facts in its order, then a row for each fact the table always has that this
    # (older) file lacks, saying so
    from lmperf.report.env import NOT_RECORDED, REQUIRED
    lacking = [k for k in REQUIRED if k not in set(facts["key"])]
    assert lacking, "the fixture's environment file predates the CPU, cuDNN and clock columns"
    assert list(view["table"]["value"]) == list(facts["value"].astype(str)) + [NOT_RECORDED] * len(lacking)
    assert view["facts"]["gpu"] == "NVIDIA H100 80GB HBM3" and view["facts"]["torch"] == "2.11.0+cu130"


def test_missing_results_say_why(tmp_path):
    """Every section of an empty results folder says why it has nothing (the words: the golden
    render, tests/fixtures/golden/report_empty.md)."""
    empty = tmp_path / "results" / "cpu"
    empty.mkdir(parents=True)
    views = render.views(inputs(empty))
    assert not any(v["available"] for v in views.values())
    # correctness and contenders: empty tables (their templates say so); every other section why
    assert all(views[name]["why"] for name in views if name not in ("correctness", "contenders"))
    assert views["correctness"]["table"].empty and not views["contenders"]["summary"]


def test_cpu_results_have_no_mfu_and_say_so(tmp_path):
    results = tmp_path / "results" / "cpu"
    shutil.copytree(FIXTURE, results)
    for csv in results.rglob("*.csv"):
        df = pd.read_csv(csv)
        if "metric" in df:
            df = df[df["metric"] != "mfu_pct"]
            df.to_csv(csv, index=False)
    text = run(results, tmp_path, "smoke")
    assert "**MFU** is not shown" in text
    assert "MFU %" not in text


def test_journals_of_unfinished_runs_are_not_read(tmp_path):
    results = tmp_path / "results" / "x"
    shutil.copytree(FIXTURE, results)
    junk = results / "e2e" / "variants" / ".journal"
    junk.mkdir()
    (junk / "bogus.csv").write_text("not,a,results,file\n")
    df = render.load_section(results, "e2e")
    assert len(df) == sum(len(pd.read_csv(p)) for p in (FIXTURE / "e2e").rglob("*.csv"))


def test_fmt_and_the_table_filter():
    assert fmt(1234.5) == "1,234"
    assert fmt(0.012345) == "0.0123"
    assert fmt(float("nan")) == "n/a"
    text = table(pd.DataFrame({"N": [1024], "ms": [Spread(1.5, 0.25)], "q": [Spread(2.0, q20=1.5, q80=2.5)],
                               "empty": [None], "_kept_for_tests": [1.0]}))
    assert "| 1024 " in text and "1.50 ± 0.25" in text and "2.00 [1.50, 2.50]" in text
    assert "empty" not in text and "_kept" not in text


def test_readme_results_block_is_a_fresh_render_of_the_committed_results():
    from lmperf.report import freshness, readme
    text = (REPO / "README.md").read_text()
    hw = re.search(r"from `results/([a-z0-9._-]+)/`", text.split(readme.BEGIN)[1])[1]
    block = readme.render_block(REPO / "results" / hw, REPO / "templates")
    frames = {s: render.load_section(REPO / "results" / hw, s) for s in readme.OLDER_NAMES}
    if freshness.view(frames)["unknown"]:  # a clone without the rows' commits (shallow): no line on older code
        drop = lambda t: re.sub(re.escape(readme.OLDER) + r".*?\n\n", "", t, flags=re.S)
        block, text = drop(block), drop(text)
    assert readme.replace_block(text, block) == text, \
        "README's results block is stale: run python -m lmperf.report.readme --results results/" + hw



def test_the_readmes_figures_are_drawn_from_its_results_where_no_report_run_writes(tmp_path):
    """The README's figures are a fresh draw of the results its block names, into report/readme/:
    `make report` rewrites report/report.md and report/figures/ for the machine it runs on, never
    what the committed README shows."""
    from lmperf.report import readme
    text = (REPO / "README.md").read_text()
    hw = re.search(r"from `results/([a-z0-9._-]+)/`", text.split(readme.BEGIN)[1])[1]
    images = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert images and all(Path(i).parent == readme.FIGURES_DIR for i in images)
    assert not readme.draw_figures(REPO / "results" / hw, tmp_path)
    for image in images:
        assert (tmp_path / Path(image).name).read_bytes() == (REPO / image).read_bytes(), \
            f"{image} is stale: run python -m lmperf.report.readme --results results/{hw}"
    report_outputs = {"report/report.md", "report/figures"}  # what rule report writes
    assert not any(str(readme.FIGURES_DIR).startswith(o) or o.startswith(str(readme.FIGURES_DIR)) for o in report_outputs)


FA_FIXTURE = REPO / "tests" / "fixtures" / "results" / "h200"


def test_flash_attention_section_reads_bars_off_the_same_run():
    df = pd.read_csv(FA_FIXTURE / "flash_attention" / "bench" / "headline_d64.csv")
    fb = df[df.metric == "fwd_bwd_ms"].set_index("provider")["median"]
    assert "triton_compiled" not in fb  # ours is then the call as it is, against the peers called so
    ours = fb["triton"]
    speedup = fb["sdpa_flash"] / ours
    bars = flash_attention.view(inputs(FA_FIXTURE))["bars"].set_index("bar")
    line = bars.loc["headline forward+backward speed-up over SDPA-flash >= 1.33x (called as it is, both sides)"]
    assert line["_value"] == pytest.approx(speedup) and line["met"] == (speedup >= 1 / 0.75)
    line = bars.loc["headline forward+backward <= 5.2 ms (called as it is)"]
    assert line["_value"] == pytest.approx(ours) and line["met"] == (ours <= 5.2)


def test_flash_attention_model_group_bar_counts_the_shapes_where_ours_is_slower(tmp_path):
    bench = tmp_path / "flash_attention" / "bench"
    shutil.copytree(FA_FIXTURE, tmp_path, dirs_exist_ok=True)

    def write(gpu: bool):
        rows = []
        # (ms: do_bench, GPU): ours slower by do_bench at xl, by GPU time at small
        for model, heads, ours_ms, flash_ms in (("small", 12, (1.0, 0.5), (2.0, 0.4)),
                                                ("xl", 25, (3.0, 0.1), (2.0, 0.2)),
                                                ("2.7B", 32, (1.0, 0.3), (1.0, 0.3))):
            for provider, ms in (("triton", ours_ms), ("sdpa_flash", flash_ms)):
                for metric, value in (("fwd_bwd_ms", ms[0]), ("fwd_bwd_gpu_ms", ms[1]))[:1 + gpu]:
                    rows.append({"section": "flash_attention", "study": "bench", "case_id": f"{model}-{provider}",
                                 "group": "model", "provider": provider, "harness": "leaderboard", "dtype": "bf16",
                                 "causal": True, "batch": 4, "heads": heads, "seq_len": 256, "head_dim": 64,
                                 "model": model, "metric": metric, "unit": "ms", "median": value, "status": "ok"})
        pd.DataFrame(rows).to_csv(bench / "model.csv", index=False)
        return flash_attention.view(inputs(tmp_path))

    view = write(gpu=False)
    line = view["bars"].set_index("bar").loc["model group: forward+backward time no slower than sdpa_flash at every shape"]
    assert line["_value"] == 1 and not line["met"]  # xl: 3.0 ms against 2.0; a tie is not slower
    view = write(gpu=True)  # the GPU time decides where it was measured; do_bench's stays in view
    bars = view["bars"].set_index("bar")
    line = bars.loc["model group: forward+backward GPU time (CUDA graph) no slower than sdpa_flash at every shape"]
    assert line["_value"] == 1 and not line["met"]  # small: 0.5 ms against 0.4
    assert view["model"].attrs["metric"] == "fwd_bwd_gpu_ms"
    assert view["model_host"]["speed-up over sdpa_flash"].tolist() == pytest.approx([2.0, 2 / 3, 1.0])


def test_flash_attention_bars_follow_the_thresholds_in_the_config():
    bars = {**BARS, "flash_attention": {**BARS["flash_attention"], "headline_vs_sdpa_flash": 10.0}}
    line = flash_attention.view(inputs(FA_FIXTURE, bars))["bars"].iloc[0]
    assert line["bar"] == "headline forward+backward speed-up over SDPA-flash >= 0.100x (called as it is, both sides)"
    assert line["met"]


def test_correctness_section_counts_checks_and_flags_failures(tmp_path):
    from lmperf.report import correctness
    results = tmp_path / "results" / "x"
    shutil.copytree(FA_FIXTURE, results)
    check = results / "flash_attention" / "check.csv"
    df = pd.read_csv(check)
    n_triton_fp16 = int((df.impl.eq("triton") & df.dtype.eq("fp16")).sum())
    view = correctness.view(inputs(results))
    line = view["table"].set_index(["kernel", "dtype"]).loc[("flash_attention / triton", "fp16")]
    assert (line["_passed"], line["_checks"], line["result"]) == (n_triton_fp16, n_triton_fp16, "pass")
    assert view["all_pass"] and not view["failures"]
    bad = df.index[df.impl.eq("triton") & df.dtype.eq("fp16")][0]
    df.loc[bad, ["mean", "passed"]] = [1.0, False]
    df.to_csv(check, index=False)
    view = correctness.view(inputs(results))
    line = view["table"].set_index(["kernel", "dtype"]).loc[("flash_attention / triton", "fp16")]
    assert (line["_passed"], line["result"]) == (n_triton_fp16 - 1, "FAIL")
    assert not view["all_pass"] and [(f["case_id"], f["error"]) for f in view["failures"]] == [(df.loc[bad, "case_id"], 1.0)]
    text = run(results, tmp_path)  # the failing line is named above the table
    assert "**Failing checks:**" in text


def test_report_lists_the_result_files_a_full_run_would_write_but_are_missing(tmp_path):
    """The files are named as the workflow does (results/<hw>/...), once each, and the sections
    they leave partial get them: a kernel's check file is the correctness section's too."""
    from lmperf.workflow import ResultFile
    results = tmp_path / "results" / "x"
    results.mkdir(parents=True)
    promised = {str(results / f): ResultFile(str(results / f), section, study) for f, section, study in (
        ("flash_attention/bench/grid_d64.csv", "flash_attention", "bench"),
        ("lrpe/check.csv", "lrpe", "check"))}
    absent = render.missing(results, promised)
    assert absent["flash_attention"] == ["results/x/flash_attention/bench/grid_d64.csv"]
    assert absent["lrpe"] == absent["correctness"] == ["results/x/lrpe/check.csv"]
    text = run(results, tmp_path, promised=promised)
    assert ("**Not measured yet:** 2 of the 2 result files a full run writes at this scale are missing "
            "(`results/x/flash_attention/bench/grid_d64.csv`, `results/x/lrpe/check.csv`)") in text


def test_flash_attention_grid_bars_count_against_the_best_peer_by_each_timing():
    """The grid's bars: by GPU time and by do_bench, ours against the best peer at each shape,
    with the number of shapes (here ours is slower by do_bench at both, by GPU time at neither)."""
    from lmperf.report import claims
    rows = []
    for n, (ours, compiled) in {128: ((1.0, 0.02), (0.9, 0.05)), 4096: ((1.3, 1.3), (1.2, 1.4))}.items():
        for provider, ms in (("triton", ours), ("plain_compiled", compiled)):
            for metric, value in zip(("fwd_bwd_ms", "fwd_bwd_gpu_ms"), ms):
                rows.append({"section": "flash_attention", "study": "bench", "group": "grid", "harness": "eager",
                             "case_id": f"grid-{provider}-{n}", "dtype": "fp32", "batch": 1, "heads": 1,
                             "head_dim": 128, "seq_len": n, "provider": provider, "metric": metric, "unit": "ms",
                             "median": value, "status": "ok"})
    grids, made = claims.fa_grid_verdicts(pd.DataFrame(rows), BARS["host_bound_idle_pct"], {}, False)
    lines = {b["bar"].split("fwd+bwd, ")[1].split(";")[0]: b
             for b in flash_attention.bars(claims.Claims(made, grids), pd.DataFrame(), BARS["flash_attention"])}
    assert lines["GPU time (CUDA graph)"]["_value"] == 0 and lines["GPU time (CUDA graph)"]["met"]
    assert lines["do_bench (host included)"]["_value"] == 2 and not lines["do_bench (host included)"]["met"]
    assert all(g.shapes == 2 for g in grids)


def test_two_providers_with_the_same_times_everywhere_are_flagged():
    """Two SDPA backends that take the same time at every shape did not both run: the cuDNN
    stretch bar then says 'not measured' instead of comparing against a copy of SDPA-flash."""
    same = pd.DataFrame({"sdpa_flash": [0.100, 0.200, 0.300], "sdpa_cudnn": [0.101, 0.199, 0.300],
                         "speed-up over sdpa_flash": [1.6, 1.6, 1.6], "speed-up over sdpa_cudnn": [1.6, 1.6, 1.6]})
    assert flash_attention.same_kernel(same, "sdpa_flash", "sdpa_cudnn")
    different = same.assign(sdpa_cudnn=[0.080, 0.150, 0.300])
    assert not flash_attention.same_kernel(different, "sdpa_flash", "sdpa_cudnn")
    same.attrs["metric"] = "fwd_bwd_gpu_ms"
    from lmperf.report import claims
    rows = flash_attention.bars(claims.Claims(), same, {})
    cudnn = [r for r in rows if "sdpa_cudnn" in r["bar"]]
    assert len(cudnn) == 1 and cudnn[0]["measured"].startswith("not measured") and not cudnn[0]["met"]


def test_the_whole_run_wall_time_spans_the_first_jobs_start_to_the_last_jobs_end():
    """A job's rows carry its process's start (measured_at); it ends its cases' wall times later
    (each case once, whatever its rows)."""
    from lmperf.report import env as env_view
    one = pd.DataFrame({"measured_at": ["2026-11-23T10:00:00+00:00"] * 3 + ["2026-11-23T10:20:00+00:00"],
                        "case_id": ["x", "x", "y", "z"], "wall_s": [60.0, 60.0, 30.0, 100.0], "commit": ["abc"] * 4})
    other = pd.DataFrame({"measured_at": ["2026-11-23T10:05:00+00:00"], "case_id": ["w"], "wall_s": [5.0],
                          "commit": ["abc"]})
    assert env_view.run_span_seconds({"a": one, "b": other}) == 21 * 60 + 40  # 10:00 to 10:21:40
    assert env_view.run_span_seconds({"a": one.iloc[:3], "b": other}) == 5 * 60 + 5  # to other's end
    other["commit"] = "def"  # two runs: their span would count the time between them
    assert env_view.run_span_seconds({"a": one, "b": other}) is None


def test_the_standard_run_and_the_deep_target_are_timed_apart(monkeypatch):
    """The deep target runs after the standard run at the same commit: the environment section
    (and the README's line) give the standard run's span from its own sections' rows, and the deep
    target's apart, never one span across both."""
    from lmperf.report import env as env_view

    job = lambda start, wall: pd.DataFrame({"measured_at": [start], "study": ["s"], "case_id": ["x"], "wall_s": [wall],
                                            "commit": ["abc"]})
    frames = {"ladder": job("2026-11-23T10:00:00+00:00", 60.0), "lrpe": job("2026-11-23T10:25:00+00:00", 60.0),
              "repeats": job("2026-11-23T11:00:00+00:00", 120.0)}
    assert env_view.run_minutes(frames) == 26.0  # 10:00 to 10:26, not to the repeats' 11:02
    inputs = type("Inputs", (), {"frames": frames, "results": "results/x", "rows": lambda self, s: pd.DataFrame()})()
    timing = env_view.view(inputs)["timing"]
    assert (timing["run_min"], timing["deep_run_min"]) == (26.0, 2.0)


def test_a_cpu_runs_environment_names_its_cpu_and_cores_not_a_gpu(tmp_path):
    """The environment file of a machine without a GPU records the CPU's model and cores, and
    the section names them where a GPU run names its GPU and memory."""
    import os

    from lmperf.bench import env as bench_env
    from lmperf.report import env as env_view

    results = tmp_path / "results" / "cpu"
    (results / "env").mkdir(parents=True)
    facts = {**bench_env.facts("cpu", "smoke"), "gpu": "none", "gpu_memory_gib": "none"}  # as on a CPU-only torch
    pd.DataFrame({"key": list(facts), "value": list(facts.values())}).to_csv(results / "env" / "env.csv", index=False)
    view = env_view.view(inputs(results))
    assert view["facts"]["cpu_model"] == bench_env.cpu_model() and view["facts"]["cpu_cores"] == str(os.cpu_count())
    assert view["device"] == f"{bench_env.cpu_model()} ({os.cpu_count()} cores, no GPU)"
    assert {"CPU model", "CPU cores (logical)"} <= set(view["table"][""])
    # an environment file written before the model was recorded names the architecture
    assert env_view.device({"hw": "cpu", "gpu": "none", "gpu_memory_gib": "none", "cpu": "x86_64"}) == "x86_64 (no GPU)"
    assert env_view.view(inputs(FIXTURE))["device"] == "NVIDIA H100 80GB HBM3 (79.2 GiB)"


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path):
    from lmperf.bench import env as bench_env

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)  Gold 6338 CPU\n"
                    "processor\t: 1\nmodel name\t: Intel(R) Xeon(R)  Gold 6338 CPU\n")
    assert bench_env.cpu_model(info) == "Intel(R) Xeon(R) Gold 6338 CPU"
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n")  # ARM
    assert bench_env.cpu_model(info) == "Raspberry Pi 4 Model B Rev 1.4"
    assert bench_env.cpu_model(tmp_path / "none")  # no such file: platform's answer, never empty


def test_references_are_validated_and_shown_only_where_their_gpu_matches(tmp_path):
    """config/references.yaml loads under its schema; a section shows the entries whose `hw`
    matches the results folder (an H100's report, not a CPU's); a bad entry is named."""
    from lmperf.report import references

    entries = references.load()
    assert {e["id"] for e in entries} >= {"cs336_leaderboard_record", "llmc_gpt2_1558m_h100_mfu",
                                          "fa2_paper_h100_fwd_bwd_causal_d64_16k"}
    assert all(e["source"]["locator"] for e in entries)
    h100 = references.by_section(entries, "h100-80gb-hbm3")
    assert "5.364 ms" in set(h100["flash_attention"]["value"])
    assert references.by_section(entries, "cpu") == {}
    bad = tmp_path / "references.yaml"
    shutil.copy(references.REFERENCES.parent / "references.schema.yaml", tmp_path)
    bad.write_text(yaml.safe_dump([{**entries[0], "section": "nowhere"}]))
    with pytest.raises(ValueError, match="cs336_leaderboard_record: section 'nowhere'"):
        references.load(bad)
    bad.write_text(yaml.safe_dump([{k: v for k, v in entries[0].items() if k != "source"}]))
    with pytest.raises(ValueError, match="'source' is a required property"):
        references.load(bad)


def test_host_bound_cases_are_marked_and_no_speed_up_is_taken_from_them(tmp_path):
    """Rows whose GPU sat idle above report.host_bound_idle_pct: marked in the tables with a
    legend, and left out of the ratios (here every bf16 eager case)."""
    frames = {s.name: render.load_section(FIXTURE, s.name) for s in SECTIONS}
    df = frames["e2e"]
    bf16_eager = (df["dtype"] == "bf16") & ~df["compile"].astype(str).str.lower().eq("true")
    frames["e2e"] = df.assign(gpu_idle_pct=bf16_eager.map({True: 60.0, False: 2.0}))
    view = e2e.view(Inputs(results=FIXTURE, frames=frames, bars=BARS, out_dir=tmp_path))
    assert BARS["host_bound_idle_pct"] == 10
    train = view["variants_train"].set_index(["size", "dtype", "compile"])
    assert train.loc[("2.7B", "bf16", "eager"), "GPU idle %"] == "60.0 ‡"
    assert train.loc[("2.7B", "bf16", "compiled"), "GPU idle %"] == 2.0
    assert view["bf16_speedup_train"] == {"n": 0}  # every eager bf16 step is host-bound
    plain = e2e.view(inputs(FIXTURE))
    assert view["compile_speedup"]["train"]["n"] == plain["compile_speedup"]["train"]["n"] // 2  # fp32 only
    n_bound = int(bf16_eager[df["metric"] == "step_ms"].sum())
    assert view["host_bound"] == {"measured": True, "threshold": 10, "mark": "‡", "n": n_bound}
    shutil.copytree(FIXTURE, tmp_path / "results")
    for path in (tmp_path / "results" / "e2e").rglob("*.csv"):
        rows = pd.read_csv(path)
        eager = (rows["dtype"] == "bf16") & ~rows["compile"].astype(str).str.lower().eq("true")
        rows.assign(gpu_idle_pct=eager.map({True: 60.0, False: 2.0})).to_csv(path, index=False)
    text = run(tmp_path / "results", tmp_path)
    # each table's legend counts its own marked rows (tests/test_report_labels.py checks the counts)
    assert re.search(r"‡ host-bound \(\d+ in the table above\): the GPU sat idle more than 10% of the median call", text)
    assert "host-bound cases left out" in text


def test_the_best_mfu_says_whether_the_host_set_it(tmp_path):
    """The section's best MFU in each mode is the highest measured, marked where its case is
    host-bound (its MFU then the host's, below the GPU's)."""
    frames = {s.name: render.load_section(FIXTURE, s.name) for s in SECTIONS}
    df = frames["e2e"]
    plain = e2e.view(Inputs(results=FIXTURE, frames=frames, bars=BARS, out_dir=tmp_path))["best_mfu"]
    top = plain["train"]
    assert top["host_bound"] is False and plain["forward"]["host_bound"] is False
    bound = (df["size"] == top["size"]) & (df["dtype"] == top["dtype"]) & (df["context"] == top["context"]) \
        & df["compile"].astype(str).str.lower().eq(str(top["compile"] == "compiled").lower()) & (df["mode"] == "train")
    frames["e2e"] = df.assign(gpu_idle_pct=bound.map({True: 60.0, False: 2.0}))
    best = e2e.view(Inputs(results=FIXTURE, frames=frames, bars=BARS, out_dir=tmp_path))["best_mfu"]
    assert best["train"] == {**top, "host_bound": True}
    assert best["forward"] == plain["forward"]
    shutil.copytree(FIXTURE, tmp_path / "results")
    for path in (tmp_path / "results" / "e2e").rglob("*.csv"):
        pd.read_csv(path).assign(gpu_idle_pct=60.0).to_csv(path, index=False)
    text = run(tmp_path / "results", tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("Best training step:"))
    assert line.count("‡ host-bound") == 3  # the training step, the forward pass, the other dtype


def test_a_flash_attention_ratio_with_a_host_bound_side_claims_no_bar(tmp_path):
    results = REPO / "results" / "h100-80gb-hbm3"
    frames = {s.name: render.load_section(results, s.name) for s in SECTIONS}
    fa = frames["flash_attention"]
    peer = (fa["group"] == "throughput") & (fa["provider"] == "sdpa_flash") & (fa["metric"] == "forward_ms") \
        & (fa["causal"].astype(str).str.lower() == "false")
    frames["flash_attention"] = fa.assign(gpu_idle_pct=peer.map({True: 50.0, False: 1.0}))
    view = flash_attention.view(Inputs(results=results, frames=frames, bars=BARS, out_dir=tmp_path))
    headline = view["bars"][view["bars"]["bar"].str.startswith("throughput forward (non-causal)")].iloc[0]
    assert headline["measured"].endswith("(host-bound ‡: not claimed)") and not headline["met"]
    assert view["host_bound"]["n"] == 1


def test_a_case_is_measured_once_and_shown_in_every_study_it_belongs_to(tmp_path):
    """The context and warm-up studies leave out the variants' eager training cases (config), and
    their tables show the variants' rows at that context / warm-up."""
    results = tmp_path / "results" / "x"
    shutil.copytree(FIXTURE, results)
    for study, column, value in (("context", "context", 256), ("warmup", "warmup", 5)):
        for csv in (results / "e2e" / study).glob("*.csv"):
            df = pd.read_csv(csv)
            df[df[column] != value].to_csv(csv, index=False)
    view = e2e.view(inputs(results))
    variants = pd.read_csv(FIXTURE / "e2e" / "variants" / "small.csv")
    step = variants[(variants.case_id == "small-ctx256-bf16-eager-train-warmup5") & (variants.metric == "step_ms")]
    context = view["context"].set_index(["size", "context", "dtype"])
    assert context.loc[("small", 256, "bf16"), "step ms"].center == step["median"].iloc[0]
    assert sorted(set(view["context"]["context"])) == [128, 256, 512, 1024]
    warmup = view["warmup"].set_index(["size", "warmup"])
    assert ("2.7B", 5) in warmup.index and len(warmup) == 2 * 4
    assert view["warmup_std_ratio"]["warm"] == 5
    assert len(view["context"]) == 2 * 4 * 2  # sizes x contexts x dtypes: the variants' compiled cases stay out


def test_the_model_table_gives_each_size_its_dimensions_and_measured_parameters():
    """The dimensions are the configuration's, the parameter count the CSV's; the embeddings
    (token embedding and untied head, vocabulary x d_model each) come out of the count, so the
    vocabulary the two imply is the model's, and a configuration that does not describe the
    measured model is named instead of counted."""
    from lmperf.model import ModelConfig

    models = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["models"]
    view = e2e.view(Inputs(results=FIXTURE, frames=inputs(FIXTURE).frames, bars=BARS, out_dir=FIXTURE, models=models))
    table = view["models"].set_index("model")
    assert list(table.index) == ["small", "2.7B"]  # the sizes the fixture measured
    params = rows("variants", "2.7B").query("metric == 'parameters'")["median"].iloc[0]
    row = table.loc["2.7B"]
    assert (row["d_model"], row["layers"], row["heads"], row["d_ff"]) == (2560, 32, 32, 10240)
    assert row["_parameters"] == params and row["parameters (B)"] == pytest.approx(3.41, abs=0.005)
    assert row["vocabulary"] == ModelConfig(**models["2.7B"]).vocab_size
    assert row["_parameters"] - row["_body"] == 2 * row["vocabulary"] * 2560
    assert row["contexts"] == "128, 256, 512, 1,024"
    wrong = {**models, "2.7B": {**models["2.7B"], "d_ff": 8192}}  # the 2.7B's count implies another vocabulary
    view = e2e.view(Inputs(results=FIXTURE, frames=inputs(FIXTURE).frames, bars=BARS, out_dir=FIXTURE, models=wrong))
    table = view["models"].set_index("model")
    assert table.loc["2.7B", "without embeddings (B)"] == "the configuration's dimensions do not give the measured count"
    assert table.loc["small", "vocabulary"] == 10_000 and pd.isna(table.loc["2.7B", "vocabulary"])


# ---------------------------------------------------------------------------------------------
# The summary the report opens with, checked against the committed CSVs

COMMITTED = REPO / "results" / "h100-80gb-hbm3"
DISTRIBUTED = REPO / "results" / "h200-x4"  # the committed multi-GPU run the H100 report quotes


@pytest.fixture
def committed_render(h100_report) -> str:
    """The committed H100 results rendered as the report rule renders them (tests/conftest.py's
    h100_report, once a session)."""
    return h100_report.text


def lines_above_the_folds(text: str) -> int:
    depth, n = 0, 0
    for line in text.splitlines():
        if line.startswith("<details"):
            depth += 1
        elif line.startswith("</details>"):
            depth -= 1
        elif depth == 0:
            n += 1
    return n


def test_the_report_above_its_folds_is_short(committed_render):
    """What a reader sees without opening a fold: at most half the 1,615 lines the report had
    before its tables were folded."""
    assert lines_above_the_folds(committed_render) <= 1615 // 2
    assert committed_render.count("<details") == committed_render.count("</details>")


def test_the_report_package_imports_nothing_from_bench():
    for path in (REPO / "src" / "lmperf" / "report").glob("*.py"):
        assert "lmperf.bench" not in path.read_text(), f"{path.name} imports from the bench side"


def summary_rows(text: str) -> dict[str, list[str]]:
    """{question: [measured here, against, section]} of the summary's table."""
    block = text.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in block.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}  # the header row left out


def csv_rows(*parts: str) -> pd.DataFrame:
    paths = sorted((COMMITTED.parent.joinpath(*parts[:-1])).glob(parts[-1]))
    assert paths, parts
    return pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)


def median(df: pd.DataFrame, stat: str = "median", **where) -> float:
    for key, value in where.items():
        df = df[df[key] == value]
    assert len(df) == 1, where
    return float(df[stat].iloc[0])


def test_the_report_opens_with_a_summary_and_its_contents(committed_render):
    """Within its first 40 lines: the summary, whose every row links to a section heading of the
    report, then the contents, one link per section."""
    from lmperf.report.format import anchor
    lines = committed_render.splitlines()
    assert "## Summary" in lines[:40]
    headings = {anchor(line): line for line in lines if line.startswith("## ")}
    rows = summary_rows(committed_render)
    assert len(rows) >= 9
    for answer, cells in rows.items():
        target = re.fullmatch(r"\[(.+)\]\(#([\w-]+)\)", cells[-1])
        assert target and headings.get(target[2]) == "## " + target[1], (answer, cells[-1])
    contents = committed_render.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"^- \[(.+)\]\(#([\w-]+)\)$", contents, re.M)
    assert len(links) == len(SECTIONS) and all(headings[a] == "## " + t for t, a in links)
    assert lines.index("## Summary") < lines.index("## Contents") < lines.index("## Environment")


def test_the_report_names_every_section_measured_at_older_code(committed_render):
    """Above the contents, the sections whose code has changed since their rows were measured
    (lmperf.report.freshness, over the committed results), each by its heading; their summary
    answers say so too."""
    from lmperf.report import freshness
    frames = {s: render.load_section(COMMITTED, s) for s in ("ladder", "flash_attention", "e2e", "lrpe", "memory")}
    code = freshness.view(frames)
    head = committed_render.split("\n## Contents\n", 1)[0]
    older = head.split("**Measured at older code:**", 1)[1].split("\n\n", 1)[0] if code["changed"] else ""
    titles = {"ladder": "The ladder", "flash_attention": "FlashAttention-2 (Triton)", "e2e": "End-to-end",
              "lrpe": "Multi-dimensional LRPE", "memory": "Memory"}
    for section, title in titles.items():
        assert (title in older) == (section in code["changed"]), (section, older)
    answer = next(a for a in summary_rows(committed_render) if a.startswith("FlashAttention-2 forward+backward"))
    assert ("(older code)" in answer) == ("flash_attention" in code["changed"])


@pytest.mark.committed
@pytest.mark.xdist_group("h100_report")  # on the worker that renders it (tests/conftest.py), asked for late
def test_the_committed_report_is_checked_like_a_fresh_render(request):
    """The committed report/report.md (read from git: `make report` rewrites the working tree's
    for this machine) states the summary a fresh render of the committed results states, whose
    values the tests on its context recompute from the CSVs (tests/test_report_labels.py): the
    same table, row for row, up to the marks of code changed since (git's answer today, not at
    the render) and its first screen holds the summary."""
    # where a link leads depends on where the page was written (here a temporary folder)
    older = re.compile(r" \(older code\)|, at older code|(?<=\]\()[^)#][^)]*(?=\))")
    table = lambda text: [older.sub("", line) for line in
                          text.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0].splitlines() if line.startswith("| ")]
    text = committed("report/report.md")  # first: skipped, saying why, outside a git checkout
    assert table(text) == table(request.getfixturevalue("h100_report").text)
    assert "## Summary" in text.splitlines()[:40]


def test_a_summary_answer_that_was_not_measured_says_why(tmp_path):
    from lmperf.report import claims, summary
    empty = tmp_path / "results" / "cpu"
    empty.mkdir(parents=True)
    given = inputs(empty)
    answers = summary.view(render.views(given), [], "cpu", claims.of(given))
    for name in ("flash_attention", "throughput", "training", "lrpe", "scaling", "memory", "profile", "correctness",
                 "reproducibility"):
        assert answers[name]["available"] is False and answers[name]["why"], name
    assert answers["contenders"] == []


# ---------------------------------------------------------------------------------------------
# What a reader sees: no raw HTML, MFU against the bf16 peak, the same numbers in README and report


def html_glitches(text: str) -> list[str]:
    """Lines where markdown would render raw HTML: a <details> or </details> line with text right
    after it (CommonMark ends an HTML block only at a blank line), or a </details> right after
    text (a paragraph's or a table's last line)."""
    lines = text.splitlines() + [""]
    out = []
    for i, line in enumerate(lines[:-1]):
        if re.match(r"\s*</?details", line) and lines[i + 1].strip():
            out.append(f"{i + 1}: {line!r} then {lines[i + 1][:60]!r}")
        if re.match(r"\s*</details>", line) and i and lines[i - 1].strip():
            out.append(f"{i + 1}: {lines[i - 1][:60]!r} then {line!r}")
    return out


def test_no_raw_html_glitches(committed_render, tmp_path):
    empty = tmp_path / "results" / "cpu"
    empty.mkdir(parents=True)
    for name, text in {"committed results": committed_render, "fixture": run(FIXTURE, tmp_path),
                       "no results": run(empty, tmp_path, "smoke"),
                       "README.md": (REPO / "README.md").read_text()}.items():
        assert not html_glitches(text), (name, html_glitches(text)[:5])
    assert html_glitches("<details><summary>x</summary>\ntext\n\n</details>\n") and \
        html_glitches("<details><summary>x</summary>\n\ntext\n</details>\n")


@pytest.mark.committed
def test_the_committed_reports_have_no_raw_html_glitches():
    """Every committed report (report/report.md, another GPU's, the multi-GPU run's), read from
    git: `make report` rewrites the working tree's report/report.md for this machine."""
    pages = [f for f in committed_files("report") if f.endswith(("/report.md", "/distributed.md"))]
    assert "report/report.md" in pages
    for page in pages:
        assert not html_glitches(committed(page)), (page, html_glitches(committed(page))[:5])


def test_every_mfu_is_against_the_bf16_peak_with_other_peaks_beside_it(committed_render):
    """Every table with an MFU column has one against the bf16 peak; a column against another
    dtype's peak stands beside it. In the README every MFU cell is against the bf16 peak and an
    fp32 cell's own-peak share is named as such."""
    headers = [line for line in committed_render.splitlines() if line.startswith("|") and "MFU %" in line]
    assert headers
    for header in headers:
        assert "MFU % of bf16 peak" in header, header
    readme = readme_block()
    mfus = re.findall(r"\d% MFU.*?(?:\.\n|$)", readme, re.S)
    assert mfus and all(re.search(r"against the dense bf16\s+peak", m) for m in mfus), mfus


def readme_block() -> str:
    from lmperf.report import readme
    return (REPO / "README.md").read_text().split(readme.BEGIN)[1].split(readme.END)[0]


def readme_table(block: str) -> dict[str, dict[str, str]]:
    """{configuration: {column: cell}} of the README block's table."""
    lines = [line for line in block.splitlines() if line.startswith("|")]
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
    header = cells(lines[0])
    return {cells(line)[0]: dict(zip(header, cells(line))) for line in lines[2:]}


def test_readme_block_is_the_claims_and_the_run_time():
    """The README's table renders the claims (tests/test_claims.py recomputes each from the CSVs);
    the run's wall time is recomputed here from the CSVs alone."""
    from lmperf.report import readme
    block = readme_block()
    if (minutes := standard_run_minutes(COMMITTED)) is not None:
        assert f"measured in one run of {fmt(minutes)} minutes from an empty results folder" in block
    else:
        assert "measured in one run" not in block
    lines = [line for line in block.splitlines() if line.startswith("|")][2:]
    assert [r["what"] for r in readme.view(COMMITTED)["rows"]] == [line.strip("|").split("|")[0].strip() for line in lines]


def standard_run_minutes(results: Path) -> float | None:
    """The standard run's wall time from the CSVs alone: every file but the deep target's (repeats,
    convergence) and env's; a job is the rows of one process start (measured_at), ending its
    cases' wall times later; None where the rows are of several commits."""
    frames = [pd.read_csv(p) for p in sorted(results.rglob("*.csv"))
              if p.relative_to(results).parts[0] not in ("repeats", "convergence", "env")]
    rows = pd.concat([f.drop_duplicates(["measured_at", "case_id"])[["measured_at", "wall_s", "commit"]]
                      for f in frames if {"measured_at", "wall_s", "commit"} <= set(f)])
    if rows["commit"].astype(str).nunique() != 1:
        return None
    jobs = rows.assign(start=pd.to_datetime(rows["measured_at"], utc=True)).groupby("start")["wall_s"].sum()
    return ((jobs.index + pd.to_timedelta(jobs.to_numpy(), unit="s")).max() - jobs.index.min()).total_seconds() / 60


def test_readme_training_rows_compare_rungs_of_one_context_and_precision():
    """A peer rung counts only against our rungs of its own context and precision: moved to
    another context, the best peer rung leaves the first row and becomes the other's peer."""
    from lmperf.report import claims
    ladder = csv_rows("h100-80gb-hbm3", "ladder", "2.7B.csv")
    threshold = BARS["host_bound_idle_pct"]
    rows = lambda frame: [c for c in claims.ladder_claims(frame, threshold, {}, False)
                          if c.setting("peer") == "best peer rung"]
    first, second = rows(ladder)[:2]
    sdpa = first.peer.rung
    assert second.peer is None and second.speedup is None  # no peer ran at that context
    moved = ladder.assign(context=ladder["context"].mask(ladder["rung"] == sdpa, second.setting("context")))
    first, second = rows(moved)[:2]
    assert (first.peer is None or first.peer.rung != sdpa) and second.peer.rung == sdpa
    tokens = lambda rung: median(moved, rung=rung, metric="tokens_per_s")
    assert second.speedup == pytest.approx(tokens(second.ours.rung) / tokens(sdpa))


def test_a_contenders_rung_is_neither_ours_nor_a_peer():
    """A contender's ladder rung (a user's attention in place of ours; the example wraps our own
    kernels) is never the README's "ours", its peer, or the ladder's best rung, however fast."""
    from lmperf.report import claims, ladder as ladder_view
    ladder = csv_rows("h100-80gb-hbm3", "ladder", "2.7B.csv")
    rival = ladder["name"].str.startswith("contender_")
    assert rival.any() and (claims.rung_kind(ladder)[rival] == "contender").all()
    fast = ladder.copy()
    fast.loc[rival & (fast["metric"] == "tokens_per_s"), "median"] = 1e9
    made = claims.ladder_claims(fast, BARS["host_bound_idle_pct"], {}, False)
    rungs = set(fast[rival]["rung"])
    assert made and not {c.ours.rung for c in made} & rungs
    assert not {c.peer.rung for c in made if c.peer} & rungs
    best = ladder_view.ladder(fast, {}, BARS["host_bound_idle_pct"])["best"]
    assert best and all(b["rung"] not in rungs for b in best.values())


def test_ratios_are_tables_and_labels_say_what_was_counted(committed_render):
    """No bullet of ratios; the FLOP table says which rungs it counted over one micro-batch."""
    assert not re.search(r"^- (headline|throughput|gqa):", committed_render, re.M)
    assert "| configuration " in committed_render and "over sdpa_cudnn" in committed_render
    ladder = csv_rows("h100-80gb-hbm3", "ladder", "*.csv")
    steps = ladder[(ladder["metric"] == "step_ms") & (ladder["status"] == "ok")]
    for r in steps[steps["micro_batches"] > 1].itertuples():
        line = re.search(rf"^\| {re.escape(r.size)}\s+\| {r.rung}\s+\| [^|]+\| one micro-batch of "
                         rf"{r.micro_batches}, {r.batch_size} x {r.context:,} ", committed_render, re.M)
        assert line, (r.size, r.rung)


def test_no_project_internal_words_in_what_a_reader_reads(committed_render):
    words = re.compile(r"the issue'?s?\b|issues'? bars|bars? of (each|the) issues?|grids of the issues|"
                       r"seed benchmark|\bsession \d|#\d+ item", re.I)
    texts = {"report": committed_render, "README.md": (REPO / "README.md").read_text(),
             **{p.name: p.read_text() for p in (REPO / "templates").glob("*.j2")}}
    for name, text in texts.items():
        assert not words.search(text), (name, words.search(text)[0])


def test_the_scaling_answer_of_a_cpu_run_leaves_out_the_memory_it_could_not_measure():
    """A Gloo run on a CPU has a speed-up but no peak memory: the answer keeps the one, names
    the machine only when it is another's, and drops FSDP2's ratio instead of printing NaN."""
    from lmperf.report import summary
    view = {"available": True, "answers": [{"size": "tiny", "speedup": 1.25, "bucket_mb": 25.0,
                                            "fsdp": [{"tokens": "4 x 64 = 256", "ratio": float("nan")}]}]}
    answer = summary.scaling(view)
    assert answer["speedup"]["min"] == 1.25 and answer["fsdp"] == [] and answer["machine"] == ""
    other = {"available": False, "why": "none here", "others": [{"machine": "h200-x2", "link": "x.md",
                                                                 "answers": view["answers"]}]}
    assert summary.scaling(other)["machine"] == "h200-x2"
    assert summary.scaling({**other, "others": []}) == {"available": False, "why": "none here"}


def test_a_study_whose_every_case_failed_renders_its_table_and_no_ratio(tmp_path):
    results = tmp_path / "results" / "x"
    shutil.copytree(FIXTURE, results)
    for study in ("context", "warmup"):
        for csv in (results / "e2e" / study).glob("*.csv"):
            df = pd.read_csv(csv)
            df.assign(status="oom", median=np.nan).to_csv(csv, index=False)
    view = e2e.view(inputs(results))
    assert view["context_growth"]["n"] == 0 and (view["context_growth"]["short"], view["context_growth"]["long"]) == (128, 1024)
    assert view["warmup_std_ratio"]["n"] == 0 and set(view["context"]["step ms"]) == {"oom"}
    assert "Going from context" not in run(results, tmp_path, "full")


ENERGY_UNITS = {"joules_per_token": "J/token", "mean_power_w": "W", "power_limit_w": "W", "mean_sm_clock_mhz": "MHz"}


def energy_rows(df: pd.DataFrame, case_id: str, joules: float, power: float, limit: float = 700.0,
                clock: float = 1_755.0, message: str = "") -> pd.DataFrame:
    """The energy rows bench/e2e.py's time_steps writes for a CUDA case (one value each, over its
    timed steps), on the case's own columns; `message` on the joules row says why it is NaN."""
    base = df[df["case_id"] == case_id].iloc[[0]]
    values = {"joules_per_token": joules, "mean_power_w": power, "power_limit_w": limit, "mean_sm_clock_mhz": clock}
    return pd.concat([base.assign(metric=m, unit=ENERGY_UNITS[m], mean=v, median=v, q20=v, q80=v, min=v, max=v,
                                  std=np.nan, n=1, samples=f"{v:.6g}", status="ok",
                                  message=message if m == "joules_per_token" else np.nan)
                      for m, v in values.items()], ignore_index=True)


def test_energy_per_token_is_shown_beside_tokens_per_s_and_mfu(tmp_path):
    """A case with energy rows shows its J/token and mean power against the limit; a case whose
    energy counter could not be read says "not measured" and the note under its table says why;
    a case without the rows (older results) leaves the cells empty; the note under the training
    table names the case near its power limit with its SM clock."""
    results = tmp_path / "results" / "h100-80gb-hbm3"
    shutil.copytree(FIXTURE, results)
    csv = results / "e2e" / "variants" / "2.7B.csv"
    df = pd.read_csv(csv)
    measured, failed = "2.7B-ctx256-bf16-compiled-train-warmup5", "2.7B-ctx256-fp32-compiled-forward-warmup5"
    why = "energy not measured: NVMLError: Not Supported"
    pd.concat([df, energy_rows(df, measured, 0.0883, power=672.4),
               energy_rows(df, failed, np.nan, power=301.0, message=why)]).to_csv(csv, index=False)
    view = e2e.view(inputs(results))
    train = view["variants_train"].set_index(["size", "dtype", "compile"])
    columns = list(train.columns)
    assert columns.index("tokens/s") < columns.index("MFU % of bf16 peak") < columns.index("J/token") < columns.index(
        "W / limit") < columns.index("peak MiB")
    assert train.loc[("2.7B", "bf16", "compiled"), "J/token"] == 0.0883
    assert train.loc[("2.7B", "bf16", "compiled"), "W / limit"] == "672 / 700"
    assert pd.isna(train.loc[("2.7B", "fp32", "eager"), "J/token"])  # no energy rows: an empty cell
    assert pd.isna(train.loc[("2.7B", "fp32", "eager"), "W / limit"])
    forward = view["variants_forward"].set_index(["size", "dtype", "compile"])
    assert forward.loc[("2.7B", "fp32", "compiled"), "J/token"] == "not measured"
    assert forward.loc[("2.7B", "fp32", "compiled"), "W / limit"] == "301 / 700"
    power = view["variants_train_power"]
    assert power["n"] == 1 and power["share_max"] == pytest.approx(672.4 / 700)
    assert power["near"] == [{"case": "2.7B, bf16, compiled", "power": 672.4, "share_pct": pytest.approx(96.057, rel=1e-4),
                              "clock": 1_755.0}]
    assert view["variants_forward_power"]["why_not"] == [{"message": why, "n": 1}]
    assert view["variants_forward_power"]["n_near"] == 0

    text = run(results, tmp_path)
    row = next(line for line in text.splitlines() if re.match(r"\| 2\.7B\s+\| 256\s+\| bf16\s+\| compiled .*\| 0\.0883 ", line))
    assert "| 672 / 700 " in row
    assert "2.7B, bf16, compiled (672 W, 1,755 MHz)" in text
    assert f"J/token not measured in 1 case: {why}." in text
    assert "whole GPU board" in text and "NVML's energy counter" in text


def test_results_without_energy_rows_render_without_the_columns():
    """Results written before the energy was measured (the fixture) have no J/token or power
    column and no power note: nothing made up (their render: tests/fixtures/golden/report_fixture.md)."""
    view = e2e.view(inputs(FIXTURE))
    for name in ("variants_train", "variants_forward", "context"):
        assert not {"J/token", "W / limit"} & set(view[name].columns), name
        assert view.get(f"{name}_power", {"n": 0})["n"] == 0


def test_the_committed_results_show_j_per_token_where_their_csvs_have_it(committed_render):
    """The e2e tables and the ladder's rungs have a J/token column exactly where their CSVs hold
    joules rows (the committed ladder CSVs may predate them), with the CSV's value."""
    sections = {s.split("\n", 1)[0]: s for s in committed_render.split("\n## ")}
    for folder, heading in (("e2e", "End-to-end"), ("ladder", "The ladder")):
        rows = csv_rows("h100-80gb-hbm3", folder, "*.csv" if folder == "ladder" else "*/*.csv")
        joules = rows[(rows["metric"] == "joules_per_token") & rows["median"].notna() & (rows["study"] != "warmup")]
        section = next(text for title, text in sections.items() if title.startswith(heading))
        headers = [line for line in section.splitlines() if line.startswith("| size") and "tokens/s" in line]
        # the rungs' and the e2e tables (the ladder's peers table, a digest, has none)
        assert headers and any("J/token" in h for h in headers) == (not joules.empty), (folder, headers)
        if not joules.empty:
            assert f"| {fmt(float(joules['median'].iloc[0]))} " in section
