"""The fused kernels (kernels/rmsnorm.py, swiglu.py, rope.py) against float64 on fresh random
inputs of awkward shapes, as PyTorch ops under torch.compile, and the model patched to run them
(kernels/fused.py) against the model itself. On a CPU the kernels run in Triton's interpreter,
which rounds to bfloat16 by truncation: bf16 is checked on the GPU."""
import copy
import sys
import types

import pytest
import torch
import torch._dynamo

from lmperf import train
from lmperf.kernels import fused, rmsnorm, rope, swiglu, triton_op
from lmperf.model import ModelConfig, rope_tables

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not CUDA, reason="needs CUDA: Triton's interpreter rounds to bfloat16 by truncation"))]
# On a GPU torch.compile runs Inductor (which launches the kernels itself); on the CPU the
# aot_eager backend: the same trace through Dynamo and AOTAutograd, kernels interpreted.
COMPILE_BACKEND = "inductor" if CUDA else "aot_eager"


def assert_passed(rows, what):
    bad = [r for r in rows if not r["passed"]]
    assert not bad, f"{what}: {bad}"


def norm_inputs(shape, dtype, variant):
    x = torch.randn(shape, device=DEVICE, dtype=torch.float32 if variant == "fp32_residual" else dtype)
    delta = None if variant == "norm" else torch.randn(shape, device=DEVICE, dtype=dtype)
    return x, delta, 1 + 0.1 * torch.randn(shape[-1], device=DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["add", "norm", "fp32_residual"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (3, 7, 48), (17, 333), (2, 8193)], ids=str)
def test_rmsnorm_matches_float64(dtype, variant, shape):
    """One row, one column, odd widths, a width past a power of two; the residual add (x and
    delta in one dtype, or the model's fp32 residual with a 16-bit delta and output) or none."""
    x, delta, weight = norm_inputs(shape, dtype, variant)
    assert_passed(rmsnorm.compare(x, delta, weight, 1e-5, dtype), f"{shape} {dtype} {variant}")


def test_rmsnorm_backward_splits_rows_over_programs_and_sums_weight_gradients_in_a_fixed_order(monkeypatch):
    """More rows than programs (each walks several tiles, the last one ragged): the same
    gradients on every run, and right."""
    monkeypatch.setattr(rmsnorm, "TILE_ELEMENTS", 64)  # 1-row tiles at D = 40
    x, delta, weight = norm_inputs((37, 40), torch.float32, "add")
    assert_passed(rmsnorm.compare(x, delta, weight, 1e-5, torch.float32), "37 rows")
    grads = []
    for _ in range(2):
        w = weight.clone().requires_grad_()
        rmsnorm.add_rmsnorm(x, delta, w, 1e-5)[1].square().sum().backward()
        grads.append(w.grad)
    assert torch.equal(*grads)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (1, 1), (3, 1001), (7, 333), (2, 3, 257)], ids=str)
def test_swiglu_matches_float64(dtype, shape):
    a, b = 3 * torch.randn(shape, device=DEVICE, dtype=dtype), torch.randn(shape, device=DEVICE, dtype=dtype)
    assert_passed(swiglu.compare(a, b), f"{shape} {dtype}")


def test_swiglu_reads_non_contiguous_inputs():
    a, b = (torch.randn(40, 33, device=DEVICE).t() for _ in range(2))
    assert not a.is_contiguous()
    assert_passed(swiglu.compare(a, b), "transposed")


def rope_inputs(b, h, h_kv, n, d, dtype, layout="model"):
    """q and k as the model makes them, (B, H, N, D) views of (B, N, H, D) projections, or
    contiguous (B, H, N, D)."""
    if layout == "model":
        q = torch.randn(b, n, h, d, device=DEVICE, dtype=dtype).transpose(1, 2)
        k = torch.randn(b, n, h_kv, d, device=DEVICE, dtype=dtype).transpose(1, 2)
    else:
        q, k = (torch.randn(b, heads, n, d, device=DEVICE, dtype=dtype) for heads in (h, h_kv))
    cos, sin = (t.to(DEVICE) for t in rope_tables(d, n + 5, 10_000.0))
    return q, k, cos[:n], sin[:n]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 2), (2, 3, 3, 17, 8), (2, 4, 1, 33, 80), (1, 2, 1, 9, 34),
                                   (1, 8, 2, 5, 128)], ids=str)
