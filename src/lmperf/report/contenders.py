"""Contenders: a user's implementations beside ours (lmperf.contenders). One summary row per
contender provider (correct / compiles / deterministic / fresh, its time, its ratio to ours and
to the best peer), and each contender's page (`pages`: everything about it, report/contenders/).

Reads results/<hw>/contenders/ (bench/contenders.py: the float64 check and the properties; the
distributed adapters against one process) and the FlashAttention section's rows of contender
providers (the timings). A contender that failed any check is "wrong" in every timing cell: its
time is never shown as a speed-up. The pages are written by the renderer (lmperf.report.render)
beside the report.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lmperf import stats
from lmperf.report.format import HOST_BOUND, fmt

PROPERTIES = ("gqa", "compiles", "deterministic", "fresh")
# The timing a provider is compared on, in order of preference: GPU time (CUDA graphs) where
# the case has it, else do_bench's; one method for a row's ratios (never mixed within a row).
TIMINGS = ("fwd_bwd_gpu_ms", "fwd_bwd_ms")
OURS = "triton"
# Ours of each kind of contender attention (lmperf.contenders.ATTENTION): what its rows are
# judged against, row by row, by lmperf.compare (`agreement`)
OURS_OF_KIND = {"triton": "triton", "pytorch": "torch_tiled"}


def _truth(s: pd.Series) -> pd.Series:
    return s.astype(str).str.lower().isin(["true", "1", "1.0"])


def checks(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per contender provider: its float64 check and its properties."""
    if rows.empty:
        return pd.DataFrame()
    att = rows[rows["study"] == "attention"]
    out = []
    for provider, g in att.groupby("provider", sort=False):
        values = g[g["check"] == "values"]
        ok = values[values["status"] == "ok"]
        passed = _truth(ok["passed"])
        bad = g[g["status"].isin(["wrong", "failed", "timeout", "crashed", "oom"])]
        skipped = g[g["status"].isin(["skipped", "unsupported"])]
        line = {"contender": g["contender"].iloc[0], "provider": provider,
                "checks passed": f"{int(passed.sum())}/{len(ok)}" if len(ok) else "none ran",
                "_passed": int(passed.sum()), "_checks": len(ok), "_bad": len(bad)}
        for prop in PROPERTIES:
            p = g[g["check"] == prop]
            if p.empty:
                line[prop] = "not checked"
            elif p["status"].iloc[0] == "ok":
                line[prop] = "yes" if _truth(p["passed"]).all() else "no"
            else:
                line[prop] = p["status"].iloc[0]
        not_implemented = not skipped.empty and len(skipped) == len(g) and \
            skipped["message"].astype(str).str.startswith("not implemented").all()
        correct = len(ok) > 0 and bool(passed.all()) and bad.empty and line["fresh"] in ("yes", "not checked")
        line["result"] = ("not implemented" if not_implemented else "correct" if correct else
                          "not checked" if len(ok) == 0 and bad.empty else "WRONG")
        line["why"] = _why(g, ok, passed, bad, skipped)
        out.append(line)
    return pd.DataFrame(out)


def _why(g, ok, passed, bad, skipped) -> str:
    if not bad.empty:
        r = bad.iloc[0]
        return f"{r['status']} in {r['case_id']}: {r['message']}"
    if len(ok) and not passed.all():
        r = ok[~passed].iloc[0]
        return f"{r['metric']} = {r['median']:.3g} > tolerance {float(r['tolerance']):.3g} in {r['case_id']}"
    if not skipped.empty:
        return str(skipped["message"].iloc[0])
    return ""


def distributed(rows: pd.DataFrame) -> pd.DataFrame:
    if rows.empty or "contract" not in rows:
        return pd.DataFrame()
    d = rows[rows["study"] == "distributed"]
    return pd.DataFrame([{"contender": r.contender, "contract": r.contract, "backend": r.backend,
                          "result": ("correct" if str(r.passed).lower() == "true" else "WRONG") if r.status == "ok"
                          else r.status,
                          "max weight difference": r.median if r.status == "ok" else None,
                          "why": "" if r.status == "ok" else r.message} for r in d.itertuples()])


def _time(g: pd.DataFrame, provider: str, metric: str, column: str = "median"):
    r = g[(g["provider"] == provider) & (g["metric"] == metric) & (g["status"] == "ok")]
    return float(r[column].iloc[0]) if len(r) and column in r and pd.notna(r[column].iloc[0]) else None


