"""Scaling across GPUs: all-reduce bandwidth per message size, the data-parallel training step
(time per phase, communication, scaling, memory per rank) and the section's bars, read from
the rows of the multi-GPU results folder(s) of the report's machine (see `sections.result_dirs`:
results/<hw>-x<N>/distributed/, or results/<hw>/distributed/ for the CPU's Gloo run) with the
thresholds of config/sections/distributed.yaml's `report.distributed`; and its two figures.

    python -m lmperf.report.section distributed --results results/h200-x2 --out report/distributed/h200-x2/distributed.md

renders the section alone (tools/distributed_gpu.sh's preview of a run), through
report/render.py like the whole report.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pandas as pd

from lmperf.report import freshness
from lmperf.report.distributed_rows import (  # noqa: F401 (the section's names, read here and by tests)
    BUCKETED, GPU_WORDS, KEY, MEMORY, PHASES, VARIANT_NAMES, allreduce_frame, best_ddp, cases, ddp_frame, frames,
    gpu_count, gpu_counts, link_peaks, no_run, ok_metric, slow_baseline, variant_label, words)
from lmperf.report.format import HOST_BOUND, Spread, bar, fmt, host_bound_legend, idle_text, unavailable
from lmperf.report.plot import plt, save

NO_RESULTS = "no multi-GPU results of this machine yet (tools/distributed_gpu.sh on a machine with 2+ GPUs)"
NOT_MEASURED = "not measured"


# ---------------------------------------------------------------------------------------------
# The view


def other_folders(results: Path) -> list[Path]:
    """Other machines' multi-GPU results folders beside `results` (a report reads only its own
    machine's results/<hw>-x<N>/; another GPU's stay under their own name)."""
    return sorted(p for p in results.parent.glob("*-x*") if (p / "distributed").is_dir()
                  and re.fullmatch(r".+-x\d+", p.name) and not p.name.startswith(results.name + "-x"))


def elsewhere(results: Path) -> str:
    """Where other machines' multi-GPU results and their rendered sections are, if any."""
    folders = other_folders(results)
    if not folders:
        return ""
    return "; measured on other machines: " + ", ".join(
        f"{p.name} (`{p.parent.name}/{p.name}/distributed/`, rendered in `report/distributed/{p.name}/distributed.md`)"
        for p in folders)


def other_machines(results: Path, out_dir: Path, idle: float = math.inf) -> list[dict]:
    """For a report without multi-GPU results of its own: each other machine's run (`other_folders`)
    with its `answers` and the link to its section rendered alone (report/distributed/<name>/,
    tools/distributed_gpu.sh's preview), for the report's summary to quote as that machine's."""
    from lmperf.report.rows import load_section  # the rows of another machine's folder, checked

    out = []
    for folder in other_folders(results):
        section = results.parent.parent / "report" / "distributed" / folder.name / "distributed.md"
        rows = load_section(folder, "distributed")
        out.append({"machine": folder.name, "answers": with_code(answers(frames(rows)[1], idle, words(rows)), rows),
                    "link": os.path.relpath(section, out_dir) if section.exists() else None})
    return out


