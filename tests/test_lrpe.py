"""Multi-dimensional LRPE-cosine against an independent float64 implementation, every impl
(Triton under its interpreter when there is no GPU)."""
import contextlib
import math

import pytest
import torch
import triton
import triton.language as tl

from lmperf import lrpe_cosine_md
from lmperf.kernels import lrpe
from lmperf.kernels.lrpe import compare, reference_float64, sincos

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
IMPLS = ["torch", "triton", "triton_cache"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (grid shape, d, e): 1 to 4 axes with odd sizes; e chosen so that m*e >= d.
GRIDS = [((13,), 24, 24), ((3, 5), 20, 10), ((3, 1, 5), 36, 12), ((2, 3, 1, 3), 16, 4)]


def run(impl, shape, l, d, e, dtype, h=3, b=2, theta_scale=1.0):
    """Check impl against float64 (lrpe.compare, the check the benchmark runs too); return the
    inputs it drew."""
    if impl != "torch" and dtype == torch.bfloat16 and not CUDA:
        pytest.skip("needs CUDA: bf16 in Triton is checked on the GPU")
    n = l + math.prod(shape)
    x = torch.randn(b, h, n, d, device=DEVICE).to(dtype)
    theta = torch.rand(h, e, device=DEVICE) * theta_scale
    bad = [r for r in compare(x, theta, shape, l, impl) if not r["passed"]]
    assert not bad, f"{impl} {shape} l={l} {dtype}: {bad}"
    return x, theta


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("l", [0, 5])
@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: "x".join(map(str, g[0])))
def test_matches_float64(impl, dtype, l, grid):
    shape, d, e = grid
    run(impl, shape, l, d, e, dtype)


@pytest.mark.parametrize("impl", IMPLS)
def test_extra_tokens_pass_through_and_sin_half_is_zero(impl):
    x, theta = run(impl, (4, 3), 5, 16, 8, torch.float32)
    out = lrpe_cosine_md(x, theta, (4, 3), 5, impl)
    # Theta = 0 for the l extra tokens: cos half = x, sin half = 0.
    assert torch.all(out[:, :, :5, 16:] == 0)


@pytest.mark.parametrize("impl", IMPLS)
def test_unencoded_axis_when_d_runs_out(impl):
    # d=16, m=3, e=8: axes 1 and 2 take all features, axis 3 gets none, so tokens that differ
    # only along the last axis get the same angles.
    shape = (2, 3, 5)
    x, theta = run(impl, shape, 0, 16, 8, torch.float32)
    angles = reference_float64(x, theta, shape, 0)[1]  # what run checked impl against
    grid = angles.reshape(angles.shape[0], *shape, 16)
    assert torch.equal(grid[:, :, :, 0], grid[:, :, :, 4])
    assert not torch.equal(grid[:, 0, 0], grid[:, 1, 0])


@pytest.mark.parametrize("impl", IMPLS)
def test_large_angles(impl):
    # positions up to 1000 with frequencies up to 3: fp32 angles lose bits; the tolerance model
    # accounts for it and the kernels must stay inside it.
    run(impl, (1001,), 0, 16, 16, torch.float32, h=1, b=1, theta_scale=3.0)


@pytest.mark.parametrize("way_in", ["eager", "op"])
def test_triton_keeps_nothing_of_size_n_by_d_and_cache_keeps_the_angles(way_in):
    """The same for eager calls and for the ops torch.compile traces."""
    x = torch.randn(2, 3, 40, 16, device=DEVICE, requires_grad=True)
    theta = torch.rand(3, 16, device=DEVICE)
    big = lambda out: [t for t in out.grad_fn.saved_tensors if t.numel() >= 40 * 16]
    if way_in == "eager":
        plain, cached = (lrpe_cosine_md(x, theta, (40,), 0, impl) for impl in ("triton", "triton_cache"))
    else:
        plain, cached = lrpe.lrpe_forward(x, theta, [40], 0), lrpe.lrpe_forward_cached(x, theta, [40], 0)[0]
    assert big(plain) == []
    cached = big(cached)
    assert len(cached) == 1 and cached[0].shape == (3, 40, 16) and cached[0].dtype == torch.float32


