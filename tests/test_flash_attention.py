"""The FlashAttention-2 contract, for the tiled PyTorch version and the Triton version (under
Triton's interpreter when there is no GPU), against float64 on fresh random inputs."""
import pytest
import torch

from lmperf.kernels import flash_attention_torch, flash_attention_triton
from lmperf.kernels.attention_contract import compare

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
IMPLS = {"torch": flash_attention_torch.FlashAttention2PyTorch.apply,
         "triton": flash_attention_triton.FlashAttention2Triton.apply}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def skip_reason(impl: str, dtype: torch.dtype) -> str | None:
    if impl == "triton" and dtype == torch.bfloat16 and not CUDA:
        return "needs CUDA: tl.dot on bfloat16 is wrong in Triton's interpreter (checked on the GPU)"
    return None


def check(impl, shape, dtype, causal):
    if reason := skip_reason(impl, dtype):
        pytest.skip(reason)
    q, k, v = (torch.randn(shape, dtype=dtype, device=DEVICE) for _ in range(3))
    rows = compare(IMPLS[impl], q, k, v, causal)
    bad = [r for r in rows if not r["passed"]]
    assert not bad, f"{impl} {shape} {dtype} causal={causal}: {bad}"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [1, 17, 70, 128])
def test_matches_float64_3d(impl, dtype, causal, n):
    check(impl, (2, n, 32), dtype, causal)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_head_dim_4d(impl, d, causal):
    check(impl, (1, 2, 45, d), torch.float16, causal)
    check(impl, (1, 2, 33, d), torch.float32, causal)


@pytest.mark.parametrize("impl", IMPLS)
def test_more_leading_dims_and_a_single_token(impl):
    check(impl, (2, 1, 2, 1, 16), torch.float32, True)
    check(impl, (3, 5, 64), torch.float32, False)


@pytest.mark.parametrize("impl", IMPLS)
def test_non_contiguous_inputs(impl):
    # (B, N, H, D) transposed to (B, H, N, D): a view with non-unit strides along N.
    q, k, v = (torch.randn(2, 37, 3, 32, device=DEVICE).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    rows = compare(IMPLS[impl], q, k, v, True)
    assert all(r["passed"] for r in rows), rows
    sliced = torch.randn(2, 3, 40, 64, device=DEVICE)[..., ::2]  # stride 2 along D
    rows = compare(IMPLS[impl], sliced, sliced.clone(), sliced.clone(), False)
    assert all(r["passed"] for r in rows), rows


@pytest.mark.parametrize("impl", IMPLS)
def test_logsumexp_is_saved_for_backward(impl):
    q, k, v = (torch.randn(2, 3, 19, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    out = IMPLS[impl](q, k, v, False)
    saved = out.grad_fn.saved_tensors
    lse = saved[4]
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    expected = torch.logsumexp(q.double() @ k.double().transpose(-2, -1) / 4.0, dim=-1)
    torch.testing.assert_close(lse.double(), expected, rtol=0, atol=1e-5)
    assert out.shape == q.shape and out.dtype == q.dtype


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("make, message", [
    (lambda: (torch.randn(2, 8, 16), torch.randn(2, 9, 16), torch.randn(2, 9, 16)), "same shape"),
    (lambda: (torch.randn(2, 8, 16), torch.randn(2, 8, 16).half(), torch.randn(2, 8, 16)), "same dtype"),
    (lambda: (torch.randn(2, 8, 24),) * 3, "D=24 is not supported"),
    (lambda: (torch.randn(2, 8, 256),) * 3, "D=256 is not supported"),
    (lambda: (torch.randn(16),) * 3, r"shape \(..., N, D\)"),
    (lambda: (torch.randn(2, 8, 16, dtype=torch.float64),) * 3, "float64 is not supported"),
    (lambda: (torch.randint(0, 3, (2, 8, 16)),) * 3, "int64 is not supported"),
    (lambda: (torch.randn(2, 0, 16),) * 3, "at least 1"),
])
def test_bad_inputs_raise_a_clear_value_error(impl, make, message):
    with pytest.raises(ValueError, match=message):
        IMPLS[impl](*make(), False)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the device-mismatch check needs two devices")
@pytest.mark.parametrize("impl", IMPLS)
def test_mixed_devices_are_refused(impl):
    with pytest.raises(ValueError, match="one device"):
        IMPLS[impl](torch.randn(1, 8, 16), torch.randn(1, 8, 16, device="cuda"),
                    torch.randn(1, 8, 16), False)


def test_a_skipped_provider_becomes_a_row_that_says_why():
    from lmperf.bench.common import NotRun
    from lmperf.bench.flash_attention import bench_cases, measure_bench
    group = {"name": "g", "batch": 1, "heads": 1, "causal": [True], "dtypes": ["bf16", "fp32"],
             "seq_lens": [128], "head_dims": [32], "providers": ["flex", "plain"],
             "skip": [{"provider": "flex", "dtype": "fp32", "reason": "cut for time"}]}
    cases = {c["case_id"]: c for c in bench_cases({"groups": [group]})}
    assert len(cases) == 4
    skipped = [c for c in cases.values() if c.get("skip_reason")]
    assert [(c["provider"], c["dtype"]) for c in skipped] == [("flex", "fp32")]
    with pytest.raises(NotRun, match="cut for time"):
        measure_bench(skipped[0])
