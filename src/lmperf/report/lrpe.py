"""Multi-dimensional LRPE-cosine (Triton): the targets (share of copy bandwidth, against
torch.compile), the same comparison per call and for the angle-cache variant, one table per grid
dimension with forward and backward side by side, the published A800 table of the same benchmark
beside ours, and the bandwidth figure.

Every timing row keeps the GPU's time beside the wall time of a call: the profiler's kernel time
(`*_kernel_ms`) and, in rows measured since, the call replayed as a CUDA graph (`*_gpu_ms`). A
call whose GPU sat idle more than the host-bound threshold of its wall time (`gpu_idle_pct`) is
marked host-bound: its wall time is the host's (Python, the launch path), never a kernel's speed;
rows with no GPU time at all say so."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lmperf import providers
from lmperf.report.format import HOST_BOUND, bar, cell, fmt, idle_text, unavailable
from lmperf.report.plot import plt, save



def ours() -> str:
    """Our LRPE-cosine kernel, the bars' (lmperf.providers, contract "lrpe")."""
    return providers.ours("lrpe")


def cached() -> str | None:
    """Our other LRPE-cosine provider (the cached cosines), or None."""
    return next(iter(providers.names("lrpe", "ours")[1:]), None)


def compiled() -> providers.Provider:
    """The peer of record the bars set ours against (torch.compile of PyTorch's LRPE-cosine)."""
    return providers.of_record("lrpe")[0]


CENTER = "median"  # do_bench medians (the 20%/80% quantiles too, in newer rows)
# Columns of the per-dimension tables, per direction: (metric suffix, label). The wall-time
# columns (a call, host included) carry the host-bound mark; the GPU-time columns do not need it.
METRICS = [("ms", "ms / call"), ("gpu_ms", "GPU ms (CUDA graph)"), ("kernel_ms", "kernel ms"),
           ("peak_mib", "peak MiB"), ("copy_fraction", "copy share / call"),
           ("kernel_copy_fraction", "copy share, kernel")]
WALL = {"ms", "copy_fraction"}
# The published table of the same benchmark (xopes' md_lrpe_cosine on an A800): its source and
# conditions are in the file's header.
PUBLISHED = Path("config/published/lrpe_md_cosine_a800.csv")


def faster_than_compile(val: pd.DataFrame, impl: str, direction: str, timing: str, how: str,
                        kernels_of_slower: bool = False) -> dict | None:
    """The line "impl faster than torch.compile everywhere" from the pivoted bench rows, on
    `{direction}{timing}_ms`; a config where either side has no time of that kind counts against
    it. kernels_of_slower: name the longest kernel time among the configs that are not faster."""
    peer = compiled()
    a, b = (impl, f"{direction}{timing}_ms"), (peer.name, f"{direction}{timing}_ms")
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
    return bar(f"{impl} {direction} faster than {peer.says} everywhere ({how})", ratio.max(),
               f"slowest ratio {fmt(ratio.max())}x ({detail})", (ratio < 1).all() and not missing)


def peak_line(val: pd.DataFrame, impl: str, direction: str) -> dict | None:
    peer = compiled()
    a, b = (impl, f"{direction}_peak_mib"), (peer.name, f"{direction}_peak_mib")
    if a not in val or b not in val:
        return None
    over = (val[a] - val[b]).dropna()
    excess = max(over.max(), 0)
    return bar(f"{impl} {direction} peak memory <= {peer.says} everywhere", excess,
               f"largest excess {fmt(excess)} MiB", (over <= 0).all())


