"""FlashAttention-2 in Triton: forward, and a backward without atomics (one kernel over key
tiles for dK and dV, one over query tiles for dQ). The algorithm, with its invariants, is
described in flash_attention_torch.py; this file mirrors it tile for tile.

Causal masking: a query tile [q0, q0+BLOCK_Q) sees key tiles [0, q0) in full and pays nothing
for the mask there; only the key tiles that cross the diagonal, [q0, q0+BLOCK_Q), are masked,
and key tiles past the diagonal are never visited. Ragged sequence ends (N not a multiple of
the tile) are masked in the last tile only.

Exponentials are base 2: scores are scaled by log2(e)/sqrt(D) once, so exp(x) = exp2(x*log2 e).
L (the logsumexp) is kept in natural log for the caller and converted in the kernels.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
import triton.testing

from lmperf.kernels.attention_contract import check_qkv

LOG2E = 1.4426950408889634
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# Autotuning configs, as data. The forward needs BLOCK_Q % BLOCK_K == 0 (the diagonal split),
# the backward uses one tile size for queries and keys.
FWD_CONFIGS = [
    dict(BLOCK_Q=bq, BLOCK_K=bk, num_warps=w, num_stages=s)
    for bq, bk, w, s in [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3),
                         (128, 32, 4, 4), (64, 32, 4, 4), (128, 64, 4, 4), (64, 64, 4, 4)]
]
BWD_CONFIGS = [
    dict(BLOCK=b, num_warps=w, num_stages=s)
    for b, w, s in [(64, 4, 3), (64, 8, 3), (128, 8, 3), (32, 4, 3), (64, 4, 2), (128, 4, 2)]
]
INTERPRET_FWD = [dict(BLOCK_Q=32, BLOCK_K=16, num_warps=4, num_stages=1)]
INTERPRET_BWD = [dict(BLOCK=16, num_warps=4, num_stages=1)]


def _autotune(configs, interpret_configs, prune):
    """Autotune over `configs` (declared above as data), keyed by head dim, causality and the
    sequence length bucketed to a power of two capped at 4096 (beyond it the best tile no longer
    changes with N, and retuning every N costs more than the run). Timings are cached on disk,
    so the check and benchmark jobs on one machine tune each key once."""
    return triton.autotune(
        configs=_configs(configs, interpret_configs), key=["N_KEY", "D", "IS_CAUSAL"],
        prune_configs_by={"early_config_prune": prune}, cache_results=True,
        do_bench=lambda fn, quantiles: triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles))


# One binary for every sequence length: specializing N on its divisibility by 16 would compile
# each config twice (odd and even N) and buys nothing measurable here.
NO_SPECIALIZE = ["N", "N_KEY"]


def n_key(n: int) -> int:
    return min(max(16, triton.next_power_of_2(n)), 4096)


def best_configs() -> dict[str, str]:
    """The config each autotuned kernel ran with last, e.g. {"fwd": "BLOCK_Q=128 ..."}."""
    out = {}
    for name, kernel in (("fwd", _fwd_kernel), ("bwd_dkdv", _bwd_dkdv_kernel), ("bwd_dq", _bwd_dq_kernel)):
        cfg = getattr(kernel, "best_config", None)
        if cfg is not None:
            out[name] = " ".join([*(f"{k}={v}" for k, v in cfg.kwargs.items()),
                                  f"warps={cfg.num_warps}", f"stages={cfg.num_stages}"])
    return out


def _configs(configs, interpret_configs):
    chosen = interpret_configs if INTERPRET else configs
    return [triton.Config({k: v for k, v in c.items() if k.isupper()},
                          num_warps=c["num_warps"], num_stages=c["num_stages"]) for c in chosen]


# fp32 runs exact fp32 dots ("ieee", no tensor cores): slow to compile and not what the tuning
# is for, so it gets one modest config instead of a search.
FP32_FWD = dict(BLOCK_Q=64, BLOCK_K=32, num_warps=4, num_stages=2)
FP32_BWD = dict(BLOCK=32, num_warps=4, num_stages=2)


def _is_fp32(named_args) -> bool:
    return named_args["Q"].dtype == torch.float32


def _prune_fwd(configs, named_args, **kwargs):
    if _is_fp32(named_args) and not INTERPRET:
        return _configs([FP32_FWD], [])
    n = named_args["N"]
    keep = [c for c in configs if c.kwargs["BLOCK_Q"] % c.kwargs["BLOCK_K"] == 0
            and c.kwargs["BLOCK_Q"] <= max(16, triton.next_power_of_2(n))]
    return keep or configs[:1]


def _prune_bwd(configs, named_args, **kwargs):
    if _is_fp32(named_args) and not INTERPRET:
        return _configs([FP32_BWD], [])
    n = named_args["N"]
    keep = [c for c in configs if c.kwargs["BLOCK"] <= max(16, triton.next_power_of_2(n))]
    return keep or configs[:1]


# ---------------------------------------------------------------------------------------------
# Forward


@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_q, offs_k, lo, hi, N,
               qk_scale, MASK_CAUSAL: tl.constexpr, MASK_TAIL: tl.constexpr,
               BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key tiles [lo, hi) into the running (acc, l_i, m_i) of one query tile.
    Invariant after each tile: m_i = max scaled score so far (log2 units), l_i = sum of
    exp2(score - m_i), acc = sum of exp2(score - m_i) * v."""
    for start in tl.range(lo, hi, BLOCK_K):
        cols = start + offs_k
        if MASK_TAIL:
            k = tl.load(k_ptrs + start * stride_kn, mask=cols[:, None] < N, other=0.0)
            v = tl.load(v_ptrs + start * stride_vn, mask=cols[:, None] < N, other=0.0)
        else:
            k = tl.load(k_ptrs + start * stride_kn)
            v = tl.load(v_ptrs + start * stride_vn)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASK_CAUSAL:
            s = tl.where(offs_q[:, None] >= cols[None, :], s, float("-inf"))
        if MASK_TAIL:
            s = tl.where(cols[None, :] < N, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@_autotune(FWD_CONFIGS, INTERPRET_FWD, _prune_fwd)
@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _fwd_kernel(Q, K, V, O, L, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                stride_ob, stride_on, N, N_KEY, sm_scale, D: tl.constexpr,
                IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    q_tile, bh = tl.program_id(0), tl.program_id(1)
    q0 = q_tile * BLOCK_Q
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, D)
    bh = bh.to(tl.int64)
    q = tl.load(Q + bh * stride_qb + offs_q[:, None] * stride_qn + offs_d[None, :],
                mask=offs_q[:, None] < N, other=0.0)
    k_ptrs = K + bh * stride_kb + offs_k[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + bh * stride_vb + offs_k[:, None] * stride_vn + offs_d[None, :]
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    if IS_CAUSAL:
        # Key tiles wholly left of the diagonal: no mask (all columns < q0 <= N).
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_q,
                                   offs_k, 0, q0, N, qk_scale, False, False, BLOCK_K, DOT_PRECISION)
        # Key tiles crossing the diagonal: causal mask (it also hides columns >= N).
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_q,
                                   offs_k, q0, q0 + BLOCK_Q, N, qk_scale, True, True, BLOCK_K,
                                   DOT_PRECISION)
    else:
        n_full = (N // BLOCK_K) * BLOCK_K
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_q,
                                   offs_k, 0, n_full, N, qk_scale, False, False, BLOCK_K, DOT_PRECISION)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_q,
                                   offs_k, n_full, N, N, qk_scale, False, True, BLOCK_K, DOT_PRECISION)
    out = acc / l_i[:, None]
    tl.store(O + bh * stride_ob + offs_q[:, None] * stride_on + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=offs_q[:, None] < N)
    # L in natural log: (m_i + log2 l_i) / log2(e).
    tl.store(L + bh * N + offs_q, (m_i + tl.math.log2(l_i)) / 1.4426950408889634, mask=offs_q < N)