def view(inputs) -> dict:
    """Everything templates/distributed.md.j2 places: frames and numbers (text only through the
    `table` and `fmt` filters), and the bars with the thresholds of `inputs.bars["distributed"]`,
    each measured or saying why it could not be."""
    df = inputs.rows("distributed")
    if df.empty:
        return unavailable(NO_RESULTS + elsewhere(Path(inputs.results)),
                           others=other_machines(Path(inputs.results), Path(inputs.out_dir),
                                                 inputs.bars.get("host_bound_idle_pct", math.inf)))
    limits = inputs.bars["distributed"]
    idle = inputs.bars.get("host_bound_idle_pct", math.inf)
    gpus = sorted({g for g in df["gpu"].astype(str) if g != "none"})
    out = {"available": True, "folders": sorted(df["hw"].astype(str).unique()),
           "gpu": ", ".join(gpus) if gpus else "the CPU (Gloo)", "words": (w := words(df)),
           "torch": sorted(df["torch"].astype(str).unique()),
           "commits": sorted(df["commit"].dropna().astype(str).unique()), "code": freshness.section_state(df)}
    ar, ddp = frames(df)
    peaks = link_peaks(df) if not ar.empty else []
    out["link_peaks"] = pd.DataFrame(peaks).rename(columns={"gbps": "GB/s per direction"})
    out["link_peak"] = next((p for p in peaks if p["source"] == "driver"), peaks[0] if peaks else None)
    out["allreduce_all"] = ar
    out["ddp_all"] = ddp
    # the training step's blocks compiled (the grid's `compile`), as every case of the folder ran
    out["compiled"] = bool("compile" in df and df.loc[df["study"] == "ddp", "compile"].fillna(False).astype(bool).any())
    ar_ok = ar[ar["status"] == "ok"] if not ar.empty else ar
    out["allreduce"] = (ar_ok.drop(columns=["status", "message"] + ([] if ar_ok["machine"].nunique() > 1 else ["machine"]))
                        .rename(columns={
        "size_mb": "size (MB)", "time_ms": "time (ms, median)", "algbw_gbps": "algbw (GB/s)",
        "busbw_gbps": "busbw (GB/s)"}) if not ar.empty else pd.DataFrame())
    out["bars"] = pd.DataFrame(allreduce_bars(ar, out["link_peak"], limits, w) + ddp_bars(ddp, limits, idle, w))
    out["answers"] = with_code(answers(ddp, idle, w), df)
    out["sizes"] = [{"size": size, "steps": ddp_table(g[g["purpose"] == "scaling"], idle, w["unit"]),
                     "host_bound": host_bound_legend(g[(g["purpose"] == "scaling") & (g["status"] == "ok")], idle),
                     "memory": memory_table(g[g["purpose"] == "scaling"], w["unit"]),
                     "tokens": tokens_per_gpu(_first(g[g["purpose"] == "scaling"])),
                     "memory_tokens": tokens_per_gpu(_first(g[g["purpose"] == "memory"])),
                     "short": memory_table(g[g["purpose"] == "memory"], w["unit"]),
                     **accumulated(g[g["purpose"] == "accumulate"], idle, w["unit"])}
                    for size, g in ddp.groupby("size", sort=False)] if not ddp.empty else []
    out["not_run"] = not_run(df)
    return out


def accumulated(g: pd.DataFrame, idle: float, unit: str = "GPUs") -> dict:
    """The steps of DDP and the one-GPU job with more micro-batches a step, where they ran: their
    micro-batches, tokens a GPU a step, and table."""
    first = _first(g)
    if first is None:
        return {}
    return {"micro_batches": int(first["micro_batches"]), "accumulate_tokens": tokens_per_gpu(first),
            "accumulated": ddp_table(g, idle, unit)}


def tokens_per_gpu(case: pd.Series | None) -> str | None:
    """The tokens each GPU of a training case takes a step, as sequences x context:
    "4 x 1,024 = 4,096"; None where its row does not say."""
    if case is None or pd.isna(case["context"]) or pd.isna(case["sequences_per_gpu"]):
        return None
    sequences, context = int(case["sequences_per_gpu"]), int(case["context"])
    return f"{sequences} x {context:,} = {sequences * context:,}"


def machine_column(g: pd.DataFrame) -> dict:
    """The machine folder of each row, where the rows come from more than one."""
    return {"machine": g["machine"]} if g["machine"].nunique() > 1 else {}


def ddp_table(g: pd.DataFrame, idle: float = math.inf, unit: str = "GPUs") -> pd.DataFrame:
    """The training steps that ran, with rank 0's GPU idle share (marked host-bound above `idle` %)."""
    g = g[g["status"] == "ok"]
    return pd.DataFrame({
        **machine_column(g), "variant": g["label"], unit: g["processes"], "global batch": g["global_batch"],
        "step (ms)": [Spread(m, q20=lo, q80=hi) for m, lo, hi in zip(g["step_ms"], g["step_q20_ms"], g["step_q80_ms"])],
        **{p.removesuffix("_ms"): g[p] for p in PHASES},
        "tokens/s": g["tokens_per_s"], "scaling efficiency": g["scaling_efficiency"],
        "comm (ms)": g["comm_ms"], "exposed comm (ms)": g["exposed_comm_ms"],
        "exposed share (%)": 100 * g["exposed_comm_share"],
        "GPU idle %": [idle_text(v, idle) for v in g["gpu_idle_pct"]]}).reset_index(drop=True)


def memory_table(g: pd.DataFrame, unit: str = "GPUs") -> pd.DataFrame:
    g = g[g["status"] == "ok"]
    return pd.DataFrame({**machine_column(g), "variant": g["label"], unit: g["processes"],
                         "parameters": g["param_mib"], "gradients": g["grad_mib"],
                         "optimizer state": g["optimizer_state_mib"],
                         "activations and buffers": g["activations_mib"],
                         "peak allocated": g["peak_allocated_mib"]}).reset_index(drop=True)


