"""RoPE on q and k in one Triton launch, forward and backward, as a PyTorch op, in place of
lmperf.model.apply_rope: each consecutive pair (x[2i], x[2i+1]) of a head's row at position p is
rotated by the angle whose cosine and sine are the model's tables cos[p, i], sin[p, i] (fp32):
    out[2i] = x[2i] cos - x[2i+1] sin,   out[2i+1] = x[2i] sin + x[2i+1] cos
in fp32, rounded once to x's dtype. The backward is the rotation by the opposite angle (sin
negated), the same kernel.

A program owns a tile of BLOCK_N positions of one sequence and HEADS heads of q, then of k (k may
have fewer heads: grouped-query attention): it loads the tile's cos and sin once and streams the
heads through them. A row is loaded as a [BLOCK_N, HALF_PAD, 2] tile (pairs along the last axis,
split into even and odd halves and joined again after the rotation), so loads and stores stay
contiguous along the head dim. q and k are read through their strides (the model's (B, H, N, D)
views of (B, N, H, D) projections are not copied); the outputs keep their layout.

Op: torch.ops.lmperf.rope (see triton_op.py); `rope(q, k, cos, sin)` on top; `reference` is the
model's apply_rope, `compare` the float64 check the tests and bench/fused.py share.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from lmperf.kernels.attention_contract import tolerance
from lmperf.kernels.rope_contract import apply_rope
from lmperf.kernels.triton_op import INTERPRET, cdiv, check_device, next_pow2, num_warps, register

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Positions a program: as many as fill TILE_ELEMENTS with head-dim rows; heads a program. The
# interpreter takes small tiles so that tests span several of them.
TILE_ELEMENTS = 128 if INTERPRET else 4096
HEADS = 2 if INTERPRET else 8


def launch_config(d: int) -> dict:
    half_pad = next_pow2(d // 2)
    block_n = max(1, TILE_ELEMENTS // (2 * half_pad))
    return {"HALF_PAD": half_pad, "BLOCK_N": block_n, "HEADS": HEADS, "num_warps": num_warps(block_n * 2 * half_pad)}


@triton.jit
def _rotate_head(X, OUT, x_head, out_head, offs, mask, cos, sin):
    x_even, x_odd = tl.split(tl.load(X + x_head + offs, mask=mask, other=0.0).to(tl.float32))
    out = tl.join(x_even * cos - x_odd * sin, x_even * sin + x_odd * cos)
    tl.store(OUT + out_head + offs, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(Q, K, QO, KO, COS, SIN, N, HQ, HK, HALF,
                 sqb, sqh, sqn, skb, skh, skn, sob, soh, son, skob, skoh, skon, stride_cos, stride_sin,
                 INVERSE: tl.constexpr, BLOCK_N: tl.constexpr, HALF_PAD: tl.constexpr, HEADS: tl.constexpr):
    tile, batch, group = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    pair = tl.arange(0, HALF_PAD)
    two = tl.arange(0, 2)
    cs_mask = (pos[:, None] < N) & (pair[None, :] < HALF)
    cos = tl.load(COS + pos[:, None] * stride_cos + pair[None, :], mask=cs_mask, other=0.0).to(tl.float32)
    sin = tl.load(SIN + pos[:, None] * stride_sin + pair[None, :], mask=cs_mask, other=0.0).to(tl.float32)
    if INVERSE:
        sin = -sin
    col = pair[None, :, None] * 2 + two[None, None, :]  # [1, HALF_PAD, 2]: element 2i + j of a row
    mask = cs_mask[:, :, None] & (two[None, None, :] < 2)
    x_offs = pos[:, None, None].to(tl.int64) * sqn + col
    o_offs = pos[:, None, None].to(tl.int64) * son + col
    kx_offs = pos[:, None, None].to(tl.int64) * skn + col
    ko_offs = pos[:, None, None].to(tl.int64) * skon + col
    for i in range(HEADS):
        head = group * HEADS + i
        if head < HQ:
            _rotate_head(Q, QO, batch * sqb + head * sqh, batch * sob + head * soh, x_offs, mask, cos, sin)
        elif head < HQ + HK:
            kh = head - HQ
            _rotate_head(K, KO, batch * skb + kh * skh, batch * skob + kh * skoh, kx_offs, mask, cos, sin)


def _rows_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _fake(q, k, cos, sin, inverse):
    return torch.empty_like(_rows_last(q)), torch.empty_like(_rows_last(k))


@register("lmperf::rope", _fake)
def rope_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by the angles of cos and sin ((>= N, D/2) tables; by the opposite angles
    when `inverse`: the backward). q (B, H, N, D) and k (B, H_kv, N, D); outputs in their
    layouts."""
    check_device(q, "rope")
    q, k, cos, sin = _rows_last(q), _rows_last(k), _rows_last(cos), _rows_last(sin)
    b, hq, n, d = q.shape
    hk = k.shape[1]
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    if q.numel() == 0:
        return qo, ko
    cfg = launch_config(d)
    grid = (cdiv(n, cfg["BLOCK_N"]), b, cdiv(hq + hk, cfg["HEADS"]))
    wrap_triton(_rope_kernel)[grid](
        q, k, qo, ko, cos, sin, n, hq, hk, d // 2, *q.stride()[:3], *k.stride()[:3], *qo.stride()[:3],
        *ko.stride()[:3], cos.stride(0), sin.stride(0), INVERSE=inverse, **cfg)
    return qo, ko


