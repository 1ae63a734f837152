"""Contenders: a user's implementations beside ours (lmperf.contenders). One summary row per
contender provider (its verdict on the course's contract, lmperf's wider properties, its time and
its ratio to ours and to the best peer), and each contender's page (`pages`).

Reads results/<hw>/contenders/ (bench/contenders.py: the float64 check and the properties; the
distributed adapters against one process) and the benchmarks' rows of contender providers (the
timings). The rule (`verdicts`, applied by `wrong_everywhere`):

- "correct" means the course's contract (CS336 assignment 2): its shapes (power-of-two head dims of
  at least 16, N a multiple of the tile), one saved L of shape (batch, N) in any float dtype, and
  its tolerance (rtol = atol = 1e-2) in each timed dtype. A contender wrong there, or whose output
  is a cached (stale) result, is wrong in every table.
- lmperf's wider contract is reported as properties, each failure named with its smallest shape:
  awkward N, head dims 8 to 256, fp16, an fp32 L, flash-attention's tighter tolerance,
  grouped-query, torch.compile, bitwise determinism.
- A shape class is (head dim, dtype, causal, N a multiple of the tile or not). A course-correct
  contender's timed row is shown where its shape class passed its float64 check (a grouped-query
  row also needs the grouped-query property), `wrong` where it failed, `unchecked` where no check
  ran at it.

The pages are written by the renderer (lmperf.report.render) beside the report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lmperf import stats
from lmperf.report.format import HOST_BOUND, fmt

# lmperf's wider contract: each a property of a contender's attention, in the order shown
PROPERTIES = ("awkward_n", "head_dim", "dtype", "fp32_lse", "tight_tolerance", "gqa", "compiles", "deterministic",
              "fresh")
PROPERTY_CASES = ("gqa", "compiles", "deterministic", "fresh")  # checked by a case each (bench/contenders.py)
OUTSIDE = ("awkward_n", "head_dim", "dtype")  # why a values case lies outside the course (its `outside`)
LABELS = {"course": "the course's contract", "awkward_n": "awkward N", "head_dim": "head dims 8 to 256",
          "dtype": "fp16", "fp32_lse": "fp32 L", "tight_tolerance": "flash-attention's tolerance",
          "gqa": "grouped-query", "compiles": "compiles", "deterministic": "deterministic", "fresh": "fresh output"}
# What usually causes each failure (one line on a contender's page)
CAUSES = {
    "course": "usually the scale 1/sqrt(d) missing, a causal mask off by one, or a backward that does not match "
              "the forward (recompute P from the saved L)",
    "awkward_n": "usually loads and stores past N without a mask (tl.load without mask= or boundary_check), or a "
                 "tile loop that assumes N is a multiple of the tile",
    "head_dim": "usually a tile over D that is not a power of two (tl.arange and block shapes need powers of two: pad "
                "D to the next one and mask), or shared memory that a head dim of 256 overflows",
    "dtype": "usually products accumulated in the input's dtype instead of fp32, or a cast missing on the way out",
    "fp32_lse": "L kept in the input's dtype (an L in bf16 or fp16): the course accepts it; the backward then "
                "recomputes P from an L good to 2-3 digits",
    "tight_tolerance": "usually fp32 dots on TF32 tensor cores (tl.dot's default) or the softmax's rescaling in "
                       "low precision",
    "gqa": "K and V with fewer heads than Q are not taken (each K/V head serves H / H_kv query heads)",
    "compiles": "usually a graph break: .item(), Python branching on tensor values, or a Triton launch torch.compile "
                "cannot trace (torch.library.triton_op)",
    "deterministic": "usually atomic adds in the backward (dQ accumulated with tl.atomic_add) or reductions in "
                     "varying order",
    "fresh": "an output cached by its inputs' storage (data_ptr) or identity: stale once their contents change",
}
BAD = ("wrong", "failed", "timeout", "crashed", "oom")
NOT_RUN = ("skipped", "unsupported")
# The timing a provider is compared on, in order of preference: GPU time (CUDA graphs) where
# the case has it, else do_bench's; one method for a row's ratios (never mixed within a row).
TIMINGS = ("fwd_bwd_gpu_ms", "fwd_bwd_ms")
OURS = "triton"
# The peers a contender's page sets it beside, by name (lmperf.providers), with ours
PAGE_PEERS = ("sdpa_flash", "sdpa_cudnn")
# Ours of each kind of contender attention (lmperf.contenders.ATTENTION): what its rows are
# judged against, row by row, by lmperf.compare (`agreement`)
OURS_OF_KIND = {"triton": "triton", "pytorch": "torch_tiled"}


def _truth(s: pd.Series) -> pd.Series:
    return s.astype(str).str.lower().isin(["true", "1", "1.0"])


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


# ---------------------------------------------------------------------------------------------
# Verdicts: the course's contract, the properties, the shape classes


def shape_class(head_dim, dtype, causal, aligned) -> tuple:
    """(head dim, dtype, causal, N a multiple of the tile): what a check case and a timed row share."""
    return int(head_dim), str(dtype), str(causal).lower() in ("true", "1", "1.0"), bool(aligned)


def class_label(cls: tuple, tile: int) -> str:
    d, dtype, causal, aligned = cls
    return f"d{d} {dtype} {'causal' if causal else 'not causal'}, N {'a' if aligned else 'not a'} multiple of {tile}"


@dataclass
class Verdict:
    """One contender attention's judgement. `course`: "correct", "WRONG", "not checked" or "not
    implemented" (the course's contract); `failures`: every failed check, the course's first, one
    a check (the course's contract or a property), each with its smallest failing shape, its error
    against the tolerance and the usual cause; `properties`: {property: "yes" | "no" | "not
    checked" | a status}; `passed` / `failed`: the shape classes whose float64 checks all passed /
    the first failure of each that failed (None for rows of an older run, which had no shape
    classes: then every class passes unless the course's verdict is WRONG)."""
    contender: str
    provider: str
    course: str
    course_checks: tuple[int, int]  # (passed, run) of the course's cases
    failures: list[dict] = field(default_factory=list)
    properties: dict = field(default_factory=dict)
    passed: set | None = None
    failed: dict = field(default_factory=dict)
    tile: int = 128

    def row_verdict(self, cls: tuple | None, grouped: bool = False) -> tuple[str, str] | None:
        """(status, message) for a timed row of this contender at shape class `cls`, or None
        where it is shown as measured."""
        if self.course == "WRONG":
            return "wrong", f"wrong: fails {self.why_course()}"
        if self.passed is None or cls is None:  # an older run's rows, or a row whose class is unknown
            return None
        if grouped and self.properties.get("gqa") != "yes":
            return ("wrong" if self.properties.get("gqa") == "no" else "unchecked",
                    f"grouped-query: {self.properties.get('gqa', 'not checked')}")
        if cls in self.passed:
            return None
        if cls in self.failed:
            return "wrong", f"wrong at its shape class ({class_label(cls, self.tile)}): {self.failed[cls]}"
        return "unchecked", f"not shown: no float64 check of it ran at this shape class ({class_label(cls, self.tile)})"

    def why_course(self) -> str:
        bad = [f for f in self.failures if f["course"]]
        return "; ".join(f"{LABELS[f['check']]} ({f['shape']}: {f['detail']})" for f in bad) or "its check"

    def why(self) -> str:
        """Every failed check, named, with its smallest failing shape."""
        return "; ".join(f"{LABELS[f['check']]} at {f['shape']}" + (f" ({f['cases']} cases)" if f["cases"] > 1 else "")
                         for f in self.failures)


def _cases(g: pd.DataFrame) -> pd.DataFrame:
    """One line per values case of one provider: its status, tier, class and how it fared."""
    out = []
    for case_id, c in g[g["check"] == "values"].groupby("case_id", sort=False):
        first = c.iloc[0]
        status = str(first["status"])
        shape = _text(first["shape"])
        dims = [int(x) for x in shape.split("x")] if shape else [0, 0]
        line = {"case_id": case_id, "status": status, "tier": _text(first.get("tier")) or "wider",
                "outside": [o for o in _text(first.get("outside")).split(",") if o],
                "shape": shape, "dtype": str(first["dtype"]), "causal": first["causal"], "numel": math.prod(dims),
                "lse_dtype": _text(first.get("lse_dtype")), "ok": None, "tight": None, "detail": "",
                "error": None, "ratio": None, "tight_detail": ""}
        tile = int(first["tile"]) if "tile" in c and pd.notna(first.get("tile")) else 128
        aligned = _truth(pd.Series([first["aligned"]])).iloc[0] if "aligned" in c and pd.notna(first.get("aligned")) \
            else dims[-2] % tile == 0
        line["cls"] = shape_class(dims[-1], line["dtype"], line["causal"], aligned)
        line["tile"] = tile
        if status == "ok":
            ratio = pd.to_numeric(c["course_ratio"], errors="coerce") if "course_ratio" in c else \
                pd.Series(float("nan"), index=c.index)
            course_ok = _truth(c["course_passed"]) if "course_passed" in c else _truth(c["passed"])
            worst = c.loc[ratio.fillna(math.inf).idxmax()] if len(c) else first
            quantity = str(worst["metric"]).removesuffix("_max_abs_err")
            line.update(ok=bool(course_ok.all()), error=float(worst["median"]),
                        ratio=float(ratio.max()) if ratio.notna().any() else None)
            line["detail"] = (f"{quantity} off by up to {line['error']:.3g}, "
                              + (f"{line['ratio']:.3g}x the course's tolerance (rtol = atol = 1e-2)"
                                 if line["ratio"] is not None else "beyond the tolerance"))
            tight = _truth(c["passed"])
            line["tight"] = bool(tight.all())
            if not line["tight"]:
                t = c[~tight].assign(r=lambda d: pd.to_numeric(d["median"]) / pd.to_numeric(d["tolerance"]))
                t = t.loc[t["r"].idxmax()]
                line["tight_detail"] = (f"{str(t['metric']).removesuffix('_max_abs_err')} off by up to "
                                        f"{float(t['median']):.3g} > tolerance {float(t['tolerance']):.3g}")
        elif status in BAD:
            line.update(ok=False, detail=f"{status}: {_text(first['message'])[:300]}")
        out.append(line)
    return pd.DataFrame(out)


def _failure(check: str, failing: pd.DataFrame, course: bool, detail_col: str = "detail") -> dict:
    """A failed check's line: its smallest failing case (among those that fail for this reason
    alone where there are such), how many cases failed, the error against the tolerance."""
    alone = failing[failing["outside"].map(lambda o: o == [check])] if check in OUTSIDE else failing
    pick = (alone if len(alone) else failing).sort_values("numel").iloc[0]
    return {"check": check, "label": LABELS[check], "course": course, "cases": len(failing),
            "shape": f"{pick['shape']} {pick['dtype']} {'causal' if str(pick['causal']).lower() == 'true' else 'not causal'}",
            "case_id": pick["case_id"], "detail": pick[detail_col], "error": pick["error"], "ratio": pick["ratio"],
            "cause": CAUSES[check]}


def _property_case(g: pd.DataFrame, prop: str) -> tuple[str, dict | None]:
    """A property case's answer ("yes", "no", "not checked" or a status) and its failure line."""
    p = g[g["check"] == prop]
    if p.empty:
        return "not checked", None
    r = p.iloc[0]
    status, message = str(r["status"]), _text(r["message"])
    if status == "ok":
        holds = bool(_truth(p["passed"]).all())
        answer = "yes" if holds else "no"
    else:
        holds, answer = False, status if status not in ("skipped",) else "not checked"
    if holds or status == "skipped":
        return answer, None
    return answer, {"check": prop, "label": LABELS[prop], "course": prop == "fresh" and status == "wrong",
                    "cases": 1, "shape": f"{r['shape']} {r['dtype']}", "case_id": r["case_id"],
                    "detail": f"{status}: {message[:300]}" if status != "ok" else message, "error": None,
                    "ratio": None, "cause": CAUSES[prop]}


def verdict(g: pd.DataFrame) -> Verdict:
    """One contender provider's verdict from its attention rows (bench/contenders.py)."""
    provider, contender = str(g["provider"].iloc[0]), str(g["contender"].iloc[0])
    skipped = g[g["status"].isin(NOT_RUN)]
    if len(skipped) == len(g) and skipped["message"].astype(str).str.startswith("not implemented").all():
        return Verdict(contender, provider, "not implemented", (0, 0),
                       failures=[], properties={p: "not implemented" for p in PROPERTIES}, passed=set())
    cases = _cases(g)
    legacy = "tier" not in g or g["tier"].isna().all()  # an older run: no tiers, no shape classes
    failures, properties = [], {}
    course = cases[cases["tier"] == "course"] if not legacy else cases.iloc[0:0]
    if legacy:  # its rule: any failed check is wrong everywhere
        course = cases
    ran = course[course["ok"].notna()]
    failing = ran[ran["ok"] == False]  # noqa: E712 (a column of True, False and None)
    if len(failing):
        failures.append(_failure("course", failing, True))
    for prop in OUTSIDE:
        mine = cases[(cases["tier"] != "course") & cases["outside"].map(lambda o, p=prop: p in o)] if not legacy \
            else cases.iloc[0:0]
        run = mine[mine["ok"].notna()]
        bad = run[run["ok"] == False]  # noqa: E712
        properties[prop] = "not checked" if run.empty else "no" if len(bad) else "yes"
        if len(bad):
            failures.append(_failure(prop, bad, False))
    ok = cases[cases["status"] == "ok"]
    lse = ok[ok["lse_dtype"].astype(bool)] if len(ok) else ok
    not_fp32 = lse[lse["lse_dtype"] != "float32"] if len(lse) else lse
    properties["fp32_lse"] = "not checked" if lse.empty else "no" if len(not_fp32) else "yes"
    if len(not_fp32):
        f = _failure("fp32_lse", not_fp32.assign(detail=lambda d: "L saved in " + d["lse_dtype"]), False)
        failures.append(f)
    # within the course's tolerance, not within flash-attention's (a case beyond both failed above)
    loose = ok[(ok["tight"] == False) & (ok["ok"] == True)] if len(ok) else ok  # noqa: E712
    properties["tight_tolerance"] = "not checked" if ok.empty else "no" if len(loose) else "yes"
    if len(loose):
        failures.append(_failure("tight_tolerance", loose, False, "tight_detail"))
    for prop in PROPERTY_CASES:
        properties[prop], failure = _property_case(g, prop)
        if failure is not None:
            failures.append(failure)
    stale = any(f["course"] and f["check"] == "fresh" for f in failures)
    if legacy:
        bad_properties = any(f["check"] in PROPERTY_CASES and f["detail"].split(":")[0] in BAD for f in failures)
        stale = stale or bad_properties
    result = ("WRONG" if len(failing) or stale else "correct" if len(ran) else "not checked")
    failures.sort(key=lambda f: not f["course"])
    tile = int(cases["tile"].iloc[0]) if len(cases) else 128
    classes = {}
    for line in cases[cases["ok"].notna()].itertuples() if len(cases) else ():
        classes.setdefault(line.cls, []).append(line)
    passed = {c for c, lines in classes.items() if all(x.ok for x in lines)}
    failed = {c: next(x.detail for x in lines if not x.ok) for c, lines in classes.items() if c not in passed}
    return Verdict(contender, provider, result, (int((ran["ok"] == True).sum()), len(ran)),  # noqa: E712
                   failures, properties, None if legacy else passed, failed, tile)


def verdicts(rows: pd.DataFrame) -> dict[str, Verdict]:
    """{provider: Verdict} for every contender attention in the contenders' rows."""
    if rows.empty or "study" not in rows:
        return {}
    att = rows[rows["study"] == "attention"]
    return {str(p): verdict(g) for p, g in att.groupby("provider", sort=False)}


def checks(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per contender provider: its verdict on the course's contract, its properties and
    every failed check, named."""
    table = []
    for v in verdicts(rows).values():
        passed, run = v.course_checks
        line = {"contender": v.contender, "provider": v.provider,
                "course's contract": v.course,
                "course checks passed": (f"{passed}/{run}" + (" (an older check: lmperf's rule at every shape)"
                                                              if v.passed is None else "")) if run else "none ran",
                "_passed": passed, "_checks": run, "_bad": len(v.failures)}
        for prop in PROPERTIES:
            line[LABELS[prop]] = v.properties.get(prop, "not checked")
        line["result"] = v.course
        line["why"] = v.why()
        table.append(line)
    return pd.DataFrame(table)


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
    SDPA-flash's and cuDNN's (PAGE_PEERS), the ratios (one timing method a row), or 'wrong' /
    'unchecked' where the contender may not be shown (wrong on the course's contract, or its row's
    shape class failed or was not checked: `wrong_everywhere`, which the renderer applies first). A
    do_bench time whose GPU sat idle more than `idle` % (the contender's or ours) is the host's:
    marked, and no ratio is taken from it."""
    if fa.empty or table.empty or "provider" not in fa:
        return pd.DataFrame()
    bench = fa[fa["study"] == "bench"]
    result = dict(zip(table["provider"], table["result"]))
    peers = [p for p in bench["provider"].unique() if p not in result and p != OURS and p != "triton_compiled"]
    keys = ["group", "dtype", "causal", "batch", "heads", "kv_heads", "seq_len", "head_dim"]
    out = []
    for key, g in bench.groupby([k for k in keys if k in bench], sort=False, dropna=False):
        shape = dict(zip([k for k in keys if k in bench], key))
        for provider in [p for p in g["provider"].unique() if p in result]:
            metric = next((m for m in TIMINGS if _time(g, provider, m) is not None and _time(g, OURS, m) is not None),
                          None)
            line = {"contender": provider, "group": shape.get("group"),
                    "shape": " ".join(f"{k}{int(shape[c])}" for k, c in (("b", "batch"), ("h", "heads"),
                                                                             ("n", "seq_len"), ("d", "head_dim"))
                                      if c in shape and pd.notna(shape[c])),
                    "causal": shape.get("causal"), "dtype": shape.get("dtype")}
            mine_rows = g[g["provider"] == provider]
            hidden = mine_rows[mine_rows["status"].isin(["wrong", "unchecked"])]
            empty = {"vs ours": None, "vs best peer": None, **{f"vs {p}": None for p in PAGE_PEERS}}
            if result[provider] == "WRONG" or not hidden.empty:
                status = "wrong" if result[provider] == "WRONG" else str(hidden["status"].iloc[0])
                line.update({"ms": status, **{k: status for k in empty},
                             "timing": _text(hidden["message"].iloc[0]) if len(hidden) else ""})
            elif metric is None:
                line.update({"ms": None, **empty,
                             "timing": f"not measured: {_text(mine_rows['message'].iloc[0]) if len(mine_rows) else 'no row'}"})
            else:
                mine, ours = _time(g, provider, metric), _time(g, OURS, metric)
                best = min((t for p in peers if (t := _time(g, p, metric)) is not None), default=None)
                line.update({"ms": mine, "vs ours": ours / mine, "vs best peer": best / mine if best else None,
                             **{f"vs {p}": (t / mine if (t := _time(g, p, metric)) else None) for p in PAGE_PEERS},
                             "timing": "GPU time (CUDA graph)" if metric.endswith("gpu_ms") else "do_bench"})
                idles = {who: _time(g, p, metric, "gpu_idle_pct") for who, p in (("its", provider), ("ours", OURS))}
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


def _number(row, column):
    value = pd.to_numeric(pd.Series([row.get(column)]), errors="coerce").iloc[0]
    return None if pd.isna(value) else value


# Where each section's rows name the implementation a row times, and the shape class of a row:
# (head dim, dtype, causal, N) from its columns; None where they are not there.
def _fa_class(r):
    d, n = _number(r, "head_dim"), _number(r, "seq_len")
    return None if d is None or n is None else (int(d), str(r.get("dtype")), r.get("causal"), int(n))


def _attention_class(r):  # PyTorch attention's grid: fp32 (batch, N, D) inputs, not causal
    d, n = _number(r, "head_dim"), _number(r, "seq_len")
    return None if d is None or n is None else (int(d), "fp32", False, int(n))


def _ladder_class(r):  # a training step of the ladder's model: causal, its dtype, N its context
    d_model, heads, n = _number(r, "d_model"), _number(r, "n_heads"), _number(r, "context")
    if d_model is None or heads is None or n is None or pd.isna(r.get("dtype")):
        return None
    return int(d_model) // int(heads), str(r.get("dtype")), True, int(n)


NAMED_BY = {"flash_attention": ("provider", _fa_class), "attention": ("impl", _attention_class),
            "ladder": ("name", _ladder_class), "distributed": ("variant", None)}


def _grouped(r) -> bool:
    kv, heads = _number(r, "kv_heads"), _number(r, "heads")
    return kv is not None and heads is not None and kv < heads


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
            answer = v.row_verdict(cls, grouped=_grouped(r))
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
            "distributed": distributed(rows), "timings": times, "agreement": agree,
            "names": sorted(table["contender"].unique()) if not table.empty else [],
            "n_wrong": int((table["result"] == "WRONG").sum()) if not table.empty else 0}


def failures_table(judged: dict[str, Verdict]) -> pd.DataFrame:
    """Every failed check of every contender attention, one line each: the check, its smallest
    failing shape, how many cases failed, the error against the tolerance, the usual cause."""
    lines = [{"contender": v.contender, "provider": v.provider, "check": f["label"],
              "tier": "the course's contract" if f["course"] else "property",
              "smallest failing shape": f["shape"], "cases failed": f["cases"], "what failed": f["detail"],
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
    implementations on the course's contract, its speed beside ours, SDPA-flash and cuDNN, then
    each failed check with its smallest failing shape, its error against the tolerance and the
    usual cause; its training step and distributed adapters."""
    training = training if training is not None else pd.DataFrame()
    mine = lambda df: df[df["contender"] == name] if not df.empty else df
    timed = view["timings"]
    timed = timed[timed["contender"].str.startswith(f"{name}_")] if not timed.empty else timed
    verdicts_ = [v for v in view.get("verdicts", {}).values() if v.contender == name]
    return {"name": name,
            "verdicts": [{"provider": v.provider, "course": v.course, "passed": v.course_checks[0],
                          "run": v.course_checks[1], "why": v.why_course() if v.course == "WRONG" else "",
                          "failed": [LABELS[f["check"]] for f in v.failures if not f["course"]]} for v in verdicts_],
            "table": mine(view["table"]), "failures": mine(view.get("failures", pd.DataFrame())),
            "distributed": mine(view["distributed"]), "timings": timed,
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
