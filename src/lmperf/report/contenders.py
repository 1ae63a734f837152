"""Contenders: a user's implementations beside ours (lmperf.contenders). One summary row per
contender provider (its verdict on the course's contract, lmperf's wider properties, its time and
its ratio to ours and to the best peer), and each contender's page (`pages`).

Reads results/<hw>/contenders/ (bench/contenders.py: the float64 check and the properties; the
distributed adapters against one process) and the benchmarks' rows of contender providers (the
timings). Judged by the course's contract first (report/contender_contract.py: `verdicts`); a
contender's timed rows are shown only where `wrong_everywhere` leaves them: nowhere for one wrong
on the course's contract, else where their shape class passed its float64 check.

The pages are written by the renderer (lmperf.report.render) beside the report.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lmperf import providers, stats
from lmperf.report.contender_contract import (LABELS, LEGACY, NAMED_BY, PROPERTIES, SCOPE, Verdict, grouped,
                                              shape_class, text_of, verdicts)
from lmperf.report.format import HOST_BOUND, fmt

# The timing a provider is compared on, in order of preference: GPU time (CUDA graphs) where
# the case has it, else do_bench's; one method for a row's ratios (never mixed within a row).
TIMINGS = ("fwd_bwd_gpu_ms", "fwd_bwd_ms")
# Ours called as it is, and the peers a contender's page sets it beside (the peers of record),
# from the registry (lmperf.providers)
ours_name = providers.ours


def page_peers() -> list[str]:
    return [p.name for p in providers.of_record()]


# The FlashAttention benchmark's groups a contender's page shows first, in this order: the
# headline, then the assignment's own benchmark (CS336 assignment 2 times FlashAttention-2 at
# batch 1, causal, powers of two in N and D, bf16 and fp32: the `grid` group)
PAGE_GROUPS = {"headline": "headline", "assignment": "grid"}
# Ours of each kind of contender attention (lmperf.contenders.ATTENTION): what its rows are
# judged against, row by row, by lmperf.compare (`agreement`)
OURS_OF_KIND = {"triton": "triton", "pytorch": "torch_tiled"}


def checks(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per contender provider: its verdict on the course's contract, its properties and
    every failed check, named."""
    table = []
    for v in verdicts(rows).values():
        passed, run = v.course_checks
        line = {"contender": v.contender, "provider": v.provider,
                "course's contract": v.course,
                "course checks passed": (f"{passed}/{run}" + (LEGACY if v.passed is None else ""))
                if run else "none ran",
                "_passed": passed, "_checks": run, "_bad": len(v.failures)}
        for prop in PROPERTIES:
            line[LABELS[prop]] = v.properties.get(prop, "not checked")
        line["result"] = v.course
        line["why"] = v.why()
        table.append(line)
    table = pd.DataFrame(table)
    # what the course lets a student leave out: a column only where some implementation was checked on it
    unused = [LABELS[p] for p in SCOPE if not table.empty and table[LABELS[p]].isin(["not checked", "not implemented"]).all()]
    return table.drop(columns=unused)


# The handout year of each distributed contract (lmperf.contenders.CONTRACTS); the sharded
# optimizer is both years'
HANDOUT = {"ddp": "2026", "fsdp": "2026", "ddp_individual_parameters": "2025", "ddp_bucketed": "2025"}


def handout_years(rows: pd.DataFrame) -> dict[str, list[str]]:
    """{contender: the handout years whose distributed adapters it implements} (none: an empty list)."""
    if rows.empty or "contract" not in rows:
        return {}
    d = rows[rows["study"] == "distributed"]
    ran = ~d["status"].isin(["skipped", "unsupported"])
    return {str(c): sorted({HANDOUT[x] for x in g.loc[ran[g.index], "contract"] if x in HANDOUT})
            for c, g in d.groupby("contender", sort=False)}


