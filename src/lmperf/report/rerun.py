"""On a fresh machine: the headline jobs run again from a fresh copy of the repository on a
fresh machine of the same GPU, into results/<hw>-rerun/ (README, "Comparing two runs"), and
judged row by row against results/<hw>/ by lmperf.compare, whose page is
report/compare/<hw>_vs_<hw>-rerun.md. The "Across processes" section shows the count of rows
that agree; the page has every row."""
from __future__ import annotations

from pathlib import Path

from lmperf import stats

SUFFIX = "-rerun"


def folder(results: Path) -> Path:
    return Path(results).parent / f"{Path(results).name}{SUFFIX}"


def values(df, column: str) -> str:
    return ", ".join(sorted(set(df[column].dropna().astype(str)))) if column in df else "n/a"


def judged(a, b, bars: dict) -> tuple[dict, object, object, object]:
    """lmperf.compare of run A against run B: (its result, the timing rows that are not
    host-bound, those that are, the former whose verdict is not "same")."""
    from lmperf import compare  # pandas and numpy: only where there is a second run
    result = compare.compare(a, b, host_bound_pct=bars.get("host_bound_idle_pct", compare.HOST_BOUND_IDLE_PCT))
    rows = result["rows"]
    timing = rows[rows["kind"].isin(["time", "rate"])
                  & rows["verdict"].isin([stats.SAME, stats.FASTER, stats.SLOWER])]
    gpu, host = timing[~timing["host_bound"]], timing[timing["host_bound"]]
    return result, gpu, host, gpu[gpu["verdict"] != stats.SAME]


def view(results: Path, bars: dict) -> dict | None:
    """The comparison's counts, or None where there is no rerun folder beside `results`."""
    rerun = folder(results)
    if not rerun.is_dir():
        return None
    from lmperf import compare, compare_page  # pandas and numpy: only where there is a rerun
    a, b = compare.load(results), compare.load(rerun)
    result, gpu, host, differ = judged(a, b, bars)
    jobs = sorted(set(b["section"] + "/" + b["study"]))
    return {"folder": f"results/{rerun.name}", "page": f"compare/{Path(results).name}_vs_{rerun.name}.md",
            "hardware": result["hardware"], "gpu": values(b, "gpu"), "commit": values(b, "commit"),
            "measured": values(b.assign(day=b["measured_at"].astype(str).str[:10]), "day"),
            "jobs": ", ".join(jobs), "cases": len(b.drop_duplicates(["section", "study", "case_id"])), "threshold": compare_page.pct(result["threshold"]),
            "host_bound_pct": result["host_bound_pct"],
            "gpu_rows": len(gpu), "gpu_agree": int((gpu["verdict"] == stats.SAME).sum()),
            "host_rows": len(host), "host_agree": int((host["verdict"] == stats.SAME).sum()),
            "largest": compare_page.largest(differ) if len(differ) else ""}
