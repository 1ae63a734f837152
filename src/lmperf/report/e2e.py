"""End-to-end Transformer timings: the variants (dtype x compile), warm-up and context studies of
`results/<hw>/e2e/`, with MFU against each case's peak, energy per token (report/energy.py: one
value over the timed steps), and their figures. Every timing is a median over the timed steps,
shown with its 20%-80% quantiles where it has a spread, and every ratio is a ratio of medians. The model sizes' order (`size_order`), the phase metrics shown with
their spread and `with_quantiles` are shared with the ladder's section (report/ladder.py)."""
from __future__ import annotations

import math

import pandas as pd

from lmperf import hardware, stats
from lmperf.report import energy
from lmperf.report.format import HOST_BOUND, Spread, cell, host_bound, host_bound_legend, idle_text, ratio_range, stop_rule, unavailable
from lmperf.report.context_growth import context_growth
from lmperf.report.plot import plt, save

CASE_KEYS = ["size", "context", "dtype", "compile", "mode", "warmup"]
# Metrics shown as median [20%, 80%] over the timed steps; the rest show the median alone.
SPREAD_METRICS = {"forward_ms", "backward_ms", "optimizer_ms", "step_ms"}


def size_order(df: pd.DataFrame) -> list[str]:
    """Model sizes from smallest to largest, by their parameter counts in the results."""
    params = df[df["metric"] == "parameters"].groupby("size")["mean"].first()
    sizes = list(dict.fromkeys(df["size"]))
    return sorted(sizes, key=lambda s: params.get(s, math.inf))


