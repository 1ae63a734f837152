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

`convert` registers a forward pre-hook on the model that, at each forward call of the model,
moves the last step's amaxes into the history and recomputes every layer's scales (a few
kernels for all layers together). Call the model's forward eagerly at the top (compile its
blocks, as lmperf.train does, or call `state.update()` yourself before each step and pass
`hook=False`).

Weights stay the module's own parameters (an optimizer holding them keeps working); only layers
whose in and out features are multiples of 16 (torch._scaled_mm's contract) are converted.
Convert a model on its device: each layer's scales are a view of the State's, which moving the
model would copy apart.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.library import wrap_triton

from lmperf.kernels.triton_op import INTERPRET, cdiv, check_device, num_warps, register

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HEADROOM = 2.0  # one power of two below the format's largest value: an amax that grows within
# the history's window by up to 2x is still not clamped
X, W, G = range(3)  # rows of a layer's amax and scale: input, weight, output gradient
FP8_MAX = (torch.finfo(E4M3).max, torch.finfo(E4M3).max, torch.finfo(E5M2).max)


# Elements of a program's tile, rows x columns (the interpreter: small, so that tests span
# several programs).
BLOCK_M, BLOCK_K = (16, 16) if INTERPRET else (64, 128)


@triton.jit
def _cast_kernel(X, Y, YT, AMAX, SCALE, M, K, M_T, stride_xm, FMAX: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """One (BLOCK_M, BLOCK_K) tile of x (M, K): y = clamp(x * scale) in fp8, stored row-major in Y
    (M, K) and transposed in YT (K, M_T), whose columns M..M_T are zeros; the tile's max |x| into
    AMAX by an atomic max. The transpose is the tile loaded again with its indices swapped (from
    the cache: x still costs one read of memory), not tl.trans: Triton 3.6 on the H100 stores a
    transposed 8-bit tile with elements missing, through fp16 too (tests/test_float8_delayed.py)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    scale = tl.load(SCALE)
    inside = (rm[:, None] < M) & (rk[None, :] < K)
    x = tl.load(X + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=inside, other=0.0).to(tl.float32)
    y = tl.clamp(x * scale, -FMAX, FMAX).to(Y.dtype.element_ty)
    tl.store(Y + rm[:, None].to(tl.int64) * K + rk[None, :], y, mask=inside)
    xt = tl.load(X + rm[None, :].to(tl.int64) * stride_xm + rk[:, None], mask=(rk[:, None] < K) & (rm[None, :] < M),
                 other=0.0).to(tl.float32)
    yt = tl.clamp(xt * scale, -FMAX, FMAX).to(YT.dtype.element_ty)
    tl.store(YT + rk[:, None].to(tl.int64) * M_T + rm[None, :], yt, mask=(rk[:, None] < K) & (rm[None, :] < M_T))
    tl.atomic_max(AMAX, tl.max(tl.max(tl.abs(x), axis=1), axis=0))


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
    m, k = x.shape
    y = x.new_empty((m, k), dtype=fp8)
    yt = x.new_empty((k, _round16(m)), dtype=fp8)
    amax = torch.zeros((), dtype=torch.float32, device=x.device)
    if m and k:
        grid = (cdiv(_round16(m), BLOCK_M), cdiv(k, BLOCK_K))
        wrap_triton(_cast_kernel)[grid](x, y, yt, amax, scale, m, k, _round16(m), x.stride(0),
                                        FMAX=torch.finfo(fp8).max, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K,
                                        num_warps=num_warps(BLOCK_M * BLOCK_K))
    return y, yt, amax


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
        if torch.is_autocast_enabled(x.device.type):
            out_dtype = torch.get_autocast_dtype(x.device.type)
        else:
            out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        delayed = self.fp8_state.delayed
        siblings = self.fp8_siblings
        if siblings is not None and siblings.x is x:
            xf, xft, amax_x, sx = siblings.cast
        else:
            with torch.no_grad():
                x2 = _rows(x.detach())
                sx = self.fp8_scales[X] if delayed else _dynamic_scale(x2, X)
                xf, xft, amax_x = float8_cast(x2, sx, E4M3)
            if siblings is not None and siblings.open and siblings.x is None:
                siblings.x, siblings.cast = x, (xf, xft, amax_x, sx)
        y = _Float8Matmul.apply(x, xf, xft, amax_x, sx, self.weight, self.fp8_scales if delayed else None,
                                self.fp8_slot, out_dtype)
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
            hook: bool = True) -> State:
    """Turn every nn.Linear of `model` (no bias, features multiples of 16; not the modules named
    in `skip`) into a Float8Linear, in place; the returned State holds their history. With
    `hook`, a forward pre-hook on `model` calls State.update before each forward. ValueError if
    nothing is converted."""
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
        if len(children) > 1:
            siblings = _Siblings()
            for child in children:
                child.fp8_siblings = siblings
            holder = model.get_submodule(parent)
            holder.register_forward_pre_hook(siblings.enter)
            holder.register_forward_hook(siblings.leave)
    if hook:
        model.register_forward_pre_hook(lambda module, args: state.update())
    return state
