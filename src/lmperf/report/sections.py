"""Each report section's view: tables (markdown) and the numbers its prose quotes, computed from
the tidy results rows. Templates only place what these functions return."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from lmperf.bench import memory as memory_bench
from lmperf.bench import precision as precision_bench
from lmperf.bench import profile as profile_bench

CASE_KEYS = ["size", "context", "dtype", "compile", "mode", "warmup"]
# Metrics shown as mean ± std over the timed steps; the rest show the mean alone.
SPREAD_METRICS = {"forward_ms", "backward_ms", "optimizer_ms", "step_ms"}


def fmt(x: float, digits: int = 3) -> str:
    """A number with `digits` significant digits, no scientific notation for everyday sizes."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if x == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{x:,.{decimals}f}"


def mean_std(mean: float, std: float) -> str:
    return f"{fmt(mean)} ± {fmt(std, 2)}"


def table(df: pd.DataFrame) -> str:
    """Markdown table; columns that are empty in every row (e.g. MFU on a CPU) are left out."""
    if not len(df):
        return "(no rows)"
    df = df.loc[:, [c for c in df.columns if (df[c].astype(str) != "").any()]]
    return df.to_markdown(index=False, disable_numparse=True)


# ---------------------------------------------------------------------------------------------
# Environment


def measured_seconds(frames: dict[str, pd.DataFrame]) -> dict[str, float]:
    """Per section, the sum of the per-case wall times in its CSVs (process start-up excluded)."""
    out = {}
    for section, df in frames.items():
        if not df.empty and "wall_s" in df:
            out[section] = float(df.drop_duplicates(["study", "case_id"])["wall_s"].sum())
    return out


def provenance_table(frames: dict[str, pd.DataFrame], seconds: dict[str, float]) -> str:
    """Per section: the commits its rows were measured at, when, and its GPU minutes, so a
    report assembled from several runs says so."""
    rows = []
    for section, df in frames.items():
        if df.empty or "commit" not in df:
            continue
        when = pd.to_datetime(df["measured_at"], utc=True, errors="coerce").dropna()
        span = "" if when.empty else (f"{when.min():%Y-%m-%d %H:%M}" if when.min() == when.max()
                                      else f"{when.min():%Y-%m-%d %H:%M} to {when.max():%H:%M} UTC")
        rows.append({"section": section, "commit(s)": ", ".join(commits([df])), "measured": span,
                     "GPU min": fmt(seconds.get(section, 0.0) / 60)})
    return table(pd.DataFrame(rows)) if rows else ""


def env_view(env: pd.DataFrame, results: Path, scale: str,
             sections: dict[str, pd.DataFrame] | None = None) -> dict:
    seconds = measured_seconds(sections or {})
    timing = {"per_section": {k: fmt(v / 60) for k, v in seconds.items()},
              "total_min": fmt(sum(seconds.values()) / 60),
              "provenance": provenance_table(sections or {}, seconds)} if seconds else None
    if env.empty:
        return {"available": False, "why": f"no {results}/env/env.csv", "facts": {}, "table": "",
                "timing": timing}
    facts = dict(zip(env["key"], env["value"].astype(str)))
    labels = {"gpu": "GPU", "gpu_memory_gib": "GPU memory (GiB)", "gpu_multiprocessors": "GPU SMs",
              "driver": "NVIDIA driver", "cuda": "CUDA (torch build)", "torch": "torch",
              "triton": "triton", "python": "Python", "cpu": "CPU", "cpu_threads": "CPU threads (torch)",
              "os": "OS", "commit": "git commit (at measurement)", "measured_at": "measured at",
              "scale": "scale", "hw": "results folder"}
    rows = [{"": labels.get(k, k), "value": v} for k, v in facts.items()]
    return {"available": True, "facts": facts, "table": table(pd.DataFrame(rows)), "timing": timing}


def commits(frames: list[pd.DataFrame]) -> list[str]:
    found = set()
    for df in frames:
        if "commit" in df:
            found.update(df["commit"].dropna().astype(str))
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# End-to-end


