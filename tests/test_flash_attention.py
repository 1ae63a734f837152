"""The FlashAttention-2 contract, for the tiled PyTorch version and the Triton version (under
Triton's interpreter when there is no GPU), against float64 on random inputs (drawn from a seed
of each case, so that a failure reproduces alone)."""
import zlib

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


def check(impl, shape, dtype, causal, kv_heads=None):
    """q of `shape`; k and v with `kv_heads` heads (dim -3) where given (grouped-query)."""
    if reason := skip_reason(impl, dtype):
        pytest.skip(reason)
    kv_shape = (*shape[:-3], kv_heads, *shape[-2:]) if kv_heads else shape
    # random inputs drawn from a seed of the case itself, not from whatever the tests before drew:
    # a failure reproduces when the case is run alone (the GPU check rule draws fresh seeds)
    torch.manual_seed(zlib.crc32(repr((impl, shape, str(dtype), causal, kv_heads)).encode()))
    q = torch.randn(shape, dtype=dtype, device=DEVICE)
    k, v = (torch.randn(kv_shape, dtype=dtype, device=DEVICE) for _ in range(2))
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
@pytest.mark.parametrize("d", [8, 16, 24, 32, 40, 64, 72, 80, 96, 128, 136, 200, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_head_dim_4d(impl, d, causal):
    """Any multiple of 8 from 8 to 256: powers of two, and padded ones (80 is the 2.7B model's)."""
    check(impl, (1, 2, 45, d), torch.float16, causal)
    check(impl, (1, 2, 33, d), torch.float32, causal)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: tl.dot on bfloat16 is wrong in Triton's interpreter")
@pytest.mark.parametrize("d", [8, 80, 96, 256])
@pytest.mark.parametrize("n", [1, 300, 1025])
def test_bf16_padded_head_dims_and_long_ragged_sequences(d, n):
    check("triton", (2, 3, n, d), torch.bfloat16, True)
    check("triton", (1, 2, n, d), torch.bfloat16, False)


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


@pytest.mark.parametrize("split", [1, 4])
def test_the_models_layout_is_read_and_written_in_place(monkeypatch, split):
    """A model's (B, H, N, D) views of (B, N, H, D) projections: the kernels read them through
    their batch, head and row strides; O comes back (B, N, H, D) in memory and dQ, dK, dV in the
    layout q, k, v came in (so the model's transposes back to (B, N, H * D) are views), split or
    not, equal to float64."""
    fa = flash_attention_triton
    force_split(monkeypatch, split)
    q, k, v = (torch.randn(2, 45, 3, 40, device=DEVICE).transpose(1, 2) for _ in range(3))
    rows = compare(fa.FlashAttention2Triton.apply, q, k, v, True)
    assert all(r["passed"] for r in rows), rows
    out, lse = torch.ops.lmperf.flash_attention_forward(q, k, v, True)
    assert out.transpose(1, 2).is_contiguous()
    grad = torch.randn(2, 45, 3, 40, device=DEVICE).transpose(1, 2)
    dq, dk, dv = torch.ops.lmperf.flash_attention_backward(q, k, v, out, lse, grad, True)
    assert dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride()
    # the same numbers as the contiguous call
    qc, kc, vc, gc = (t.contiguous() for t in (q, k, v, grad))
    out_c, lse_c = torch.ops.lmperf.flash_attention_forward(qc, kc, vc, True)
    torch.testing.assert_close(out, out_c, rtol=0, atol=0)
    assert out_c.transpose(1, 2).is_contiguous()  # contiguous inputs: the same output layout
    for a, b in zip((dq, dk, dv), torch.ops.lmperf.flash_attention_backward(qc, kc, vc, out_c, lse_c, gc, True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_compiled_model_layout_matches_eager():
    """Under torch.compile (fullgraph), transposed inputs and a transposed gradient: no graph
    break, and bit for bit the eager results."""
    import torch._dynamo
    torch._dynamo.reset()
    apply = flash_attention_triton.FlashAttention2Triton.apply

    def attend(xq, xk, xv):  # (B, N, H, D) in, (B, N, H * D) out, as in the model
        y = apply(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), True)
        return y.transpose(1, 2).reshape(xq.shape[0], xq.shape[1], -1)
    compiled = torch.compile(attend, backend=COMPILE_BACKEND, fullgraph=True)
    xs = [torch.randn(2, 37, 3, 24, device=DEVICE, requires_grad=True) for _ in range(3)]
    out = compiled(*xs)
    (out * torch.arange(out.shape[-1], device=DEVICE)).sum().backward()
    ys = [t.detach().clone().requires_grad_() for t in xs]
    ref = attend(*ys)
    (ref * torch.arange(ref.shape[-1], device=DEVICE)).sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for a, b in zip(xs, ys):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


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
    (lambda: (torch.randn(2, 8, 20),) * 3, "D=20 is not supported; use a multiple of 8 from 8 to 256"),
    (lambda: (torch.randn(2, 8, 4),) * 3, "D=4 is not supported"),
    (lambda: (torch.randn(2, 8, 264),) * 3, "D=264 is not supported"),
    (lambda: (torch.randn(16),) * 3, r"shape \(..., N, D\)"),
    (lambda: (torch.randn(2, 8, 16, dtype=torch.float64),) * 3, "float64 is not supported"),
    (lambda: (torch.randint(0, 3, (2, 8, 16)),) * 3, "int64 is not supported"),
    (lambda: (torch.randn(2, 0, 16),) * 3, "at least 1"),
    (lambda: (torch.randn(1, 6, 8, 16), torch.randn(1, 4, 8, 16), torch.randn(1, 4, 8, 16)),
     "6 heads are not a multiple of k and v's 4 heads"),
    (lambda: (torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 1, 8, 16)), "same shape"),
    (lambda: (torch.randn(1, 4, 8, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)), "same shape"),
    (lambda: (torch.randn(2, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)), "same shape"),
])
def test_bad_inputs_raise_a_clear_value_error(impl, make, message):
    with pytest.raises(ValueError, match=message):
        IMPLS[impl](*make(), False)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("is_causal", ["False", 1, None, torch.tensor(True)], ids=repr)