def _setup_context(ctx, inputs, output):
    q, k, cos, sin, inverse = inputs
    ctx.save_for_backward(cos, sin)
    ctx.inverse = inverse


def _backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    dq, dk = rope_op(dq, dk, cos, sin, not ctx.inverse)
    return dq, dk, None, None, None


rope_op.register_autograd(_backward, setup_context=_setup_context)


def check_inputs(q, k, cos, sin) -> None:
    """Raise ValueError naming what is wrong."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"rope takes q (B, H, N, D) and k (B, H_kv, N, D); got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.dtype != k.dtype or q.dtype not in DTYPES:
        raise ValueError(f"rope: q and k must have one dtype of {[str(t) for t in DTYPES]}; got {q.dtype}, {k.dtype}")
    n, d = q.shape[-2:]
    if d % 2:
        raise ValueError(f"rope rotates pairs: the head dim must be even; got {d}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 2 or t.shape[0] < n or t.shape[1] != d // 2:
            raise ValueError(f"rope: {name} must be ({'>='} N = {n}, D/2 = {d // 2}); got {tuple(t.shape)}")
    if len({q.device, k.device, cos.device, sin.device}) != 1:
        raise ValueError(f"rope: q, k, cos and sin must be on one device; got {q.device}, {k.device}, "
                         f"{cos.device}, {sin.device}")


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(apply_rope(q, cos, sin), apply_rope(k, cos, sin)) in one launch; differentiable in q and
    k (cos and sin are the model's fixed tables); works under torch.compile(fullgraph=True)."""
    check_inputs(q, k, cos, sin)
    check_device(q, "rope")
    return rope_op(q, k, cos.detach(), sin.detach(), False)


# ---------------------------------------------------------------------------------------------
# The same computation in PyTorch, and the check against float64


def reference(x, cos, sin):
    """The model's rotation, rope_contract.apply_rope (in x's dtype, with the tables' dtype where
    they meet)."""
    return apply_rope(x, cos, sin)


def compare(q, k, cos, sin, impl=rope) -> list[dict]:
    """Errors of impl(q, k, cos, sin) against float64 (the fp32 tables taken as exact: they are
    the model's), beside `reference` in the inputs' dtype: q and k rotated, dq and dk for random
    gradients; the house rule (attention_contract.tolerance)."""
    dq_out, dk_out = torch.randn_like(q), torch.randn_like(k)
    results = {}
    for name, dt in (("ref", torch.float64), ("torch", q.dtype), ("impl", q.dtype)):
        q_, k_ = (t.detach().to(dt).requires_grad_() for t in (q, k))
        tables = (cos.double(), sin.double()) if dt == torch.float64 else (cos, sin)
        if name == "impl":
            qo, ko = impl(q_, k_, *tables)
        else:
            qo, ko = reference(q_, *tables), reference(k_, *tables)
        torch.autograd.backward([qo, ko], [dq_out.to(qo.dtype), dk_out.to(ko.dtype)])
        results[name] = {"q": qo.detach(), "k": ko.detach(), "dq": q_.grad, "dk": k_.grad}
    rows = []
    for quantity in ("q", "k", "dq", "dk"):
        ref = results["ref"][quantity]
        err = lambda t: float((t.double() - ref).abs().max()) if torch.isfinite(t).all() else float("inf")
        impl_err, torch_err = err(results["impl"][quantity]), err(results["torch"][quantity])
        tol = tolerance(torch_err, q.dtype)
        rows.append({"quantity": quantity, "max_abs_err": impl_err, "torch_err": torch_err, "tolerance": tol,
                     "passed": bool(impl_err <= tol)})
    return rows
