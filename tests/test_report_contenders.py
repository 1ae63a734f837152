"""The report on a user's contenders, from the data its sections and pages show: the correctness
section judges a contender by the course's contract first, lmperf's wider contract as properties
(report/correctness.py); a contender's page gives its verdict, its speed at the headline and the
assignment's benchmark shapes, then each failure with its smallest shape, error, tolerance and
usual cause (report/contenders.py: `page_view`).

Read from the fixtures' committed check (tests/fixtures/contenders_contract/, contenders of the
project's own that behave like student code): an L saved in bf16, a kernel right only at the
handout's shapes, one without the 1/sqrt(d) scale, one that caches.
"""
from pathlib import Path

import pandas as pd
import pytest

from lmperf.report import contender_contract, contenders as report, correctness, render
from lmperf.report.sections import Inputs

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "tests" / "fixtures" / "contenders_contract" / "results" / "cpu"


@pytest.fixture(scope="module")
def frames():
    return {"contenders": render.load_section(RESULTS, "contenders"),
            "flash_attention": render.load_section(RESULTS, "flash_attention")}


def _inputs(frames) -> Inputs:
    return Inputs(results=RESULTS, frames=frames, bars={}, out_dir=RESULTS, scale="smoke")


# ---------------------------------------------------------------------------------------------
# The correctness section


@pytest.fixture(scope="module")
def checks(frames) -> pd.DataFrame:
    return correctness.contender_checks(_inputs(frames)).set_index(["contender", "dtype"])


def test_an_L_in_bf16_is_correct_in_the_correctness_section_its_L_a_property(frames, checks):
    rows = frames["contenders"]
    lse = rows[(rows["provider"] == "bf16_lse_pytorch") & (rows["metric"] == "lse_max_abs_err")]
    assert not lse["passed"].astype(bool).all()  # beyond flash-attention's tolerance: the old rule's FAIL
    for dtype in ("fp32", "bf16"):
        line = checks.loc[("bf16_lse_pytorch", dtype)]
        assert line["course's contract"] == "correct" and line["implementation's verdict"] == "correct"
        assert line["course checks passed"] == "1/1" and line["worst error / course tolerance"] <= 1
        assert set(line["properties failed"].split(", ")) == {"fp32 L", "flash-attention's tolerance"}


def test_a_kernel_right_at_the_handouts_shapes_is_correct_its_wider_failures_named_by_dtype(checks):
    fp32, bf16 = checks.loc[("narrow_pytorch", "fp32")], checks.loc[("narrow_pytorch", "bf16")]
    assert fp32["course's contract"] == bf16["course's contract"] == "correct"
    assert fp32["implementation's verdict"] == "correct"
    # its wider cases ran in fp32 alone: the failures are that dtype's
    assert set(fp32["properties failed"].split(", ")) == {"awkward N", "head dims 8 to 256"}
    assert bf16["properties failed"] == "none"


def test_a_contender_wrong_on_the_course_is_wrong_in_every_dtype_with_its_error(checks):
    for dtype in ("fp32", "bf16"):
        line = checks.loc[("no_scale_pytorch", dtype)]
        assert line["course's contract"] == "WRONG" and line["course checks passed"] == "0/1"
        assert line["worst error / course tolerance"] > 100  # no 1/sqrt(d): far beyond rtol = atol = 1e-2
        assert line["implementation's verdict"] == "WRONG"


def test_a_caching_contender_is_wrong_though_its_values_pass(checks):
    """Its values pass at every course shape; the property that catches a cache makes it wrong."""
    fp32 = checks.loc[("caching_pytorch", "fp32")]
    assert fp32["course's contract"] == "correct" and fp32["implementation's verdict"] == "WRONG"
    assert "fresh output" in fp32["properties failed"].split(", ")
    assert fp32["why"].startswith(contender_contract.LABELS["fresh"])


