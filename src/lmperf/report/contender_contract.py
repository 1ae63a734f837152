"""The course's contract and lmperf's wider one, judged from a contender attention's check rows
(results/<hw>/contenders/, bench/contenders.py): its verdict (`verdicts`), every failed check with
its smallest failing shape, and the shape class of a timed row (`NAMED_BY`), by which
report/contenders.py decides which of its times may be shown.

- "correct" means the course's contract (CS336 assignment 2): its shapes (power-of-two head dims of
  at least 16, N a multiple of the tile), one saved L of shape (batch, N) in any float dtype, and
  its tolerance (rtol = atol = 1e-2) on the values it gives in each timed dtype. Wrong there, or
  caught returning a cached (stale) result, a contender is wrong in every table. What the course
  lets a student leave out fails its shape class alone (`course_scope`): the PyTorch version is
  the course's at fp32 and not causal only (its tests; the handout: "You can ignore the is_causal
  flag for this task"), and a dtype other than the course tests' fp32 in which the code raises
  instead of giving values is not the course's either.
- lmperf's wider contract is reported as properties, each failure named with its smallest shape:
  awkward N, head dims 8 to 256, fp16, an fp32 L, flash-attention's tighter tolerance,
  grouped-query, torch.compile, bitwise determinism, a fresh output.
- A shape class is (head dim, dtype, causal, N a multiple of the tile or not): a course-correct
  contender's timed row is shown where its class passed its float64 check (a grouped-query row
  also needs the grouped-query property), `wrong` where it failed, `unchecked` where none ran.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

# lmperf's wider contract: each a property of a contender's attention, in the order shown
PROPERTIES = ("awkward_n", "head_dim", "dtype", "causal", "timed_dtype", "fp32_lse", "tight_tolerance", "gqa", "compiles",
              "deterministic", "fresh")
# Properties of what the course lets a student leave out (`course_scope`): shown only where checked
SCOPE = ("causal", "timed_dtype")
COURSE_TEST_DTYPE = "fp32"  # the dtype of the course's test_attention.py inputs
RAISED = ("failed", "crashed", "timeout", "oom")  # a case that ended with no values
PROPERTY_CASES = ("gqa", "compiles", "deterministic", "fresh")  # checked by a case each (bench/contenders.py)
OUTSIDE = ("awkward_n", "head_dim", "dtype", "causal", "timed_dtype")  # why a values case lies outside the course
LABELS = {"course": "the course's contract", "awkward_n": "awkward N", "head_dim": "head dims 8 to 256",
          "dtype": "fp16", "causal": "causal (PyTorch version)", "timed_dtype": "timed dtypes beyond fp32",
          "fp32_lse": "fp32 L", "tight_tolerance": "flash-attention's tolerance",
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
    "causal": "the handout lets the PyTorch version ignore is_causal, so its causal rows are not shown; to have them, "
              "mask the scores where the key comes after the query (S = -inf, or -1e6 as the course's reference)",
    "timed_dtype": "where it raises, usually a product of the input's dtype with an fp32 tensor (an accumulator, L or "
                   "a scale made fp32 and not cast back); where its values are off, P or dS rounded to the input's "
                   "dtype before their products: cast before each matmul, accumulate in fp32",
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
LEGACY = " (an older check: lmperf's rule at every shape)"  # said of rows of a run before the course's tiers
NOT_RUN = ("skipped", "unsupported")


def _truth(s: pd.Series) -> pd.Series:
    return s.astype(str).str.lower().isin(["true", "1", "1.0"])


def text_of(value) -> str:
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
    classes: then every class passes unless the course's verdict is WRONG); `by_dtype`: the same
    judgement in each dtype that was checked (`_by_dtype`)."""
    contender: str
    provider: str
    course: str
    course_checks: tuple[int, int]  # (passed, run) of the course's cases
    failures: list[dict] = field(default_factory=list)
    properties: dict = field(default_factory=dict)
    passed: set | None = None
    failed: dict = field(default_factory=dict)
    tile: int = 128
    by_dtype: list[dict] = field(default_factory=list)

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
        shape = text_of(first["shape"])
        dims = [int(x) for x in shape.split("x")] if shape else [0, 0]
        line = {"case_id": case_id, "status": status, "tier": text_of(first.get("tier")) or "wider",
                "outside": [o for o in text_of(first.get("outside")).split(",") if o],
                "shape": shape, "dtype": str(first["dtype"]), "causal": first["causal"], "numel": math.prod(dims),
                "lse_dtype": text_of(first.get("lse_dtype")), "ok": None, "tight": None, "detail": "",
                "error": None, "ratio": None, "tight_detail": "", "tight_error": None, "tight_ratio": None,
                "tight_tolerance": None}
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
                line.update(tight_error=float(t["median"]), tight_ratio=float(t["r"]),
                            tight_tolerance=float(t["tolerance"]))
        elif status in BAD:
            line.update(ok=False, detail=f"{status}: {text_of(first['message'])[:300]}")
        out.append(line)
    return pd.DataFrame(out)