@pytest.mark.parametrize("layout", ["model", "contiguous"])
def test_rope_matches_float64(dtype, shape, layout):
    """One token, a head dim of 2, head dims whose half is not a power of two (80: the 2.7B
    model's; 34), grouped-query k (fewer heads than q), more heads than a program takes."""
    q, k, cos, sin = rope_inputs(*shape, dtype, layout)
    assert_passed(rope.compare(q, k, cos, sin), f"{shape} {dtype} {layout}")


def test_rope_keeps_the_layout_and_takes_a_longer_table():
    q, k, cos, sin = rope_inputs(2, 3, 1, 7, 16, torch.float32)
    qo, ko = rope.rope(q, k, cos, sin)
    assert qo.stride() == q.stride() and ko.stride() == k.stride()
    long_cos, long_sin = (t.to(DEVICE) for t in rope_tables(16, 64, 10_000.0))
    qo2, ko2 = rope.rope(q, k, long_cos, long_sin)  # the model's tables hold its whole context
    assert torch.equal(qo, qo2) and torch.equal(ko, ko2)


# ---------------------------------------------------------------------------------------------
# As PyTorch ops: torch.compile and torch.library's own checks


def compiled_matches_eager(fn, inputs, grad_of=lambda out: out):
    """fn under torch.compile(fullgraph=True) gives eager's outputs and gradients: exactly on the
    CPU; on a GPU within assert_close's rounding for the dtype, since Inductor fuses the ops around
    our kernels there (the gradient sums of the ops' backward formulas) with fused multiply-adds
    (an H100 differs in the last bit of fp32)."""
    torch._dynamo.reset()
    results = []
    for f in (fn, torch.compile(fn, backend=COMPILE_BACKEND, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) if t is not None else None for t in inputs]
        out = grad_of(f(*leaves))
        sum(o.float().square().sum() for o in out).backward()
        results.append(([o.detach() for o in out], [t.grad for t in leaves if t is not None and t.requires_grad]))
    for a, b in zip(results[0][0] + results[0][1], results[1][0] + results[1][1]):
        torch.testing.assert_close(a, b, **({} if CUDA else {"rtol": 0, "atol": 0}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else []), ids=str)
def test_each_kernel_under_compile_fullgraph_matches_eager(dtype):
    x, delta, weight = norm_inputs((5, 33), dtype, "add")
    compiled_matches_eager(lambda x, d, w: rmsnorm.add_rmsnorm(x, d, w, 1e-5), (x, delta, weight))
    x32, delta, weight = norm_inputs((5, 33), dtype, "fp32_residual")
    compiled_matches_eager(lambda x, d, w: rmsnorm.add_rmsnorm(x, d, w, 1e-5, dtype), (x32, delta, weight))
    compiled_matches_eager(lambda x, w: rmsnorm.add_rmsnorm(x, None, w, 1e-5)[1:], (x, weight))
    a, b = (torch.randn(3, 77, device=DEVICE, dtype=dtype) for _ in range(2))
    compiled_matches_eager(lambda a, b: (swiglu.silu_mul(a, b),), (a, b))
    q, k, cos, sin = rope_inputs(2, 4, 2, 9, 80, dtype)
    compiled_matches_eager(lambda q, k: rope.rope(q, k, cos, sin), (q, k))


def test_ops_pass_torch_library_opcheck():
    """Schema, fake implementation (output strides included), autograd registration and AOT
    dispatch of every op, for inputs whose layout the ops copy (RoPE's fake once disagreed with
    the op there, and a compiled backward viewed the wrong strides)."""
    ops = torch.ops.lmperf
    x, delta, weight = norm_inputs((3, 7, 24), torch.float32, "add")
    torch.library.opcheck(ops.rmsnorm_forward.default, (x.requires_grad_(), weight, 1e-5, torch.float16))
    torch.library.opcheck(ops.add_rmsnorm_forward.default, (x, delta.half(), weight, 1e-5, torch.float16))
    h, _, rstd = ops.add_rmsnorm_forward(x.detach(), delta, weight, 1e-5, torch.float32)
    for dh, two in ((None, False), (torch.randn_like(h), True)):
        torch.library.opcheck(ops.rmsnorm_backward.default,
                              (torch.randn_like(h), dh, h, weight, rstd, torch.float32, two, torch.float16))
    a, b = (torch.randn(5, 9, device=DEVICE, requires_grad=True) for _ in range(2))
    torch.library.opcheck(ops.silu_mul_forward.default, (a, b))
    q, k, cos, sin = rope_inputs(2, 3, 1, 5, 8, torch.float32)
    strided = torch.randn(2, 3, 5, 16, device=DEVICE)[..., ::2]  # stride 2 along D: copied by the op
    for qq in (q, strided):
        torch.library.opcheck(ops.rope.default, (qq.requires_grad_(), k.requires_grad_(), cos, sin, False))


