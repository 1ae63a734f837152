"""Across processes: the headline cases measured again, each time in a fresh process
(`results/<hw>/repeats/`, rules/repeats.smk), beside the run of their own job. Per case and
headline metric: each process's median (the job's first), the spread of those medians across
processes, and the spread within one process (its 20%-80% range, of timed steps or of do_bench's
repeats), so that a reader sees how much of a difference between two runs one process can show."""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report import rerun
from lmperf.report.format import HOST_BOUND, unavailable

# The metrics of each section whose spread across processes the section shows: the headline
# numbers (FlashAttention's forward+backward, by the host's clock and as a CUDA graph; LRPE's
# call and kernel times; the ladder's step, tokens/s and MFU; the data-parallel step's tokens/s,
# one GPU's and several's, whose ratio is the scaling).
HEADLINE = {"flash_attention": ("fwd_bwd_ms", "fwd_bwd_gpu_ms"),
            "lrpe": ("forward_ms", "backward_ms", "forward_kernel_ms", "backward_kernel_ms"),
            "ladder": ("step_ms", "tokens_per_s", "mfu_pct"),
            "distributed": ("step_ms", "tokens_per_s")}


def relative_range(low: float, high: float, center: float) -> float:
    """(high - low) / center in %, NaN where any is missing."""
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (low, high, center)) or not center:
        return math.nan
    return 100 * (high - low) / center


def processes(job: pd.DataFrame, repeats: pd.DataFrame, metric: str) -> list[pd.Series | str | None]:
    """One entry per process, the job's first (None where the job's rows are missing) and then
    the repeats in the order they ran: its row of `metric`, or its status where the case did not
    run ok there (None where it has no such metric)."""
    def entry(rows: pd.DataFrame) -> pd.Series | str | None:
        if rows.empty:
            return None
        if (rows["status"] != "ok").any():
            return str(rows["status"][rows["status"] != "ok"].iloc[0])
        row = rows[rows["metric"] == metric]
        return None if row.empty else row.iloc[0]
    return [entry(job)] + [entry(rows) for _, rows in repeats.groupby("measured_at", sort=True)]


def spread_row(section: str, case_id: str, metric: str, measured: list, width: int,
               threshold: float = math.inf) -> dict:
    """The table's line for one case and metric, `measured` as `processes` gives it; the metric
    marked host-bound where its GPU sat idle more than `threshold` % of the call in a process."""
    rows = [m for m in measured if isinstance(m, pd.Series) and math.isfinite(float(m["median"]))]
    idle = [float(r["gpu_idle_pct"]) for r in rows if "gpu_idle_pct" in r and pd.notna(r["gpu_idle_pct"])]
    bound = bool(idle) and max(idle) > threshold
    medians = [float(r["median"]) for r in rows]
    center = float(pd.Series(medians).median()) if medians else math.nan
    within = [relative_range(float(r["q20"]), float(r["q80"]), float(r["median"])) for r in rows]
    within = [w for w in within if math.isfinite(w)]
    line = {"section": section, "case": case_id, "metric": f"{metric} {HOST_BOUND}" if bound else metric,
            "unit": rows[0]["unit"] if rows else ""}
    for i in range(width):
        label = "the job's process" if i == 0 else f"fresh process {i}"
        value = measured[i] if i < len(measured) else None
        line[label] = float(value["median"]) if isinstance(value, pd.Series) else value
    line["across processes: (max - min) / median %"] = (
        relative_range(min(medians), max(medians), center) if len(medians) > 1 else math.nan)
    line["within one process: (q80 - q20) / median %, widest"] = max(within) if within else math.nan
    line["_processes"], line["_host_bound"] = len(medians), bound
    return line


SECTION_NAMES = {"flash_attention": "FlashAttention-2", "lrpe": "LRPE-cosine", "ladder": "the ladder",
                 "distributed": "data-parallel training"}


def by_section(table: pd.DataFrame) -> list[dict]:
    """Per section: how many numbers, and the median and widest spread of their medians across
    processes (%), so that one section's many rows do not stand for another's few; and, where some
    of them are host-bound (their time the host's, which moves with the machine), how many and the
    widest spread of the others (NaN where all are host-bound)."""
    out = []
    across = "across processes: (max - min) / median %"
    for section, g in table.groupby("section", sort=False):
        a = g[across].dropna()
        if a.empty:
            continue
        widest = g.loc[a.idxmax()]
        bound = g.loc[a.index, "_host_bound"].astype(bool)
        on_gpu = a[~bound]
        out.append({"section": section, "name": SECTION_NAMES.get(section, section), "n": len(a),
                    "median_pct": float(a.median()), "max_pct": float(a.max()),
                    "widest": f"{widest['metric']} of {widest['case']}", "host_bound": int(bound.sum()),
                    "max_not_host_bound_pct": float(on_gpu.max()) if not on_gpu.empty else math.nan})
    return out


def view(inputs) -> dict:
    repeats = inputs.rows("repeats")
    fresh = rerun.view(inputs.results, inputs.bars)
    if repeats.empty:
        return unavailable(f"no {inputs.results}/repeats/ (rule repeats: config `repeats`)", fresh_machine=fresh)
    groups = list(repeats.groupby(["section", "study", "case_id"], sort=False))
    width = 1 + max(g["measured_at"].nunique() for _, g in groups)
    lines = []
    for (section, study, case_id), rep in groups:
        job = inputs.frames.get(section, pd.DataFrame())
        if not job.empty:  # the job's rows of this case, from the machine the repeats ran on
            job = job[(job["study"] == study) & (job["case_id"] == case_id)
                      & (job["hw"] == rep["hw"].iloc[0] if "hw" in job and "hw" in rep else True)]
        for metric in HEADLINE.get(section, ()):
            measured = processes(job, rep, metric)
            if any(isinstance(m, pd.Series) for m in measured):
                lines.append(spread_row(section, case_id, metric, measured, width,
                                        inputs.bars.get("host_bound_idle_pct", math.inf)))
    table = pd.DataFrame(lines)
    if table.empty:
        return unavailable("the repeats' rows hold none of the headline metrics "
                           f"({', '.join(m for ms in HEADLINE.values() for m in ms)})", fresh_machine=fresh)
    across = table["across processes: (max - min) / median %"]
    within = table["within one process: (q80 - q20) / median %, widest"]
    widest = table.loc[across.idxmax()] if across.notna().any() else None
    threshold = inputs.bars.get("host_bound_idle_pct", math.inf)
    legend = {"measured": bool(table["_host_bound"].any()), "threshold": threshold, "mark": HOST_BOUND,
              "n": int(table["_host_bound"].sum())}
    return {"available": True, "table": table, "processes": width, "fresh_machine": fresh, "host_bound": legend,
            "numbers": len(table), "complete": int((table["_processes"] == width).sum()),
            "widest": None if widest is None else {
                "case": widest["case"], "metric": widest["metric"],
                "across_pct": float(widest["across processes: (max - min) / median %"]),
                "within_pct": float(widest["within one process: (q80 - q20) / median %, widest"])},
            "across_median_pct": float(across.median()) if across.notna().any() else math.nan,
            "within_median_pct": float(within.median()) if within.notna().any() else math.nan,
            "wider_across": int((across > within).sum()),
            "by_section": by_section(table),
            "comparable": int((across.notna() & within.notna()).sum())}