COURSE_TOLERANCE = "rtol = atol = 1e-2"  # the course test's (torch.testing.assert_close)


def course_scope(cases: pd.DataFrame, kind: str) -> None:
    """Course cases that the course lets a student leave out move to lmperf's wider contract, with
    the reason as their `outside`: the PyTorch version's cases in a dtype other than fp32 or causal
    (the course tests it at fp32, not causal, alone; the handout: "You can ignore the is_causal
    flag for this task"), where the check ran that case of the course's own (a check narrowed to
    others judges the version there, as a Triton kernel's); and any case in a dtype other than
    fp32 that raised instead of giving values. A Triton kernel's wrong value in a timed dtype stays
    the course's: the course times it in bf16."""
    if cases.empty:
        return
    course = cases["tier"] == "course"
    causal = cases["causal"].astype(str).str.lower().isin(["true", "1", "1.0"])
    other_dtype = cases["dtype"] != COURSE_TEST_DTYPE
    pytorch = kind == "pytorch" and (course & ~causal & ~other_dtype).any()
    for i in cases.index[course]:
        if other_dtype[i] and (pytorch or cases.at[i, "status"] in RAISED):  # a dtype's failure, whatever the mask
            cases.at[i, "outside"], cases.at[i, "tier"] = ["timed_dtype"], "wider"
        elif pytorch and causal[i]:
            cases.at[i, "outside"], cases.at[i, "tier"] = ["causal"], "wider"


def _explained(cases: pd.DataFrame) -> None:
    """Failures that one cause explains are that cause's alone, so that awkward N or a head dim is
    judged where the code runs: where every case of a dtype other than fp32 raised (a kernel that
    takes no bf16 or fp16 inputs), the dtype's (fp16's property, or `timed_dtype` for a course
    dtype); where a causal case of the course's shapes failed outside the course (the PyTorch
    version, which may ignore is_causal), every causal case's."""
    if cases.empty:
        return

    def blame(index, reason: str) -> None:
        for i in index:
            cases.at[i, "outside"] = [reason]
        cases.loc[index, "tier"] = "wider"

    for dtype, c in cases.groupby("dtype"):
        if dtype != COURSE_TEST_DTYPE and c["status"].isin(RAISED).all():
            blame(c.index, "dtype" if dtype == "fp16" else "timed_dtype")
    causal = cases["causal"].astype(str).str.lower().isin(["true", "1", "1.0"])
    unmasked = cases["outside"].map(lambda o: o == ["causal"]) & (cases["ok"] == False)  # noqa: E712
    if unmasked.any():
        blamed_on_dtype = cases["outside"].map(lambda o: o in (["dtype"], ["timed_dtype"])) & cases["status"].isin(RAISED)
        blame(cases.index[causal & ~blamed_on_dtype], "causal")  # a raise in a dtype says nothing of the mask


def _failure(check: str, failing: pd.DataFrame, course: bool, tight: bool = False) -> dict:
    """A failed check's line: its smallest failing case (among those that fail for this reason
    alone where there are such), how many cases failed, its error (the largest max abs error of
    its quantities), the tolerance it is judged by (the course's rtol = atol = 1e-2, or with
    `tight` flash-attention's: twice plain PyTorch's error in the same dtype) and the error
    against it (None where the case ended with no values: a compile error, a crash)."""
    alone = failing[failing["outside"].map(lambda o: o == [check])] if check in OUTSIDE else failing
    pick = (alone if len(alone) else failing).sort_values("numel").iloc[0]
    number = lambda x: None if x is None or pd.isna(x) else float(x)  # noqa: E731
    prefix = "tight_" if tight else ""
    return {"check": check, "label": LABELS[check], "course": course, "cases": len(failing),
            "shape": f"{pick['shape']} {pick['dtype']} {'causal' if str(pick['causal']).lower() == 'true' else 'not causal'}",
            "case_id": pick["case_id"], "detail": pick[f"{prefix}detail"], "error": number(pick[f"{prefix}error"]),
            "ratio": number(pick[f"{prefix}ratio"]),
            "tolerance": number(pick["tight_tolerance"]) if tight else COURSE_TOLERANCE, "cause": CAUSES[check]}


def _property_case(g: pd.DataFrame, prop: str) -> tuple[str, dict | None]:
    """A property case's answer ("yes", "no", "not checked" or a status) and its failure line."""
    p = g[g["check"] == prop]
    if p.empty:
        return "not checked", None
    r = p.iloc[0]
    status, message = str(r["status"]), text_of(r["message"])
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
                    "ratio": None, "tolerance": None, "cause": CAUSES[prop]}