def timings(fa: pd.DataFrame, table: pd.DataFrame, idle: float = math.inf) -> pd.DataFrame:
    """Per FlashAttention bench case and contender provider: its time, ours, the best peer's,
    the ratios (one timing method a row), or 'wrong' where the contender failed a check. A
    do_bench time whose GPU sat idle more than `idle` % (the contender's or ours) is the host's:
    marked, and no ratio is taken from it."""
    if fa.empty or table.empty or "provider" not in fa:
        return pd.DataFrame()
    bench = fa[fa["study"] == "bench"]
    result = dict(zip(table["provider"], table["result"]))
    peers = [p for p in bench["provider"].unique() if p not in result and p != OURS and p != "triton_compiled"]
    keys = ["group", "dtype", "causal", "batch", "heads", "kv_heads", "seq_len", "head_dim"]
    out = []
    for key, g in bench.groupby([k for k in keys if k in bench], sort=False):
        shape = dict(zip([k for k in keys if k in bench], key))
        for provider in [p for p in g["provider"].unique() if p in result]:
            metric = next((m for m in TIMINGS if _time(g, provider, m) is not None and _time(g, OURS, m) is not None),
                          None)
            line = {"contender": provider, "group": shape.get("group"),
                    "shape": " ".join(f"{k}{int(shape[c])}" for k, c in (("b", "batch"), ("h", "heads"),
                                                                             ("n", "seq_len"), ("d", "head_dim"))
                                      if c in shape),
                    "causal": shape.get("causal"), "dtype": shape.get("dtype")}
            if result[provider] == "WRONG":
                line.update({"ms": "wrong", "vs ours": "wrong", "vs best peer": "wrong", "timing": ""})
            elif metric is None:
                r = g[g["provider"] == provider]
                line.update({"ms": None, "vs ours": None, "vs best peer": None,
                             "timing": f"not measured: {r['message'].iloc[0] if len(r) else 'no row'}"})
            else:
                mine, ours = _time(g, provider, metric), _time(g, OURS, metric)
                best = min((t for p in peers if (t := _time(g, p, metric)) is not None), default=None)
                line.update({"ms": mine, "vs ours": ours / mine, "vs best peer": best / mine if best else None,
                             "timing": "GPU time (CUDA graph)" if metric.endswith("gpu_ms") else "do_bench"})
                idles = {who: _time(g, p, metric, "gpu_idle_pct") for who, p in (("its", provider), ("ours", OURS))}
                if not metric.endswith("gpu_ms") and any(v is not None and v > idle for v in idles.values()):
                    line.update({"vs ours": None, "vs best peer": None,
                                 "timing": f"do_bench, host-bound {HOST_BOUND}: the GPU idle "
                                           + ", ".join(f"{fmt(v)}% ({who})" for who, v in idles.items() if v is not None)})
            out.append(line)
    return pd.DataFrame(out)


def wrong(rows: pd.DataFrame) -> dict[str, str]:
    """{what a section's rows call it: why it is wrong} for every contender implementation that
    failed a check: its attention provider, its ladder rung (`contender_<provider>`) and its
    distributed variant (`<name>-<contract>`)."""
    out = {}
    table = checks(rows)
    for r in (table.itertuples() if not table.empty else ()):
        if r.result == "WRONG":
            out[r.provider] = out[f"contender_{r.provider}"] = f"wrong: failed its check ({r.why})"
    dist = distributed(rows)
    for r in (dist.itertuples() if not dist.empty else ()):
        if r.result == "WRONG" or r.result in ("wrong", "failed", "crashed", "timeout"):
            out[f"{r.contender}-{r.contract}"] = f"wrong: failed its check against one process ({r.result})"
    return out


# where each section's rows name the implementation a row times
NAMED_BY = {"flash_attention": "provider", "attention": "impl", "ladder": "name", "distributed": "variant"}


def wrong_everywhere(frames: dict) -> dict:
    """The sections' rows with every row of a contender that failed a check turned into a `wrong`
    row (no time, the reason as its message): a wrong implementation is never shown as fast."""
    bad = wrong(frames.get("contenders", pd.DataFrame()))
    if not bad:
        return frames
    out = dict(frames)
    for section, column in NAMED_BY.items():
        df = frames.get(section)
        if df is None or df.empty or column not in df:
            continue
        hit = df[column].isin(list(bad))
        if hit.any():
            df = df.copy()
            df.loc[hit, "message"] = df.loc[hit, column].map(bad)
            df.loc[hit, "status"] = "wrong"
            for col in ("median", "mean", "q20", "q80", "min", "max"):
                if col in df:
                    df.loc[hit, col] = float("nan")
            out[section] = df
    return out


