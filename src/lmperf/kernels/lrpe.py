"""Multi-dimensional LRPE-cosine (Qin et al., TMLR 2023): x -> [x cos(Theta), x sin(Theta)].

x has shape (b, h, N, d) with N = l + n_1 * ... * n_m: first l extra tokens (Theta = 0), then
the tokens of an (n_1, ..., n_m) grid in row-major order (last axis fastest). A grid token's
coordinates (p_1, ..., p_m) are the mixed-radix digits of its index. Feature f = k*e + j
(axis k, 0 <= j < e) gets Theta = p_{k+1} * theta[h, j]; theta has shape (h, e) and m*e >= d, so
features are handed out axis by axis until d runs out. The output (b, h, N, 2d) is computed in
fp32 and returned in x's dtype; dx = dO_cos * cos(Theta) + dO_sin * sin(Theta).

Implementations (`impl`):
- "torch": a vectorized reference (autograd does the backward);
- "triton": angles computed on the fly, forward and backward; nothing of size N x d is kept;
- "triton_cache": the forward also writes the fp32 angle table (h, N, d) and the backward
  reads it instead of recomputing the angles.
The Triton kernels own a tile of tokens of one head: Theta, cos and sin depend on (head,
token, feature) only, so each program computes them once and streams every batch element
through them.

The Triton impls are also PyTorch ops (torch.ops.lmperf.lrpe_forward, lrpe_forward_cached,
lrpe_backward; torch.library.triton_op), which torch.compile(fullgraph=True) traces forward and
backward; eager calls take an autograd.Function over the same launchers (less host time).

Why one file of ~470 lines: as in the Triton tutorials, the kernel, its launchers, the ops, the
PyTorch reference and the float64 contract (`compare`, shared by tests and benchmark) sit side
by side, and the workflow reruns the LRPE jobs when this one file changes.
"""
from __future__ import annotations

import functools
import math
import os
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

