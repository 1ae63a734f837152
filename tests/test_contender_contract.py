"""A contender judged by the course's contract first (lmperf.kernels.attention_contract,
lmperf.bench.contenders, lmperf.report.contenders): CS336's shapes, one saved L of shape (batch, N)
in any float dtype and rtol = atol = 1e-2 decide "correct"; lmperf's wider contract is properties,
each failure named; a course-correct contender's timings stand wherever their shape class passed.

The fixtures (tests/fixtures/contenders_contract/) behave like student code: an L saved in bf16, a
kernel right only at the handout's shapes, one without the 1/sqrt(d) scale, one that caches. Its
results/cpu/ folder holds their check, as `test_the_committed_check_is_what_the_fixtures_give`
reruns it, and a FlashAttention bench file of the project's own whose message cells are all empty.
"""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from lmperf import contenders
from lmperf.kernels import attention_contract as contract
from lmperf.report import contenders as report

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "contenders_contract"
RESULTS = FIXTURES / "results" / "cpu"
NAMES = {"bf16_lse": "bf16_lse.py", "narrow": "narrow_kernel.py", "no_scale": "no_scale.py", "caching": "caching.py"}
# The check the committed results/cpu/contenders/attention.csv ran (the course's shape at fp32 and
# bf16; an awkward N and head dim 80 outside it; the property that catches a cache)
SPEC = {"contenders": {n: str((FIXTURES / f).relative_to(REPO)) for n, f in NAMES.items()},
        "kinds": ["pytorch"], "course": {"dtypes": ["fp32", "bf16"], "shapes": [[2, 128, 16]]},
        "dtypes": ["fp32"], "causal": [True], "shapes": [[2, 100, 16], [2, 128, 80]],
        "properties": ["fresh"], "gqa_shape": [1, 2, 1, 128, 16], "property_shape": [2, 2, 128, 16],
        "property_dtype": "fp32", "time_limit_s": 120, "workers": 1}


@pytest.fixture(autouse=True)
def environment():
    """Loading a contender here registers nothing; the environment as it was after each test."""
    import os
    env = os.environ.pop(contenders.ENV, None)
    yield
    os.environ.pop(contenders.ENV, None)
    if env is not None:
        os.environ[contenders.ENV] = env


def _apply(name: str):
    return contenders.attention_class(contenders.load(name, str(FIXTURES / NAMES[name])), "pytorch").apply


def _qkv(*shape, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=gen, dtype=dtype) for _ in range(3)]


# ---------------------------------------------------------------------------------------------
# The contract: one L of shape (batch, N) in any float dtype, the course's tolerance


def test_an_L_saved_in_bf16_passes_the_courses_test_but_not_flash_attentions_tolerance():
    rows = {r["quantity"]: r for r in contract.compare(_apply("bf16_lse"), *_qkv(2, 128, 16), True)}
    assert rows["lse"]["saved_dtype"] == "bfloat16"
    assert all(r["course_passed"] for r in rows.values()), rows
    assert rows["lse"]["course_ratio"] <= 1 and not rows["lse"]["passed"]  # good to 1e-2, not to 2x PyTorch's
    assert all(rows[q]["passed"] for q in ("out", "dq", "dk", "dv"))


class _SavesTwo(torch.autograd.Function):
    """L and the row maximum, both (batch, N): the course's test refuses two."""
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        ctx.save_for_backward(torch.logsumexp(s, -1), s.amax(-1))
        return torch.softmax(s, -1) @ v


class _SavesNone(torch.autograd.Function):
    """No L at all: q, k and v alone."""
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        ctx.save_for_backward(q, k, v)
        return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1) @ v


def test_the_saved_L_is_the_one_tensor_of_shape_batch_n_as_the_course_finds_it():
    q, k, v = _qkv(2, 16, 16)
    with pytest.raises(AssertionError, match=r"found 2"):
        contract.saved_logsumexp(_SavesTwo.apply(q.requires_grad_(), k, v), q.shape[:-1])
    with pytest.raises(AssertionError, match=r"found 0"):
        contract.saved_logsumexp(_SavesNone.apply(q, k, v), q.shape[:-1])


