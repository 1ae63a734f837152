"""End-to-end Transformer timings: the ladder (one change a rung, with its bars, floors and FLOP
counts), the variants (dtype x compile), warm-up and context studies of `results/<hw>/e2e/`, and
their figures. One module of ~330 lines, as bench/e2e.py is one section: the four studies share
the row schema, the MFU and floor arithmetic and one figure style, and the report rule reruns
only the report when it changes."""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report.format import bar, cell, fmt, ratio_range, unavailable
from lmperf.report.plot import empty, plt, save

CASE_KEYS = ["size", "context", "dtype", "compile", "mode", "warmup"]
# Metrics shown as mean ± std over the timed steps; the rest show the mean alone.
SPREAD_METRICS = {"forward_ms", "backward_ms", "optimizer_ms", "step_ms"}


def size_order(df: pd.DataFrame) -> list[str]:
    """Model sizes from smallest to largest, by their parameter counts in the results."""
    params = df[df["metric"] == "parameters"].groupby("size")["mean"].first()
    sizes = list(dict.fromkeys(df["size"]))
    return sorted(sizes, key=lambda s: params.get(s, math.inf))


def wide(df: pd.DataFrame, metrics: dict[str, str]) -> pd.DataFrame:
    """One row per case: its keys, then each metric's value (a Spread for the phase times, the
    status for a case that did not run)."""
    metrics = {m: label for m, label in metrics.items() if m in set(df["metric"])}
    out = []
    for _, g in df.groupby("case_id", sort=False):
        row = {k: g.iloc[0][k] for k in CASE_KEYS}
        for metric, label in metrics.items():
            row[label] = cell(g, metric, spread=metric in SPREAD_METRICS)
        out.append(row)
    return pd.DataFrame(out)


def metric_frame(df: pd.DataFrame, metric: str) -> pd.Series:
    """Means of one metric of the ok cases, indexed by the case keys."""
    return df[(df["metric"] == metric) & (df["status"] == "ok")].set_index(CASE_KEYS)["mean"]