@pytest.mark.parametrize("args, message", [
    (dict(x=torch.randn(2, 3, 10, 8), shape=(3, 3)), "N=10 tokens but l \\+ prod\\(shape\\) = 0 \\+ 9"),
    (dict(x=torch.randn(2, 3, 9, 8), shape=(3, 3), e=3), "m \\* e = 2 \\* 3 = 6 < d = 8"),
    (dict(x=torch.randn(3, 9, 8), shape=(9,)), "shape \\(b, h, N, d\\)"),
    (dict(x=torch.randn(2, 3, 9, 8).double(), shape=(9,)), "float64"),
    (dict(x=torch.randn(2, 3, 9, 8), shape=(0, 9)), "positive sizes"),
    (dict(x=torch.randn(2, 3, 9, 8), shape=(9,), l=-1), "l \\(extra tokens\\)"),
    (dict(x=torch.randn(2, 3, 9, 8), shape=(9,), impl="cuda"), "impl='cuda'"),
    (dict(x=torch.randn(2, 4, 9, 8), shape=(9,)), "theta has 3 heads but x has 4"),
    (dict(x=torch.randn(2, 3, 9, 8), shape=(9,), theta=torch.ones(3, 8, dtype=torch.long)), "floating-point"),
])
def test_bad_input_is_a_clear_value_error(args, message):
    # on the device the kernels run on: a CPU tensor on a GPU host is a different error (the
    # RuntimeError naming the device), raised before the shape checks
    theta = args.pop("theta", torch.rand(3, args.pop("e", 8))).to(DEVICE)
    with pytest.raises(ValueError, match=message):
        lrpe_cosine_md(args.pop("x").to(DEVICE), theta, args.pop("shape"), args.pop("l", 0),
                       args.pop("impl", "triton"))


def test_bench_grid_follows_the_seed():
    from lmperf.bench.lrpe import bench_cases
    spec = {"batch": 12, "heads": 12, "d": 128, "dtype": "bf16", "extra_tokens": [0, 10],
            "timing_ms": [25, 100], "copy_timing_ms": [25, 200], "kernel_calls": 10,
            "providers": ["triton", "torch"]}
    for dims, sizes, e in ((1, [256, 32768], 128), (2, [16, 128], 64), (3, [4, 32], 64)):
        cases = bench_cases({**spec, "dims": dims, "sizes": sizes})
        assert len(cases) == len(sizes) * 2 * 2
        assert {c["e"] for c in cases} == {e}
        assert {c["tokens"] for c in cases} == {n**dims + l for n in sizes for l in (0, 10)}


def _synthetic_rows(kernel_speedup=None):
    rows = []
    for n, elements, fraction, t_triton, t_compile, peak_triton, peak_compile in (
            (256, 12 * 12 * 256 * 128, 0.5, 0.1, 0.2, 10, 20),
            (32768, 12 * 12 * 32768 * 128, 0.9, 1.0, 2.0, 100, 200),
            (16384, 12 * 12 * 16384 * 128, 0.8, 1.0, 0.9, 100, 90)):
        for provider, ms, peak in (("triton", t_triton, peak_triton), ("torch_compile", t_compile, peak_compile)):
            for metric, value in (("forward_ms", ms), ("backward_ms", ms), ("forward_peak_mib", peak),
                                  ("backward_peak_mib", peak), ("forward_copy_fraction", fraction),
                                  ("backward_copy_fraction", fraction), ("x_elements", elements),
                                  ("copy_gbs", 3000.0)):
                metrics = [(metric, value)]
                if kernel_speedup and metric.endswith(("_ms", "_copy_fraction")) and not metric.endswith("peak_mib"):
                    # host-free times: ours kernel_speedup x faster than its call time, the peer's unchanged
                    g = kernel_speedup if provider == "triton" else 1.0
                    gv = value / g if metric.endswith("_ms") else min(1.0, value * g)
                    metrics.append((metric.replace("_ms", "_kernel_ms").replace("_copy", "_kernel_copy"), gv))
                for m, v in metrics:
                    rows.append({"dims": 1, "side": n, "l": 0, "tokens": n, "provider": provider,
                                 "case_id": f"1d-n{n}-l0-{provider}", "metric": m, "mean": v,
                                 "status": "ok", "message": "", "kernel_calls": 10})
    return rows


