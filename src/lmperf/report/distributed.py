"""The "Scaling across GPUs" section: its view (frames, numbers and the issue's bars, computed
from the rows of results/<gpu>-x<count>/distributed/*.csv and the thresholds under
`distributed.bars` in config/config.yaml) and its two figures. Self-contained: it reads only
the tidy rows, and formats its own tables (`markdown`) for templates/distributed.md.j2.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

CONFIG = Path(__file__).resolve().parents[3] / "config" / "config.yaml"
PHASES = ["forward_ms", "backward_ms", "allreduce_ms", "optimizer_ms"]
MEMORY = ["param_mib", "grad_mib", "optimizer_state_mib", "activations_mib", "peak_allocated_mib"]
VARIANT_NAMES = {"single": "one GPU", "per_param": "all-reduce per parameter",
                 "flat": "one flattened all-reduce", "ddp": "DDP", "fsdp2": "FSDP2",
                 "zero": "DDP + ZeroRedundancyOptimizer"}


def bars_from_config(path: Path = CONFIG) -> dict:
    """The thresholds under distributed.bars in config/config.yaml."""
    import yaml
    return yaml.safe_load(Path(path).read_text())["distributed"]["bars"]


def load(results: Path) -> pd.DataFrame:
    """All CSVs under <results>/distributed/ (journals excluded), concatenated."""
    paths = sorted(p for p in (Path(results) / "distributed").glob("*.csv"))
    frames = [pd.read_csv(p, keep_default_na=False, na_values=[""]) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# ---------------------------------------------------------------------------------------------
# Formatting (this section's own; the same rules as the rest of the report)


def fmt(x, digits: int = 3) -> str:
    """`digits` significant digits, thousands separated; a whole number as it is (GPUs, batch,
    MB); n/a for a missing number."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if float(x).is_integer():
        return f"{int(x):,}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def markdown(df: pd.DataFrame) -> str:
    """A markdown table of a frame, numbers through fmt; columns empty in every row left out."""
    if df.empty:
        return "(no rows)"
    cells = df.map(lambda v: fmt(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else
                   ("" if v is None else str(v)))
    cells = cells.loc[:, [c for c in cells.columns if ((cells[c] != "") & (cells[c] != "n/a")).any()]]
    return cells.to_markdown(index=False, disable_numparse=True)


# ---------------------------------------------------------------------------------------------
# Reading the rows


def ok_metric(df: pd.DataFrame, study: str, metric: str, stat: str = "mean") -> pd.Series:
    """{case_id: value} of one metric of one study's ok rows."""
    rows = df[(df["study"] == study) & (df["metric"] == metric) & (df["status"] == "ok")]
    return rows.set_index("case_id")[stat]


def variant_label(variant: str, bucket) -> str:
    name = VARIANT_NAMES.get(variant, variant)
    if variant == "ddp":
        return f"{name}, {fmt(float(bucket))} MB buckets"
    return name


def cases(df: pd.DataFrame, study: str) -> pd.DataFrame:
    """One row per case of a study: its columns, status and message."""
    return df[df["study"] == study].drop_duplicates("case_id").set_index("case_id")


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
    out = pd.DataFrame({"backend": c["backend"], "processes": c["world_size"].astype(int),
                        "size_mb": c["size_mb"], "status": c["status"], "message": c["message"]})
    for metric in ("time_ms", "algbw_gbps", "busbw_gbps"):
        out[metric] = ok_metric(df, "allreduce", metric, "median")
    return out.sort_values(["backend", "processes", "size_mb"]).reset_index(drop=True)


def ddp_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per training case: what ran and its means (memory: the largest rank)."""
    c = cases(df, "ddp")
    out = pd.DataFrame({"size": c["size"], "variant": c["variant"], "bucket_cap_mb": c["bucket_cap_mb"],
                        "processes": c["world_size"].astype(int), "global_batch": c["global_batch"],
                        "status": c["status"], "message": c["message"]})
    for metric in PHASES + ["step_ms", "tokens_per_s", "comm_ms", "exposed_comm_ms"]:
        out[metric] = ok_metric(df, "ddp", metric)
    out["step_std_ms"] = ok_metric(df, "ddp", "step_ms", "std")
    for metric in MEMORY:
        out[metric] = ok_metric(df, "ddp", metric, "max")
    out["exposed_comm_share"] = out["exposed_comm_ms"] / out["step_ms"]
    # Scaling efficiency: tokens/s against the one-process job of the same size times the
    # process count (same per-GPU batch, so ideal scaling keeps the step time).
    single = out[out["variant"] == "single"].set_index("size")["tokens_per_s"]
    out["speedup"] = out["tokens_per_s"] / out["size"].map(single)
    out["scaling_efficiency"] = out["speedup"] / out["processes"]
    out["label"] = [variant_label(v, b) for v, b in zip(out["variant"], out["bucket_cap_mb"])]
    return out.reset_index(drop=True)


def best_ddp(ddp: pd.DataFrame, size: str, procs: int) -> pd.Series | None:
    """The DDP bucket size with the most tokens/s for this model size and process count."""
    g = ddp[(ddp["size"] == size) & (ddp["processes"] == procs) & (ddp["variant"] == "ddp")
            & ddp["tokens_per_s"].notna()]
    return None if g.empty else g.loc[g["tokens_per_s"].idxmax()]


# ---------------------------------------------------------------------------------------------
# The view


def view(df: pd.DataFrame, bars: dict) -> dict:
    """Everything templates/distributed.md.j2 places: frames, numbers, and the bars with the
    thresholds from config (`bars`), each measured or saying why it could not be."""
    if df.empty:
        return {"available": False, "why": "no results (rule distributed has not run)"}
    prov = df.iloc[0]
    gpu = prov["gpu"] if prov["gpu"] != "none" else "the CPU (Gloo)"
    out = {"available": True, "hw": prov["hw"], "gpu": gpu, "torch": prov["torch"],
           "commits": sorted(df["commit"].dropna().astype(str).unique()), "bars_config": bars}
    ar = allreduce_frame(df) if "allreduce" in set(df["study"]) else pd.DataFrame()
    ddp = ddp_frame(df) if "ddp" in set(df["study"]) else pd.DataFrame()
    peaks = link_peaks(df) if not ar.empty else []
    out["link_peaks"] = peaks
    out["link_peak"] = next((p for p in peaks if p["source"] == "driver"), peaks[0] if peaks else None)
    out["allreduce"] = ar
    out["ddp"] = ddp
    out["not_run"] = not_run_lines(df)
    out["bars"] = pd.DataFrame(allreduce_bars(ar, out["link_peak"], bars) + ddp_bars(ddp, bars))
    out["markdown"] = {
        "allreduce": markdown(ar[ar["status"] == "ok"].drop(columns=["status", "message"])
                              .rename(columns={"size_mb": "size (MB)", "time_ms": "time (ms, median)",
                                               "algbw_gbps": "algbw (GB/s)", "busbw_gbps": "busbw (GB/s)"}))
        if not ar.empty else "",
        "link_peaks": markdown(pd.DataFrame(peaks).rename(columns={"gbps": "GB/s per direction"}))
        if peaks else "",
        "bars": markdown(out["bars"]) if len(out["bars"]) else "",
        **{f"ddp_{size}": ddp_table(g) for size, g in ddp.groupby("size", sort=False)},
        **{f"memory_{size}": memory_table(g) for size, g in ddp.groupby("size", sort=False)},
    }
    out["sizes"] = list(ddp["size"].unique()) if not ddp.empty else []
    return out


def ddp_table(g: pd.DataFrame) -> str:
    g = g[g["status"] == "ok"]
    t = pd.DataFrame({
        "variant": g["label"], "GPUs": g["processes"], "global batch": g["global_batch"],
        "step (ms)": [f"{fmt(m)} ± {fmt(s, 2)}" for m, s in zip(g["step_ms"], g["step_std_ms"])],
        **{p.removesuffix("_ms"): g[p] for p in PHASES},
        "tokens/s": g["tokens_per_s"], "scaling efficiency": g["scaling_efficiency"],
        "comm (ms)": g["comm_ms"], "exposed comm (ms)": g["exposed_comm_ms"],
        "exposed share": [f"{100 * x:.1f}%" if pd.notna(x) else "" for x in g["exposed_comm_share"]]})
    return markdown(t)


def memory_table(g: pd.DataFrame) -> str:
    g = g[g["status"] == "ok"]
    t = pd.DataFrame({"variant": g["label"], "GPUs": g["processes"],
                      "parameters": g["param_mib"], "gradients": g["grad_mib"],
                      "optimizer state": g["optimizer_state_mib"],
                      "activations and buffers": g["activations_mib"],
                      "peak allocated": g["peak_allocated_mib"]})
    return markdown(t)


def not_run_lines(df: pd.DataFrame) -> list[str]:
    """One line per case that is not ok: the case and its status and message."""
    c = df.drop_duplicates(["study", "case_id"])
    return [f"`{r.case_id}` ({r.study}): {r.status}, {r.message}"
            for r in c[c["status"] != "ok"].itertuples()]


def allreduce_bars(ar: pd.DataFrame, peak: dict | None, bars: dict) -> list[dict]:
    """NCCL all-reduce of the largest message: bus bandwidth as a share of the link's peak."""
    nccl = ar[(ar.get("backend") == "nccl") & ar["busbw_gbps"].notna()] if not ar.empty else ar
    threshold = bars["busbw_fraction_of_link"]
    if nccl.empty or peak is None:
        why = "no NCCL all-reduce measured here" if nccl.empty else "no link peak known for this GPU"
        return [{"bar": f"NCCL all-reduce of 1 GB: busbw >= {threshold:.0%} of the link's peak",
                 "measured": why, "met": "not measured"}]
    rows = []
    for n, g in nccl.groupby("processes"):
        big = g.loc[g["size_mb"].idxmax()]
        share = big["busbw_gbps"] / peak["gbps"]
        rows.append({"bar": f"NCCL all-reduce of {fmt(big['size_mb'] / 1000)} GB, {n} GPUs: busbw >= "
                            f"{threshold:.0%} of the link's peak ({peak['source']}, {fmt(peak['gbps'])} GB/s)",
                     "measured": f"{fmt(big['busbw_gbps'])} GB/s = {share:.1%}",
                     "met": "yes" if share >= threshold else "no"})
    return rows


def ddp_bars(ddp: pd.DataFrame, bars: dict) -> list[dict]:
    """Per model size, on 2 GPUs: the best DDP bucket's speedup and exposed communication, and
    FSDP2's peak memory against that DDP's."""
    speedup, exposed, memory = (bars["ddp_speedup_2gpu"], bars["exposed_comm_fraction"],
                                bars["fsdp2_memory_vs_ddp"])
    rows = []
    sizes = list(ddp["size"].unique()) if not ddp.empty else []
    if not sizes:
        return [{"bar": f"DDP on 2 GPUs >= {speedup}x one GPU", "measured": "no training step measured",
                 "met": "not measured"}]
    for size in sizes:
        best = best_ddp(ddp, size, 2)
        if best is None:
            rows.append({"bar": f"{size}: best DDP bucket on 2 GPUs >= {speedup}x one GPU's tokens/s",
                         "measured": "no DDP step on 2 GPUs", "met": "not measured"})
            continue
        name = f"{size}, DDP {fmt(float(best['bucket_cap_mb']))} MB buckets"
        s = best["speedup"]
        rows.append({"bar": f"{name} (best) on 2 GPUs: tokens/s >= {speedup}x one GPU's",
                     "measured": f"{fmt(s)}x" if pd.notna(s) else "no one-GPU job",
                     "met": ("yes" if s >= speedup else "no") if pd.notna(s) else "not measured"})
        share = best["exposed_comm_share"]
        rows.append({"bar": f"{name}: exposed communication <= {exposed:.0%} of the step",
                     "measured": f"{share:.1%} ({fmt(best['exposed_comm_ms'])} of {fmt(best['step_ms'])} ms)"
                     if pd.notna(share) else "not profiled here (a GPU's profile is needed)",
                     "met": ("yes" if share <= exposed else "no") if pd.notna(share) else "not measured"})
        fsdp = ddp[(ddp["size"] == size) & (ddp["processes"] == 2) & (ddp["variant"] == "fsdp2")]
        ratio = (fsdp["peak_allocated_mib"].iloc[0] / best["peak_allocated_mib"]) if len(fsdp) else math.nan
        rows.append({"bar": f"{size}: FSDP2 peak memory per rank <= {memory}x DDP's (2 GPUs)",
                     "measured": f"{fmt(ratio)}x ({fmt(fsdp['peak_allocated_mib'].iloc[0])} vs "
                                 f"{fmt(best['peak_allocated_mib'])} MiB)" if pd.notna(ratio)
                     else "no peak memory measured (CPU run, or FSDP2 did not run)",
                     "met": ("yes" if ratio <= memory else "no") if pd.notna(ratio) else "not measured"})
    return rows


# ---------------------------------------------------------------------------------------------
# Figures


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


def figures(df: pd.DataFrame, out: Path) -> dict[str, Path]:
    """Bus bandwidth against message size; training step time against GPU count."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"dist_busbw": out / "distributed_busbw_vs_size.png",
             "dist_step_vs_gpus": out / "distributed_step_vs_gpus.png"}
    ar = allreduce_frame(df) if not df.empty and "allreduce" in set(df["study"]) else pd.DataFrame()
    ar = ar[ar["busbw_gbps"].notna()] if not ar.empty else ar
    if ar.empty:
        _empty(paths["dist_busbw"], "all-reduce bus bandwidth vs message size")
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
        _save(fig, paths["dist_busbw"])
    ddp = ddp_frame(df) if not df.empty and "ddp" in set(df["study"]) else pd.DataFrame()
    ddp = ddp[ddp["step_ms"].notna()] if not ddp.empty else ddp
    if ddp.empty:
        _empty(paths["dist_step_vs_gpus"], "training step vs GPU count")
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
        for size, g in ddp.groupby("size", sort=False):
            one = g[g["variant"] == "single"]
            for variant, v in g[g["variant"] != "single"].groupby("variant", sort=False):
                if variant == "ddp":  # the best bucket size at each GPU count
                    v = v.loc[v.groupby("processes")["tokens_per_s"].idxmax()]
                v = pd.concat([one, v]).sort_values("processes")
                ax.plot(v["processes"], v["step_ms"], marker="o", label=f"{size}, {VARIANT_NAMES[variant]}"
                        + (" (best bucket)" if variant == "ddp" else ""))
            if not one.empty:
                ax.axhline(one["step_ms"].iloc[0], linestyle=":", color="gray")
        ax.set_xticks(sorted(ddp["processes"].unique()))
        ax.set_xlabel("GPUs (same batch per GPU; dotted: one GPU's step, the ideal)")
        ax.set_ylabel("training step (ms, mean)")
        ax.set_title("Data-parallel training step vs GPU count")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        _save(fig, paths["dist_step_vs_gpus"])
    return paths


# ---------------------------------------------------------------------------------------------
# The section alone (before it is wired into report/report.md, or to preview a run)


def main(argv=None) -> None:
    """python -m lmperf.report.distributed --results results/h200-x2 --out report/distributed/distributed.md"""
    import argparse

    import jinja2

    p = argparse.ArgumentParser(description="Render the 'Scaling across GPUs' section alone.")
    p.add_argument("--results", type=Path, required=True, help="results/<gpu>-x<count> folder")
    p.add_argument("--templates", type=Path, default=Path("templates"))
    p.add_argument("--out", type=Path, required=True, help="markdown file to write")
    args = p.parse_args(argv)
    df = load(args.results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figs = figures(df, args.out.parent / "figures")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(args.templates), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    text = env.get_template("distributed.md.j2").render(
        distributed=view(df, bars_from_config()),
        figures={k: str(Path(v).relative_to(args.out.parent)) for k, v in figs.items()})
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