def ordered(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["compile"] = df["compile"].astype(str).str.lower().map({"true": "compiled", "false": "eager"})
    order = {"size": {s: i for i, s in enumerate(size_order(df))},
             "dtype": {"fp32": 0, "bf16": 1}, "compile": {"eager": 0, "compiled": 1}}
    return df.sort_values(by=CASE_KEYS, kind="stable",
                          key=lambda col: col.map(order[col.name]) if col.name in order else col)


def precision(df: pd.DataFrame) -> pd.Series:
    """The peak each row's MFU is against: its dtype, or 'tf32' for fp32 with TF32 matmuls."""
    tf32 = df["tf32"].astype(str).str.lower().eq("true") if "tf32" in df else pd.Series(False, index=df.index)
    return df["dtype"].where(~(tf32 & df["dtype"].eq("fp32")), "tf32")


def peaks(mfu: pd.DataFrame) -> dict[str, float]:
    """{dtype: peak TFLOP/s} the MFU rows were computed against (the `peak_tflops` column)."""
    if mfu.empty or "peak_tflops" not in mfu:
        return {}
    return {d: float(p) for d, p in mfu.groupby(precision(mfu))["peak_tflops"].first().items()}


def view(inputs) -> dict:
    df = inputs.rows("e2e")
    if df.empty:
        return unavailable("no end-to-end results (rule e2e_study has not run)")
    df = ordered(df)
    view = {"available": True, "studies": sorted(df["study"].unique())}
    cases = df.drop_duplicates(["study", "case_id"])  # one case id can be in several studies
    view["n_cases"] = len(cases)
    failed = cases[cases["status"] != "ok"][["study", "case_id", "status", "message"]].copy()
    failed["message"] = [m if len(m) <= 110 else m[:110] + "…" for m in failed["message"].astype(str)]
    view["failures"] = failed
    view["n_failures"] = len(failed)
    studies = cases[cases["study"] != "ladder"] if (cases["study"] != "ladder").any() else cases
    view["batch_size"] = int(studies["batch_size"].iloc[0])
    view["timed_steps"] = int(studies["timed_steps"].iloc[0])
    mfu = df[(df["metric"] == "mfu_pct") & (df["status"] == "ok")]
    view["has_mfu"] = not mfu.empty
    view["peaks"] = peaks(mfu)
    if not mfu.empty:
        best = mfu.loc[mfu["mean"].idxmax()]
        view["best_mfu"] = {"value": float(best["mean"]), **{k: best[k] for k in CASE_KEYS}}
    studies = df[df["study"] != "ladder"]
    view["optimizers"] = sorted(set((studies["optimizer"] if "optimizer" in studies else pd.Series(dtype=str))
                                    .fillna("foreach")) or {"foreach"})
    view.update(ladder(df[df["study"] == "ladder"], inputs.bars.get("e2e", {})))
    view.update(variants(df[df["study"] == "variants"]))
    view.update(warmup(df[df["study"] == "warmup"]))
    view.update(context(df[df["study"] == "context"]))
    return view


LADDER_METRICS = {"forward_ms": "forward ms", "backward_ms": "backward ms", "optimizer_ms": "optimizer ms",
                  "step_ms": "step ms", "tokens_per_s": "tokens/s", "mfu_pct": "MFU %",
                  "peak_allocated_mib": "peak MiB"}


def ladder_rungs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (size, rung): what changed, its settings, and its metrics (or its status)."""
    out = []
    for _, g in df[df["name"] != "floors"].groupby("case_id", sort=False):
        first = g.iloc[0]
        ok = first["status"] == "ok"
        row = {"size": first["size"], "rung": int(first["rung"]), "change": first["change"],
               "context": int(first["context"]), "batch": batch_text(g), "attention": first["attention_backend"] if ok and
               isinstance(first.get("attention_backend"), str) else first["attention"],
               "AdamW": first["optimizer"],
               "checkpointed": _count(cell(g, "checkpointed_blocks")) if ok else None}
        for metric, label in LADDER_METRICS.items():
            row[label] = cell(g, metric, spread=metric in SPREAD_METRICS)
        # one profiled step's kernel time against the timed step (GPU only: blank elsewhere)
        kernels, step, attention = (cell(g, m) for m in ("step_kernel_ms", "step_ms", "step_attention_kernel_ms"))
        busy = isinstance(kernels, float) and isinstance(step, float) and step > 0
        row["GPU busy %"] = 100 * kernels / step if busy else None
        row["attention kernels ms"] = attention if isinstance(attention, float) else None
        row["_name"], row["_attention"] = first["name"], first["attention"]
        row["_status"] = first["status"]
        out.append(row)
    table = pd.DataFrame(out)
    return table.drop(columns=[c for c in ("GPU busy %", "attention kernels ms")
                               if c in table and table[c].isna().all()])


def timed_batch(g: pd.DataFrame) -> tuple[int, int]:
    """(micro-batch size, micro-batches a step) of a rung's timed steps: from its step_ms row
    (a rung that chooses its micro-batch by memory has trial rows of other sizes), else its
    first row."""
    timed = g[g["metric"] == "step_ms"]
    r = (timed if len(timed) else g).iloc[0]
    k = r.get("micro_batches", 1)
    return int(r["batch_size"]), int(k) if pd.notna(k) else 1


def batch_text(g: pd.DataFrame) -> str:
    """Sequences a step: "4", or "16 = 8 x 2" (micro-batches x their size)."""
    b, k = timed_batch(g)
    return f"{b}" if k == 1 else f"{b * k} = {k} x {b}"


def _busy(rungs: pd.DataFrame, size: str, name: str) -> float:
    """A rung's "GPU busy %" from the ladder table (NaN where not profiled on a GPU)."""
    if "GPU busy %" not in rungs:
        return math.nan
    x = rungs[(rungs["size"] == size) & (rungs["_name"] == name)]["GPU busy %"]
    return float(x.iloc[0]) if len(x) and pd.notna(x.iloc[0]) else math.nan


def _count(x) -> int | None:
    return int(x) if isinstance(x, float) and math.isfinite(x) else None


def _value(df: pd.DataFrame, case_id: str, metric: str) -> float:
    r = df[(df["case_id"] == case_id) & (df["metric"] == metric) & (df["status"] == "ok")]["mean"]
    return float(r.iloc[0]) if len(r) else math.nan


def ladder(df: pd.DataFrame, limits: dict) -> dict:
    """The ladder per size: its rungs, the device rates, the best rung with its phase floors,
    FlopCounterMode's count beside the closed form, and the issue's bars."""
    if df.empty:
        return {}
    df = df.assign(rung=df["rung"].astype(int)).sort_values(["rung"], kind="stable")
    rungs = ladder_rungs(df)
    out = {"ladder": rungs, "ladder_sizes": [s for s in size_order(df) if s in set(rungs["size"])]}
    ok = df[df["status"] == "ok"]
    rates = ok[ok["name"] == "floors"]
    out["ladder_rates"] = {size: {m: float(v) for m, v in g.set_index("metric")["mean"].items()
                                  if m in ("copy_gb_per_s", "bf16_matmul_tflops")}
                           for size, g in rates.groupby("size")}
    # The best rung is the fastest (tokens/s): MFU is against each rung's own dtype peak (fp32
    # eager against 67 TFLOP/s, bf16 against 989), so it does not rank rungs of different dtypes.
    key = "tokens_per_s"
    best, floors, flops = {}, [], []
    for size, g in ok[ok["name"] != "floors"].groupby("size", sort=False):
        score = g[g["metric"] == key].set_index("case_id")["mean"]
        if score.empty:
            continue
        case_id = score.idxmax()
        first = g[g["case_id"] == case_id].iloc[0]
        assignment = g[g["name"] == "compiled"]["case_id"]
        tokens = _value(g, case_id, "tokens_per_s")
        batch_size, micro_batches = timed_batch(g[g["case_id"] == case_id])
        best[size] = {"rung": int(first["rung"]), "change": first["change"], "context": int(first["context"]),
                      "batch_size": batch_size, "warmup": int(first["warmup"]), "micro_batches": micro_batches,
                      "timed_steps": int(first["timed_steps"]),
                      "attention": first["attention"], "backend": first.get("attention_backend"),
                      "optimizer": first["optimizer"], "mfu": _value(g, case_id, "mfu_pct"),
                      "step_ms": _value(g, case_id, "step_ms"), "tokens_per_s": tokens,
                      "vs_assignment": tokens / _value(g, assignment.iloc[0], "tokens_per_s")
                      if len(assignment) else math.nan,
                      "assignment_busy_pct": _busy(rungs, size, "compiled")}
        for phase in ("forward", "backward", "optimizer"):
            measured, floor = _value(g, case_id, f"{phase}_ms"), _value(g, case_id, f"{phase}_floor_ms")
            if math.isfinite(floor):
                floors.append({"size": size, "phase": phase, "measured ms": measured, "floor ms": floor,
                               "measured / floor": measured / floor,
                               "floor from": ("Linear weights x 26 B + other params x 28 B / copy bandwidth"
                                              if first["optimizer"] == "master" else
                                              "params x 28 B / copy bandwidth") if phase == "optimizer"
                               else "closed-form FLOPs / bf16 matmul rate"})
    for case_id, g in ok[ok["metric"].isin(["counted_flops", "closed_form_flops"])].groupby("case_id", sort=False):
        first = g.iloc[0]
        counted, closed = _value(g, case_id, "counted_flops"), _value(g, case_id, "closed_form_flops")
        att_counted = _value(ok, case_id, "counted_attention_flops")
        att_closed = _value(ok, case_id, "closed_form_attention_flops")
        flops.append({"size": first["size"], "rung": int(first["rung"]), "attention": first["attention"],
                      "checkpointed": _count(_value(ok, case_id, "checkpointed_blocks")),
                      "counted TFLOP": counted / 1e12, "closed form TFLOP": closed / 1e12,
                      "counted / closed": counted / closed, "attention: counted / closed": att_counted / att_closed})
    out["ladder_best"] = best
    out["ladder_floors"] = pd.DataFrame(floors)
    out["ladder_flops"] = pd.DataFrame(flops)
    if not out["ladder_flops"].empty:
        out["ladder_flops_range"] = ratio_range(out["ladder_flops"]["counted / closed"])
    out["ladder_bars"] = ladder_bars(best, out["ladder_floors"], limits)
    return out


def ladder_bars(best: dict, floors: pd.DataFrame, limits: dict) -> pd.DataFrame:
    """The issue's bars for the configured size, read off its ladder job."""
    size = limits.get("ladder_size")
    b = best.get(size)
    if not b or not limits:
        return pd.DataFrame()
    rows = []
    if math.isfinite(b["mfu"]):
        for text, limit in ((f"{size}: best rung >= {fmt(limits['best_mfu_pct'])}% MFU with "
                             f"{limits['best_attention']} attention", limits["best_mfu_pct"]),
                            (f"stretch: >= {fmt(limits['best_mfu_pct_stretch'])}% MFU", limits["best_mfu_pct_stretch"])):
            rows.append(bar(text, b["mfu"], f"{fmt(b['mfu'])}% (rung {b['rung']}, {b['attention']})",
                            b["mfu"] >= limit and b["attention"] == limits["best_attention"]))
    x, busy = b["vs_assignment"], b.get("assignment_busy_pct", math.nan)
    # below 100% busy the reference step waits on the host, so the ratio moves with the host's speed
    host = f" (reference rung {fmt(busy)}% GPU-busy)" if math.isfinite(busy) and busy < 95 else ""
    rows.append(bar(f"{size}: best rung tokens/s >= {fmt(limits['tokens_per_s_vs_assignment'])}x the assignment "
                    f"setting's (bf16 compiled, same job)", x, f"{fmt(x)}x{host}",
                    x >= limits["tokens_per_s_vs_assignment"]))
    opt = floors[(floors["size"] == size) & (floors["phase"] == "optimizer")] if not floors.empty else floors
    if len(opt):
        x = float(opt["measured / floor"].iloc[0])
        rows.append(bar(f"{size}: {b['optimizer']} optimizer phase <= {fmt(limits['optimizer_vs_floor'])}x its "
                        f"bandwidth floor", x, f"{fmt(x)}x", x <= limits["optimizer_vs_floor"]))
    return pd.DataFrame(rows)


def variants(df: pd.DataFrame) -> dict:
    if df.empty:
        return {}
    train, fwd = df[df["mode"] == "train"], df[df["mode"] == "forward"]
    out = {"variants_train": wide(train, {
        "forward_ms": "forward ms", "backward_ms": "backward ms", "optimizer_ms": "optimizer ms",
        "step_ms": "step ms", "tokens_per_s": "tokens/s", "mfu_pct": "MFU %",
        "peak_allocated_mib": "peak MiB", "first_step_ms": "first step ms"}).drop(columns=["mode", "warmup"]),
        "variants_forward": wide(fwd, {
            "forward_ms": "forward ms", "tokens_per_s": "tokens/s", "mfu_pct": "MFU %",
            "peak_allocated_mib": "peak MiB", "first_step_ms": "first step ms"}).drop(columns=["mode", "warmup"])}
    f, b = metric_frame(train, "forward_ms"), metric_frame(train, "backward_ms")
    out["backward_over_forward"] = ratio_range(b / f)
    step = metric_frame(df, "step_ms").reset_index()
    eager = step[step["compile"] == "eager"].pivot_table(index=["size", "context", "mode"],
                                                         columns="dtype", values="mean")
    out["bf16_speedup_train"] = ratio_range(
        (eager["fp32"] / eager["bf16"]).xs("train", level="mode")
        if {"fp32", "bf16"} <= set(eager.columns) else pd.Series(dtype=float))
    by_compile = step.pivot_table(index=["size", "context", "dtype", "mode"], columns="compile", values="mean")
    out["compile_speedup"] = {}
    if {"eager", "compiled"} <= set(by_compile.columns):
        speedup = by_compile["eager"] / by_compile["compiled"]
        out["compile_speedup"] = {mode: ratio_range(speedup.xs(mode, level="mode"))
                                  for mode in speedup.index.get_level_values("mode").unique()}
    return out


def warmup(df: pd.DataFrame) -> dict:
    if df.empty:
        return {}
    out = {"warmup": wide(df, {"step_ms": "step ms (mean ± std)", "first_step_ms": "first step ms"})
           .drop(columns=["compile", "mode", "context"])}
    step = df[(df["metric"] == "step_ms") & (df["status"] == "ok")]
    std = step.pivot_table(index="size", columns="warmup", values="std")
    lo, hi = min(std.columns), max(std.columns)
    out["warmup_std_ratio"] = {"cold": int(lo), "warm": int(hi), **ratio_range(std[lo] / std[hi])}
    return out


def context(df: pd.DataFrame) -> dict:
    if df.empty:
        return {}
    out = {"context": wide(df, {"step_ms": "step ms", "tokens_per_s": "tokens/s", "mfu_pct": "MFU %",
                                "peak_allocated_mib": "peak MiB"}).drop(columns=["compile", "mode", "warmup"])}
    per = metric_frame(df, "step_ms").reset_index().pivot_table(index=["size", "dtype"],
                                                                columns="context", values="mean")
    lo, hi = min(per.columns), max(per.columns)
    out["context_growth"] = {"short": int(lo), "long": int(hi), "factor": int(hi // lo),
                             **ratio_range(per[hi] / per[lo])}
    out["context_oom"] = df.drop_duplicates("case_id").query("status == 'oom'")[["size", "context", "dtype"]]
    return out


def ladder_figure(df: pd.DataFrame, path) -> None:
    """MFU (when the device has a peak) and tokens/s per rung, one line per model size."""
    ok = df[(df["study"] == "ladder") & (df["status"] == "ok")] if not df.empty else df
    if ok.empty or not (ok["metric"] == "tokens_per_s").any():
        empty(path, "the ladder: MFU and tokens/s per rung")
        return
    metrics = [m for m in ("mfu_pct", "tokens_per_s") if (ok["metric"] == m).any()]
    labels = {"mfu_pct": "MFU (%)", "tokens_per_s": "tokens/s"}
    fig, axes = plt.subplots(len(metrics), 1, figsize=(9, 3.2 * len(metrics)), sharex=True, squeeze=False)
    names = ok.drop_duplicates("rung").sort_values("rung").set_index("rung")["name"]
    for ax, metric in zip(axes[:, 0], metrics):
        for size in size_order(ok):
            g = ok[(ok["size"] == size) & (ok["metric"] == metric)].sort_values("rung")
            ax.plot(g["rung"].astype(int), g["mean"], marker="o", label=size)
        ax.set_ylabel(labels[metric])
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[-1, 0].set_xticks(list(names.index.astype(int)), list(names), rotation=30, ha="right")
    axes[0, 0].set_title("The ladder: one change a rung (the rung before plus its change)")
    save(fig, path)


def figures(inputs, paths: dict) -> None:
    df = inputs.rows("e2e")
    ladder_figure(df, paths["ladder"])
    ok = df[(df["metric"] == "step_ms") & (df["status"] == "ok")] if not df.empty else df
    variants = ok[(ok["study"] == "variants") & (ok["mode"] == "train")] if not ok.empty else ok
    if variants.empty:
        empty(paths["step_vs_size"], "training step vs model size")
    else:
        sizes = size_order(df)
        fig, ax = plt.subplots(figsize=(7, 4))
        for (dtype, compiled), g in variants.groupby(["dtype", "compile"]):
            g = g.set_index("size").reindex([s for s in sizes if s in set(g["size"])])
            label = f"{dtype}, {'compiled' if str(compiled).lower() == 'true' else 'eager'}"
            ax.errorbar(g.index, g["mean"], yerr=g["std"], marker="o", capsize=3, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("model size")
        ax.set_ylabel("training step (ms, mean ± std)")
        ax.set_title(f"Training step vs model size (context {int(variants['context'].iloc[0])})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        save(fig, paths["step_vs_size"])
    context = ok[ok["study"] == "context"] if not ok.empty else ok
    if context.empty:
        empty(paths["step_vs_context"], "training step vs context")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, size in enumerate(size_order(df)):
        for dtype, style in (("fp32", "-"), ("bf16", "--")):
            g = context[(context["size"] == size) & (context["dtype"] == dtype)].sort_values("context")
            if not g.empty:
                ax.plot(g["context"], g["mean"], style, marker="o", color=colors[i % len(colors)],
                        label=f"{size} {dtype}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("training step (ms)")
    ax.set_title("Training step vs context length (eager; solid fp32, dashed bf16)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(ncol=2, fontsize="small")
    save(fig, paths["step_vs_context"])
