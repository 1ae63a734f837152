"""The report renders from the committed H100 CSVs with every number its tables held before the
report side was restructured (tests/fixtures/report_numbers_h100.json, captured from the
report/report.md of dff03a4 by tests/report_numbers.py)."""
import json
from pathlib import Path

import pytest

from lmperf.report import render
from report_numbers import table_numbers

REPO = Path(__file__).resolve().parents[1]
BEFORE = json.loads((REPO / "tests" / "fixtures" / "report_numbers_h100.json").read_text())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("report") / "report.md"
    return render.render(REPO / "results" / "h100-80gb-hbm3", REPO / "templates", out,
                         out.parent / "figures", "full")


@pytest.mark.parametrize("section", sorted(BEFORE))
def test_every_table_number_is_still_in_its_section(rendered, section):
    after = table_numbers(rendered)
    assert section in after, f"section {section!r} has no table any more"
    lost = sorted(set(BEFORE[section]) - set(after[section]))
    assert not lost, f"{section}: {len(lost)} numbers of its tables are gone, e.g. {lost[:20]}"