def test_each_dtype_is_judged_from_its_own_cases(frames):
    """by_dtype: one entry per dtype checked, counts of the course's cases in that dtype alone."""
    v = report.verdicts(frames["contenders"])["no_scale_pytorch"]
    assert [d["dtype"] for d in v.by_dtype] == ["fp32", "bf16"]
    assert sum(d["run"] for d in v.by_dtype) == v.course_checks[1]
    assert sum(d["passed"] for d in v.by_dtype) == v.course_checks[0]


def test_no_contender_no_lines(frames):
    assert correctness.contender_checks(_inputs({"contenders": pd.DataFrame()})).empty


# ---------------------------------------------------------------------------------------------
# A contender's page


def test_each_failure_has_its_smallest_shape_its_error_against_the_tolerance_and_its_cause(frames):
    failed = {(f["provider"], f["check"]): f for f in report.failures_table(
        report.verdicts(frames["contenders"])).to_dict("records")}
    awkward = failed[("narrow_pytorch", "awkward N")]
    assert awkward["smallest failing shape"].startswith("2x100x16")
    assert awkward["tolerance"] == contender_contract.COURSE_TOLERANCE
    assert awkward["error"] > 0 and awkward["error / tolerance"] > 1
    assert awkward["usual cause"] == contender_contract.CAUSES["awkward_n"]
    head = failed[("narrow_pytorch", "head dims 8 to 256")]  # a compile error: no values, its message
    assert pd.isna(head["error"]) and "CompilationError" in head["what failed"]
    assert head["usual cause"] == contender_contract.CAUSES["head_dim"]
    tight = failed[("bf16_lse_pytorch", "flash-attention's tolerance")]  # judged by that tolerance, not 1e-2
    assert isinstance(tight["tolerance"], float) and tight["tolerance"] < 1e-3
    assert tight["error / tolerance"] == pytest.approx(tight["error"] / tight["tolerance"])
    assert tight["error / tolerance"] > 1
    course = failed[("no_scale_pytorch", "the course's contract")]
    assert course["tier"] == "the course's contract" and course["error / tolerance"] > 100
    assert failed[("bf16_lse_pytorch", "fp32 L")]["usual cause"] == contender_contract.CAUSES["fp32_lse"]


def _with_groups(fa: pd.DataFrame) -> pd.DataFrame:
    """The fixture's bench rows (group `grid`) and the same rows again as the headline and as a
    model-size group: each group's rows on the page where it belongs."""
    d16 = fa[(fa["head_dim"] == 16) & (fa["seq_len"] == 256)]
    return pd.concat([fa, d16.assign(group="headline", seq_len=512), d16.assign(group="model", seq_len=1024)],
                     ignore_index=True)


def test_the_page_gives_the_headline_then_the_assignments_shapes_then_the_rest(frames):
    marked = report.wrong_everywhere({**frames, "flash_attention": _with_groups(frames["flash_attention"])})
    view = report.view(_inputs(marked))
    page = report.page_view(view, "narrow")
    assert [v["course"] for v in page["verdicts"]] == ["correct"]
    speed = page["speed"]
    assert speed["headline"]["shape"].tolist() == ["b1 h1 n512 d16"]
    headline = speed["headline"].iloc[0]
    assert headline["ms"] == pytest.approx(0.5)
    assert (headline["vs ours"], headline["vs sdpa_flash"], headline["vs sdpa_cudnn"]) == pytest.approx((2.0, 1.6, 1.8))
    assert set(speed["assignment"]["group"]) == {"grid"} and len(speed["assignment"]) == 4
    assert speed["assignment"].set_index("shape").loc["b1 h1 n256 d80", "ms"] == "wrong"
    assert speed["other"]["group"].tolist() == ["model"]
    assert sum(len(t) for t in speed.values()) == len(page["timings"])
    # a wrong contender's page: every time withheld, in every group
    wrong = report.page_view(view, "no_scale")["speed"]
    assert all((t["ms"] == "wrong").all() for t in wrong.values())


def test_a_page_with_nothing_timed_has_empty_groups(frames):
    view = report.view(_inputs({"contenders": frames["contenders"]}))
    speed = report.page_view(view, "narrow")["speed"]
    assert set(speed) == {"headline", "assignment", "other"} and all(t.empty for t in speed.values())