def _lrpe_view(rows):
    """The report's LRPE view of synthetic bench rows, with config/config.yaml's thresholds."""
    import pandas as pd
    from pathlib import Path
    from lmperf.report import lrpe as lrpe_report
    from lmperf.report.render import bars_from_config
    from lmperf.report.sections import Inputs
    repo = Path(__file__).resolve().parents[1]
    frames = {"lrpe": pd.DataFrame(rows).assign(study="bench")}
    return lrpe_report.view(Inputs(results=repo, frames=frames, out_dir=repo,
                                   bars=bars_from_config(repo / "config" / "config.yaml")))


def _bar(frame, start: str):
    """The one bar line whose text starts with `start`."""
    hit = frame[frame["bar"].str.startswith(start)]
    assert len(hit) == 1, (start, list(frame["bar"]))
    return hit.iloc[0]


def test_lrpe_bars_are_computed_from_the_rows():
    """Synthetic rows (not measurements): the view must flag each bar from the numbers given."""
    view = _lrpe_view(_synthetic_rows())
    assert not view["kernel"]
    bars = view["bars"]
    line = _bar(bars, "triton forward >= 85% of copy bandwidth")
    assert line["_value"] == pytest.approx(0.80) and not line["met"]
    line = _bar(bars, "triton forward faster than torch.compile everywhere (time per call)")
    assert line["_value"] == pytest.approx(1.0 / 0.9) and not line["met"]
    line = _bar(bars, "triton forward peak memory <= torch.compile everywhere")
    assert line["_value"] == pytest.approx(10.0) and not line["met"]


def test_lrpe_bars_use_kernel_times_when_the_run_has_them():
    view = _lrpe_view(_synthetic_rows(kernel_speedup=1.25))
    assert view["kernel"] and view["kernel_calls"] == 10
    bars = view["bars"]
    # 0.8 x 1.25 = 100% of copy bandwidth, and 1.0 / 1.25 = 0.8 ms against the peer's 0.9 ms
    line = _bar(bars, "triton forward >= 85% of copy bandwidth (x >= 16M elements, 2 configs; kernel time)")
    assert line["_value"] == pytest.approx(1.0) and line["met"]
    line = _bar(bars, "triton forward faster than torch.compile everywhere (kernel time)")
    assert line["_value"] == pytest.approx(0.8 / 0.9) and line["met"]
    # beside them, the per-call comparison, shown as information
    line = _bar(view["per_call"], "triton forward faster than torch.compile everywhere (time per call, host included)")
    assert line["_value"] == pytest.approx(1.0 / 0.9) and not line["met"]


def test_a_missing_time_on_either_side_fails_the_faster_bar():
    """A config where only one side has a kernel time is not counted as a win."""
    rows = [r for r in _synthetic_rows(kernel_speedup=1.25)
            if not (r["provider"] == "torch_compile" and r["side"] == 256 and r["metric"] == "forward_kernel_ms")]
    line = _bar(_lrpe_view(rows)["bars"], "triton forward faster than torch.compile everywhere (kernel time)")
    assert not line["met"] and "1 configs without both times" in line["measured"]


class _Avg:  # the fields of a profiler key_averages() entry that device_us reads
    def __init__(self, key, device_type, self_us, count=1):
        self.key, self.device_type, self.self_device_time_total, self.count = key, device_type, self_us, count


def test_device_us_sums_device_work_per_call_without_the_flushes():
    from lmperf.bench.lrpe import device_us
    flush = "void at::native::vectorized_elementwise_kernel<4, at::native::bitwise_not_kernel_cuda"
    events = [_Avg("aten::bitwise_not_", "DeviceType.CPU", 50.0, 4),       # CPU op: not device work
              _Avg(flush, "DeviceType.CUDA", 400.0, 4),                     # the L2 flushes
              _Avg("_lrpe_fwd_kernel", "DeviceType.CUDA", 80.0, 4),
              _Avg("Memset (Device)", "DeviceType.CUDA", 4.0, 4),
              _Avg("cudaLaunchKernel", "DeviceType.CPU", 30.0, 8)]
    assert device_us(events, 4, {flush: 1}) == pytest.approx(21.0)
    assert device_us(events, 2, {flush: 2}) == pytest.approx(42.0)   # a flush of two launches
    with pytest.raises(RuntimeError, match="cannot tell them"):
        device_us(events, 5, {flush: 1})
    with pytest.raises(RuntimeError, match="cannot tell them"):   # a flush kernel not seen at all
        device_us(events, 4, {flush: 1, "some other kernel": 1})


