"""The rows of the "Scaling across GPUs" section as frames (report/distributed.py renders
them): one row per all-reduce case and per training case of each machine folder, medians with
their quantiles, each GPU count's speedup against its own machine's one-GPU job."""
from __future__ import annotations

import math
import re

import pandas as pd

PHASES = ["forward_ms", "backward_ms", "allreduce_ms", "optimizer_ms"]
MEMORY = ["param_mib", "grad_mib", "optimizer_state_mib", "activations_mib", "peak_allocated_mib"]
VARIANT_NAMES = {"single": "one GPU", "per_param": "all-reduce per parameter",
                 "flat": "one flattened all-reduce", "ddp": "DDP", "ddp_bf16": "DDP, bf16 all-reduce",
                 "fsdp2": "FSDP2",
                 "zero": "DDP + ZeroRedundancyOptimizer"}


# ---------------------------------------------------------------------------------------------
# Reading the rows


BUCKETED = ("ddp", "ddp_bf16")  # DDP at each bucket size of the grid (fp32 and bf16 all-reduce)
KEY = ["hw", "case_id"]  # a case of one machine's folder: h200-x2's and h200-x4's n2 jobs are two cases


def ok_metric(df: pd.DataFrame, study: str, metric: str, stat: str = "median") -> pd.Series:
    """{(hw, case_id): value} of one metric of one study's ok rows."""
    rows = df[(df["study"] == study) & (df["metric"] == metric) & (df["status"] == "ok")]
    return rows.drop_duplicates(KEY).set_index(KEY)[stat] if stat in rows else pd.Series(dtype=float)


GPU_WORDS = {"unit": "GPUs", "one": "one GPU", "each": "a GPU", "noun": "GPU"}
PROCESS_WORDS = {"unit": "processes", "one": "one process", "each": "a process", "noun": "process"}


def words(df: pd.DataFrame) -> dict:
    """How the section names a rank: a GPU where the rows name one, else a process (a CPU's Gloo
    run). `unit` follows a count ("2 GPUs"), `one` names the one-rank job ("one GPU"), `each` a
    rank's share ("tokens a GPU")."""
    on_gpus = "gpu" in df and any(g != "none" for g in df["gpu"].dropna().astype(str))
    return dict(GPU_WORDS if on_gpus else PROCESS_WORDS)


def no_run(n: int, w: dict) -> str:
    """Why a bar of `n` ranks is not measured: no machine of `n` GPUs, or no run of `n` processes."""
    return f"no machine with {n} GPUs ran it" if w == GPU_WORDS else f"no run of {n} {w['unit']} here"


def variant_label(variant: str, bucket, one: str = VARIANT_NAMES["single"]) -> str:
    """A training variant's name in the tables (DDP's with its bucket size); `one` names the
    one-rank job (`words`)."""
    if variant == "single":
        return one
    name = VARIANT_NAMES.get(variant, variant)
    if variant in BUCKETED:
        return f"{name}, {float(bucket):g} MB buckets"
    return name


def cases(df: pd.DataFrame, study: str) -> pd.DataFrame:
    """One row per case of a study and machine folder: its columns, status and message."""
    return df[df["study"] == study].drop_duplicates(KEY).set_index(KEY)


def gpu_count(folder: str) -> int | None:
    """The GPUs of the machine a multi-GPU folder comes from: 'h100-80gb-hbm3-x4' -> 4."""
    m = re.fullmatch(r".+-x(\d+)", str(folder))
    return int(m[1]) if m else None


def link_peaks(df: pd.DataFrame) -> list[dict]:
    """The link's peak, driver and datasheet, as the allreduce jobs recorded it."""
    rows = df[(df["study"] == "allreduce") & df["metric"].isin(["link_peak_driver_gbps",
                                                                "link_peak_datasheet_gbps"])
              & (df["status"] == "ok")].drop_duplicates("metric")
    return [{"source": "driver" if r.metric == "link_peak_driver_gbps" else "datasheet",
             "gbps": float(r.mean), "how": r.message} for r in rows.itertuples()]


def allreduce_frame(df: pd.DataFrame) -> pd.DataFrame:
    c = cases(df, "allreduce")
    c = c[c["kind"] == "allreduce"]
    out = pd.DataFrame({"machine": c.index.get_level_values("hw"), "backend": c["backend"],
                        "processes": c["world_size"].astype(int),
                        "size_mb": c["size_mb"], "status": c["status"], "message": c["message"]})
    for metric in ("time_ms", "algbw_gbps", "busbw_gbps"):
        out[metric] = ok_metric(df, "allreduce", metric, "median")
    return out.sort_values(["backend", "processes", "size_mb", "machine"]).reset_index(drop=True)


