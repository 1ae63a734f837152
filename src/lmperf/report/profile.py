"""Kernel-level profile: per case, each phase's share of matmul / softmax / other, its top
kernels, attention's parts against their FLOPs (softmax against the two matmuls around it), and
the profiler's kernel time of each phase against the Python timer's time of the same phase in the
end-to-end rows (the same case: size, context, dtype, eager training step)."""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report.format import HOST_BOUND, idle_text, ratio_range, unavailable

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
    softmax = softmax_table(cases)
    timer = timer_table(ok, inputs.frames.get("e2e", pd.DataFrame()), inputs.bars.get("host_bound_idle_pct", math.inf))
    return {"available": True, "cases": cases, "takeaway": takeaway(cases), "steps": int(df["profiled_steps"].iloc[0]),
            "softmax": softmax, "softmax_answer": softmax_answer(softmax), "timer": timer,
            # the legend under the timer table: its rows whose end-to-end step is host-bound
            "timer_hb": {"measured": True, "mark": HOST_BOUND, "threshold": inputs.bars.get("host_bound_idle_pct", math.inf),
                         "n": int(timer["_host_bound"].sum()) if not timer.empty else 0},
            "timer_answer": {**(ratio_range(timer["_share"]) if not timer.empty else {"n": 0}),
                             "not_bound": ratio_range(timer.loc[~timer["_host_bound"], "_share"]) if not timer.empty
                             else {"n": 0}},
            "on_gpu": bool((df["gpu"] != "none").any()),
            "failures": failed[failed["status"] != "ok"][["case_id", "status", "message"]]}


def softmax_table(cases: list[dict]) -> pd.DataFrame:
    """Per profiled case: attention's softmax against its two matmuls (scores Q K^T, values P V),
    kernel time a step (us) and FLOPs: softmax's time over the slower matmul's, and the matmuls'
    FLOPs over softmax's. `_ratio`, `_flops` are kept for the answer and tests."""
    rows = []
    for c in cases:
        a = c["attention"].set_index("part") if not c["attention"].empty else None
        parts = {k: f"attention.{k}" for k in ("scores", "softmax", "values")}
        if a is None or not all(p in a.index for p in parts.values()):
            continue
        us = {k: float(a.loc[p, "us / step"]) for k, p in parts.items()}
        gflop = {k: float(a.loc[p, "GFLOP"]) for k, p in parts.items()}
        ratio = us["softmax"] / max(us["scores"], us["values"])
        flops = min(gflop["scores"], gflop["values"]) / gflop["softmax"] if gflop["softmax"] else math.nan
        rows.append({"case": c["name"], "scores us": us["scores"], "softmax us": us["softmax"],
                     "values us": us["values"], "softmax / slower matmul (time)": ratio,
                     "matmul / softmax (FLOPs)": flops, "_ratio": ratio, "_flops": flops})
    return pd.DataFrame(rows)


def softmax_answer(table: pd.DataFrame) -> dict:
    """In how many cases softmax takes longer than either matmul, over how many, with the time
    and FLOP ratios of those cases ({n, min, max, mean} each)."""
    if table.empty:
        return {"n": 0, "of": 0}
    more = table[table["_ratio"] > 1]
    return {"n": len(more), "of": len(table), "cases": list(more["case"]), "time": ratio_range(more["_ratio"]),
            "flops": ratio_range(more["_flops"])}


E2E_PHASES = {"forward": "forward_ms", "backward": "backward_ms", "optimizer": "optimizer_ms"}


def timer_table(ok: pd.DataFrame, e2e: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Per profiled case and phase: the profiler's kernel time (ms a step, summed over the
    phase's kernels) against the Python timer's median of the same phase in the end-to-end rows
    (the same size, context and dtype; eager training step), their ratio, and the end-to-end
    step's GPU idle % (marked host-bound above `threshold`). Empty without end-to-end rows."""
    if e2e.empty or "metric" not in e2e:
        return pd.DataFrame()
    e2e = e2e[(e2e["status"] == "ok") & (e2e["mode"] == "train") & (e2e["compile"].astype(str).str.lower() == "false")]
    if "warmup" in e2e:  # the settled steps: the most warm-up steps the case ran with
        e2e = e2e[e2e["warmup"] == e2e.groupby(["size", "context", "dtype"])["warmup"].transform("max")]
    rows = []
    kernels = ok[ok["metric"] == "kernel_us_per_step"]
    for (size, context, dtype), g in kernels.groupby(["size", "context", "dtype"], sort=False):
        wall = e2e[(e2e["size"] == size) & (e2e["context"] == context) & (e2e["dtype"] == dtype)]
        if wall.empty:
            continue
        step = wall[wall["metric"] == "step_ms"]
        idle = float(step["gpu_idle_pct"].iloc[0]) if "gpu_idle_pct" in step and len(step) and pd.notna(step["gpu_idle_pct"].iloc[0]) else None
        for phase, metric in E2E_PHASES.items():
            timer = wall[wall["metric"] == metric]
            kernel_ms = g[g["phase"] == phase]["mean"].sum() / 1e3
            if timer.empty or not kernel_ms:
                continue
            center = timer["median"] if "median" in timer and timer["median"].notna().any() else timer["mean"]
            t = float(center.iloc[0])
            rows.append({"case": f"{size}, context {int(context)}, {dtype}", "phase": phase,
                         "kernel ms (profiler)": kernel_ms, "timer ms (Python, median)": t,
                         "kernel / timer": kernel_ms / t, "step GPU idle %": idle_text(idle, threshold),
                         "_share": kernel_ms / t, "_host_bound": idle is not None and idle > threshold})
    return pd.DataFrame(rows)


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
