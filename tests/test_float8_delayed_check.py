"""The rows of rules/float8_delayed.smk's check (lmperf.bench.float8_delayed): its cases, every
case that runs on this machine passing, and those that need CUDA's fp8 rounding saying so on a
CPU, with their code run there anyway (their numbers are the interpreter's, not checked)."""
import math

import pytest
import torch

from lmperf import failures
from lmperf.bench import float8_delayed as check

CUDA = torch.cuda.is_available()
SPEC = {"cast": [[3, 7], [17, 40]], "swiglu": [[5, 7]], "layers": [[1, 3, 32, 48]],
        "compiled": {"cast": [[3, 7]], "swiglu": [[5, 7]], "layers": [[1, 3, 32, 48]]}}


def test_cases_cover_each_kernel_and_layer_eager_and_compiled():
    cases = check.check_cases(SPEC)
    ids = [c["case_id"] for c in cases]
    assert len(set(ids)) == len(ids)
    assert {"cast-held-e4m3-bf16-eager-3x7", "cast-random-e5m2-fp16-compiled-3x7", "swiglu-fp32-fp32-eager-5x7",
            "swiglu_backward-fp8-bf16-compiled-5x7", "linear-float64-bf16-compiled-1x3x32x48",
            "ffn-float64-bf16-eager-1x3x32x48", "ffn-wiring-bf16-eager-1x3x32x48"} <= set(ids)
    assert not [i for i in ids if "wiring" in i and "compiled" in i]  # an eager comparison
    # 2 casts x 2 variants x 3 dtypes x 2 formats x 3 shapes (2 eager, 1 compiled), 2 swiglu ops x 2 x 3 x 2,
    # linear 1 x 2, ffn 2 eager + 1 compiled
    assert len(cases) == 2 * 3 * 2 * 3 + 2 * 2 * 3 * 2 + 2 + 3
    with pytest.raises(ValueError, match="multiples of 16"):
        check.check_cases({**SPEC, "layers": [[1, 3, 32, 40]]})


@pytest.mark.parametrize("case", check.check_cases(SPEC), ids=lambda c: c["case_id"])
def test_each_case_passes_or_says_it_needs_cuda(case):
    if not CUDA and case["variant"] in ("random", "fp8", "float64"):
        with pytest.raises(failures.NotRun, match="needs CUDA"):
            check.measure_check(case)
        return
    rows = check.measure_check(case)
    assert rows and all(r["passed"] for r in rows), (case["case_id"], rows)
    assert all(r["tolerance"] >= 0 and math.isfinite(r["mean"]) for r in rows)


@pytest.mark.skipif(CUDA, reason="on a GPU the cases run through measure_check above")
@pytest.mark.parametrize("impl, variant", [("cast", "random"), ("swiglu", "fp8"), ("swiglu_backward", "fp8"),
                                           ("linear", "float64"), ("ffn", "float64")])
def test_the_cuda_only_checks_run_on_the_cpu_too(impl, variant):
    """Their code, not their numbers (the interpreter's fp8 rounding is wrong in places): every
    metric is there, finite, with its tolerance."""
    case = next(c for c in check.check_cases(SPEC) if (c["impl"], c["variant"]) == (impl, variant)
                and not c["compiled"])
    fn = {"cast": check.check_cast, "swiglu": check.check_swiglu, "swiglu_backward": check.check_swiglu,
          "linear": check.check_layers, "ffn": check.check_layers}[impl]
    rows = fn(case, "cpu")
    metrics = [r["metric"] for r in rows]
    want = {"cast": ["y_and_transpose_mismatches", "amax_abs_err"],
            "swiglu": ["h_e4m3_mismatches", "h_e5m2_mismatches"],
            "swiglu_backward": ["da_e4m3_mismatches", "db_e4m3_mismatches", "da_e5m2_mismatches", "db_e5m2_mismatches"],
            "linear": ["y_rel_err", "dx_rel_err", "dw_rel_err"], "ffn": ["y_rel_err", "dx_rel_err", "dw_rel_err"]}
    assert metrics == want[impl]
    assert all(math.isfinite(r["max_abs_err"]) and r["tolerance"] >= 0 for r in rows)


