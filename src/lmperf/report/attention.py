"""Attention in PyTorch: forward and backward time, the memory held for backward against the
prediction from the saved tensors, the first OOM, and the figure against sequence length."""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report.format import cell, unavailable
from lmperf.report.plot import plt, save


def view(inputs) -> dict:
    df = inputs.rows("attention")
    if df.empty:
        return unavailable("no results (rule attention has not run)")
    rows = []
    for _, g in df.groupby("case_id", sort=False):
        first = g.iloc[0]
        rows.append({"impl": first["impl"], "d": int(first["head_dim"]), "N": int(first["seq_len"]),
                     "forward ms": cell(g, "forward_ms", spread=True),
                     "backward ms": cell(g, "backward_ms", spread=True),
                     "held before backward (MiB)": cell(g, "allocated_before_backward_mib"),
                     "predicted (MiB)": cell(g, "predicted_saved_mib")})
    view = {"available": True, "table": pd.DataFrame(rows),
            "batch": int(df["batch"].iloc[0]), "iters": int(df["iters"].iloc[0])}
    if "window_s" in df and df["window_s"].notna().any():  # rows of a windowed run
        view["min_iters"], view["window_s"] = int(df["min_iters"].iloc[0]), float(df["window_s"].iloc[0])
    cases = df.drop_duplicates("case_id")
    oom = cases[cases["status"] == "oom"].sort_values(["seq_len", "head_dim"])
    view["first_oom"] = ({"impl": oom.iloc[0]["impl"], "d": int(oom.iloc[0]["head_dim"]),
                          "N": int(oom.iloc[0]["seq_len"])} if len(oom) else None)
    held = df[(df["metric"] == "allocated_before_backward_mib") & (df["status"] == "ok")
              & (df["impl"] == "eager")].sort_values("seq_len")
    if held["seq_len"].nunique() >= 2:
        per_n = held.groupby("seq_len")["mean"].max()
        n0, n1 = per_n.index[-2], per_n.index[-1]
        view["growth"] = {"n0": int(n0), "n1": int(n1),
                          "exponent": math.log(per_n[n1] / per_n[n0]) / math.log(n1 / n0)}
    return view


def figures(inputs, paths: dict) -> dict[str, str]:
    """Time (forward, backward) and memory held for backward against sequence length, log-log;
    {name: why} of a figure not drawn."""
    path = paths["attention"]
    df = inputs.rows("attention")
    ok = df[df["status"] == "ok"] if not df.empty else df
    panels = [("forward_ms", "forward (ms)"), ("backward_ms", "backward (ms)"),
              ("allocated_before_backward_mib", "held before backward (MiB)")]
    panels = [p for p in panels if not ok.empty and (ok["metric"] == p[0]).any()]
    if not panels:
        return {"attention": "no attention case ran ok here"}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (metric, label) in zip(axes.flat, panels):
        for (impl, d), g in ok[ok["metric"] == metric].groupby(["impl", "head_dim"]):
            g = g.sort_values("seq_len")
            ax.plot(g["seq_len"], g["mean"], "-" if impl == "eager" else "--", marker="o",
                    label=f"{impl} d={int(d)}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_title(label)
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(fontsize="x-small", ncol=2)
    save(fig, path)
    return {}
