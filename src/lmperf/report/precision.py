"""Mixed precision: the accumulation experiment, the dtypes autocast gives a toy model's tensors,
and fp32 against bf16 autocast, the eager training step's medians from the end-to-end rows (every
context the end-to-end studies ran), with the host-bound steps marked and left out of the ratios."""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report.e2e import size_order, with_quantiles
from lmperf.report.format import HOST_BOUND, host_bound, idle_text, ratio_range

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
        view["errors"] = {v: float(e) for v, e in zip(acc["variant"], acc["error"])}
        auto = df[df["experiment"] == "autocast"]
        wide = auto.pivot_table(index="tensor", columns="autocast", values="dtype", aggfunc="first")
        wide = wide.reindex([t for t in AUTOCAST_ORDER if t in wide.index])
        view["autocast"] = wide.rename(columns=lambda c: f"under {c} autocast").reset_index()
        view["autocast_dtypes"] = {c: {d: [t for t in wide.index if wide.loc[t, c] == d]
                                       for d in dict.fromkeys(wide[c].dropna())} for c in wide.columns}
    if not e2e.empty:
        threshold = inputs.bars.get("host_bound_idle_pct", math.inf)
        table = dtype_speed(with_quantiles(e2e), threshold)
        if table is not None:
            view["dtype_speed"] = table
            claimed = table[table["_ratio"].notna()]
            view["dtype_speedup"] = {**ratio_range(claimed["_ratio"]),
                                     "pairs": [f"{m}, context {c:,}" for m, c in zip(claimed["model"], claimed["context"])],
                                     "host_bound": int(table["_host_bound"].sum()),
                                     "failed": [f"{m}, context {c:,}" for m, c in
                                                zip(*table.loc[table["_failed"], ["model", "context"]].T.values)],
                                     "mark": HOST_BOUND,
                                     "threshold": threshold}
    return view


def dtype_speed(e2e: pd.DataFrame, threshold: float) -> pd.DataFrame | None:
    """fp32 against bf16 autocast, eager training step: one row per (size, context) the end-to-end
    studies ran both dtypes at, each step's median (ms) and GPU idle % (marked host-bound above
    `threshold`), and fp32 median / bf16 median where neither step is host-bound; a pair with a
    host-bound step shows the mark instead of a ratio (its ratio is the host's, not the GPU's).
    `_ratio` (NaN where not taken), `_host_bound` and `_failed` are kept for the answer and tests."""
    train = e2e[(e2e["mode"] == "train") & (e2e["compile"].astype(str).str.lower() == "false")]
    # a case's step row where it ran, its first row (the status) where it did not; once per case
    cases = pd.concat([train[(train["metric"] == "step_ms") & (train["status"] == "ok")],
                       train[train["status"] != "ok"]]).drop_duplicates("case_id")
    if not {"fp32", "bf16"} <= set(cases["dtype"]):
        return None
    rows = []
    for (size, context), g in cases.groupby(["size", "context"], sort=False):
        by = {d: g[g["dtype"] == d] for d in ("fp32", "bf16")}
        if any(c.empty for c in by.values()):
            continue
        row = {"model": size, "context": int(context)}
        bound, failed, median = False, False, {}
        for d, c in by.items():
            r = c.iloc[0]
            if r["status"] != "ok":
                row[f"{d} step ms"], failed = r["status"], True
                continue
            median[d] = float(r["median"]) if pd.notna(r.get("median")) else float(r["mean"])
            row[f"{d} step ms"] = median[d]
            idle = float(r["gpu_idle_pct"]) if "gpu_idle_pct" in r and pd.notna(r["gpu_idle_pct"]) else None
            row[f"{d} GPU idle %"] = idle_text(idle, threshold)
            bound |= bool(host_bound(c.iloc[:1], threshold).iloc[0])
        ratio = median["fp32"] / median["bf16"] if len(median) == 2 else math.nan
        row["speed-up (fp32 / bf16)"] = ("" if failed else f"{HOST_BOUND} host-bound" if bound else ratio)
        row.update(_ratio=math.nan if bound or failed else ratio, _host_bound=bound and not failed,
                   _failed=failed, _fp32=median.get("fp32", math.nan), _bf16=median.get("bf16", math.nan))
        rows.append(row)
    if not rows:
        return None
    out = pd.DataFrame(rows)
    order = {s: i for i, s in enumerate(size_order(e2e))}
    return out.sort_values(["model", "context"], key=lambda c: c.map(order) if c.name == "model" else c,
                           kind="stable").reset_index(drop=True)