def test_the_course_ratio_is_assert_closes_rule():
    ref = torch.tensor([0.0, 10.0], dtype=torch.float64)
    assert contract.course_ratio(ref + torch.tensor([0.01, 0.0], dtype=torch.float64), ref) == pytest.approx(1.0)
    assert contract.course_ratio(ref + torch.tensor([0.0, 0.11], dtype=torch.float64), ref) == pytest.approx(1.0)
    assert contract.course_ratio(ref + torch.tensor([0.0, 0.5]), ref) > 4
    assert contract.course_ratio(torch.tensor([float("nan"), 0.0]), ref) == float("inf")


def test_course_cases_are_the_courses_shapes_and_a_shape_outside_is_refused():
    cases = {c["case_id"]: c for c in __import__("lmperf.bench.contenders", fromlist=["x"]).attention_cases(SPEC)}
    course = {c["case_id"] for c in cases.values() if c.get("tier") == "course"}
    assert course == {f"{n}_pytorch-{d}-causal-2x128x16" for n in NAMES for d in ("fp32", "bf16")}
    assert cases["narrow_pytorch-fp32-causal-2x100x16"]["outside"] == "awkward_n"
    assert cases["narrow_pytorch-fp32-causal-2x128x80"]["outside"] == "head_dim"
    assert cases["narrow_pytorch-fp32-causal-2x128x80"]["aligned"] is True
    from lmperf.bench.contenders import attention_cases
    with pytest.raises(contenders.ContenderError, match="outside the course's contract"):
        attention_cases({**SPEC, "course": {"dtypes": ["fp32"], "shapes": [[2, 128, 80]]}})


def _eligible(d: int) -> bool:
    return not contract.course_reasons(d, contract.COURSE_TILE)


def test_the_course_shapes_cover_every_timed_head_dim_dtype_and_causal_of_each_scale():
    """Every (head dim, dtype, causal) that the FlashAttention benchmark and PyTorch attention's
    grid time, where the head dim is inside the course's contract, has a course case at every
    scale: the headline (1 x 16 x 16,384 x 64, bf16, causal) among them."""
    from lmperf.report.render import load_config
    config = load_config()
    for scale in ("full", "smoke", "quick"):
        att = config["contenders_check"][scale]["attention"]
        covered = {(s[-1], dtype, causal) for s in att["course"]["shapes"] for dtype in att["course"]["dtypes"]
                   for causal in att["causal"]}
        timed = set()
        for group in config["flash_attention"][scale]["bench"]["groups"]:
            dims = group.get("head_dims") or [config["models"][m]["d_model"] // config["models"][m]["n_heads"]
                                              for m in group.get("models", [])]
            timed |= {(d, dtype, causal) for d in dims for dtype in group["dtypes"] for causal in group["causal"]}
        grid = config["attention"][scale]
        timed |= {(d, "fp32", False) for d in grid.get("head_dims", [])}
        missing = {t for t in timed if _eligible(t[0])} - covered
        assert not missing, (scale, sorted(missing))
        assert (64, "bf16", True) in covered


# ---------------------------------------------------------------------------------------------
# Verdicts, from the fixtures' committed check


@pytest.fixture(scope="module")
def frames():
    from lmperf.report import render
    return {"contenders": render.load_section(RESULTS, "contenders"),
            "flash_attention": render.load_section(RESULTS, "flash_attention")}


def _shown(frames) -> pd.DataFrame:
    fa = report.wrong_everywhere(frames)["flash_attention"]
    return fa.set_index(["provider", "head_dim", "seq_len"])