def test_an_older_runs_rows_are_judged_by_its_rule_and_say_so(frames):
    """Rows of a check that had no tiers (the course's contract came later): every case counts,
    judged by lmperf's rule, and the line says it is an older check."""
    old = frames["contenders"].drop(columns=["tier", "outside", "course_ratio", "course_passed"])
    lines = correctness.contender_checks(_inputs({"contenders": old})).set_index(["contender", "dtype"])
    narrow = lines.loc[("narrow_pytorch", "fp32")]
    assert narrow["course checks passed"] == "1/3" + contender_contract.LEGACY  # its awkward N and head dim 80 too
    assert narrow["course's contract"] == "WRONG" and narrow["implementation's verdict"] == "WRONG"


# ---------------------------------------------------------------------------------------------
# What the course lets a student leave out: rows as bench/contenders.py writes them


def _row(kind: str, dtype: str, causal: bool, shape: str, tier: str = "course", outside: str = "",
         ratio: float | None = 0.1, status: str = "ok", message: str = "") -> dict:
    """One values case of contender `mine` (one quantity: the output), `ratio` its error against
    the course's tolerance (and flash-attention's); None with a status other than ok."""
    n, d = (int(x) for x in shape.split("x")[-2:])
    return {"study": "attention", "contender": "mine", "kind": kind, "provider": f"mine_{kind}", "check": "values",
            "case_id": f"mine_{kind}-{dtype}-{'causal' if causal else 'full'}-{shape}", "dtype": dtype,
            "causal": causal, "shape": shape, "tier": tier, "outside": outside, "head_dim": d, "seq_len": n,
            "tile": 128, "aligned": n % 128 == 0, "metric": "out_max_abs_err" if status == "ok" else None,
            "median": None if ratio is None else ratio * 1e-2, "tolerance": 1e-2,
            "passed": None if ratio is None else ratio <= 1, "course_ratio": ratio,
            "course_passed": None if ratio is None else ratio <= 1, "lse_dtype": "float32" if status == "ok" else None,
            "status": status, "message": message}


def _verdict(rows: list[dict]):
    return report.verdicts(pd.DataFrame(rows))[f"mine_{rows[0]['kind']}"]


def _ignores_is_causal(kind: str) -> list[dict]:
    """Right without the mask, off by far with it, at the course's shapes and at an awkward N."""
    return [_row(kind, dtype, causal, "2x128x64", ratio=500.0 if causal else 0.1)
            for dtype in ("fp32", "bf16") for causal in (False, True)] + \
        [_row(kind, "fp32", causal, "2x100x64", "wider", "awkward_n", ratio=300.0 if causal else 0.2)
         for causal in (False, True)]


def test_a_pytorch_version_that_ignores_is_causal_is_course_correct_its_causal_rows_withheld():
    """The handout: "You can ignore the is_causal flag for this task" (the PyTorch version)."""
    v = _verdict(_ignores_is_causal("pytorch"))
    assert v.course == "correct" and v.course_checks == (1, 1)  # fp32, not causal: the course's own test
    assert v.properties["causal"] == "no" and v.properties["awkward_n"] == "yes"  # its awkward N is right unmasked
    assert [f["check"] for f in v.failures] == ["causal"]  # bf16 is right where it is not causal
    assert v.failures[0]["shape"] == "2x100x64 fp32 causal" and v.failures[0]["cases"] == 3
    assert v.row_verdict((64, "fp32", False, True)) is None
    assert v.row_verdict((64, "fp32", True, True))[0] == "wrong"
    assert v.row_verdict((64, "bf16", True, True))[0] == "wrong"


def test_a_triton_kernel_that_ignores_is_causal_is_wrong_everywhere():
    v = _verdict(_ignores_is_causal("triton"))
    assert v.course == "WRONG" and v.failures[0]["check"] == "course"
    assert v.row_verdict((64, "fp32", False, True))[0] == "wrong"


