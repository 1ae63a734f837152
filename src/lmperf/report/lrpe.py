"""Multi-dimensional LRPE-cosine (Triton): the bars (share of copy bandwidth, against
torch.compile), the same comparison per call and for the angle-cache variant, one table per grid
dimension with forward and backward side by side, and the bandwidth figure."""
from __future__ import annotations

import pandas as pd

from lmperf.report.format import bar, cell, fmt, unavailable
from lmperf.report.plot import plt, save

PROVIDERS = ["triton", "triton_cache", "torch", "torch_compile"]
CENTER = "median"  # do_bench medians (the 20%/80% quantiles too, in newer rows)
# Columns of the per-dimension tables, per direction: (metric suffix, label).
METRICS = [("ms", "ms / call"), ("kernel_ms", "kernel ms"), ("peak_mib", "peak MiB"),
           ("copy_fraction", "copy share / call"), ("kernel_copy_fraction", "copy share, kernel")]


def faster_than_compile(val: pd.DataFrame, impl: str, direction: str, timing: str, how: str,
                        kernels_of_slower: bool = False) -> dict | None:
    """The line "impl faster than torch.compile everywhere" from the pivoted bench rows, on
    `{direction}{timing}_ms`; a config where either side has no time of that kind counts against
    it. kernels_of_slower: name the longest kernel time among the configs that are not faster."""
    a, b = (impl, f"{direction}{timing}_ms"), ("torch_compile", f"{direction}{timing}_ms")
    if a not in val or b not in val:
        return None
    ratio = val[a] / val[b]
    missing = int(ratio.isna().sum())
    ratio = ratio.dropna()
    slower = ratio[ratio >= 1].index
    detail = f"{len(slower)} of {len(ratio)} not faster"
    if missing:
        detail += f"; {missing} configs without both times"
    if kernels_of_slower and len(slower):
        detail += f"; their kernels take at most {fmt(1e3 * val.loc[slower, (impl, f'{direction}_kernel_ms')].max())} us"
    return bar(f"{impl} {direction} faster than torch.compile everywhere ({how})", ratio.max(),
               f"slowest ratio {fmt(ratio.max())}x ({detail})", (ratio < 1).all() and not missing)


def peak_line(val: pd.DataFrame, impl: str, direction: str) -> dict | None:
    a, b = (impl, f"{direction}_peak_mib"), ("torch_compile", f"{direction}_peak_mib")
    if a not in val or b not in val:
        return None
    over = (val[a] - val[b]).dropna()
    excess = max(over.max(), 0)
    return bar(f"{impl} {direction} peak memory <= torch.compile everywhere", excess,
               f"largest excess {fmt(excess)} MiB", (over <= 0).all())


def lines(val: pd.DataFrame, limits: dict, kernel: bool) -> dict:
    """{"bars": the section's bars for `triton`, "cache": the same lines for `triton_cache`,
    "per_call": the torch.compile comparison per call, host included (with kernel times),
    "answer": what the report's summary quotes: per direction, triton's worst share of copy
    bandwidth over the large configs and its slowest time against torch.compile's (the bars'
    timing), with the number of large configs}."""
    timing, how = ("_kernel", "kernel time") if kernel else ("", "time per call")
    elements = val[("triton", "x_elements")] if ("triton", "x_elements") in val else pd.Series(dtype=float)
    big = elements[elements >= limits["large_elements"]].index
    out = {"bars": [], "cache": [], "per_call": [],
           "answer": {"large": len(big), "large_elements": limits["large_elements"], "how": how}}
    for direction in ("forward", "backward"):
        key = ("triton", f"{direction}{timing}_copy_fraction")
        if key in val and len(big):
            worst = val.loc[big, key].min()
            out["answer"][direction] = {"copy_share": float(worst)}
            out["bars"].append(bar(
                f"triton {direction} >= {100 * limits['copy_fraction']:g}% of copy bandwidth "
                f"(x >= {limits['large_elements'] / 2**20:g}M elements, {len(big)} configs; {how})",
                worst, f"worst {fmt(100 * worst)}%", worst >= limits["copy_fraction"]))
    for impl, name in (("triton", "bars"), ("triton_cache", "cache")):
        for direction in ("forward", "backward"):
            faster = faster_than_compile(val, impl, direction, timing, how)
            if faster and impl == "triton" and direction in out["answer"]:
                out["answer"][direction]["vs_compile"] = faster["_value"]
            out[name] += [x for x in (faster, peak_line(val, impl, direction)) if x]
    # With kernel times the bars use them; the same comparison per call (host included) is shown
    # beside them, since at small sizes it measures the host path of each op, not its kernels.
    if kernel:
        out["per_call"] = [x for d in ("forward", "backward") if (x := faster_than_compile(
            val, "triton", d, "", "time per call, host included", kernels_of_slower=True))]
    return out


