"""FlashAttention-2 (Triton) against PyTorch's attention: the bars, one table per headline
configuration, the model group (forward+backward and backward alone by GPU time), grouped-query
attention against SDPA's backends, where ours is still slower than cuDNN, the grid
(forward+backward ms per sequence length) and its TFLOP/s figure."""
from __future__ import annotations

import pandas as pd

import math

from lmperf import providers
from lmperf.report.format import HOST_BOUND, bar, cell, fmt, host_bound, host_bound_legend, unavailable
from lmperf.report.flash_attention_figures import ratio_figure, same_kernel, tflops_figure

def peers() -> list[str]:
    """The providers ours is compared with, in the registry's order (lmperf.providers): the peers,
    then any contender."""
    return providers.names("attention", role="peer") + providers.names("attention", role="contender")


# Ours: under the leaderboard's harness (torch.compile around apply) where the group has it.
OURS = providers.names("attention", role="ours")
DIRECTIONS = {"forward": "forward", "backward": "backward", "fwd_bwd": "forward+backward"}
# do_bench gives medians (and, in newer rows, the 20% and 80% quantiles), not means.
CENTER = "median"


def config_table(df: pd.DataFrame, threshold: float = math.inf) -> tuple[pd.DataFrame, dict, set, str]:
    """Providers x directions (ms and TFLOP/s) for one configuration, a host-bound time (GPU idle
    above `threshold` %) marked; ours/peer time ratios; the keys of those with a host-bound side;
    the provider that is ours in the ratios (`OURS`)."""
    rows = []
    bound = df[host_bound(df, threshold)]
    bound = set(zip(bound["provider"], bound["metric"]))
    for provider, g in df.groupby("provider", sort=False):
        row = {"provider": provider}
        for d, label in DIRECTIONS.items():
            row[f"{label} ms"] = cell(g, f"{d}_ms", spread=True, column=CENTER)
            if (provider, f"{d}_ms") in bound:
                row[f"{label} ms"] = f"{row[f'{label} ms']} {HOST_BOUND}"
            row[f"{label} TFLOP/s"] = cell(g, f"{d}_tflops", column=CENTER)
        rows.append(row)
    ms = df[df["metric"].str.endswith("_ms") & (df["status"] == "ok")].set_index(["provider", "metric"])[CENTER]
    ours = next((p for p in OURS if (p, "fwd_bwd_ms") in ms.index), "triton")
    ratios = {(peer, d): ms[(ours, f"{d}_ms")] / ms[(peer, f"{d}_ms")]
              for peer in peers() for d in DIRECTIONS
              if (ours, f"{d}_ms") in ms.index and (peer, f"{d}_ms") in ms.index}
    host = {(peer, d) for peer, d in ratios if {(ours, f"{d}_ms"), (peer, f"{d}_ms")} & bound}
    if (ours, "fwd_bwd_ms") in ms.index:
        ratios[("ms", "fwd_bwd")] = ms[(ours, "fwd_bwd_ms")]
    order = {p: i for i, p in enumerate(OURS + peers())}
    rows.sort(key=lambda r: order.get(r["provider"], 99))
    return pd.DataFrame(rows), ratios, host, ours