def test_a_kernel_that_raises_in_bf16_is_course_correct_its_bf16_rows_withheld():
    """The course's tests use fp32 inputs: a kernel that takes no bf16 fails bf16's shape classes,
    and its awkward N is judged in fp32, not blamed for the bf16 error."""
    error = "RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16"
    rows = [_row("triton", "fp32", True, "2x128x64"),
            _row("triton", "bf16", True, "2x128x64", ratio=None, status="failed", message=error),
            _row("triton", "fp32", True, "2x100x64", "wider", "awkward_n"),
            _row("triton", "bf16", True, "2x100x64", "wider", "awkward_n", ratio=None, status="failed", message=error)]
    v = _verdict(rows)
    assert v.course == "correct" and v.course_checks == (1, 1)
    assert v.properties["timed_dtype"] == "no" and v.properties["awkward_n"] == "yes"
    (failure,) = v.failures
    assert failure["check"] == "timed_dtype" and failure["cases"] == 2 and error in failure["detail"]
    assert failure["cause"] == contender_contract.CAUSES["timed_dtype"]
    assert v.row_verdict((64, "bf16", True, True))[0] == "wrong" and v.row_verdict((64, "fp32", True, True)) is None


@pytest.mark.parametrize("kind, course", [("pytorch", "correct"), ("triton", "WRONG")])
def test_values_off_in_bf16_are_the_courses_for_a_triton_kernel_alone(kind, course):
    """The course times its Triton kernel in bf16, and tests its PyTorch version at fp32 alone."""
    rows = [_row(kind, "fp32", False, "2x128x64"), _row(kind, "bf16", False, "2x128x64", ratio=1.07)]
    v = _verdict(rows)
    assert v.course == course
    assert v.row_verdict((64, "bf16", False, True))[0] == "wrong"


def test_a_check_without_the_courses_own_case_judges_a_pytorch_version_at_the_shapes_it_ran():
    """A check narrowed to causal cases (as the fixtures') has no case of the course's own test
    (fp32, not causal): the PyTorch version is judged at those, as a Triton kernel is."""
    v = _verdict([_row("pytorch", "fp32", True, "2x128x64", ratio=500.0)])
    assert v.course == "WRONG"


# ---------------------------------------------------------------------------------------------
# Distributed adapters, both handout years


def _dist(contender: str, contract: str, status: str = "ok", **extra) -> dict:
    message = f"not implemented: contender '{contender}' defines no get_{contract}" if status == "skipped" else ""
    return {"study": "distributed", "contender": contender, "contract": contract, "backend": "gloo",
            "status": status, "passed": True if status == "ok" else None, "median": 3e-8 if status == "ok" else None,
            "tolerance": 1e-5 if status == "ok" else None, "message": message, "bucket_size_mb": None,
            "compute_dtype": None, **extra}


def test_a_contender_is_shown_its_own_handout_years_adapters_each_case_named():
    rows = pd.DataFrame([
        _dist("old", "ddp", "skipped"), _dist("old", "ddp_individual_parameters"),
        *[_dist("old", "ddp_bucketed", bucket_size_mb=mb) for mb in (0.0001, 1.0)],
        *[_dist("old", "fsdp", "skipped", compute_dtype=d) for d in ("fp32", "fp16")],
        _dist("old", "sharded_optimizer", "skipped"),
        _dist("new", "ddp"), *[_dist("new", "ddp_bucketed", "skipped", bucket_size_mb=mb) for mb in (0.0001, 1.0)],
        _dist("new", "fsdp", compute_dtype="fp16"), _dist("new", "ddp_individual_parameters", "skipped")])
    assert report.handout_years(rows) == {"old": ["2025"], "new": ["2026"]}
    table = report.distributed(rows)
    old = table[table["contender"] == "old"]
    # the 2026 adapters it never had are left out; a contract it lacks of both years, once
    assert old["contract"].tolist() == ["ddp_individual_parameters", "ddp_bucketed", "ddp_bucketed",
                                        "sharded_optimizer"]
    assert old["case"].tolist()[1:3] == ["0.0001 MB buckets", "1 MB buckets"]
    assert old.iloc[-1]["result"] == "skipped"
    new = table[table["contender"] == "new"]
    assert new["contract"].tolist() == ["ddp", "fsdp"] and new.iloc[1]["case"] == "compute dtype fp16"
    assert (new["max weight difference"] < new["tolerance"]).all()