def not_run(df: pd.DataFrame) -> pd.DataFrame:
    """One row per case that is not ok: the case, its study, status and message."""
    c = df.drop_duplicates(["study", "case_id"])
    c = c[c["status"] != "ok"]
    return pd.DataFrame({"case": c["case_id"], "study": c["study"], "status": c["status"],
                         "message": c["message"]}).reset_index(drop=True)


def _not_measured(text: str, why: str, met: str = NOT_MEASURED) -> dict:
    return {"bar": text, "measured": why, "met": met, "_value": math.nan}


def allreduce_bars(ar: pd.DataFrame, peak: dict | None, limits: dict, w: dict = GPU_WORDS) -> list[dict]:
    """NCCL all-reduce of the largest message: bus bandwidth as a share of the link's peak."""
    nccl = ar[(ar["backend"] == "nccl") & ar["busbw_gbps"].notna()] if not ar.empty else ar
    threshold = limits["busbw_fraction_of_link"]
    if nccl.empty or peak is None:
        why = "no NCCL all-reduce measured here" if nccl.empty else "no link peak known for this GPU"
        return [_not_measured(f"NCCL all-reduce of 1 GB: busbw >= {threshold:.0%} of the link's peak", why)]
    rows = []
    for n, g in nccl.groupby("processes"):
        big = g.loc[g["size_mb"].idxmax()]
        share = big["busbw_gbps"] / peak["gbps"]
        rows.append(bar(f"NCCL all-reduce of {big['size_mb'] / 1000:g} GB, {n} {w['unit']}: busbw >= "
                        f"{threshold:.0%} of the link's peak ({peak['source']}, {fmt(peak['gbps'])} GB/s)",
                        share, f"{fmt(big['busbw_gbps'])} GB/s = {share:.1%}", share >= threshold))
    return rows


def threshold(entries: list[dict], procs: int) -> dict | None:
    """The entry of a per-GPU-count bar (`report.distributed`'s lists) for this count, if any."""
    return next((e for e in entries if e["gpus"] == procs), None)


def host_bound_scaling(best: pd.Series, ddp: pd.DataFrame, idle: float) -> str:
    """Why a DDP case's speedup is the host's, not the GPUs': its step or its machine's one-GPU
    step left the GPU idle more than `idle` % ("" where neither did, or neither was profiled)."""
    single = ddp[(ddp["variant"] == "single") & (ddp["size"] == best["size"]) & (ddp["machine"] == best["machine"])
                 & (ddp["purpose"] == best["purpose"])]
    one = single["gpu_idle_pct"].iloc[0] if len(single) else math.nan
    mine = best.get("gpu_idle_pct", math.nan)
    if not (one > idle or mine > idle):
        return ""
    return (f"host-bound {HOST_BOUND}: rank 0's GPU sat idle {fmt(mine)}% of this step and {fmt(one)}% of the "
            f"one-GPU step, so the ratio follows the host's speed")


def ddp_bars(ddp: pd.DataFrame, limits: dict, idle: float = math.inf, w: dict = GPU_WORDS) -> list[dict]:
    """Per model size and GPU count with a target: the best DDP bucket's speedup (not judged
    where a step is host-bound: `host_bound_scaling`) and exposed communication, and FSDP2's
    peak memory against DDP's (`fsdp_pairs`); a rank named as `w` says (`words`)."""
    exposed = limits["exposed_comm_fraction"]
    sizes = list(ddp["size"].unique()) if not ddp.empty else []
    counts = gpu_counts(ddp)
    if not sizes or not counts:
        return [_not_measured(f"DDP on {e['gpus']} {w['unit']} >= {e['at_least']}x {w['one']}'s tokens/s",
                              f"no training step on 2 or more {w['unit']} measured") for e in limits["ddp_speedup"]]
    rows = []
    for size in sizes:
        for procs, machine in counts:
            best = best_ddp(ddp, size, procs, machine)
            if best is None:
                continue
            name = f"{size}, {best['label']}"
            where = f"{procs} {w['unit']} ({machine})"
            if (entry := threshold(limits["ddp_speedup"], procs)) is not None:
                rows.append(speedup_bar(f"{name} (best) on {where}: tokens/s >= {entry['at_least']}x {w['one']}'s",
                                        best, entry, ddp, idle))
                if (acc := best_ddp(ddp, size, procs, machine, "accumulate")) is not None:
                    rows.append(speedup_bar(f"{size}, {acc['label']}, {int(acc['micro_batches'])} micro-batches a step "
                                            f"({tokens_per_gpu(acc)} tokens {w['each']}, one all-reduce) on {where}: tokens/s "
                                            f">= {entry['at_least']}x {w['one']}'s at the same step", acc, entry, ddp, idle))
            text, share = f"{name} on {where}: exposed communication <= {exposed:.0%} of the step", best["exposed_comm_share"]
            rows.append(bar(text, share, f"{share:.1%} ({fmt(best['exposed_comm_ms'])} of {fmt(best['step_ms'])} ms)",
                            share <= exposed) if pd.notna(share) else
                        _not_measured(text, "not profiled here (a GPU's profile is needed)"))
            if (entry := threshold(limits["fsdp2_memory_vs_ddp"], procs)) is not None:
                for case, fsdp, against in fsdp_pairs(ddp, size, best):
                    memory = entry[case["purpose"]]
                    rows.append(memory_bar(f"{size}: FSDP2 peak memory per rank <= {memory}x DDP's ({where}"
                                           f"{_at(case, w['each'])})", fsdp, against, memory))
        for entry in limits["ddp_speedup"]:
            if entry["gpus"] not in dict(counts):
                rows.append(_not_measured(f"{size}: DDP (best) on {entry['gpus']} {w['unit']} >= {entry['at_least']}x "
                                          f"{w['one']}'s tokens/s", no_run(entry["gpus"], w)))
    return rows