# ---------------------------------------------------------------------------------------------
# Backward


@triton.jit
def _bwd_delta_kernel(O, DO, Delta, stride_ob, stride_on, stride_dob, stride_don, N,
                      D: tl.constexpr, BLOCK: tl.constexpr):
    """Delta = rowsum(O * dO) in fp32, per query row."""
    tile, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rows = tile * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    o = tl.load(O + bh * stride_ob + rows[:, None] * stride_on + offs_d[None, :], mask=rows[:, None] < N, other=0.0)
    do = tl.load(DO + bh * stride_dob + rows[:, None] * stride_don + offs_d[None, :], mask=rows[:, None] < N, other=0.0)
    tl.store(Delta + bh * N + rows, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=rows < N)


@triton.jit
def _bwd_dkdv_tiles(dk, dv, k, v, Q, DO, L, Delta, stride_qn, stride_don, offs_k, offs_d, lo, hi, N,
                    qk_scale, MASK_CAUSAL: tl.constexpr, BLOCK: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key tile over query tiles [lo, hi). Query rows >= N load q = 0,
    dO = 0 and L = +inf, so P = 0 there and they add nothing."""
    for start in tl.range(lo, hi, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        in_range = rows < N
        q = tl.load(Q + rows[:, None] * stride_qn + offs_d[None, :], mask=in_range[:, None], other=0.0)
        do = tl.load(DO + rows[:, None] * stride_don + offs_d[None, :], mask=in_range[:, None], other=0.0)
        lse2 = tl.load(L + rows, mask=in_range, other=float("inf")) * 1.4426950408889634
        delta = tl.load(Delta + rows, mask=in_range, other=0.0)
        # Transposed scores: sT[j, i] = k_j . q_i, so P^T comes out directly.
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
        p_t = tl.math.exp2(s_t - lse2[None, :])
        if MASK_CAUSAL:
            p_t = tl.where(rows[None, :] >= offs_k[:, None], p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)
    return dk, dv


@_autotune(BWD_CONFIGS, INTERPRET_BWD, _prune_bwd)
@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _bwd_dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV, stride_qb, stride_qn, stride_kb, stride_kn,
                     stride_vb, stride_vn, stride_dob, stride_don, stride_dkb, stride_dkn,
                     stride_dvb, stride_dvn, N, N_KEY, sm_scale, D: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    k_tile, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    k0 = k_tile * BLOCK
    offs_k = k0 + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    kv_mask = offs_k[:, None] < N
    k = tl.load(K + bh * stride_kb + offs_k[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + bh * stride_vb + offs_k[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK, D], tl.float32)
    dv = tl.zeros([BLOCK, D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    Qb, DOb, Lb, Deltab = Q + bh * stride_qb, DO + bh * stride_dob, L + bh * N, Delta + bh * N
    if IS_CAUSAL:
        # The query tile on the diagonal is masked; later query tiles see this key tile in full.
        dk, dv = _bwd_dkdv_tiles(dk, dv, k, v, Qb, DOb, Lb, Deltab, stride_qn, stride_don, offs_k,
                                 offs_d, k0, k0 + BLOCK, N, qk_scale, True, BLOCK, DOT_PRECISION)
        dk, dv = _bwd_dkdv_tiles(dk, dv, k, v, Qb, DOb, Lb, Deltab, stride_qn, stride_don, offs_k,
                                 offs_d, k0 + BLOCK, N, N, qk_scale, False, BLOCK, DOT_PRECISION)
    else:
        dk, dv = _bwd_dkdv_tiles(dk, dv, k, v, Qb, DOb, Lb, Deltab, stride_qn, stride_don, offs_k,
                                 offs_d, 0, N, N, qk_scale, False, BLOCK, DOT_PRECISION)
    tl.store(DK + bh * stride_dkb + offs_k[:, None] * stride_dkn + offs_d[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + bh * stride_dvb + offs_k[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_tiles(dq, q, do, lse2, delta, K, V, stride_kn, stride_vn, offs_q, offs_d, lo, hi, N,
                  qk_scale, MASK_CAUSAL: tl.constexpr, MASK_TAIL: tl.constexpr,
                  BLOCK: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Accumulate dQ of one query tile over key tiles [lo, hi)."""
    for start in tl.range(lo, hi, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        if MASK_TAIL:
            k = tl.load(K + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < N, other=0.0)
            v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < N, other=0.0)
        else:
            k = tl.load(K + cols[:, None] * stride_kn + offs_d[None, :])
            v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :])
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        p = tl.math.exp2(s - lse2[:, None])
        if MASK_CAUSAL:
            p = tl.where(offs_q[:, None] >= cols[None, :], p, 0.0)
        if MASK_TAIL:
            p = tl.where(cols[None, :] < N, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    return dq


@_autotune(BWD_CONFIGS, INTERPRET_BWD, _prune_bwd)
@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _bwd_dq_kernel(Q, K, V, DO, L, Delta, DQ, stride_qb, stride_qn, stride_kb, stride_kn,
                   stride_vb, stride_vn, stride_dob, stride_don, stride_dqb, stride_dqn, N, N_KEY, sm_scale,
                   D: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    q_tile, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    q0 = q_tile * BLOCK
    offs_q = q0 + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    rows_in = offs_q < N
    q = tl.load(Q + bh * stride_qb + offs_q[:, None] * stride_qn + offs_d[None, :], mask=rows_in[:, None], other=0.0)
    do = tl.load(DO + bh * stride_dob + offs_q[:, None] * stride_don + offs_d[None, :], mask=rows_in[:, None], other=0.0)
    lse2 = tl.load(L + bh * N + offs_q, mask=rows_in, other=float("inf")) * 1.4426950408889634
    delta = tl.load(Delta + bh * N + offs_q, mask=rows_in, other=0.0)
    dq = tl.zeros([BLOCK, D], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    Kb, Vb = K + bh * stride_kb, V + bh * stride_vb
    if IS_CAUSAL:
        dq = _bwd_dq_tiles(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_vn, offs_q, offs_d,
                           0, q0, N, qk_scale, False, False, BLOCK, DOT_PRECISION)
        dq = _bwd_dq_tiles(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_vn, offs_q, offs_d,
                           q0, q0 + BLOCK, N, qk_scale, True, True, BLOCK, DOT_PRECISION)
    else:
        n_full = (N // BLOCK) * BLOCK
        dq = _bwd_dq_tiles(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_vn, offs_q, offs_d,
                           0, n_full, N, qk_scale, False, False, BLOCK, DOT_PRECISION)
        dq = _bwd_dq_tiles(dq, q, do, lse2, delta, Kb, Vb, stride_kn, stride_vn, offs_q, offs_d,
                           n_full, N, N, qk_scale, False, True, BLOCK, DOT_PRECISION)
    tl.store(DQ + bh * stride_dqb + offs_q[:, None] * stride_dqn + offs_d[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows_in[:, None])


# ---------------------------------------------------------------------------------------------
# Launchers and the autograd Function


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs: exact fp32 products (PyTorch's default), not TF32.
    return "ieee" if dtype == torch.float32 else "tf32"


def _flat(t: torch.Tensor) -> torch.Tensor:
    """(..., N, D) -> (B, N, D) with unit stride along D (copies only if it must)."""
    n, d = t.shape[-2:]
    t = t.reshape(-1, n, d)
    return t if t.stride(-1) == 1 else t.contiguous()


def forward_with_lse(q, k, v, is_causal: bool = False):
    """(O, L) without autograd: O like q, L fp32 of shape q.shape[:-1]."""
    check_qkv(q, k, v)
    n, d = q.shape[-2:]
    q3, k3, v3 = _flat(q), _flat(k), _flat(v)
    out = torch.empty_like(q3)
    lse = torch.empty(q3.shape[:2], dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_Q"]), q3.shape[0])
    _fwd_kernel[grid](q3, k3, v3, out, lse, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                      v3.stride(0), v3.stride(1), out.stride(0), out.stride(1), n, n_key(n), 1.0 / math.sqrt(d),
                      D=d, IS_CAUSAL=bool(is_causal), DOT_PRECISION=_dot_precision(q.dtype))
    return out.reshape(q.shape), lse.reshape(q.shape[:-1])


def backward(q, k, v, out, lse, grad_out, is_causal: bool):
    n, d = q.shape[-2:]
    q3, k3, v3, o3, do3 = (_flat(t) for t in (q, k, v, out, grad_out))
    lse2 = lse.reshape(-1, n).contiguous()
    bh = q3.shape[0]
    delta = torch.empty(bh, n, dtype=torch.float32, device=q.device)
    block = 16 if INTERPRET else 64
    _bwd_delta_kernel[(triton.cdiv(n, block), bh)](o3, do3, delta, o3.stride(0), o3.stride(1),
                                                   do3.stride(0), do3.stride(1), n, D=d, BLOCK=block)
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    common = dict(D=d, IS_CAUSAL=bool(is_causal), DOT_PRECISION=_dot_precision(q.dtype))
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]), bh)
    _bwd_dkdv_kernel[grid](q3, k3, v3, do3, lse2, delta, dk, dv, q3.stride(0), q3.stride(1),
                           k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1), do3.stride(0),
                           do3.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), n, n_key(n),
                           1.0 / math.sqrt(d), **common)
    _bwd_dq_kernel[grid](q3, k3, v3, do3, lse2, delta, dq, q3.stride(0), q3.stride(1), k3.stride(0),
                         k3.stride(1), v3.stride(0), v3.stride(1), do3.stride(0), do3.stride(1),
                         dq.stride(0), dq.stride(1), n, n_key(n), 1.0 / math.sqrt(d), **common)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


class FlashAttention2Triton(torch.autograd.Function):
    """apply(q, k, v, is_causal=False) -> softmax(q k^T / sqrt(D)) v for (..., N, D) inputs.
    Saves (q, k, v, O, L) for backward, L being the fp32 logsumexp of shape q.shape[:-1]."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, lse = forward_with_lse(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = bool(is_causal)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, out, lse, grad_out, ctx.is_causal)
        return dq, dk, dv, None
