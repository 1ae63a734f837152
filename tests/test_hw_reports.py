"""Another GPU's results rendered alone (rule hw_report, report/<hw>/report.md): the scale comes
from the results' env.csv, the rule measures nothing, and every committed page is what the
renderer writes from the committed results."""
from __future__ import annotations

import re
import shutil

import pytest

from conftest import REPO, copy_repo, snakemake
from lmperf import workflow
from lmperf.report import render

# report/quick/report.md is this machine's quick-scale report (rule report), not another GPU's
HW_REPORTS = sorted(p for p in (REPO / "report").glob("*/report.md") if p != REPO / workflow.report_path("quick"))


def test_the_scale_is_the_one_the_results_were_measured_at(tmp_path):
    env = tmp_path / "results" / "x" / "env"
    env.mkdir(parents=True)
    (env / "env.csv").write_text("key,value\nhw,x\nscale,full\n")
    assert workflow.measured_scale(str(tmp_path / "results" / "x")) == "full"
    (env / "env.csv").write_text("key,value\nhw,x\n")
    with pytest.raises(ValueError, match=r"env\.csv: no scale"):
        workflow.measured_scale(str(tmp_path / "results" / "x"))
    with pytest.raises(ValueError, match="cannot read the scale"):
        workflow.measured_scale(str(tmp_path / "results" / "none"))


def test_an_hw_report_renders_and_measures_nothing(tmp_path):
    """A dry run of report/h200/report.md plans the render alone, on a machine that cannot
    measure."""
    repo = copy_repo(tmp_path / "repo")
    shutil.copytree(REPO / "results" / "h200", repo / "results" / "h200")
    plan = snakemake(repo, "report/h200/report.md", "-n", "-F", "--quiet", "rules").stdout
    jobs = re.findall(r"^(\w+)\s+\d+\s*$", plan, flags=re.M)
    assert set(jobs) == {"hw_report", "total"}, plan


@pytest.mark.parametrize("page", HW_REPORTS, ids=lambda p: p.parent.name)
def test_every_committed_hw_report_is_what_the_renderer_writes(page, tmp_path, monkeypatch):
    hw = page.parent.name
    # the page names the results folder as the rule gives it, and links files under it (the memory
    # snapshots' pictures) relative to itself: rendered at report/<hw>/ of a tree whose results,
    # templates and config are the repository's
    for name in ("results", "templates", "config"):
        (tmp_path / name).symlink_to(REPO / name, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    results = f"results/{hw}"
    out = tmp_path / "report" / hw / "report.md"
    argv = ["--results", results, "--scale", workflow.measured_scale(results),
            "--templates", "templates", "--out", str(out), "--figures", str(out.parent / "figures"),
            "--config", "config/config.yaml", "--references", "config/references.yaml"]
    render.main(argv)
    stamp = re.compile(r" on \d{4}-\d\d-\d\d \d\d:\d\d UTC")  # when it was rendered
    fresh, committed = (stamp.sub(" on <time>", p.read_text()) for p in (out, page))
    assert f"snakemake --cores 1 report/{hw}/report.md" in fresh
    assert fresh == committed, f"rewrite it: snakemake --cores 1 -F report/{hw}/report.md"
    assert sorted(p.name for p in (out.parent / "figures").glob("*.png")) == \
        sorted(p.name for p in (page.parent / "figures").glob("*.png"))


@pytest.mark.parametrize("page", sorted((REPO / "report").rglob("*.md")), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_of_a_committed_page_leads_to_a_file(page):
    """A page at report/<hw>/ or report/quick/ is a folder deeper than report/report.md: its links
    into the repository (the docs, the results' pictures) climb as far as it is deep."""
    links = [m.group(1).split("#")[0] for m in re.finditer(r"\]\(([^)\s]+)\)", page.read_text())]
    local = [t for t in links if t and "://" not in t and not t.startswith("mailto:")]
    assert not [t for t in local if not (page.parent / t).exists()]
