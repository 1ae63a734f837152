"""RMSNorm fused with the residual add before it, in Triton: (h, y) = (x + delta,
RMSNorm(x + delta) * weight), forward and backward, as PyTorch ops.

The model's block is x + attn(norm1(x)), then + ffn(norm2(.)): every RMSNorm but the first reads
the residual stream right after an add. One kernel reads x and delta (the previous sublayer's
output), writes h (the new residual) and y (the normalised row) and keeps rstd = 1/RMS(h) per
row for the backward; without delta it is a plain RMSNorm. The math is lmperf.model.RMSNorm's:
h in the promoted dtype of x and delta (fp32 for the model's fp32 residual and bf16 sublayer
outputs), then in fp32 h * rstd * weight, rounded once to `out_dtype`. Under autocast the caller
asks for the autocast dtype: the next matmul would cast y to it anyway, so it is written once.

Backward, with n = h * rstd and dn = dy * weight (fp32):
    dh = rstd * (dn - n * mean(dn * n)) + dh_out      (dh_out: the residual's own gradient)
    dx = dh in x's dtype, ddelta = dh in delta's dtype (one tensor when they agree)
    dweight = sum over rows of dy * n
Each backward program walks a contiguous range of rows and keeps its partial dweight in fp32;
the partial sums are added after the kernel in a fixed order (no atomics: one result).

Ops: torch.ops.lmperf.rmsnorm_forward, add_rmsnorm_forward and rmsnorm_backward (triton_op,
see triton_op.py); `add_rmsnorm(x, delta, weight, eps, out_dtype)` on top. `reference` is the
same computation in plain PyTorch, `compare` the float64 check the tests and bench/fused.py share.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from lmperf.kernels.attention_contract import tolerance
from lmperf.kernels.triton_op import INTERPRET, cdiv, check_device, multiprocessors, next_pow2, num_warps, register

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_D = 65536  # one row is one tile
# Elements a program's tile holds: rows of BLOCK_D columns, as many rows as fit (one for the
# 2.7B model's 2,560 -> 4,096). Backward programs per SM: each walks rows one tile at a time.
TILE_ELEMENTS = 1024 if INTERPRET else 4096
BACKWARD_PROGRAMS_PER_SM = 2
# The backward's row loop software-pipelined this deep: the next tiles' loads in flight while one
# is reduced (H100, the 2.7B model's 8,192 x 2,560: 78.6-78.9 us against 98.0 unpipelined, dx the
# same bits; tuning/ladder/NOTES.md, section 6)
BACKWARD_STAGES = 3


def backward_stages(cfg: dict) -> int:
    """The backward's pipeline depth: BACKWARD_STAGES for a tile of TILE_ELEMENTS, none for a
    wider row (one row past 4,096 columns: its stages' buffers of h, dy and dh would not fit in
    shared memory, e.g. 393 KB for 8,193 fp32 columns on an H100's 227 KB)."""
    return BACKWARD_STAGES if cfg["BLOCK_D"] * cfg["ROWS"] <= TILE_ELEMENTS else 1


def launch_config(d: int) -> dict:
    block_d = next_pow2(d)
    rows = max(1, TILE_ELEMENTS // block_d)
    return {"BLOCK_D": block_d, "ROWS": rows, "num_warps": num_warps(block_d * rows)}


# ---------------------------------------------------------------------------------------------
# Kernels


@triton.jit
def _rmsnorm_forward_kernel(X, DELTA, W, H, Y, RSTD, n_rows, D, stride_x, stride_delta, stride_h, stride_y, eps,
                    HAS_DELTA: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < D)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x += tl.load(DELTA + rows[:, None] * stride_delta + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        h = x.to(H.dtype.element_ty)
        tl.store(H + rows[:, None] * stride_h + cols[None, :], h, mask=mask)
        x = h.to(tl.float32)  # the norm reads h as stored (rounded when h is 16-bit)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    w = tl.load(W + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = (x * rstd[:, None]) * w[None, :]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rows < n_rows)


@triton.jit
def _rmsnorm_backward_kernel(DY, DH, H, W, RSTD, DX, DDELTA, DW_PARTS, n_rows, D, rows_per_program,
                     stride_dy, stride_dh, stride_h, stride_dx, stride_ddelta,
                     HAS_DH: tl.constexpr, TWO_OUTPUTS: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
                     STAGES: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    w = tl.load(W + cols, mask=cols < D, other=0.0).to(tl.float32)
    dw = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)  # this program's rows' dy * n, column by column
    first = pid.to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    for start in tl.range(first, last, ROWS, num_stages=STAGES):
        rows = start + tl.arange(0, ROWS)
        mask = (rows[:, None] < last) & (cols[None, :] < D)
        rstd = tl.load(RSTD + rows, mask=rows < last, other=0.0)
        n = tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=mask, other=0.0).to(tl.float32) * rstd[:, None]
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dn = dy * w[None, :]
        dw += dy * n
        dh = (dn - n * (tl.sum(dn * n, axis=1) / D)[:, None]) * rstd[:, None]
        if HAS_DH:
            dh += tl.load(DH + rows[:, None] * stride_dh + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dh.to(DX.dtype.element_ty), mask=mask)
        if TWO_OUTPUTS:
            tl.store(DDELTA + rows[:, None] * stride_ddelta + cols[None, :], dh.to(DDELTA.dtype.element_ty),
                     mask=mask)
    tl.store(DW_PARTS + pid * D + cols, tl.sum(dw, axis=0), mask=cols < D)


# ---------------------------------------------------------------------------------------------
# Launchers and ops


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as (rows, D) with unit column stride (a view where one exists)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _forward(kernel, x, delta, weight, eps: float, out_dtype: torch.dtype):
    """(h or None, y, rstd); h = x + delta in their promoted dtype when delta is given."""
    check_device(x, "add_rmsnorm")
    d = x.shape[-1]
    x2 = _rows(x)
    n_rows = x2.shape[0]
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    h = delta2 = None
    if delta is not None:
        delta2 = _rows(delta)
        h = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, delta.dtype), device=x.device)
    h2, y2 = (h.view(-1, d) if h is not None else None), y.view(-1, d)
    cfg = launch_config(d)
    # without delta, DELTA and H are never dereferenced: they get x, which the kernel only reads
    # (a tensor the kernel writes passed twice would make Inductor copy it)
    kernel[(cdiv(n_rows, cfg["ROWS"]),)](
        x2, delta2 if delta2 is not None else x2, weight.contiguous(), h2 if h2 is not None else x2, y2, rstd,
        n_rows, d,
        x2.stride(0), delta2.stride(0) if delta2 is not None else 0, h2.stride(0) if h2 is not None else 0,
        y2.stride(0), eps, HAS_DELTA=delta is not None, **cfg)
    return h, y, rstd


