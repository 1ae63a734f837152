"""AdamW on fp32 master weights that writes the bf16 weights the matmuls read: one Triton launch
for every nn.Linear weight of a model (a ladder rung of the end-to-end section, issue #15).

Under bf16 autocast a training step casts every nn.Linear weight from fp32 to bf16 in the forward
(torch.compile's backward casts it again rather than keep the copy) and each weight's bf16
gradient back to fp32: about 14 ms of kernels in the 2.7B model's 376 ms step at context 2,048 on
an H100. `MasterWeightAdamW` makes those weights bf16 parameters and keeps, beside each, the 16
bits that make it the fp32 master weight again: master = the bf16 weight's bits << 16 plus a
signed 16-bit remainder. Weight and remainder take the 4 bytes the fp32 weight took, the
gradients are bf16 (half of fp32's), and no casts are left. The kernel reads weight, remainder,
both moments and the gradient (14 bytes a weight) and writes all but the gradient (12): 26 bytes,
against fused AdamW's 28 in fp32.

The math is autocast's: the bf16 weight is the fp32 master rounded to nearest even (autocast's
cast), the gradient is the bf16 one autocast would have upcast, and the update is AdamW's
(PyTorch's fused kernel's order of operations) in fp32 on the exact master. One exception, at
fp32 rounding level: a master exactly halfway between two bf16 numbers that rounds down (its low
16 bits 0x8000, the bf16 bits even) has a remainder of +32,768, one more than 16 bits hold; it is
stored one fp32 bit lower (a relative change of at most 2^-23, about one master in 2^17).
Other parameters (embedding, RMSNorm weights: autocast leaves them fp32) stay fp32 under torch's
AdamW (fused on CUDA).

Gradient accumulation over micro-batches sums the bf16 gradients in fp32, as autocast's fp32
`.grad` does: with `accumulate = True` (lmperf.train.step sets it for micro-batches > 1) each
gradient moves into an fp32 buffer as soon as autograd has it; without it, a hook before a
weight's second gradient moves the first there, and the kernel adds the last.

Layout: every weight's slot in the flat buffers (weights, remainders, moments, sums) is padded to
whole BLOCK-element chunks, so program c updates elements [c * BLOCK, (c + 1) * BLOCK) of all of
them; a table maps a chunk to its weight, whose gradient (allocated by autograd each step) is
read through a table of addresses. Chunks inside a weight load and store unmasked.
"""
from __future__ import annotations

import math
import os
import weakref

import torch
import triton
import triton.language as tl
from torch import nn

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 256 if INTERPRET else 2048  # elements a program; the interpreter: several chunks a small weight


@triton.jit
def _adamw_master_kernel(chunk_weight_ptr, first_chunk_ptr, numel_ptr, grad_table_ptr,
                         weight_ptr, rest_ptr, exp_avg_ptr, exp_avg_sq_ptr, acc_ptr,
                         lr_decay, beta1, beta2, step_size, bias_correction2_sqrt, eps,
                         HAS_GRAD: tl.constexpr, HAS_ACC: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0)
    w = tl.load(chunk_weight_ptr + c)
    start = (c - tl.load(first_chunk_ptr + w)).to(tl.int64) * BLOCK  # the chunk's first element in its weight
    left = tl.load(numel_ptr + w) - start
    flat = c.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    grad = tl.arange(0, BLOCK)  # an unused placeholder without HAS_GRAD
    if HAS_GRAD:
        address = tl.multiple_of(tl.load(grad_table_ptr + w), 16)  # step() passes 16-byte aligned gradients
        grad = address.to(tl.pointer_type(tl.bfloat16)) + start + tl.arange(0, BLOCK)
    if left >= BLOCK:
        _update(flat, grad, None, weight_ptr, rest_ptr, exp_avg_ptr, exp_avg_sq_ptr, acc_ptr, lr_decay, beta1,
                beta2, step_size, bias_correction2_sqrt, eps, HAS_GRAD, HAS_ACC)
    else:
        _update(flat, grad, tl.arange(0, BLOCK) < left, weight_ptr, rest_ptr, exp_avg_ptr, exp_avg_sq_ptr,
                acc_ptr, lr_decay, beta1, beta2, step_size, bias_correction2_sqrt, eps, HAS_GRAD, HAS_ACC)


