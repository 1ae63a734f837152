"""Memory of one step: peaks per case, the residual stream against the snapshot, links to each
case's snapshot HTML (the memory rule's `html` output), each case's picture of its snapshot (the
memory rule's `snapshots`, kept in git) beside the peaks, largest allocations, the timelines figure,
why a bf16 forward pass peaks above an fp32 one (`bf16_forward`), and each contender's attention in a
training step beside ours (`contender_rungs`, from the ladder's rows: no second measurement)."""
from __future__ import annotations

import math
import os

import pandas as pd

from lmperf.report.format import cell, ratio_range, unavailable
from lmperf.report.ladder import is_contender, is_peer
from lmperf.report.plot import plt, save


def view(inputs) -> dict:
    df = inputs.rows("memory")
    if df.empty:
        return unavailable("no results (rule memory has not run)")
    cases = df.drop_duplicates("case_id")
    html_dir = inputs.results / "memory" / "html"
    rows, pictures = [], []
    for case_id, g in df.groupby("case_id", sort=False):
        first = g.iloc[0]
        residual = g[g["metric"] == "residual_stream_mib"]
        html = html_dir / f"{case_id}.html"
        rows.append({"mode": first["mode"], "dtype": first["dtype"], "context": int(first["context"]),
                     "peak allocated (MiB)": cell(g, "peak_allocated_mib"),
                     "peak reserved (MiB)": cell(g, "peak_reserved_mib"),
                     "residual stream (MiB)": cell(g, "residual_stream_mib"),
                     "allocations of that size": int(residual["matching_allocations"].iloc[0]) if len(residual) else None,
                     "snapshot": f"[html]({os.path.relpath(html, inputs.out_dir)})" if html.exists() else None})
        if (png := snapshot_picture(inputs.results, case_id)) is not None:
            pictures.append({"case": case_id, "mode": first["mode"], "dtype": first["dtype"],
                             "context": int(first["context"]), "path": os.path.relpath(png, inputs.out_dir)})
    ok = df[df["status"] == "ok"]
    largest = [{"case": case_id, "table": pd.DataFrame({
        "rank": g["rank"].astype(int), "MiB": g["mean"], "made by": g["made_by"],
        "category": g["category"]})}
        for case_id, g in ok[ok["metric"] == "allocation_mib"].groupby("case_id", sort=False)]
    peak = ok[ok["metric"] == "peak_allocated_mib"]
    first = df.iloc[0]
    e2e = inputs.frames.get("e2e", pd.DataFrame())
    counted = e2e[(e2e["metric"] == "parameters") & (e2e["size"] == first["size"])]["median"] if not e2e.empty else []
    return {"available": True, "table": pd.DataFrame(rows), "largest": largest, "pictures": pictures,
            "bf16_forward": bf16_forward(ok, e2e, inputs.models, first["size"]),
            "modes": list(dict.fromkeys(df["mode"])),
            # the parameters' state only where the peaks count it (a GPU's; a CPU's see the step's allocations)
            "peaks": peaks(ok, float(counted.iloc[0]) if len(counted) and (df["gpu"] != "none").any() else None),
            "size": first["size"], "batch": int(first["batch_size"]),
            **contenders_view(contender_rungs(inputs.frames.get("ladder", pd.DataFrame()))),
            "on_gpu": bool((df["gpu"] != "none").any()), "n_cases": len(cases),
            "n_oom": int((cases["status"] == "oom").sum()),
            "largest_peak": (peak.loc[peak["mean"].idxmax(), ["mode", "dtype", "context", "mean"]].to_dict()
                             if len(peak) else None)}


# The memory rule's pictures of its snapshots, beside its CSV (bench/memory.py's SNAPSHOTS)
SNAPSHOTS = "snapshots"


def snapshot_picture(results, case_id: str):
    """The PNG of a case's snapshot (its allocations stacked over time), or None where the run
    wrote none (results measured before the pictures were)."""
    path = results / "memory" / SNAPSHOTS / f"{case_id}.png"
    return path if path.is_file() else None


