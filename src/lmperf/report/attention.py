"""Attention in PyTorch: forward and backward time (medians), the memory held for backward against
the prediction from the saved tensors, the first OOM, torch.compile against eager across sequence
lengths (host-bound calls marked and left out of the ratios), and the figure against sequence
length; the deep target's grid (fp32 and bf16, each line to its first out-of-memory case) with
that edge as a boundary against the memory model's."""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report.format import HOST_BOUND, cell, fmt, idle_text, ratio_range, stop_rule, unavailable
from lmperf.report.plot import plt, save


DEEP_STUDY = "attention_deep"  # the deep target's rows (bench/attention.py's study)


def view(inputs) -> dict:
    every = inputs.rows("attention")
    is_deep = every["study"] == DEEP_STUDY if not every.empty and "study" in every else pd.Series(False, index=every.index)
    deep_rows, df = every[is_deep], every[~is_deep]
    deep = deep_view(deep_rows, gpu_memory_gib(inputs))
    if df.empty:
        if deep["measured"]:
            return {"available": True, "standard": False, "deep": deep, "dtypes": deep["dtypes"]}
        return unavailable("no results (rule attention has not run)")
    rows = []
    center = "median" if "median" in df and df["median"].notna().any() else "mean"
    threshold = inputs.bars.get("host_bound_idle_pct", math.inf)
    for _, g in df.groupby("case_id", sort=False):
        first = g.iloc[0]
        rows.append({"impl": first["impl"], "d": int(first["head_dim"]), "N": int(first["seq_len"]),
                     "forward ms": cell(g, "forward_ms", spread=True, column=center),
                     "backward ms": cell(g, "backward_ms", spread=True, column=center),
                     "held before backward (MiB)": cell(g, "allocated_before_backward_mib"),
                     "predicted (MiB)": cell(g, "predicted_saved_mib"),
                     "forward GPU idle %": idle_text(gpu_idle(g, "forward_ms"), threshold),
                     "backward GPU idle %": idle_text(gpu_idle(g, "backward_ms"), threshold)})
    table = pd.DataFrame(rows)
    view = {"available": True, "standard": True, "deep": deep, "table": table, "center": center, "threshold": threshold,
            "table_hb": int(table[["forward GPU idle %", "backward GPU idle %"]].map(
                lambda v: isinstance(v, str) and v.endswith(HOST_BOUND)).any(axis=1).sum()),
            "dtypes": sorted(set(df["dtype"].dropna() if "dtype" in df else ["fp32"]) | set(deep.get("dtypes", []))),
            "batch": int(df["batch"].iloc[0]), "iters": int(df["iters"].iloc[0]), "max_n": int(df["seq_len"].max())}
    if "window_s" in df and df["window_s"].notna().any():  # rows of a windowed run
        view["min_iters"], view["window_s"] = int(df["min_iters"].iloc[0]), float(df["window_s"].iloc[0])
    view["stop_rule"] = stop_rule(df[(df["status"] == "ok") & df["metric"].isin(["forward_ms", "backward_ms"])])
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
    view["compiled"] = compiled_vs_eager(df, center, threshold)
    return view


def gpu_memory_gib(inputs) -> float | None:
    """The GPU's memory as the environment section recorded it (env.csv's gpu_memory_gib), None
    where there is none (a CPU run)."""
    env = inputs.frames.get("env")
    if env is None or env.empty or "key" not in env:
        return None
    value = dict(zip(env["key"], env["value"].astype(str))).get("gpu_memory_gib")
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def metric(g: pd.DataFrame, name: str, column: str = "mean") -> float:
    row = g[(g["metric"] == name) & (g["status"] == "ok")]
    return float(row[column].iloc[0]) if len(row) else math.nan