def with_quantiles(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with each one's median and 20% / 80% quantiles completed from its samples where
    they are missing (results written before the rows recorded their quantiles)."""
    if df.empty or "samples" not in df:
        return df
    df = df.reindex(columns=[*df.columns, *(c for c in ("median", "q20", "q80") if c not in df)])
    done = [stats.complete(stats.Quantiles(*q), stats.parse_samples(s)) for q, s in
            zip(df[["median", "q20", "q80"]].astype(float).itertuples(index=False), df["samples"])]
    return df.assign(**dict(zip(("median", "q20", "q80"), map(list, zip(*done))))) if done else df


# MFU against the bf16 tensor-core peak, every row whatever its dtype (so that rows compare), and
# for a row of another dtype its share of that dtype's own peak (fp32 without tensor cores: 67
# TFLOP/s on an H100, so an fp32 step looks well used there while it uses a few % of the GPU).
BF16_MFU = "mfu_bf16_pct"
STATS = ("mean", "std", "median", "q20", "q80", "min", "max")


def with_bf16_mfu(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with an `mfu_bf16_pct` row for every ok case with MFU (`mfu_pct`, against its
    dtype's peak) and none against the bf16 peak (results written before the benchmarks
    recorded it): a bf16 case's `mfu_pct` (the same peak), another's TFLOP/s over the dense bf16
    peak of its GPU (`hardware.peak_tflops`)."""
    if df.empty or "metric" not in df:
        return df
    key = lambda d: pd.Series(list(zip(d["study"], d["case_id"])), index=d.index, dtype=object)
    have = set(key(df[df["metric"] == BF16_MFU]))
    ok = df[(df["status"] == "ok") & ~key(df).isin(have)]
    mfu = ok[ok["metric"] == "mfu_pct"]
    own = mfu[precision(mfu) == "bf16"]
    other = set(key(mfu[precision(mfu) != "bf16"]))
    rate = ok[(ok["metric"] == "tflops") & key(ok).isin(other)]
    if "gpu" in rate:
        peak = rate["gpu"].astype(str).map(lambda gpu: hardware.peak_tflops(gpu, "bf16")).astype(float)
    else:
        peak = pd.Series(math.nan, index=rate.index)
    rate, peak = rate[peak.notna()], peak[peak.notna()]
    derived = rate.assign(unit="%", peak_tflops=peak, samples=math.nan,
                          **{c: 100 * rate[c] / peak for c in STATS if c in rate})
    return pd.concat([df, own.assign(metric=BF16_MFU), derived.assign(metric=BF16_MFU)], ignore_index=True)


def mfu_columns(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """The rows without the own-dtype MFU of bf16 cases (the bf16 column has it), and the MFU
    columns {metric: label}: against the bf16 peak, then the other dtypes' own peaks, named
    ("MFU % of fp32 peak", "MFU % of fp32 / tf32 peak")."""
    mfu = df["metric"] == "mfu_pct"
    if not mfu.any():
        return df, {BF16_MFU: "MFU % of bf16 peak"}
    bf16 = mfu & (precision(df) == "bf16")
    others = [d for d in ("fp32", "tf32", "fp16") if d in set(precision(df[mfu & ~bf16]))]
    return df[~bf16], {BF16_MFU: "MFU % of bf16 peak", "mfu_pct": f"MFU % of {' / '.join(others)} peak"}


def wide(df: pd.DataFrame, metrics: dict[str, str], threshold: float = math.inf) -> pd.DataFrame:
    """One row per case: its keys, then each metric's value (a Spread for the phase times, the
    status for a case that did not run; `joules_per_token` as J/token and the mean power against
    the limit, report/energy.py), and its GPU idle %, marked host-bound above `threshold`."""
    metrics = {m: label for m, label in metrics.items() if m in set(df["metric"])}
    out = []
    for _, g in df.groupby("case_id", sort=False):
        row = {k: g.iloc[0][k] for k in CASE_KEYS}
        for metric, label in metrics.items():
            if metric == energy.JOULES:
                row.update(energy.columns(g))
            else:
                row[label] = cell(g, metric, spread=metric in SPREAD_METRICS, column="median")
        row["GPU idle %"] = idle_text(cell(g, "step_ms", column="gpu_idle_pct") if "gpu_idle_pct" in g else None,
                                      threshold)
        out.append(row)
    return pd.DataFrame(out)


def marked(cells: pd.Series) -> pd.Series:
    """Per cell of a table's "GPU idle %" column: whether it carries the host-bound mark."""
    return cells.map(lambda v: isinstance(v, str) and v.endswith(HOST_BOUND))


def table_legend(table: pd.DataFrame, legend: dict) -> dict:
    """The host-bound legend under one table (templates/host_bound.md.j2): the section's
    threshold and whether idle time was measured at all, with `n` the rows of *this* table that
    carry the mark."""
    n = int(marked(table["GPU idle %"]).sum()) if table is not None and "GPU idle %" in table else 0
    return {**legend, "n": n}


def metric_frame(df: pd.DataFrame, metric: str) -> pd.Series:
    """Medians of one metric of the ok cases that are not host-bound (`claimable`), indexed by
    the case keys: what the section's ratios are taken from."""
    ok = df[(df["metric"] == metric) & (df["status"] == "ok")]
    return ok[ok["claimable"] if "claimable" in ok else True].set_index(CASE_KEYS)["median"]


def mark_host_bound(df: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """The rows with `claimable`: False for every row of a case whose step is host-bound."""
    step = df[df["metric"] == "step_ms"]
    step = step[host_bound(step, threshold)]
    bound = set(zip(step["study"], step["case_id"]))
    return df.assign(claimable=[(s, c) not in bound for s, c in zip(df["study"], df["case_id"])])


def ordered(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["compile"] = df["compile"].astype(str).str.lower().map({"true": "compiled", "false": "eager"})
    return ordered_rows(df)


def ordered_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by their case keys: sizes smallest first, fp32 before bf16, eager before
    compiled (`compile` as `ordered` writes it)."""
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


def failures(cases: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The cases (one row each) that are not ok: their keys, status and message, cut at 110
    characters."""
    failed = cases[cases["status"] != "ok"][[*keys, "status", "message"]].copy()
    failed["message"] = [m if len(m) <= 110 else m[:110] + "…" for m in failed["message"].astype(object).fillna("").astype(str)]
    return failed


def view(inputs) -> dict:
    df = inputs.rows("e2e")
    if df.empty:
        return unavailable("no end-to-end results (rule e2e_study has not run)")
    threshold = inputs.bars.get("host_bound_idle_pct", math.inf)
    df = mark_host_bound(ordered(with_bf16_mfu(with_quantiles(df))), threshold)
    view = {"available": True, "studies": sorted(df["study"].unique()),
            "host_bound": host_bound_legend(df[df["metric"] == "step_ms"], threshold)}
    cases = df.drop_duplicates(["study", "case_id"])  # one case id can be in several studies
    view["n_cases"] = len(cases)
    view["failures"] = failures(cases, ["study", "case_id"])
    view["n_failures"] = len(view["failures"])
    view["batch_size"] = int(cases["batch_size"].iloc[0])
    view["timed_steps"] = int(cases["timed_steps"].iloc[0])
    if "timed_window_s" in cases and cases["timed_window_s"].notna().any():  # rows of a windowed run
        view["min_timed_steps"] = int(cases["min_timed_steps"].iloc[0])
        view["timed_window_s"] = float(cases["timed_window_s"].iloc[0])
    view["stop_rule"] = stop_rule(cases[cases["status"] == "ok"])
    mfu = df[(df["metric"] == "mfu_pct") & (df["status"] == "ok")]
    view["has_mfu"] = not mfu.empty
    view["peaks"] = peaks(mfu)
    view["best_mfu"] = best_mfu(df)
    view["models"] = model_table(df, inputs.models, named_sizes(inputs.frames))
    view["optimizers"] = sorted(set((df["optimizer"] if "optimizer" in df else pd.Series(dtype=str))
                                    .fillna("foreach")) or {"foreach"})
    df, view["mfu_columns"] = mfu_columns(df)
    view.update(variants(df[df["study"] == "variants"], view["mfu_columns"], threshold))
    view.update(warmup(study_rows(df, "warmup"), threshold))
    view.update(context(study_rows(df, "context"), view["mfu_columns"], threshold))
    view.update(compile_study(df, threshold))
    # one legend per table: its count is the rows of that table marked host-bound
    view["legends"] = {name: table_legend(view[name], view["host_bound"])
                       for name in ("variants_train", "variants_forward", "warmup", "context", "compile") if name in view}
    view["warmup_sizes"] = warmup_sizes(df)
    view["deep_target"] = deep_target_cases(df)
    return view


def deep_target_cases(df: pd.DataFrame) -> dict:
    """Which rows the deep target measured (their `deep_target` mark, report/rows.py: the files a
    plan marks deep): {study: its sizes measured so}, in size order; {} where none is marked."""
    if "deep_target" not in df:
        return {}
    deep = df[df["deep_target"].eq(True)]
    order = size_order(df)
    return {study: [s for s in order if s in set(g["size"])] for study, g in deep.groupby("study", sort=True)}


def warmup_sizes(df: pd.DataFrame) -> dict:
    """Which model sizes the warm-up study ran (with no warm-up step and with one), and which of
    the sizes the variants study ran it left out: {"measured": [...], "missing": [...]}."""
    warm = df[df["study"] == "warmup"]
    measured = [s for s in size_order(df) if s in set(warm["size"])]
    every = [s for s in size_order(df) if s in set(df[df["study"] == "variants"]["size"])]
    return {"measured": measured, "missing": [s for s in every if s not in measured]}


# The sections whose rows name model sizes (their `size` column), beside the end-to-end rows
SIZED_SECTIONS = ("ladder", "profile", "memory", "convergence", "distributed")


def named_sizes(frames: dict) -> list[str]:
    """The model sizes the other sections' rows name (the profile's, the ladder's, ...): the
    table of models lists each, so that every size the report names has its dimensions."""
    out = []
    for section in SIZED_SECTIONS:
        df = frames.get(section)
        if df is not None and not df.empty and "size" in df:
            out += [str(s) for s in df["size"].dropna().unique()]
    return list(dict.fromkeys(out))


def body_parameters(m: dict) -> int:
    """A size's parameters without the token embedding and the output head, from its dimensions:
    q, o; k, v; SwiGLU; two norms a block, and the final norm."""
    d, f, layers, heads = m["d_model"], m["d_ff"], m["n_layers"], m["n_heads"]
    d_kv = d // heads * (m.get("n_kv_heads") or heads)
    return layers * (2 * d * d + 2 * d * d_kv + 3 * d * f + 2 * d) + d


def model_table(df: pd.DataFrame, models: dict, named: list[str] = ()) -> pd.DataFrame:
    """One row per model size in the rows, then per size of `named` (the other sections') that
    they lack: its dimensions as configured (`models`, from config/config.yaml), the contexts it
    ran at end to end, and its parameters as the benchmark counted them, with and without the
    embeddings (the token embedding and the untied output head, vocabulary x d_model each). The
    vocabulary is what the count implies: the count less the Transformer blocks and the final
    norm that the dimensions give, over 2 x d_model. Every size shares one vocabulary, so a size
    whose count implies another one (or none: not a positive whole number) was measured with
    other dimensions than the configuration's: its row says so instead of counting. A size not
    timed end to end here is counted from its dimensions and the shared vocabulary (`counted`
    says which)."""
    params = df[(df["metric"] == "parameters") & (df["status"] == "ok")].groupby("size")["median"].first()
    rows = []
    for size in size_order(df):
        if size not in models or size not in params.index:
            continue
        m = models[size]
        body, total = body_parameters(m), int(params[size])
        contexts = sorted(set(df[df["size"] == size]["context"].astype(int)))
        rows.append({"model": size, "d_model": m["d_model"], "layers": m["n_layers"], "heads": m["n_heads"],
                     "d_ff": m["d_ff"], "contexts": ", ".join(f"{c:,}" for c in contexts),
                     "parameters (B)": total / 1e9, "without embeddings (B)": body / 1e9,
                     "vocabulary": (total - body) / (2 * m["d_model"]), "counted": "by the benchmark",
                     "_parameters": total, "_body": body})
    table = pd.DataFrame(rows)
    if not table.empty:
        shared = table["vocabulary"].mode().iloc[0]
        wrong = (table["vocabulary"] != shared) | (table["vocabulary"] <= 0) | (table["vocabulary"] % 1 != 0)
        table["without embeddings (B)"] = table["without embeddings (B)"].astype(object).where(
            ~wrong, "the configuration's dimensions do not give the measured count")
        table["vocabulary"] = table["vocabulary"].where(~wrong)
    vocab = table["vocabulary"].dropna() if not table.empty else pd.Series(dtype=float)
    extra = [s for s in dict.fromkeys(named) if s in models and (table.empty or s not in set(table["model"]))]
    more = []
    for size in extra:
        m = models[size]
        body = body_parameters(m)
        total = body + 2 * int(vocab.iloc[0]) * m["d_model"] if len(vocab) else None
        more.append({"model": size, "d_model": m["d_model"], "layers": m["n_layers"], "heads": m["n_heads"],
                     "d_ff": m["d_ff"], "contexts": "not timed end to end here",
                     "parameters (B)": total / 1e9 if total else None, "without embeddings (B)": body / 1e9,
                     "vocabulary": vocab.iloc[0] if len(vocab) else None, "counted": "from its dimensions",
                     "_parameters": total, "_body": body})
    if not more:
        return table
    table = pd.concat([table, pd.DataFrame(more)], ignore_index=True) if not table.empty else pd.DataFrame(more)
    return table.sort_values("_body", kind="stable", ignore_index=True)


def best_mfu(df: pd.DataFrame) -> dict:
    """The section's answer: {mode: the case with the highest MFU against the bf16 peak, with
    its value}, and under "other_dtype" the highest share of its own dtype's peak of a row in
    another dtype (fp32 against its non-tensor-core peak), with that row's bf16-peak MFU beside
    it; {} without MFU (a CPU). Each says whether its case is host-bound (`host_bound`: not
    `claimable`, mark_host_bound): its MFU then is the host's, below what the GPU does."""
    out = {}
    ok = df[df["status"] == "ok"]
    bf16 = ok[ok["metric"] == BF16_MFU]
    rate = ok[ok["metric"] == "tflops"].set_index(["study", "case_id"])["median"]
    for mode, g in bf16.groupby("mode", sort=False):
        best = g.loc[g["median"].idxmax()]
        out[mode] = {"value": float(best["median"]), "peak": float(best["peak_tflops"]),
                     "tflops": float(rate.get((best["study"], best["case_id"]), math.nan)),
                     "host_bound": not bool(best.get("claimable", True)), **{k: best[k] for k in CASE_KEYS}}
    own = ok[(ok["metric"] == "mfu_pct") & (precision(ok) != "bf16")]
    if not own.empty:
        best = own.loc[own["median"].idxmax()]
        same = bf16[(bf16["study"] == best["study"]) & (bf16["case_id"] == best["case_id"])]["median"]
        out["other_dtype"] = {"value": float(best["median"]), "peak": float(best["peak_tflops"]),
                              "precision": precision(own.loc[[best.name]]).iloc[0],
                              "bf16_value": float(same.iloc[0]) if len(same) else math.nan,
                              "host_bound": not bool(best.get("claimable", True)), **{k: best[k] for k in CASE_KEYS}}
    return out


# The case key each study varies; its other keys stay at values the study lists.
STUDY_AXES = {"warmup": "warmup", "context": "context"}


def study_rows(df: pd.DataFrame, study: str) -> pd.DataFrame:
    """The rows of a study, with the variants study's cases that sit on the study's grid (their
    other case keys among the study's values) at a value of its axis that the study does not
    list: a case is measured once, in one job, and shown wherever it belongs (the context study
    takes context 256 from the variants' eager training steps)."""
    own = df[df["study"] == study]
    axis = STUDY_AXES[study]
    if own.empty or "variants" not in set(df["study"]):
        return own
    cases = own.drop_duplicates("case_id")
    shared = df[df["study"] == "variants"]
    for key in CASE_KEYS:
        if key != axis:
            shared = shared[shared[key].isin(set(cases[key]))]
    shared = shared[~shared[axis].isin(set(cases[axis])) & ~shared["case_id"].isin(set(cases["case_id"]))]
    return ordered_rows(pd.concat([own, shared.assign(study=study)], ignore_index=True))


def case_label(keys: list[str]):
    """A case's name in prose, from its first row's `keys`: "2.7B, fp32, compiled", "xl, bf16, context 512"."""
    return lambda r: ", ".join(f"context {int(r[k]):,}" if k == "context" else str(r[k]) for k in keys)


def variants(df: pd.DataFrame, mfu: dict[str, str], threshold: float = math.inf) -> dict:
    """The variants study: its tables (MFU columns `mfu`, `mfu_columns`) and ratios."""
    if df.empty:
        return {}
    train, fwd = df[df["mode"] == "train"], df[df["mode"] == "forward"]
    rates = {"tokens_per_s": "tokens/s", "tflops": "TFLOP/s", **mfu, energy.JOULES: "J/token",
             "peak_allocated_mib": "peak MiB", "first_step_ms": "first step ms"}
    phases = {"forward_ms": "forward ms", "backward_ms": "backward ms", "optimizer_ms": "optimizer ms",
              "step_ms": "step ms"}
    label = case_label(["size", "dtype", "compile"])
    out = {"variants_train": wide(train, {**phases, **rates}, threshold).drop(columns=["mode", "warmup"]),
           "variants_forward": wide(fwd, {"forward_ms": "forward ms", **rates}, threshold).drop(columns=["mode", "warmup"]),
           "variants_train_power": energy.power_note(train, label),
           "variants_forward_power": energy.power_note(fwd, label)}
    f, b = metric_frame(train, "forward_ms"), metric_frame(train, "backward_ms")
    out["backward_over_forward"] = ratio_range(b / f)
    step = metric_frame(df, "step_ms").reset_index()
    eager = step[step["compile"] == "eager"].pivot_table(index=["size", "context", "mode"],
                                                         columns="dtype", values="median")
    out["bf16_speedup_train"] = ratio_range(
        (eager["fp32"] / eager["bf16"]).xs("train", level="mode")
        if {"fp32", "bf16"} <= set(eager.columns) else pd.Series(dtype=float))
    by_compile = step.pivot_table(index=["size", "context", "dtype", "mode"], columns="compile", values="median")
    out["compile_speedup"] = {}
    if {"eager", "compiled"} <= set(by_compile.columns):
        speedup = by_compile["eager"] / by_compile["compiled"]
        out["compile_speedup"] = {mode: ratio_range(speedup.xs(mode, level="mode"))
                                  for mode in speedup.index.get_level_values("mode").unique()}
    return out


def warmup(df: pd.DataFrame, threshold: float = math.inf) -> dict:
    if df.empty:
        return {}
    out = {"warmup": wide(df, {"step_ms": "step ms", "first_step_ms": "first step ms"}, threshold)
           .drop(columns=["compile", "mode", "context"])}
    step = df[(df["metric"] == "step_ms") & (df["status"] == "ok")]
    std = step.pivot_table(index="size", columns="warmup", values="std")
    lo, hi = int(df["warmup"].min()), int(df["warmup"].max())  # the study's range, whatever ran
    ratio = std[lo] / std[hi] if {lo, hi} <= set(std.columns) else pd.Series(dtype=float)
    out["warmup_std_ratio"] = {"cold": lo, "warm": hi, **ratio_range(ratio)}
    return out


def context(df: pd.DataFrame, mfu: dict[str, str], threshold: float = math.inf) -> dict:
    if df.empty:
        return {}
    out = {"context": wide(df, {"step_ms": "step ms", "tokens_per_s": "tokens/s", "tflops": "TFLOP/s", **mfu,
                                energy.JOULES: "J/token", "peak_allocated_mib": "peak MiB"}, threshold)
           .drop(columns=["compile", "mode", "warmup"]),
           "context_power": energy.power_note(df, case_label(["size", "dtype", "context"]))}
    lo, hi = int(df["context"].min()), int(df["context"].max())  # the study's range, whatever ran
    out["context_growth"] = context_growth(df, lo, hi)
    out["context_oom"] = df.drop_duplicates("case_id").query("status == 'oom'")[["size", "context", "dtype"]]
    return out


def compile_study(df: pd.DataFrame, threshold: float = math.inf) -> dict:
    """torch.compile against eager across contexts (the compile study: compiled training steps
    at every size): one row per size, context and dtype with the eager step (the context study's,
    or at the variants' context theirs), the compiled one, and eager / compiled where both ran ok
    without a host-bound side; a case that did not run shows its status (`oom`). {} without the
    study's rows."""
    own = df[df["study"] == "compile"]
    if own.empty:
        return {}
    cases = own.drop_duplicates("case_id")
    pool = df[df["mode"].isin(set(cases["mode"])) & df["dtype"].isin(set(cases["dtype"]))
              & df["warmup"].isin(set(cases["warmup"])) & df["size"].isin(set(cases["size"]))]
    pool = pool.drop_duplicates(["case_id", "metric"])
    contexts = set(cases["context"]) | set(pool[pool["compile"] == "compiled"]["context"])
    pool = pool[pool["context"].isin(contexts)]
    rows, ratios = [], []
    for (size, ctx, dtype), g in ordered_rows(pool).groupby(["size", "context", "dtype"], sort=False):
        eager, compiled = g[g["compile"] == "eager"], g[g["compile"] == "compiled"]
        e, c = (cell(x, "step_ms", spread=True, column="median") for x in (eager, compiled))
        ratio = None
        if isinstance(e, Spread) and isinstance(c, Spread) and eager["claimable"].all() and compiled["claimable"].all():
            ratio = e.center / c.center
            ratios.append({"size": size, "context": int(ctx), "dtype": dtype, "ratio": ratio})
        idle = [v for x in (eager, compiled) if "gpu_idle_pct" in x
                and isinstance(v := cell(x, "step_ms", column="gpu_idle_pct"), float) and math.isfinite(v)]
        rows.append({"size": size, "context": int(ctx), "dtype": dtype,
                     "eager step ms": "not measured" if e is None else e,
                     "compiled step ms": "not measured" if c is None else c,
                     "eager / compiled": ratio,
                     "GPU idle %": idle_text(max(idle) if idle else None, threshold)})
    table = pd.DataFrame(rows)
    by = pd.DataFrame(ratios)
    speedup = ratio_range(by["ratio"] if len(by) else pd.Series(dtype=float))
    per_context = ({int(c): ratio_range(g["ratio"]) for c, g in by.groupby("context")} if len(by) else {})
    failed = table[table["compiled step ms"].map(lambda v: isinstance(v, str) and v != "not measured")]
    failed = failed[["size", "context", "dtype", "compiled step ms"]]
    return {"compile": table, "compile_speedup_by_context": per_context, "compile_speedup_all": speedup,
            "compile_failed": failed.rename(columns={"compiled step ms": "status"}),
            "compile_sizes": [s for s in size_order(df) if s in set(cases["size"])]}


def figures(inputs, paths: dict) -> dict[str, str]:
    """The training step against model size (the variants study) and against context (the
    context study); {name: why} of a figure not drawn."""
    df = with_quantiles(inputs.rows("e2e"))
    ok = df[(df["metric"] == "step_ms") & (df["status"] == "ok")] if not df.empty else df
    variants = ok[(ok["study"] == "variants") & (ok["mode"] == "train")] if not ok.empty else ok
    not_drawn = {}
    if variants.empty:
        not_drawn["step_vs_size"] = "no training step of the variants study ran ok here"
    else:
        sizes = size_order(df)
        fig, ax = plt.subplots(figsize=(7, 4))
        for (dtype, compiled), g in variants.groupby(["dtype", "compile"]):
            g = g.set_index("size").reindex([s for s in sizes if s in set(g["size"])])
            label = f"{dtype}, {'compiled' if str(compiled).lower() == 'true' else 'eager'}"
            spread = [g["median"] - g["q20"], g["q80"] - g["median"]]
            ax.errorbar(g.index, g["median"], yerr=spread, marker="o", capsize=3, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("model size")
        ax.set_ylabel("training step (ms, median, 20%-80%)")
        ax.set_title(f"Training step vs model size (context {int(variants['context'].iloc[0])})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        save(fig, paths["step_vs_size"])
    context = study_rows(ordered(df), "context") if not df.empty else df
    context = context[(context["metric"] == "step_ms") & (context["status"] == "ok")] if not context.empty else context
    if context.empty:
        return {**not_drawn, "step_vs_context": "no training step of the context study ran ok here"}
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, size in enumerate(size_order(df)):
        for dtype, style in (("fp32", "-"), ("bf16", "--")):
            g = context[(context["size"] == size) & (context["dtype"] == dtype)].sort_values("context")
            if not g.empty:
                ax.plot(g["context"], g["median"], style, marker="o", color=colors[i % len(colors)],
                        label=f"{size} {dtype}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("training step (ms)")
    ax.set_title("Training step vs context length (eager; solid fp32, dashed bf16)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(ncol=2, fontsize="small")
    save(fig, paths["step_vs_context"])
    return not_drawn
