"""AdamW on fp32 master weights that writes the bf16 weights the matmuls read: one Triton launch
for every nn.Linear weight of a model (a ladder rung of the end-to-end section, issue #15).

Under bf16 autocast a training step casts every nn.Linear weight from fp32 to bf16 in the forward
(torch.compile's backward casts it again rather than keep the copy) and each weight's bf16
gradient back to fp32: about 14 ms of kernels in the 2.7B model's 376 ms step at context 2,048 on
an H100. `MasterWeightAdamW` stores those weights as bf16 parameters, keeps their fp32 values as
its own state (the master weights), and updates both in one kernel: per weight it reads the fp32
master and both moments (12 bytes) and the bf16 gradient (2), and writes master and moments (12)
and the bf16 weight (2): 28 bytes, as many as fused AdamW's fp32 step. No casts are left.

The math is autocast's: the bf16 weight is the fp32 master rounded to nearest even (what
autocast's cast computes), the gradient is the bf16 one that autocast would have upcast, and the
update is AdamW's (PyTorch's fused kernel's order of operations) in fp32. Other parameters
(embedding, RMSNorm weights: autocast leaves them in fp32) stay fp32 under torch's fused AdamW.
Gradient accumulation over micro-batches sums the bf16 gradients in fp32, as autocast's fp32
`.grad` does: a hook before each weight's gradient accumulation moves the previous
micro-batch's bf16 gradient into an fp32 buffer, and the kernel adds the last one.

The kernel walks every weight in BLOCK-element chunks: tables map a chunk to its weight, and a
weight to its offset in the flat fp32 buffers (master, moments) and the flat bf16 buffer the
weights are views of; the gradients (allocated by autograd each step) are read through a table
of their addresses.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from torch import nn

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 256 if INTERPRET else 2048  # elements a program; the interpreter: several chunks a small weight


@triton.jit
def _adamw_master_kernel(chunk_weight_ptr, first_chunk_ptr, numel_ptr, offset_ptr, grad_table_ptr,
                         master_ptr, exp_avg_ptr, exp_avg_sq_ptr, acc_ptr, weight_ptr,
                         lr_decay, beta1, beta2, step_size, bias_correction2_sqrt, eps,
                         HAS_ACC: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0)
    w = tl.load(chunk_weight_ptr + c)
    idx = (c - tl.load(first_chunk_ptr + w)).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < tl.load(numel_ptr + w)
    grad_ptr = tl.load(grad_table_ptr + w).to(tl.pointer_type(tl.bfloat16))
    g = tl.load(grad_ptr + idx, mask=mask).to(tl.float32)
    flat = tl.load(offset_ptr + w) + idx
    if HAS_ACC:  # the earlier micro-batches' gradients, summed in fp32
        g = tl.load(acc_ptr + flat, mask=mask) + g
    p = tl.load(master_ptr + flat, mask=mask)
    m = tl.load(exp_avg_ptr + flat, mask=mask)
    v = tl.load(exp_avg_sq_ptr + flat, mask=mask)
    p = p - lr_decay * p  # AdamW's decoupled weight decay, lr_decay = lr * weight_decay
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - step_size * m / (tl.sqrt(v) / bias_correction2_sqrt + eps)
    tl.store(master_ptr + flat, p, mask=mask)
    tl.store(exp_avg_ptr + flat, m, mask=mask)
    tl.store(exp_avg_sq_ptr + flat, v, mask=mask)
    tl.store(weight_ptr + flat, _to_bf16_rtne(p), mask=mask)


@triton.jit
def _to_bf16_rtne(x):
    """fp32 -> bf16 rounded to nearest, ties to even (PyTorch's cast), in integer arithmetic: the
    interpreter's own cast truncates. NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x != x, (bits >> 16) | 0x40, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


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
    master weights; the model's other parameters stay fp32 under torch.optim.AdamW(fused=True).
    Construct it before the model first runs (and before torch.compile traces it): it changes
    the weights' dtype. Train under bf16 autocast, as with fp32 weights. `step()` and
    `zero_grad()` as torch optimizers; `state` is empty until the first step allocates the
    moments (as AdamW's)."""

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
        numels = [w.numel() for w in self.weights]
        offsets = [0] + list(_accumulate(numels))[:-1]
        self.total = sum(numels)
        self.master = torch.empty(self.total, dtype=torch.float32, device=device)
        self.flat_weights = torch.empty(self.total, dtype=torch.bfloat16, device=device)
        with torch.no_grad():
            for w, o, n in zip(self.weights, offsets, numels):
                self.master[o:o + n].copy_(w.reshape(-1))
                w.data = self.flat_weights[o:o + n].view(w.shape)
                w.copy_(self.master[o:o + n].view(w.shape))  # round to nearest even, as autocast's cast
        chunks = [math.ceil(n / BLOCK) for n in numels]
        first = [0] + list(_accumulate(chunks))[:-1]
        as_tensor = lambda xs, dtype: torch.tensor(xs, dtype=dtype, device=device)
        self.chunk_weight = torch.repeat_interleave(as_tensor(range(len(numels)), torch.int32),
                                                    as_tensor(chunks, torch.int64))
        self.first_chunk, self.numel = as_tensor(first, torch.int32), as_tensor(numels, torch.int64)
        self.offset = as_tensor(offsets, torch.int64)
        self.offsets, self.numels = offsets, numels
        # the gradients' addresses, written each step; pinned, with an event guarding its reuse
        pin = device.type == "cuda"
        self._grad_addresses = torch.empty(len(numels), dtype=torch.int64, pin_memory=pin)
        self._grad_table = torch.empty(len(numels), dtype=torch.int64, device=device)
        self._table_copied = torch.cuda.Event() if pin else None
        self.exp_avg = self.exp_avg_sq = None  # allocated at the first step, as AdamW's state
        self.steps = 0
        self.acc = None  # fp32 sums of earlier micro-batches' gradients
        self._accumulated: set[int] = set()
        for i, w in enumerate(self.weights):
            w.register_hook(lambda grad, i=i: self._before_accumulate(i))

    @property
    def state(self) -> dict:
        """Non-empty once a step has allocated the moments (AdamW's and this optimizer's)."""
        state = dict(self.others.state) if self.others else {}
        if self.exp_avg is not None:
            state.update({w: {"step": self.steps} for w in self.weights})
        return state

    def _before_accumulate(self, i: int) -> None:
        """Runs before autograd accumulates a new gradient into weight i: a gradient already there
        (an earlier micro-batch's) goes into the fp32 sum, so that bf16 never adds two up."""
        w = self.weights[i]
        if w.grad is None:
            return
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

    @torch.no_grad()
    def step(self) -> None:
        if self.others is not None:
            self.others.step()
        grads = [w.grad for w in self.weights]
        missing = [tuple(w.shape) for w, g in zip(self.weights, grads) if g is None]
        if missing:
            raise RuntimeError(f"MasterWeightAdamW.step: {len(missing)} Linear weight(s) have no gradient "
                               f"(shapes {missing[:3]}); run backward first")
        if self._accumulated and len(self._accumulated) != len(self.weights):
            raise RuntimeError("MasterWeightAdamW.step: some weights accumulated micro-batch gradients and "
                               "others did not")
        grads = [g if g.is_contiguous() and g.dtype == torch.bfloat16 else g.to(torch.bfloat16).contiguous()
                 for g in grads]
        if self.exp_avg is None:
            self.exp_avg = torch.zeros_like(self.master)
            self.exp_avg_sq = torch.zeros_like(self.master)
        self.steps += 1
        beta1, beta2 = self.betas
        if self._table_copied is not None:
            self._table_copied.synchronize()  # the last step's copy has read the pinned buffer
        for i, g in enumerate(grads):
            self._grad_addresses[i] = g.data_ptr()
        self._grad_table.copy_(self._grad_addresses, non_blocking=True)
        if self._table_copied is not None:
            self._table_copied.record()
        has_acc = bool(self._accumulated)
        _adamw_master_kernel[(self.chunk_weight.numel(),)](
            self.chunk_weight, self.first_chunk, self.numel, self.offset, self._grad_table,
            self.master, self.exp_avg, self.exp_avg_sq, self.acc if has_acc else self.master, self.flat_weights,
            self.lr * self.weight_decay, beta1, beta2, self.lr / (1 - beta1 ** self.steps),
            math.sqrt(1 - beta2 ** self.steps), self.eps, HAS_ACC=has_acc, BLOCK=BLOCK, num_warps=8)
        self._grads_in_flight = grads  # alive until the kernel has read them (the next zero_grad at least)
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


def _accumulate(xs):
    total = 0
    for x in xs:
        total += x
        yield total
