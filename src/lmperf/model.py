"""A pre-norm decoder-only Transformer LM, in the order data flows through it.

token embedding -> N x [RMSNorm -> causal MHA with RoPE -> residual,
RMSNorm -> SwiGLU -> residual] -> RMSNorm -> LM head (untied, no biases).
The attention kernel is pluggable: see ATTENTION.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lmperf.kernels.attention_contract import repeat_kv
from lmperf.kernels.rope_contract import apply_rope
from lmperf.ranges import annotate


@dataclass(frozen=True)
class ModelConfig:
    d_model: int
    d_ff: int
    n_layers: int
    n_heads: int
    vocab_size: int = 10_000
    context_length: int = 256
    rope_theta: float = 10_000.0
    attention: str = "plain"
    n_kv_heads: int | None = None  # K/V heads (grouped-query attention); None: n_heads

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(f"head dim {self.d_model // self.n_heads} must be even for RoPE")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise ValueError(f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention={self.attention!r}; choose one of {sorted(ATTENTION)}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


def count_parameters(cfg: ModelConfig) -> int:
    """Closed-form parameter count of TransformerLM(cfg)."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    d_kv = cfg.kv_heads * cfg.d_head
    per_block = 2 * d * d + 2 * d * d_kv + 3 * d * f + 2 * d  # q,o; k,v; w1,w2,w3; two RMSNorm gains
    return v * d + cfg.n_layers * per_block + d + d * v  # embedding, blocks, final norm, head


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v, written out in PyTorch ops. The three steps are
    named ranges (profiler and NVTX) for the report's kernel-level profile. k and v with fewer
    heads than q (grouped-query) are repeated to q's heads."""
    k, v = repeat_kv(q, k), repeat_kv(q, v)
    with annotate("attention.scores"):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    with annotate("attention.softmax"):
        if is_causal:
            n_q, n_k = q.shape[-2], k.shape[-2]
            mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
    with annotate("attention.values"):
        return probs @ v


def sdpa_attention(q, k, v, is_causal: bool):
    if q.shape[-3] != k.shape[-3]:  # grouped-query; the flag only where needed (it narrows SDPA's backends)
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def flash_triton_attention(q, k, v, is_causal: bool):
    """Our FlashAttention-2 (Triton); imported on first use so the model needs no triton."""
    from lmperf.kernels.flash_attention_triton import FlashAttention2Triton

    return FlashAttention2Triton.apply(q, k, v, is_causal)


# name -> fn(q, k, v, is_causal) on (batch, heads, seq, d_head) tensors.
ATTENTION: dict[str, Callable] = {"plain": plain_attention, "sdpa": sdpa_attention,
                                  "flash-triton": flash_triton_attention}


def register_attention(name: str, fn: Callable) -> None:
    """Another attention the model can use by `name` (a user's contender: lmperf.contenders)."""
    if name in ATTENTION and ATTENTION[name] is not fn:
        raise ValueError(f"attention {name!r} is already registered")
    ATTENTION[name] = fn


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * self.weight).to(dtype)


def rope_tables(d_head: int, context: int, theta: float):
    """cos/sin of the rotation angle pos * theta^(-2i/d), shape (context, d_head/2)."""
    inv_freq = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    angles = torch.outer(torch.arange(context, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.kv_heads
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.d_head, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.d_head, bias=False)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        attend = ATTENTION[cfg.attention]  # a user's (lmperf.contenders.Deferred) is loaded now
        self.attend = attend.resolve() if hasattr(attend, "resolve") else attend

    def forward(self, x, cos, sin):
        b, n, d = x.shape
        heads = lambda t, h: t.view(b, n, h, d // self.n_heads).transpose(1, 2)
        q, k, v = heads(self.q_proj(x), self.n_heads), heads(self.k_proj(x), self.n_kv_heads), \
            heads(self.v_proj(x), self.n_kv_heads)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = self.attend(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, n, d))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model)
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class TransformerLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.d_head, cfg.context_length, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (batch, seq) int64 -> logits (batch, seq, vocab)."""
        n = tokens.shape[-1]
        if n > self.cfg.context_length:
            raise ValueError(f"sequence length {n} exceeds context_length {self.cfg.context_length}")
        cos, sin = self.rope_cos[:n], self.rope_sin[:n]
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.final_norm(x))


def _init_weights(module: nn.Module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, std=0.02, a=-0.06, b=0.06)