def lines(val: pd.DataFrame, limits: dict, kernel: bool) -> dict:
    """{"bars": the section's bars for `triton`, "cache": the same lines for `triton_cache`,
    "per_call": the torch.compile comparison per call, host included (with kernel times),
    "answer": what the report's summary quotes: per direction, triton's worst share of copy
    bandwidth over the large configs and its slowest time against torch.compile's (the bars'
    timing), with the number of large configs}."""
    timing, how = ("_kernel", "kernel time") if kernel else ("", "time per call")
    mine = ours()
    elements = val[(mine, "x_elements")] if (mine, "x_elements") in val else pd.Series(dtype=float)
    big = elements[elements >= limits["large_elements"]].index
    out = {"bars": [], "cache": [], "per_call": [],
           "answer": {"large": len(big), "large_elements": limits["large_elements"], "how": how}}
    for direction in ("forward", "backward"):
        key = (mine, f"{direction}{timing}_copy_fraction")
        if key in val and len(big):
            worst = val.loc[big, key].min()
            out["answer"][direction] = {"copy_share": float(worst)}
            out["bars"].append(bar(
                f"{mine} {direction} >= {100 * limits['copy_fraction']:g}% of copy bandwidth "
                f"(x >= {limits['large_elements'] / 2**20:g}M elements, {len(big)} configs; {how})",
                worst, f"worst {fmt(100 * worst)}%", worst >= limits["copy_fraction"]))
    for impl, name in ((mine, "bars"), (cached(), "cache")):
        for direction in ("forward", "backward"):
            faster = faster_than_compile(val, impl, direction, timing, how)
            if faster and impl == mine and direction in out["answer"]:
                out["answer"][direction]["vs_compile"] = faster["_value"]
            out[name] += [x for x in (faster, peak_line(val, impl, direction)) if x]
    # With kernel times the bars use them; the same comparison per call (host included) is shown
    # beside them, since at small sizes it measures the host path of each op, not its kernels.
    if kernel:
        out["per_call"] = [x for d in ("forward", "backward") if (x := faster_than_compile(
            val, mine, d, "", "time per call, host included", kernels_of_slower=True))]
    return out


def idle(c: pd.DataFrame, direction: str) -> float | None:
    """A case's GPU idle % over its median `direction` call (the wall-time row's), or None."""
    row = c[c["metric"] == f"{direction}_ms"]
    if row.empty or "gpu_idle_pct" not in row or pd.isna(row["gpu_idle_pct"].iloc[0]):
        return None
    return float(row["gpu_idle_pct"].iloc[0])


def has_gpu_time(c: pd.DataFrame, direction: str) -> bool:
    """Whether a case has a GPU time of `direction` (kernel or CUDA-graph) that ran ok."""
    ok = c[c["status"] == "ok"]
    return bool(ok["metric"].isin([f"{direction}_kernel_ms", f"{direction}_gpu_ms"]).any())


def dims_table(g: pd.DataFrame, metrics: list[tuple[str, str]], threshold: float = math.inf) -> pd.DataFrame:
    """One grid dimension: a row per (extra tokens, n, provider), forward and backward columns.
    A wall-time cell of a host-bound call carries the mark; where the case has no GPU time for
    that direction it reads "host" instead of a number (the host's time, not the kernel's).
    `_host_bound` counts the row's host-bound directions (for the legend and tests)."""
    rows = []
    order = {p: k for k, p in enumerate(providers.names("lrpe"))}
    for (l, n, provider), c in g.groupby(["l", "side", "provider"], sort=True):
        row = {"l": int(l), "n": int(n), "provider": provider,
               "_order": order.get(provider, 99), "_host_bound": 0}
        for direction, short in (("forward", "fwd"), ("backward", "bwd")):
            gpu_idle = idle(c, direction)
            bound = gpu_idle is not None and gpu_idle > threshold
            row["_host_bound"] += bound
            for metric, label in metrics:
                value = cell(c, f"{direction}_{metric}", spread=metric.endswith("ms"), column=CENTER)
                if bound and metric in WALL and value is not None and not isinstance(value, str):
                    shown = str(value) if isinstance(value, tuple) else fmt(float(value))
                    value = (f"{shown} {HOST_BOUND}" if has_gpu_time(c, direction)
                             else f"{HOST_BOUND} host ({fmt(float(value[0] if isinstance(value, tuple) else value))})")
                row[f"{short} {label}"] = value
            row[f"{short} GPU idle %"] = idle_text(gpu_idle, threshold)
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["l", "n", "_order"], kind="stable")