def speedup_bar(text: str, best: pd.Series, entry: dict, ddp: pd.DataFrame, idle: float) -> dict:
    """A DDP case's tokens/s over its machine's one-GPU job's against the threshold `entry`, or
    why it is not judged."""
    s = best["speedup"]
    if pd.isna(s):
        return _not_measured(text, "no one-GPU job")
    if why := slow_baseline(best) or host_bound_scaling(best, ddp, idle):
        return _not_measured(text, f"{fmt(s)}x, not judged: {why}", met="not judged")
    return bar(text, s, f"{fmt(s)}x", s >= entry["at_least"])


def fsdp_pairs(ddp: pd.DataFrame, size: str, best: pd.Series) -> list[tuple]:
    """FSDP2 against DDP at the GPU count and machine of `best`, as (the case whose tokens a GPU
    and purpose name the pair, FSDP2's rows, DDP's row or None): at the scaling context against
    the best DDP variant `best`, and at the memory context, where the model's state (which
    sharding divides) fills more of the memory, against the DDP case there."""
    here = ddp[(ddp["size"] == size) & (ddp["processes"] == best["processes"]) & (ddp["machine"] == best["machine"])]
    pairs = [(best, here[(here["variant"] == "fsdp2") & (here["purpose"] == "scaling")], best)]
    short = here[here["purpose"] == "memory"]
    ddp_short, fsdp_short = short[short["variant"] == "ddp"], short[short["variant"] == "fsdp2"]
    if len(ddp_short) or len(fsdp_short):
        pairs.append((short.iloc[0], fsdp_short, ddp_short.iloc[0] if len(ddp_short) else None))
    return pairs


def fsdp_ratio(fsdp: pd.DataFrame, ddp: pd.Series | None) -> float:
    """FSDP2's peak memory per rank over DDP's; NaN where either is not measured."""
    peak = fsdp["peak_allocated_mib"].iloc[0] if len(fsdp) else math.nan
    return peak / ddp["peak_allocated_mib"] if ddp is not None else math.nan


def answers(ddp: pd.DataFrame, idle: float = math.inf, w: dict = GPU_WORDS) -> list[dict]:
    """What the report's summary quotes, per model size and GPU count (`gpu_counts`): the best
    DDP variant's tokens/s over one GPU's on that machine, and FSDP2's peak memory per rank over
    DDP's at each context (with its tokens a GPU); each with the words that name a rank (`w`)."""
    out = []
    for size in (ddp["size"].unique() if not ddp.empty else []):
        for procs, machine in gpu_counts(ddp):
            best = best_ddp(ddp, size, procs, machine)
            if best is None:
                continue
            out.append({**w, "size": size, "gpus": procs, "machine": machine, "label": best["label"],
                        "speedup": float(best["speedup"]), "bucket_mb": float(best["bucket_cap_mb"]),
                        "slow_baseline": slow_baseline(best), "host_bound": host_bound_scaling(best, ddp, idle),
                        "fsdp": [{"tokens": tokens_per_gpu(case), "ratio": fsdp_ratio(fsdp, against)}
                                 for case, fsdp, against in fsdp_pairs(ddp, size, best) if tokens_per_gpu(case)]})
            if (acc := best_ddp(ddp, size, procs, machine, "accumulate")) is not None:
                out[-1]["accumulated"] = {"micro_batches": int(acc["micro_batches"]), "tokens": tokens_per_gpu(acc),
                                          "speedup": float(acc["speedup"]), "slow_baseline": slow_baseline(acc),
                                          "host_bound": host_bound_scaling(acc, ddp, idle)}
    return out