def _fake_forward(x, weight, eps, out_dtype):
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty(x.shape[:-1], dtype=torch.float32)


def _fake_add_forward(x, delta, weight, eps, out_dtype):
    h = x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, delta.dtype))
    return (h, *_fake_forward(x, weight, eps, out_dtype))


@register("lmperf::rmsnorm_forward", _fake_forward)
def rmsnorm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): y = RMSNorm(x) * weight in out_dtype, rstd = 1/RMS(x) (fp32, x.shape[:-1])."""
    _, y, rstd = _forward(wrap_triton(_rmsnorm_forward_kernel), x, None, weight, eps, out_dtype)
    return y, rstd


@register("lmperf::add_rmsnorm_forward", _fake_add_forward)
def add_rmsnorm_forward(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                        out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, y, rstd): h = x + delta, y = RMSNorm(h) * weight in out_dtype, rstd = 1/RMS(h)."""
    return _forward(wrap_triton(_rmsnorm_forward_kernel), x, delta, weight, eps, out_dtype)


def _fake_backward(dy, dh, h, weight, rstd, dx_dtype, two_outputs, ddelta_dtype):
    ddelta = h.new_empty(h.shape if two_outputs else (0,), dtype=ddelta_dtype)
    return h.new_empty(h.shape, dtype=dx_dtype), ddelta, weight.new_empty(weight.shape)


