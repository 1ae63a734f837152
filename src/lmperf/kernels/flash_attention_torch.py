"""FlashAttention-2 tiled in plain PyTorch: the algorithm in readable form, and the reference
that the Triton kernels mirror.

Forward, per query tile Q_i: walk the key tiles K_j, V_j keeping, for each query row,
    m_i  = the largest scaled score seen so far,
    l_i  = sum over keys seen so far of exp(score - m_i),
    acc  = sum over keys seen so far of exp(score - m_i) * v_j,
rescaling l_i and acc by exp(m_old - m_new) whenever the running max grows. At the end
O_i = acc / l_i and the logsumexp L_i = m_i + log(l_i). Everything is accumulated in fp32.

Backward recomputes P = exp(S - L) from the saved L (no N x N matrix is kept from forward) with
D = rowsum(O * dO): dV = P^T dO, dP = dO V^T, dS = P * (dP - D), dQ = dS K / sqrt(d),
dK = dS^T Q / sqrt(d).

Grouped-query attention (k and v with H_kv heads, H_kv dividing q's H): this version repeats
K and V to H heads (a copy; the Triton kernels read them in place) and sums dK and dV over each
group of H / H_kv query heads.
"""
from __future__ import annotations

import math

import torch

from lmperf.kernels.attention_contract import check_causal, check_qkv, repeat_kv

Q_TILE = 64
K_TILE = 64


def _forward(q, k, v, is_causal: bool):
    """q, k, v: (B, N, D). Returns O (input dtype) and L (fp32, (B, N))."""
    b, n, d = q.shape
    scale = 1.0 / math.sqrt(d)
    out = torch.empty_like(q)
    lse = torch.empty(b, n, dtype=torch.float32, device=q.device)
    for i in range(0, n, Q_TILE):
        qi = q[:, i:i + Q_TILE].float()
        rows = torch.arange(i, i + qi.shape[1], device=q.device)
        m = torch.full((b, qi.shape[1]), float("-inf"), device=q.device)
        l = torch.zeros(b, qi.shape[1], device=q.device)
        acc = torch.zeros(b, qi.shape[1], d, device=q.device)
        last_key = i + qi.shape[1] if is_causal else n  # causal: later key tiles are all masked
        for j in range(0, last_key, K_TILE):
            kj, vj = k[:, j:j + K_TILE].float(), v[:, j:j + K_TILE].float()
            s = qi @ kj.transpose(1, 2) * scale
            if is_causal and j + kj.shape[1] > i:  # the tile crosses the diagonal
                cols = torch.arange(j, j + kj.shape[1], device=q.device)
                s = s.masked_fill(cols[None, None, :] > rows[None, :, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + p @ vj
            m = m_new
        out[:, i:i + Q_TILE] = (acc / l[..., None]).to(q.dtype)
        lse[:, i:i + Q_TILE] = m + torch.log(l)
    return out, lse


def _backward(q, k, v, out, lse, grad_out, is_causal: bool):
    """Gradients from the saved logsumexp; computed in fp32, returned in the input dtype."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    q32, k32, v32, do32 = q.float(), k.float(), v.float(), grad_out.float()
    delta = (out.float() * do32).sum(-1)  # D = rowsum(O * dO)
    s = q32 @ k32.transpose(-2, -1) * scale
    if is_causal:
        n = q.shape[-2]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    p = torch.exp(s - lse[..., None])
    dv = p.transpose(-2, -1) @ do32
    dp = do32 @ v32.transpose(-2, -1)
    ds = p * (dp - delta[..., None])
    dq = ds @ k32 * scale
    dk = ds.transpose(-2, -1) @ q32 * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


_compiled_backward = None


def _backward_for(device: torch.device):
    """torch.compile'd backward on CUDA (it fuses the element-wise work); eager elsewhere."""
    global _compiled_backward
    if device.type != "cuda":
        return _backward
    if _compiled_backward is None:
        _compiled_backward = torch.compile(_backward, dynamic=False)
    return _compiled_backward


def forward_with_lse(q, k, v, is_causal: bool = False):
    """(O, L) without autograd: O like q, L in fp32 of shape q.shape[:-1]."""
    check_qkv(q, k, v)
    check_causal(is_causal)
    n, d = q.shape[-2:]
    k, v = repeat_kv(q, k), repeat_kv(q, v)
    out, lse = _forward(*(t.reshape(-1, n, d) for t in (q, k, v)), is_causal)
    return out.reshape(q.shape), lse.reshape(q.shape[:-1])


class FlashAttention2PyTorch(torch.autograd.Function):
    """apply(q, k, v, is_causal=False) -> softmax(q k^T / sqrt(D)) v for (..., N, D) inputs.
    Saves (q, k, v, O, L) for backward, L being the fp32 logsumexp of shape q.shape[:-1]."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, lse = forward_with_lse(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        n, d = q.shape[-2:]
        flat = lambda t: t.reshape(-1, n, d)
        dq, dk, dv = _backward_for(q.device)(flat(q), flat(repeat_kv(q, k)), flat(repeat_kv(q, v)), flat(out),
                                             lse.reshape(-1, n), flat(grad_out), ctx.is_causal)
        return dq.reshape(q.shape), _group_sum(dk, k.shape), _group_sum(dv, v.shape), None


def _group_sum(g: torch.Tensor, shape) -> torch.Tensor:
    """A gradient of K or V repeated to H heads, summed back over each group of H / H_kv heads."""
    if g.numel() == math.prod(shape):
        return g.reshape(shape)
    *lead, h_kv, n, d = shape
    return g.reshape(*lead, h_kv, -1, n, d).sum(-3)