def distributed(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per distributed check of each contender: its contract, the case (bucket size,
    compute dtype), the result against one process and the largest weight difference against its
    tolerance. A contender that implements one handout year's adapters is not shown the other
    year's as "not implemented", and a contract not implemented is one line, not one per case."""
    if rows.empty or "contract" not in rows:
        return pd.DataFrame()
    d = rows[rows["study"] == "distributed"]
    years = handout_years(rows)
    lines = []
    for r in d.to_dict("records"):
        message = text_of(r.get("message"))
        absent = r["status"] in ("skipped", "unsupported") and message.startswith("not implemented")
        mine = years.get(str(r["contender"]), [])
        if absent and len(mine) == 1 and HANDOUT.get(r["contract"], mine[0]) != mine[0]:
            continue  # the other handout year's adapter
        mb, dtype = r.get("bucket_size_mb"), text_of(r.get("compute_dtype"))
        case = "" if absent else f"{mb:g} MB buckets" if mb is not None and not pd.isna(mb) else \
            f"compute dtype {dtype}" if dtype else ""
        ok = r["status"] == "ok"
        lines.append({"contender": r["contender"], "contract": r["contract"], "case": case, "backend": r["backend"],
                      "result": ("correct" if str(r["passed"]).lower() == "true" else "WRONG") if ok else r["status"],
                      "max weight difference": r["median"] if ok else None,
                      "tolerance": r.get("tolerance") if ok else None, "why": "" if ok else message})
    out = pd.DataFrame(lines)
    return out.drop_duplicates(["contender", "contract", "case", "result", "why"]).reset_index(drop=True) \
        if not out.empty else out


def _time(g: pd.DataFrame, provider: str, metric: str, column: str = "median"):
    r = g[(g["provider"] == provider) & (g["metric"] == metric) & (g["status"] == "ok")]
    return float(r[column].iloc[0]) if len(r) and column in r and pd.notna(r[column].iloc[0]) else None


def timings(fa: pd.DataFrame, table: pd.DataFrame, idle: float = math.inf) -> pd.DataFrame:
    """Per FlashAttention bench case and contender provider: its time, ours, the best peer's,
    each peer of record's (`page_peers`), the ratios (one timing method a row), or 'wrong' /
    'unchecked' where the contender may not be shown (wrong on the course's contract, or its row's
    shape class failed or was not checked: `wrong_everywhere`, which the renderer applies first). A
    do_bench time whose GPU sat idle more than `idle` % (the contender's or ours) is the host's:
    marked, and no ratio is taken from it."""
    if fa.empty or table.empty or "provider" not in fa:
        return pd.DataFrame()
    bench = fa[fa["study"] == "bench"]
    result = dict(zip(table["provider"], table["result"]))
    me, record, ours_all = ours_name(), page_peers(), providers.names("attention", "ours")
    peers = [p for p in bench["provider"].unique() if p not in result and p not in ours_all]
    keys = ["group", "dtype", "causal", "batch", "heads", "kv_heads", "seq_len", "head_dim"]
    out = []
    for key, g in bench.groupby([k for k in keys if k in bench], sort=False, dropna=False):
        shape = dict(zip([k for k in keys if k in bench], key))
        for provider in [p for p in g["provider"].unique() if p in result]:
            metric = next((m for m in TIMINGS if _time(g, provider, m) is not None and _time(g, me, m) is not None),
                          None)
            line = {"contender": provider, "group": shape.get("group"),
                    "shape": " ".join(f"{k}{int(shape[c])}" for k, c in (("b", "batch"), ("h", "heads"),
                                                                             ("n", "seq_len"), ("d", "head_dim"))
                                      if c in shape and pd.notna(shape[c])),
                    "causal": shape.get("causal"), "dtype": shape.get("dtype")}
            mine_rows = g[g["provider"] == provider]
            hidden = mine_rows[mine_rows["status"].isin(["wrong", "unchecked"])]
            empty = {"vs ours": None, "vs best peer": None, **{f"vs {p}": None for p in record}}
            if result[provider] == "WRONG" or not hidden.empty:
                status = "wrong" if result[provider] == "WRONG" else str(hidden["status"].iloc[0])
                line.update({"ms": status, **{k: status for k in empty},
                             "timing": text_of(hidden["message"].iloc[0]) if len(hidden) else ""})
            elif metric is None:
                line.update({"ms": None, **empty,
                             "timing": f"not measured: {text_of(mine_rows['message'].iloc[0]) if len(mine_rows) else 'no row'}"})
            else:
                mine, ours = _time(g, provider, metric), _time(g, me, metric)
                best = min((t for p in peers if (t := _time(g, p, metric)) is not None), default=None)
                line.update({"ms": mine, "vs ours": ours / mine, "vs best peer": best / mine if best else None,
                             **{f"vs {p}": (t / mine if (t := _time(g, p, metric)) else None) for p in record},
                             "timing": "GPU time (CUDA graph)" if metric.endswith("gpu_ms") else "do_bench"})
                idles = {who: _time(g, p, metric, "gpu_idle_pct") for who, p in (("its", provider), ("ours", me))}
                if not metric.endswith("gpu_ms") and any(v is not None and v > idle for v in idles.values()):
                    line.update({**empty,
                                 "timing": f"do_bench, host-bound {HOST_BOUND}: the GPU idle "
                                           + ", ".join(f"{fmt(v)}% ({who})" for who, v in idles.items() if v is not None)})
            out.append(line)
    return pd.DataFrame(out)


def wrong(rows: pd.DataFrame) -> dict[str, str]:
    """{what a section's rows call it: why it is wrong everywhere} for every contender
    implementation wrong on the course's contract (its attention provider and its ladder rung,
    `contender_<provider>`) and every distributed variant (`<name>-<contract>`) that failed its
    check against one process."""
    out = {}
    for v in verdicts(rows).values():
        if v.course == "WRONG":
            out[v.provider] = out[f"contender_{v.provider}"] = f"wrong: fails {v.why_course()}"
    dist = distributed(rows)
    for r in (dist.itertuples() if not dist.empty else ()):
        if r.result == "WRONG" or r.result in ("wrong", "failed", "crashed", "timeout"):
            out[f"{r.contender}-{r.contract}"] = f"wrong: failed its check against one process ({r.result})"
    return out


def wrong_everywhere(frames: dict) -> dict:
    """The sections' rows with every row of a contender that may not be shown turned into a
    `wrong` (or `unchecked`) row, no time, the reason as its message: every row of an
    implementation wrong on the course's contract (and of a distributed variant that failed its
    check), and a course-correct contender's rows at shape classes that failed their float64
    check or were not checked. A wrong implementation is never shown as fast."""
    rows = frames.get("contenders", pd.DataFrame())
    judged = verdicts(rows)
    dist = {k: v for k, v in wrong(rows).items() if k not in judged and not k.startswith("contender_")}
    if not judged and not dist:
        return frames
    out = dict(frames)
    for section, (column, class_of) in NAMED_BY.items():
        df = frames.get(section)
        if df is None or df.empty or column not in df:
            continue
        names = df[column].astype(str)
        decided = {}
        for i, name in names.items():
            if section == "distributed":
                if name in dist:
                    decided[i] = ("wrong", dist[name])
                continue
            v = judged.get(name.removeprefix("contender_") if section == "ladder" else name)
            if v is None:
                continue
            r = df.loc[i]
            raw = class_of(r)
            cls = shape_class(raw[0], raw[1], raw[2], raw[3] % v.tile == 0) if raw is not None else None
            answer = v.row_verdict(cls, grouped=grouped(r))
            # a course-wrong contender's every row; a shape class's verdict on the rows with a time
            if answer is not None and (v.course == "WRONG" or str(r.get("status")) == "ok"):
                decided[i] = answer
        if decided:
            df = df.copy()
            # read as float64 where every cell was empty (pandas 3 refuses strings there)
            df["message"] = df["message"].astype(object) if "message" in df else None
            hit = list(decided)
            df.loc[hit, "status"] = [decided[i][0] for i in hit]
            df.loc[hit, "message"] = [decided[i][1] for i in hit]
            for col in ("median", "mean", "q20", "q80", "min", "max"):
                if col in df:
                    df[col] = pd.to_numeric(df[col], errors="coerce")
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
    # each row of the contender's under the id of ours at the same case (its fields, not its id: ours'
    # ids name a harness not their own, the model group's leaderboard, which a contender's need not)
    fields = [c for c in providers.ATTENTION_CASE_COLUMNS if c != "provider" and c in bench]
    ids = theirs.drop_duplicates(fields).set_index(fields)["case_id"]
    mine["case_id"] = ids.reindex(pd.MultiIndex.from_frame(mine[fields])).to_numpy()
    mine = mine[mine["case_id"].notna()]
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
    judged = verdicts(rows)
    table = checks(rows)
    fa = inputs.frames.get("flash_attention", pd.DataFrame())
    idle = inputs.bars.get("host_bound_idle_pct", math.inf)
    times = timings(fa, table, idle)
    agree = {p: a for p in (table["provider"] if not table.empty else [])
             if (a := agreement(fa, p, idle)) is not None}
    return {"available": not table.empty or not rows.empty, "summary": summary_rows(table, times, judged),
            "table": table.drop(
                columns=[c for c in table.columns if c.startswith("_")]) if not table.empty else table,
            "verdicts": judged, "failures": failures_table(judged),
            "distributed": distributed(rows), "handout": handout_years(rows), "timings": times, "agreement": agree,
            "names": sorted(table["contender"].unique()) if not table.empty else [],
            "n_wrong": int((table["result"] == "WRONG").sum()) if not table.empty else 0}


def failures_table(judged: dict[str, Verdict]) -> pd.DataFrame:
    """Every failed check of every contender attention, one line each: the check, its smallest
    failing shape, how many cases failed, the error against the tolerance, the usual cause."""
    lines = [{"contender": v.contender, "provider": v.provider, "check": f["label"],
              "tier": "the course's contract" if f["course"] else "property",
              "smallest failing shape": f["shape"], "cases failed": f["cases"], "error": f["error"],
              "tolerance": f["tolerance"], "error / tolerance": f["ratio"], "what failed": f["detail"],
              "usual cause": f["cause"], "case": f["case_id"]}
             for v in judged.values() for f in v.failures]
    return pd.DataFrame(lines)


def _is_time(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def summary_rows(table: pd.DataFrame, times: pd.DataFrame, judged: dict | None = None) -> list[dict]:
    """One row per contender implementation for the report's summary: its verdict on the
    course's contract (with the properties it fails, named), compiles / deterministic, and its
    time on the headline shape with its ratio to ours and to the best peer (none where it was not
    timed, "wrong" where it may not be shown)."""
    judged = judged or {}
    out = []
    for r in (table.to_dict("records") if not table.empty else ()):
        if r["result"] == "not implemented":
            continue
        rows = times[(times["contender"] == r["provider"])] if not times.empty else times
        # the headline where it was timed, else the first timed shape, else the headline untimed
        timed = rows[rows["ms"].map(_is_time)] if not rows.empty else rows
        pool = timed if not timed.empty else rows
        head = pool[pool["group"] == "headline"] if not pool.empty else pool
        row = (head if not head.empty else pool).iloc[0] if not pool.empty else None
        t = row.astype(object).where(row.notna(), None).to_dict() if row is not None else {}  # NaN: none
        v = judged.get(r["provider"])
        fails = [f["label"] for f in v.failures if not f["course"]] if v is not None else []
        result = (f"correct on the course's contract; fails {', '.join(fails)}" if r["result"] == "correct" and fails
                  else r["result"])
        out.append({"provider": r["provider"], "result": result, "compiles": r[LABELS["compiles"]],
                    "deterministic": r[LABELS["deterministic"]], "fresh": r[LABELS["fresh"]],
                    "where": f"{t['group']}: {t['shape']}, {t['dtype']}" if t else "",
                    "ms": t.get("ms"), "vs_ours": t.get("vs ours"), "vs_peer": t.get("vs best peer"),
                    "timing": t.get("timing", "")})
    return out


def page_view(view: dict, name: str, training: pd.DataFrame | None = None) -> dict:
    """What contender `name`'s page shows, in its order: the verdict of each of its attention
    implementations on the course's contract, its speed beside ours, SDPA-flash and cuDNN (`speed`:
    the headline, the assignment's benchmark shapes, then the other groups: PAGE_GROUPS), then
    each failed check with its smallest failing shape, its error against the tolerance and the
    usual cause; its training step and distributed adapters."""
    training = training if training is not None else pd.DataFrame()
    mine = lambda df: df[df["contender"] == name] if not df.empty else df
    timed = view["timings"]
    timed = timed[timed["contender"].str.startswith(f"{name}_")] if not timed.empty else timed
    if timed.empty:
        speed = {key: timed for key in (*PAGE_GROUPS, "other")}
    else:
        speed = {key: timed[timed["group"] == g] for key, g in PAGE_GROUPS.items()}
        speed["other"] = timed[~timed["group"].isin(list(PAGE_GROUPS.values()))]
    verdicts_ = [v for v in view.get("verdicts", {}).values() if v.contender == name]
    return {"name": name,
            "verdicts": [{"provider": v.provider, "course": v.course, "passed": v.course_checks[0],
                          "run": v.course_checks[1], "why": v.why_course() if v.course == "WRONG" else "",
                          "failed": [LABELS[f["check"]] for f in v.failures if not f["course"]]} for v in verdicts_],
            "table": mine(view["table"]), "failures": mine(view.get("failures", pd.DataFrame())),
            "distributed": mine(view["distributed"]), "timings": timed, "speed": speed,
            "handout": view.get("handout", {}).get(name, []),
            # whether any of its rows has a time; else the reasons none has (e.g. needs CUDA)
            "timed_any": bool(not timed.empty and timed["ms"].map(_is_time).any()),
            "untimed_why": sorted(set(timed["timing"].astype(str))) if not timed.empty else [],
            "training": training[training["contender"].str.startswith(f"{name}_")] if not training.empty else training,
            "agreement": {p: a for p, a in view.get("agreement", {}).items() if p.startswith(f"{name}_")}}


def pages(view: dict, out_dir: Path, template, training: pd.DataFrame | None = None) -> list[Path]:
    """report/contenders/<name>.md for each contender (`page_view`), rendered through `template`
    (templates/contender_page.md.j2); `training`: the memory section's `contender_rungs`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in view["names"]:
        path = out_dir / f"{name}.md"
        path.write_text(template.render(**page_view(view, name, training)))
        written.append(path)
    return written