def test_a_contract_not_implemented_is_one_line_not_one_a_case():
    rows = pd.DataFrame([_dist("bare", "ddp_bucketed", "skipped", bucket_size_mb=mb) for mb in (0.0001, 0.003, 1.0)])
    assert report.handout_years(rows) == {"bare": []}
    assert report.distributed(rows)[["contract", "case", "result"]].values.tolist() == [["ddp_bucketed", "", "skipped"]]


def test_each_implementation_is_a_list_item_of_its_own_on_the_page(frames, tmp_path):
    """The page's verdicts: one markdown list item a line, one line an implementation (the
    renderer's whitespace rules once joined them into one)."""
    view = report.view(_inputs(report.wrong_everywhere(frames)))
    view = {**view, "names": ["two"],
            "verdicts": {f"two_{k}": contender_contract.Verdict("two", f"two_{k}", "correct", (1, 1))
                         for k in ("triton", "pytorch")}}
    (page,) = report.pages(view, tmp_path, render.environment(REPO / "templates").get_template("contender_page.md.j2"))
    items = [line for line in page.read_text().splitlines() if line.startswith("- **")]
    assert [line.split(":")[0] for line in items] == ["- **two_triton", "- **two_pytorch"]


def _property(kind: str, prop: str, shape: str, status: str, message: str = "") -> dict:
    return {"study": "attention", "contender": "mine", "kind": kind, "provider": f"mine_{kind}", "check": prop,
            "case_id": f"mine_{kind}-{prop}-{shape}", "dtype": "fp32", "causal": True, "shape": shape,
            "tier": "property", "outside": "", "tile": 128, "metric": prop if status == "ok" else None,
            "passed": True if status == "ok" else None, "status": status, "message": message}


@pytest.mark.parametrize("shape, shown", [("2x2x33x32", "not checked (awkward N)"), ("2x2x128x32", "failed")])
def test_a_property_case_that_raised_at_an_awkward_n_the_kernel_refuses_is_not_checked(shape, shown):
    """A kernel right at the course's shapes that takes no awkward N: its property cases at such an
    N never reach what they check (a cache, a graph break), so they say so, not "failed"."""
    error = "InterpreterError: ValueError('Shape element 0 must be a power of 2')"
    rows = [_row("triton", "fp32", True, "2x128x32"),
            _row("triton", "fp32", True, "2x33x32", "wider", "awkward_n", ratio=None, status="failed", message=error),
            _property("triton", "fresh", shape, "failed", error)]
    v = _verdict(rows)
    assert v.course == "correct" and v.properties["fresh"] == shown
    assert [f["check"] for f in v.failures] == (["awkward_n"] if shown.startswith("not") else ["awkward_n", "fresh"])
    assert ("fresh" in v.by_dtype[0]["failed"]) == (shown == "failed")  # the correctness section's line agrees


def test_a_page_whose_rows_have_no_time_says_why_once(frames):
    fa = frames["flash_attention"]
    mine = fa["provider"] == "narrow_pytorch"
    skipped = fa.assign(status=fa["status"].where(~mine, "skipped"), median=fa["median"].where(~mine),
                        message=fa["message"].astype(object).where(~mine, "needs CUDA"))
    page = report.page_view(report.view(_inputs({**frames, "flash_attention": skipped})), "narrow")
    assert not page["timed_any"] and page["untimed_why"] == ["not measured: needs CUDA"]
    timed = report.page_view(report.view(_inputs(report.wrong_everywhere(frames))), "narrow")
    assert timed["timed_any"]
