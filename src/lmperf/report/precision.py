"""Mixed precision: the accumulation experiment, the dtypes autocast gives a toy model's tensors,
and fp32 against bf16 step times from the end-to-end rows."""
from __future__ import annotations

import pandas as pd

from lmperf.report.e2e import size_order

AUTOCAST_ORDER = ["parameters", "fc1 output", "LayerNorm output", "logits", "loss", "gradients"]


def view(inputs) -> dict:
    df, e2e = inputs.rows("precision"), inputs.rows("e2e")
    view = {"available": not df.empty}
    if df.empty:
        view["why"] = "no results (rule precision has not run)"
    else:
        acc = df[df["case_id"] == "accumulation"]
        n, x = int(acc["additions"].iloc[0]), float(acc["addend"].iloc[0])
        view["experiment"] = {"additions": n, "addend": x, "exact": n * x}
        # `exact` is the float's repr as written by the bench; the error keeps its sign.
        view["accumulation"] = pd.DataFrame({"variant": acc["variant"],
                                             f"sum of {n:,} x {x:g}": acc["exact"].astype(str),
                                             f"error vs {n * x:g}": acc["error"].map(lambda e: f"{e:+.6g}")})
        auto = df[df["experiment"] == "autocast"]
        wide = auto.pivot_table(index="tensor", columns="autocast", values="dtype", aggfunc="first")
        wide = wide.reindex([t for t in AUTOCAST_ORDER if t in wide.index])
        view["autocast"] = wide.rename(columns=lambda c: f"under {c} autocast").reset_index()
    if not e2e.empty:
        v = e2e[(e2e["study"] == "variants") & (e2e["metric"] == "step_ms") & (e2e["status"] == "ok")
                & (e2e["mode"] == "train") & (e2e["compile"].astype(str).str.lower() == "false")]
        p = v.pivot_table(index="size", columns="dtype", values="mean")
        if {"fp32", "bf16"} <= set(p.columns):
            p = p.reindex([s for s in size_order(e2e) if s in p.index])
            view["dtype_speed"] = pd.DataFrame({"model": p.index, "fp32 step ms": p["fp32"],
                                                "bf16 step ms": p["bf16"],
                                                "speed-up (fp32 / bf16)": p["fp32"] / p["bf16"]})
    return view
