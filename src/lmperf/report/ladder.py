"""The ladder: from the assignment's setting to the GPU's limit, one change a rung (the rows of
`results/<hw>/ladder/`, one CSV a model size; medians over the timed steps, as the end-to-end
section's): the rungs with their phase times, MFU, energy per token and GPU busy share, the best rung of each size, its phases against the floors measured in the same job,
FlopCounterMode's count beside the closed form MFU uses, the section's bars (config/sections/ladder.yaml's
`report.ladder`), and its figure."""
from __future__ import annotations

import math

import pandas as pd

from lmperf.report import energy
from lmperf.report.e2e import (BF16_MFU, SPREAD_METRICS, failures, mfu_columns, peaks, size_order, with_bf16_mfu,
                                with_quantiles)
from lmperf.report.format import HOST_BOUND, bar, cell, fmt, host_bound_legend, idle_text, ratio_range, unavailable
from lmperf.report import ladder_fp8
from lmperf.report.plot import plt, save


def view(inputs) -> dict:
    df = with_quantiles(inputs.rows("ladder"))
    if df.empty:
        return unavailable("no ladder results (rule ladder_size has not run)")
    cases = df.drop_duplicates("case_id")
    failed = failures(cases, ["size", "case_id"])
    mfu = df[(df["metric"] == "mfu_pct") & (df["status"] == "ok")]
    threshold = inputs.bars.get("host_bound_idle_pct", math.inf)
    return {"available": True, "n_cases": len(cases), "failures": failed, "n_failures": len(failed),
            "has_mfu": not mfu.empty, "peaks": peaks(mfu),
            "host_bound": host_bound_legend(df[df["metric"] == "step_ms"], threshold),
            **ladder(df, inputs.bars.get("ladder", {}), threshold)}


METRICS = {"forward_ms": "forward ms", "backward_ms": "backward ms", "optimizer_ms": "optimizer ms",
           "step_ms": "step ms", "tokens_per_s": "tokens/s", "tflops": "TFLOP/s"}


