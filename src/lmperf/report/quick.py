"""The quick scale's distance from the full run: a quick run (config `scale: quick`) measures only
the cases of the report's summary, with fewer timed steps, into results/<hw>-quick/; its report
(report/quick/report.md) opens with how far its numbers lie from the full run's in results/<hw>/,
judged row by row by lmperf.compare (the full run as A, the quick one as B), whose page is
report/compare/<hw>_vs_<hw>-quick.md. Where either run has no rows, it says so."""
from __future__ import annotations

from pathlib import Path

from lmperf import stats
from lmperf.report import rerun
from lmperf.workflow import QUICK_SUFFIX


def full_folder(results: Path) -> Path:
    """The full run's folder beside a quick run's: results/<hw> for results/<hw>-quick."""
    return Path(results).parent / Path(results).name.removesuffix(QUICK_SUFFIX)


def view(results: Path, scale: str, bars: dict) -> dict | None:
    """None below the quick scale; else the comparison's counts and spread ({"measured": False,
    "why": ...} where there is nothing to compare)."""
    if scale != "quick":
        return None
    results, full = Path(results), full_folder(results)
    out = {"full": f"results/{full.name}", "quick": f"results/{results.name}",
           "page": f"compare/{full.name}_vs_{results.name}.md",
           "command": f"snakemake --cores 1 report/compare/{full.name}_vs_{results.name}.md"}
    if full == results or not full.is_dir():
        return {**out, "measured": False, "why": f"there is no full run in `{out['full']}/` to compare with"}
    from lmperf import compare, compare_page  # pandas and numpy: only for a quick report
    a, b = compare.load(full), compare.load(results)
    if b.empty or a.empty:
        return {**out, "measured": False, "why": f"`{out['quick'] if b.empty else out['full']}/` has no rows yet"}
    result, gpu, host, differ = rerun.judged(a, b, bars)
    if not len(gpu):
        return {**out, "measured": False, "why": "the two runs share no timing row that is not host-bound"}
    apart = 100 * (gpu["ratio"].astype(float) - 1).abs()
    return {**out, "measured": True, "hardware": result["hardware"],
            "threshold": compare_page.pct(result["threshold"]),
            "rows": len(gpu), "agree": int((gpu["verdict"] == stats.SAME).sum()),
            "host_rows": len(host),
            "median_pct": float(apart.median()), "max_pct": float(apart.max()),
            "largest": compare_page.largest(differ) if len(differ) else ""}
