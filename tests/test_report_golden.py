"""The report rendered end to end from small fixture results folders and compared whole with its
golden file under tests/fixtures/golden/: a change of wording, layout or number in what a reader
reads is one diff to review (rewrite the files with LMPERF_REWRITE_GOLDEN=1, docs/testing.md).
The numbers in them are checked against the CSVs by the tests on the views (tests/test_report*.py,
tests/test_claims.py)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import REPO, golden
from lmperf.report import render

FIXTURES = REPO / "tests" / "fixtures" / "results"
GOLDEN = REPO / "tests" / "fixtures" / "golden"
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC")  # when it was rendered


@pytest.fixture(autouse=True)
def code_changed_since_the_rows(monkeypatch):
    """git's answer pinned: the fixture rows' code has changed since in one file (what git says
    of this checkout changes with every commit; lmperf.report.freshness has its own tests)."""
    from lmperf.report import freshness
    monkeypatch.setattr(freshness, "changed_since", lambda commit, files, repo=None: (["src/lmperf/model.py"], ""))
    monkeypatch.setattr(freshness, "changed_between", lambda a, b, files, repo=None: ["src/lmperf/model.py"])


def render_fixture(root: Path, folders: list[Path]) -> tuple[str, Path]:
    """The sections of `folders` merged into one results folder `results/fixture` under `root`,
    rendered there as the report rule would (paths relative to `root`)."""
    results = root / "results" / "fixture"
    results.mkdir(parents=True)
    for folder in folders:
        shutil.copytree(folder, results, dirs_exist_ok=True)
    out = root / "report" / "report.md"
    text = render.render(Path("results/fixture"), REPO / "templates", out, out.parent / "figures", "full",
                         render.bars_from_config(REPO / "config" / "config.yaml"))
    return STAMP.sub("<time>", text), out


def test_a_report_of_end_to_end_environment_and_flash_attention_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text, out = render_fixture(tmp_path, [FIXTURES / "h100-80gb-hbm3", FIXTURES / "h200"])
    assert str(tmp_path) not in text  # nothing of the machine it was rendered on
    golden(GOLDEN / "report_fixture.md", text)
    figures = sorted((out.parent / "figures").glob("*.png"))
    assert [p.name for p in figures] == sorted(re.findall(r"\]\(figures/([\w.-]+\.png)\)", text))  # each one shown
    assert {"e2e_step_vs_size.png", "e2e_step_vs_context.png"} <= {p.name for p in figures}
    for png in figures:  # a real image, not a placeholder
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, png.name


def test_a_report_of_an_empty_results_folder(tmp_path, monkeypatch):
    """Every section says what it lacks and the summary answers 'not measured here'."""
    monkeypatch.chdir(tmp_path)
    text, out = render_fixture(tmp_path, [])
    golden(GOLDEN / "report_empty.md", text)
    assert not list((out.parent / "figures").glob("*.png"))