@pytest.mark.parametrize("impl", ["triton", "triton_cache"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("programs_per_sm", [1, 4, 16])  # interpreter: 2 SMs, 4 tiles x heads: no split, parts of 2 and 3, parts of 1
@pytest.mark.parametrize("min_batch", [1, 2])
@pytest.mark.parametrize("wide", [False, True])
def test_launch_variants_match_float64(monkeypatch, impl, dtype, programs_per_sm, min_batch, wide):
    """Every launch setting the tuning sweep (tuning/lrpe/lrpe_sweep.py) tries is a correct kernel:
    the batch split into uneven parts, parts of one element (where the first load is also the
    last), or none; 32- and 64-bit offsets."""
    from lmperf.kernels import lrpe
    monkeypatch.setattr(lrpe, "PROGRAMS_PER_SM", programs_per_sm)
    monkeypatch.setattr(lrpe, "MIN_BATCH_PER_PROGRAM", min_batch)
    monkeypatch.setattr(lrpe, "WIDE_OFFSETS", wide)
    run(impl, (5, 7), 5, 20, 10, dtype, h=2, b=5)


def test_offsets_are_64_bit_only_for_tensors_of_2_to_the_31_elements():
    from lmperf.kernels.lrpe import wide_offsets
    small, big = torch.empty(1).expand(2**31 - 2), torch.empty(1).expand(2**31 - 1)
    assert not wide_offsets(small, small) and wide_offsets(small, big)


def test_sincos_matches_float64():
    """The kernels' shared-reduction sine and cosine (kernels.lrpe.sincos), run as a Triton
    kernel, against float64 at angles from 0 to 1e5 of either sign: within 4e-7 of the exact
    values of the fp32 inputs (fp32 sin/cos round to 6e-8; the reduction adds a little more
    where the interpreter has no fused multiply-add)."""
    @triton.jit
    def kernel(A, S, C, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        s, c = sincos(tl.load(A + i, mask=i < n))
        tl.store(S + i, s, mask=i < n)
        tl.store(C + i, c, mask=i < n)

    gen = torch.Generator().manual_seed(0)
    a = torch.cat([torch.linspace(-7, 7, 4001),                        # every quadrant, near 0
                   (torch.rand(20000, generator=gen) * 2 - 1) * 10.0 ** torch.randint(0, 6, (20000,), generator=gen),
                   torch.tensor([0.0, math.pi / 4, math.pi / 2, math.pi, 1e5, -1e5])]).float()
    a = a.to(DEVICE)
    s, c = torch.empty_like(a), torch.empty_like(a)
    kernel[(triton.cdiv(a.numel(), 1024),)](a, s, c, a.numel(), BLOCK=1024)
    a64 = a.double()
    bound = 1.5e-7 + 2e-11 * a64.abs()
    for name, got, want in (("sin", s, a64.sin()), ("cos", c, a64.cos())):
        excess = (got.double() - want).abs() - bound
        assert float(excess.max()) <= 0, f"{name} error over the bound at a = {float(a64[excess.argmax()])}"


# ---------------------------------------------------------------------------------------------
# The PyTorch ops (torch.ops.lmperf.lrpe_*) and torch.compile
#
# On a GPU, AOT dispatch decomposes the ops into their wrap_triton'd kernels, so that Inductor
# compiles the kernels themselves (where the tuple error of issue #13 was). Under
# TRITON_INTERPRET (a CPU) wrap_triton hands back the interpreted kernel, which cannot run on
# the FakeTensors and FunctionalTensors that this decomposition traces with; with
# decompose_custom_triton_ops off the ops stay opaque in the graph (their fake implementations
# give the shapes, their bodies run the kernels at run time). That is what a CPU checks: the
# schemas, fake and autograd registrations, and a full graph forward and backward.
NO_INDUCTOR_KERNELS = ("needs CUDA: under TRITON_INTERPRET wrap_triton returns the interpreted kernel, "
                       "which cannot run on the fake tensors Inductor traces the ops' kernels with")


def ops_traced_as_on_this_device():
    if CUDA:
        return contextlib.nullcontext()
    return torch._functorch.config.patch(decompose_custom_triton_ops=False)


def op_samples(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5 + 35, 20, generator=gen).to(DEVICE, dtype).requires_grad_()
    theta = torch.rand(3, 10, generator=gen).to(DEVICE)
    grad = torch.randn(2, 3, 40, 40, generator=gen).to(DEVICE, dtype)
    angles = torch.rand(3, 40, 20, generator=gen).to(DEVICE)
    return {"forward": (lrpe.lrpe_forward, (x, theta, [5, 7], 5)),
            "forward_cached": (lrpe.lrpe_forward_cached, (x, theta, [5, 7], 5)),
            "backward": (lrpe.lrpe_backward, (grad, theta, None, [5, 7], 5)),
            "backward_cached": (lrpe.lrpe_backward, (grad, theta, angles, [5, 7], 5))}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", ["forward", "forward_cached", "backward", "backward_cached"])
def test_ops_pass_opcheck(op, dtype):
    """torch.library.opcheck's default tests: schema, autograd registration, fake tensor,
    AOT dispatch with dynamic shapes."""
    if dtype == torch.bfloat16 and not CUDA:
        pytest.skip("needs CUDA: bf16 in Triton is checked on the GPU")
    fn, args = op_samples(dtype)[op]
    with ops_traced_as_on_this_device():
        torch.library.opcheck(fn, args)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiles_in_one_graph_forward_and_backward(impl, dynamic):
    dtype = torch.bfloat16 if CUDA else torch.float32
    x = torch.randn(2, 3, 40, 20, device=DEVICE).to(dtype).requires_grad_()
    theta = torch.rand(3, 10, device=DEVICE)

    def step(x, theta):
        return lrpe_cosine_md(x, theta, (5, 7), 5, impl).float().square().sum()

    want = torch.autograd.grad(step(x, theta), x)[0]
    torch._dynamo.reset()
    with ops_traced_as_on_this_device():
        got = torch.autograd.grad(torch.compile(step, fullgraph=True, dynamic=dynamic)(x, theta), x)[0]
    torch.testing.assert_close(got, want)


@pytest.mark.skipif(not CUDA, reason=NO_INDUCTOR_KERNELS)
@pytest.mark.parametrize("impl", ["triton", "triton_cache"])
def test_inductor_compiles_our_kernels_themselves(impl):
    from torch._inductor.utils import run_and_get_code
    x = torch.randn(4, 2, 64, 32, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    theta = torch.rand(2, 32, device=DEVICE)
    torch._dynamo.reset()
    step = torch.compile(lambda x: lrpe_cosine_md(x, theta, (64,), 0, impl).sum(), fullgraph=True)
    _, code = run_and_get_code(lambda: step(x).backward())
    code = "\n".join(code)
    assert "_lrpe_fwd_kernel" in code and "_lrpe_bwd_kernel" in code


def test_check_rows_come_from_compare_with_no_spread_claimed():
    from lmperf.bench.lrpe import check_cases, measure_check
    spec = {"impls": ["triton"], "dtypes": ["fp32"], "grids": [{"shape": [3, 5], "d": 20, "e": 10}],
            "extra_tokens": [5], "batch": 2, "heads": 3}
    rows = measure_check(check_cases(spec)[0])
    assert [r["metric"] for r in rows] == ["out_max_abs_err", "dx_max_abs_err"]
    assert all(r["passed"] and r["mean"] <= r["tolerance"] and math.isnan(r["std"]) for r in rows)


def test_timing_rows_carry_quantiles_not_a_zero_std():
    from lmperf.bench.lrpe import quantile_row
    row = quantile_row("forward_ms", "ms", 1.0, 1.1, 1.3)
    assert (row["q20"], row["median"], row["mean"], row["q80"]) == (1.0, 1.1, 1.1, 1.3)
    assert all(math.isnan(row[k]) for k in ("std", "min", "max"))


def test_torch_library_finds_each_ops_kernel():
    """torch.library reads each triton_op's kernels from its source (wrap_triton(kernel) calls,
    followed into helpers) for the keys of torch.compile's caches: a kernel it misses could be
    served stale from the cache after an edit. Compiled kernels only, so outside the interpreter."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    code = ("from lmperf.kernels import lrpe\n"
            "from torch._library.triton import get_triton_kernels_for_op as k\n"
            "print([[f.fn.__name__ for f in k(f'lmperf::{op}')] for op in "
            "('lrpe_forward', 'lrpe_forward_cached', 'lrpe_backward')])")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "[['_lrpe_fwd_kernel'], ['_lrpe_fwd_kernel'], ['_lrpe_bwd_kernel']]"