@register("lmperf::rmsnorm_backward", _fake_backward)
def rmsnorm_backward(dy: torch.Tensor, dh: torch.Tensor | None, h: torch.Tensor, weight: torch.Tensor,
                     rstd: torch.Tensor, dx_dtype: torch.dtype, two_outputs: bool,
                     ddelta_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, ddelta, dweight) from dy (y's gradient), dh (h's own, or None) and the saved h and
    rstd: dx in dx_dtype; ddelta, the same values in ddelta_dtype, when two_outputs (else an
    empty tensor: dx serves both); dweight in weight's dtype."""
    check_device(h, "add_rmsnorm")
    d = h.shape[-1]
    h2, dy2 = _rows(h), _rows(dy)
    dh2 = _rows(dh) if dh is not None else None
    n_rows = h2.shape[0]
    dx = torch.empty(h.shape, dtype=dx_dtype, device=h.device)
    ddelta = torch.empty(h.shape if two_outputs else (0,), dtype=ddelta_dtype, device=h.device)
    cfg = launch_config(d)
    programs = max(1, min(cdiv(n_rows, cfg["ROWS"]), BACKWARD_PROGRAMS_PER_SM * multiprocessors(h.device)))
    rows_per_program = cdiv(cdiv(n_rows, programs), cfg["ROWS"]) * cfg["ROWS"]
    programs = cdiv(n_rows, rows_per_program)
    parts = torch.empty((programs, d), dtype=torch.float32, device=h.device)
    dx2 = dx.view(-1, d)
    ddelta2 = ddelta.view(-1, d) if two_outputs else h2  # not dereferenced without two_outputs
    wrap_triton(_rmsnorm_backward_kernel)[(programs,)](
        dy2, dh2 if dh2 is not None else dy2, h2, weight.contiguous(), rstd, dx2, ddelta2, parts, n_rows, d,
        rows_per_program,
        dy2.stride(0), dh2.stride(0) if dh2 is not None else 0, h2.stride(0), dx2.stride(0), ddelta2.stride(0),
        HAS_DH=dh is not None, TWO_OUTPUTS=two_outputs, STAGES=backward_stages(cfg), **cfg)
    return dx, ddelta, parts.sum(0).to(weight.dtype)


def _save(ctx, h, weight, rstd, x_dtype, delta_dtype):
    ctx.save_for_backward(h, weight, rstd)
    ctx.x_dtype, ctx.delta_dtype = x_dtype, delta_dtype


def _setup_norm(ctx, inputs, output):
    x, weight, _, _ = inputs
    _save(ctx, x, weight, output[1], x.dtype, None)
    ctx.mark_non_differentiable(output[1])


def _setup_add_norm(ctx, inputs, output):
    x, delta, weight, _, _ = inputs
    _save(ctx, output[0], weight, output[2], x.dtype, delta.dtype)
    ctx.mark_non_differentiable(output[2])


def _gradients(ctx, dy, dh):
    h, weight, rstd = ctx.saved_tensors
    dy = torch.zeros(h.shape, dtype=h.dtype, device=h.device) if dy is None else dy
    two = ctx.delta_dtype is not None and ctx.delta_dtype != ctx.x_dtype
    dx, ddelta, dweight = rmsnorm_backward(dy, dh, h, weight, rstd, ctx.x_dtype, two, ctx.delta_dtype or ctx.x_dtype)
    return dx, ddelta if two else dx, dweight


def _backward_norm(ctx, dy, drstd):
    dx, _, dweight = _gradients(ctx, dy, None)
    return dx, dweight, None, None


def _backward_add_norm(ctx, dh, dy, drstd):
    dx, ddelta, dweight = _gradients(ctx, dy, dh)
    return dx, ddelta, dweight, None, None


rmsnorm_forward.register_autograd(_backward_norm, setup_context=_setup_norm)
add_rmsnorm_forward.register_autograd(_backward_add_norm, setup_context=_setup_add_norm)


