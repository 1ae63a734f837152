"""The model with fused kernels for what is left between its matmuls: `apply(model, impl)` turns an
existing lmperf.model.TransformerLM into one whose RMSNorms are fused with the residual adds
before them, whose SwiGLU product and RoPE are one kernel each, without touching model.py, its
parameters or anything an optimizer already holds (Liger-Kernel's way of patching a model).

    impl "ours":  kernels/rmsnorm.py, kernels/swiglu.py, kernels/rope.py (Triton); `parts`
                  chooses which (PARTS), the model's own code doing the others (the ladder
                  adds them one a rung)
    impl "liger": Liger-Kernel's fused add-RMSNorm, RMSNorm and SiLU-mul (a peer for the ladder);
                  its norms run outside torch.compile's graph (Dynamo traces them wrongly).
                  Liger's RoPE rotates the two halves of a head (the Llama convention), not the
                  consecutive pairs this model rotates: RoPE stays the model's.

The residual stream then travels between blocks as a pair (x, delta), x + delta being the
model's residual: a block hands its last sublayer's output to the next block unadded, and the
next block's first RMSNorm adds it while normalising (the last block's goes to the final norm).
Per block the model's four passes over the residual (norm, add, norm, add) become two fused ones.
Under autocast (the model's bf16 recipe) each RMSNorm writes its output in the autocast dtype:
the matmuls after it would cast it to that anyway, so the function computed is the same.

`apply` swaps the classes of the model's modules for subclasses here (their forward only), so
that anything built around the modules keeps working: lmperf.train.checkpoint_blocks (it runs
type(block).forward) and torch.compile of the blocks (before their first call).
"""
from __future__ import annotations

import importlib
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from lmperf.kernels.rope_contract import apply_rope
from lmperf.model import Block, CausalSelfAttention, SwiGLU, TransformerLM

IMPLS = ("ours", "liger")
PARTS = ("rmsnorm", "swiglu", "rope")
LIGER_MISSING = "needs liger-kernel (pip wheel; tools/wheelhouse.sh)"


class MissingPackage(ImportError):
    """A peer's package is not installed: the caller may skip what needs it."""


class Kernels(NamedTuple):
    """What an implementation brings: add_rmsnorm(x, delta or None, norm module, out_dtype) ->
    (x + delta, the normalised row); silu_mul(a, b); rope(q, k, cos, sin) -> (q, k)."""
    add_rmsnorm: Callable
    silu_mul: Callable
    rope: Callable


def _model_add_rmsnorm(x, delta, norm, out_dtype):
    h = x if delta is None else x + delta
    return h, norm(h)


def _model_rope(q, k, cos, sin):
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def _model_silu_mul(a, b):
    return F.silu(a) * b


def _ours(parts) -> Kernels:
    """Our kernels for `parts`, the model's code (the functions above) for the others."""
    from lmperf.kernels import rmsnorm, rope, swiglu

    def add_rmsnorm(x, delta, norm, out_dtype):
        return rmsnorm.add_rmsnorm(x, delta, norm.weight, norm.eps, out_dtype)
    return Kernels(add_rmsnorm if "rmsnorm" in parts else _model_add_rmsnorm,
                   swiglu.silu_mul if "swiglu" in parts else _model_silu_mul,
                   rope.rope if "rope" in parts else _model_rope)


def _liger() -> Kernels:
    try:
        ops = importlib.import_module("liger_kernel.ops")
    except ImportError as e:
        raise MissingPackage(LIGER_MISSING) from e

    # Outside the compiled graph: Dynamo traces Liger's norms wrongly (H100, torch 2.11, Liger
    # 0.8.5): rows in and out reach the attention with 2 dimensions instead of 3, and 3-D inputs
    # make its backward return gradients of the rows' shape ("returned an invalid gradient");
    # run eagerly between the compiled regions they match eager Liger's loss and gradients.
    # Its SiLU-mul compiles.
    @torch.compiler.disable
    def add_rmsnorm(x, delta, norm, out_dtype):
        # casting mode "gemma": everything in fp32, the result in the input's dtype (the model's
        # math); Liger adds in the input's dtype, so a 16-bit delta joins the fp32 residual first
        # in rows (-1, d), as Liger's kernels see them: its backward gives every gradient the
        # shape of the output's, which under torch.compile need not be the input's it belongs to
        rows = lambda t: t.reshape(-1, t.shape[-1])
        if delta is None:
            return x, ops.LigerRMSNormFunction.apply(rows(x), norm.weight, norm.eps, 0.0, "gemma", False).view(x.shape)
        y, h = ops.LigerFusedAddRMSNormFunction.apply(rows(delta.to(x.dtype)), rows(x), norm.weight, norm.eps, 0.0,
                                                     "gemma", False)
        return h.view(x.shape), y.view(x.shape)

    return Kernels(add_rmsnorm, ops.LigerSiLUMulFunction.apply, _model_rope)