# What a ladder rung is run on besides its attention: a contender's rung is the last carried rung's
# settings with the contender's attention (bench/ladder.py, lmperf.contenders.ladder_rungs).
RUNG_SETTINGS = ("size", "dtype", "tf32", "compile", "optimizer", "fused", "float8", "context", "batch_size",
                 "micro_batches", "checkpoint_every", "expandable_segments")


def contender_rungs(ladder: pd.DataFrame) -> pd.DataFrame:
    """Each contender's attention in a training step of the ladder's model (its rung,
    `contender_<provider>`) beside the rung whose settings it runs on: the last rung of ours before
    it that ran (a rung skipped for want of CUDA changes nothing after it) with the contender
    rung's settings but the attention (ours, flash-triton, on a GPU). Peak allocated memory (MiB;
    a GPU's: the ladder records none without CUDA, "no peak recorded") and the contender's over
    that rung's; an empty frame without contender rungs. (Their step times are the ladder
    section's, with its host-bound marks.)"""
    if ladder.empty or "name" not in ladder:
        return pd.DataFrame()
    rungs = ladder.drop_duplicates("case_id")
    rivals = rungs[is_contender(rungs)]
    if rivals.empty:
        return pd.DataFrame()
    keys = [k for k in RUNG_SETTINGS if k in rungs]
    setting = lambda df: df[keys].astype(str).agg("|".join, axis=1)
    ours = rungs[~is_contender(rungs) & ~is_peer(rungs) & rungs["status"].ne("skipped")]
    ours_setting = setting(ours)
    peak = lambda case: (lambda v: "no peak recorded" if v is None else v)(cell(case, "peak_allocated_mib", column="median"))
    out = []
    for (_, r), key in zip(rivals.iterrows(), setting(rivals)):
        same = ours[(ours_setting == key) & (ours["rung"] < r["rung"])]
        mine = ladder[ladder["case_id"] == r["case_id"]]
        theirs = ladder[ladder["case_id"] == same["case_id"].iloc[-1]] if len(same) else None
        line = {"contender": str(r["attention"]), "rung": int(r["rung"]), "context": int(r["context"]),
                "dtype": r["dtype"], "peak allocated (MiB)": peak(mine),
                "on the settings of": f"rung {int(same['rung'].iloc[-1])} {same['name'].iloc[-1]} "
                                      f"(attention {same['attention'].iloc[-1]})" if len(same) else "no rung ran on them",
                "its peak (MiB)": peak(theirs) if theirs is not None else None}
        both = [line["peak allocated (MiB)"], line["its peak (MiB)"]]
        line["peak, contender / that rung"] = (both[0] / both[1] if all(isinstance(v, float) and v > 0 for v in both)
                                               else None)
        out.append(line)
    return pd.DataFrame(out)


def contenders_view(table: pd.DataFrame) -> dict:
    """The template's keys of `contender_rungs`' table: the table and a line per contender for
    the prose (peak: MiB, or why there is none; that rung's peak and the ratio: None where there
    is none)."""
    number = lambda v: float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None
    lines = [{"contender": r["contender"], "peak": r["peak allocated (MiB)"], "ours": number(r["its peak (MiB)"]),
              "ratio": number(r["peak, contender / that rung"]), "beside": r["on the settings of"]}
             for _, r in table.iterrows()]
    return {"contenders": table, "contender_lines": lines}


