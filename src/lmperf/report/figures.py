"""Figures for the report (matplotlib, PNG). Each function writes its files and returns
{name: path}; a figure without data still gets written, saying so, since the workflow expects it."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from lmperf.report.sections import size_order  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _empty(path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{title}: no data", ha="center", va="center")
    return _save(fig, path)


def e2e_figures(df: pd.DataFrame, out: Path) -> dict[str, Path]:
    paths = {"step_vs_size": out / "e2e_step_vs_size.png",
             "step_vs_context": out / "e2e_step_vs_context.png"}
    ok = df[(df.get("metric") == "step_ms") & (df.get("status") == "ok")] if not df.empty else df
    variants = ok[(ok["study"] == "variants") & (ok["mode"] == "train")] if not ok.empty else ok
    if variants.empty:
        _empty(paths["step_vs_size"], "training step vs model size")
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
        _save(fig, paths["step_vs_size"])
    context = ok[ok["study"] == "context"] if not ok.empty else ok
    if context.empty:
        _empty(paths["step_vs_context"], "training step vs context")
    else:
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
        _save(fig, paths["step_vs_context"])
    return paths


def fa_figures(bench: pd.DataFrame, out: Path) -> dict[str, Path]:
    """TFLOP/s (forward+backward) against sequence length, one panel per head dim and dtype."""
    path = out / "fa_tflops_vs_seq_len.png"
    grid = bench[(bench["group"] == "grid") & (bench["metric"] == "fwd_bwd_tflops")
                 & (bench["status"] == "ok")] if not bench.empty else bench
    if grid.empty:
        _empty(path, "FlashAttention-2 grid")
        return {"fa_tflops": path}
    panels = sorted(grid.groupby(["dtype", "head_dim"]).groups)
    fig, axes = plt.subplots(len(panels) // 4 + bool(len(panels) % 4), min(4, len(panels)),
                             figsize=(4 * min(4, len(panels)), 3.2 * (len(panels) // 4 + bool(len(panels) % 4))),
                             squeeze=False)
    # One colour per provider in every panel (fp32 panels lack the SDPA backends).
    colours = {p: f"C{i}" for i, p in enumerate(sorted(grid["provider"].unique()))}
    for ax, (dtype, d) in zip(axes.flat, panels):
        g = grid[(grid["dtype"] == dtype) & (grid["head_dim"] == d)]
        for provider, p in g.groupby("provider"):
            p = p.sort_values("seq_len")
            ax.plot(p["seq_len"], p["mean"], marker="o", lw=2.5 if provider == "triton" else 1,
                    label=provider, color=colours[provider])
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype}, D={int(d)}")
        ax.legend(fontsize="x-small")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s (fwd+bwd)")
        ax.grid(True, alpha=0.3)
    _save(fig, path)
    return {"fa_tflops": path}


def lrpe_figures(bench: pd.DataFrame, out: Path) -> dict[str, Path]:
    """Achieved GB/s against tokens, forward and backward, per provider (l = 0)."""
    path = out / "lrpe_bandwidth.png"
    ok = bench[(bench["status"] == "ok") & (bench["l"] == 0)] if not bench.empty else bench
    if ok.empty:
        _empty(path, "LRPE-cosine bandwidth")
        return {"lrpe_bandwidth": path}
    copy = ok[ok["metric"] == "copy_gbs"]["mean"].median()
    colours = {p: f"C{i}" for i, p in enumerate(sorted(ok["provider"].unique()))}  # provider: colour
    styles = ["-.", "-", "--"]                                                       # dims: line
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for ax, direction in zip(axes.flat, ("forward", "backward")):
        g = ok[ok["metric"] == f"{direction}_gbs"]
        for (provider, dims), p in g.groupby(["provider", "dims"]):
            p = p.sort_values("tokens")
            ax.plot(p["tokens"], p["mean"], label=f"{provider} {int(dims)}-D",
                    color=colours[provider], ls=styles[int(dims) % 3], marker="o^s"[int(dims) % 3])
        ax.axhline(copy, color="black", ls=":", label="device copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens (l = 0)")
        ax.set_ylabel("GB/s (x read + output written)")
        ax.set_title(f"LRPE-cosine {direction}")
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize="x-small", ncol=2)
    _save(fig, path)
    return {"lrpe_bandwidth": path}


def attention_figures(df: pd.DataFrame, out: Path) -> dict[str, Path]:
    """Time (forward, backward) and memory held for backward against sequence length, log-log."""
    path = out / "attention_vs_seq_len.png"
    ok = df[df["status"] == "ok"] if not df.empty else df
    if ok.empty:
        _empty(path, "PyTorch attention")
        return {"attention": path}
    panels = [("forward_ms", "forward (ms)"), ("backward_ms", "backward (ms)"),
              ("allocated_before_backward_mib", "held before backward (MiB)")]
    panels = [p for p in panels if (ok["metric"] == p[0]).any()]
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
    _save(fig, path)
    return {"attention": path}


def memory_figures(df: pd.DataFrame, out: Path) -> dict[str, Path]:
    """Active memory over the recorded step, one panel per case (from the CSV's timeline rows)."""
    path = out / "memory_timelines.png"
    rows = df[(df["metric"] == "timeline_mib") & (df["status"] == "ok")] if not df.empty else df
    if rows.empty:
        _empty(path, "memory timelines")
        return {"memory": path}
    cols = min(4, len(rows))
    nrows = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.8 * nrows), squeeze=False)
    for ax, (_, r) in zip(axes.flat, rows.iterrows()):
        ys = [float(x) for x in str(r["samples"]).split(";")]
        ax.plot(range(len(ys)), ys)
        ax.set_title(f"{r['mode']} {r['dtype']} ctx {int(r['context'])}", fontsize="small")
        ax.set_xlabel("snapshot events (bucketed)")
        ax.set_ylabel("active MiB")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    _save(fig, path)
    return {"memory": path}