def agreement(fa: pd.DataFrame, provider: str, host_bound_pct: float = math.inf) -> dict | None:
    """A contender provider's FlashAttention bench rows against ours of its kind (OURS_OF_KIND),
    case by case and metric by metric, judged by lmperf.compare as a rerun of ours would be:
    {"ours", "agree": timing rows within noise, "rows": timing rows judged (not host-bound),
    "host": host-bound rows apart, "largest": the largest difference, "threshold"}; None where
    the two share no timed case."""
    from lmperf import compare
    kind = provider.rsplit("_", 1)[-1]
    ours = OURS_OF_KIND.get(kind)
    if ours is None or fa.empty or "provider" not in fa:
        return None
    bench = fa[fa["study"] == "bench"]
    mine = bench[bench["provider"] == provider].copy()
    theirs = bench[bench["provider"] == ours].copy()
    if mine.empty or theirs.empty:
        return None
    mine["case_id"] = mine["case_id"].str.replace(f"-{provider}-", f"-{ours}-", regex=False)
    mine = mine[mine["case_id"].isin(set(theirs["case_id"]))]
    result = compare.compare(theirs.drop(columns=["gpu"], errors="ignore"), mine.drop(columns=["gpu"], errors="ignore"),
                             host_bound_pct=host_bound_pct)
    rows = result["rows"]
    timing = rows[rows["kind"].isin(["time", "rate"]) & rows["verdict"].ne("n/a")]
    gpu = timing[~timing["host_bound"]]
    if gpu.empty and timing.empty:
        return None
    worst = gpu.assign(off=(gpu["ratio"].astype(float) - 1).abs()).sort_values("off").tail(1)
    largest = (f"`{worst['case_id'].iloc[0].replace(f'-{ours}-', f'-{provider}-')}` {worst['metric'].iloc[0]} contender/ours "
               f"{fmt(float(worst['ratio'].iloc[0]))}") if len(worst) else ""
    return {"ours": ours, "agree": int((gpu["verdict"] == stats.SAME).sum()), "rows": len(gpu),
            "host": len(timing) - len(gpu), "largest": largest, "threshold": f"{100 * result['threshold']:g}%"}


def view(inputs) -> dict:
    rows = inputs.frames.get("contenders", pd.DataFrame())
    table = checks(rows)
    fa = inputs.frames.get("flash_attention", pd.DataFrame())
    idle = inputs.bars.get("host_bound_idle_pct", math.inf)
    times = timings(fa, table, idle)
    agree = {p: a for p in (table["provider"] if not table.empty else [])
             if (a := agreement(fa, p, idle)) is not None}
    return {"available": not table.empty or not rows.empty, "summary": summary_rows(table, times),
            "table": table.drop(
                columns=[c for c in table.columns if c.startswith("_")]) if not table.empty else table,
            "distributed": distributed(rows), "timings": times, "agreement": agree,
            "names": sorted(table["contender"].unique()) if not table.empty else [],
            "n_wrong": int((table["result"] == "WRONG").sum()) if not table.empty else 0}


def summary_rows(table: pd.DataFrame, times: pd.DataFrame) -> list[dict]:
    """One row per contender implementation for the report's summary: correct / compiles /
    deterministic, and its time on the headline shape with its ratio to ours and to the best peer
    (none where it was not timed, "wrong" where it failed a check)."""
    out = []
    for r in (table.itertuples() if not table.empty else ()):
        if r.result == "not implemented":
            continue
        rows = times[(times["contender"] == r.provider)] if not times.empty else times
        # the headline where it was timed, else the first timed shape, else the headline untimed
        timed = rows[rows["ms"].notna()] if not rows.empty else rows
        pool = timed if not timed.empty else rows
        head = pool[pool["group"] == "headline"] if not pool.empty else pool
        row = (head if not head.empty else pool).iloc[0] if not pool.empty else None
        t = row.astype(object).where(row.notna(), None).to_dict() if row is not None else {}  # NaN: none
        out.append({"provider": r.provider, "result": r.result, "compiles": r.compiles,
                    "deterministic": r.deterministic, "fresh": r.fresh,
                    "where": f"{t['group']}: {t['shape']}, {t['dtype']}" if t else "",
                    "ms": t.get("ms"), "vs_ours": t.get("vs ours"), "vs_peer": t.get("vs best peer"),
                    "timing": t.get("timing", "")})
    return out


def pages(view: dict, out_dir: Path, template, training: pd.DataFrame | None = None) -> list[Path]:
    """report/contenders/<name>.md for each contender: its checks, properties, distributed
    adapters and timings, and, where the ladder ran its rungs, its attention in a training step
    beside ours (`training`: the memory section's `contender_rungs`), rendered through `template`
    (templates/contender_page.md.j2)."""
    training = training if training is not None else pd.DataFrame()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in view["names"]:
        mine = lambda df: df[df["contender"] == name] if not df.empty else df
        timed = view["timings"]
        timed = timed[timed["contender"].str.startswith(f"{name}_")] if not timed.empty else timed
        page = template.render(name=name, table=mine(view["table"]), distributed=mine(view["distributed"]),
                               timings=timed,
                               training=training[training["contender"].str.startswith(f"{name}_")]
                               if not training.empty else training,
                               agreement={p: a for p, a in view.get("agreement", {}).items()
                                                         if p.startswith(f"{name}_")})
        path = out_dir / f"{name}.md"
        path.write_text(page)
        written.append(path)
    return written