def rungs(df: pd.DataFrame, threshold: float = math.inf) -> pd.DataFrame:
    """One row per (size, rung): what changed, its settings, its metrics (or its status): MFU
    against the bf16 peak, and the fp32 and TF32 rungs' share of their own peaks beside it
    (`e2e.mfu_columns`), its energy per token (report/energy.py: empty where not measured), and
    its GPU idle %, marked host-bound above `threshold`."""
    df, mfu = mfu_columns(df)
    metrics = {**METRICS, **mfu, energy.JOULES: "J/token", "peak_allocated_mib": "peak MiB"}
    out = []
    for _, g in df[df["name"] != "floors"].groupby("case_id", sort=False):
        first = g.iloc[0]
        ok = first["status"] == "ok"
        row = {"size": first["size"], "rung": int(first["rung"]), "change": first["change"],
               "context": int(first["context"]), "batch": batch_text(g), "attention": first["attention_backend"] if ok and
               isinstance(first.get("attention_backend"), str) else first["attention"],
               "AdamW": first["optimizer"],
               "checkpointed": _count(cell(g, "checkpointed_blocks")) if ok else None}
        for metric, label in metrics.items():
            row[label] = (energy.joules_cell(g) if metric == energy.JOULES
                          else cell(g, metric, spread=metric in SPREAD_METRICS, column="median"))
        # one profiled step's kernel time against the timed step (GPU only: blank elsewhere)
        kernels, step, attention = (cell(g, m, column="median") for m in ("step_kernel_ms", "step_ms", "step_attention_kernel_ms"))
        busy = isinstance(kernels, float) and isinstance(step, float) and step > 0
        row["GPU busy %"] = 100 * kernels / step if busy else None
        row["attention kernels ms"] = attention if isinstance(attention, float) else None
        row["GPU idle %"] = idle_text(cell(g, "step_ms", column="gpu_idle_pct") if "gpu_idle_pct" in g else None,
                                      threshold)
        row["_name"], row["_attention"] = first["name"], first["attention"]
        row["_status"] = first["status"]
        out.append(row)
    table = pd.DataFrame(out)
    return table.drop(columns=[c for c in ("GPU busy %", "attention kernels ms", "GPU idle %", "J/token", *mfu.values())
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
    return sequences_text(*timed_batch(g))


def sequences_text(batch_size: int, micro_batches: int) -> str:
    return f"{batch_size}" if micro_batches == 1 else f"{batch_size * micro_batches} = {micro_batches} x {batch_size}"


def _busy(rungs: pd.DataFrame, size: str, name: str) -> float:
    """A rung's "GPU busy %" from the ladder table (NaN where not profiled on a GPU)."""
    if "GPU busy %" not in rungs:
        return math.nan
    x = rungs[(rungs["size"] == size) & (rungs["_name"] == name)]["GPU busy %"]
    return float(x.iloc[0]) if len(x) and pd.notna(x.iloc[0]) else math.nan


def _idle(df: pd.DataFrame, case_id: str) -> float:
    """A rung's GPU idle % (its step_ms row's gpu_idle_pct), NaN where not measured."""
    r = df[(df["case_id"] == case_id) & (df["metric"] == "step_ms")]
    return float(r["gpu_idle_pct"].iloc[0]) if len(r) and "gpu_idle_pct" in r else math.nan


def _count(x) -> int | None:
    return int(x) if isinstance(x, float) and math.isfinite(x) else None


def _value(df: pd.DataFrame, case_id: str, metric: str) -> float:
    r = df[(df["case_id"] == case_id) & (df["metric"] == metric) & (df["status"] == "ok")]["median"]
    return float(r.iloc[0]) if len(r) else math.nan


def is_peer(df: pd.DataFrame) -> pd.Series:
    """Rows of a peer rung (bench/ladder.py's PEERS: its change starts with "peer")."""
    return df["change"].astype(str).str.startswith("peer")


def is_contender(df: pd.DataFrame) -> pd.Series:
    """Rows of a contender's rung (a user's attention in place of ours, lmperf.contenders.ladder_rungs)."""
    return df["name"].astype(str).str.startswith("contender_")


def ladder(df: pd.DataFrame, limits: dict, threshold: float = math.inf) -> dict:
    """The ladder per size: its rungs, the device rates, the best rung with its phase floors,
    FlopCounterMode's count beside the closed form, and the section's bars. A best rung or
    reference rung whose step is host-bound (GPU idle above `threshold` %) labels the ratio
    between them (`host_bound`): no speed-up is claimed from it."""
    if df.empty:
        return {}
    df = with_bf16_mfu(df)
    size_rank = {s: i for i, s in enumerate(size_order(df))}  # smallest model first within a rung
    df = df.assign(rung=df["rung"].astype(int), _size=df["size"].map(size_rank))
    df = df.sort_values(["rung", "_size"], kind="stable").drop(columns="_size")
    table = rungs(df, threshold)
    label = lambda r: f"{r['size']} rung {int(r['rung'])} ({r['name']})"
    out = {"rungs": table, "sizes": [s for s in size_order(df) if s in set(table["size"])],
           "power": energy.power_note(df[df["name"] != "floors"], label)}  # under the table: does the power limit bind?
    ok = df[df["status"] == "ok"]
    rates = ok[ok["name"] == "floors"]
    out["rates"] = {size: {m: float(v) for m, v in g.set_index("metric")["median"].items()
                                  if m in ("copy_gb_per_s", "bf16_matmul_tflops")}
                           for size, g in rates.groupby("size")}
    # The best rung is the fastest (tokens/s) of our stack's rungs (a peer, another library's
    # kernels or training recipe measured beside them, and a contender's rung, a user's attention,
    # are shown, not chosen); its MFU is against
    # the bf16 peak, as every rung's.
    key = "tokens_per_s"
    best, floors, flops = {}, [], []
    own = ok[(ok["name"] != "floors") & ~is_peer(ok) & ~is_contender(ok) & ~ladder_fp8.is_fp8(ok)]  # the best bf16 rung
    for size, g in own.groupby("size", sort=False):
        score = g[g["metric"] == key].set_index("case_id")["median"]
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
                      "optimizer": first["optimizer"], "mfu": _value(g, case_id, BF16_MFU),
                      "tflops": _value(g, case_id, "tflops"), "joules_per_token": _value(g, case_id, energy.JOULES),
                      "step_ms": _value(g, case_id, "step_ms"), "tokens_per_s": tokens,
                      "vs_assignment": tokens / _value(g, assignment.iloc[0], "tokens_per_s")
                      if len(assignment) else math.nan,
                      "assignment": {"rung": int(g[g["case_id"] == assignment.iloc[0]]["rung"].iloc[0]),
                                     "context": int(g[g["case_id"] == assignment.iloc[0]]["context"].iloc[0]),
                                     "tokens_per_s": _value(g, assignment.iloc[0], "tokens_per_s")}
                      if len(assignment) else None,
                      "assignment_busy_pct": _busy(table, size, "compiled"),
                      "host_bound": [f"{which} {fmt(idle)}% GPU idle" for which, idle in
                                     (("best rung", _idle(g, case_id)),
                                      ("reference rung", _idle(g, assignment.iloc[0]) if len(assignment) else math.nan))
                                     if idle > threshold]}
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
        # a rung that accumulates gradients is counted over one of its micro-batches
        batch_size, micro_batches = timed_batch(df[df["case_id"] == case_id])
        over = f"{batch_size} x {int(first['context']):,}"
        flops.append({"size": first["size"], "rung": int(first["rung"]), "attention": first["attention"],
                      "counted over": f"one micro-batch of {micro_batches}, {over}" if micro_batches > 1
                      else f"the step, {over}",
                      "checkpointed": _count(_value(ok, case_id, "checkpointed_blocks")),
                      "counted TFLOP": counted / 1e12, "closed form TFLOP": closed / 1e12,
                      "counted / closed": counted / closed, "attention: counted / closed": att_counted / att_closed})
    out["best"] = best
    out["best_table"] = best_table(best)
    out["floors"] = pd.DataFrame(floors)
    out["flops"] = pd.DataFrame(flops)
    if not out["flops"].empty:
        out["flops_range"] = ratio_range(out["flops"]["counted / closed"])
    out["fp8"], out["fp8_peak_source"] = ladder_fp8.table(df, best), ladder_fp8.FP8_PEAK_SOURCE  # the FP8 rung, and its bar
    recipes = out["fp8"]["recipe"].drop_duplicates().tolist() if len(out["fp8"]) else []
    out["fp8_how"] = "; ".join(ladder_fp8.how(r) for r in recipes) or "float8 training"
    out["bars"] = ladder_fp8.with_bar(bars(best, out["floors"], limits), out["fp8"], limits)
    out["peers"] = peers(df, out["fp8"], threshold)
    return out


# What keeps a peer rung from being the same setting as the rung it stands beside, by its name
# (bench/ladder.py's peer rungs); the FP8 ones are told by their context against the FP8 rung's.
PEER_CAVEATS = {"liger": "its norms run outside the compiled graph (Dynamo traces them wrongly), while the "
                         "rung beside it compiles ours: not the same setting, so not drawn as a like-for-like peer"}


PEER_FIGURE_NOTES = {"liger": "norms outside the compiled graph"}


def peers(df: pd.DataFrame, fp8: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """One row per peer rung (another library's kernels on the settings of the last rung of our
    stack before it): its tokens/s over that rung's (same job), its GPU idle %, and why it is not
    the same setting where it is not (`PEER_CAVEATS`; a float8 peer at another context than our
    FP8 rung's; a host-bound side)."""
    ok = df[(df["status"] == "ok") & (df["name"] != "floors")]
    rows = []
    for size, g in ok.groupby("size", sort=False):
        cases = g.drop_duplicates("case_id").sort_values("rung")
        own = cases[~is_peer(cases) & ~ladder_fp8.is_fp8(cases)]
        ours_fp8 = fp8[fp8["size"] == size] if len(fp8) else fp8
        for _, c in cases[is_peer(cases)].iterrows():
            before = own[own["rung"] < c["rung"]]
            if before.empty:
                continue
            b = before.iloc[-1]
            idle, idle_b = _idle(g, c["case_id"]), _idle(g, b["case_id"])
            caveats = [PEER_CAVEATS[c["name"]]] if c["name"] in PEER_CAVEATS else []
            if str(c.get("float8", "none")) not in ("none", "nan") and len(ours_fp8):
                context = int(ours_fp8["context"].iloc[0])
                if int(c["context"]) != context:
                    caveats.append(f"context {int(c['context']):,}, not our FP8 rung's {context:,}: "
                                   "not a peer of our FP8 rung")
            bound = [f"{which} {fmt(x)}% GPU idle" for which, x in (("this rung", idle), ("the rung beside it", idle_b))
                     if x > threshold]
            if bound:
                caveats.append(f"host-bound {HOST_BOUND} ({', '.join(bound)}): the ratio is the host's")
            ratio = _value(g, c["case_id"], "tokens_per_s") / _value(g, b["case_id"], "tokens_per_s")
            rows.append({"size": size, "rung": int(c["rung"]), "peer": c["name"], "context": int(c["context"]),
                         "beside our rung": f"{int(b['rung'])} ({b['name']})",
                         "tokens/s / that rung's": f"{fmt(ratio)} {HOST_BOUND}" if bound else ratio,
                         "GPU idle %": idle_text(idle, threshold),
                         "same setting?": "no: " + "; ".join(caveats) if caveats else "yes"})
    return pd.DataFrame(rows)


def best_table(best: dict) -> pd.DataFrame:
    """The best rung of each size, one row each: what it is, its step and its speed-up over the
    assignment's setting (rung "torch.compile", same job; labelled, not claimed, where a side is
    host-bound)."""
    rows = []
    for size, b in best.items():
        x = b["vs_assignment"]
        rows.append({"size": size, "rung": b["rung"], "change": b["change"], "context": b["context"],
                     "sequences a step": sequences_text(b["batch_size"], b["micro_batches"]),
                     "attention": b["backend"] or b["attention"], "AdamW": b["optimizer"], "step ms": b["step_ms"],
                     "tokens/s": b["tokens_per_s"], "TFLOP/s": b["tflops"], "MFU % of bf16 peak": b["mfu"],
                     "J/token": b["joules_per_token"],
                     "tokens/s / the assignment's": f"{fmt(x)} (host-bound: {', '.join(b['host_bound'])}; not a "
                                                    "speed-up claim)" if b["host_bound"] else x})
    return pd.DataFrame(rows)


def bars(best: dict, floors: pd.DataFrame, limits: dict) -> pd.DataFrame:
    """The section's bars for the configured size, read off its ladder job."""
    size = limits.get("size")
    b = best.get(size)
    if not b or not limits:
        return pd.DataFrame()
    rows = []
    if math.isfinite(b["mfu"]):
        for text, limit in ((f"{size}: best rung >= {fmt(limits['best_mfu_pct'])}% MFU (bf16 peak) with "
                             f"{limits['best_attention']} attention", limits["best_mfu_pct"]),
                            (f"further: >= {fmt(limits['best_mfu_pct_stretch'])}% MFU", limits["best_mfu_pct_stretch"])):
            rows.append(bar(text, b["mfu"], f"{fmt(b['mfu'])}% (rung {b['rung']}, {b['attention']})",
                            b["mfu"] >= limit and b["attention"] == limits["best_attention"]))
    x, busy = b["vs_assignment"], b.get("assignment_busy_pct", math.nan)
    # below 100% busy the reference step waits on the host, so the ratio moves with the host's speed
    host = f" (reference rung {fmt(busy)}% GPU-busy)" if math.isfinite(busy) and busy < 95 else ""
    if b.get("host_bound"):  # host-bound: the ratio is the host's, not claimed
        host = f" (host-bound: {', '.join(b['host_bound'])}; not claimed)"
    rows.append(bar(f"{size}: best rung tokens/s >= {fmt(limits['tokens_per_s_vs_assignment'])}x the assignment "
                    f"setting's (bf16 compiled, same job)", x, f"{fmt(x)}x{host}",
                    x >= limits["tokens_per_s_vs_assignment"] and not b.get("host_bound")))
    opt = floors[(floors["size"] == size) & (floors["phase"] == "optimizer")] if not floors.empty else floors
    if len(opt):
        x = float(opt["measured / floor"].iloc[0])
        rows.append(bar(f"{size}: {b['optimizer']} optimizer phase <= {fmt(limits['optimizer_vs_floor'])}x its "
                        f"bandwidth floor", x, f"{fmt(x)}x", x <= limits["optimizer_vs_floor"]))
    return pd.DataFrame(rows)


PHASES = {"forward_ms": "forward", "backward_ms": "backward", "optimizer_ms": "optimizer"}


def figures(inputs, paths: dict) -> dict[str, str]:
    """Per model size: the time a token of each rung, stacked forward / backward / optimizer bars
    for our stack's rungs (a step's phases over the tokens it processes: rungs of other contexts
    and batches compare), each peer (another library's kernels) a marker of its own at its rung,
    no line between rungs; below, MFU against the bf16 peak of the bf16 rungs, and the FP8 rung's
    against the fp8 peak on an axis of its own. {name: why} of a figure not drawn."""
    df, path = with_bf16_mfu(with_quantiles(inputs.rows("ladder"))), paths["ladder"]
    ok = df[(df["status"] == "ok") & (df["name"] != "floors")] if not df.empty else df
    if ok.empty or not (ok["metric"] == "step_ms").any():
        return {"ladder": "no rung of the ladder ran ok here"}
    sizes = size_order(ok)
    fig, axes = plt.subplots(2, len(sizes), figsize=(max(9, 7 * len(sizes)), 7.5), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    for j, size in enumerate(sizes):
        g = ok[ok["size"] == size]
        cases = g.drop_duplicates("case_id").sort_values("rung")
        x = range(len(cases))
        top, bottom = axes[0, j], axes[1, j]
        base = [0.0] * len(cases)
        for metric, label in PHASES.items():
            heights = []
            for (_, c), b in zip(cases.iterrows(), base):
                tokens = _tokens(g, c["case_id"])
                own = not (is_peer(cases.loc[[c.name]]).iloc[0])
                heights.append(1e3 * _value(g, c["case_id"], metric) / tokens if own and tokens else 0.0)
            top.bar(x, heights, bottom=base, label=label, width=0.7)
            base = [b + h for b, h in zip(base, heights)]
        for k, (_, c) in enumerate(cases.iterrows()):
            tokens = _tokens(g, c["case_id"])
            if is_peer(cases.loc[[c.name]]).iloc[0] and tokens:
                y = 1e3 * _value(g, c["case_id"], "step_ms") / tokens
                top.plot([k], [y], "kD", ms=7, label="peer (another library's kernels): step" if "peer" not in
                         " ".join(top.get_legend_handles_labels()[1]) else None)
                # not the setting of the rung beside it: said on the marker (the peers' table says why)
                note = PEER_FIGURE_NOTES.get(c["name"]) or (f"context {int(c['context']):,}" if str(
                    c.get("float8", "none")) not in ("none", "nan") else "")
                if _idle(g, c["case_id"]) > inputs.bars.get("host_bound_idle_pct", math.inf):
                    note = f"{HOST_BOUND} {note}".strip()
                if note:
                    top.annotate(note, (k, y), textcoords="offset points", xytext=(0, 8), ha="center",
                                 rotation=90, fontsize="x-small", va="bottom")
        threshold = inputs.bars.get("host_bound_idle_pct", math.inf)
        for k, (_, c) in enumerate(cases.iterrows()):  # a host-bound rung's time is the host's
            if _idle(g, c["case_id"]) > threshold and not is_peer(cases.loc[[c.name]]).iloc[0]:
                tokens = _tokens(g, c["case_id"])
                top.annotate(HOST_BOUND, (k, 1e3 * _value(g, c["case_id"], "step_ms") / tokens),
                             textcoords="offset points", xytext=(0, 6), ha="center", fontsize="large")
        top.set_ylabel("µs a token (step time / tokens)")
        top.set_title(f"{size}: time a token per rung, forward / backward / optimizer ({HOST_BOUND}: host-bound)")
        top.legend(fontsize="small")
        top.grid(True, axis="y", alpha=0.3)
        bf16 = [(k, _value(g, c["case_id"], BF16_MFU)) for k, (_, c) in enumerate(cases.iterrows())
                if not is_peer(cases.loc[[c.name]]).iloc[0] and not ladder_fp8.is_fp8(cases.loc[[c.name]]).iloc[0]]
        bottom.plot([k for k, _ in bf16], [v for _, v in bf16], "o", color="C0", label="bf16 rungs: % of bf16 peak")
        bottom.set_ylabel("MFU, % of bf16 peak")
        fp8 = [(k, c) for k, (_, c) in enumerate(cases.iterrows()) if ladder_fp8.is_fp8(cases.loc[[c.name]]).iloc[0]]
        peak = ladder_fp8.fp8_peak(g["gpu"].iloc[0]) if "gpu" in g else None
        if fp8 and peak:
            right = bottom.twinx()
            right.plot([k for k, _ in fp8], [100 * _value(g, c["case_id"], "tflops") / peak for _, c in fp8],
                       "s", color="C3", label="FP8 rung: % of fp8 peak (right axis)")
            right.set_ylabel("FP8 rung: % of fp8 peak", color="C3")
            right.set_ylim(0, 100)
            right.legend(loc="center right", fontsize="small")
        bottom.set_ylim(bottom=0)
        bottom.legend(loc="lower right", fontsize="small")
        bottom.grid(True, axis="y", alpha=0.3)
        for ax in (top, bottom):
            ax.set_xticks(list(x), [c["name"] for _, c in cases.iterrows()],
                          rotation=40, ha="right", fontsize="small")
    save(fig, path)
    return {}


def _tokens(g: pd.DataFrame, case_id: str) -> int:
    """Tokens a step of a rung: sequences (micro-batches x their size) x context."""
    case = g[g["case_id"] == case_id]
    batch_size, micro_batches = timed_batch(case)
    return batch_size * micro_batches * int(case["context"].iloc[0])