def size_order(df: pd.DataFrame) -> list[str]:
    """Model sizes from smallest to largest, by their parameter counts in the results."""
    params = df[df["metric"] == "parameters"].groupby("size")["mean"].first()
    sizes = list(dict.fromkeys(df["size"]))
    return sorted(sizes, key=lambda s: params.get(s, math.inf))


def wide(df: pd.DataFrame, metrics: dict[str, str]) -> pd.DataFrame:
    """One row per case: its keys, then 'mean ± std' per metric (or the failure status)."""
    metrics = {m: label for m, label in metrics.items() if m in set(df["metric"])}
    out = []
    for case_id, g in df.groupby("case_id", sort=False):
        first = g.iloc[0]
        row = {k: first[k] for k in CASE_KEYS}
        by_metric = g.set_index("metric")
        for metric, label in metrics.items():
            if first["status"] != "ok":
                row[label] = first["status"]
            elif metric in by_metric.index:
                m = by_metric.loc[metric]
                row[label] = mean_std(m["mean"], m["std"]) if metric in SPREAD_METRICS else fmt(m["mean"])
            else:
                row[label] = ""
        out.append(row)
    return pd.DataFrame(out)


def metric_frame(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows of one metric of the ok cases, indexed by the case keys."""
    return df[(df["metric"] == metric) & (df["status"] == "ok")].set_index(CASE_KEYS)["mean"]


def ratio_range(ratios: pd.Series) -> dict:
    ratios = ratios.dropna()
    if ratios.empty:
        return {"n": 0}
    return {"n": len(ratios), "min": fmt(ratios.min()), "max": fmt(ratios.max()),
            "mean": fmt(ratios.mean())}


def e2e_view(df: pd.DataFrame) -> dict:
    if df.empty:
        return {"available": False, "why": "no end-to-end results (rule e2e_study has not run)"}
    df = df.copy()
    df["compile"] = df["compile"].astype(str).str.lower().map({"true": "compiled", "false": "eager"})
    order = {"size": {s: i for i, s in enumerate(size_order(df))},
             "dtype": {"fp32": 0, "bf16": 1}, "compile": {"eager": 0, "compiled": 1}}
    df = df.sort_values(by=CASE_KEYS, kind="stable",
                        key=lambda col: col.map(order[col.name]) if col.name in order else col)
    view = {"available": True, "studies": sorted(df["study"].unique())}
    cases = df.drop_duplicates(["study", "case_id"])  # one case id can be in several studies
    view["n_cases"] = len(cases)
    failed = cases[cases["status"] != "ok"][["study", "case_id", "status", "message"]].copy()
    failed["message"] = [m if len(m) <= 110 else m[:110] + "…" for m in failed["message"].astype(str)]
    view["failures"] = table(failed)
    view["n_failures"] = int((cases["status"] != "ok").sum())
    view["batch_size"] = int(cases["batch_size"].iloc[0])
    view["timed_steps"] = int(cases["timed_steps"].iloc[0])
    mfu = df[(df["metric"] == "mfu_pct") & (df["status"] == "ok")]
    view["has_mfu"] = not mfu.empty
    view["peaks"] = sorted(set(mfu["message"]))
    if not mfu.empty:
        best = mfu.loc[mfu["mean"].idxmax()]
        view["best_mfu"] = {"value": fmt(best["mean"]), **{k: best[k] for k in CASE_KEYS}}

    variants = df[df["study"] == "variants"]
    if not variants.empty:
        train = variants[variants["mode"] == "train"]
        view["variants_train"] = table(wide(train, {
            "forward_ms": "forward ms", "backward_ms": "backward ms", "optimizer_ms": "optimizer ms",
            "step_ms": "step ms", "tokens_per_s": "tokens/s", "mfu_pct": "MFU %",
            "peak_allocated_mib": "peak MiB", "first_step_ms": "first step ms"})
            .drop(columns=["mode", "warmup"]))
        fwd = variants[variants["mode"] == "forward"]
        view["variants_forward"] = table(wide(fwd, {
            "forward_ms": "forward ms", "tokens_per_s": "tokens/s", "mfu_pct": "MFU %",
            "peak_allocated_mib": "peak MiB", "first_step_ms": "first step ms"})
            .drop(columns=["mode", "warmup"]))
        f, b = metric_frame(train, "forward_ms"), metric_frame(train, "backward_ms")
        view["backward_over_forward"] = ratio_range(b / f)
        step = metric_frame(variants, "step_ms").reset_index()
        eager = step[step["compile"] == "eager"].pivot_table(
            index=["size", "context", "mode"], columns="dtype", values="mean")
        view["bf16_speedup_train"] = ratio_range(
            (eager["fp32"] / eager["bf16"]).xs("train", level="mode")
            if {"fp32", "bf16"} <= set(eager.columns) else pd.Series(dtype=float))
        by_compile = step.pivot_table(index=["size", "context", "dtype", "mode"], columns="compile",
                                      values="mean")
        if {"eager", "compiled"} <= set(by_compile.columns):
            speedup = by_compile["eager"] / by_compile["compiled"]
            view["compile_speedup"] = {mode: ratio_range(speedup.xs(mode, level="mode"))
                                       for mode in speedup.index.get_level_values("mode").unique()}
        else:
            view["compile_speedup"] = {}

    warmup = df[df["study"] == "warmup"]
    if not warmup.empty:
        view["warmup"] = table(wide(warmup, {"step_ms": "step ms (mean ± std)",
                                             "first_step_ms": "first step ms"})
                               .drop(columns=["compile", "mode", "context"]))
        step = warmup[(warmup["metric"] == "step_ms") & (warmup["status"] == "ok")]
        std = step.pivot_table(index="size", columns="warmup", values="std")
        lo, hi = min(std.columns), max(std.columns)
        view["warmup_std_ratio"] = {"cold": int(lo), "warm": int(hi),
                                    **ratio_range(std[lo] / std[hi])}

    context = df[df["study"] == "context"]
    if not context.empty:
        view["context"] = table(wide(context, {"step_ms": "step ms", "tokens_per_s": "tokens/s",
                                               "mfu_pct": "MFU %", "peak_allocated_mib": "peak MiB"})
                                .drop(columns=["compile", "mode", "warmup"]))
        ctx = metric_frame(context, "step_ms").reset_index()
        per = ctx.pivot_table(index=["size", "dtype"], columns="context", values="mean")
        lo, hi = min(per.columns), max(per.columns)
        view["context_growth"] = {"short": int(lo), "long": int(hi), "factor": hi // lo,
                                  **ratio_range(per[hi] / per[lo])}
        view["context_oom"] = table(context.drop_duplicates("case_id")
                                    .query("status == 'oom'")[["size", "context", "dtype"]])
    return view


# ---------------------------------------------------------------------------------------------
# Correctness: every kernel-test CSV (study "check"), one line per kernel and dtype


def correctness_view(kernel_sections: dict[str, pd.DataFrame]) -> dict:
    """One line per kernel and dtype from the `check` rows of each kernel section."""
    lines, skipped, failures = [], [], []
    for section, df in kernel_sections.items():
        if df.empty:
            continue
        df = df[df["study"] == "check"]
        ran = df[df["status"] == "ok"]
        for (impl, dtype), g in ran.groupby(["impl", "dtype"], sort=False):
            worst = g.loc[(g["mean"] / g["tolerance"]).idxmax()]
            passed = g["passed"].astype(str).str.lower() == "true"
            lines.append({"kernel": f"{section} / {impl}", "dtype": dtype,
                          "cases": g["case_id"].nunique(), "checks passed": f"{int(passed.sum())}/{len(g)}",
                          "worst error / tolerance": fmt(worst["mean"] / worst["tolerance"]),
                          "worst error": fmt(worst["mean"]), "its tolerance": fmt(worst["tolerance"]),
                          "where": f"{worst['metric'].replace('_max_abs_err', '')} {worst['case_id']}",
                          "result": "pass" if passed.all() else "FAIL"})
            failures += [f"{section}: {r.case_id} {r.metric} = {fmt(r.mean)} > {fmt(r.tolerance)}"
                         for r in g[~passed].itertuples()]
        for (impl, dtype, status, message), g in df[df["status"] != "ok"].groupby(
                ["impl", "dtype", "status", "message"], sort=False):
            skipped.append({"kernel": f"{section} / {impl}", "dtype": dtype, "status": status,
                            "cases": g["case_id"].nunique(), "why": message})
    return {"available": bool(lines or skipped), "table": table(pd.DataFrame(lines)),
            "skipped": table(pd.DataFrame(skipped)) if skipped else "", "failures": failures,
            "all_pass": bool(lines) and not failures}


# ---------------------------------------------------------------------------------------------
# FlashAttention-2 benchmark

PEERS = ["sdpa_flash", "sdpa_cudnn", "flex", "plain_compiled", "plain", "torch_tiled"]
DIRECTIONS = {"forward": "forward", "backward": "backward", "fwd_bwd": "forward+backward"}


def _bench_cell(g: pd.DataFrame, metric: str) -> str:
    if g.empty:
        return ""
    first = g.iloc[0]
    if first["status"] != "ok":
        return first["status"]
    m = g[g["metric"] == metric]
    return fmt(m["mean"].iloc[0]) if len(m) else ""


def _config_table(df: pd.DataFrame) -> tuple[str, dict]:
    """Providers x directions (ms and TFLOP/s) for one configuration, and ours/peer ratios."""
    rows, ratios = [], {}
    ms = df[df["metric"].str.endswith("_ms") & (df["status"] == "ok")].set_index(["provider", "metric"])["mean"]
    for provider, g in df.groupby("provider", sort=False):
        row = {"provider": provider}
        for d, label in DIRECTIONS.items():
            row[f"{label} ms"] = _bench_cell(g, f"{d}_ms")
            row[f"{label} TFLOP/s"] = _bench_cell(g, f"{d}_tflops")
        rows.append(row)
    for peer in PEERS:
        for d in DIRECTIONS:
            if ("triton", f"{d}_ms") in ms.index and (peer, f"{d}_ms") in ms.index:
                ratios[(peer, d)] = ms[("triton", f"{d}_ms")] / ms[(peer, f"{d}_ms")]
    order = {"triton": 0, **{p: i + 1 for i, p in enumerate(PEERS)}}
    rows.sort(key=lambda r: order.get(r["provider"], 99))
    return table(pd.DataFrame(rows)), ratios


def fa_view(bench: pd.DataFrame) -> dict:
    if bench.empty:
        return {"available": False, "why": "no benchmark results (rule flash_attention_bench has not run)"}
    ran = bench[bench["status"] == "ok"]
    if ran.empty:
        reasons = sorted(set(bench["message"].dropna()))
        return {"available": False, "why": "the benchmark did not run here: " + "; ".join(reasons)}
    view = {"available": True, "configs": []}
    for (group, dtype, causal, b, h, n, d), g in bench.groupby(
            ["group", "dtype", "causal", "batch", "heads", "seq_len", "head_dim"], sort=False):
        if group == "grid":
            continue
        text, ratios = _config_table(g)
        mode = "causal" if str(causal).lower() == "true" else "non-causal"
        notes = sorted({f"{r.provider}: {r.message}" for r in g[g["metric"] == "backward_ms"].itertuples()
                        if isinstance(r.message, str) and r.message})
        view["configs"].append({"name": f"{group}: {int(b)} x {int(h)} heads x {int(n)} tokens x "
                                        f"D {int(d)}, {dtype}, {mode}",
                                "group": group, "causal": mode, "table": text, "notes": notes,
                                "ratios": {f"{p}/{dd}": fmt(r) for (p, dd), r in ratios.items()},
                                "raw": ratios})
    # The bars, read off the same run.
    bars = []
    for c in view["configs"]:
        r = c["raw"]
        if c["group"] == "headline" and ("sdpa_flash", "fwd_bwd") in r:
            bars.append({"bar": "headline forward+backward <= 0.75x SDPA-flash time",
                         "measured": f"{fmt(r[('sdpa_flash', 'fwd_bwd')])}x",
                         "met": "yes" if r[("sdpa_flash", "fwd_bwd")] <= 0.75 else "no"})
            if ("sdpa_cudnn", "fwd_bwd") in r:
                bars.append({"bar": "stretch: headline forward+backward <= cuDNN time",
                             "measured": f"{fmt(r[('sdpa_cudnn', 'fwd_bwd')])}x",
                             "met": "yes" if r[("sdpa_cudnn", "fwd_bwd")] <= 1 else "no"})
        if c["group"] == "throughput" and c["causal"] == "non-causal" and ("sdpa_flash", "forward") in r:
            speedup = 1 / r[("sdpa_flash", "forward")]
            bars.append({"bar": "throughput forward (non-causal) >= 1.2x SDPA-flash TFLOP/s",
                         "measured": f"{fmt(speedup)}x", "met": "yes" if speedup >= 1.2 else "no"})
            if ("sdpa_cudnn", "forward") in r:
                s2 = 1 / r[("sdpa_cudnn", "forward")]
                bars.append({"bar": "stretch: throughput forward >= cuDNN TFLOP/s",
                             "measured": f"{fmt(s2)}x", "met": "yes" if s2 >= 1 else "no"})
    grid = bench[bench["group"] == "grid"]
    if not grid.empty:
        fb = grid[(grid["metric"] == "fwd_bwd_ms") & (grid["status"] == "ok")]
        wide_ms = fb.pivot_table(index=["dtype", "head_dim", "seq_len"], columns="provider", values="mean")
        if {"triton", "plain_compiled"} <= set(wide_ms.columns):
            slower = wide_ms[wide_ms["triton"] > wide_ms["plain_compiled"]]
            bars.append({"bar": "grid: nowhere slower than torch.compile'd PyTorch attention (fwd+bwd)",
                         "measured": f"slower in {len(slower)} of {int(wide_ms['plain_compiled'].notna().sum())} shapes",
                         "met": "yes" if slower.empty else "no"})
        view["grid"] = []
        for (dtype, d), g in grid.groupby(["dtype", "head_dim"], sort=False):
            cells = {}
            for (n, provider), c in g.groupby(["seq_len", "provider"], sort=False):
                cells.setdefault(n, {"N": int(n)})[provider] = _bench_cell(c, "fwd_bwd_ms")
            view["grid"].append({"dtype": dtype, "head_dim": int(d),
                                 "table": table(pd.DataFrame(list(cells.values())))})
        # why cells say `skipped` or `unsupported`: one line per provider and reason
        left_out = grid[grid["status"].isin(["skipped", "unsupported"])].drop_duplicates(["provider", "message"])
        view["grid_left_out"] = [f"{r.provider} ({r.status}): {r.message}" for r in left_out.itertuples()]
    view["bars"] = table(pd.DataFrame(bars)) if bars else ""
    return view


# ---------------------------------------------------------------------------------------------
# LRPE-cosine benchmark

LRPE_PROVIDERS = ["triton", "triton_cache", "torch", "torch_compile"]


def _faster_than_compile(val: pd.DataFrame, impl: str, direction: str, timing: str, how: str,
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
    return {"bar": f"{impl} {direction} faster than torch.compile everywhere ({how})",
            "measured": f"slowest ratio {fmt(ratio.max())}x ({detail})",
            "met": "yes" if (ratio < 1).all() and not missing else "no"}


def lrpe_view(bench: pd.DataFrame) -> dict:
    if bench.empty:
        return {"available": False, "why": "no benchmark results (rule lrpe_bench has not run)"}
    if (bench["status"] != "ok").all():
        return {"available": False, "why": "the benchmark did not run here: "
                + "; ".join(sorted(set(bench["message"].dropna())))}
    cell = lambda g, metric: _bench_cell(g, metric)
    tables = []
    # Kernel time (host left out), where the run measured it: the bars use it.
    kernel = bench["metric"].eq("forward_kernel_ms").any()
    metrics = [("ms", "time per call (ms)"), ("peak_mib", "peak memory (MiB)"),
               ("copy_fraction", "fraction of copy bandwidth, per call")]
    if kernel:
        metrics += [("kernel_ms", "kernel time (ms)"),
                    ("kernel_copy_fraction", "fraction of copy bandwidth, kernel time")]
    for (dims, l), g in bench.groupby(["dims", "l"], sort=True):
        for direction in ("forward", "backward"):
            for metric, label in metrics:
                rows = {}
                for (n, provider), c in g.groupby(["side", "provider"], sort=False):
                    rows.setdefault(n, {"n": int(n)})[provider] = cell(c, f"{direction}_{metric}")
                df = pd.DataFrame(list(rows.values()))
                df = df[["n"] + [p for p in LRPE_PROVIDERS if p in df.columns]]
                tables.append({"title": f"{int(dims)}-D, l = {int(l)}, {direction}, {label}",
                               "table": table(df)})
    ok = bench[bench["status"] == "ok"]
    val = ok.pivot_table(index=["dims", "side", "l"], columns=["provider", "metric"], values="mean")
    bars = []
    elements = val[("triton", "x_elements")] if ("triton", "x_elements") in val else pd.Series(dtype=float)
    big = elements[elements >= 16 * 2**20].index
    timing = "_kernel" if kernel else ""
    how = "kernel time" if kernel else "time per call"
    for direction in ("forward", "backward"):
        key = ("triton", f"{direction}{timing}_copy_fraction")
        if key in val and len(big):
            worst = val.loc[big, key].min()
            bars.append({"bar": f"triton {direction} >= 85% of copy bandwidth (x >= 16M elements, "
                                f"{len(big)} configs; {how})", "measured": f"worst {fmt(100 * worst)}%",
                         "met": "yes" if worst >= 0.85 else "no"})
    cache_lines = []
    for impl, out in (("triton", bars), ("triton_cache", cache_lines)):
        for direction in ("forward", "backward"):
            line = _faster_than_compile(val, impl, direction, timing, how)
            if line:
                out.append(line)
            a, b = (impl, f"{direction}_peak_mib"), ("torch_compile", f"{direction}_peak_mib")
            if a in val and b in val:
                over = (val[a] - val[b]).dropna()
                out.append({"bar": f"{impl} {direction} peak memory <= torch.compile everywhere",
                            "measured": f"largest excess {fmt(max(over.max(), 0))} MiB",
                            "met": "yes" if (over <= 0).all() else "no"})
    # With kernel times the bars use them; the same comparison per call (host included) is shown
    # beside them, since at small sizes it measures the host path of each op, not its kernels.
    per_call = [line for direction in ("forward", "backward") if kernel and (line := _faster_than_compile(
        val, "triton", direction, "", "time per call, host included", kernels_of_slower=True))]
    as_lines = lambda rows: (table(pd.DataFrame(rows).rename(columns={"bar": "line", "met": "holds"}))
                             if rows else "")
    per_call = as_lines(per_call)
    # The issue sets the bars for `triton`; the cache variant is measured against the same lines
    # for comparison (it keeps an fp32 angle table by design, so it holds more memory).
    cache_lines = as_lines(cache_lines)
    copy = ok[ok["metric"] == "copy_gbs"]["mean"]
    first = ok.iloc[0]
    setup = {k: (first[k] if k in first and pd.notna(first[k]) else "?") for k in ("batch", "heads", "d", "dtype")}
    setup = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in setup.items()}
    return {"available": True, "tables": tables, "bars": table(pd.DataFrame(bars)) if bars else "",
            "cache_lines": cache_lines, "per_call": per_call,
            "copy_gbs": fmt(copy.median()) if len(copy) else "n/a", "kernel": bool(kernel),
            "kernel_calls": int(bench["kernel_calls"].max()) if kernel and "kernel_calls" in bench else 0,
            "setup": setup}


# ---------------------------------------------------------------------------------------------
# PyTorch attention


def attention_view(df: pd.DataFrame) -> dict:
    if df.empty:
        return {"available": False, "why": "no results (rule attention has not run)"}
    rows = []
    for case_id, g in df.groupby("case_id", sort=False):
        first = g.iloc[0]
        by = g.set_index("metric")["mean"] if first["status"] == "ok" else {}
        get = lambda m: fmt(by[m]) if m in by else (first["status"] if first["status"] != "ok" else "")
        spread = lambda m: (mean_std(g.set_index("metric").loc[m, "mean"], g.set_index("metric").loc[m, "std"])
                            if m in by else get(m))
        rows.append({"impl": first["impl"], "d": int(first["head_dim"]), "N": int(first["seq_len"]),
                     "forward ms": spread("forward_ms"), "backward ms": spread("backward_ms"),
                     "held before backward (MiB)": get("allocated_before_backward_mib"),
                     "predicted (MiB)": get("predicted_saved_mib")})
    view = {"available": True, "table": table(pd.DataFrame(rows)),
            "batch": int(df["batch"].iloc[0]), "iters": int(df["iters"].iloc[0])}
    cases = df.drop_duplicates("case_id")
    oom = cases[cases["status"] == "oom"].sort_values(["seq_len", "head_dim"])
    view["first_oom"] = ({k: (int(oom.iloc[0][c]) if c != "impl" else oom.iloc[0][c])
                          for k, c in (("impl", "impl"), ("d", "head_dim"), ("N", "seq_len"))}
                         if len(oom) else None)
    held = df[(df["metric"] == "allocated_before_backward_mib") & (df["status"] == "ok")
              & (df["impl"] == "eager")].sort_values("seq_len")
    if held["seq_len"].nunique() >= 2:
        per_n = held.groupby("seq_len")["mean"].max()
        n0, n1 = per_n.index[-2], per_n.index[-1]
        view["growth"] = {"n0": int(n0), "n1": int(n1),
                          "exponent": fmt(math.log(per_n[n1] / per_n[n0]) / math.log(n1 / n0))}
    return view


# ---------------------------------------------------------------------------------------------
# Mixed precision


def precision_view(df: pd.DataFrame, e2e: pd.DataFrame) -> dict:
    view = {"available": not df.empty}
    if df.empty:
        view["why"] = "no results (rule precision has not run)"
    else:
        acc = df[df["case_id"] == "accumulation"]
        # The experiment's size, from the rows (rows written before it was recorded: the code's).
        n = int(acc["additions"].iloc[0]) if "additions" in acc and acc["additions"].notna().any() \
            else precision_bench.ADDITIONS
        x = float(acc["addend"].iloc[0]) if "addend" in acc and acc["addend"].notna().any() \
            else precision_bench.ADDEND
        view["experiment"] = {"additions": f"{n:,}", "addend": f"{x:g}", "exact": f"{n * x:g}"}
        total, err = f"sum of {n:,} x {x:g}", f"error vs {n * x:g}"
        view["accumulation"] = table(acc.assign(**{total: acc["exact"],
                                                   err: acc["error"].map(lambda e: f"{e:+.6g}")})
                                     [["variant", total, err]])
        auto = df[df["experiment"] == "autocast"]
        wide_auto = auto.pivot_table(index="tensor", columns="autocast", values="dtype", aggfunc="first")
        order = ["parameters", "fc1 output", "LayerNorm output", "logits", "loss", "gradients"]
        wide_auto = wide_auto.reindex([t for t in order if t in wide_auto.index])
        view["autocast"] = table(wide_auto.rename(columns=lambda c: f"under {c} autocast").reset_index())
    if not e2e.empty:
        v = e2e[(e2e["study"] == "variants") & (e2e["metric"] == "step_ms") & (e2e["status"] == "ok")
                & (e2e["mode"] == "train") & (e2e["compile"].astype(str).str.lower() == "false")]
        p = v.pivot_table(index="size", columns="dtype", values="mean")
        if {"fp32", "bf16"} <= set(p.columns):
            p = p.reindex([s for s in size_order(e2e) if s in p.index])
            view["dtype_speed"] = table(pd.DataFrame({
                "model": p.index, "fp32 step ms": p["fp32"].map(fmt), "bf16 step ms": p["bf16"].map(fmt),
                "speed-up (fp32 / bf16)": (p["fp32"] / p["bf16"]).map(fmt)}))
    return view


# ---------------------------------------------------------------------------------------------
# Kernel-level profile


def profile_view(df: pd.DataFrame, top: int = 10) -> dict:
    if df.empty:
        return {"available": False, "why": "no results (rule profile has not run)"}
    ok = df[df["status"] == "ok"]
    view = {"available": True, "cases": [], "steps": int(df["profiled_steps"].iloc[0]),
            "on_gpu": bool((df["gpu"] != "none").any())}
    for case_id, g in ok.groupby("case_id", sort=False):
        kernels = g[g["metric"] == "kernel_us_per_step"]
        # Rows measured before named ranges were filtered at the source (a GPU lists each
        # range as a device-side annotation) are dropped here; shares are over kernels only.
        kernels = kernels[~kernels["kernel"].map(profile_bench.is_annotation)].copy()
        kernels["share"] = kernels["mean"] / kernels.groupby("phase")["mean"].transform("sum")
        shares = kernels.pivot_table(index="phase", columns="category", values="share", aggfunc="sum")
        shares = shares.reindex([p for p in ("forward", "backward", "optimizer") if p in shares.index])
        phase_ms = kernels.groupby("phase")["mean"].sum() / 1e3
        share_table = pd.DataFrame({"phase": shares.index,
                                    "phase ms": [fmt(phase_ms[p]) for p in shares.index],
                                    **{f"{c} share": [fmt(100 * shares.loc[p, c]) + "%" if pd.notna(shares.loc[p, c]) else "0%"
                                                      for p in shares.index] for c in shares.columns}})
        tops = []
        for phase in shares.index:
            t = kernels[kernels["phase"] == phase].nlargest(top, "mean")
            tops.append({"phase": phase, "table": table(pd.DataFrame({
                "kernel": [k if len(k) <= 70 else k[:67] + "..." for k in t["kernel"]],
                "calls / step": t["calls_per_step"].map(fmt), "us / step": t["mean"].map(fmt),
                "share of phase": (100 * t["share"]).map(lambda x: fmt(x) + "%"),
                "category": t["category"]}))})
        parts = g[g["metric"] == "attention_part_us_per_step"]
        attention = table(pd.DataFrame({"part": parts["kernel"], "us / step": parts["mean"].map(fmt),
                                        "GFLOP": (parts["flops"] / 1e9).map(fmt),
                                        "TFLOP/s": parts["tflops"].map(fmt)})) if len(parts) else ""
        first = g.iloc[0]
        view["cases"].append({"name": f"{first['size']}, context {int(first['context'])}, {first['dtype']}",
                              "shares": table(share_table), "tops": tops, "attention": attention})
    failed = df.drop_duplicates("case_id")
    failed = failed[failed["status"] != "ok"]
    view["failures"] = table(failed[["case_id", "status", "message"]]) if len(failed) else ""
    return view


# ---------------------------------------------------------------------------------------------
# Memory


def memory_view(df: pd.DataFrame, results: Path, out_dir: Path) -> dict:
    if df.empty:
        return {"available": False, "why": "no results (rule memory has not run)"}
    cases = df.drop_duplicates("case_id")
    rows = []
    for case_id, g in df.groupby("case_id", sort=False):
        first = g.iloc[0]
        by = g.set_index("metric")
        cell = lambda m: fmt(by.loc[m, "mean"]) if first["status"] == "ok" and m in by.index else \
            (first["status"] if first["status"] != "ok" else "")
        html = results / "memory" / "html" / f"{case_id}.html"
        rows.append({"mode": first["mode"], "dtype": first["dtype"], "context": int(first["context"]),
                     "peak allocated (MiB)": cell("peak_allocated_mib"),
                     "peak reserved (MiB)": cell("peak_reserved_mib"),
                     "residual stream (MiB)": cell("residual_stream_mib"),
                     "allocations of that size": (str(int(by.loc["residual_stream_mib", "matching_allocations"]))
                                                  if "residual_stream_mib" in by.index else ""),
                     "snapshot": f"[html]({os.path.relpath(html, out_dir)})" if html.exists() else ""})
    ok = df[df["status"] == "ok"]
    top = ok[ok["metric"] == "allocation_mib"]
    largest = []
    for case_id, g in top.groupby("case_id", sort=False):
        largest.append({"case": case_id, "table": table(pd.DataFrame({
            "rank": g["rank"].astype(int), "MiB": g["mean"].map(fmt),
            "made by": g["made_by"].replace("(no stack)", memory_bench.NO_STACK),  # older rows
            "category": g["category"].fillna("")}))})
    first = df.iloc[0]
    return {"available": True, "table": table(pd.DataFrame(rows)), "largest": largest,
            "size": first["size"], "batch": int(first["batch_size"]),
            "on_gpu": bool((df["gpu"] != "none").any()), "n_cases": len(cases),
            "n_oom": int((cases["status"] == "oom").sum())}