def kernel_timed(bench: pd.DataFrame) -> bool:
    """Whether the run measured kernel times (host left out): the bars and the figure use them."""
    return bool(bench["metric"].eq("forward_kernel_ms").any())


def view(inputs) -> dict:
    bench = providers.renamed(inputs.rows("lrpe", "bench"), "lrpe")
    if bench.empty:
        return unavailable("no benchmark results (rule lrpe_bench has not run)")
    if CENTER not in bench:  # rows with a mean only (one sample: the same number)
        bench = bench.assign(**{CENTER: bench["mean"]})
    if (bench["status"] != "ok").all():
        return unavailable("the benchmark did not run here: " + "; ".join(sorted(set(bench["message"].dropna()))))
    kernel = kernel_timed(bench)
    threshold = inputs.bars.get("host_bound_idle_pct", math.inf)
    gpu_timed = bool(bench["metric"].astype(str).str.endswith("_gpu_ms").any())
    metrics = [m for m in METRICS if (kernel or "kernel" not in m[0]) and (gpu_timed or m[0] != "gpu_ms")]
    tables = []
    for dims, g in bench.groupby("dims", sort=True):
        t = dims_table(g, metrics, threshold)
        tables.append({"dims": int(dims), "table": t, "host_bound": int((t["_host_bound"] > 0).sum()),
                       "wall_only": int(sum(1 for _, r in t.iterrows() for d in ("fwd", "bwd")
                                             if str(r.get(f"{d} ms / call", "")).startswith(f"{HOST_BOUND} host")))})
    ok = bench[bench["status"] == "ok"]
    val = ok.pivot_table(index=["dims", "side", "l"], columns=["provider", "metric"], values=CENTER)
    found = lines(val, inputs.bars["lrpe"], kernel)
    copy = ok[ok["metric"] == "copy_gbs"][CENTER]
    first = ok.iloc[0]
    setup = {k: (first[k] if k in first and pd.notna(first[k]) else "?") for k in ("batch", "heads", "d", "dtype")}
    setup = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in setup.items()}
    # as the report shows them: each line a target, with what was measured and whether it holds
    shown = lambda key: pd.DataFrame(found[key]).rename(columns={"bar": "target"})
    return {"available": True, "tables": tables, "bars": pd.DataFrame(found["bars"]),
            "cache_lines": pd.DataFrame(found["cache"]), "per_call": pd.DataFrame(found["per_call"]),
            "targets": {"ours": shown("bars"), "cache": shown("cache"), "per_call": shown("per_call")},
            "ours": ours(), "cached": cached(),  # the providers the bars and the cache lines are of
            "threshold": threshold, "gpu_timed": gpu_timed,
            "host_bound_calls": host_bound_calls(ok, threshold),
            "published": published(val, PUBLISHED, idle_pivot(ok, threshold)),
            "copy_gbs": float(copy.median()) if len(copy) else None, "kernel": kernel, "answer": found["answer"],
            "kernel_calls": int(bench["kernel_calls"].max()) if kernel and "kernel_calls" in bench else 0,
            "setup": setup}


def host_bound_calls(ok: pd.DataFrame, threshold: float) -> dict:
    """{n: the timed calls (case x direction) whose GPU sat idle more than `threshold` % of the
    wall time, of: all timed calls, max_kernel_us: the longest GPU time among them}."""
    wall = ok[ok["metric"].isin(["forward_ms", "backward_ms"])]
    if "gpu_idle_pct" not in wall:
        return {"n": 0, "of": len(wall), "max_kernel_us": None}
    bound = wall[pd.to_numeric(wall["gpu_idle_pct"], errors="coerce") > threshold]
    kernel = ok.set_index(["case_id", "metric"])[CENTER]
    times = [kernel.get((c, m.replace("_ms", "_kernel_ms"))) for c, m in zip(bound["case_id"], bound["metric"])]
    times = [t for t in times if t is not None and pd.notna(t)]
    return {"n": len(bound), "of": len(wall), "max_kernel_us": 1e3 * max(times) if times else None}