def test_an_L_in_bf16_is_course_correct_and_reported_as_a_property(frames):
    v = report.verdicts(frames["contenders"])["bf16_lse_pytorch"]
    assert v.course == "correct" and v.course_checks == (2, 2)
    assert v.properties["fp32_lse"] == "no"
    # L good to the course's 1e-2, not to twice plain PyTorch's error: both properties, named
    assert [f["check"] for f in v.failures] == ["fp32_lse", "tight_tolerance"]
    shown = _shown(frames).loc["bf16_lse_pytorch"]
    assert shown.loc[(16, 256), "status"] == "ok" and shown.loc[(80, 256), "status"] == "ok"
    assert shown.loc[(32, 256), "status"] == "unchecked"  # no check ran at head dim 32


def test_a_kernel_right_at_the_handouts_shapes_is_timed_there_its_failures_listed(frames):
    v = report.verdicts(frames["contenders"])["narrow_pytorch"]
    assert v.course == "correct"
    assert v.properties["awkward_n"] == "no" and v.properties["head_dim"] == "no"
    failed = {f["check"]: f for f in v.failures}
    assert set(failed) == {"awkward_n", "head_dim"}  # every failed check named, not only the first
    assert failed["awkward_n"]["shape"].startswith("2x100x16") and failed["awkward_n"]["ratio"] > 1
    assert failed["head_dim"]["shape"].startswith("2x128x80") and "CompilationError" in failed["head_dim"]["detail"]
    shown = _shown(frames).loc["narrow_pytorch"]
    kept = shown.loc[(16, 256)]
    assert kept["status"] == "ok" and kept["median"] == pytest.approx(0.5)  # its shape class passed
    assert shown.loc[(80, 256), "status"] == "wrong" and pd.isna(shown.loc[(80, 256), "median"])
    assert shown.loc[(16, 100), "status"] == "wrong"
    assert "head dim 80" in shown.loc[(80, 256), "message"]


@pytest.mark.parametrize("provider, check", [("no_scale_pytorch", "course"), ("caching_pytorch", "fresh")])
def test_a_contender_wrong_on_the_course_or_caching_is_wrong_everywhere(frames, provider, check):
    v = report.verdicts(frames["contenders"])[provider]
    assert v.course == "WRONG"
    assert v.failures[0]["check"] == check and v.failures[0]["course"]
    shown = _shown(frames).loc[provider]
    assert (shown["status"] == "wrong").all() and shown["median"].isna().all()
    assert shown["message"].str.startswith("wrong: fails").all()


def test_a_wrong_contenders_every_failed_check_is_named(frames):
    v = report.verdicts(frames["contenders"])["no_scale_pytorch"]
    assert [f["check"] for f in v.failures] == ["course", "awkward_n", "head_dim"]
    course = v.failures[0]
    assert course["cases"] == 2 and course["ratio"] > 100  # both dtypes, far beyond rtol = atol = 1e-2


def test_pytorch_attentions_grid_and_the_ladders_rung_are_judged_by_their_shape_class(frames):
    """PyTorch attention's grid (fp32, not causal) and the ladder's contender rung (the model's head
    dim, its dtype, causal, N its context): a row at a class that passed keeps its time, one at a
    class no check ran at is `unchecked`."""
    attention = pd.DataFrame({"study": "attention", "impl": ["narrow_pytorch", "narrow_pytorch", "no_scale_pytorch"],
                              "head_dim": [16, 16, 16], "seq_len": [256, 100, 256], "status": "ok",
                              "median": 1.0, "message": float("nan")})
    ladder = pd.DataFrame({"study": "ladder", "name": ["contender_narrow_pytorch", "contender_narrow_pytorch", "rung1"],
                           "d_model": 64, "n_heads": 4, "dtype": "fp32", "context": [256, 32, 32], "status": "ok",
                           "median": 2.0, "message": float("nan")})
    marked = report.wrong_everywhere({**frames, "attention": attention, "ladder": ladder})
    # the fixtures' check ran causal alone: PyTorch attention's grid (not causal) is another class
    assert marked["attention"]["status"].tolist() == ["unchecked", "unchecked", "wrong"]
    assert marked["attention"]["median"].isna().all()
    assert marked["ladder"]["status"].tolist() == ["ok", "wrong", "ok"]  # N = 32: an awkward N, which it fails