IMPLS = ("torch", "triton", "triton_cache")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_AXES = 8
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def check_inputs(x, theta, shape, l, impl) -> tuple[int, ...]:
    """Raise ValueError naming what is wrong (RuntimeError where Triton cannot run on x's
    device); return the grid shape as a tuple of ints."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; choose one of {IMPLS}")
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a tensor of shape (b, h, N, d); got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in DTYPES:
        raise ValueError(f"x has dtype {x.dtype}; use one of {[str(t) for t in DTYPES]}")
    if not isinstance(theta, torch.Tensor) or theta.dim() != 2:
        raise ValueError("theta must be a tensor of shape (h, e)")
    if not theta.dtype.is_floating_point:
        raise ValueError(f"theta must be a floating-point tensor; got {theta.dtype}")
    if theta.device != x.device:
        raise ValueError(f"x is on {x.device} but theta is on {theta.device}")
    if impl != "torch" and x.device.type != "cuda" and not INTERPRET:
        raise RuntimeError(f"impl={impl!r} runs Triton kernels, which need CUDA tensors; x is on "
                           f"{x.device}. On a CPU, set TRITON_INTERPRET=1 in the environment before "
                           f"this module is imported (Triton's interpreter), or use impl='torch'")
    b, h, n, d = x.shape
    if theta.shape[0] != h:
        raise ValueError(f"theta has {theta.shape[0]} heads but x has {h}")
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a sequence of positive ints; got {shape!r}") from None
    if not shape or any(s < 1 for s in shape) or len(shape) > MAX_AXES:
        raise ValueError(f"shape must have 1 to {MAX_AXES} positive sizes; got {shape}")
    if not isinstance(l, int) or l < 0:
        raise ValueError(f"l (extra tokens) must be an int >= 0; got {l!r}")
    if n != l + math.prod(shape):
        raise ValueError(f"x has N={n} tokens but l + prod(shape) = {l} + {math.prod(shape)} "
                         f"= {l + math.prod(shape)}")
    e = theta.shape[1]
    if len(shape) * e < d:
        raise ValueError(f"m * e = {len(shape)} * {e} = {len(shape) * e} < d = {d}: "
                         f"not every feature gets an angle")
    return shape


# ---------------------------------------------------------------------------------------------
# Reference


def angle_table(theta: torch.Tensor, shape: tuple[int, ...], l: int, d: int) -> torch.Tensor:
    """Theta of every (head, token, feature): fp32, shape (h, l + prod(shape), d)."""
    m, e = len(shape), theta.shape[1]
    axes = [torch.arange(n, device=theta.device) for n in shape]
    coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, m)  # row-major
    f = torch.arange(d, device=theta.device)
    pos = coords[:, f // e].float()                                 # (G, d): p of feature's axis
    grid_angles = pos[None] * theta.float()[:, f % e][:, None, :]   # (h, G, d)
    extra = grid_angles.new_zeros(theta.shape[0], l, d)
    return torch.cat([extra, grid_angles], dim=1)


def lrpe_torch(x, theta, shape, l):
    angles = angle_table(theta, shape, l, x.shape[-1])
    x32 = x.float()
    return torch.cat([x32 * angles.cos(), x32 * angles.sin()], dim=-1).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Triton


@triton.jit
def _angles(theta_ptr, dims, strides, head, rows, cols, l, e, d, M: tl.constexpr):
    """Theta for a (BLOCK_N, BLOCK_D) tile of one head, fp32; 0 for extra tokens."""
    g = rows - l                                   # index inside the grid (negative: extra token)
    axis = cols // e
    j = cols - axis * e
    pos = tl.zeros([rows.shape[0], cols.shape[0]], tl.int32)
    for k in tl.static_range(M):                   # each row's coordinate on each axis, once
        coord = (tl.maximum(g, 0) // strides[k]) % dims[k]
        pos = tl.where(axis[None, :] == k, coord[:, None], pos)
    freq = tl.load(theta_ptr + head * e + j, mask=cols < d, other=0.0).to(tl.float32)
    angle = pos.to(tl.float32) * freq[None, :]
    return tl.where(g[:, None] >= 0, angle, 0.0)


@triton.jit
def sincos(a):
    """(sin a, cos a) in fp32 with one shared range reduction: a = k pi/2 + r, |r| <= pi/4, in
    three Cody-Waite steps (the first two exact for |k| < 2^13 even without fma), then Cephes'
    minimax polynomials for sin r and cos r and a quadrant swap. Absolute error about 1e-7 for
    |a| up to 2e5 (tests/test_lrpe.py::test_sincos_matches_float64). libdevice's sinf and cosf
    each reduce on their own and carry a slow path for huge arguments: twice the work, which
    the batch split (_grid) repeats per part."""
    k = tl.floor(a * 0.636619772367581343 + 0.5)
    r = tl.fma(-k, 1.5703125, a)
    r = tl.fma(-k, 4.837512969970703125e-4, r)
    r = tl.fma(-k, 7.54978995489188216e-8, r)
    z = r * r
    sin_r = tl.fma((tl.fma(tl.fma(z, -1.9515295891e-4, 8.3321608736e-3), z, -1.6666654611e-1)) * z, r, r)
    cos_r = tl.fma(tl.fma(tl.fma(z, 2.443315711809948e-5, -1.388731625493765e-3), z,
                          4.166664568298827e-2) * z, z, tl.fma(z, -0.5, 1.0))
    q = k.to(tl.int32) & 3
    swap = (q & 1) != 0
    s = tl.where(swap, cos_r, sin_r)
    c = tl.where(swap, sin_r, cos_r)
    return tl.where((q & 2) != 0, -s, s), tl.where(((q + 1) & 2) != 0, -c, c)


@triton.jit
def _offsets(head, rows, cols, stride_b, stride_h, stride_n, WIDE: tl.constexpr):
    """Offsets of a (BLOCK_N, BLOCK_D) tile of one head, and the batch stride: in int64 only
    when the tensor has 2^31 elements or more (WIDE), since 64-bit index math costs
    instructions per element that the small, compute-bound grids feel."""
    if WIDE:
        off = head.to(tl.int64) * stride_h + rows[:, None].to(tl.int64) * stride_n + cols[None, :]
        stride_b = tl.cast(stride_b, tl.int64)
    else:
        off = head * stride_h + rows[:, None] * stride_n + cols[None, :]
    return off, stride_b


# The tile: tokens per program (BLOCK_N) and warps, and the batch-split target. From the H100
# sweeps (tuning/lrpe/NOTES.md; tuning/lrpe/data/lrpe_sweep_h100*.csv): with the
# shared-reduction sine and cosine (commit aa48c7c33985), 2K-element tiles with 4 warps and 16
# programs per SM were the fastest setting at nearly every size, forward and backward.
# The interpreter takes 32-token tiles so that tests cover several tiles per grid.
TILE_ELEMENTS, NUM_WARPS = 2048, 4
# Below this many programs per SM the batch is split over more programs, each with at least
# MIN_BATCH_PER_PROGRAM batch elements (see _grid).
# Two elements a part halve the angle math per element where the split would otherwise go
# down to one (grids of < 30 tiles x heads): there the kernel is bound by instructions, and
# the prologue (angles, sine, cosine: about 40 instructions an element) outweighs the loop
# (about 8) five to one (PTX of sm_90, tuning/lrpe/NOTES.md).
PROGRAMS_PER_SM, MIN_BATCH_PER_PROGRAM = 16, 2
# 64-bit offsets: "auto" uses them only for tensors of 2^31 elements or more (see _offsets).
WIDE_OFFSETS = "auto"


def wide_offsets(*tensors: torch.Tensor) -> bool:
    if WIDE_OFFSETS != "auto":
        return bool(WIDE_OFFSETS)
    return max(t.numel() for t in tensors) >= 2**31 - 1


def launch_config(d: int) -> dict:
    block_d = max(16, triton.next_power_of_2(d))
    if INTERPRET:
        return {"BLOCK_N": 32, "BLOCK_D": block_d, "num_warps": 4}
    return {"BLOCK_N": max(1, TILE_ELEMENTS // block_d), "BLOCK_D": block_d, "num_warps": NUM_WARPS}


# Both kernels issue the load of their first batch element before the angle math, so that its
# latency overlaps the trigonometry, and the load of the next element before storing the
# current one (the last iteration's "next" load is fully masked: no memory traffic).


@triton.jit
def _lrpe_fwd_kernel(X, OUT, ANGLES, theta_ptr, D0, D1, D2, D3, D4, D5, D6, D7,
                     S0, S1, S2, S3, S4, S5, S6, S7, B, H, N, l, e, d,
                     stride_xb, stride_xh, stride_xn, stride_ob, stride_oh, stride_on,
                     M: tl.constexpr, CACHE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     WIDE: tl.constexpr):
    # The grid's sizes (D*) and row-major strides (S*); only the first M are read (see _axes_args).
    dims, strides = (D0, D1, D2, D3, D4, D5, D6, D7), (S0, S1, S2, S3, S4, S5, S6, S7)
    tile, head, part, parts = tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(2)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < N) & (cols[None, :] < d)
    x_off, stride_xb = _offsets(head, rows, cols, stride_xb, stride_xh, stride_xn, WIDE)
    o_off, stride_ob = _offsets(head, rows, cols, stride_ob, stride_oh, stride_on, WIDE)
    b0, b1 = part * B // parts, (part + 1) * B // parts
    x = tl.load(X + b0 * stride_xb + x_off, mask=mask, other=0.0).to(tl.float32)
    angle = _angles(theta_ptr, dims, strides, head, rows, cols, l, e, d, M)
    if CACHE:  # write the angle table for the backward
        tl.store(ANGLES + (head * N + rows[:, None]).to(tl.int64) * d + cols[None, :], angle, mask=mask)
    sin, cos = sincos(angle)
    for b in range(b0, b1):  # the same angles serve every batch element of this part
        # where(more, mask, False), not mask & more: the same code once compiled, and Triton
        # 3.9's interpreter splats a scalar int1 to int32, which its masked load refuses
        x_next = tl.load(X + (b + 1) * stride_xb + x_off, mask=tl.where(b + 1 < b1, mask, False),
                         other=0.0).to(tl.float32)
        out = OUT + b * stride_ob + o_off
        tl.store(out, (x * cos).to(OUT.dtype.element_ty), mask=mask)
        tl.store(out + d, (x * sin).to(OUT.dtype.element_ty), mask=mask)
        x = x_next


@triton.jit
def _lrpe_bwd_kernel(DO, DX, ANGLES, theta_ptr, D0, D1, D2, D3, D4, D5, D6, D7,
                     S0, S1, S2, S3, S4, S5, S6, S7, B, H, N, l, e, d,
                     stride_ob, stride_oh, stride_on, stride_xb, stride_xh, stride_xn,
                     M: tl.constexpr, CACHE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     WIDE: tl.constexpr):
    dims, strides = (D0, D1, D2, D3, D4, D5, D6, D7), (S0, S1, S2, S3, S4, S5, S6, S7)
    tile, head, part, parts = tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(2)
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < N) & (cols[None, :] < d)
    o_off, stride_ob = _offsets(head, rows, cols, stride_ob, stride_oh, stride_on, WIDE)
    x_off, stride_xb = _offsets(head, rows, cols, stride_xb, stride_xh, stride_xn, WIDE)
    b0, b1 = part * B // parts, (part + 1) * B // parts
    do = DO + b0 * stride_ob + o_off
    do_cos = tl.load(do, mask=mask, other=0.0).to(tl.float32)
    do_sin = tl.load(do + d, mask=mask, other=0.0).to(tl.float32)
    if CACHE:  # read the angle table the forward wrote
        angle = tl.load(ANGLES + (head * N + rows[:, None]).to(tl.int64) * d + cols[None, :],
                        mask=mask, other=0.0)
    else:
        angle = _angles(theta_ptr, dims, strides, head, rows, cols, l, e, d, M)
    sin, cos = sincos(angle)
    for b in range(b0, b1):
        more = tl.where(b + 1 < b1, mask, False)  # see the forward
        do = DO + (b + 1) * stride_ob + o_off
        next_cos = tl.load(do, mask=more, other=0.0).to(tl.float32)
        next_sin = tl.load(do + d, mask=more, other=0.0).to(tl.float32)
        tl.store(DX + b * stride_xb + x_off,
                 (do_cos * cos + do_sin * sin).to(DX.dtype.element_ty), mask=mask)
        do_cos, do_sin = next_cos, next_sin


def _grid(b: int, n: int, h: int, block_n: int, device: torch.device) -> tuple[int, int, int]:
    """(token tiles, heads, batch parts). A program streams its batch elements through one tile
    of angles; when tiles x heads alone would not fill the GPU (small grids), the batch is
    split over more programs, each recomputing the tile's angles, so that the loads of
    different batch elements are in flight at once instead of one after another; a part keeps
    at least MIN_BATCH_PER_PROGRAM elements, so the angles are not recomputed for every one."""
    tiles = triton.cdiv(n, block_n)
    fill = triton.cdiv(PROGRAMS_PER_SM * _multiprocessors(device), tiles * h)
    return tiles, h, max(1, min(triton.cdiv(b, MIN_BATCH_PER_PROGRAM), fill))


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # the interpreter: small enough that tests cover both split and unsplit grids
    return torch.cuda.get_device_properties(device).multi_processor_count


def _axes_args(shape) -> tuple[int, ...]:
    """The grid's sizes, then its row-major strides, each padded with 1s to MAX_AXES: plain
    ints passed by value (a device tensor for them would be an allocation of its own, and a
    tuple argument is what Inductor cannot pass to a user-defined Triton kernel)."""
    pad = (1,) * (MAX_AXES - len(shape))
    strides = tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))
    return (*shape, *pad, *strides, *pad)


# ---------------------------------------------------------------------------------------------
# Launchers, and the two ways in: an autograd.Function for eager calls, and PyTorch ops
# (torch.ops.lmperf.lrpe_forward, lrpe_forward_cached, lrpe_backward) for torch.compile.
# Both run the same launchers, given the kernel: wrap_triton(kernel) inside the ops, so that
# Inductor sees the kernels (and torch.library finds them, for its compile caches' keys), the
# plain kernel in eager. Eager calls skip the ops because the
# custom-op dispatch (schema defaults, redispatch, its own autograd wrapper) doubles the host
# time of a call, which is what the small benchmark cases measure.


def _launch_forward(kernel, x, theta, shape, l, cache: bool):
    """(output, the fp32 angle table (h, N, d) if `cache` else None). Without the cache the
    kernel's ANGLES argument is never dereferenced; it gets theta, so that no tensor the kernel
    writes is passed twice (Inductor's functionalization of a kernel would copy it)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    b, h, n, d = x.shape
    theta = theta.contiguous()
    out = torch.empty(b, h, n, 2 * d, dtype=x.dtype, device=x.device)
    angles = torch.empty(h, n, d, dtype=torch.float32, device=x.device) if cache else None
    cfg = launch_config(d)
    kernel[_grid(b, n, h, cfg["BLOCK_N"], x.device)](
        x, out, theta if angles is None else angles, theta, *_axes_args(shape), b, h, n, l,
        theta.shape[1], d, x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1),
        out.stride(2), M=len(shape), CACHE=cache, WIDE=wide_offsets(x, out), **cfg)
    return out, angles