def kernels(impl: str, parts=PARTS) -> Kernels:
    """The kernels of `impl` (IMPLS; for "ours", those of `parts`); raises MissingPackage where
    its package is not installed."""
    if impl not in IMPLS:
        raise ValueError(f"fused kernels impl={impl!r}; choose one of {IMPLS}")
    if not set(parts) <= set(PARTS):
        raise ValueError(f"fused kernels parts={tuple(parts)}; choose from {PARTS}")
    return _ours(parts) if impl == "ours" else _liger()


def norm_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype a fused RMSNorm writes: autocast's where it is on for x's device (the matmul
    after the norm casts to it), else None (the residual's)."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


class FusedAttention(CausalSelfAttention):
    """CausalSelfAttention with q and k rotated by the fused RoPE."""
    kernels: Kernels

    def forward(self, x, cos, sin):
        b, n, d = x.shape
        heads = lambda t, h: t.view(b, n, h, d // self.n_heads).transpose(1, 2)
        q, k, v = heads(self.q_proj(x), self.n_heads), heads(self.k_proj(x), self.n_kv_heads), \
            heads(self.v_proj(x), self.n_kv_heads)
        q, k = self.kernels.rope(q, k, cos, sin)
        y = self.attend(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, n, d))


class FusedSwiGLU(SwiGLU):
    """SwiGLU with the fused silu(a) * b."""
    kernels: Kernels

    def forward(self, x):
        return self.w2(self.kernels.silu_mul(self.w1(x), self.w3(x)))


class FusedBlock(Block):
    """A block on the residual pair: forward(x, cos, sin, delta=None) -> (h, ffn output), the
    block's output residual being h + ffn output (see the module docstring)."""
    kernels: Kernels

    def forward(self, x, cos, sin, delta=None):
        h, y = self.kernels.add_rmsnorm(x, delta, self.attn_norm, norm_dtype(x))
        h, y = self.kernels.add_rmsnorm(h, self.attn(y, cos, sin), self.ffn_norm, norm_dtype(x))
        return h, self.ffn(y)


class FusedTransformerLM(TransformerLM):
    """TransformerLM whose blocks pass the residual pair on; the final norm adds the last one."""
    kernels: Kernels

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[-1]
        if n > self.cfg.context_length:
            raise ValueError(f"sequence length {n} exceeds context_length {self.cfg.context_length}")
        cos, sin = self.rope_cos[:n], self.rope_sin[:n]
        x, delta = self.embedding(tokens), None
        for block in self.blocks:
            x, delta = block(x, cos, sin, delta)
        return self.lm_head(self.kernels.add_rmsnorm(x, delta, self.final_norm, norm_dtype(x))[1])


FUSED = {TransformerLM: FusedTransformerLM, Block: FusedBlock, CausalSelfAttention: FusedAttention,
         SwiGLU: FusedSwiGLU}


def apply(model: TransformerLM, impl: str = "ours", parts=PARTS) -> TransformerLM:
    """Patch `model` in place (and return it) to run the fused kernels of `impl` (`parts` of
    ours): its modules' classes become the Fused* subclasses above, with the same parameters and
    buffers. Call it before the model's first compiled call. Raises MissingPackage where impl's
    package is not installed (the model is then unchanged)."""
    chosen = kernels(impl, parts)
    if not isinstance(model, TransformerLM):
        raise TypeError(f"apply patches an lmperf.model.TransformerLM; got {type(model).__name__}")
    for module in model.modules():
        fused = FUSED.get(type(module)) or (type(module) if type(module) in FUSED.values() else None)
        if fused is not None:
            module.__class__ = fused
            module.kernels = chosen
    return model