def bars(configs: list[dict], grid: pd.DataFrame, model: pd.DataFrame, limits: dict) -> list[dict]:
    """The section's bars, read off the same run; thresholds from config/config.yaml's report."""
    out = []
    for c in configs:
        r = c["ratios"]

        def ratio_bar(key, text, x, measured, met):  # a ratio with a host-bound side claims nothing
            if key in c.get("host_bound", ()):
                return bar(text, x, f"{measured} (host-bound {HOST_BOUND}: not claimed)", False)
            return bar(text, x, measured, met)
        if c["group"] == "headline" and ("sdpa_flash", "fwd_bwd") in r:
            x, limit = r[("sdpa_flash", "fwd_bwd")], limits["headline_vs_sdpa_flash"]
            out.append(ratio_bar(("sdpa_flash", "fwd_bwd"), f"headline forward+backward <= {limit:g}x SDPA-flash "
                                 "time (leaderboard harness)", x, f"{fmt(x)}x", x <= limit))
            x, limit = r[("ms", "fwd_bwd")], limits["headline_ms"]
            out.append(bar(f"headline forward+backward <= {limit:g} ms", x, f"{fmt(x)} ms", x <= limit))
            if ("sdpa_cudnn", "fwd_bwd") in r:
                x, limit = r[("sdpa_cudnn", "fwd_bwd")], limits["headline_vs_sdpa_cudnn"]
                out.append(ratio_bar(("sdpa_cudnn", "fwd_bwd"), "further: headline forward+backward <= cuDNN time",
                                     x, f"{fmt(x)}x", x <= limit))
        if c["group"] == "throughput" and ("sdpa_flash", "forward") in r:
            direction, label = (("forward", "forward (non-causal)") if c["causal"] == "non-causal"
                                else ("fwd_bwd", "forward+backward (causal)"))
            x, limit = 1 / r[("sdpa_flash", direction)], limits["throughput_vs_sdpa_flash"]
            out.append(ratio_bar(("sdpa_flash", direction), f"throughput {label} >= {limit:g}x SDPA-flash TFLOP/s",
                                 x, f"{fmt(x)}x", x >= limit))
            if ("sdpa_cudnn", direction) in r:
                x, limit = 1 / r[("sdpa_cudnn", direction)], limits["throughput_vs_sdpa_cudnn"]
                out.append(ratio_bar(("sdpa_cudnn", direction), f"further: throughput {label} >= cuDNN TFLOP/s",
                                     x, f"{fmt(x)}x", x >= limit))
    if not model.empty:
        gpu = model.attrs.get("metric") == "fwd_bwd_gpu_ms"
        how = "GPU time (CUDA graph)" if gpu else "time"
        for peer, label in (("sdpa_flash", ""), ("sdpa_cudnn", "further: ")):
            if peer == "sdpa_cudnn" and same_kernel(model, "sdpa_flash", "sdpa_cudnn"):
                out.append(bar(f"{label}model group: forward+backward {how} no slower than {peer} at every shape",
                               float("nan"), "not measured: " + SAME_KERNEL, False))
            elif f"ours / {peer}" in model:
                ratio = model[f"ours / {peer}"].dropna()
                slower = int((ratio > 1).sum())
                out.append(bar(f"{label}model group: forward+backward {how} no slower than {peer} at every shape",
                               slower, f"slower at {slower} of {len(ratio)} shapes (worst {fmt(ratio.max())}x)",
                               slower == 0))
    for metric, how in (("fwd_bwd_gpu_ms", "GPU time (CUDA graph)"), ("fwd_bwd_ms", "do_bench")):
        slower, shapes = grid_slower(grid, metric)
        if shapes:
            out.append(bar(f"grid: nowhere slower than torch.compile'd PyTorch attention (fwd+bwd, {how})", slower,
                           f"slower in {slower} of {shapes} shapes", slower == 0))
            break  # the GPU time where it was measured; the do_bench count is in the grid's notes
    return out


SAME_KERNEL = ("sdpa_cudnn's times equal sdpa_flash's at every shape: under torch.compile, Inductor's graph "
               "cache does not key on the SDPA backend (pytorch/pytorch#185449), so one ran the graph compiled "
               "for the other (most likely sdpa_cudnn ran sdpa_flash's: they run in that order)")


def grid_slower(grid: pd.DataFrame, metric: str) -> tuple[int, int]:
    """(shapes where ours is slower than torch.compile'd attention, shapes compared) by `metric`."""
    fb = grid[(grid["metric"] == metric) & (grid["status"] == "ok")] if not grid.empty else grid
    if fb.empty:
        return 0, 0
    wide_ms = fb.pivot_table(index=["dtype", "head_dim", "seq_len"], columns="provider", values=CENTER)
    if not {"triton", "plain_compiled"} <= set(wide_ms.columns):
        return 0, 0
    both = wide_ms[["triton", "plain_compiled"]].dropna()
    return int((both["triton"] > both["plain_compiled"]).sum()), len(both)


