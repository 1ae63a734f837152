import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

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


@pytest.fixture
def rendered(tmp_path):
    out = tmp_path / "report" / "report.md"
    text = render.render(FIXTURE, REPO / "templates", out, tmp_path / "report" / "figures", "full", BARS)
    return text, out


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
    mfu = df[(df.case_id == "2.7B-ctx256-fp32-compiled-forward-warmup5") & (df.metric == "mfu_pct")].iloc[0]
    assert view["best_mfu"]["value"] == mfu["median"] and view["best_mfu"]["mode"] == "forward"
    assert view["peaks"] == {"fp32": 67.0, "bf16": 989.0}  # the rows' peak_tflops column


def test_prose_ratio_is_computed_from_the_csvs():
    df = pd.concat([rows("variants", "small"), rows("variants", "2.7B")])
    ok = df[df["status"] == "ok"]
    f = ok[ok.metric == "forward_ms"].set_index("case_id")["median"]  # ratios of medians, not means
    b = ok[ok.metric == "backward_ms"].set_index("case_id")["median"]
    ratio = (b / f.reindex(b.index)).dropna()
    got = e2e.view(inputs(FIXTURE))["backward_over_forward"]
    assert got["n"] == len(ratio) and got["mean"] == pytest.approx(ratio.mean())


def test_case_count_is_per_study(rendered):
    text, _ = rendered
    frames = [pd.read_csv(p) for p in (FIXTURE / "e2e").rglob("*.csv")]
    n = sum(f["case_id"].nunique() for f in frames)  # one file per study and size
    n_bad = sum(f.drop_duplicates("case_id")["status"].ne("ok").sum() for f in frames)
    assert f"{n} cases, {n_bad} of them not `ok`." in text


def test_oom_cases_are_shown_with_their_status():
    view = e2e.view(inputs(FIXTURE))
    context = view["context"].set_index(["size", "context", "dtype"])
    assert context.loc[("2.7B", 1024, "fp32"), "step ms"] == "oom"
    assert "2.7B-ctx1024-bf16-eager-train-warmup5" in set(view["failures"].query("status == 'oom'")["case_id"])


def test_environment_section_and_figures(rendered):
    text, out = rendered
    assert "| GPU                         | NVIDIA H100 80GB HBM3" in text
    assert "| torch                       | 2.11.0+cu130" in text
    for link in ("figures/e2e_step_vs_size.png", "figures/e2e_step_vs_context.png"):
        assert f"]({link})" in text
        png = out.parent / link
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_missing_results_say_why(tmp_path):
    empty = tmp_path / "results" / "cpu"
    empty.mkdir(parents=True)
    text = run(empty, tmp_path, "smoke")
    assert "Not available: no end-to-end results" in text
    assert "Missing: no " in text


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
    from lmperf.report import readme
    text = (REPO / "README.md").read_text()
    hw = re.search(r"results/([a-z0-9._-]+)/e2e/", text.split(readme.BEGIN)[1])[1]
    block = readme.render_block(REPO / "results" / hw, REPO / "templates")
    assert readme.replace_block(text, block) == text, \
        "README's results block is stale: run python -m lmperf.report.readme --results results/" + hw


FA_FIXTURE = REPO / "tests" / "fixtures" / "results" / "h200"


def test_flash_attention_section_reads_bars_off_the_same_run():
    df = pd.read_csv(FA_FIXTURE / "flash_attention" / "bench" / "headline_d64.csv")
    fb = df[df.metric == "fwd_bwd_ms"].set_index("provider")["median"]
    ours = fb["triton_compiled"] if "triton_compiled" in fb else fb["triton"]  # the leaderboard's harness first
    ratio = ours / fb["sdpa_flash"]
    bars = flash_attention.view(inputs(FA_FIXTURE))["bars"].set_index("bar")
    line = bars.loc["headline forward+backward <= 0.75x SDPA-flash time (leaderboard harness)"]
    assert line["_value"] == pytest.approx(ratio) and line["met"] == (ratio <= 0.75)
    line = bars.loc["headline forward+backward <= 5.2 ms"]
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
    assert view["model_host"]["ours / sdpa_flash"].tolist() == [0.5, 1.5, 1.0]


