"""Correctness: the `check` rows of every kernel (against float64; the master-weight AdamW also
against PyTorch's fused AdamW under autocast), one line per kernel and dtype, with the worst
error against its tolerance; a user's contenders apart, judged by the course's contract first and
lmperf's wider one as properties (`contender_checks`)."""
from __future__ import annotations

import pandas as pd

from lmperf import catalog
from lmperf.report.contender_contract import LABELS, LEGACY, verdicts

KERNEL_SECTIONS = tuple(s.name for s in catalog.SECTIONS if s.kernel)  # as declared (lmperf.catalog)


def view(inputs) -> dict:
    lines, skipped, failures = [], [], []
    for section in KERNEL_SECTIONS:
        df = inputs.rows(section, "check") if section in inputs.frames else None
        if df is None or df.empty:
            continue
        for (impl, dtype), g in df[df["status"] == "ok"].groupby(["impl", "dtype"], sort=False):
            # error / tolerance, 0 for an exact check (a count of mismatches) that found none
            ratio = (g["mean"] / g["tolerance"]).where(g["mean"] != 0, 0.0)
            worst = g.loc[ratio.idxmax()]
            passed = g["passed"].astype(str).str.lower() == "true"
            lines.append({"kernel": f"{section} / {impl}", "dtype": dtype,
                          "cases": g["case_id"].nunique(), "checks passed": f"{int(passed.sum())}/{len(g)}",
                          "_passed": int(passed.sum()), "_checks": len(g),
                          "worst error / tolerance": ratio.max(),
                          "worst error": worst["mean"], "its tolerance": worst["tolerance"],
                          "where": f"{worst['metric'].replace('_max_abs_err', '')} {worst['case_id']}",
                          "result": "pass" if passed.all() else "FAIL"})
            failures += [{"section": section, "case_id": r.case_id, "metric": r.metric,
                          "error": r.mean, "tolerance": r.tolerance} for r in g[~passed].itertuples()]
        for (impl, dtype, status, message), g in df[df["status"] != "ok"].groupby(
                ["impl", "dtype", "status", "message"], sort=False):
            skipped.append({"kernel": f"{section} / {impl}", "dtype": dtype, "status": status,
                            "cases": g["case_id"].nunique(), "why": message})
    table = pd.DataFrame(lines)
    return {"available": bool(lines or skipped), "table": table, "contenders": contender_checks(inputs),
            "skipped": pd.DataFrame(skipped), "failures": failures,
            "all_pass": bool(lines) and not failures,
            # what the report's summary quotes
            "n_checks": int(table["_checks"].sum()) if lines else 0,
            "n_passed": int(table["_passed"].sum()) if lines else 0,
            "n_kernels": table["kernel"].str.split(" / ").str[0].nunique() if lines else 0,
            "worst_ratio": float(table["worst error / tolerance"].max()) if lines else None,
            "n_skipped": int(sum(s["cases"] for s in skipped))}


def contender_checks(inputs) -> pd.DataFrame:
    """A user's contenders' float64 checks (results/<hw>/contenders/, lmperf.contenders), kept apart
    from our kernels' counts: one line per attention implementation and dtype, judged by the
    course's contract first (report/contender_contract.py): its verdict in that dtype, its cases
    at the course's shapes passed, their worst error against the course's tolerance (rtol = atol =
    1e-2), then the properties of lmperf's wider contract that failed there, and the
    implementation's verdict over every dtype with its reason (wrong on the course's contract in
    one dtype, or caught returning a cached result, it is wrong everywhere)."""
    rows = inputs.frames.get("contenders", pd.DataFrame())
    lines = []
    for v in verdicts(rows).values():
        if v.course == "not implemented":
            continue
        for d in v.by_dtype:
            lines.append({"contender": v.provider, "dtype": d["dtype"], "course's contract": d["course"],
                          "course checks passed": (f"{d['passed']}/{d['run']}" + (LEGACY if v.passed is None else ""))
                          if d["run"] else "none ran",
                          "worst error / course tolerance": d["worst_ratio"],
                          "properties failed": ", ".join(LABELS[p] for p in d["failed"]) or "none",
                          "implementation's verdict": v.course,
                          "why": v.why_course() if v.course == "WRONG" else ""})
    return pd.DataFrame(lines)