def bf16_forward(ok: pd.DataFrame, e2e: pd.DataFrame, models: dict, size: str) -> dict:
    """A forward pass's peak under bf16 autocast against fp32's, per context: {"table": context,
    both peaks and their difference (MiB), "extra": {n, min, max, mean} of the differences,
    "weights_mib": the matrix weights in bf16 (every parameter but the token embedding, 2 B each:
    the copies autocast casts once and keeps in its cast cache for the rest of the pass), and the
    largest allocation of each dtype's forward with what made it and, for bf16, the size of one
    d_model x d_ff weight in bf16}; {} where either dtype's forward is missing."""
    peak = ok[(ok["metric"] == "peak_allocated_mib") & (ok["mode"] == "forward")]
    p = peak.pivot_table(index="context", columns="dtype", values="mean")
    if not {"fp32", "bf16"} <= set(p.columns):
        return {}
    table = pd.DataFrame({"context": p.index.astype(int), "fp32 peak (MiB)": p["fp32"].values,
                          "bf16 peak (MiB)": p["bf16"].values, "bf16 - fp32 (MiB)": (p["bf16"] - p["fp32"]).values})
    out = {"table": table, "extra": ratio_range(table["bf16 - fp32 (MiB)"])}
    # at the shortest context, where the activations weigh least against the weights
    alloc = ok[(ok["metric"] == "allocation_mib") & (ok["mode"] == "forward")]
    alloc = alloc[alloc["context"] == alloc["context"].min()] if len(alloc) else alloc
    out["largest_context"] = int(alloc["context"].min()) if len(alloc) else None
    for dtype in ("fp32", "bf16"):
        a = alloc[alloc["dtype"] == dtype]
        if len(a):
            top = a.loc[a["mean"].idxmax()]
            out[f"largest_{dtype}"] = {"mib": float(top["mean"]), "made_by": str(top["made_by"]).split(" from ")[0]}
    if size in models and not e2e.empty:
        from lmperf.report.e2e import model_table, with_quantiles
        m = model_table(with_quantiles(e2e), models)
        row = m[m["model"] == size] if not m.empty else m
        if len(row) and pd.notna(row["vocabulary"].iloc[0]):
            d, f = models[size]["d_model"], models[size]["d_ff"]
            vocab = float(row["vocabulary"].iloc[0])
            out["weights_mib"] = (int(row["_parameters"].iloc[0]) - vocab * d) * 2 / 2**20
            out["mlp_weight_mib"] = d * f * 2 / 2**20
    return out


def peaks(ok: pd.DataFrame, parameters: float | None) -> dict:
    """The section's answer: per mode, the range of the peaks over dtypes and contexts
    ({n, min, max, mean}, MiB); where the training step's peak falls in its recorded timeline
    (the bucket of the maximum over the buckets, 0 to 1: its last part is the optimizer step, after
    backward), with the contexts and dtypes of those cases; and, given the model's parameter count, the fp32 parameters, gradients and AdamW's
    two moments (16 B a parameter, MiB)."""
    peak = ok[ok["metric"] == "peak_allocated_mib"]
    out = {mode: ratio_range(g["mean"]) for mode, g in peak.groupby("mode", sort=False)}
    timeline = ok[(ok["metric"] == "timeline_mib") & (ok["mode"] == "train")]
    where = []
    for samples in timeline["samples"].dropna().astype(str):
        ys = [float(x) for x in samples.split(";")]
        where.append(ys.index(max(ys)) / max(len(ys) - 1, 1))
    out["train_peak_at"] = ratio_range(pd.Series(where, dtype=float))
    train = peak[peak["mode"] == "train"]
    out["contexts"] = [f"{c:,}" for c in sorted(set(train["context"].astype(int)))]
    out["dtypes"] = list(dict.fromkeys(train["dtype"]))
    out["model_state_mib"] = 16 * parameters / 2**20 if parameters else None
    out["parameters"] = parameters
    return out


def figures(inputs, paths: dict) -> dict[str, str]:
    """Active memory over the recorded step, one panel per case (from the CSV's timeline rows);
    {name: why} of a figure not drawn."""
    path = paths["memory"]
    df = inputs.rows("memory")
    rows = df[(df["metric"] == "timeline_mib") & (df["status"] == "ok")] if not df.empty else df
    if rows.empty:
        return {"memory": "no memory timeline was recorded here"}
    cols = min(4, len(rows))
    nrows = -(-len(rows) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.8 * nrows), squeeze=False)
    for ax, (_, r) in zip(axes.flat, rows.iterrows()):
        ys = [float(x) for x in str(r["samples"]).split(";")]
        ax.plot(range(len(ys)), ys)
        ax.set_title(f"{r['mode']} {r['dtype']} ctx {int(r['context'])}", fontsize="small")
        ax.set_xlabel("snapshot events (bucketed)")
        ax.set_ylabel("active MiB")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.remove()
    save(fig, path)
    return {}