def test_is_causal_must_be_a_bool(impl, is_causal):
    """A string "False" is truthy: it would silently run causal attention."""
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        IMPLS[impl](q, q, q, is_causal)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        {"torch": flash_attention_torch, "triton": flash_attention_triton}[impl].forward_with_lse(q, q, q, is_causal)


def test_cpu_tensors_without_the_interpreter_say_what_to_set(monkeypatch):
    """Without TRITON_INTERPRET=1, Triton finds no driver for CPU tensors ("0 active drivers");
    the op says what to set instead."""
    monkeypatch.setattr(flash_attention_triton, "INTERPRET", False)
    q = torch.randn(1, 2, 8, 16)
    for call in (flash_attention_triton.FlashAttention2Triton.apply, flash_attention_triton.forward_with_lse):
        with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1"):
            call(q, q, q, False)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the device-mismatch check needs two devices")
@pytest.mark.parametrize("impl", IMPLS)
def test_mixed_devices_are_refused(impl):
    with pytest.raises(ValueError, match="one device"):
        IMPLS[impl](torch.randn(1, 8, 16), torch.randn(1, 8, 16, device="cuda"),
                    torch.randn(1, 8, 16), False)


def test_a_skipped_provider_becomes_a_row_that_says_why():
    from lmperf.failures import NotRun
    from lmperf.bench.flash_attention import bench_cases, measure_bench
    group = {"name": "g", "batch": 1, "heads": 1, "causal": [True], "dtypes": ["bf16", "fp32"],
             "seq_lens": [128], "head_dims": [32], "providers": ["flex", "plain"],
             "timing_ms": [25, 100], "tiled_max_seq_len": 4096,
             "skip": [{"provider": "flex", "dtype": "fp32", "reason": "cut for time"}]}
    cases = {c["case_id"]: c for c in bench_cases({"groups": [group]})}
    assert len(cases) == 4
    skipped = [c for c in cases.values() if c.get("skip_reason")]
    assert [(c["provider"], c["dtype"]) for c in skipped] == [("flex", "fp32")]
    with pytest.raises(NotRun, match="cut for time"):
        measure_bench(skipped[0])