@triton.jit
def _update(flat, grad, mask, weight_ptr, rest_ptr, exp_avg_ptr, exp_avg_sq_ptr, acc_ptr, lr_decay, beta1,
            beta2, step_size, bias_correction2_sqrt, eps, HAS_GRAD: tl.constexpr, HAS_ACC: tl.constexpr):
    if HAS_ACC:  # the earlier micro-batches' gradients, summed in fp32
        g = tl.load(acc_ptr + flat, mask=mask)
        if HAS_GRAD:
            g += tl.load(grad, mask=mask).to(tl.float32)
    else:
        g = tl.load(grad, mask=mask).to(tl.float32)
    p = join_master(tl.load(weight_ptr + flat, mask=mask), tl.load(rest_ptr + flat, mask=mask))
    m = tl.load(exp_avg_ptr + flat, mask=mask)
    v = tl.load(exp_avg_sq_ptr + flat, mask=mask)
    p = p - lr_decay * p  # AdamW's decoupled weight decay, lr_decay = lr * weight_decay
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - step_size * m / (tl.sqrt(v) / bias_correction2_sqrt + eps)
    weight, rest = split_master(p)
    tl.store(weight_ptr + flat, weight, mask=mask)
    tl.store(rest_ptr + flat, rest, mask=mask)
    tl.store(exp_avg_ptr + flat, m, mask=mask)
    tl.store(exp_avg_sq_ptr + flat, v, mask=mask)


@triton.jit
def split_master(x):
    """fp32 -> (bf16 rounded to nearest, ties to even: PyTorch's cast; int16 remainder: x's bits
    minus the bf16's << 16, +32,768 stored as +32,767). Integer arithmetic throughout (the
    interpreter's own cast truncates); NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    high = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    high = tl.where(x != x, (bits >> 16) | 0x40, high)
    rest = (bits - (high << 16)).to(tl.int32, bitcast=True)  # in [-32768, 32768]
    rest = tl.minimum(rest, 32767)
    return high.to(tl.uint16).to(tl.bfloat16, bitcast=True), rest.to(tl.int16)


@triton.jit
def join_master(weight, rest):
    """split_master's inverse: the fp32 master from the bf16 weight and its int16 remainder."""
    high = weight.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
    return (high + rest.to(tl.int32).to(tl.uint32, bitcast=True)).to(tl.float32, bitcast=True)


def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's twin of the kernel's split_master: fp32 -> (bf16 weight, int16 remainder)."""
    high = x.to(torch.bfloat16)
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rest = bits - ((high.view(torch.int16).to(torch.int64) & 0xFFFF) << 16)
    return high, rest.clamp(max=32767).to(torch.int16)


def join(weight: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """PyTorch's twin of the kernel's join_master: the fp32 master weight."""
    bits = (((weight.view(torch.int16).to(torch.int64) & 0xFFFF) << 16) + rest.to(torch.int64)) & 0xFFFFFFFF
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32)


def linear_weights(model: nn.Module) -> list[nn.Parameter]:
    """The weights bf16 autocast casts: every nn.Linear's (biases too), each once."""
    seen, out = set(), []
    for module in model.modules():
        if isinstance(module, nn.Linear):
            for p in (module.weight, module.bias):
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
    return out