def view(inputs) -> dict:
    bench = inputs.rows("flash_attention", "bench")
    if bench.empty:
        return unavailable("no benchmark results (rule flash_attention_bench has not run)")
    if (bench["status"] != "ok").all():
        return unavailable("the benchmark did not run here: " + "; ".join(sorted(set(bench["message"].dropna()))),
                           providers=provider_rows(bench))
    if CENTER not in bench:  # rows with a mean only (one sample: the same number)
        bench = bench.assign(**{CENTER: bench["mean"]})
    # K/V heads (grouped-query attention); rows from before GQA have as many as query heads
    bench = bench.assign(kv_heads=bench["kv_heads"].fillna(bench["heads"]) if "kv_heads" in bench else bench["heads"])
    configs = []
    for (group, dtype, causal, b, h, kv, n, d), g in bench.groupby(
            ["group", "dtype", "causal", "batch", "heads", "kv_heads", "seq_len", "head_dim"], sort=False):
        if group in ("grid", "model"):
            continue
        table, ratios, host, ours = config_table(g, inputs.bars.get("host_bound_idle_pct", math.inf))
        mode = "causal" if str(causal).lower() == "true" else "non-causal"
        notes = sorted({f"{r.provider}: {r.message}" for r in g[g["metric"] == "backward_ms"].itertuples()
                        if isinstance(r.message, str) and r.message})
        heads = f"{int(h)} heads" + (f" over {int(kv)} K/V heads" if kv != h else "")
        configs.append({"name": f"{group}: {int(b)} x {heads} x {int(n)} tokens x D {int(d)}, {dtype}, {mode}",
                        "group": group, "causal": mode, "table": table, "notes": notes, "ratios": ratios,
                        "host_bound": host, "ours": ours,
                        "forward_tflops": {p: v for p, v in g[(g["metric"] == "forward_tflops") & (g["status"] == "ok")]
                                           .set_index("provider")[CENTER].items()}})
    grid = bench[bench["group"] == "grid"]
    model = model_table(bench[bench["group"] == "model"])
    threshold = inputs.bars.get("host_bound_idle_pct", math.inf)
    model_host = marked(model_table(bench[bench["group"] == "model"], "fwd_bwd_ms"), bench[bench["group"] == "model"],
                        "fwd_bwd_ms", threshold)
    model_backward = model_table(bench[bench["group"] == "model"], "backward_gpu_ms")
    timed = bench[bench["group"].isin([c["group"] for c in configs]) & bench["metric"].str.endswith("_ms")]
    view = {"available": True, "configs": configs,
            "host_bound": host_bound_legend(timed, inputs.bars.get("host_bound_idle_pct", math.inf)), "model": model, "model_host": model_host,
            "model_backward": model_backward, "gqa": gqa_table(bench[bench["group"] == "gqa"]),
            "model_same_kernel": SAME_KERNEL if same_kernel(model, "sdpa_flash", "sdpa_cudnn") else "",
            "bars": pd.DataFrame(bars(configs, grid, model, inputs.bars["flash_attention"]))}
    view["ratios"] = ratio_table(configs, view["host_bound"]["mark"])
    view["losses"] = loss_table(configs, model, model_backward)
    if not grid.empty:
        view["grid"] = grid_tables(grid, threshold)
        view["grid_speedups"] = grid_speedups(grid)
        view["grid_head_dims"] = sorted(int(d) for d in grid["head_dim"].unique())
        view["grid_slower"] = {m: grid_slower(grid, m) for m in ("fwd_bwd_gpu_ms", "fwd_bwd_ms")}
        left_out = grid[grid["status"].isin(["skipped", "unsupported"])].drop_duplicates(["provider", "message"])
        view["grid_left_out"] = [f"{r.provider} ({r.status}): {r.message}" for r in left_out.itertuples()]
    return view


def provider_rows(bench: pd.DataFrame) -> list[dict]:
    """Every provider of the benchmark's rows, in their order, with its role (ours, peer,
    contender: lmperf.providers), its number of cases and their statuses: what a run that timed
    nothing (no GPU) still shows, so that a contender or a new peer is seen to reach the job."""
    out = []
    for name, g in bench.drop_duplicates("case_id").groupby("provider", sort=False):
        known = providers.find(name)
        out.append({"provider": name, "role": known.role if known else "unregistered", "cases": len(g),
                    "statuses": ", ".join(f"{n} {status}" for status, n in g["status"].value_counts().items())})
    return out


def marked(table: pd.DataFrame, rows: pd.DataFrame, metric: str, threshold: float) -> pd.DataFrame:
    """`table` (a `model_table` by do_bench's `metric`) with each host-bound time, and each ratio
    with a host-bound side, marked: a host-bound wall time is the host's, not the kernel's."""
    if table.empty or not math.isfinite(threshold):
        return table
    fb = rows[(rows["metric"] == metric) & (rows["status"] == "ok")]
    fb = fb.assign(model=fb["model"].fillna("").astype(str).replace("", "(no model)") if "model" in fb else "(no model)")
    bound = fb[host_bound(fb, threshold)]
    keys = set(zip(bound["model"], bound["batch"].astype(int), bound["heads"].astype(int),
                   bound["head_dim"].astype(int), bound["seq_len"].astype(int), bound["provider"]))
    out = table.astype(object)
    names = {"ours (triton)": "triton"}
    for i, r in table.iterrows():
        key = (r["model"], int(r["batch"]), int(r["heads"]), int(r["D"]), int(r["N"]))
        for column in table.columns:
            provider = names.get(column, column)
            if (*key, provider) in keys:
                out.at[i, column] = f"{fmt(r[column])} {HOST_BOUND}"
            if str(column).startswith("ours / ") and ({(*key, "triton"), (*key, column[len("ours / "):])} & keys) \
                    and pd.notna(r[column]):
                out.at[i, column] = f"{fmt(r[column])} {HOST_BOUND}"
    out.attrs.update(table.attrs)
    return out


