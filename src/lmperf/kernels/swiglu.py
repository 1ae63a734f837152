"""SwiGLU's product c = silu(a) * b in Triton, forward and backward, as PyTorch ops; the three
matmuls around it (a = x W1, b = x W3, c W2) stay cuBLAS's.

One pass over a and b writes c; the backward reads dc, a and b once and writes both input
gradients, recomputing sigmoid(a) instead of saving silu(a):
    s = sigmoid(a), silu(a) = a s, silu'(a) = s (1 + a (1 - s))
    da = dc * b * silu'(a),  db = dc * silu(a)
All in fp32, each result rounded once to its tensor's dtype (PyTorch rounds silu(a) to the
input dtype before the product: in bf16 our product is the more accurate one).

Ops: torch.ops.lmperf.silu_mul_forward and silu_mul_backward (see triton_op.py), `silu_mul(a, b)`
on top; `reference` is the model's code, `compare` the float64 check of tests and bench/fused.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.library import wrap_triton

from lmperf.kernels.attention_contract import tolerance
from lmperf.kernels.triton_op import INTERPRET, cdiv, check_device, num_warps, register

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Elements a program: a flat range of a, b and c (the interpreter: small, so that tests span
# several programs).
BLOCK = 256 if INTERPRET else 2048


@triton.jit
def _silu_mul_forward_kernel(A, B, C, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(C + offs, (a * tl.sigmoid(a) * b).to(C.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_backward_kernel(DC, A, B, DA, DB, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    dc = tl.load(DC + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    tl.store(DA + offs, (dc * b * (s * (1.0 + a * (1.0 - s)))).to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, (dc * a * s).to(DB.dtype.element_ty), mask=mask)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _launch(kernel, *tensors):
    numel = tensors[0].numel()
    if numel:
        kernel[(cdiv(numel, BLOCK),)](*tensors, numel, BLOCK=BLOCK, num_warps=num_warps(BLOCK))


@register("lmperf::silu_mul_forward", lambda a, b: torch.empty_like(a, memory_format=torch.contiguous_format))
def silu_mul_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b, contiguous, in a's dtype."""
    check_device(a, "silu_mul")
    c = torch.empty_like(a, memory_format=torch.contiguous_format)
    _launch(wrap_triton(_silu_mul_forward_kernel), _flat(a), _flat(b), c)
    return c


def _fake_backward(dc, a, b):
    return (torch.empty_like(a, memory_format=torch.contiguous_format),
            torch.empty_like(b, memory_format=torch.contiguous_format))


@register("lmperf::silu_mul_backward", _fake_backward)
def silu_mul_backward(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) of silu_mul_forward from dc and the saved a and b."""
    check_device(a, "silu_mul")
    da = torch.empty_like(a, memory_format=torch.contiguous_format)
    db = torch.empty_like(b, memory_format=torch.contiguous_format)
    _launch(wrap_triton(_silu_mul_backward_kernel), _flat(dc), _flat(a), _flat(b), da, db)
    return da, db


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dc):
    a, b = ctx.saved_tensors
    return silu_mul_backward(dc, a, b)


silu_mul_forward.register_autograd(_backward, setup_context=_setup_context)


def check_inputs(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"silu_mul: a and b must have one shape, dtype and device; got a {tuple(a.shape)} "
                         f"{a.dtype} {a.device}, b {tuple(b.shape)} {b.dtype} {b.device}")
    if a.dtype not in DTYPES:
        raise ValueError(f"silu_mul takes {[str(t) for t in DTYPES]}; got {a.dtype}")


def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b (SwiGLU's product), differentiable in a and b; works under
    torch.compile(fullgraph=True)."""
    check_inputs(a, b)
    check_device(a, "silu_mul")
    return silu_mul_forward(a, b)


# ---------------------------------------------------------------------------------------------
# The same computation in PyTorch, and the check against float64


def reference(a, b):
    """lmperf.model.SwiGLU's product, in the inputs' dtype."""
    return F.silu(a) * b


def compare(a: torch.Tensor, b: torch.Tensor, impl=silu_mul) -> list[dict]:
    """Errors of impl(a, b) against float64, beside `reference` in the inputs' dtype: c, da, db
    for a random dc; the house rule (attention_contract.tolerance)."""
    dc = torch.randn_like(a)
    results = {}
    for name, fn, dt in (("ref", reference, torch.float64), ("torch", reference, a.dtype), ("impl", impl, a.dtype)):
        a_, b_ = (t.detach().to(dt).requires_grad_() for t in (a, b))
        c = fn(a_, b_)
        c.backward(dc.to(c.dtype))
        results[name] = {"c": c.detach(), "da": a_.grad, "db": b_.grad}
    rows = []
    for quantity in ("c", "da", "db"):
        ref = results["ref"][quantity]
        err = lambda t: float((t.double() - ref).abs().max()) if torch.isfinite(t).all() else float("inf")
        impl_err, torch_err = err(results["impl"][quantity]), err(results["torch"][quantity])
        tol = tolerance(torch_err, a.dtype)
        rows.append({"quantity": quantity, "max_abs_err": impl_err, "torch_err": torch_err, "tolerance": tol,
                     "passed": bool(impl_err <= tol)})
    return rows