@pytest.mark.parametrize("ffn", [False, True], ids=["linear", "ffn"])
def test_the_fp8_emulation_is_the_layers_float64_gradients_without_its_roundings(ffn, monkeypatch):
    """With fp8_round the identity, fp8_emulated is the float64 module's forward and autograd gradients:
    its hand-written backward (the SwiGLU's da and db included) is the layer's math."""
    from lmperf.model import SwiGLU

    torch.manual_seed(0)
    d, f = 32, 48
    model = (SwiGLU(d, f) if ffn else torch.nn.Sequential(torch.nn.Linear(d, f, bias=False))).double()
    names = ["w1.weight", "w3.weight", "w2.weight"] if ffn else ["0.weight"]
    x = torch.randn(2, 5, d, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(2, 5, d if ffn else f, dtype=torch.float64)
    y = model(x)
    y.backward(gy)
    want = [y.detach(), x.grad, *(model.get_parameter(n).grad for n in names)]
    monkeypatch.setattr(check, "fp8_round", lambda t, fmt, scale=None: t)
    monkeypatch.setattr(check, "bf16_round", lambda t: t)
    got = check.fp8_emulated([model.get_parameter(n).detach() for n in names], x.detach(), gy, ffn)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_the_ffn_emulation_rounds_the_layers_16_bit_intermediates_to_bf16(monkeypatch):
    """The Float8SwiGLU writes w1's and w3's products and dh = gy w2 in bf16 before it casts h, da
    and db to fp8; the emulation rounds them alike (without, a flipped e5m2 rounding of da at 3
    tokens doubled dw1's error against the emulation's on the H200), and nothing else."""
    torch.manual_seed(2)
    d, f = 16, 48
    w1, w3 = torch.randn(f, d, dtype=torch.float64) / 4, torch.randn(f, d, dtype=torch.float64) / 4
    w2 = torch.randn(d, f, dtype=torch.float64) / 7
    x, gy = torch.randn(3, d, dtype=torch.float64) * 3, torch.randn(3, d, dtype=torch.float64)
    monkeypatch.setattr(check, "fp8_round", lambda t, fmt, scale=None: t)
    bf = lambda t: t.to(torch.bfloat16).double()
    a, b = bf(x @ w1.T), bf(x @ w3.T)
    s = torch.sigmoid(a)
    dh = bf(gy @ w2)
    da, db = dh * b * s * (1 + a * (1 - s)), dh * a * s
    want = [(a * s * b) @ w2.T, da @ w1 + db @ w3, da.T @ x, db.T @ x, gy.T @ (a * s * b)]
    got = check.fp8_emulated([w1, w3, w2], x, gy, ffn=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(check, "bf16_round", lambda t: t)
    exact = check.fp8_emulated([w1, w3, w2], x, gy, ffn=True)
    assert all(float((g - e).abs().max()) > 1e-6 for g, e in zip(got, exact))


def test_the_fp8_emulation_errs_as_fp8_does():
    """PyTorch's roundings (CPU casts, not Triton's interpreter) give fp8's error: on normal data,
    y of a linear layer about 0.037 from float64 (x and w in e4m3), its gradients about 0.059
    (gy in e5m2), as the H100 measured the Float8Linear at 7 x 13 x 160 x 96 (0.038, 0.060,
    0.060); and fp8_round keeps a tensor's largest value within the format's rounding."""
    torch.manual_seed(1)
    x, w, gy = torch.randn(64, 160, dtype=torch.float64) * 3, torch.randn(96, 160, dtype=torch.float64) * 0.05, \
        torch.randn(64, 96, dtype=torch.float64) * 1e-4
    y, dx, dw = check.fp8_emulated([w], x, gy, ffn=False)
    rel = lambda a, b: float((a - b).norm() / b.norm())
    assert 0.03 < rel(y, x @ w.T) < 0.045
    assert 0.05 < rel(dx, gy @ w) < 0.07 and 0.05 < rel(dw, gy.T @ x) < 0.07
    q = check.fp8_round(x, torch.float8_e4m3fn)
    assert float((q - x).abs().max() / x.abs().max()) <= 2.0 ** -4