def test_rows_whose_message_cells_are_all_empty_take_the_reason(frames):
    """pandas reads a message column with no text as float64; marking a row wrong writes text."""
    fa = frames["flash_attention"]
    assert fa["message"].isna().all() and fa["message"].dtype == "float64"
    marked = report.wrong_everywhere(frames)["flash_attention"]
    hit = marked[marked["status"] != "ok"]
    assert len(hit) and hit["message"].map(lambda m: isinstance(m, str) and len(m) > 0).all()
    assert (marked.loc[marked["status"] == "ok", "provider"].isin(
        ["triton", "sdpa_flash", "sdpa_cudnn", "bf16_lse_pytorch", "narrow_pytorch"])).all()


def test_the_summary_times_a_course_correct_contender_where_its_class_passed(frames):
    from lmperf.report.sections import Inputs
    marked = report.wrong_everywhere(frames)
    view = report.view(Inputs(results=RESULTS, frames=marked, bars={}, out_dir=RESULTS, scale="smoke"))
    summary = {s["provider"]: s for s in view["summary"]}
    assert summary["narrow_pytorch"]["ms"] == pytest.approx(0.5)
    assert summary["narrow_pytorch"]["vs_ours"] == pytest.approx(2.0)
    assert summary["no_scale_pytorch"]["ms"] == "wrong" and summary["caching_pytorch"]["ms"] == "wrong"
    page = report.page_view(view, "narrow")
    assert page["verdicts"][0]["course"] == "correct"
    assert set(page["failures"]["check"]) == {"awkward N", "head dims 8 to 256"}
    times = page["timings"].set_index("shape")
    assert times.loc["b1 h1 n256 d16", "vs sdpa_flash"] == pytest.approx(1.6)
    assert times.loc["b1 h1 n256 d80", "ms"] == "wrong"


def test_the_report_renders_with_a_wrong_contender(tmp_path):
    """Every section, from the fixture's folder (a wrong contender, message cells all empty), and
    a page for each contender."""
    from lmperf.report import render
    out = tmp_path / "report" / "report.md"
    render.render(RESULTS, REPO / "templates", out, tmp_path / "report" / "figures", "smoke",
                  render.bars_from_config(REPO / "config" / "config.yaml"))
    assert sorted(p.name for p in (out.parent / "contenders").iterdir()) == sorted(f"{n}.md" for n in NAMES)


# ---------------------------------------------------------------------------------------------
# The check itself, in processes of each contender's own


def _check(spec: dict, out: Path) -> pd.DataFrame:
    proc = subprocess.run([sys.executable, "-m", "lmperf.bench.contenders", "attention", "--spec", json.dumps(spec),
                           "--out", str(out), "--hw", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_csv(out)


def test_two_contenders_never_share_a_process(tmp_path):
    """Each fixture refuses to run in a process where another fixture was imported (as two
    packages named cs336_systems would collide): with one child process for the job, the second
    contender's cases would fail."""
    spec = {**SPEC, "contenders": {n: SPEC["contenders"][n] for n in ("narrow", "bf16_lse")},
            "course": {"dtypes": ["fp32"], "shapes": [[2, 128, 16]]}, "shapes": [], "properties": []}
    rows = _check(spec, tmp_path / "attention.csv")
    assert set(rows["contender"]) == {"narrow", "bf16_lse"}
    assert (rows["status"] == "ok").all(), rows[["case_id", "status", "message"]]


@pytest.mark.slow  # four contenders' checks, each in its own processes: 16-45 s on two cores
def test_the_committed_check_is_what_the_fixtures_give(tmp_path):
    from lmperf.report import render
    fresh = report.verdicts(_check(SPEC, tmp_path / "attention.csv"))
    committed = report.verdicts(render.load_section(RESULTS, "contenders"))
    for provider, v in committed.items():
        assert (fresh[provider].course, fresh[provider].properties) == (v.course, v.properties), provider
        assert [f["check"] for f in fresh[provider].failures] == [f["check"] for f in v.failures], provider
