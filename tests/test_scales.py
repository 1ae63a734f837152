"""The scales and the deep target: a standard run leaves the deep target's jobs (config `repeats`,
`convergence`) out and a deep one (`depth=deep`, `make report-deep`) plans them; the quick scale
(`scale=quick`, `make report-quick`) plans the jobs of the summary's rows and only those, into
results/<hw>-quick/ and report/quick/report.md; and the report says where the deep tables come
from and, at the quick scale, how far its numbers lie from the full run's."""
import re
import shutil
from pathlib import Path

import pytest

from conftest import config_yaml, copy_repo, snakemake
from lmperf import workflow as wf
from lmperf.report import render, summary
from lmperf.report.sections import DEEP

REPO = Path(__file__).resolve().parents[1]
DEEP_RULES = {"repeat", "distributed_repeat", "convergence_run"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return copy_repo(tmp_path_factory.mktemp("scales") / "lmperf")


def plan(repo: Path, target: str, *config: str) -> tuple[dict[str, int], str]:
    """The jobs a dry run plans ({rule: count}) and its shell commands."""
    proc = snakemake(repo, target, "-n", "-p", "--config", *config)
    table = proc.stdout.split("Job stats:", 1)[1].split("Reasons:", 1)[0]
    jobs = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}
    return jobs, proc.stdout


def test_a_standard_run_plans_no_deep_target_job_and_a_deep_run_does(repo):
    standard, _ = plan(repo, "report/report.md", "scale=smoke")
    deep, _ = plan(repo, "report/report.md", "scale=smoke", "depth=deep")
    assert not DEEP_RULES & set(standard)
    assert {"repeat", "convergence_run"} <= set(deep)
    # and the jobs a plan marks deep in a section both run (the end-to-end compile study's)
    files = wf.result_files(render.load_config(repo / "config" / "config.yaml"), "results/cpu", "smoke", ["results/cpu"])
    marked = {}
    for f in files:
        if f.deep:
            marked[f.rule] = marked.get(f.rule, 0) + 1
    assert marked.get("e2e_study")
    assert {k: v - marked.get(k, 0) for k, v in deep.items() if k not in DEEP_RULES} == standard


def test_a_standard_full_run_plans_no_deep_target_job(repo):
    """On a GPU the default: the full grids, no repeats and no convergence (planned here, on a CPU)."""
    jobs, out = plan(repo, "report/report.md", "scale=full", "hw=h100-80gb-hbm3")
    assert not DEEP_RULES & set(jobs) and {"ladder_size", "flash_attention_bench", "e2e_study"} <= set(jobs)
    deep, _ = plan(repo, "report/report.md", "scale=full", "hw=h100-80gb-hbm3", "depth=deep")
    assert {"repeat", "convergence_run"} <= set(deep)


# The jobs whose rows each summary row reads (lmperf.report.summary, templates/summary.md.j2):
# the correctness row reads the checks the quick scale runs, FlashAttention's and LRPE's.
SUMMARY_JOBS = {"flash_attention": {"flash_attention_bench"}, "throughput": {"flash_attention_bench"},
                "training": {"ladder_size"}, "lrpe": {"lrpe_bench"}, "memory": {"memory"}, "profile": {"profile"},
                "correctness": {"flash_attention_check", "lrpe_check"}}


def test_the_quick_scale_plans_the_summarys_jobs_and_only_those(repo):
    jobs, out = plan(repo, "report/quick/report.md", "scale=quick", "hw=h100-80gb-hbm3-quick")
    assert set(SUMMARY_JOBS) | {"scaling", "contenders", "reproducibility"} == set(
        summary.view({}, [], "x"))  # every summary row is named above or has no job at this scale
    needed = set().union(*SUMMARY_JOBS.values()) | {"env", "report"}
    assert set(jobs) == needed
    assert jobs["flash_attention_bench"] == 2  # the headline and the throughput shape
    # into a folder and a report of their own, never the full run's
    outputs = re.findall(r"^\s+output: (\S+)", out, re.M)
    assert outputs and all(o.startswith(("results/h100-80gb-hbm3-quick/", "report/quick/")) for o in outputs)
    # the ladder runs the summary's rungs alone, numbered as in the full grid
    ladder = next(line for line in out.splitlines() if "lmperf.bench.ladder" in line)
    config = config_yaml()
    assert all(f"'{p}'" in ladder for p in config["ladder"]["quick"]["cases"])


def test_the_quick_ladder_rungs_are_the_full_grids():
    """The quick ladder's rungs are the full ladder's (same ids, so lmperf.compare pairs them)."""
    config = render.load_config()
    full = {f.study: f for f in wf.result_files(config, "results/x", "full", []) if f.section == "ladder"}
    quick = [f for f in wf.result_files(config, "results/x-quick", "quick", []) if f.section == "ladder"]
    assert quick and all(set(f.case_ids()) < set(full[f.study].case_ids()) for f in quick)
    assert {c.split("-", 2)[2] for f in quick for c in f.case_ids()} == {
        "floors", "compiled", "ctx2048", "ours_float8_delayed"}


