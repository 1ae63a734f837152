"""Kernel-level profile: per case, each phase's share of matmul / softmax / other, its top
kernels, and attention's parts against their FLOPs."""
from __future__ import annotations

import pandas as pd

from lmperf.report.format import ratio_range, unavailable

PHASES = ("forward", "backward", "optimizer")
# PyTorch's copy kernels (at::native's direct_copy_kernel_cuda, bfloat16_copy_kernel_cuda, ...):
# dtype casts (autocast's fp32 <-> bf16) and layout copies, inside the "other" category.
COPY = r"copy_kernel"


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
    copies = kernels[kernels["kernel"].str.contains(COPY)].groupby("phase")["share"].sum()
    top = kernels.loc[kernels.groupby("phase")["mean"].idxmax()].set_index("phase")["kernel"]
    first = g.iloc[0]
    return {"name": f"{first['size']}, context {int(first['context'])}, {first['dtype']}", "dtype": first["dtype"],
            "copy_share": {p: float(copies.get(p, 0.0)) for p in shares.index},
            "top_is_copy": {p: bool(pd.Series([top[p]]).str.contains(COPY).iloc[0]) for p in shares.index},
            "other_share": {p: float(shares.loc[p, "other"]) for p in shares.index} if "other" in shares else {},
            "shares": share_table, "tops": tops, "attention": attention,
            "matmul_share": {p: float(shares.loc[p, "matmul"]) for p in shares.index} if "matmul" in shares else {}}


def view(inputs, top: int = 10) -> dict:
    df = inputs.rows("profile")
    if df.empty:
        return unavailable("no results (rule profile has not run)")
    ok = df[df["status"] == "ok"]
    cases = [case_view(g, top) for _, g in ok.groupby("case_id", sort=False)]
    failed = df.drop_duplicates("case_id")
    return {"available": True, "cases": cases, "takeaway": takeaway(cases), "steps": int(df["profiled_steps"].iloc[0]),
            "on_gpu": bool((df["gpu"] != "none").any()),
            "failures": failed[failed["status"] != "ok"][["case_id", "status", "message"]]}


def takeaway(cases: list[dict]) -> dict[str, dict]:
    """Per dtype, over its cases' forward and backward phases (percent of the phase's kernel
    time): the matmul, "other" and copy-kernel shares ({n, min, max, mean}), and in how many of
    those phases the largest kernel is a copy."""
    out = {}
    for dtype in dict.fromkeys(c["dtype"] for c in cases):
        mine = [c for c in cases if c["dtype"] == dtype]
        share = lambda key: ratio_range(pd.Series([100 * c[key][p] for c in mine for p in ("forward", "backward")
                                                   if p in c[key]], dtype=float))
        tops = [c["top_is_copy"][p] for c in mine for p in ("forward", "backward") if p in c["top_is_copy"]]
        out[dtype] = {"matmul": share("matmul_share"), "other": share("other_share"), "copies": share("copy_share"),
                      "top_copy": sum(tops), "phases": len(tops)}
    return out