def test_flash_attention_bars_follow_the_thresholds_in_the_config():
    bars = {**BARS, "flash_attention": {**BARS["flash_attention"], "headline_vs_sdpa_flash": 10.0}}
    line = flash_attention.view(inputs(FA_FIXTURE, bars))["bars"].iloc[0]
    assert line["bar"] == "headline forward+backward <= 10x SDPA-flash time (leaderboard harness)" and line["met"]


def test_correctness_section_counts_checks_and_flags_failures(tmp_path):
    results = tmp_path / "results" / "x"
    shutil.copytree(FA_FIXTURE, results)
    check = results / "flash_attention" / "check.csv"
    df = pd.read_csv(check)
    n_triton_fp16 = int((df.impl.eq("triton") & df.dtype.eq("fp16")).sum())
    text = run(results, tmp_path)
    assert re.search(rf"flash_attention / triton \| fp16\s+\| \d+\s+\| {n_triton_fp16}/{n_triton_fp16}", text)
    assert "Every check that ran passed." in text
    bad = df.index[df.impl.eq("triton") & df.dtype.eq("fp16")][0]
    df.loc[bad, ["mean", "passed"]] = [1.0, False]
    df.to_csv(check, index=False)
    text = run(results, tmp_path)
    assert "**Failing checks:**" in text and "| FAIL" in text


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
    assert ("**Not measured yet:** 2 of the 2 result files a full run writes\nat this scale are missing "
            "(`results/x/flash_attention/bench/grid_d64.csv`, `results/x/lrpe/check.csv`)") in text


def test_flash_attention_grid_bar_uses_the_gpu_time_where_both_were_measured():
    rows = []
    for n, (ours, compiled) in {128: ((1.0, 0.02), (0.9, 0.05)), 4096: ((1.3, 1.3), (1.2, 1.4))}.items():
        for provider, ms in (("triton", ours), ("plain_compiled", compiled)):
            for metric, value in zip(("fwd_bwd_ms", "fwd_bwd_gpu_ms"), ms):
                rows.append({"dtype": "fp32", "head_dim": 128, "seq_len": n, "provider": provider,
                             "metric": metric, "median": value, "status": "ok"})
    grid = pd.DataFrame(rows)
    assert flash_attention.grid_slower(grid, "fwd_bwd_ms") == (2, 2)
    assert flash_attention.grid_slower(grid, "fwd_bwd_gpu_ms") == (0, 2)
    line = flash_attention.bars([], grid, pd.DataFrame(), BARS["flash_attention"])[0]
    assert "GPU time" in line["bar"] and line["met"]


def test_two_providers_with_the_same_times_everywhere_are_flagged():
    """Two SDPA backends that take the same time at every shape did not both run: the cuDNN
    stretch bar then says 'not measured' instead of comparing against a copy of SDPA-flash."""
    same = pd.DataFrame({"sdpa_flash": [0.100, 0.200, 0.300], "sdpa_cudnn": [0.101, 0.199, 0.300],
                         "ours / sdpa_flash": [0.6, 0.6, 0.6], "ours / sdpa_cudnn": [0.6, 0.6, 0.6]})
    assert flash_attention.same_kernel(same, "sdpa_flash", "sdpa_cudnn")
    different = same.assign(sdpa_cudnn=[0.080, 0.150, 0.300])
    assert not flash_attention.same_kernel(different, "sdpa_flash", "sdpa_cudnn")
    same.attrs["metric"] = "fwd_bwd_gpu_ms"
    rows = flash_attention.bars([], pd.DataFrame(), same, {})
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
    assert f"‡ host-bound ({n_bound} here): the GPU sat idle more than 10% of the median call" in text
    assert "host-bound cases left out" in text


def test_a_flash_attention_ratio_with_a_host_bound_side_claims_no_bar(tmp_path):
    results = REPO / "results" / "h100-80gb-hbm3"
    frames = {s.name: render.load_section(results, s.name) for s in SECTIONS}
    fa = frames["flash_attention"]
    peer = (fa["group"] == "headline") & (fa["provider"] == "sdpa_flash") & (fa["metric"] == "fwd_bwd_ms")
    frames["flash_attention"] = fa.assign(gpu_idle_pct=peer.map({True: 50.0, False: 1.0}))
    view = flash_attention.view(Inputs(results=results, frames=frames, bars=BARS, out_dir=tmp_path))
    headline = view["bars"][view["bars"]["bar"].str.contains("SDPA-flash time")].iloc[0]
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