def _by_dtype(cases: pd.DataFrame, g: pd.DataFrame, legacy: bool, judged: set) -> list[dict]:
    """The course's contract and the properties in each dtype checked, one dict a dtype:
    {"dtype", "course": "correct" | "WRONG" | "not checked", "passed", "run" (the course's cases),
    "worst_ratio" (the largest error against the course's tolerance at its shapes, None where
    none was measured), "failed": [every property that failed in this dtype, by its check name; a
    property case's only where the verdict holds it failed (`judged`: the checks of its failures)]}.
    An older run's rows (no tiers) count every case as the course's, as its rule did."""
    props = g[g["check"].isin(PROPERTY_CASES)]
    dtypes = list(dict.fromkeys([*(cases["dtype"] if len(cases) else []), *props["dtype"].astype(str)]))
    out = []
    for dtype in dtypes:
        mine = cases[cases["dtype"] == dtype] if len(cases) else cases
        ran = mine[mine["ok"].notna()] if len(mine) else mine
        course = ran if legacy else ran[ran["tier"] == "course"] if len(ran) else ran
        passed = int((course["ok"] == True).sum()) if len(course) else 0  # noqa: E712
        ratios = pd.to_numeric(course["ratio"], errors="coerce").dropna() if len(course) else pd.Series(dtype=float)
        failed = []
        if not legacy and len(ran):
            failed += [p for p in OUTSIDE if ((ran["tier"] != "course") & (ran["ok"] == False)  # noqa: E712
                                              & ran["outside"].map(lambda o, p=p: p in o)).any()]
        ok = mine[mine["status"] == "ok"] if len(mine) else mine
        if len(ok) and ((ok["lse_dtype"].astype(bool)) & (ok["lse_dtype"] != "float32")).any():
            failed.append("fp32_lse")
        if len(ok) and ((ok["tight"] == False) & (ok["ok"] == True)).any():  # noqa: E712
            failed.append("tight_tolerance")
        failed += [p for p in PROPERTY_CASES  # those the verdict holds failed (`judged`), in this dtype
                   if p in judged and _property_case(props[props["dtype"].astype(str) == dtype], p)[1]]
        out.append({"dtype": dtype, "passed": passed, "run": len(course),
                    "course": "not checked" if course.empty else "correct" if passed == len(course) else "WRONG",
                    "worst_ratio": float(ratios.max()) if len(ratios) else None, "failed": failed})
    return out


def _raised_at_awkward_n(g: pd.DataFrame, prop: str) -> bool:
    """Whether property `prop`'s case raised at an N that is not a multiple of the tile."""
    r = g[g["check"] == prop].iloc[0]
    shape = text_of(r["shape"])
    tile = int(r["tile"]) if "tile" in g and pd.notna(r.get("tile")) else 128
    return str(r["status"]) in RAISED and bool(shape) and int(shape.split("x")[-2]) % tile != 0


def verdict(g: pd.DataFrame) -> Verdict:
    """One contender provider's verdict from its attention rows (bench/contenders.py)."""
    provider, contender = str(g["provider"].iloc[0]), str(g["contender"].iloc[0])
    skipped = g[g["status"].isin(NOT_RUN)]
    if len(skipped) == len(g) and skipped["message"].astype(str).str.startswith("not implemented").all():
        return Verdict(contender, provider, "not implemented", (0, 0),
                       failures=[], properties={p: "not implemented" for p in PROPERTIES}, passed=set())
    cases = _cases(g)
    legacy = "tier" not in g or g["tier"].isna().all()  # an older run: no tiers, no shape classes
    if not legacy:
        course_scope(cases, text_of(g["kind"].iloc[0]) if "kind" in g else "")
        _explained(cases)
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
        f.update(error=None, ratio=None, tolerance=None)  # its dtype is what fails, not an error
        failures.append(f)
    # within the course's tolerance, not within flash-attention's (a case beyond both failed above)
    loose = ok[(ok["tight"] == False) & (ok["ok"] == True)] if len(ok) else ok  # noqa: E712
    properties["tight_tolerance"] = "not checked" if ok.empty else "no" if len(loose) else "yes"
    if len(loose):
        failures.append(_failure("tight_tolerance", loose, False, tight=True))
    for prop in PROPERTY_CASES:
        properties[prop], failure = _property_case(g, prop)
        if failure is not None and not len(failing) and properties.get("awkward_n") == "no" \
                and _raised_at_awkward_n(g, prop):
            # right at the course's shapes, awkward N explains it (listed above): the property was never reached
            properties[prop], failure = "not checked (awkward N)", None
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
                   failures, properties, None if legacy else passed, failed, tile, _by_dtype(cases, g, legacy, {f["check"] for f in failures}))


def verdicts(rows: pd.DataFrame) -> dict[str, Verdict]:
    """{provider: Verdict} for every contender attention in the contenders' rows."""
    if rows.empty or "study" not in rows:
        return {}
    att = rows[rows["study"] == "attention"]
    return {str(p): verdict(g) for p, g in att.groupby("provider", sort=False)}


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


def grouped(r) -> bool:
    kv, heads = _number(r, "kv_heads"), _number(r, "heads")
    return kv is not None and heads is not None and kv < heads