def test_cpu_tensors_without_the_interpreter_say_what_to_set(monkeypatch):
    monkeypatch.setattr(triton_op, "INTERPRET", False)
    x = torch.randn(2, 8)
    q = torch.randn(1, 2, 3, 8)
    cos, sin = rope_tables(8, 3, 10_000.0)
    for call in (lambda: rmsnorm.add_rmsnorm(x, x, torch.ones(8), 1e-5), lambda: swiglu.silu_mul(x, x),
                 lambda: rope.rope(q, q, cos, sin)):
        with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1"):
            call()


@pytest.mark.parametrize("call, message", [
    (lambda: rmsnorm.add_rmsnorm(torch.randn(2, 8), torch.randn(2, 9), torch.ones(8), 1e-5), "delta"),
    (lambda: rmsnorm.add_rmsnorm(torch.randn(2, 8), None, torch.ones(9), 1e-5), "weight"),
    (lambda: rmsnorm.add_rmsnorm(torch.randn(2, 8).double(), None, torch.ones(8), 1e-5), "float64"),
    (lambda: swiglu.silu_mul(torch.randn(2, 8), torch.randn(2, 8).half()), "one shape, dtype and device"),
    (lambda: rope.rope(torch.randn(1, 2, 3, 7), torch.randn(1, 2, 3, 7), torch.ones(3, 3), torch.ones(3, 3)), "even"),
    (lambda: rope.rope(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.ones(2, 4), torch.ones(2, 4)), "cos"),
    (lambda: rope.rope(torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.ones(3, 4), torch.ones(3, 4)), "(B, H, N, D)"),
], ids=["delta-shape", "weight-shape", "float64", "swiglu-dtype", "odd-head-dim", "short-table", "3-d"])
def test_bad_inputs_raise_a_clear_value_error(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


# ---------------------------------------------------------------------------------------------
# The patched model


CFG = ModelConfig(d_model=48, d_ff=80, n_layers=3, n_heads=4, vocab_size=97, context_length=16, n_kv_heads=2)


def loss_and_grads(model, x, y, autocast=None):
    model.zero_grad(set_to_none=True)
    with autocast or train.autocast("fp32", DEVICE):
        loss = train.loss(model, x, y)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("checkpoint_every", [0, 2])
def test_patched_model_computes_the_models_function(compiled, checkpoint_every):
    """fp32: the same loss and gradients (to fp32 rounding), with grouped-query attention, blocks
    checkpointed (train.checkpoint_blocks runs type(block).forward) and compiled (fullgraph)."""
    model = train.build_model(CFG, DEVICE)
    patched = fused.apply(copy.deepcopy(model), "ours")
    params = list(patched.parameters())
    for m in (model, patched):
        train.checkpoint_blocks(m, checkpoint_every)
        if compiled:
            torch._dynamo.reset()
            for block in m.blocks:
                block.compile(backend=COMPILE_BACKEND, fullgraph=True)
    assert type(patched).__name__ == "FusedTransformerLM" and list(patched.parameters()) == params
    x, y = train.random_tokens(CFG, 2, 13, DEVICE)
    loss, grads = loss_and_grads(model, x, y)
    fused_loss, fused_grads = loss_and_grads(patched, x, y)
    torch.testing.assert_close(fused_loss, loss, rtol=1e-6, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(fused_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("parts", [("rmsnorm",), ("swiglu",), ("rope",), ("swiglu", "rope")], ids="+".join)
def test_a_model_patched_with_some_of_our_kernels_computes_the_models_function(parts):
    """The ladder adds our kernels one a rung: the model's own code does the others."""
    model = train.build_model(CFG, DEVICE)
    patched = fused.apply(copy.deepcopy(model), "ours", parts)
    x, y = train.random_tokens(CFG, 2, 13, DEVICE)
    loss, grads = loss_and_grads(model, x, y)
    fused_loss, fused_grads = loss_and_grads(patched, x, y)
    torch.testing.assert_close(fused_loss, loss, rtol=1e-6, atol=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(fused_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="parts"):
        fused.apply(model, "ours", ("layernorm",))


@pytest.mark.skipif(not CUDA, reason="needs CUDA: Triton's interpreter rounds to bfloat16 by truncation")
def test_patched_model_under_bf16_autocast_matches_float64_as_well_as_the_model():
    from lmperf.bench import fused as check
    spec_case = {"impl": "model", "dtype": "bf16", "variant": "", "compiled": True, "attention": "flash-triton",
                 "context": 64, "batch_size": 2, "d_model": 128, "d_ff": 512, "n_layers": 4, "n_heads": 4,
                 "vocab_size": 97, "size": "mini", "case_id": "model-mini-bf16-compiled"}
    assert all(r["passed"] for r in check.measure_check(spec_case))


def test_liger_without_its_package_is_named_and_leaves_the_model_as_it_was():
    import importlib.util
    if importlib.util.find_spec("liger_kernel"):
        pytest.skip("liger-kernel is installed here")
    model = train.build_model(CFG, DEVICE)
    with pytest.raises(fused.MissingPackage, match=r"needs liger-kernel \(pip wheel; tools/wheelhouse.sh\)"):
        fused.apply(model, "liger")
    assert type(model).__name__ == "TransformerLM"
    with pytest.raises(ValueError, match="impl='nope'"):
        fused.apply(model, "nope")


def liger_stand_in() -> types.ModuleType:
    """A stand-in for liger_kernel.ops computing what Liger's functions are documented to compute
    (casting mode "gemma": fp32 math, the input's dtype out; the fused add returns (Y, S))."""
    def rmsnorm_gemma(X, W, eps, offset=0.0, casting_mode="llama", in_place=True, row_mode=None):
        assert casting_mode == "gemma" and offset == 0.0 and in_place is False
        x = X.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + W.float())).to(X.dtype)

    def add_rmsnorm_gemma(X, R, W, eps, offset=0.0, casting_mode="llama", in_place=False):
        assert X.dtype == R.dtype, "Liger adds in one dtype"
        S = X + R
        return rmsnorm_gemma(S, W, eps, offset, casting_mode, in_place), S

    ops = types.ModuleType("liger_kernel.ops")
    ops.LigerRMSNormFunction = types.SimpleNamespace(apply=rmsnorm_gemma)
    ops.LigerFusedAddRMSNormFunction = types.SimpleNamespace(apply=add_rmsnorm_gemma)
    ops.LigerSiLUMulFunction = types.SimpleNamespace(apply=lambda a, b: torch.nn.functional.silu(a) * b)
    return ops


def test_liger_gets_its_arguments_in_its_order(monkeypatch):
    """With the stand-in for Liger's functions, the model patched for Liger computes the model's
    function, in fp32 and with the fp32 residual and bf16 sublayer outputs of autocast."""
    ops = liger_stand_in()
    monkeypatch.setitem(sys.modules, "liger_kernel", types.SimpleNamespace(ops=ops))
    monkeypatch.setitem(sys.modules, "liger_kernel.ops", ops)
    model = train.build_model(CFG, DEVICE)
    patched = fused.apply(copy.deepcopy(model), "liger")
    x, y = train.random_tokens(CFG, 2, 13, DEVICE)
    for dtype in ("fp32", "bf16"):
        loss, grads = loss_and_grads(model, x, y, train.autocast(dtype, DEVICE))
        liger_loss, liger_grads = loss_and_grads(patched, x, y, train.autocast(dtype, DEVICE))
        torch.testing.assert_close(liger_loss, loss, rtol=1e-6, atol=1e-6)
        for name, g in grads.items():
            torch.testing.assert_close(liger_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_the_check_rows_pass_and_bf16_on_a_cpu_says_why():
    """The rows of the fused check (rule fused_check): a case of each kernel and of the model."""
    from lmperf import failures
    from lmperf.bench import fused as check

    spec = {"dtypes": ["fp16", "bf16"], "rmsnorm": [[3, 40]], "swiglu": [[5, 7]], "rope": [[1, 2, 1, 3, 8]],
            "compiled_shapes": {"rope": [[1, 2, 1, 3, 8]]},
            "model": {"sizes": ["tiny"], "dtypes": ["fp32"], "compile": [False], "attention": "plain", "context": 8,
                      "batch_size": 2, "vocab_size": 97,
                      "models": {"tiny": {"d_model": 32, "d_ff": 64, "n_layers": 2, "n_heads": 2}}}}
    cases = check.check_cases(spec)
    ids = [c["case_id"] for c in cases]
    assert len(set(ids)) == len(ids)
    assert "rmsnorm-add_fp32_residual-fp16-eager-3x40" in ids and "rope-fp16-compiled-1x2x1x3x8" in ids
    assert "model-tiny-fp32-eager" in ids
    for case in cases:
        if case["dtype"] == "bf16" and not CUDA:
            with pytest.raises(failures.NotRun, match="needs CUDA"):
                check.measure_check(case)
            continue
        rows = check.measure_check(case)
        assert rows and all(r["passed"] for r in rows), (case["case_id"], rows)
