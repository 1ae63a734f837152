"""Kernel-level profile: per case, each phase's share of matmul / softmax / other, its top
kernels, and attention's parts against their FLOPs."""
from __future__ import annotations

import pandas as pd

from lmperf.report.format import unavailable

PHASES = ("forward", "backward", "optimizer")


def shorten(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def case_view(g: pd.DataFrame, top: int) -> dict:
    kernels = g[g["metric"] == "kernel_us_per_step"].copy()
    kernels["share"] = kernels["mean"] / kernels.groupby("phase")["mean"].transform("sum")
    shares = kernels.pivot_table(index="phase", columns="category", values="share", aggfunc="sum")
    shares = shares.reindex([p for p in PHASES if p in shares.index]).fillna(0.0)
    phase_ms = kernels.groupby("phase")["mean"].sum() / 1e3
    share_table = pd.DataFrame({"phase": shares.index, "phase ms": [phase_ms[p] for p in shares.index],
                                **{f"{c} share %": 100 * shares[c].values for c in shares.columns}})
    tops = []
    for phase in shares.index:
        t = kernels[kernels["phase"] == phase].nlargest(top, "mean")
        tops.append({"phase": phase, "table": pd.DataFrame({
            "kernel": t["kernel"].map(shorten), "calls / step": t["calls_per_step"].astype(float),
            "us / step": t["mean"], "share of phase %": 100 * t["share"], "category": t["category"]})})
    parts = g[g["metric"] == "attention_part_us_per_step"]
    attention = pd.DataFrame({"part": parts["kernel"], "us / step": parts["mean"],
                              "GFLOP": parts["flops"] / 1e9, "TFLOP/s": parts["tflops"]})
    first = g.iloc[0]
    return {"name": f"{first['size']}, context {int(first['context'])}, {first['dtype']}",
            "shares": share_table, "tops": tops, "attention": attention,
            "matmul_share": {p: float(shares.loc[p, "matmul"]) for p in shares.index} if "matmul" in shares else {}}


def view(inputs, top: int = 10) -> dict:
    df = inputs.rows("profile")
    if df.empty:
        return unavailable("no results (rule profile has not run)")
    ok = df[df["status"] == "ok"]
    cases = [case_view(g, top) for _, g in ok.groupby("case_id", sort=False)]
    failed = df.drop_duplicates("case_id")
    return {"available": True, "cases": cases, "steps": int(df["profiled_steps"].iloc[0]),
            "on_gpu": bool((df["gpu"] != "none").any()),
            "failures": failed[failed["status"] != "ok"][["case_id", "status", "message"]]}