def _launch_backward(kernel, grad_out, theta, angles, shape, l):
    """dx from dO (b, h, N, 2d); the angles from `angles` (the cached forward's table) when
    it is not None, else computed again (ANGLES gets theta, as in the forward)."""
    grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    b, h, n, d2 = grad_out.shape
    d = d2 // 2
    theta = theta.contiguous()
    dx = torch.empty(b, h, n, d, dtype=grad_out.dtype, device=grad_out.device)
    cfg = launch_config(d)
    kernel[_grid(b, n, h, cfg["BLOCK_N"], grad_out.device)](
        grad_out, dx, theta if angles is None else angles, theta, *_axes_args(shape), b, h, n, l,
        theta.shape[1], d, grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
        dx.stride(0), dx.stride(1), dx.stride(2), M=len(shape), CACHE=angles is not None,
        WIDE=wide_offsets(grad_out, dx), **cfg)
    return dx


class _LRPETriton(torch.autograd.Function):
    """Eager calls: saves theta, plus the angle table when `cache`."""

    @staticmethod
    def forward(ctx, x, theta, shape, l, cache):
        out, angles = _launch_forward(_lrpe_fwd_kernel, x, theta, shape, l, cache)
        ctx.save_for_backward(theta, *([angles] if cache else []))
        ctx.shape, ctx.l = shape, l
        return out

    @staticmethod
    def backward(ctx, grad_out):
        theta, *angles = ctx.saved_tensors
        dx = _launch_backward(_lrpe_bwd_kernel, grad_out, theta, angles[0] if angles else None,
                              ctx.shape, ctx.l)
        return dx, None, None, None, None


