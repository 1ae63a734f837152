"""Float8 training with delayed scaling: nn.Linear layers that multiply in fp8 with scales from
the amax of earlier steps, so no cast waits for a reduction over the tensor it casts.

    state = convert(model)          # every nn.Linear but the LM head, in place
    ... train as before (torch.compile of the blocks or of the whole model works) ...

Each converted layer computes y = x @ w.T as torch._scaled_mm of x and w cast to float8 e4m3,
and its backward dx = dy @ w and dw = dy.T @ x with dy cast to e5m2 (the wider range gradients
need), accumulating in fp32 (the forward with `use_fast_accum`, as torchao's tensorwise recipe).
A tensor's scale is fp8_max / (amax * HEADROOM), amax the largest |value| the tensor had over the
last `history` steps (tensorwise, Transformer Engine's delayed recipe). One Triton kernel
(`float8_cast`, the op lmperf::float8_cast) reads each tensor once and writes it in fp8 in both
layouts torch._scaled_mm needs (row-major, and transposed with the token dimension padded to a
multiple of 16) and its amax; the amaxes reach the next step as the gradient of a zero scalar
each layer passes to its matmul, so nothing in a forward or backward graph is mutated. The first
step, before any history, scales dynamically (the tensor's own amax, one more pass); after it
the scaling is delayed, and a compiled model recompiles once. On a CPU the kernel runs in
Triton's interpreter (TRITON_INTERPRET=1), whose fp8 rounding is wrong where it carries into the
exponent (triton-lang/triton#8322): use it to check code, not numbers.

An lmperf.model.SwiGLU whose three layers are converted runs as one fp8 computation
(Float8SwiGLU): its product h = silu(w1 x) * w3 x is computed in fp32 and cast to fp8 by one
kernel (`float8_swiglu`, which writes both layouts and h's amax, and no 16-bit h), and in the
backward one kernel (`float8_swiglu_backward`) reads dh, a and b and writes the gradients of w1's
and w3's outputs in fp8, each in both layouts with its amax: three cast passes a layer fewer
than three lone layers around a 16-bit product, and no 16-bit copy of h, da or db.
Other layers that read one tensor (q, k and v) cast it once while their parent's forward runs.

`convert` registers a forward pre-hook on the model that, at each forward call of the model,
moves the last step's amaxes into the history and recomputes every layer's scales (a few
kernels for all layers together). Call the model's forward eagerly at the top (compile its
blocks, as lmperf.train does, or call `state.update()` yourself before each step and pass
`hook=False`).

Weights stay the module's own parameters (an optimizer holding them keeps working); only layers
whose in and out features are multiples of 16 (torch._scaled_mm's contract) are converted.
Convert a model on its device: each layer's scales are a view of the State's, which moving the
model would copy apart.

One file of about 485 lines on purpose: the three kernels share their tile loads and stores,
and the two autograd functions the scales, amaxes and layouts those kernels write; split, each
half would need the other's internals.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.library import wrap_triton

from lmperf.kernels.triton_op import INTERPRET, cdiv, check_device, num_warps, register
from lmperf.model import SwiGLU

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HEADROOM = 2.0  # one power of two below the format's largest value: an amax that grows within
# the history's window by up to 2x is still not clamped
X, W, G = range(3)  # rows of a layer's amax and scale: input, weight, output gradient
FP8_MAX = (torch.finfo(E4M3).max, torch.finfo(E4M3).max, torch.finfo(E5M2).max)


# Elements of a program's tile, rows x columns (the interpreter: small, so that tests span
# several programs).
BLOCK_M, BLOCK_K = (16, 16) if INTERPRET else (64, 128)


@triton.jit
def _tile(P, rm, rk, M, K, stride, T: tl.constexpr):
    """P[rm, rk] (rows of M, unit stride along K) as fp32: a (BLOCK_M, BLOCK_K) tile, or with `T`
    the same elements transposed, (BLOCK_K, BLOCK_M), loaded with its indices swapped. A kernel
    loads a tile twice, once each way (the second read hits the cache), rather than tl.trans it:
    Triton 3.6 on the H100 stores a transposed 8-bit tile with elements missing, through fp16 too
    (triton-lang/triton#11111; tests/test_float8_delayed.py)."""
    if T:
        ptrs = P + rm[None, :].to(tl.int64) * stride + rk[:, None]
        return tl.load(ptrs, mask=(rk[:, None] < K) & (rm[None, :] < M), other=0.0).to(tl.float32)
    else:
        ptrs = P + rm[:, None].to(tl.int64) * stride + rk[None, :]
        return tl.load(ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0).to(tl.float32)


@triton.jit
def _store(Y, v, scale, rm, rk, M, K, M_T, FMAX: tl.constexpr, T: tl.constexpr):
    """clamp(v * scale) in Y's dtype: v a row-major tile into Y (M, K), or with `T` a transposed
    one into YT (K, M_T), whose columns M..M_T get the zeros v holds there."""
    y = tl.clamp(v * scale, -FMAX, FMAX).to(Y.dtype.element_ty)
    if T:
        tl.store(Y + rk[:, None].to(tl.int64) * M_T + rm[None, :], y, mask=(rk[:, None] < K) & (rm[None, :] < M_T))
    else:
        tl.store(Y + rm[:, None].to(tl.int64) * K + rk[None, :], y, mask=(rm[:, None] < M) & (rk[None, :] < K))


@triton.jit
def _cast_kernel(X, Y, YT, AMAX, SCALE, M, K, M_T, stride_xm, FMAX: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """One (BLOCK_M, BLOCK_K) tile of x (M, K): y = clamp(x * scale) in fp8, stored row-major in Y
    (M, K) and transposed in YT (K, M_T), whose columns M..M_T are zeros; the tile's max |x| into
    AMAX by an atomic max."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    scale = tl.load(SCALE)
    x = _tile(X, rm, rk, M, K, stride_xm, False)
    _store(Y, x, scale, rm, rk, M, K, M_T, FMAX, False)
    _store(YT, _tile(X, rm, rk, M, K, stride_xm, True), scale, rm, rk, M, K, M_T, FMAX, True)
    tl.atomic_max(AMAX, tl.max(tl.max(tl.abs(x), axis=1), axis=0))


@triton.jit
def _silu_mul(a, b):
    return a * tl.sigmoid(a) * b


@triton.jit
def _swiglu_kernel(A, B, H, HT, AMAX, SCALE, M, K, M_T, stride_am, stride_bm, FMAX: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """One tile of h = silu(a) * b (a, b: (M, K)), in fp32, cast as _cast_kernel casts x: h in
    fp8 row-major and transposed, and the tile's max |h| into AMAX."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    scale = tl.load(SCALE)
    h = _silu_mul(_tile(A, rm, rk, M, K, stride_am, False), _tile(B, rm, rk, M, K, stride_bm, False))
    _store(H, h, scale, rm, rk, M, K, M_T, FMAX, False)
    ht = _silu_mul(_tile(A, rm, rk, M, K, stride_am, True), _tile(B, rm, rk, M, K, stride_bm, True))
    _store(HT, ht, scale, rm, rk, M, K, M_T, FMAX, True)
    tl.atomic_max(AMAX, tl.max(tl.max(tl.abs(h), axis=1), axis=0))


@triton.jit
def _swiglu_grads(g, a, b):
    """(da, db) of h = silu(a) * b for dh = g: s = sigmoid(a), silu'(a) = s (1 + a (1 - s))."""
    s = tl.sigmoid(a)
    return g * b * (s * (1.0 + a * (1.0 - s))), g * a * s


@triton.jit
def _swiglu_backward_kernel(G, A, B, DA, DAT, DB, DBT, AMAX_A, AMAX_B, SCALE_A, SCALE_B, M, K, M_T, stride_gm,
                            stride_am, stride_bm, FMAX: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_K: tl.constexpr):
    """One tile of the gradients (da, db) of h = silu(a) * b from dh = g, in fp32, each cast as
    _cast_kernel casts x (its own scale): row-major and transposed, and its max |.| into its AMAX."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    scale_a, scale_b = tl.load(SCALE_A), tl.load(SCALE_B)
    da, db = _swiglu_grads(_tile(G, rm, rk, M, K, stride_gm, False), _tile(A, rm, rk, M, K, stride_am, False),
                           _tile(B, rm, rk, M, K, stride_bm, False))
    _store(DA, da, scale_a, rm, rk, M, K, M_T, FMAX, False)
    _store(DB, db, scale_b, rm, rk, M, K, M_T, FMAX, False)
    tl.atomic_max(AMAX_A, tl.max(tl.max(tl.abs(da), axis=1), axis=0))
    tl.atomic_max(AMAX_B, tl.max(tl.max(tl.abs(db), axis=1), axis=0))
    dat, dbt = _swiglu_grads(_tile(G, rm, rk, M, K, stride_gm, True), _tile(A, rm, rk, M, K, stride_am, True),
                             _tile(B, rm, rk, M, K, stride_bm, True))
    _store(DAT, dat, scale_a, rm, rk, M, K, M_T, FMAX, True)
    _store(DBT, dbt, scale_b, rm, rk, M, K, M_T, FMAX, True)


def _fake_cast(x, scale, fp8):
    m, k = x.shape
    return (x.new_empty((m, k), dtype=fp8), x.new_empty((k, _round16(m)), dtype=fp8),
            x.new_empty((), dtype=torch.float32))


def _round16(n):
    return (n + 15) // 16 * 16


@register("lmperf::float8_cast", _fake_cast)
def float8_cast(x: torch.Tensor, scale: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor,
                                                                                  torch.Tensor]:
    """(y, yT, amax) of a 2-D x with unit stride along its rows: y = x * scale clamped to fp8's
    range and rounded to `fp8` (M, K), the same transposed (K, M rounded up to 16, the extra
    columns zero: torch._scaled_mm's inner dimension), and max |x| in fp32, all from one read of x."""
    check_device(x, "float8_cast")
    y, yt, amax = _outputs(x, fp8)
    m, k = x.shape
    _launch(_cast_kernel, m, k, x, y, yt, amax, scale, m, k, _round16(m), x.stride(0), fp8=fp8)
    return y, yt, amax


def _launch(kernel, m, k, *args, fp8):
    """kernel over the tiles of an (M, K) tensor (M rounded up to 16 for the transposed copies)."""
    if m and k:
        grid = (cdiv(_round16(m), BLOCK_M), cdiv(k, BLOCK_K))
        wrap_triton(kernel)[grid](*args, FMAX=torch.finfo(fp8).max, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K,
                                  num_warps=num_warps(BLOCK_M * BLOCK_K))


def _outputs(like: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty (y, yT, amax) for an (M, K) tensor cast to fp8 (see float8_cast)."""
    m, k = like.shape
    return (like.new_empty((m, k), dtype=fp8), like.new_empty((k, _round16(m)), dtype=fp8),
            torch.zeros((), dtype=torch.float32, device=like.device))


def _fake_swiglu(a, b, scale, fp8):
    return _fake_cast(a, scale, fp8)


@register("lmperf::float8_swiglu", _fake_swiglu)
def float8_swiglu(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor,
                  fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, hT, amax) of h = silu(a) * b, computed in fp32 from 2-D a and b (unit stride along
    their rows) and cast as float8_cast casts x (`fp8` float32 gives the values before rounding,
    as the tests read them), from one read of a and b: nothing is written in 16 bits."""
    check_device(a, "float8_swiglu")
    if a.shape != b.shape:
        raise ValueError(f"float8_swiglu: a {tuple(a.shape)} and b {tuple(b.shape)} differ in shape")
    h, ht, amax = _outputs(a, fp8)
    m, k = a.shape
    _launch(_swiglu_kernel, m, k, a, b, h, ht, amax, scale, m, k, _round16(m), a.stride(0), b.stride(0), fp8=fp8)
    return h, ht, amax


def _fake_swiglu_backward(g, a, b, scale_a, scale_b, fp8):
    return (*_fake_cast(a, scale_a, fp8), *_fake_cast(b, scale_b, fp8))


@register("lmperf::float8_swiglu_backward", _fake_swiglu_backward)
def float8_swiglu_backward(g: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                           scale_b: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                            torch.Tensor, torch.Tensor, torch.Tensor]:
    """(da, daT, amax da, db, dbT, amax db): the gradients of h = silu(a) * b for dh = g, in fp32
    from one read of g, a and b, each cast as float8_cast casts x with its own scale."""
    check_device(a, "float8_swiglu_backward")
    if not g.shape == a.shape == b.shape:
        raise ValueError(f"float8_swiglu_backward: g {tuple(g.shape)}, a {tuple(a.shape)} and b {tuple(b.shape)} "
                         "differ in shape")
    da, dat, amax_a = _outputs(a, fp8)
    db, dbt, amax_b = _outputs(a, fp8)
    m, k = a.shape
    _launch(_swiglu_backward_kernel, m, k, g, a, b, da, dat, db, dbt, amax_a, amax_b, scale_a, scale_b, m, k,
            _round16(m), g.stride(0), a.stride(0), b.stride(0), fp8=fp8)
    return da, dat, amax_a, db, dbt, amax_b


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def _dynamic_scale(t: torch.Tensor, row: int) -> torch.Tensor:
    """The scale of t from its own amax (the first step, before any history)."""
    return FP8_MAX[row] / (torch.clamp(t.abs().amax().float(), min=1e-12) * HEADROOM)


class _Float8Matmul(torch.autograd.Function):
    """y = x @ w.T in fp8, x given cast (xf row-major, xft transposed, amax_x, its scale sx: one
    cast may serve several layers that read x). `scales` (3,) are the layer's delayed scales (of
    x, w and dy; x's is sx), or None to scale w and dy by their own amax (the first step); `slot`
    a zero (3,) leaf whose gradient becomes this step's (amax x, amax w, amax dy).
    torch._scaled_mm takes its first operand row-major and its second column-major: float8_cast
    writes both layouts of each tensor in one pass."""

    @staticmethod
    def forward(ctx, x, xf, xft, amax_x, sx, w, scales, slot, out_dtype):
        sw = scales[W] if scales is not None else _dynamic_scale(w, W)
        wf, wft, amax_w = float8_cast(_rows(w), sw, E4M3)
        y = torch._scaled_mm(xf, wf.t(), scale_a=sx.reciprocal(), scale_b=sw.reciprocal(), out_dtype=out_dtype,
                             use_fast_accum=True)
        ctx.save_for_backward(xft, wft, sx, sw, amax_x, amax_w, scales[G] if scales is not None else None)
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype, ctx.out_dtype = x.shape, x.dtype, w.dtype, out_dtype
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        xft, wft, sx, sw, amax_x, amax_w, sg = ctx.saved_tensors
        g2 = _rows(gy)
        if sg is None:
            sg = _dynamic_scale(g2, G)
        gf, gft, amax_g = float8_cast(g2, sg, E5M2)
        # dx = dy @ w: w column-major is wT's transpose; dw = dy.T @ x over the tokens, padded with
        # zero columns in gT and xT to a multiple of 16 (zeros add nothing)
        gx = torch._scaled_mm(gf, wft.t(), scale_a=sg.reciprocal(), scale_b=sw.reciprocal(), out_dtype=ctx.out_dtype)
        gw = torch._scaled_mm(gft, xft.t(), scale_a=sg.reciprocal(), scale_b=sx.reciprocal(),
                              out_dtype=torch.float32 if ctx.w_dtype == torch.float32 else ctx.out_dtype)
        amaxes = torch.stack([amax_x, amax_w, amax_g])
        return gx.reshape(ctx.x_shape).to(ctx.x_dtype), None, None, None, None, gw.to(ctx.w_dtype), None, amaxes, None


class _Siblings:
    """The converted layers of one parent module (q, k, v and o of an attention; w1, w2 and w3 of
    a SwiGLU). While the parent's forward runs (`open`, set and cleared by hooks on the parent),
    the first of them to cast an input keeps the cast, and a sibling called on the same tensor
    (k and v after q; w3 after w1) takes it instead of casting again: x is read once, its fp8
    copies written once, and its amax is the same in every sibling's history, so each scales x
    alike. Outside the parent's forward nothing is kept."""

    def __init__(self):
        self.open, self.x, self.cast = False, None, None

    def enter(self, module, args):
        self.open, self.x, self.cast = True, None, None

    def leave(self, module, args, output):
        self.open, self.x, self.cast = False, None, None


class Float8Linear(nn.Linear):
    """An nn.Linear without bias multiplying in fp8 with delayed scaling (made by `convert`).
    Its output dtype is the autocast dtype under autocast, else the input's (an fp32 input's
    product is rounded to bf16 first)."""

    def forward(self, x):
        out_dtype = _out_dtype(x)
        delayed = self.fp8_state.delayed
        siblings = self.fp8_siblings
        if siblings is not None and siblings.x is x:
            xf, xft, amax_x, sx = siblings.cast
        else:
            xf, xft, amax_x, sx = _cast_input(self, x, delayed)
            if siblings is not None and siblings.open and siblings.x is None:
                siblings.x, siblings.cast = x, (xf, xft, amax_x, sx)
        y = _Float8Matmul.apply(x, xf, xft, amax_x, sx, self.weight, self.fp8_scales if delayed else None,
                                self.fp8_slot, out_dtype)
        return y if torch.is_autocast_enabled(x.device.type) or x.dtype == out_dtype else y.to(x.dtype)


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    """A converted layer's output dtype: autocast's under autocast, else x's (bf16 for fp32 x)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


def _cast_input(layer: "Float8Linear", x: torch.Tensor, delayed: bool):
    """(xf, xT, amax, scale) of x, the input of `layer`: its delayed scale, or x's own amax."""
    with torch.no_grad():
        x2 = _rows(x.detach())
        sx = layer.fp8_scales[X] if delayed else _dynamic_scale(x2, X)
        return (*float8_cast(x2, sx, E4M3), sx)


def _mm(a, b, sa, sb, out_dtype, fast=False):
    """a @ b in fp8 with a's and b's scales (the values are a / sa and b / sb)."""
    return torch._scaled_mm(a, b, scale_a=sa.reciprocal(), scale_b=sb.reciprocal(), out_dtype=out_dtype,
                            use_fast_accum=fast)


def _silu_mul_fp32(a, b):
    return F.silu(a.float()) * b.float()


def _silu_mul_grads_fp32(g, a, b):
    a, b, g = a.float(), b.float(), g.float()
    s = torch.sigmoid(a)
    return g * b * s * (1 + a * (1 - s)), g * a * s


class _Float8SwiGLU(torch.autograd.Function):
    """y = w2(silu(w1 x) * w3 x) with its three matmuls in fp8, x given cast (as _Float8Matmul).
    The product h = silu(a) * b is computed and cast to fp8 by one kernel (float8_swiglu), which
    writes both layouts w2's matmuls need and h's amax, and no 16-bit h; in the backward one kernel
    (float8_swiglu_backward) turns dh into da and db in fp8, each in both layouts, for the
    matmuls of w1 and w3. `scales` are the three layers' (3,) delayed scales (w2's input scale is
    h's), or None (the first step: each tensor scaled by its own amax, computed for the
    purpose); `slots` their zero (3,) leaves, whose gradients become this step's amaxes."""

    @staticmethod
    def forward(ctx, x, xf, xft, amax_x, sx, w1, w3, w2, s1, s3, s2, slot1, slot3, slot2, out_dtype):
        delayed = s1 is not None
        sw = [s[W] if delayed else _dynamic_scale(w, W) for w, s in ((w1, s1), (w3, s3), (w2, s2))]
        (w1f, w1ft, amax_w1), (w3f, w3ft, amax_w3), (w2f, w2ft, amax_w2) = (
            float8_cast(_rows(w), s, E4M3) for w, s in zip((w1, w3, w2), sw))
        a = _mm(xf, w1f.t(), sx, sw[0], out_dtype, fast=True)
        b = _mm(xf, w3f.t(), sx, sw[1], out_dtype, fast=True)
        sh = s2[X] if delayed else _dynamic_scale(_silu_mul_fp32(a, b), X)
        hf, hft, amax_h = float8_swiglu(a, b, sh, E4M3)
        y = _mm(hf, w2f.t(), sh, sw[2], out_dtype, fast=True)
        sg = (s1[G], s3[G], s2[G]) if delayed else (None, None, None)
        ctx.save_for_backward(xft, a, b, hft, w1ft, w3ft, w2ft, sx, *sw, sh, amax_x, amax_w1, amax_w3, amax_w2, amax_h,
                              *sg)
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype, ctx.out_dtype = x.shape, x.dtype, w1.dtype, out_dtype
        return y.reshape(*x.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, gy):
        (xft, a, b, hft, w1ft, w3ft, w2ft, sx, sw1, sw3, sw2, sh, amax_x, amax_w1, amax_w3, amax_w2, amax_h,
         sg1, sg3, sg2) = ctx.saved_tensors
        g2 = _rows(gy)
        if sg2 is None:
            sg2 = _dynamic_scale(g2, G)
        gf, gft, amax_g2 = float8_cast(g2, sg2, E5M2)
        wdtype = torch.float32 if ctx.w_dtype == torch.float32 else ctx.out_dtype
        dh = _mm(gf, w2ft.t(), sg2, sw2, ctx.out_dtype)
        dw2 = _mm(gft, hft.t(), sg2, sh, wdtype)
        if sg1 is None:
            da, db = _silu_mul_grads_fp32(dh, a, b)
            sg1, sg3 = _dynamic_scale(da, G), _dynamic_scale(db, G)
        daf, daft, amax_da, dbf, dbft, amax_db = float8_swiglu_backward(dh, a, b, sg1, sg3, E5M2)
        dx = _mm(daf, w1ft.t(), sg1, sw1, ctx.out_dtype) + _mm(dbf, w3ft.t(), sg3, sw3, ctx.out_dtype)
        dw1 = _mm(daft, xft.t(), sg1, sx, wdtype)
        dw3 = _mm(dbft, xft.t(), sg3, sx, wdtype)
        amaxes = (torch.stack([amax_x, amax_w1, amax_da]), torch.stack([amax_x, amax_w3, amax_db]),
                  torch.stack([amax_h, amax_w2, amax_g2]))
        return (dx.reshape(ctx.x_shape).to(ctx.x_dtype), None, None, None, None, dw1.to(ctx.w_dtype),
                dw3.to(ctx.w_dtype), dw2.to(ctx.w_dtype), None, None, None, *amaxes, None)


class Float8SwiGLU(SwiGLU):
    """A SwiGLU (lmperf.model) whose w1, w3 and w2 are Float8Linear layers, run as one fp8
    computation (_Float8SwiGLU, made by `convert`): x is cast once for w1 and w3, and silu(w1 x) *
    w3 x reaches w2 in fp8 from the kernel that computes it, as its gradient reaches w1 and w3.
    The layers keep their weights, scales and histories: the amaxes are theirs as before."""

    def forward(self, x):
        out_dtype = _out_dtype(x)
        delayed = self.w1.fp8_state.delayed
        xf, xft, amax_x, sx = _cast_input(self.w1, x, delayed)
        layers = (self.w1, self.w3, self.w2)
        y = _Float8SwiGLU.apply(x, xf, xft, amax_x, sx, *(m.weight for m in layers),
                                *((m.fp8_scales if delayed else None) for m in layers), *(m.fp8_slot for m in layers),
                                out_dtype)
        return y if torch.is_autocast_enabled(x.device.type) or x.dtype == out_dtype else y.to(x.dtype)


class State:
    """The history and scales of every converted layer of one model (made by `convert`)."""

    def __init__(self, layers: list[Float8Linear], history: int):
        if history < 1:
            raise ValueError(f"float8_delayed: history={history}: at least one step")
        self.layers = layers
        dev = layers[0].weight.device
        self.history = torch.zeros(history, len(layers), 3, device=dev)
        self.scales = torch.ones(len(layers), 3, device=dev)
        self.fp8_max = torch.tensor(FP8_MAX, device=dev)
        self.steps = 0  # amaxes moved into the history so far
        self.delayed = False  # False until the history holds a step: every layer scales dynamically
        for i, layer in enumerate(layers):
            layer.fp8_state = self
            layer.register_buffer("fp8_scales", self.scales[i], persistent=False)  # a view: updated in place
            layer.fp8_slot = torch.zeros(3, device=dev, requires_grad=True)

    def update(self) -> None:
        """Move the amaxes of the last backward into the history and recompute the scales; if a
        layer has none (no backward since the last update: a forward-only call), nothing changes."""
        amaxes = [layer.fp8_slot.grad for layer in self.layers]
        if any(a is None for a in amaxes):
            return
        with torch.no_grad():
            self.history[self.steps % len(self.history)] = torch.stack(amaxes)
            amax = self.history.amax(dim=0)  # rows not yet written are zeros: no amax is below them
            self.scales.copy_(self.fp8_max / (amax.clamp(min=1e-12) * HEADROOM))
        for layer in self.layers:
            layer.fp8_slot.grad = None
        self.steps += 1
        self.delayed = True


def convert(model: nn.Module, skip: tuple[str, ...] = ("lm_head",), history: int = 16,
            hook: bool = True, swiglu: bool = True) -> State:
    """Turn every nn.Linear of `model` (no bias, features multiples of 16; not the modules named
    in `skip`) into a Float8Linear, in place; the returned State holds their history. With
    `swiglu`, each lmperf.model.SwiGLU whose three layers were converted becomes a Float8SwiGLU
    (its product computed and cast in fp8 by one kernel; the model's or a fused kernel's product
    is then not used). With `hook`, a forward pre-hook on `model` calls State.update before each
    forward. ValueError if nothing is converted."""
    layers, parents = [], {}
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or name in skip or module.bias is not None:
            continue
        if module.in_features % 16 or module.out_features % 16:
            continue  # torch._scaled_mm multiplies only multiples of 16: the layer stays as it is
        module.__class__ = Float8Linear
        module.fp8_siblings = None
        layers.append(module)
        parents.setdefault(name.rpartition(".")[0], []).append(module)
    if not layers:
        raise ValueError("float8_delayed.convert: no nn.Linear without bias and with features that are "
                         "multiples of 16 outside `skip`")
    state = State(layers, history)
    for parent, children in parents.items():
        holder = model.get_submodule(parent)
        if swiglu and isinstance(holder, SwiGLU) and all(type(m) is Float8Linear for m in (holder.w1, holder.w2,
                                                                                         holder.w3)):
            holder.__class__ = Float8SwiGLU  # its layers are called by _Float8SwiGLU, not as modules
        elif len(children) > 1:
            siblings = _Siblings()
            for child in children:
                child.fp8_siblings = siblings
            holder.register_forward_pre_hook(siblings.enter)
            holder.register_forward_hook(siblings.leave)
    if hook:
        model.register_forward_pre_hook(lambda module, args: state.update())
    return state