@pytest.mark.parametrize("gpu_time, timed", [(True, {"flex", "plain"}), (["plain"], {"plain"}), (False, set())])
def test_cuda_graph_timing_is_asked_per_group_or_per_provider(gpu_time, timed):
    from lmperf.bench.flash_attention import bench_cases
    group = {"name": "g", "batch": 1, "heads": 1, "causal": [True], "dtypes": ["bf16"], "seq_lens": [128],
             "head_dims": [32], "providers": ["flex", "plain"], "timing_ms": [25, 100],
             "tiled_max_seq_len": 4096, "gpu_time": gpu_time}
    assert {c["provider"] for c in bench_cases({"groups": [group]}) if c["gpu_time"]} == timed


def test_compiled_plain_attention_is_one_static_graph_a_case_and_warmed():
    """The grid's torch.compile'd peer is compiled for its case's shape alone, as users get it for
    a shape that does not change: a second length is a recompile, not a dynamic graph, and the next
    case starts from no graph at all (with dynamic=True its time depended on the lengths an earlier
    case met). Each case's graph is compiled first by the compile-cache warm-up."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from lmperf.bench.flash_attention import compiles, provider_fn
    from lmperf.model import plain_attention

    graphs = lambda: len(_debug_get_cache_entry_list(plain_attention.__code__))
    case = lambda n: {"case_id": f"n{n}", "provider": "plain_compiled", "causal": True, "dtype": "fp32",
                      "heads": 1, "seq_len": n}
    fn, _ = provider_fn(case(16))
    for n, expected in ((16, 1), (24, 2)):
        x = torch.randn(1, 1, n, 8)
        fn(x, x, x)
        assert graphs() == expected
    provider_fn(case(40))
    assert graphs() == 0
    assert compiles(case(40)) and not compiles({**case(40), "provider": "plain"})


# ---------------------------------------------------------------------------------------------
# The Triton kernels as PyTorch ops: torch.compile and torch.library's own checks.
# On a GPU torch.compile runs Inductor (which launches the kernels itself); on the CPU it runs
# the aot_eager backend: the same trace through Dynamo and AOTAutograd, kernels interpreted.
COMPILE_BACKEND = "inductor" if CUDA else "aot_eager"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else []), ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("split", [None, 2], ids=["rule", "split2"])
def test_compiled_fullgraph_matches_eager(monkeypatch, dtype, causal, split):
    """The leaderboard's harness: torch.compile around apply, out.sum().backward(); no graph
    break (fullgraph), and the same output and gradients as eager; with the rule's configs and
    with every kernel split (its fp32 partial buffers), through a recompile for a second shape
    (dynamic shapes: Inductor once failed on a kernel writing two views of one buffer there)."""
    import torch._dynamo
    torch._dynamo.reset()
    if split:
        force_split(monkeypatch, split)
    apply = flash_attention_triton.FlashAttention2Triton.apply
    compiled = torch.compile(apply, backend=COMPILE_BACKEND, fullgraph=True)
    for shape in [(2, 3, 70, 64), (1, 2, 33, 80)]:  # a second shape: a recompile, not a break
        q, k, v = (torch.randn(shape, dtype=dtype, device=DEVICE, requires_grad=True) for _ in range(3))
        out = compiled(q, k, v, causal)
        out.sum().backward()
        grads = [t.grad for t in (q, k, v)]
        q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        ref = apply(q2, k2, v2, causal)
        ref.sum().backward()
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        for g, r in zip(grads, (q2.grad, k2.grad, v2.grad)):
            torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_compiled_forward_matches_float64():
    q, k, v = (torch.randn(2, 2, 50, 24, device=DEVICE) for _ in range(3))
    compiled = torch.compile(flash_attention_triton.FlashAttention2Triton.apply,
                             backend=COMPILE_BACKEND, fullgraph=True)
    rows = compare(compiled, q, k, v, True)
    assert all(r["passed"] for r in rows), rows


@pytest.mark.parametrize("shape", [(2, 3, 37, 16), (2, 3, 37, 40), (3, 37, 16), (2, 1, 2, 37, 16)],
                         ids=["4d-d16", "4d-d40", "3d", "5d"])
def test_ops_pass_torch_library_opcheck(shape):
    """Schema, fake (meta) implementation (output strides included), autograd registration and
    AOT dispatch of both ops, for every rank the layout rules treat apart."""
    q, k, v = (torch.randn(shape, device=DEVICE, requires_grad=True) for _ in range(3))
    fwd = torch.ops.lmperf.flash_attention_forward.default
    bwd = torch.ops.lmperf.flash_attention_backward.default
    torch.library.opcheck(fwd, (q, k, v, True))
    out, lse = fwd(*(t.detach() for t in (q, k, v)), True)
    torch.library.opcheck(bwd, (*(t.detach() for t in (q, k, v)), out, lse, torch.randn_like(out), True))


def test_the_op_itself_is_differentiable():
    """torch.ops.lmperf.flash_attention_forward has its own autograd formula (register_autograd)."""
    q, k, v = (torch.randn(1, 2, 21, 32, device=DEVICE, requires_grad=True) for _ in range(3))
    out, lse = torch.ops.lmperf.flash_attention_forward(q, k, v, False)
    assert not lse.requires_grad
    out.sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    flash_attention_triton.FlashAttention2Triton.apply(q2, k2, v2, False).sum().backward()
    for a, b in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_tile_configs_depend_only_on_the_call():
    """No autotuner: the config is a function of (N, D, dtype, causal, batch x heads)."""
    import triton
    fa = flash_attention_triton
    assert not [name for name, obj in vars(fa).items() if isinstance(obj, triton.runtime.Autotuner)]
    first = fa.fwd_config(16384, 64, torch.bfloat16, True, 16)
    for n in (1, 4097, 128):
        fa.fwd_config(n, 64, torch.bfloat16, True, 1)
    assert fa.fwd_config(16384, 64, torch.bfloat16, True, 16) == first


def force_split(monkeypatch, split: int) -> None:
    """Every kernel of every call splits its tile loops over `split` programs, the rule table's
    tiles otherwise."""
    fa = flash_attention_triton
    fwd_rule, bwd_rule = fa.fwd_config, fa.bwd_config
    monkeypatch.setattr(fa, "launch_fwd_config", lambda *a: {**fwd_rule(*a), "SPLIT": split})
    monkeypatch.setattr(fa, "launch_bwd_config", lambda *a: {name: {**c, "SPLIT": split} if name in ("dq", "dkdv") else c
                                                      for name, c in bwd_rule(*a).items()})


def force_fused(monkeypatch, fused: bool) -> None:
    """Every backward runs as one fused launch (fused=True) or as two kernels, with the tiles
    and splits of the launch path's config as it stands (force_split's, if called first)."""
    fa = flash_attention_triton
    bwd = fa.launch_bwd_config
    monkeypatch.setattr(fa, "launch_bwd_config", lambda *a: {**bwd(*a), "fused": fused})


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n, split", [(1, 2), (33, 2), (70, 4), (130, 2), (130, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_split_matches_float64(monkeypatch, causal, n, split, dtype):
    """At low parallelism each kernel splits a tile's loop over SPLIT programs writing fp32
    partial results (the forward's merged by logsumexp, the backward's summed): forced here for
    all three kernels, with shares that are empty, one tile, or ragged, checked against float64."""
    force_split(monkeypatch, split)
    check("triton", (1, 2, n, 40), dtype, causal)


@pytest.mark.parametrize("fused", [False, True], ids=["two_kernels", "fused"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape, split", [((1, 2, 70, 40), 1), ((2, 3, 33, 80), 1), ((1, 1, 130, 16), 4),
                                          ((1, 2, 1, 64), 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_fused_and_two_kernel_backward_match_float64(monkeypatch, fused, causal, shape, split, dtype):
    """The backward as one launch (dK/dV programs computing Delta themselves, beside the dQ
    programs) and as two kernels (dQ writing Delta, then dK/dV reading it), each with and
    without a split, checked against float64."""
    force_split(monkeypatch, split)
    force_fused(monkeypatch, fused)
    check("triton", shape, dtype, causal)


def test_split_gives_the_same_result_every_run(monkeypatch):
    """Partial sums are added in a fixed order (no atomics): two runs agree bit for bit."""
    force_split(monkeypatch, 4)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 100, 32, generator=gen).to(DEVICE) for _ in range(3))
    grad = torch.randn(1, 2, 100, 32, generator=gen).to(DEVICE)
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flash_attention_triton.FlashAttention2Triton.apply(*leaves, True)
        out.backward(grad)
        runs.append([out.detach(), *(t.grad for t in leaves)])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_head_dims_are_one_padded_tile_or_two_narrower_ones():
    fa = flash_attention_triton
    assert fa.d_tiles(80) == (64, 16) and fa.d_tiles(96) == (64, 32) and fa.d_tiles(72) == (64, 16)
    assert fa.d_tiles(40) == (32, 16) and fa.d_tiles(136) == (128, 16)
    assert fa.d_tiles(64) == (64, 0) and fa.d_tiles(8) == (16, 0) and fa.d_tiles(24) == (32, 0)
    assert fa.d_tiles(112) == (128, 0) and fa.d_tiles(200) == (256, 0)  # two tiles would save nothing
    for d in range(8, 257, 8):
        da, db = fa.d_tiles(d)
        assert da + db >= d and da + db <= fa.d_pad(d) and (db == 0 or da <= d)


def test_split_is_chosen_with_few_programs_only(monkeypatch):
    fa = flash_attention_triton
    monkeypatch.setattr(fa, "INTERPRET", False)  # the GPU's rule table (the interpreter has its own tiles)
    # one head, short sequences (the grid's): several programs per tile, every kernel
    assert fa.fwd_config(1024, 128, torch.float32, True, 1)["SPLIT"] == 8
    assert fa.bwd_config(1024, 128, torch.float32, True, 1)["dkdv"]["SPLIT"] == 8
    assert fa.bwd_config(1024, 128, torch.bfloat16, True, 1)["dq"]["SPLIT"] == 8
    # fp32: shares keep at least one tile of the loop: 4 tiles of 32 keys at 128 tokens, 4 shares
    assert fa.fwd_config(128, 128, torch.float32, True, 1)["SPLIT"] == 4
    # 16 bits: no split below 16 tiles of loop (the merge kernels cost more than the split saves)
    assert fa.fwd_config(512, 128, torch.bfloat16, True, 1)["SPLIT"] == 1
    assert fa.bwd_config(128, 64, torch.float16, True, 1)["dkdv"]["SPLIT"] == 1
    assert fa.bwd_config(256, 64, torch.bfloat16, True, 48)["dq"]["SPLIT"] == 1  # the model group's small
    # and no more than 8 shares, and no split past two programs per SM (fp32 D=128 N=4,096: 4)
    assert fa.fwd_config(512, 64, torch.float32, True, 1)["SPLIT"] == 8
    assert fa.fwd_config(4096, 128, torch.float32, True, 1)["SPLIT"] == 4
    # enough programs: the headline, the throughput and the model group's larger shapes are not split
    assert fa.fwd_config(16384, 64, torch.bfloat16, True, 16)["SPLIT"] == 1
    assert fa.bwd_config(8192, 128, torch.bfloat16, True, 64)["dkdv"]["SPLIT"] == 1
    assert fa.bwd_config(256, 80, torch.bfloat16, True, 128)["dq"]["SPLIT"] == 1
    # causal 16-bit at 1,024 rows (head dims 64 and 128) where the unsplit forward has a program an
    # SM: nothing split and two backward kernels (the assignment's (16, 1,024, D)); with fewer
    # sequences, with grouped-query in the backward, not causal or past 1,024 rows _split's rule
    for d in (64, 128):
        for dtype in (torch.bfloat16, torch.float16):
            bwd = fa.bwd_config(1024, d, dtype, True, 16)
            assert fa.fwd_config(1024, d, dtype, True, 16)["SPLIT"] == 1
            assert (bwd["dq"]["SPLIT"], bwd["dkdv"]["SPLIT"], bwd["fused"]) == (1, 1, False)
    assert fa.fwd_config(1024, 64, torch.bfloat16, True, 8)["SPLIT"] == 4  # 128 programs: fewer than the SMs
    assert fa.bwd_config(1024, 64, torch.bfloat16, True, 16, 4)["dkdv"]["SPLIT"] == 8
    assert fa.fwd_config(1024, 64, torch.bfloat16, False, 16)["SPLIT"] == 2
    assert fa.fwd_config(1024, 80, torch.bfloat16, True, 16)["SPLIT"] == 2
    assert fa.fwd_config(4096, 64, torch.bfloat16, True, 4)["SPLIT"] == 2
    assert fa.bwd_config(1024, 64, torch.bfloat16, True, 48)["dq"]["SPLIT"] == 1
    assert fa.bwd_config(1024, 64, torch.bfloat16, True, 100)["dkdv"]["SPLIT"] == 1
    # fp32 D = 128 at short sequences: 16-row tiles, shares of at least two tiles
    assert fa.bwd_config(128, 128, torch.float32, True, 1)["dq"]["SPLIT"] == 4
    assert fa.bwd_config(256, 128, torch.float32, True, 1)["dkdv"]["SPLIT"] == 8


def test_calls_the_host_launches_are_unsplit_where_the_host_bounds_them(monkeypatch):
    """A causal 16-bit call that the host launches (host=True: eager or compiled, no graph captured)
    keeps every kernel unsplit up to 8,192 rows at head dim 64 (and below) and 4,096 at 128 (80 pads to
    128); longer, not causal, fp32, a grouped-query backward, or under a capture (host=False): the split
    rule as it was."""
    fa = flash_attention_triton
    monkeypatch.setattr(fa, "INTERPRET", False)

    def splits(n, d, dtype=torch.bfloat16, causal=True, bh=1, group=1, host=True):
        bwd = fa.bwd_config(n, d, dtype, causal, bh, group, host)
        return fa.fwd_config(n, d, dtype, causal, bh, host)["SPLIT"], bwd["dq"]["SPLIT"], bwd["dkdv"]["SPLIT"]
    for n, d in [(1024, 64), (8192, 64), (2048, 32), (8192, 16), (1024, 128), (4096, 128), (4096, 80), (2048, 128)]:
        assert splits(n, d) == (1, 1, 1), (n, d)
        assert splits(n, d, torch.float16) == (1, 1, 1), (n, d)
        assert max(splits(n, d, host=False)) > 1, (n, d)  # the rule splits every one of them under a capture
    assert fa.bwd_config(1024, 128, torch.bfloat16, True, 1, 1, True)["fused"]  # one launch: no sums after it
    assert not fa.bwd_config(4096, 128, torch.bfloat16, True, 1, 1, True)["fused"]
    for n, d in [(16384, 64), (8192, 128), (8192, 80)]:
        assert splits(n, d) == splits(n, d, host=False) and max(splits(n, d)) > 1, (n, d)
    assert splits(1024, 64, causal=False) == splits(1024, 64, causal=False, host=False)
    assert splits(1024, 64, torch.float32) == splits(1024, 64, torch.float32, host=False)
    assert splits(1024, 64, bh=4, group=4)[2] == splits(1024, 64, bh=4, group=4, host=False)[2] > 1


def test_backward_is_one_launch_only_when_it_cannot_fill_the_gpu(monkeypatch):
    fa = flash_attention_triton
    monkeypatch.setattr(fa, "INTERPRET", False)
    # one head, short sequences (the grid's), and the model group's smallest at context 256
    assert fa.bwd_config(512, 128, torch.bfloat16, True, 1)["fused"]
    assert fa.bwd_config(128, 128, torch.float32, True, 1)["fused"]
    assert fa.bwd_config(2048, 64, torch.bfloat16, True, 1)["fused"]
    assert fa.bwd_config(256, 64, torch.bfloat16, True, 48)["fused"]
    # big launches, and fp32 past 1,024 tokens: two kernels
    assert not fa.bwd_config(256, 80, torch.bfloat16, True, 128)["fused"]  # 2.7B at 256: 8 programs an SM
    assert not fa.bwd_config(1024, 64, torch.bfloat16, True, 100)["fused"]
    assert not fa.bwd_config(16384, 64, torch.bfloat16, True, 16)["fused"]
    assert not fa.bwd_config(2048, 128, torch.float32, True, 1)["fused"]
    assert not fa.bwd_config(4096, 64, torch.bfloat16, True, 1)["fused"]

