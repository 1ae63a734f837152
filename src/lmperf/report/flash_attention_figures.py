"""The FlashAttention-2 section's figures (report/flash_attention.py): TFLOP/s against sequence
length by one timing method, and ours over each peer across shapes."""
from __future__ import annotations

import itertools

import pandas as pd

from lmperf import providers
from lmperf.report.plot import plt, save

CENTER = "median"


def same_kernel(model: pd.DataFrame, a: str, b: str, tolerance: float = 0.02) -> bool:
    """Whether providers a and b took the same time (within `tolerance`, about twice the
    run-to-run spread of one kernel's GPU time) at every shape of the model group: two backends
    of one op do not, at ten shapes, so one of them did not run."""
    if not {a, b} <= set(model.columns):
        return False
    both = model[[a, b]].dropna()
    return len(both) > 1 and bool(((both[a] - both[b]).abs() <= tolerance * both[a]).all())


def tflops_figure(bench: pd.DataFrame, path) -> dict[str, str]:
    grid = bench[(bench["group"] == "grid") & (bench["status"] == "ok")] if not bench.empty else bench
    if grid.empty:
        return {"fa_tflops": "no case of the FlashAttention-2 grid ran ok here"}
    # one timing method on every line: GPU time (CUDA graph) where the grid has it, else do_bench's
    how = "GPU time (CUDA graph)" if (grid["metric"] == "fwd_bwd_gpu_tflops").any() else "do_bench (host included)"
    grid = grid[grid["metric"] == ("fwd_bwd_gpu_tflops" if how.startswith("GPU") else "fwd_bwd_tflops")]
    if grid.empty:
        return {"fa_tflops": "no case of the FlashAttention-2 grid ran ok here"}
    dtypes, dims = sorted(grid["dtype"].unique()), sorted(grid["head_dim"].unique())
    fig, axes = plt.subplots(len(dtypes), len(dims), figsize=(4.2 * len(dims), 3.4 * len(dtypes)),
                             squeeze=False)
    colours, ours = providers.colours("attention", grid["provider"].unique()), providers.ours()
    for (i, dtype), (j, d) in itertools.product(enumerate(dtypes), enumerate(dims)):
        ax, g = axes[i, j], grid[(grid["dtype"] == dtype) & (grid["head_dim"] == d)]
        if g.empty:  # no panel for a dtype and head dim without rows
            ax.remove()
            continue
        for provider, p in g.groupby("provider"):
            p = p.sort_values("seq_len")
            ax.plot(p["seq_len"], p[CENTER], "-", marker="o", ms=3, lw=2.5 if provider == ours else 1,
                    color=colours[provider], label=provider)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype}, D={int(d)}")
        ax.legend(fontsize="x-small")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s (fwd+bwd)")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"FlashAttention-2 grid, forward+backward, {how} on every line", fontsize="medium")
    save(fig, path)
    return {}


def ratio_figure(bench: pd.DataFrame, model: pd.DataFrame, reference: str, path) -> dict[str, str]:
    """Our speed-up over a peer (its time over ours) across shapes, GPU time (CUDA graph) on both sides: the grid against
    torch.compile'd attention (forward+backward, per dtype and head dim, against N), and the model
    group against the peers of record (lmperf.providers.of_record; one whose times are an
    earlier one's, `same_kernel`, left out).
    `model`: the model group's table of GPU times (report/flash_attention.py's model_table);
    `reference`: the grid's peer (torch.compile'd PyTorch attention)."""
    if bench.empty:
        return {"fa_ratio": "no case of the FlashAttention-2 benchmark ran here"}
    grid = bench[(bench["group"] == "grid") & (bench["status"] == "ok") & (bench["metric"] == "fwd_bwd_gpu_ms")]
    wide = grid.pivot_table(index=["dtype", "head_dim", "seq_len"], columns="provider", values=CENTER) \
        if not grid.empty else pd.DataFrame()
    ours, record = providers.ours(), [p.name for p in providers.of_record()]
    has_grid = {ours, reference} <= set(wide.columns)
    peers = [p for i, p in enumerate(record) if f"speed-up over {p}" in model
             and not any(same_kernel(model, a, p) for a in record[:i])]
    if not has_grid and not peers:
        return {"fa_ratio": "no shape has GPU time (CUDA graph) for ours and a peer here"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), squeeze=False)
    left, right = axes[0]
    if has_grid:
        for (dtype, d), g in (wide[reference] / wide[ours]).dropna().groupby(level=["dtype", "head_dim"]):
            left.plot(g.index.get_level_values("seq_len"), g.values, marker="o", ms=3, label=f"{dtype}, D={int(d)}")
        left.set_xscale("log", base=2)
        left.set_xlabel("sequence length (batch 1, causal)")
        left.legend(fontsize="x-small")
    left.axhline(1, color="k", lw=0.8)
    left.set_ylabel("speed-up: peer time / ours (above 1: ours faster)")
    left.set_title("grid: over torch.compile'd attention (the one peer with GPU time here)", fontsize="medium")
    left.grid(True, alpha=0.3)
    for k, peer in enumerate(peers):
        labels = [f"{r['model']} N={r['N']} D={r['D']}" for r in model.to_dict("records")]
        right.plot(range(len(labels)), model[f"speed-up over {peer}"], "o" if k == 0 else "s", label=peer)
        right.set_xticks(range(len(labels)), labels, rotation=40, ha="right", fontsize="x-small")
    right.axhline(1, color="k", lw=0.8)
    right.set_title("model sizes' attention (bf16, causal): speed-up over SDPA, fwd+bwd", fontsize="medium")
    right.legend(fontsize="x-small")
    right.grid(True, alpha=0.3)
    fig.suptitle("FlashAttention-2: our speed-up over a peer, GPU time (CUDA graph) on both sides", fontsize="medium")
    save(fig, path)
    return {}