def with_code(found: list[dict], df: pd.DataFrame) -> list[dict]:
    """Each answer with `older`: whether its machine folder's rows are of code changed since."""
    for a in found:
        rows = df[df["hw"].astype(str) == a["machine"]] if "hw" in df else df
        a["older"] = freshness.section_state(rows)["state"] == "changed"
    return found


def _at(case: pd.Series, each: str = "a GPU") -> str:
    return f", {tokens} tokens {each}" if (tokens := tokens_per_gpu(case)) else ""


def _first(g: pd.DataFrame) -> pd.Series | None:
    return g.iloc[0] if len(g) else None


def memory_bar(text: str, fsdp: pd.DataFrame, ddp: pd.Series | None, limit: float) -> dict:
    """FSDP2's peak memory per rank against DDP's, or why it is not measured."""
    ratio = fsdp_ratio(fsdp, ddp)
    peak = fsdp["peak_allocated_mib"].iloc[0] if len(fsdp) else math.nan
    if pd.isna(ratio):
        return _not_measured(text, "no peak memory measured (CPU run, or FSDP2 or DDP did not run)")
    return bar(text, ratio, f"{fmt(ratio)}x ({fmt(peak)} vs {fmt(ddp['peak_allocated_mib'])} MiB)", ratio <= limit)


# ---------------------------------------------------------------------------------------------
# Figures


def figures(inputs, paths: dict) -> dict[str, str]:
    """Bus bandwidth against message size; training step time against GPU (or, on a CPU, process)
    count; {name: why} of a figure not drawn."""
    df = inputs.rows("distributed")
    ar, ddp = frames(df)
    ar = ar[ar["busbw_gbps"].notna()] if not ar.empty else ar
    not_drawn = {}
    if ar.empty:
        not_drawn["dist_busbw"] = "no all-reduce case ran here"
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        for (backend, n), g in ar.groupby(["backend", "processes"]):
            ax.plot(g["size_mb"], g["busbw_gbps"], marker="o", label=f"{backend}, {n} processes")
        for p, style in zip(link_peaks(df), ("--", ":")):
            ax.axhline(p["gbps"], linestyle=style, color="gray", label=f"link peak ({p['source']})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message size (MB)")
        ax.set_ylabel("bus bandwidth (GB/s, median)")
        ax.set_title("All-reduce, fp32: busbw = algbw x 2(n-1)/n")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, paths["dist_busbw"])
    ddp = ddp[ddp["step_ms"].notna() & (ddp["purpose"] == "scaling")] if not ddp.empty else ddp
    if ddp.empty:
        return {**not_drawn, "dist_step_vs_gpus": "no training step of the scaling cases ran here"}
    fig, ax = plt.subplots(figsize=(7, 4))
    # each GPU count from its own machine where there is one (gpu_counts), one GPU from the largest
    machines = dict(gpu_counts(ddp))
    largest = max(ddp["machine"].unique(), key=lambda m: gpu_count(m) or 0)
    ddp = ddp[[m == machines.get(p, largest) for p, m in zip(ddp["processes"], ddp["machine"])]]
    for size, g in ddp.groupby("size", sort=False):
        one = g[g["variant"] == "single"]
        for variant, v in g[g["variant"] != "single"].groupby("variant", sort=False):
            if variant in BUCKETED:  # the best bucket size at each GPU count
                v = v.loc[v.groupby("processes")["tokens_per_s"].idxmax()]
            v = pd.concat([one, v]).sort_values("processes")
            ax.plot(v["processes"], v["step_ms"], marker="o", label=f"{size}, {VARIANT_NAMES.get(variant, variant)}"
                    + (" (best bucket)" if variant in BUCKETED else ""))
        if not one.empty:
            ax.axhline(one["step_ms"].iloc[0], linestyle=":", color="gray")
    w = words(df)
    ax.set_xticks(sorted(ddp["processes"].unique()))
    ax.set_xlabel(f"{w['unit']} (same batch per {w['noun']}; dotted: {w['one']}'s step, the ideal)")
    ax.set_ylabel("training step (ms, median)")
    ax.set_title(f"Data-parallel training step vs {w['noun']} count")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, paths["dist_step_vs_gpus"])
    return not_drawn