def test_quick_results_go_to_a_folder_of_their_own(monkeypatch):
    monkeypatch.setattr(wf.hardware, "gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    assert wf.machine({"hw": "auto", "scale": "quick"}) == ("h100-80gb-hbm3-quick", "quick")
    assert wf.machine({"hw": "auto", "scale": "auto"}) == ("h100-80gb-hbm3", "full")
    assert wf.report_path("quick") == "report/quick/report.md" and wf.report_path("full") == "report/report.md"
    assert "without a CUDA GPU" in wf.cannot_measure("cpu", "quick", None)


def render_smoke(results: Path, tmp_path: Path, scale: str = "smoke") -> str:
    config = render.load_config()
    promised = render.promised_files(config, results, scale, render.distributed_folders(results))
    return render.render(results, REPO / "templates", tmp_path / "report" / "report.md",
                         tmp_path / "report" / "figures", scale, config["report"], promised)


def test_without_the_deep_results_the_report_says_they_come_from_the_deep_target(tmp_path):
    results = tmp_path / "results" / "cpu"
    results.mkdir(parents=True)
    text = render_smoke(results, tmp_path)
    top = text.split("## Contents", 1)[0]
    assert "**The deep target:**" in top and "None of them is measured here." in top
    assert "/repeats/" not in top and "/convergence/" not in top  # not counted missing
    for name in DEEP:
        section = text.split(f"\n{name_heading(text, name)}\n", 1)[1]
        first = section.strip().splitlines()[0]
        assert first.startswith("Not measured here: this table comes from the deep target") and "make report-deep" in first
    assert "they come from the deep target (`make report-deep`)" in text  # the summary's row


def name_heading(text: str, name: str) -> str:
    titles = {"repeats": "## Across processes", "convergence": "## The FP8 rung's convergence"}
    return next(line for line in text.splitlines() if line.startswith(titles[name]))


def test_the_quick_report_says_so_and_how_far_it_lies_from_the_full_run(tmp_path):
    import pandas as pd
    quick = tmp_path / "results" / "h100-80gb-hbm3-quick"
    (quick / "profile").mkdir(parents=True)
    rows = pd.read_csv(REPO / "results" / "h100-80gb-hbm3" / "profile" / "profile.csv")
    rows[rows["case_id"].str.startswith("small-")].to_csv(quick / "profile" / "profile.csv", index=False)  # quick's cases
    text = render_smoke(quick, tmp_path, "quick")
    head = text.split("## Summary", 1)[0]
    assert "**Quick scale:**" in head and "is not measured yet: there is no full run" in head
    full = tmp_path / "results" / "h100-80gb-hbm3"
    (full / "profile").mkdir(parents=True)
    shutil.copy(REPO / "results" / "h100-80gb-hbm3" / "profile" / "profile.csv", full / "profile")
    head = render_smoke(quick, tmp_path, "quick").split("## Summary", 1)[0]
    n = re.search(r"\*\*(\d+) of (\d+) timing rows agree within noise\*\*", head)
    assert n and n[1] == n[2] and int(n[1]) > 0  # the same rows: every one agrees, 0% apart
    assert "a median 0% and at most 0% from the full run's" in head
    assert "(../compare/h100-80gb-hbm3_vs_h100-80gb-hbm3-quick.md)" in head


def test_a_standard_run_after_a_deep_one_keeps_and_shows_the_deep_rows(built_repo, tmp_path):
    """The smoke run of the tests is deep (conftest.SMOKE); a standard run after it measures
    nothing, deletes none of the deep target's results, and renders them as measured."""
    report = (built_repo / "report" / "report.md").read_text()
    assert "All of them are measured here." in report and "*From the deep target*" in report
    copy = tmp_path / "built"
    shutil.copytree(built_repo, copy, symlinks=True)
    deep_csvs = sorted(p for name in DEEP for p in (copy / "results").rglob(f"{name}/**/*.csv"))
    assert deep_csvs
    proc = snakemake(copy, "--cores", "1", "report/report.md", "--config", "scale=smoke")
    ran = set(re.findall(r"^rule (\w+):", proc.stdout + proc.stderr, re.M))
    assert ran <= {"report"}, ran  # at most the render (its inputs are fewer than the deep run's)
    assert all(p.exists() for p in deep_csvs)
    report = (copy / "report" / "report.md").read_text()
    assert "All of them are measured here." in report and "Not measured here: this table" not in report
    assert "## Across processes" in report and "headline numbers were measured in" in report