def deep_view(df: pd.DataFrame, memory_gib: float | None) -> dict:
    """The deep target's grid: {"measured", "table": a row a case (its status, times, the peak
    measured and the memory model's), "edge": a row a line (implementation, dtype, head dim) with
    the smallest N that ran out of memory, the largest that ran, and the smallest the memory
    model (lmperf.attention_memory's predicted_peak_bytes) puts over the GPU's memory, and whether
    the two agree; "disagree": the lines where they do not; "peak_ratio": the measured peak over
    the model's, {n, min, max, mean} over the cases that ran}."""
    if df.empty:
        return {"measured": False}
    from lmperf.attention_memory import ELEMENT_BYTES, predicted_peak_bytes
    center = "median" if "median" in df and df["median"].notna().any() else "mean"
    rows, edges = [], []
    for case_id, g in df.groupby("case_id", sort=False):
        first = g.iloc[0]
        rows.append({"impl": first["impl"], "dtype": first["dtype"], "d": int(first["head_dim"]),
                     "N": int(first["seq_len"]), "status": first["status"],
                     "forward ms": metric(g, "forward_ms", center), "backward ms": metric(g, "backward_ms", center),
                     "peak (MiB)": metric(g, "peak_mib"), "model's peak (MiB)": metric(g, "predicted_peak_mib"),
                     "batch": int(first["batch"]), "message": first["message"] if first["status"] != "ok" else ""})
    table = pd.DataFrame(rows)
    memory = memory_gib * 2**30 if memory_gib else None
    for (impl, dtype, d), g in table.groupby(["impl", "dtype", "d"], sort=False):
        g = g.sort_values("N")
        oom = g[g["status"] == "oom"]["N"]
        ran = g[g["status"] == "ok"]["N"]
        predicted = None
        if memory is not None:
            over = [n for n in g["N"] if predicted_peak_bytes(impl, int(g["batch"].iloc[0]), n, d, ELEMENT_BYTES[dtype]) > memory]
            predicted = int(min(over)) if over else None
        first_oom = int(oom.min()) if len(oom) else None
        edges.append({"impl": impl, "dtype": dtype, "d": int(d),
                      "largest N that ran": int(ran.max()) if len(ran) else None,
                      "first N out of memory": first_oom,
                      "model's first N over memory": predicted,
                      "agree": None if memory is None else predicted == first_oom,
                      "largest N tried": int(g[g["status"].isin(["ok", "oom"])]["N"].max())
                      if g["status"].isin(["ok", "oom"]).any() else None})
    shown_edge = pd.DataFrame([{k: ("none" if v is None else "yes" if v is True else "no" if v is False else v)
                                for k, v in e.items() if k != "largest N tried" and (k != "agree" or memory is not None)}
                               for e in edges]).astype(str)
    ratio = (table["peak (MiB)"] / table["model's peak (MiB)"]).dropna()
    shown = table.drop(columns=["batch", "message"])
    return {"measured": True, "table": shown, "edges": edges, "edge": shown_edge, "memory_gib": memory_gib,
            "dtypes": sorted(set(table["dtype"])), "batch": int(table["batch"].iloc[0]),
            "disagree": [e for e in edges if e["agree"] is False],
            "no_oom": [e for e in edges if e["first N out of memory"] is None],
            "peak_ratio": ratio_range(ratio) if len(ratio) else None}


def gpu_idle(g: pd.DataFrame, metric: str) -> float | None:
    row = g[g["metric"] == metric]
    if row.empty or "gpu_idle_pct" not in row or pd.isna(row["gpu_idle_pct"].iloc[0]):
        return None
    return float(row["gpu_idle_pct"].iloc[0])


def compiled_vs_eager(df: pd.DataFrame, center: str, threshold: float) -> dict:
    """torch.compile against eager, per (d, N) and direction: eager median / compiled median,
    shown where neither call is host-bound (else the mark); {"table", "host_bound": rows with a
    mark, per direction {n, min, max, mean} over the ratios taken and the N they cover}."""
    ok = df[(df["status"] == "ok") & df["metric"].isin(["forward_ms", "backward_ms"])]
    if not {"eager", "compiled"} <= set(ok["impl"]):
        return {}
    idle = pd.to_numeric(ok["gpu_idle_pct"], errors="coerce") if "gpu_idle_pct" in ok else pd.Series(math.nan, index=ok.index)
    ok = ok.assign(bound=idle > threshold)
    rows, taken = [], {"forward": [], "backward": []}
    for (d, n), g in ok.groupby(["head_dim", "seq_len"], sort=True):
        row = {"d": int(d), "N": int(n)}
        for direction in ("forward", "backward"):
            m = g[g["metric"] == f"{direction}_ms"].set_index("impl")
            if not {"eager", "compiled"} <= set(m.index):
                continue
            ratio = float(m.loc["eager", center] / m.loc["compiled", center])
            bound = bool(m.loc[["eager", "compiled"], "bound"].any())
            row[f"{direction}: eager / compiled"] = f"{fmt(ratio)} {HOST_BOUND}" if bound else ratio
            row[f"_{direction}"] = math.nan if bound else ratio
            if not bound:
                taken[direction].append((int(n), ratio))
        rows.append(row)
    table = pd.DataFrame(rows)
    marks = [c for c in table if c.endswith("eager / compiled")]
    out = {"table": table, "host_bound": int(table[marks].map(lambda v: isinstance(v, str)).any(axis=1).sum())}
    for direction, pairs in taken.items():
        out[direction] = {**ratio_range(pd.Series([r for _, r in pairs], dtype=float)),
                          "n_from": min((n for n, _ in pairs), default=None)}
    return out


def figures(inputs, paths: dict) -> dict[str, str]:
    """Time (forward, backward) and memory held for backward against sequence length, log-log;
    {name: why} of a figure not drawn."""
    path = paths["attention"]
    df = inputs.rows("attention")
    if not df.empty and "study" in df:  # the standard run's grid (the deep target's is a table)
        df = df[df["study"] != DEEP_STUDY]
    ok = df[df["status"] == "ok"] if not df.empty else df
    center = "median" if "median" in ok and ok["median"].notna().any() else "mean"
    panels = [("forward_ms", "forward (ms)"), ("backward_ms", "backward (ms)"),
              ("allocated_before_backward_mib", "held before backward (MiB)")]
    panels = [p for p in panels if not ok.empty and (ok["metric"] == p[0]).any()]
    if not panels:
        return {"attention": "no attention case ran ok here"}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (metric, label) in zip(axes.flat, panels):
        for (impl, d), g in ok[ok["metric"] == metric].groupby(["impl", "head_dim"]):
            g = g.sort_values("seq_len")
            ax.plot(g["seq_len"], g[center], "-" if impl == "eager" else "--", marker="o",
                    label=f"{impl} d={int(d)}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_title(label)
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(fontsize="x-small", ncol=2)
    save(fig, path)
    return {}
