"""`snakemake --report` after a run: one self-contained HTML page with the report, its figures
and the CSVs (flagged with report() in rules/*.smk, captions in rules/captions/), their
provenance, runtimes and the DAG; built here from the CPU smoke run."""
import base64
import json
import re
from pathlib import Path

from conftest import SMOKE, snakemake


def embedded(html: str) -> dict:
    """{path: result} of the results the page embeds (its `var results = {...};`, data URIs included)."""
    return json.loads(re.search(r"^\s*var results = (\{.*\});$", html, re.M)[1])


def test_snakemake_report_publishes_the_run_in_one_html_page(built_repo, tmp_path):
    """Read-only in the built repository: the page is written to tmp_path."""
    html = tmp_path / "lmperf.html"
    snakemake(built_repo, "--report", str(html), *SMOKE)
    results = embedded(html.read_text())
    report = results["report/report.md"]
    data = report["data_uri"].split(",", 1)[1]
    assert base64.b64decode(data).decode() == (built_repo / "report" / "report.md").read_text()
    assert "rendered by" in report["caption"]
    figures = {Path(p).name for p in results if p.startswith("report/figures/")}
    assert figures == {p.name for p in (built_repo / "report" / "figures").glob("*.png")} and figures
    csvs = sorted(p for p in results if p.endswith(".csv"))
    assert "results/cpu/e2e/variants/tiny.csv" in csvs
    assert len(csvs) == len(list((built_repo / "results").rglob("*.csv")))
    e2e = results["results/cpu/e2e/variants/tiny.csv"]
    assert e2e["labels"] == {"study": "variants", "model": "tiny"} and "variants" in e2e["caption"]