class MasterWeightAdamW:
    """AdamW (PyTorch's defaults but lr) whose nn.Linear weights become bf16 parameters with fp32
    master weights (their bf16 bits and a 16-bit remainder); the model's other parameters stay
    fp32 under torch.optim.AdamW. Construct it before the model first runs (and before
    torch.compile traces it): it changes the weights' dtype. Train under bf16 autocast, as with
    fp32 weights. `step()` and `zero_grad()` as torch optimizers; `state` is empty until the
    first step allocates the moments (as AdamW's); `master_weights()` gives the fp32 weights."""

    def __init__(self, model: nn.Module, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if not value >= 0:
                raise ValueError(f"MasterWeightAdamW: {name}={value!r} must be >= 0")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"MasterWeightAdamW: betas={betas!r} must each be in [0, 1)")
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.weights = linear_weights(model)
        if not self.weights:
            raise ValueError("MasterWeightAdamW: the model has no nn.Linear weights")
        bad = [tuple(w.shape) for w in self.weights if w.dtype != torch.float32]
        if bad:
            raise ValueError(f"MasterWeightAdamW: Linear weights must be fp32 to start from (got "
                             f"{sorted({str(w.dtype) for w in self.weights})}, shapes {bad[:3]})")
        device = self.weights[0].device
        if any(w.device != device for w in self.weights):
            raise ValueError("MasterWeightAdamW: all Linear weights must be on one device")
        ids = {id(w) for w in self.weights}
        others = [p for p in model.parameters() if id(p) not in ids]
        self.others = (torch.optim.AdamW(others, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                         fused=device.type == "cuda" or None) if others else None)
        self.numels = [w.numel() for w in self.weights]
        chunks = [math.ceil(n / BLOCK) for n in self.numels]
        self.offsets = [BLOCK * c for c in [0, *_running_sum(chunks)][:-1]]  # each slot starts a chunk
        self.total = BLOCK * sum(chunks)
        self.flat_weights = torch.zeros(self.total, dtype=torch.bfloat16, device=device)
        self.rest = torch.zeros(self.total, dtype=torch.int16, device=device)
        with torch.no_grad():
            for w, o, n in zip(self.weights, self.offsets, self.numels):
                high, rest = split(w.detach().reshape(-1))
                self.flat_weights[o:o + n] = high
                self.rest[o:o + n] = rest
                w.data = self.flat_weights[o:o + n].view(w.shape)
        as_tensor = lambda xs, dtype: torch.tensor(xs, dtype=dtype, device=device)
        self.chunk_weight = torch.repeat_interleave(as_tensor(range(len(chunks)), torch.int32),
                                                    as_tensor(chunks, torch.int64))
        self.first_chunk = as_tensor([o // BLOCK for o in self.offsets], torch.int32)
        self.numel = as_tensor(self.numels, torch.int64)
        # the gradients' addresses, written each step; pinned, with an event guarding its reuse
        pin = device.type == "cuda"
        self._grad_addresses = torch.empty(len(chunks), dtype=torch.int64, pin_memory=pin)
        self._grad_table = torch.empty(len(chunks), dtype=torch.int64, device=device)
        self._table_copied = torch.cuda.Event() if pin else None
        self.exp_avg = self.exp_avg_sq = None  # allocated at the first step, as AdamW's state
        self.steps = 0
        self.accumulate = False  # True: every gradient goes into the fp32 sums as it comes
        self.acc = None  # fp32 sums of micro-batches' gradients
        self._accumulated: set[int] = set()
        # the hooks hold the optimizer weakly: a hook kept by a weight must not keep the optimizer
        # (and through it every weight and its state) alive once the model and optimizer are dropped
        me = weakref.ref(self)
        for i, w in enumerate(self.weights):
            w.register_hook(lambda grad, i=i: me() and me()._before_accumulate(i))
            w.register_post_accumulate_grad_hook(lambda w, i=i: me() and me()._after_accumulate(i))

    @property
    def state(self) -> dict:
        """Non-empty once a step has allocated the moments (AdamW's and this optimizer's)."""
        state = dict(self.others.state) if self.others else {}
        if self.exp_avg is not None:
            state.update({w: {"step": self.steps} for w in self.weights})
        return state

    def master_weights(self) -> list[torch.Tensor]:
        """The fp32 master weights, in the order of `weights` (new tensors)."""
        return [join(self.flat_weights[o:o + n], self.rest[o:o + n]).view(w.shape)
                for w, o, n in zip(self.weights, self.offsets, self.numels)]

    def _add_to_sum(self, i: int) -> None:
        """Weight i's gradient into the fp32 sum, and off the weight."""
        w = self.weights[i]
        if self.acc is None:
            self.acc = torch.empty(self.total, dtype=torch.float32, device=w.device)
        view = self.acc[self.offsets[i]:self.offsets[i] + self.numels[i]].view(w.shape)
        with torch.no_grad():
            if i in self._accumulated:
                view.add_(w.grad)
            else:
                view.copy_(w.grad)
                self._accumulated.add(i)
        w.grad = None

    def _before_accumulate(self, i: int) -> None:
        """Before autograd accumulates a new gradient into weight i: one already there (an earlier
        micro-batch's) goes into the fp32 sum, so that two never add up in bf16."""
        if self.weights[i].grad is not None:
            self._add_to_sum(i)

    def _after_accumulate(self, i: int) -> None:
        if self.accumulate:
            self._add_to_sum(i)

    @torch.no_grad()
    def step(self) -> None:
        if self.others is not None:
            self.others.step()
        grads = [w.grad for w in self.weights]
        has_grad, has_acc = grads[0] is not None, bool(self._accumulated)
        if any((g is not None) != has_grad for g in grads) or (
                has_acc and len(self._accumulated) != len(self.weights)) or not (has_grad or has_acc):
            no_gradient = [tuple(w.shape) for i, (w, g) in enumerate(zip(self.weights, grads))
                           if g is None and i not in self._accumulated]
            raise RuntimeError(f"MasterWeightAdamW.step: {len(no_gradient)} Linear weight(s) have no gradient "
                               f"(shapes {no_gradient[:3]}), or weights differ in whether they have one; "
                               f"run backward first")
        if has_grad:  # contiguous, bf16, 16-byte aligned (the kernel's loads assume it)
            grads = [g if g.dtype == torch.bfloat16 and g.is_contiguous() and g.data_ptr() % 16 == 0
                     else _aligned_copy(g) for g in grads]
        if self.exp_avg is None:
            self.exp_avg = torch.zeros(self.total, dtype=torch.float32, device=self.rest.device)
            self.exp_avg_sq = torch.zeros_like(self.exp_avg)
        self.steps += 1
        beta1, beta2 = self.betas
        if has_grad:
            if self._table_copied is not None:
                self._table_copied.synchronize()  # the last step's copy has read the pinned buffer
            for i, g in enumerate(grads):
                self._grad_addresses[i] = g.data_ptr()
            self._grad_table.copy_(self._grad_addresses, non_blocking=True)
            if self._table_copied is not None:
                self._table_copied.record()
        _adamw_master_kernel[(self.chunk_weight.numel(),)](
            self.chunk_weight, self.first_chunk, self.numel, self._grad_table,
            self.flat_weights, self.rest, self.exp_avg, self.exp_avg_sq, self.acc if has_acc else self.exp_avg,
            self.lr * self.weight_decay, beta1, beta2, self.lr / (1 - beta1 ** self.steps),
            math.sqrt(1 - beta2 ** self.steps), self.eps, HAS_GRAD=has_grad, HAS_ACC=has_acc, BLOCK=BLOCK,
            num_warps=8)
        self._grads_in_flight = grads if has_grad else None  # alive until the kernel has read them
        self._accumulated.clear()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            raise ValueError("MasterWeightAdamW.zero_grad: only set_to_none=True (gradients are read in place)")
        if self.others is not None:
            self.others.zero_grad(set_to_none=True)
        for w in self.weights:
            w.grad = None
        self._accumulated.clear()
        self.acc = None
        self._grads_in_flight = None


def _aligned_copy(g: torch.Tensor) -> torch.Tensor:
    out = torch.empty(g.numel() + 8, dtype=torch.bfloat16, device=g.device)
    skip = (-out.data_ptr() // 2) % 8  # elements to the next 16-byte boundary
    out = out[skip:skip + g.numel()].view(g.shape)
    out.copy_(g)
    return out


def _running_sum(xs):
    total = 0
    for x in xs:
        total += x
        yield total