def idle_pivot(ok: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Per (dims, side, l) and (provider, direction): whether that call is host-bound."""
    wall = ok[ok["metric"].isin(["forward_ms", "backward_ms"])]
    if "gpu_idle_pct" not in wall or wall.empty:
        return pd.DataFrame()
    wall = wall.assign(bound=pd.to_numeric(wall["gpu_idle_pct"], errors="coerce") > threshold)
    return wall.pivot_table(index=["dims", "side", "l"], columns=["provider", "metric"], values="bound", aggfunc="max")


def published(val: pd.DataFrame, path: Path, bound: pd.DataFrame | None = None) -> dict:
    """The published A800 table (`PUBLISHED`) beside ours: per (dims, l, n, direction), their
    triton / torch.compile time ratio, and ours by kernel time and per call (host included);
    and how often each side's triton is not faster than its torch.compile, per direction.
    {} where the file is not there."""
    if not path.exists():
        return {}
    theirs = pd.read_csv(path, comment="#")
    mine, peer = providers.ours("lrpe"), compiled().name
    rows = []
    for r in theirs.itertuples(index=False):
        key = (r.dims, r.n, r.l)
        ours = lambda metric: (float(val.loc[key, (mine, metric)] / val.loc[key, (peer, metric)])
                               if key in val.index and (mine, metric) in val and (peer, metric) in val
                               else math.nan)
        rows.append({"dims": r.dims, "l": r.l, "n": r.n, "direction": r.direction,
                     "A800 (published): triton / torch.compile, per call": r.triton / r.torch_compile,
                     "A800: triton_cache / torch.compile": r.triton_cache / r.torch_compile,
                     "ours: triton / torch.compile, kernel time": ours(f"{r.direction}_kernel_ms"),
                     "ours, per call (host included)": per_call(ours(f"{r.direction}_ms"), bound, key, r.direction)})
    table = pd.DataFrame(rows)
    summary = {}
    for direction, g in table.groupby("direction", sort=False):
        theirs_r, ours_r = g["A800 (published): triton / torch.compile, per call"], g["ours: triton / torch.compile, kernel time"]
        both = g[ours_r.notna()]
        summary[direction] = {"n": len(both), "published": len(g), "theirs_slower": int((both["A800 (published): triton / torch.compile, per call"] >= 1).sum()),
                              "ours_slower": int((both["ours: triton / torch.compile, kernel time"] >= 1).sum()),
                              "theirs_max": float(theirs_r.max()), "ours_max": float(ours_r.max())}
    return {"table": table.sort_values(["direction", "dims", "l", "n"], ascending=[False, True, True, True],
                                       kind="stable"),
            "summary": summary, "path": str(path)}


def per_call(ratio: float, bound: pd.DataFrame | None, key: tuple, direction: str):
    """A per-call ratio as the published table shows it: marked host-bound where either call is."""
    cols = [(p, f"{direction}_ms") for p in (ours(), compiled().name)]
    if bound is None or bound.empty or key not in bound.index or not all(c in bound for c in cols):
        return ratio
    return f"{fmt(ratio)} {HOST_BOUND}" if any(bool(bound.loc[key, c]) for c in cols) else ratio


def figures(inputs, paths: dict) -> dict[str, str]:
    """Achieved GB/s against tokens, forward and backward, per provider (l = 0), by the time the
    bars use (kernel time where measured, else time per call); {name: why} of a figure not drawn."""
    path = paths["lrpe_bandwidth"]
    bench = providers.renamed(inputs.rows("lrpe", "bench"), "lrpe")
    ok = bench[(bench["status"] == "ok") & (bench["l"] == 0)] if not bench.empty else bench
    if ok.empty:
        return {"lrpe_bandwidth": "no LRPE benchmark case ran ok here"}
    timing, how = ("_kernel", "kernel time") if kernel_timed(ok) else ("", "time per call")
    copy = ok[ok["metric"] == "copy_gbs"][CENTER].median()
    colours = providers.colours("lrpe", ok["provider"].unique())  # provider: colour
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