# The ops. Their fake implementations give shapes without launching anything (under
# TRITON_INTERPRET wrap_triton hands back the plain interpreted kernel, which cannot run on
# fake tensors). Inputs are checked once, in lrpe_cosine_md.


@triton_op("lmperf::lrpe_forward", mutates_args=())
def lrpe_forward(x: torch.Tensor, theta: torch.Tensor, shape: list[int], l: int) -> torch.Tensor:
    """[x cos(Theta), x sin(Theta)], angles computed on the fly."""
    return _launch_forward(wrap_triton(_lrpe_fwd_kernel), x, theta, shape, l, False)[0]


@triton_op("lmperf::lrpe_forward_cached", mutates_args=())
def lrpe_forward_cached(x: torch.Tensor, theta: torch.Tensor, shape: list[int],
                        l: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, the fp32 angle table (h, N, d) for the backward)."""
    return _launch_forward(wrap_triton(_lrpe_fwd_kernel), x, theta, shape, l, True)


@triton_op("lmperf::lrpe_backward", mutates_args=())
def lrpe_backward(grad_out: torch.Tensor, theta: torch.Tensor, angles: Optional[torch.Tensor],
                  shape: list[int], l: int) -> torch.Tensor:
    """dx = dO_cos cos(Theta) + dO_sin sin(Theta), the angles from `angles` when given."""
    return _launch_backward(wrap_triton(_lrpe_bwd_kernel), grad_out, theta, angles, shape, l)


@lrpe_forward.register_fake
def _(x, theta, shape, l):
    b, h, n, d = x.shape
    return x.new_empty(b, h, n, 2 * d)


@lrpe_forward_cached.register_fake
def _(x, theta, shape, l):
    b, h, n, d = x.shape
    return x.new_empty(b, h, n, 2 * d), x.new_empty(h, n, d, dtype=torch.float32)


@lrpe_backward.register_fake
def _(grad_out, theta, angles, shape, l):
    b, h, n, d2 = grad_out.shape
    return grad_out.new_empty(b, h, n, d2 // 2)


def _save_theta(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])
    ctx.shape, ctx.l = inputs[2], inputs[3]


def _save_theta_and_angles(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], output[1])
    ctx.shape, ctx.l = inputs[2], inputs[3]
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_out, *grad_angles):
    theta, *angles = ctx.saved_tensors
    dx = lrpe_backward(grad_out, theta, angles[0] if angles else None, ctx.shape, ctx.l)
    return dx, None, None, None


lrpe_forward.register_autograd(_backward, setup_context=_save_theta)
lrpe_forward_cached.register_autograd(_backward, setup_context=_save_theta_and_angles)


def lrpe_cosine_md(x: torch.Tensor, theta: torch.Tensor, shape, l: int = 0,
                   impl: str = "triton") -> torch.Tensor:
    """[x cos(Theta), x sin(Theta)] for x (b, h, l + prod(shape), d) and theta (h, e); see the
    module docstring. Differentiable with respect to x; theta is a fixed buffer. Works under
    torch.compile(fullgraph=True), forward and backward."""
    shape = check_inputs(x, theta, shape, l, impl)
    theta = theta.detach()
    if impl == "torch":
        return lrpe_torch(x, theta, shape, l)
    if not torch.compiler.is_compiling():
        return _LRPETriton.apply(x, theta, shape, l, impl == "triton_cache")
    if impl == "triton":
        return lrpe_forward(x, theta, list(shape), l)
    return lrpe_forward_cached(x, theta, list(shape), l)[0]


# ---------------------------------------------------------------------------------------------
# Checking against float64

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def reference_float64(x, theta, shape, l):
    """An implementation independent of `angle_table`: coordinates by enumerating the grid in
    row-major order, features assigned one by one, everything in float64."""
    import itertools

    b, h, n, d = x.shape
    e = theta.shape[1]
    angles = torch.zeros(h, n, d, dtype=torch.float64, device=x.device)
    coords = torch.tensor(list(itertools.product(*[range(s) for s in shape])), dtype=torch.float64,
                          device=x.device).reshape(-1, len(shape))
    for f in range(d):
        axis, j = divmod(f, e)
        angles[:, l:, f] = coords[:, axis][None, :] * theta[:, j].double()[:, None]
    x64 = x.double()
    return torch.cat([x64 * angles.cos(), x64 * angles.sin()], dim=-1), angles


def tolerance(ref: torch.Tensor, angles: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> float:
    """Error model of an fp32 computation returned in `dtype`: twice the rounding of the exact
    result to `dtype`, plus what fp32 angles cost (|dTheta| <= 2 u32 |Theta|, times |x|)."""
    rounding = float((ref.to(dtype).double() - ref).abs().max())
    angle_err = 2 * UNIT_ROUNDOFF[torch.float32] * float(angles.abs().max()) * float(x.abs().max())
    return 2 * rounding + 4 * angle_err + 1e-12


def compare(x: torch.Tensor, theta: torch.Tensor, shape, l: int, impl: str,
            grad_out: torch.Tensor | None = None) -> list[dict]:
    """Errors of lrpe_cosine_md(impl) against float64 (`reference_float64`), forward and dx, in
    x's dtype; the one check the tests and the benchmark's check share. grad_out is dO
    (standard normal in x's dtype when None). Returns one dict per quantity ("out", "dx"):
    max_abs_err, tolerance (`tolerance`), passed."""
    x = x.detach().requires_grad_()
    out = lrpe_cosine_md(x, theta, shape, l, impl)
    if out.shape != (*x.shape[:-1], 2 * x.shape[-1]) or out.dtype != x.dtype:
        raise AssertionError(f"{impl}: output {tuple(out.shape)} {out.dtype} for x {tuple(x.shape)} {x.dtype}")
    grad_out = torch.randn_like(out) if grad_out is None else grad_out
    out.backward(grad_out)
    ref, angles = reference_float64(x.detach(), theta, shape, l)
    g64, d = grad_out.double(), x.shape[-1]
    dx_ref = g64[..., :d] * angles.cos() + g64[..., d:] * angles.sin()
    rows = []
    for quantity, got, want, scale in (("out", out.detach(), ref, x.detach()), ("dx", x.grad, dx_ref, g64)):
        err = float((got.double() - want).abs().max())  # nan if got has a nan: fails
        tol = tolerance(want, angles, scale, x.dtype)
        rows.append({"quantity": quantity, "max_abs_err": err, "tolerance": tol, "passed": bool(err <= tol)})
    return rows