def model_table(model: pd.DataFrame, metric: str | None = None) -> pd.DataFrame:
    """The model group: one row per model size and context, forward+backward ms of every
    provider (the leaderboard's harness), and ours / each SDPA backend. By `metric`, else the
    GPU time (CUDA graph) where it was measured, else do_bench's; `.attrs["metric"]` says which."""
    if metric is None:
        metric = "fwd_bwd_gpu_ms" if not model.empty and (model["metric"] == "fwd_bwd_gpu_ms").any() else "fwd_bwd_ms"
    fb = model[(model["metric"] == metric) & (model["status"] == "ok")] if not model.empty else model
    if fb.empty:
        return pd.DataFrame()
    # shapes of no model size (the group's head-dim-128 case) are named by their shape
    fb = fb.assign(model=fb["model"].fillna("").astype(str) if "model" in fb else "")
    fb = fb.assign(model=fb["model"].where(fb["model"] != "", "(no model)"))
    keys = ["model", "batch", "heads", "head_dim", "seq_len"]
    wide_ms = fb.pivot_table(index=keys, columns="provider", values=CENTER, sort=False)
    out = wide_ms.reset_index()
    for key in keys[1:]:  # batch, heads, head dim, N: integers
        out[key] = out[key].astype(int)
    for peer in ("sdpa_flash", "sdpa_cudnn"):
        if {"triton", peer} <= set(wide_ms.columns):
            out[f"ours / {peer}"] = (wide_ms["triton"] / wide_ms[peer]).to_numpy()
    out = out.rename(columns={"seq_len": "N", "head_dim": "D", "triton": "ours (triton)"})
    out.attrs["metric"] = metric
    return out


def ratio_table(configs: list[dict], mark: str) -> pd.DataFrame:
    """Ours / each peer's time, one row per configuration and pass (below 1 ours is faster), a
    ratio with a host-bound side marked."""
    rows = []
    for c in configs:
        for d, label in DIRECTIONS.items():
            row = {"configuration": c["name"], "pass": label}
            for peer in peers():
                if (peer, d) in c["ratios"]:
                    r = c["ratios"][(peer, d)]
                    row[f"ours / {peer}"] = f"{fmt(r)} {mark}" if (peer, d) in c["host_bound"] else r
            if len(row) > 2:
                rows.append(row)
    return pd.DataFrame(rows)


def loss_table(configs: list[dict], model: pd.DataFrame, model_backward: pd.DataFrame) -> pd.DataFrame:
    """Where ours is still slower than cuDNN (ours / cuDNN time > 1), from the same runs: each
    configuration's directions (do_bench), and the model group's forward+backward and backward
    (GPU time where measured)."""
    rows = []
    for c in configs:
        for direction, label in DIRECTIONS.items():
            r = c["ratios"].get(("sdpa_cudnn", direction))
            if r is not None and r > 1:
                rows.append({"shape": c["name"], "pass": label, "ours / cuDNN": r})
    for table, label in ((model, "forward+backward"), (model_backward, "backward")):
        if "ours / sdpa_cudnn" not in table:
            continue
        how = "GPU time" if table.attrs.get("metric", "").endswith("gpu_ms") else "do_bench"
        for r in table.to_dict("records"):
            if r["ours / sdpa_cudnn"] > 1:
                rows.append({"shape": f"model group: {r['model']}, {r['batch']} x {r['heads']} heads x {r['N']} tokens "
                                      f"x D {r['D']}", "pass": f"{label} ({how})", "ours / cuDNN": r["ours / sdpa_cudnn"]})
    return pd.DataFrame(rows)