def dims_table(g: pd.DataFrame, metrics: list[tuple[str, str]]) -> pd.DataFrame:
    """One grid dimension: a row per (extra tokens, n, provider), forward and backward columns."""
    rows = []
    for (l, n, provider), c in g.groupby(["l", "side", "provider"], sort=True):
        row = {"l": int(l), "n": int(n), "provider": provider,
               "_order": PROVIDERS.index(provider) if provider in PROVIDERS else 99}
        for direction, short in (("forward", "fwd"), ("backward", "bwd")):
            for metric, label in metrics:
                row[f"{short} {label}"] = cell(c, f"{direction}_{metric}", spread=metric.endswith("ms"),
                                               column=CENTER)
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["l", "n", "_order"], kind="stable")


def kernel_timed(bench: pd.DataFrame) -> bool:
    """Whether the run measured kernel times (host left out): the bars and the figure use them."""
    return bool(bench["metric"].eq("forward_kernel_ms").any())


def view(inputs) -> dict:
    bench = inputs.rows("lrpe", "bench")
    if bench.empty:
        return unavailable("no benchmark results (rule lrpe_bench has not run)")
    if CENTER not in bench:  # rows with a mean only (one sample: the same number)
        bench = bench.assign(**{CENTER: bench["mean"]})
    if (bench["status"] != "ok").all():
        return unavailable("the benchmark did not run here: " + "; ".join(sorted(set(bench["message"].dropna()))))
    kernel = kernel_timed(bench)
    metrics = [m for m in METRICS if kernel or "kernel" not in m[0]]
    tables = [{"dims": int(dims), "table": dims_table(g, metrics)}
              for dims, g in bench.groupby("dims", sort=True)]
    ok = bench[bench["status"] == "ok"]
    val = ok.pivot_table(index=["dims", "side", "l"], columns=["provider", "metric"], values=CENTER)
    found = lines(val, inputs.bars["lrpe"], kernel)
    copy = ok[ok["metric"] == "copy_gbs"][CENTER]
    first = ok.iloc[0]
    setup = {k: (first[k] if k in first and pd.notna(first[k]) else "?") for k in ("batch", "heads", "d", "dtype")}
    setup = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in setup.items()}
    return {"available": True, "tables": tables, "bars": pd.DataFrame(found["bars"]),
            "cache_lines": pd.DataFrame(found["cache"]), "per_call": pd.DataFrame(found["per_call"]),
            "copy_gbs": float(copy.median()) if len(copy) else None, "kernel": kernel, "answer": found["answer"],
            "kernel_calls": int(bench["kernel_calls"].max()) if kernel and "kernel_calls" in bench else 0,
            "setup": setup}


def figures(inputs, paths: dict) -> dict[str, str]:
    """Achieved GB/s against tokens, forward and backward, per provider (l = 0), by the time the
    bars use (kernel time where measured, else time per call); {name: why} of a figure not drawn."""
    path = paths["lrpe_bandwidth"]
    bench = inputs.rows("lrpe", "bench")
    ok = bench[(bench["status"] == "ok") & (bench["l"] == 0)] if not bench.empty else bench
    if ok.empty:
        return {"lrpe_bandwidth": "no LRPE benchmark case ran ok here"}
    timing, how = ("_kernel", "kernel time") if kernel_timed(ok) else ("", "time per call")
    copy = ok[ok["metric"] == "copy_gbs"][CENTER].median()
    colours = {p: f"C{i}" for i, p in enumerate(sorted(ok["provider"].unique()))}  # provider: colour
    styles = ["-.", "-", "--"]                                                       # dims: line
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for ax, direction in zip(axes.flat, ("forward", "backward")):
        g = ok[ok["metric"] == f"{direction}{timing}_gbs"]
        for (provider, dims), p in g.groupby(["provider", "dims"]):
            p = p.sort_values("tokens")
            ax.plot(p["tokens"], p[CENTER], label=f"{provider} {int(dims)}-D",
                    color=colours[provider], ls=styles[int(dims) % 3], marker="o^s"[int(dims) % 3])
        ax.axhline(copy, color="black", ls=":", label="device copy")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens (l = 0)")
        ax.set_ylabel("GB/s (x read + output written)")
        ax.set_title(f"LRPE-cosine {direction}, by {how}")
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize="x-small", ncol=2)
    save(fig, path)
    return {}