def check_inputs(x, delta, weight) -> None:
    """Raise ValueError naming what is wrong."""
    if x.dtype not in DTYPES or (delta is not None and delta.dtype not in DTYPES):
        raise ValueError(f"add_rmsnorm takes {[str(t) for t in DTYPES]}; got x {x.dtype}"
                         + (f", delta {delta.dtype}" if delta is not None else ""))
    if x.dim() < 1 or x.shape[-1] < 1 or x.shape[-1] > MAX_D:
        raise ValueError(f"add_rmsnorm: the normalised (last) dim must have 1 to {MAX_D} elements; "
                         f"x is {tuple(x.shape)}")
    if delta is not None and (delta.shape != x.shape or delta.device != x.device):
        raise ValueError(f"add_rmsnorm: delta {tuple(delta.shape)} on {delta.device} must match x "
                         f"{tuple(x.shape)} on {x.device}")
    if weight.shape != x.shape[-1:] or weight.device != x.device:
        raise ValueError(f"add_rmsnorm: weight {tuple(weight.shape)} must be ({x.shape[-1]},) on {x.device}")


def add_rmsnorm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, y): h = x + delta (x itself when delta is None), y = RMSNorm(h) * weight in out_dtype
    (h's dtype when None). Differentiable in x, delta and weight; works under
    torch.compile(fullgraph=True)."""
    check_inputs(x, delta, weight)
    check_device(x, "add_rmsnorm")
    h_dtype = x.dtype if delta is None else torch.promote_types(x.dtype, delta.dtype)
    out_dtype = out_dtype or h_dtype
    if delta is None:
        return x, rmsnorm_forward(x, weight, eps, out_dtype)[0]
    h, y, _ = add_rmsnorm_forward(x, delta, weight, eps, out_dtype)
    return h, y


# ---------------------------------------------------------------------------------------------
# The same computation in PyTorch, and the check against float64


def reference(x, delta, weight, eps: float, out_dtype: torch.dtype, dtype=None):
    """(h, y) as lmperf.model computes them (the residual add, then RMSNorm's fp32 math, then
    autocast's cast to out_dtype), with x, delta and weight in `dtype` (float64 for the
    reference; None: as they are)."""
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    h = cast(x) if delta is None else cast(x) + cast(delta)
    h32 = h.double() if dtype == torch.float64 else h.float()
    y = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps) * cast(weight)
    return h, y.to(h.dtype).to(torch.float64 if dtype == torch.float64 else out_dtype)


def compare(x, delta, weight, eps: float, out_dtype: torch.dtype, impl=add_rmsnorm) -> list[dict]:
    """Errors of impl(x, delta, weight, eps, out_dtype) -> (h, y) against float64, beside
    `reference` run in the inputs' own dtypes (the model's code), forward (h, y) and backward
    (dx, ddelta, dweight) for random gradients of y and h. The house rule (attention_contract):
    at most twice PyTorch's error, plus a floor of the output's dtype."""
    dy = torch.randn(x.shape, dtype=out_dtype, device=x.device)
    h_dtype = x.dtype if delta is None else torch.promote_types(x.dtype, delta.dtype)
    dh = torch.randn(x.shape, dtype=h_dtype, device=x.device) if delta is not None else None
    results = {}
    for name, fn, dt in (("ref", reference, torch.float64), ("torch", reference, None), ("impl", impl, None)):
        leaves = [t.detach().to(dt or t.dtype).requires_grad_() if t is not None else None for t in (x, delta, weight)]
        if name == "impl":
            h, y = fn(*leaves, eps, out_dtype)
        else:
            h, y = fn(*leaves, eps, out_dtype, dt)
        grads = [dy.to(y.dtype)] + ([dh.to(h.dtype)] if delta is not None else [])
        torch.autograd.backward([y] + ([h] if delta is not None else []), grads)
        results[name] = {"y": y.detach(), "h": h.detach(), "dx": leaves[0].grad,
                         "ddelta": leaves[1].grad if delta is not None else None, "dweight": leaves[2].grad}
    rows = []
    for quantity in ("y", "h", "dx", "ddelta", "dweight"):
        if results["ref"][quantity] is None or (quantity == "h" and delta is None):
            continue
        ref = results["ref"][quantity].double()
        err = lambda t: float((t.double() - ref).abs().max()) if torch.isfinite(t).all() else float("inf")
        impl_err, torch_err = err(results["impl"][quantity]), err(results["torch"][quantity])
        tol = tolerance(torch_err, results["torch"][quantity].dtype)
        rows.append({"quantity": quantity, "max_abs_err": impl_err, "torch_err": torch_err, "tolerance": tol,
                     "passed": bool(impl_err <= tol)})
    return rows
