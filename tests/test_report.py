import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from lmperf.report import render, sections

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "results" / "h100-80gb-hbm3"


@pytest.fixture
def rendered(tmp_path):
    out = tmp_path / "report" / "report.md"
    text = render.render(FIXTURE, REPO / "templates", out, tmp_path / "report" / "figures", "full")
    return text, out


def rows(study, size):
    return pd.read_csv(FIXTURE / "e2e" / study / f"{size}.csv")


def test_tables_hold_the_csv_numbers(rendered):
    text, _ = rendered
    df = rows("variants", "2.7B")
    step = df[(df.case_id == "2.7B-ctx256-bf16-compiled-train-warmup5") & (df.metric == "step_ms")].iloc[0]
    cell = re.escape(sections.mean_std(step["mean"], step["std"]))
    assert re.search(rf"\|\s+{cell}\s+\|", text)
    mfu = df[(df.case_id == "2.7B-ctx256-fp32-compiled-forward-warmup5") & (df.metric == "mfu_pct")].iloc[0]
    assert f"The best MFU measured is {sections.fmt(mfu['mean'])}%" in " ".join(text.split())


def test_prose_ratio_is_computed_from_the_csvs(rendered):
    text, _ = rendered
    df = pd.concat([rows("variants", "small"), rows("variants", "2.7B")])
    ok = df[df["status"] == "ok"]
    f = ok[ok.metric == "forward_ms"].set_index("case_id")["mean"]
    b = ok[ok.metric == "backward_ms"].set_index("case_id")["mean"]
    ratio = (b / f.reindex(b.index)).mean()
    assert f"the backward pass takes {sections.fmt(ratio)}× the forward on average" in " ".join(text.split())


def test_case_count_is_per_study(rendered):
    text, _ = rendered
    frames = [pd.read_csv(p) for p in (FIXTURE / "e2e").rglob("*.csv")]
    n = sum(f["case_id"].nunique() for f in frames)  # one file per study and size
    n_bad = sum(f.drop_duplicates("case_id")["status"].ne("ok").sum() for f in frames)
    assert f"{n} cases, {n_bad} of them not `ok`." in text


def test_oom_cases_are_shown_with_their_status(rendered):
    text, _ = rendered
    assert "| 2.7B   | 1024      | fp32    | oom" in text
    assert "2.7B-ctx1024-bf16-eager-train-warmup5 | oom" in text


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
    text = render.render(empty, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "smoke")
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
    text = render.render(results, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "smoke")
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


def test_fmt():
    assert sections.fmt(1234.5) == "1,234"
    assert sections.fmt(0.012345) == "0.0123"
    assert sections.fmt(float("nan")) == "n/a"


def test_readme_results_block_is_a_fresh_render_of_the_committed_results():
    from lmperf.report import readme
    text = (REPO / "README.md").read_text()
    hw = re.search(r"results/([a-z0-9._-]+)/e2e/", text.split(readme.BEGIN)[1])[1]
    block = readme.render_block(REPO / "results" / hw, REPO / "templates")
    assert readme.replace_block(text, block) == text, \
        "README's results block is stale: run python -m lmperf.report.readme --results results/" + hw


FA_FIXTURE = REPO / "tests" / "fixtures" / "results" / "h200"


def test_flash_attention_section_reads_bars_off_the_same_run(tmp_path):
    text = render.render(FA_FIXTURE, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "full")
    df = pd.read_csv(FA_FIXTURE / "flash_attention" / "bench" / "headline_d64.csv")
    fb = df[df.metric == "fwd_bwd_ms"].set_index("provider")["mean"]
    ratio = fb["triton"] / fb["sdpa_flash"]
    met = "yes" if ratio <= 0.75 else "no"
    assert re.search(rf"headline forward\+backward <= 0.75x SDPA-flash time \|\s+{sections.fmt(ratio)}x\s+\|\s+{met}", text)
    assert "### headline: 1 x 16 heads x 16384 tokens x D 64, bf16, causal" in text


def test_correctness_section_counts_checks_and_flags_failures(tmp_path):
    results = tmp_path / "results" / "x"
    shutil.copytree(FA_FIXTURE, results)
    check = results / "flash_attention" / "check.csv"
    df = pd.read_csv(check)
    n_triton_fp16 = int((df.impl.eq("triton") & df.dtype.eq("fp16")).sum())
    text = render.render(results, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "full")
    assert re.search(rf"flash_attention / triton \| fp16\s+\| \d+\s+\| {n_triton_fp16}/{n_triton_fp16}", text)
    assert "Every check that ran passed." in text
    bad = df.index[df.impl.eq("triton") & df.dtype.eq("fp16")][0]
    df.loc[bad, ["mean", "passed"]] = [1.0, False]
    df.to_csv(check, index=False)
    text = render.render(results, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "full")
    assert "**Failing checks:**" in text and "| FAIL" in text


def test_report_lists_the_result_files_a_full_run_would_write_but_are_missing(tmp_path):
    results = tmp_path / "results" / "x"
    shutil.copytree(FA_FIXTURE, results)
    missing, expected = render.missing_csvs(results, "full")
    assert expected > 20 and "flash_attention/bench/grid_d64.csv" in missing
    assert "flash_attention/bench/headline_d64.csv" not in missing  # the fixture has it
    text = render.render(results, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "full")
    assert f"**Not measured yet:** {len(missing)} of the {expected} result files" in text
