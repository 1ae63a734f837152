"""Memory of one step: peaks per case, the residual stream against the snapshot, links to each
case's snapshot HTML (the memory rule's `html` output), largest allocations, the timelines figure."""
from __future__ import annotations

import os

import pandas as pd

from lmperf.report.format import cell, unavailable
from lmperf.report.plot import plt, save


def view(inputs) -> dict:
    df = inputs.rows("memory")
    if df.empty:
        return unavailable("no results (rule memory has not run)")
    cases = df.drop_duplicates("case_id")
    html_dir = inputs.results / "memory" / "html"
    rows = []
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
    ok = df[df["status"] == "ok"]
    largest = [{"case": case_id, "table": pd.DataFrame({
        "rank": g["rank"].astype(int), "MiB": g["mean"], "made by": g["made_by"],
        "category": g["category"]})}
        for case_id, g in ok[ok["metric"] == "allocation_mib"].groupby("case_id", sort=False)]
    peak = ok[ok["metric"] == "peak_allocated_mib"]
    first = df.iloc[0]
    return {"available": True, "table": pd.DataFrame(rows), "largest": largest,
            "size": first["size"], "batch": int(first["batch_size"]),
            "on_gpu": bool((df["gpu"] != "none").any()), "n_cases": len(cases),
            "n_oom": int((cases["status"] == "oom").sum()),
            "largest_peak": (peak.loc[peak["mean"].idxmax(), ["mode", "dtype", "context", "mean"]].to_dict()
                             if len(peak) else None)}


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
