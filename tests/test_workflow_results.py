"""Through Snakemake: a damaged result is named while the DAG is built and its job rerun; a
failed render leaves the report and every figure as they were; the report counts the result
files the configuration promises. Each in a private copy of the built CPU repository."""
import re
import shutil
from pathlib import Path

import pytest

from conftest import SMOKE, snakemake
from lmperf import workflow as wf
from lmperf.report import render

TARGET = "results/cpu/e2e/warmup/tiny.csv"  # a smoke job of a few seconds


@pytest.fixture
def built_copy(built_repo, tmp_path) -> Path:
    dest = tmp_path / "built"
    shutil.copytree(built_repo, dest, symlinks=True)
    return dest


def planned(repo: Path) -> tuple[dict[str, int], str]:
    """({rule: job count} a dry run of report/report.md would execute, its stderr)."""
    proc = snakemake(repo, "report/report.md", "-n", "--quiet", "rules", *SMOKE)
    stats = proc.stdout.split("Job stats:")[1] if "Job stats:" in proc.stdout else ""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M) if m[1] != "total"}, proc.stderr


def cut_mid_row(text: str) -> str:
    return text[:len(text) // 2]


def header_only(text: str) -> str:
    return text.splitlines(keepends=True)[0]


def emptied(text: str) -> str:
    return ""


def garbage(text: str) -> str:
    return "cnf7DWVgXVsAF0wIQuR1hg56n3uBVTgLLVtwb7aaTd5WDYE016PlknsUBLlSiTV\nymR8HfmFw1nAU+==\n"


def short_at_a_row_boundary(text: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[:len(lines) // 2])


def test_the_report_counts_the_result_files_the_config_promises(built_repo):
    config = render.load_config(built_repo / "config" / "config.yaml")
    n = len(wf.result_files(config, "results/cpu", "smoke", ["results/cpu"]))
    assert f"All {n} result files a full run writes at this scale are here." in \
        (built_repo / "report" / "report.md").read_text()


@pytest.mark.parametrize("damage, says", [
    (cut_mid_row, "ends mid-row"),
    (header_only, "has a header but no rows"),
    (emptied, "is empty"),
    (garbage, "is not a results table"),
    (short_at_a_row_boundary, "holds 2 of the 3 cases its job promises"),
])
def test_a_damaged_result_is_named_at_planning_and_its_job_planned(built_copy, damage, says):
    path = built_copy / TARGET
    path.write_text(damage(path.read_text()))
    jobs, stderr = planned(built_copy)
    assert f"lmperf: {TARGET} {says}" in stderr and "its job is forced to rerun" in stderr
    assert jobs == {"e2e_study": 1, "report": 1}


@pytest.mark.slow
def test_a_damaged_result_is_measured_again_and_the_report_rendered(built_copy):
    """The issue's case: a CSV truncated mid-row used to rerun only the report, which then
    summarised what was left (exit 0)."""
    path = built_copy / TARGET
    good = path.read_text()
    path.write_text(cut_mid_row(good))
    run = snakemake(built_copy, "--cores", "1", "report/report.md", *SMOKE)
    assert "reason: Forced execution" in run.stdout + run.stderr
    assert len(path.read_text().splitlines()) == len(good.splitlines())   # every case measured again
    assert planned(built_copy)[0] == {}


@pytest.mark.slow
def test_a_failed_render_leaves_the_report_and_every_figure(built_copy):
    """Snakemake deletes a job's outputs before it runs and after it fails; the report's are
    flagged update(), so a render that fails (here on a stray garbage CSV in a section's folder,
    after a template edit) leaves report/report.md and the figures as they were."""
    report = built_copy / "report"
    before = {p: p.read_bytes() for p in report.rglob("*") if p.is_file()}
    (built_copy / "results" / "cpu" / "e2e" / "variants" / "stray.csv").write_text("case_id,status,mean\nx,ok,fast\n")
    template = built_copy / "templates" / "env.md.j2"
    template.write_text(template.read_text() + "\n")
    run = snakemake(built_copy, "--cores", "1", "report/report.md", *SMOKE, check=False)
    assert run.returncode != 0 and "Restored previous version of report/report.md" in run.stdout + run.stderr
    log = (built_copy / "logs" / "cpu" / "report.log").read_text()
    assert "results/cpu/e2e/variants/stray.csv has non-numbers in column mean" in log
    assert "no job of this configuration writes it" in log
    assert {p: p.read_bytes() for p in report.rglob("*") if p.is_file()} == before