def gqa_table(gqa: pd.DataFrame) -> pd.DataFrame:
    """Grouped-query attention: one row per shape, ours and each SDPA backend (enable_gqa) by
    GPU time (CUDA graph) where measured, else do_bench: forward and forward+backward ms, and
    ours / peer."""
    if gqa.empty:
        return pd.DataFrame()
    gpu = (gqa["metric"] == "fwd_bwd_gpu_ms").any()
    metrics = {"forward": "forward_gpu_ms" if gpu else "forward_ms", "fwd+bwd": "fwd_bwd_gpu_ms" if gpu else "fwd_bwd_ms"}
    keys = ["batch", "heads", "kv_heads", "head_dim", "seq_len"]
    rows = []
    for shape, g in gqa[gqa["status"] == "ok"].groupby(keys, sort=False):
        row = dict(zip(["B", "H", "H_kv", "D", "N"], (int(x) for x in shape)))
        ms = g.set_index(["provider", "metric"])[CENTER]
        for label, metric in metrics.items():
            for provider in ("triton", "sdpa_flash", "sdpa_cudnn"):
                if (provider, metric) in ms.index:
                    row[f"{label} ms, {'ours' if provider == 'triton' else provider}"] = ms[(provider, metric)]
            for peer in ("sdpa_flash", "sdpa_cudnn"):
                if ("triton", metric) in ms.index and (peer, metric) in ms.index:
                    row[f"{label}: ours / {peer}"] = ms[("triton", metric)] / ms[(peer, metric)]
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["metric"] = "GPU time (CUDA graph)" if gpu else "do_bench"
    return out


# The grid's reference for speed-ups: PyTorch attention under torch.compile, the one peer whose
# grid rows have GPU time beside ours (the others are timed by do_bench alone).
GRID_REFERENCE = "plain_compiled"
PASSES = {"forward": "forward_gpu_ms", "backward": "backward_gpu_ms", "forward+backward": "fwd_bwd_gpu_ms"}


def grid_speedups(grid: pd.DataFrame) -> list[dict]:
    """Per dtype: one row per head dim and sequence length, forward, backward and
    forward+backward, ours and torch.compile'd PyTorch attention by GPU time (CUDA graph), and the
    speed-up (its time / ours); the head dims the grid has, for the template to name those it lacks."""
    ok = grid[(grid["status"] == "ok") & grid["metric"].isin(PASSES.values())] if not grid.empty else grid
    if ok.empty:
        return []
    wide = ok.pivot_table(index=["dtype", "head_dim", "seq_len"], columns=["metric", "provider"], values=CENTER)
    out = []
    for dtype, g in wide.groupby(level="dtype", sort=False):
        rows = []
        for (_, d, n), r in g.iterrows():
            row = {"D": int(d), "N": int(n)}
            for label, metric in PASSES.items():
                ours, ref = r.get((metric, "triton")), r.get((metric, GRID_REFERENCE))
                row[f"{label}: ours ms"], row[f"{label}: compiled ms"] = ours, ref
                row[f"{label}: speed-up"] = ref / ours if pd.notna(ours) and pd.notna(ref) else None
            rows.append(row)
        out.append({"dtype": dtype, "table": pd.DataFrame(rows)})
    return out


def grid_tables(grid: pd.DataFrame, threshold: float = math.inf) -> list[dict]:
    """Per dtype and head dim: forward+backward ms, one row per sequence length, one column per
    provider (do_bench, a host-bound time marked), and the GPU time beside it where measured."""
    out = []
    for (dtype, d), g in grid.groupby(["dtype", "head_dim"], sort=False):
        cells = {}
        gpu = {}
        for (n, provider), c in g.groupby(["seq_len", "provider"], sort=False):
            value = cell(c, "fwd_bwd_ms", spread=True, column=CENTER)
            if host_bound(c[c["metric"] == "fwd_bwd_ms"], threshold).any():
                value = f"{value} {HOST_BOUND}"
            cells.setdefault(n, {"N": int(n)})[provider] = value
            if (c["metric"] == "fwd_bwd_gpu_ms").any():
                gpu.setdefault(n, {})[f"{provider}, GPU"] = cell(c, "fwd_bwd_gpu_ms", spread=True, column=CENTER)
        for n, extra in gpu.items():
            cells[n].update(extra)
        out.append({"dtype": dtype, "head_dim": int(d), "table": pd.DataFrame(list(cells.values()))})
    return out


def figures(inputs, paths: dict) -> dict[str, str]:
    """The grid's forward+backward TFLOP/s against sequence length by GPU time (CUDA graph) alone,
    for the providers whose rows have it (ours and torch.compile'd PyTorch attention), one panel
    per dtype and head dim; and ours over each peer's time across shapes, GPU time on both sides
    (`ratio_figure`). {name: why} of a figure not drawn."""
    bench = inputs.rows("flash_attention", "bench")
    if not bench.empty and CENTER not in bench:  # rows with a mean only (one sample: the same number)
        bench = bench.assign(**{CENTER: bench["mean"]})
    model = model_table(bench[bench["group"] == "model"], "fwd_bwd_gpu_ms") if not bench.empty else pd.DataFrame()
    return {**tflops_figure(bench, paths["fa_tflops"]), **ratio_figure(bench, model, GRID_REFERENCE, paths["fa_ratio"])}