def ddp_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per training case and machine folder: what ran, the medians of its timed steps
    with their 20%-80% quantiles (memory: the largest rank)."""
    c = cases(df, "ddp")
    out = pd.DataFrame({"machine": c.index.get_level_values("hw"), "size": c["size"], "variant": c["variant"],
                        "bucket_cap_mb": c["bucket_cap_mb"],
                        "processes": c["world_size"].astype(int), "global_batch": c["global_batch"],
                        "micro_batches": c["micro_batches"] if "micro_batches" in c else 1,
                        # the memory context's cases ("memory"), beside the scaling grid ("scaling")
                        "context": c["context"] if "context" in c else math.nan,
                        "purpose": c["purpose"].fillna("scaling") if "purpose" in c else "scaling",
                        "status": c["status"], "message": c["message"]})
    for metric in PHASES + ["step_ms", "tokens_per_s", "comm_ms", "exposed_comm_ms", "compute_ms"]:
        out[metric] = ok_metric(df, "ddp", metric)
    for stat in ("q20", "q80"):
        out[f"step_{stat}_ms"] = ok_metric(df, "ddp", "step_ms", stat)
    for metric in MEMORY:
        out[metric] = ok_metric(df, "ddp", metric, "max")
    out["exposed_comm_share"] = out["exposed_comm_ms"] / out["step_ms"]
    # host-bound? the share of the median step in which rank 0's GPU ran nothing: the step less
    # its profiled steps' kernel time (compute, and communication nothing overlaps); NaN where
    # not profiled (a CPU)
    busy = out["compute_ms"] + out["exposed_comm_ms"]
    out["gpu_idle_pct"] = (100 * (1 - busy / out["step_ms"])).clip(lower=0)
    # Scaling efficiency: tokens/s against the one-process job of the same size on the same
    # machine times the process count (same per-GPU batch, so ideal scaling keeps the step time).
    single = out[out["variant"] == "single"].set_index(["machine", "size", "purpose"])["tokens_per_s"]
    keys = pd.Series(list(zip(out["machine"], out["size"], out["purpose"])), index=out.index)
    out["speedup"] = out["tokens_per_s"] / keys.map(single)
    out["scaling_efficiency"] = out["speedup"] / out["processes"]
    single_forward = out[out["variant"] == "single"].set_index(["machine", "size", "purpose"])["forward_ms"]
    out["single_forward_ms"] = keys.map(single_forward)
    out["sequences_per_gpu"] = out["global_batch"] / out["processes"]  # a step's, micro-batches included
    one = words(df)["one"]
    out["label"] = [variant_label(v, b, one) for v, b in zip(out["variant"], out["bucket_cap_mb"])]
    return out.reset_index(drop=True)


# DDP's forward pass does not communicate: on a quiet machine a rank's forward takes what the
# one-GPU job's takes. A one-GPU forward this much slower than the ranks' says the baseline ran
# slow (another tenant, a throttled GPU), and every speedup against it reads too high.
SLOW_BASELINE = 0.05


def slow_baseline(row: pd.Series) -> str:
    """Why a DDP case's speedup cannot be judged against its machine's one-GPU job, or ""."""
    mine, single = row.get("forward_ms", math.nan), row.get("single_forward_ms", math.nan)
    if row.get("variant") not in BUCKETED or pd.isna(mine) or pd.isna(single) or mine >= (1 - SLOW_BASELINE) * single:
        return ""
    return (f"the one-GPU job's forward took {single:.1f} ms, each rank's {mine:.1f} ms (DDP's forward does not "
            f"communicate): the baseline ran slow on a noisy machine; measure both again")


def best_ddp(ddp: pd.DataFrame, size: str, procs: int, machine: str, purpose: str = "scaling") -> pd.Series | None:
    """The DDP bucket size and bucket type (fp32, or bf16: BUCKETED) with the most tokens/s for
    this model size and process count on this machine, among the cases of `purpose` (the
    scaling grid's, or those with more micro-batches a step: "accumulate")."""
    g = ddp[(ddp["size"] == size) & (ddp["processes"] == procs) & ddp["variant"].isin(BUCKETED)
            & (ddp["machine"] == machine) & (ddp["purpose"] == purpose) & ddp["tokens_per_s"].notna()]
    return None if g.empty else g.loc[g["tokens_per_s"].idxmax()]


def gpu_counts(ddp: pd.DataFrame) -> list[tuple[int, str]]:
    """(GPU count, machine folder) of every count of 2 or more with a training step: a count's
    own machine (h200-x2 for 2 GPUs) where there is one, else the largest machine that ran it."""
    if ddp.empty:
        return []
    ran = ddp[(ddp["processes"] >= 2) & ddp["tokens_per_s"].notna()]
    out = []
    for procs, g in ran.groupby("processes"):
        machines = sorted(g["machine"].unique(), key=lambda m: (gpu_count(m) != procs, -(gpu_count(m) or 0)))
        out.append((int(procs), machines[0]))
    return out


def frames(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(all-reduce frame, training frame) of the section's rows, empty where a study is absent."""
    studies = set(df["study"]) if not df.empty else set()
    return (allreduce_frame(df) if "allreduce" in studies else pd.DataFrame(),
            ddp_frame(df) if "ddp" in studies else pd.DataFrame())
