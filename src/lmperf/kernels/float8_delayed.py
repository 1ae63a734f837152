"""Float8 training with delayed scaling: nn.Linear layers that multiply in fp8 with scales from
the amax of earlier steps, so no cast waits for a reduction over the tensor it casts.

    state = convert(model)          # every nn.Linear but the LM head, in place
    ... train as before (torch.compile of the blocks or of the whole model works) ...

Each converted layer computes y = x @ w.T as torch._scaled_mm of x and w cast to float8 e4m3,
and its backward dx = dy @ w and dw = dy.T @ x with dy cast to e5m2 (the wider range gradients
need), accumulating in fp32 (the forward with `use_fast_accum`, as torchao's tensorwise recipe).
A tensor's scale is fp8_max / (amax * HEADROOM), amax the largest |value| the tensor had over the
last `history` steps (tensorwise, Transformer Engine's delayed recipe). The amax of every cast
tensor is computed beside its cast (row maxima, which a compiler can fuse into the cast's loop)
and reaches the next step as the gradient of a zero scalar each layer passes to its matmul, so
nothing in a forward or backward graph is mutated. The first step, before any history, scales
dynamically (the tensor's own amax); after it the scaling is delayed, and a compiled model
recompiles once.

`convert` registers a forward pre-hook on the model that, at each forward call of the model,
moves the last step's amaxes into the history and recomputes every layer's scales (a few
kernels for all layers together). Call the model's forward eagerly at the top (compile its
blocks, as lmperf.train does, or call `state.update()` yourself before each step and pass
`hook=False`).

Weights stay the module's own parameters (an optimizer holding them keeps working); only layers
whose in and out features are multiples of 16 (torch._scaled_mm's contract) are converted.
"""
from __future__ import annotations

import torch
import torch.nn as nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HEADROOM = 2.0  # one power of two below the format's largest value: an amax that grows within
# the history's window by up to 2x is still not clamped
X, W, G = range(3)  # rows of a layer's amax and scale: input, weight, output gradient
FP8_MAX = (torch.finfo(E4M3).max, torch.finfo(E4M3).max, torch.finfo(E5M2).max)


def _amax(t: torch.Tensor) -> torch.Tensor:
    """max |t| in fp32, as row maxima first (a reduction over the cast's inner loop)."""
    return t.abs().amax(dim=-1).amax().float()


def _cast(t: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    fmax = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype)


def _pad_rows(t: torch.Tensor, multiple: int = 16) -> torch.Tensor:
    """t with zero rows appended up to a multiple of `multiple` (the weight gradient's inner
    dimension is the token count, which torch._scaled_mm needs in multiples of 16 on a GPU)."""
    pad = -t.shape[0] % multiple
    if not pad:
        return t
    out = t.new_zeros((t.shape[0] + pad, *t.shape[1:]))
    out[:t.shape[0]].copy_(t)
    return out


def _dynamic_scale(amax: torch.Tensor, row: int) -> torch.Tensor:
    return FP8_MAX[row] / (torch.clamp(amax, min=1e-12) * HEADROOM)


class _Float8Matmul(torch.autograd.Function):
    """y = x @ w.T in fp8. `scales` (3,) are the delayed scales of x, w and dy, or None to scale
    each by its own amax (the first step); `slot` a zero (3,) leaf whose gradient becomes this
    step's (amax x, amax w, amax dy)."""

    @staticmethod
    def forward(ctx, x, w, scales, slot, out_dtype):
        x2 = x.reshape(-1, x.shape[-1])
        amax_x, amax_w = _amax(x2), _amax(w)
        if scales is None:
            sx, sw = _dynamic_scale(amax_x, X), _dynamic_scale(amax_w, W)
        else:
            sx, sw = scales[X], scales[W]
        xf, wf = _cast(x2, sx, E4M3), _cast(w, sw, E4M3)
        # _scaled_mm: the first operand row-major, the second column-major (wf.t() is)
        y = torch._scaled_mm(xf, wf.t(), scale_a=sx.reciprocal(), scale_b=sw.reciprocal(), out_dtype=out_dtype,
                             use_fast_accum=True)
        ctx.save_for_backward(xf, wf, sx, sw, amax_x, amax_w, scales[G] if scales is not None else None)
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype, ctx.out_dtype = x.shape, x.dtype, w.dtype, out_dtype
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        xf, wf, sx, sw, amax_x, amax_w, sg = ctx.saved_tensors
        g2 = gy.reshape(-1, gy.shape[-1])
        amax_g = _amax(g2)
        if sg is None:
            sg = _dynamic_scale(amax_g, G)
        gf = _cast(g2, sg, E5M2)
        gx = torch._scaled_mm(gf, wf.t().contiguous().t(), scale_a=sg.reciprocal(), scale_b=sw.reciprocal(),
                              out_dtype=ctx.out_dtype)
        gfp, xfp = _pad_rows(gf), _pad_rows(xf)  # zero rows add nothing to dy.T @ x
        gw = torch._scaled_mm(gfp.t().contiguous(), xfp.t().contiguous().t(), scale_a=sg.reciprocal(),
                              scale_b=sx.reciprocal(), out_dtype=torch.float32 if ctx.w_dtype == torch.float32
                              else ctx.out_dtype)
        amaxes = torch.stack([amax_x, amax_w, amax_g])
        return gx.reshape(ctx.x_shape).to(ctx.x_dtype), gw.to(ctx.w_dtype), None, amaxes, None


class Float8Linear(nn.Linear):
    """An nn.Linear without bias multiplying in fp8 with delayed scaling (made by `convert`).
    Its output dtype is the autocast dtype under autocast, else the input's (fp16 or bf16)."""

    def forward(self, x):
        if torch.is_autocast_enabled(x.device.type):
            out_dtype = torch.get_autocast_dtype(x.device.type)
        else:
            out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        scales = self.fp8_scales if self.fp8_state.delayed else None
        y = _Float8Matmul.apply(x, self.weight, scales, self.fp8_slot, out_dtype)
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
        """Move the amaxes of the last backward into the history and recompute the scales. A
        layer without one (no backward since: a forward-only call) keeps its history as it is."""
        amaxes = [layer.fp8_slot.grad for layer in self.layers]
        if any(a is None for a in amaxes):
            return
        with torch.no_grad():
            self.history[self.steps % len(self.history)] = torch.stack(amaxes)
            amax = self.history.amax(dim=0) if self.steps + 1 >= len(self.history) else \
                self.history[:self.steps + 1].amax(dim=0)
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
    layers = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or name in skip or module.bias is not None:
            continue
        if module.in_features % 16 or module.out_features % 16:
            continue  # torch._scaled_mm multiplies only multiples of 16: the layer stays as it is
        module.__class__ = Float8Linear
        layers.append(module)
    if not layers:
        raise ValueError("float8_delayed.convert: no nn.Linear without bias and with features that are "
                         "multiples of 16 outside `skip`")
    state = State(layers, history)
    if hook:
        model.register_forward_pre_hook(lambda module, args: state.update())
    return state
