"""FlashAttention-2 in Triton, as PyTorch ops: `torch.ops.lmperf.flash_attention_forward` and
`..._backward`, registered with `torch.library.triton_op` so that `torch.compile` (fullgraph)
traces through them, and `FlashAttention2Triton.apply(q, k, v, is_causal=False)` on top. The
algorithm, with its invariants, is described in flash_attention_torch.py; this file mirrors it
tile for tile. One file (about 1,250 lines) on purpose: the rule table, the kernels, their
launchers and the ops change together (a tile config is only valid for the kernel beside it),
and every change here re-measures the whole FlashAttention section.

Launches: one forward kernel; backward is two kernels. The first walks the key tiles of one
query tile for dQ and also writes Delta = rowsum(O * dO) of its rows; the second walks the
query tiles of one key tile for dK and dV, reading that Delta. A backward too small to fill
the GPU is one launch instead (`_bwd_fused_kernel`): its dK/dV programs compute Delta from O
themselves and run beside the dQ programs, not after them. At low parallelism (few
programs, long loops: one head, short sequences) each kernel splits a tile's loop over SPLIT
programs (2, 4 or 8) that write fp32 partial results to their own slices: the forward's
partial (O, L) are merged by their logsumexps in a second small kernel, the backward's
partial sums are added in a fixed order after the kernel, so results do not depend on
scheduling.

Causal masking: a query tile [q0, q0+BLOCK_Q) sees key tiles [0, q0) in full and pays nothing
for the mask there; only the key tiles that cross the diagonal are masked, and key tiles past
the diagonal are never visited. Ragged sequence ends are masked in the last tile only.
Programs run tile-fastest (the tiles of one head share its K and V in L2) and, when causal,
longest tile first within a head.

Grouped-query attention: k and v may have H_kv heads dividing q's H; query head h reads K/V
head h // GROUP (GROUP = H / H_kv, a compile-time constant). The dK/dV program of a key tile
walks the GROUP query heads that read its K/V head one after another (a fixed order: the same
sums every run); K and V are never repeated in memory.

Head dims: any multiple of 8 from 8 to 256. A row block is held as one tile D_PAD = next power
of two >= max(D, 16) wide, or as two power-of-two tiles where they are narrower (`d_tiles`:
80 = 64 + 16, 96 = 64 + 32), each product over D then being two dots; columns past D are
masked to zero on load and never stored.

Exponentials are base 2: scores are scaled by QK_SCALE = log2(e)/sqrt(D) inside one FMA,
exp(x) = exp2(x*log2 e). L (the logsumexp) is kept in natural log for the caller.

fp32 inputs use "tf32x3" dots: each fp32 product as three TF32 tensor-core products (the
operands split into a high and a low TF32 part), accurate to about fp32 rounding; checked
against float64 like every other dtype.

Tile configs come from a rule table (`fwd_config`, `bwd_config`) chosen from a committed sweep
(tuning/flash_attention/data/fa_sweep_*.csv, tuning/flash_attention/NOTES.md): the config depends only on the call's
shape, dtype and causality, never on what ran before, and a launch does no tuning.
"""
from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl
from torch.library import custom_op, triton_op, wrap_triton

from lmperf.kernels.attention_contract import check_causal, check_qkv
from lmperf.kernels import launch as kernel_launch
from lmperf.kernels.launch import plain_launch

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------------------------
# Tile configs: a rule table, as data. The sweep that chose them is tuning/flash_attention/fa_sweep.py.


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a, b):
    """ceil(a / b) in plain Python (triton.cdiv is a JIT function: about 7 us a call from Python)."""
    return (a + b - 1) // b


def d_pad(d: int) -> int:
    return max(16, _pow2(d))


def d_tiles(d: int) -> tuple[int, int]:
    """(DA, DB): the column tiles a head dim is held in. Two power-of-two tiles where they are
    narrower than one padded tile (80 = 64 + 16, 96 = 64 + 32, 40 = 32 + 16 padded from 8 to
    16), else (d_pad(d), 0)."""
    da = 1 << (int(d).bit_length() - 1)  # the largest power of two <= d
    if da < 16 or da == d:
        return d_pad(d), 0
    db = max(16, _pow2(d - da))
    return (da, db) if da + db < d_pad(d) else (d_pad(d), 0)


# The H100 sweeps (tuning/flash_attention/data/fa_sweep_h100_*.csv, NOTES.md there) in short:
# long sequences want big tiles (fewer programs re-reading K/V); short ones, or few programs,
# 64-row tiles (more programs in flight, less causal waste on the diagonal); head dims padded
# to 128 behave like 128; fp32 (tf32x3 dots, 4-byte tiles) and D = 256 want 32-row tiles.
# Program order: tile-fastest keeps one head's K/V (or Q/dO) in L2 (the non-causal forward ran
# 20% slower heads-fastest); the causal dK/dV kernel is the exception, faster heads-fastest
# (its longest tiles, the first of every head, then start together).
SM_COUNT_H100 = 132


def fwd_config(n: int, d: int, dtype: torch.dtype, causal: bool, bh: int, host: bool = False) -> dict:
    """BLOCK_Q, BLOCK_K, num_warps, num_stages of the forward for one call's shape; `host`: a call the
    host launches (host_launched), which _host_bound keeps unsplit."""
    if INTERPRET:
        return dict(BLOCK_Q=32, BLOCK_K=16, num_warps=4, num_stages=1)
    dp = d_pad(d)
    if dtype == torch.float32:
        cfg = dict(BLOCK_Q=32, BLOCK_K=32, num_warps=4, num_stages=3)
    elif dp > 128:
        cfg = dict(BLOCK_Q=64, BLOCK_K=32, num_warps=4, num_stages=3)
    elif n < 8192 or dp <= 32:
        cfg = dict(BLOCK_Q=64, BLOCK_K=64, num_warps=4, num_stages=3)
    elif dp == 64:
        cfg = dict(BLOCK_Q=128, BLOCK_K=64, num_warps=8, num_stages=3)
    else:
        cfg = dict(BLOCK_Q=128, BLOCK_K=128, num_warps=8, num_stages=3)
    cfg = fit_tiles(cfg, n, "BLOCK_Q", "BLOCK_K")
    cfg["SPLIT"] = 1 if _wide_at_1024(n, d, dtype, causal, bh) or (host and _host_bound(n, d, dtype, causal)) else \
        _split(bh * cdiv(n, cfg["BLOCK_Q"]), cdiv(n, cfg["BLOCK_K"]), _min_loop(dtype))
    return cfg


# The longest causal 16-bit calls that the host launches (eager, or under torch.compile) whose kernels do
# not split, by padded head dim: (head dim up to, rows up to). A split's own launches (the forward's merge,
# the backward's sums) and buffers cost the host more than its GPU time saves there: on the H200, one
# sequence of 1,024-8,192 rows at head dim 64 and 1,024-4,096 at 128, forward + backward with the host
# 0.55-0.94x the split calls' (the GPU time 1.6-2.6x, about cuDNN's), and 1.25x past them at 8,192 x 128
# (tuning/flash_attention/NOTES.md step 82). A CUDA graph's capture keeps the split: its GPU time is what
# a replay costs.
HOST_BOUND_ROWS = ((64, 8192), (128, 4096))


def _host_bound(n: int, d: int, dtype: torch.dtype, causal: bool, group: int = 1) -> bool:
    """Whether a call that the host launches keeps its kernels unsplit (HOST_BOUND_ROWS): causal, 16
    bits, no grouped-query (`group`: the backward's), and no more rows than its head dim allows."""
    if not causal or dtype == torch.float32 or group != 1:
        return False
    dp = d_pad(d)
    return any(dp <= top and n <= rows for top, rows in HOST_BOUND_ROWS)


def host_launched(q: torch.Tensor) -> bool:
    """Whether this call's kernels are launched by the host one call at a time: not while a CUDA graph
    is captured on the current stream."""
    return not (q.is_cuda and torch.cuda.is_current_stream_capturing())


def _wide_at_1024(n: int, d: int, dtype: torch.dtype, causal: bool, bh: int, group: int = 1) -> bool:
    """Whether a call is in the class where no kernel splits and the backward is two kernels:
    causal, 16-bit, head dim 64 or 128, 16 tiles of 64 rows (961-1,024 rows: the assignment's
    harness, (16, 1,024, D)) in enough sequences that the unsplit forward gives every SM a
    program; for the backward (`group`) without grouped-query. Swept on the H200 at 16 sequences
    of 1,024 rows (tuning/flash_attention/NOTES.md step 64): unsplit, the forward's GPU time
    0.85-0.86x the split one's at head dim 64 and 0.73x at 128, two unsplit backward kernels
    0.79-0.82x and 0.73x the split ones', one fused launch 1.09x and 1.55x the two kernels'.
    Elsewhere _split's rule (up to two programs an SM) stands: longer or non-causal sequences were
    not swept here."""
    return (causal and dtype != torch.float32 and d in (64, 128) and group == 1 and cdiv(n, 64) == 16
            and bh * 16 >= SM_COUNT_H100)


def _min_loop(dtype: torch.dtype) -> int:
    """The shortest loop (in tiles) that _split splits: any in fp32, 16 tiles in 16 bits."""
    return 1 if dtype == torch.float32 else 16


def _split(programs: int, loop_tiles: int, min_loop: int = 1, min_share: int = 1) -> int:
    """Programs per tile (1, 2, 4 or 8), each over a share of the tile's loop: none when the loop
    has fewer than min_loop tiles, else doubled while the launch has fewer than two programs per
    SM and every share keeps at least min_share tiles. Swept on the H100 at batch 1 x 1 head,
    N = 128-4,096 (tuning/flash_attention/NOTES.md, v6 steps 20-21): in fp32 more parts were faster
    down to one tile a share; in 16 bits the split's own kernels (the forward's merge, the
    backward's sums and casts: about 10 us in a CUDA graph) cost more than it saves below 16
    tiles of loop, so 16-bit callers pass min_loop=16. 8 parts were slower than 4 once a launch
    had enough programs (fp32 D = 128, N = 4,096)."""
    split = 1
    if loop_tiles < min_loop:
        return split
    while split < 8 and programs * split < 2 * SM_COUNT_H100 and loop_tiles >= 2 * split * min_share:
        split *= 2
    return split


def bwd_config(n: int, d: int, dtype: torch.dtype, causal: bool, bh: int, group: int = 1, host: bool = False) -> dict:
    """Configs of the two backward kernels: "dq" walks BLOCK_N2 keys at a time past a tile of
    BLOCK_M2 query rows; "dkdv" walks BLOCK_M query rows at a time past a tile of BLOCK_N keys
    (HEADS_FASTEST: program order), for each of the `group` query heads that read its K/V head
    (bh // group K/V sequences); "fused": both in one launch (`_fused`). `host`: a call the host
    launches (host_launched), which _host_bound keeps unsplit."""
    if INTERPRET:
        cfg = dict(dq=dict(BLOCK_M2=32, BLOCK_N2=16, num_warps=4, num_stages=1, SPLIT=1),
                   dkdv=dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1, HEADS_FASTEST=causal, SPLIT=1))
        return {**cfg, "fused": _fused(cfg, n, dtype, bh, group)}
    dp = d_pad(d)
    min_share = 1  # tiles of loop each part of a split keeps at least
    if dtype == torch.float32 and dp >= 128 and n <= 512:
        # short single-head sequences: 16-row tiles, parts of at least 2 tiles (tuning/flash_attention/NOTES.md step 25)
        dq = dict(BLOCK_M2=16, BLOCK_N2=16, num_warps=4, num_stages=2)
        dkdv = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2)
        min_share = 2
    elif dtype == torch.float32:
        dq = dict(BLOCK_M2=32, BLOCK_N2=32, num_warps=4, num_stages=2)
        dkdv = dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)
    elif dp > 128:
        dq = dict(BLOCK_M2=64, BLOCK_N2=32, num_warps=4, num_stages=2)
        dkdv = dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)
    elif d == dp == 128 and 256 <= n <= 512:  # step 25's sweep of the whole backward: unsplit
        dq = dict(BLOCK_M2=64, BLOCK_N2=32, num_warps=4, num_stages=3)
        dkdv = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3)
        min_share = n  # no split: shares would need n tiles each
    else:
        if dp <= 64:
            dq = dict(BLOCK_M2=64, BLOCK_N2=64, num_warps=4, num_stages=3)
        elif d == dp:
            dq = dict(BLOCK_M2=64, BLOCK_N2=64, num_warps=4, num_stages=2)
        else:  # padded to 128 (e.g. 80)
            dq = dict(BLOCK_M2=64, BLOCK_N2=32, num_warps=4, num_stages=3)
        # causal, D <= 64: 128-key tiles when they alone give every SM several programs
        if causal and dp <= 64 and bh * cdiv(n, 128) >= 4 * SM_COUNT_H100:
            dkdv = dict(BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=3)
        elif d != dp and n >= 2048:  # padded D (the 2.7B's 80) at long context: step 24's sweep
            dkdv = dict(BLOCK_M=16, BLOCK_N=128, num_warps=4, num_stages=3)
        else:
            dkdv = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    dkdv["HEADS_FASTEST"] = causal
    dq, dkdv = fit_tiles(dq, n, "BLOCK_M2", "BLOCK_N2"), fit_tiles(dkdv, n, "BLOCK_N", "BLOCK_M")
    # few programs and long loops: several programs per tile, each writing fp32 partial sums
    wide = _wide_at_1024(n, d, dtype, causal, bh, group)
    unsplit = wide or (host and _host_bound(n, d, dtype, causal, group))
    dq["SPLIT"] = 1 if unsplit else _split(bh * cdiv(n, dq["BLOCK_M2"]), cdiv(n, dq["BLOCK_N2"]), _min_loop(dtype),
                                        min_share)
    dkdv["SPLIT"] = 1 if unsplit else _split(bh // group * cdiv(n, dkdv["BLOCK_N"]), group * cdiv(n, dkdv["BLOCK_M"]),
                                          _min_loop(dtype), min_share)
    cfg = dict(dq=dq, dkdv=dkdv)
    return {**cfg, "fused": not wide and _fused(cfg, n, dtype, bh, group)}


def _fused(cfg: dict, n: int, dtype: torch.dtype, bh: int, group: int = 1) -> bool:
    """One launch for dQ and dK/dV (`_bwd_fused_kernel`): the two run side by side, and the
    backward takes about the longer of the two loops instead of both one after the other. The
    fused dK/dV programs recompute Delta for every query tile they visit, so big launches keep
    two kernels. From the sweep of the whole backward (H100; tuning/flash_attention/NOTES.md
    step 25): fused was faster at every shape of up to 4 programs per SM with N <= 1,024 (one
    head at N = 128-1,024 in all three head dims and both dtype families, batch 4 x 12 and 16
    heads at N = 256), and at N = 2,048 in 16 bits; two kernels were faster at 8 per SM (4 x 32
    heads x 256) and for fp32 D = 128 at N = 2,048."""
    dq, dkdv = cfg["dq"], cfg["dkdv"]
    programs = bh * cdiv(n, dq["BLOCK_M2"]) * dq["SPLIT"] + bh // group * cdiv(n, dkdv["BLOCK_N"]) * dkdv["SPLIT"]
    return programs <= 4 * SM_COUNT_H100 and (n <= 1024 or (n <= 2048 and dtype != torch.float32))


fwd_config_memo = functools.lru_cache(maxsize=1024)(fwd_config)
bwd_config_memo = functools.lru_cache(maxsize=1024)(bwd_config)


def launch_fwd_config(n, d, dtype, causal, bh, host=False):
    """The config a launch uses: the rule (fwd_config), memoised (its dicts are only read);
    traced symbolic sizes (SymInt, unhashable) go to the rule itself."""
    return (fwd_config_memo if type(n) is type(d) is type(bh) is int else fwd_config)(n, d, dtype, causal, bh, host)


def launch_bwd_config(n, d, dtype, causal, bh, group=1, host=False):
    """The config a backward launch uses: bwd_config, memoised like launch_fwd_config."""
    return (bwd_config_memo if type(n) is type(d) is type(bh) is int else bwd_config)(n, d, dtype, causal, bh, group,
                                                                                     host)


def fit_tiles(cfg: dict, n: int, outer: str, inner: str) -> dict:
    """Shrink the outer tile to the sequence (at least 16) and keep inner <= outer, so that
    short sequences do not run mostly-masked tiles."""
    cfg = dict(cfg)
    cfg[outer] = min(cfg[outer], max(16, _pow2(n)))
    cfg[inner] = min(cfg[inner], cfg[outer])
    return cfg


# ---------------------------------------------------------------------------------------------
# Tile loads


@triton.jit
def _load(ptrs, rows, N, offs_d, D: tl.constexpr, D_PAD: tl.constexpr, MASK_ROWS: tl.constexpr):
    """A [rows, D_PAD] tile; rows >= N (if MASK_ROWS) and columns >= D read as zero."""
    if MASK_ROWS:
        if D == D_PAD:
            x = tl.load(ptrs, mask=rows[:, None] < N, other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows[:, None] < N) & (offs_d[None, :] < D), other=0.0)
    else:
        if D == D_PAD:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < D, other=0.0)
    return x


@triton.jit
def _store(ptrs, x, rows, N, offs_d, D: tl.constexpr, D_PAD: tl.constexpr):
    """Write a [rows, D_PAD] tile (rows < N, columns < D)."""
    if D == D_PAD:
        mask = rows[:, None] < N
    else:
        mask = (rows[:, None] < N) & (offs_d[None, :] < D)
    tl.store(ptrs, x, mask=mask)


# A row block of a (., N, D) tensor is held as two column tiles: A = columns [0, DA) (DAV of them
# real) and, when DB > 0, B = columns [DA, DA + DB) (DBV real). D = 80 is 64 + 16, D = 96 is
# 64 + 32: no padding to 128. Power-of-two D (and D where two tiles would save nothing) is one
# tile, DA = D_PAD, DB = 0; then B is a placeholder the kernels never touch.


@triton.jit
def _load_ab(base, rows, N, stride_n, DA: tl.constexpr, DAV: tl.constexpr, DB: tl.constexpr,
             DBV: tl.constexpr, MASK_ROWS: tl.constexpr):
    offs_a = tl.arange(0, DA)
    a = _load(base + rows[:, None] * stride_n + offs_a[None, :], rows, N, offs_a, DAV, DA, MASK_ROWS)
    if DB > 0:
        offs_b = tl.arange(0, DB)
        b = _load(base + rows[:, None] * stride_n + DA + offs_b[None, :], rows, N, offs_b, DBV, DB, MASK_ROWS)
    else:
        b = a
    return a, b


@triton.jit
def _store_ab(base, a, b, rows, N, stride_n, DA: tl.constexpr, DAV: tl.constexpr, DB: tl.constexpr,
              DBV: tl.constexpr):
    offs_a = tl.arange(0, DA)
    _store(base + rows[:, None] * stride_n + offs_a[None, :], a, rows, N, offs_a, DAV, DA)
    if DB > 0:
        offs_b = tl.arange(0, DB)
        _store(base + rows[:, None] * stride_n + DA + offs_b[None, :], b, rows, N, offs_b, DBV, DB)


@triton.jit
def _dot_t(xa, xb, ya, yb, DB: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """x y^T over the (A, B) column tiles: [M, D] x [N, D] -> [M, N] fp32."""
    s = tl.dot(xa, tl.trans(ya), input_precision=DOT_PRECISION)
    if DB > 0:
        s = tl.dot(xb, tl.trans(yb), s, input_precision=DOT_PRECISION)
    return s


@triton.jit
def _dot_acc(p, ya, yb, acc_a, acc_b, DB: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """(acc_a, acc_b) += p y over the (A, B) column tiles of y: [M, N] x [N, D]."""
    acc_a = tl.dot(p.to(ya.dtype), ya, acc_a, input_precision=DOT_PRECISION)
    if DB > 0:
        acc_b = tl.dot(p.to(yb.dtype), yb, acc_b, input_precision=DOT_PRECISION)
    return acc_a, acc_b


@triton.jit
def _zeros_ab(ROWS: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr):
    a = tl.zeros([ROWS, DA], tl.float32)
    if DB > 0:
        b = tl.zeros([ROWS, DB], tl.float32)
    else:
        b = a
    return a, b


@triton.jit
def _part_range(part, end, BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    """[lo, hi): this part's share of the tiles in [0, end) (end a multiple of BLOCK), in SPLIT
    contiguous chunks of whole tiles; trailing parts may be empty."""
    per = tl.cdiv(end // BLOCK, SPLIT) * BLOCK
    lo = tl.minimum(part * per, end)
    return lo, tl.minimum(lo + per, end)


# ---------------------------------------------------------------------------------------------
# Forward


@triton.jit
def _fwd_tiles(acc_a, acc_b, l_i, m_i, qa, qb, K, V, stride_kn, stride_vn, offs_q, lo, hi, N,
               QK_SCALE: tl.constexpr, DA: tl.constexpr, DAV: tl.constexpr, DB: tl.constexpr,
               DBV: tl.constexpr, MASK_CAUSAL: tl.constexpr, MASK_TAIL: tl.constexpr,
               BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key tiles [lo, hi) into the running (acc, l_i, m_i) of one query tile.
    Invariant after each tile: m_i = max scaled score so far (log2 units), l_i = sum of
    exp2(score - m_i), acc = sum of exp2(score - m_i) * v."""
    offs_k = tl.arange(0, BLOCK_K)
    for start in tl.range(lo, hi, BLOCK_K):
        cols = start + offs_k
        ka, kb = _load_ab(K, cols, N, stride_kn, DA, DAV, DB, DBV, MASK_TAIL)
        va, vb = _load_ab(V, cols, N, stride_vn, DA, DAV, DB, DBV, MASK_TAIL)
        s = _dot_t(qa, qb, ka, kb, DB, DOT_PRECISION)
        if MASK_CAUSAL:
            s = tl.where(offs_q[:, None] >= cols[None, :], s, float("-inf"))
        if MASK_TAIL:
            s = tl.where(cols[None, :] < N, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * QK_SCALE)
        p = tl.math.exp2(s * QK_SCALE - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc_a = acc_a * alpha[:, None]
        if DB > 0:
            acc_b = acc_b * alpha[:, None]
        acc_a, acc_b = _dot_acc(p, va, vb, acc_a, acc_b, DB, DOT_PRECISION)
        m_i = m_new
    return acc_a, acc_b, l_i, m_i


@triton.jit
def _fwd_kernel(Q, K, V, O, L, H, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_os, stride_ob, stride_oh, stride_on, stride_ls, N, QK_SCALE: tl.constexpr, DA: tl.constexpr,
                DAV: tl.constexpr, DB: tl.constexpr, DBV: tl.constexpr, IS_CAUSAL: tl.constexpr,
                DOT_PRECISION: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                SPLIT: tl.constexpr, GROUP: tl.constexpr):
    """O and L of one query tile. SPLIT > 1: SPLIT programs per query tile, each over its share of
    the key tiles, writing its own normalised partial O (fp32) and logsumexp to slice `part` of
    O and L; _fwd_combine_kernel merges them. Sequence bh is (batch bh // H, head bh % H) of
    tensors with their own batch and head strides; query head h reads K/V head h // GROUP."""
    q_tile = tl.program_id(0) // SPLIT
    part = tl.program_id(0) % SPLIT
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    if IS_CAUSAL:  # the last query tile has the most keys: start it first
        q_tile = tl.num_programs(0) // SPLIT - 1 - q_tile
    q0 = q_tile * BLOCK_Q
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    qa, qb = _load_ab(Q + b * stride_qb + h * stride_qh, offs_q, N, stride_qn, DA, DAV, DB, DBV, True)
    Kb, Vb = K + b * stride_kb + (h // GROUP) * stride_kh, V + b * stride_vb + (h // GROUP) * stride_vh
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc_a, acc_b = _zeros_ab(BLOCK_Q, DA, DB)
    # Key tiles needing no mask: causal, those wholly left of the diagonal (all columns < q0 <= N);
    # otherwise all but a ragged last one. Split in SPLIT shares; the last part also takes the
    # masked tiles (the diagonal, or the ragged end).
    if IS_CAUSAL:
        end = q0
    else:
        end = (N // BLOCK_K) * BLOCK_K
    lo = 0
    hi = end
    if SPLIT > 1:
        lo, hi = _part_range(part, end, BLOCK_K, SPLIT)
    acc_a, acc_b, l_i, m_i = _fwd_tiles(acc_a, acc_b, l_i, m_i, qa, qb, Kb, Vb, stride_kn, stride_vn, offs_q,
                                        lo, hi, N, QK_SCALE, DA, DAV, DB, DBV, False, False, BLOCK_K,
                                        DOT_PRECISION)
    if part == SPLIT - 1:
        if IS_CAUSAL:  # the causal mask also hides columns >= N
            acc_a, acc_b, l_i, m_i = _fwd_tiles(acc_a, acc_b, l_i, m_i, qa, qb, Kb, Vb, stride_kn, stride_vn,
                                                offs_q, q0, q0 + BLOCK_Q, N, QK_SCALE, DA, DAV, DB, DBV,
                                                True, True, BLOCK_K, DOT_PRECISION)
        else:
            acc_a, acc_b, l_i, m_i = _fwd_tiles(acc_a, acc_b, l_i, m_i, qa, qb, Kb, Vb, stride_kn, stride_vn,
                                                offs_q, end, N, N, QK_SCALE, DA, DAV, DB, DBV, False, True,
                                                BLOCK_K, DOT_PRECISION)
    # L in natural log: (m_i + log2 l_i) * ln 2.
    if SPLIT == 1:
        inv = 1.0 / l_i
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    else:  # a part that saw no keys (l_i = 0) writes O = 0 and L = -inf: weight 0 in the merge
        seen = l_i > 0
        inv = 1.0 / tl.where(seen, l_i, 1.0)
        lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453,
                       float("-inf"))
    _store_ab(O + part * stride_os + b * stride_ob + h * stride_oh, (acc_a * inv[:, None]).to(O.dtype.element_ty),
              (acc_b * inv[:, None]).to(O.dtype.element_ty), offs_q, N, stride_on, DA, DAV, DB, DBV)
    tl.store(L + part * stride_ls + bh * N + offs_q, lse, mask=offs_q < N)


@triton.jit
def _fwd_combine_kernel(OS, LS, O, L, H, stride_os, stride_osb, stride_osh, stride_osn, stride_ls, stride_ob,
                        stride_oh, stride_on, N, D: tl.constexpr, D_PAD: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """Merge the SPLIT partial (O_p, L_p) of a split forward: L = log sum_p exp(L_p),
    O = sum_p exp(L_p - L) O_p. Every row has keys in at least one part, so L is finite."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    offs_d = tl.arange(0, D_PAD)
    rows_in = rows < N
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for p in tl.static_range(SPLIT):
        m = tl.maximum(m, tl.load(LS + p * stride_ls + bh * N + rows, mask=rows_in, other=float("-inf")))
    m = tl.where(rows_in, m, 0.0)
    w_sum = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, D_PAD], tl.float32)
    for p in tl.static_range(SPLIT):
        w = tl.exp(tl.load(LS + p * stride_ls + bh * N + rows, mask=rows_in, other=float("-inf")) - m)
        o = _load(OS + p * stride_os + b * stride_osb + h * stride_osh + rows[:, None] * stride_osn + offs_d[None, :], rows, N,
                  offs_d, D, D_PAD, True)
        acc += w[:, None] * o
        w_sum += w
    w_sum = tl.where(rows_in, w_sum, 1.0)
    _store(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + offs_d[None, :],
           (acc / w_sum[:, None]).to(O.dtype.element_ty), rows, N, offs_d, D, D_PAD)
    tl.store(L + bh * N + rows, m + tl.log(w_sum), mask=rows_in)


# ---------------------------------------------------------------------------------------------
# Backward


@triton.jit
def _bwd_dq_tiles(dqa, dqb, qa, qb, doa, dob, lse2, delta, K, V, stride_kn, stride_vn, offs_q, lo, hi, N,
                  QK_SCALE: tl.constexpr, DA: tl.constexpr, DAV: tl.constexpr, DB: tl.constexpr,
                  DBV: tl.constexpr, MASK_CAUSAL: tl.constexpr, MASK_TAIL: tl.constexpr,
                  BLOCK_N2: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Accumulate dQ (unscaled) of one query tile over key tiles [lo, hi)."""
    offs_k = tl.arange(0, BLOCK_N2)
    for start in tl.range(lo, hi, BLOCK_N2):
        cols = start + offs_k
        ka, kb = _load_ab(K, cols, N, stride_kn, DA, DAV, DB, DBV, MASK_TAIL)
        va, vb = _load_ab(V, cols, N, stride_vn, DA, DAV, DB, DBV, MASK_TAIL)
        s = _dot_t(qa, qb, ka, kb, DB, DOT_PRECISION)
        p = tl.math.exp2(s * QK_SCALE - lse2[:, None])
        if MASK_CAUSAL:
            p = tl.where(offs_q[:, None] >= cols[None, :], p, 0.0)
        if MASK_TAIL:
            p = tl.where(cols[None, :] < N, p, 0.0)
        dp = _dot_t(doa, dob, va, vb, DB, DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dqa, dqb = _dot_acc(ds, ka, kb, dqa, dqb, DB, DOT_PRECISION)
    return dqa, dqb


@triton.jit
def _bwd_dq_program(q_tile, part, bh, Q, K, V, O, DO, L, Delta, DQ, H, stride_qb, stride_qh, stride_qn,
                    stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_ob, stride_oh,
                    stride_on, stride_dob, stride_doh, stride_don, stride_dqs, stride_dqb, stride_dqh,
                    stride_dqn, N, QK_SCALE: tl.constexpr, SM_SCALE: tl.constexpr, DA: tl.constexpr,
                    DAV: tl.constexpr, DB: tl.constexpr, DBV: tl.constexpr, IS_CAUSAL: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
                    SPLIT: tl.constexpr, STORE_DELTA: tl.constexpr, GROUP: tl.constexpr):
    """dQ of query tile `q_tile` (counted from the last when causal: the longest loop first),
    share `part` of its key tiles, of query sequence bh (its K/V head: h // GROUP); Delta =
    rowsum(O * dO) of its rows, written for the dK/dV kernel when STORE_DELTA. SPLIT > 1: the
    fp32 partial dQ goes to slice `part` of DQ."""
    b, h = bh // H, bh % H
    if IS_CAUSAL:
        q_tile = tl.cdiv(N, BLOCK_M2) - 1 - q_tile
    q0 = q_tile * BLOCK_M2
    offs_q = q0 + tl.arange(0, BLOCK_M2)
    rows_in = offs_q < N
    qa, qb = _load_ab(Q + b * stride_qb + h * stride_qh, offs_q, N, stride_qn, DA, DAV, DB, DBV, True)
    doa, dob = _load_ab(DO + b * stride_dob + h * stride_doh, offs_q, N, stride_don, DA, DAV, DB, DBV, True)
    oa, ob = _load_ab(O + b * stride_ob + h * stride_oh, offs_q, N, stride_on, DA, DAV, DB, DBV, True)
    delta = tl.sum(oa.to(tl.float32) * doa.to(tl.float32), 1)
    if DB > 0:
        delta += tl.sum(ob.to(tl.float32) * dob.to(tl.float32), 1)
    if STORE_DELTA:
        if part == 0:  # one of the parts (the only one when SPLIT = 1) writes Delta
            tl.store(Delta + bh * N + offs_q, delta, mask=rows_in)
    # Rows >= N: L = +inf, so P = 0 there.
    lse2 = tl.load(L + bh * N + offs_q, mask=rows_in, other=float("inf")) * 1.4426950408889634
    dqa, dqb = _zeros_ab(BLOCK_M2, DA, DB)
    Kb, Vb = K + b * stride_kb + (h // GROUP) * stride_kh, V + b * stride_vb + (h // GROUP) * stride_vh
    # unmasked key tiles [0, end) (in SPLIT shares), then the masked ones (the diagonal, or the
    # ragged end) by the last part
    if IS_CAUSAL:
        end = q0
    else:
        end = (N // BLOCK_N2) * BLOCK_N2
    lo = 0
    hi = end
    if SPLIT > 1:
        lo, hi = _part_range(part, end, BLOCK_N2, SPLIT)
    dqa, dqb = _bwd_dq_tiles(dqa, dqb, qa, qb, doa, dob, lse2, delta, Kb, Vb, stride_kn, stride_vn, offs_q,
                             lo, hi, N, QK_SCALE, DA, DAV, DB, DBV, False, False, BLOCK_N2, DOT_PRECISION)
    if part == SPLIT - 1:
        if IS_CAUSAL:
            dqa, dqb = _bwd_dq_tiles(dqa, dqb, qa, qb, doa, dob, lse2, delta, Kb, Vb, stride_kn, stride_vn,
                                     offs_q, q0, q0 + BLOCK_M2, N, QK_SCALE, DA, DAV, DB, DBV, True, True,
                                     BLOCK_N2, DOT_PRECISION)
        else:
            dqa, dqb = _bwd_dq_tiles(dqa, dqb, qa, qb, doa, dob, lse2, delta, Kb, Vb, stride_kn, stride_vn,
                                     offs_q, end, N, N, QK_SCALE, DA, DAV, DB, DBV, False, True,
                                     BLOCK_N2, DOT_PRECISION)
    _store_ab(DQ + part * stride_dqs + b * stride_dqb + h * stride_dqh, (dqa * SM_SCALE).to(DQ.dtype.element_ty),
              (dqb * SM_SCALE).to(DQ.dtype.element_ty), offs_q, N, stride_dqn, DA, DAV, DB, DBV)


@triton.jit
def _bwd_dq_kernel(Q, K, V, O, DO, L, Delta, DQ, H, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh,
                   stride_kn, stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on, stride_dob,
                   stride_doh, stride_don, stride_dqs, stride_dqb, stride_dqh, stride_dqn, N, QK_SCALE: tl.constexpr, SM_SCALE: tl.constexpr,
                   DA: tl.constexpr, DAV: tl.constexpr, DB: tl.constexpr, DBV: tl.constexpr,
                   IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M2: tl.constexpr,
                   BLOCK_N2: tl.constexpr, SPLIT: tl.constexpr, GROUP: tl.constexpr):
    """dQ of one query tile, and Delta = rowsum(O * dO) of its rows for the dK/dV kernel.
    SPLIT > 1: SPLIT programs per query tile, each over its share of the key tiles, writing its
    fp32 partial dQ to slice `part` of DQ (summed after the kernel, in a fixed order)."""
    _bwd_dq_program(tl.program_id(0) // SPLIT, tl.program_id(0) % SPLIT, tl.program_id(1).to(tl.int64),
                    Q, K, V, O, DO, L, Delta, DQ, H, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh,
                    stride_kn, stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on, stride_dob,
                    stride_doh, stride_don, stride_dqs, stride_dqb, stride_dqh, stride_dqn, N, QK_SCALE,
                    SM_SCALE, DA, DAV, DB, DBV, IS_CAUSAL, DOT_PRECISION, BLOCK_M2, BLOCK_N2, SPLIT, True,
                    GROUP)


@triton.jit
def _bwd_dkdv_tiles(dka, dkb, dva, dvb, ka, kb, va, vb, Q, O, DO, L, Delta, stride_qn, stride_on, stride_don,
                    offs_k, lo, hi, N, QK_SCALE: tl.constexpr, DA: tl.constexpr, DAV: tl.constexpr,
                    DB: tl.constexpr, DBV: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                    BLOCK_M: tl.constexpr, DOT_PRECISION: tl.constexpr, INLINE_DELTA: tl.constexpr):
    """Accumulate dK (unscaled) and dV of one key tile over query tiles [lo, hi). Query rows
    >= N load q = 0, dO = 0 and L = +inf, so P = 0 there and they add nothing. INLINE_DELTA:
    Delta = rowsum(O * dO) computed here from each query tile's O (when the dQ program that
    writes it runs beside this one, in the same launch), else read."""
    for start in tl.range(lo, hi, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        in_range = rows < N
        qa, qb = _load_ab(Q, rows, N, stride_qn, DA, DAV, DB, DBV, True)
        doa, dob = _load_ab(DO, rows, N, stride_don, DA, DAV, DB, DBV, True)
        lse2 = tl.load(L + rows, mask=in_range, other=float("inf")) * 1.4426950408889634
        if INLINE_DELTA:
            oa, ob = _load_ab(O, rows, N, stride_on, DA, DAV, DB, DBV, True)
            delta = tl.sum(oa.to(tl.float32) * doa.to(tl.float32), 1)
            if DB > 0:
                delta += tl.sum(ob.to(tl.float32) * dob.to(tl.float32), 1)
        else:
            delta = tl.load(Delta + rows, mask=in_range, other=0.0)
        # Transposed scores: sT[j, i] = k_j . q_i, so P^T comes out directly.
        s_t = _dot_t(ka, kb, qa, qb, DB, DOT_PRECISION)
        p_t = tl.math.exp2(s_t * QK_SCALE - lse2[None, :])
        if MASK_CAUSAL:
            p_t = tl.where(rows[None, :] >= offs_k[:, None], p_t, 0.0)
        dva, dvb = _dot_acc(p_t, doa, dob, dva, dvb, DB, DOT_PRECISION)
        dp_t = _dot_t(va, vb, doa, dob, DB, DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dka, dkb = _dot_acc(ds_t, qa, qb, dka, dkb, DB, DOT_PRECISION)
    return dka, dkb, dva, dvb


@triton.jit
def _bwd_dkdv_head(dka, dkb, dva, dvb, ka, kb, va, vb, Qb, Ob, DOb, Lb, Deltab, stride_qn, stride_on,
                   stride_don, offs_k, k0, part, N, QK_SCALE: tl.constexpr, DA: tl.constexpr,
                   DAV: tl.constexpr, DB: tl.constexpr, DBV: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLIT: tl.constexpr, INLINE_DELTA: tl.constexpr):
    """Accumulate one query head's share `part` of its query tiles into the key tile's dK, dV.
    Causal: query tiles crossing the diagonal are masked (by the first part); later ones see
    this key tile in full. The unmasked range [start, N) is split in SPLIT shares."""
    lo = 0
    if IS_CAUSAL:
        lo = k0 + BLOCK_N
        if part == 0:
            dka, dkb, dva, dvb = _bwd_dkdv_tiles(dka, dkb, dva, dvb, ka, kb, va, vb, Qb, Ob, DOb, Lb, Deltab,
                                                 stride_qn, stride_on, stride_don, offs_k, k0, k0 + BLOCK_N, N,
                                                 QK_SCALE, DA, DAV, DB, DBV, True, BLOCK_M, DOT_PRECISION,
                                                 INLINE_DELTA)
    hi = N
    if SPLIT > 1:  # shares of whole tiles from lo; the last share's end may pass N (rows masked)
        start = lo
        lo, hi = _part_range(part, tl.cdiv(tl.maximum(N - start, 0), BLOCK_M) * BLOCK_M, BLOCK_M, SPLIT)
        lo += start
        hi += start
    return _bwd_dkdv_tiles(dka, dkb, dva, dvb, ka, kb, va, vb, Qb, Ob, DOb, Lb, Deltab, stride_qn, stride_on,
                           stride_don, offs_k, lo, hi, N, QK_SCALE, DA, DAV, DB, DBV, False, BLOCK_M,
                           DOT_PRECISION, INLINE_DELTA)


@triton.jit
def _bwd_dkdv_program(k_tile, part, bkv, Q, K, V, O, DO, L, Delta, DK, DV, H, stride_qb, stride_qh, stride_qn,
                      stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_ob, stride_oh,
                      stride_on, stride_dob, stride_doh, stride_don, stride_dks, stride_dkb, stride_dkh,
                      stride_dkn, stride_dvs, stride_dvb, stride_dvh, stride_dvn, N, QK_SCALE: tl.constexpr,
                      SM_SCALE: tl.constexpr, DA: tl.constexpr, DAV: tl.constexpr, DB: tl.constexpr,
                      DBV: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                      INLINE_DELTA: tl.constexpr, GROUP: tl.constexpr):
    """dK and dV of key tile `k_tile` of K/V sequence bkv (batch bkv // (H / GROUP), K/V head
    hk), share `part` of its query tiles, summed over the GROUP query heads hk * GROUP + g that
    read this K/V head, g in order (a fixed order: the same result every run). SPLIT > 1: fp32
    partial sums to slice `part` of DK and DV (summed after). O is read only with INLINE_DELTA."""
    h_kv = H // GROUP
    b, hk = bkv // h_kv, bkv % h_kv
    k0 = k_tile * BLOCK_N
    offs_k = k0 + tl.arange(0, BLOCK_N)
    ka, kb = _load_ab(K + b * stride_kb + hk * stride_kh, offs_k, N, stride_kn, DA, DAV, DB, DBV, True)
    va, vb = _load_ab(V + b * stride_vb + hk * stride_vh, offs_k, N, stride_vn, DA, DAV, DB, DBV, True)
    dka, dkb = _zeros_ab(BLOCK_N, DA, DB)
    dva, dvb = _zeros_ab(BLOCK_N, DA, DB)
    for g in range(GROUP):  # GROUP = 1: one trip, folded away by the compiler
        h = hk * GROUP + g
        bh = b * H + h
        dka, dkb, dva, dvb = _bwd_dkdv_head(
            dka, dkb, dva, dvb, ka, kb, va, vb, Q + b * stride_qb + h * stride_qh, O + b * stride_ob + h * stride_oh,
            DO + b * stride_dob + h * stride_doh, L + bh * N, Delta + bh * N, stride_qn, stride_on, stride_don,
            offs_k, k0, part, N, QK_SCALE, DA, DAV, DB, DBV, IS_CAUSAL, DOT_PRECISION, BLOCK_M, BLOCK_N, SPLIT,
            INLINE_DELTA)
    _store_ab(DK + part * stride_dks + b * stride_dkb + hk * stride_dkh, (dka * SM_SCALE).to(DK.dtype.element_ty),
              (dkb * SM_SCALE).to(DK.dtype.element_ty), offs_k, N, stride_dkn, DA, DAV, DB, DBV)
    _store_ab(DV + part * stride_dvs + b * stride_dvb + hk * stride_dvh, dva.to(DV.dtype.element_ty),
              dvb.to(DV.dtype.element_ty), offs_k, N, stride_dvn, DA, DAV, DB, DBV)


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV, H, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh,
                     stride_kn, stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                     stride_dks, stride_dkb, stride_dkh, stride_dkn, stride_dvs, stride_dvb, stride_dvh,
                     stride_dvn, N, QK_SCALE: tl.constexpr, SM_SCALE: tl.constexpr,
                     DA: tl.constexpr, DAV: tl.constexpr, DB: tl.constexpr, DBV: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, HEADS_FASTEST: tl.constexpr, SPLIT: tl.constexpr,
                     GROUP: tl.constexpr):
    """dK and dV of one key tile of one K/V sequence (the grid's heads are the K/V heads), reading
    the Delta the dQ kernel wrote. SPLIT > 1: SPLIT programs per key tile, each over its share of
    the query tiles."""
    # causal: the first key tile has the most queries, and starts first
    if HEADS_FASTEST:
        tile = tl.program_id(1)
        bkv = tl.program_id(0).to(tl.int64)
    else:
        tile = tl.program_id(0)
        bkv = tl.program_id(1).to(tl.int64)
    _bwd_dkdv_program(tile // SPLIT, tile % SPLIT, bkv, Q, K, V, Q, DO, L, Delta, DK, DV, H, stride_qb,
                      stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                      0, 0, 0, stride_dob, stride_doh, stride_don, stride_dks, stride_dkb, stride_dkh,
                      stride_dkn, stride_dvs, stride_dvb, stride_dvh, stride_dvn, N, QK_SCALE, SM_SCALE,
                      DA, DAV, DB, DBV, IS_CAUSAL, DOT_PRECISION, BLOCK_M, BLOCK_N, SPLIT, False, GROUP)


@triton.jit
def _bwd_fused_kernel(Q, K, V, O, DO, L, DQ, DK, DV, H, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh,
                      stride_kn, stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on, stride_dob,
                      stride_doh, stride_don, stride_dqs, stride_dqb, stride_dqh, stride_dqn, stride_dks,
                      stride_dkb, stride_dkh, stride_dkn, stride_dvs, stride_dvb, stride_dvh, stride_dvn, N,
                      QK_SCALE: tl.constexpr, SM_SCALE: tl.constexpr, DA: tl.constexpr, DAV: tl.constexpr,
                      DB: tl.constexpr, DBV: tl.constexpr, IS_CAUSAL: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
                      SPLIT_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      SPLIT: tl.constexpr, GROUP: tl.constexpr):
    """The whole backward in one launch, for launches too small to fill the GPU. The grid's
    heads are the query heads; the first programs of each are dK/dV programs (the longest
    first, Delta computed from each query tile's O), the rest dQ (SPLIT_Q per query tile). A K/V
    head's key tiles x SPLIT dK/dV programs are dealt round-robin to the GROUP query heads that
    read it (program p of query head g takes dK/dV program p * GROUP + g), so no slot idles.
    The two run side by side, so the backward's critical path is the longer of the two loops,
    not their sum."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    kv_slots = tl.cdiv(tl.cdiv(N, BLOCK_N) * SPLIT, GROUP)
    if pid < kv_slots:
        kv_pid = pid * GROUP + bh % GROUP
        if kv_pid < tl.cdiv(N, BLOCK_N) * SPLIT:
            _bwd_dkdv_program(kv_pid // SPLIT, kv_pid % SPLIT, bh // GROUP, Q, K, V, O, DO, L, L, DK, DV, H,
                              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb,
                              stride_vh, stride_vn, stride_ob, stride_oh, stride_on, stride_dob, stride_doh,
                              stride_don, stride_dks, stride_dkb, stride_dkh, stride_dkn, stride_dvs, stride_dvb,
                              stride_dvh, stride_dvn, N, QK_SCALE, SM_SCALE, DA, DAV, DB, DBV, IS_CAUSAL,
                              DOT_PRECISION, BLOCK_M, BLOCK_N, SPLIT, True, GROUP)
    else:
        q_pid = pid - kv_slots
        _bwd_dq_program(q_pid // SPLIT_Q, q_pid % SPLIT_Q, bh, Q, K, V, O, DO, L, L, DQ, H, stride_qb, stride_qh,
                        stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, stride_ob,
                        stride_oh, stride_on, stride_dob, stride_doh, stride_don, stride_dqs, stride_dqb,
                        stride_dqh, stride_dqn, N, QK_SCALE, SM_SCALE, DA, DAV, DB, DBV, IS_CAUSAL,
                        DOT_PRECISION, BLOCK_M2, BLOCK_N2, SPLIT_Q, False, GROUP)


# ---------------------------------------------------------------------------------------------
# Launchers, registered as PyTorch ops


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32: three TF32 products per fp32 product (about fp32 accuracy on tensor cores);
    # the interpreter computes dots in numpy fp32 whatever is asked.
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _heads_shape(shape) -> tuple:
    """The (B, H, N, D) shape _heads gives a tensor of this shape."""
    shape = tuple(shape)
    if len(shape) < 4:
        return (1,) * (4 - len(shape)) + shape
    return (math.prod(shape[:-3]), *shape[-3:]) if len(shape) > 4 else shape


def _heads(t: torch.Tensor) -> torch.Tensor:
    """(..., H, N, D) -> a (B, H, N, D) view with its own batch, head and row strides (so that a
    (batch, heads, N, D) view of (batch, N, heads, D) memory, as models make by transposing a
    projection, is read in place), and unit stride along D. Copies only where it must: a stride
    along D other than 1, or leading dims that do not merge. A 3-D (B, N, D) input is one head
    per sequence: (1, B, N, D); a 2-D (N, D) one is (1, 1, N, D)."""
    if t.dim() != 4:
        t = t.reshape(_heads_shape(t.shape))  # a view, except leading dims that do not merge
    return t if t.stride(-1) == 1 else t.contiguous()


def _like(t: torch.Tensor) -> torch.Tensor:
    """A fresh (B, H, N, D) gradient for t (view it as t.shape): for a 4-D t with unit stride
    along D, t's memory layout (torch.empty_like keeps the stride order), so dQ, dK, dV come
    back in the layout q, k, v came in and autograd's transposes back to the model's projections
    stay views; otherwise contiguous."""
    if t.dim() == 4:
        g = torch.empty_like(t)
        if g.stride(-1) == 1:
            return g
    return t.new_empty(_heads_shape(t.shape))


def _out_like(q: torch.Tensor) -> torch.Tensor:
    """A fresh (B, H, N, D) output O for q (view it as q.shape): for a 4-D q, (B, N, H, D) in
    memory, as SDPA's flash and cuDNN backends allocate it, so that a model's
    O.transpose(1, 2).reshape(B, N, H * D) is a view and the gradient coming back through it is
    read in place; otherwise contiguous."""
    if q.dim() == 4:
        b, h, n, d = q.shape
        return q.new_empty_strided((b, h, n, d), (n * h * d, d, h * d, 1))
    return q.new_empty(_heads_shape(q.shape))


def _group(q3: torch.Tensor, k3: torch.Tensor) -> int:
    """Query heads per K/V head of (B, H, N, D) q3 and (B, H_kv, N, D) k3 (a compile-time
    constant of the kernels: a traced size is specialised here)."""
    return int(q3.shape[1] // k3.shape[1])


def _scales(d: int) -> dict:
    """The head dim's constants of every kernel (memoised for a plain int: a launch only reads them)."""
    return _scales_memo(d) if type(d) is int else _scales_rule(d)


def _scales_rule(d: int) -> dict:
    da, db = d_tiles(d)
    return dict(QK_SCALE=LOG2E / math.sqrt(d), DA=da, DAV=min(d, da), DB=db, DBV=max(0, d - da))


_scales_memo = functools.lru_cache(maxsize=64)(_scales_rule)


def _bhn(t: torch.Tensor) -> tuple:
    """(batch, head, row) strides of a (B, H, N, D) tensor."""
    return t.stride()[:3]


def _strides(t: torch.Tensor) -> tuple:
    """(part, batch, head, row) strides of an output: (B, H, N, D), or (SPLIT, B, H, N, D) partial
    sums."""
    return (0, *t.stride()[:3]) if t.dim() == 4 else t.stride()[:4]


def _partials(out: torch.Tensor, split: int) -> torch.Tensor:
    """Where a split kernel writes: out itself when unsplit, else a fresh fp32 buffer of `split`
    slices like out (one buffer per output, never views of a shared one: Inductor's
    functionalization of a kernel writing two views of one buffer fails under dynamic shapes,
    torch 2.11, H100)."""
    return out if split == 1 else kernel_launch.scratch(
        torch.empty((split, *out.shape), dtype=torch.float32, device=out.device))


@triton.jit
def _sum_parts_kernel(P, OUT, numel, NH, N, D, stride_ob, stride_oh, stride_on, stride_od,
                      SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """OUT (B, H, N, D, any strides) = P[0] + P[1] + ... + P[SPLIT-1], added left to right in
    fp32, then cast: P is (SPLIT, B, H, N, D) contiguous."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < numel
    acc = tl.load(P + i, mask=mask, other=0.0)
    for part in tl.static_range(1, SPLIT):
        acc += tl.load(P + part * numel + i, mask=mask, other=0.0)
    d = i % D
    row = i // D
    n = row % N
    bh = row // N
    offs = (bh // NH) * stride_ob + (bh % NH) * stride_oh + n * stride_on + d * stride_od
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)


def _sum_parts(parts: torch.Tensor, out: torch.Tensor, launch=lambda k: k) -> None:
    """out = the sum of a split's fp32 partial results over their first dim, added in a fixed
    order by a kernel of ours: the same bits in eager mode and under torch.compile (the op is a
    triton_op, so Inductor would compile a torch reduction such as parts.sum(0) its own way, and
    a grouped-query dK came out different in its last bits; tuning/flash_attention/NOTES.md
    step 40)."""
    nb, nh, n, d = out.shape
    numel = out.numel()
    block = 1024
    launch(_sum_parts_kernel)[(cdiv(numel, block),)](
        parts, out, numel, nh, n, d, *out.stride(), SPLIT=parts.shape[0], BLOCK=block, num_warps=4)


def launch_forward(q3, k3, v3, out, lse, is_causal: bool, cfg: dict, launch=lambda k: k) -> None:
    """Run the forward kernel on (B, N, D) views with config `cfg` (BLOCK_Q, BLOCK_K, warps,
    stages, SPLIT), writing out and lse. `launch` wraps each kernel (wrap_triton inside the op;
    identity for the sweep). SPLIT > 1: partial results in fp32 buffers, then one merge kernel.
    Tensors are (B, H, N, D) with any batch, head and row strides, or (B, N, D); k3 and v3 may
    have H_kv heads, H_kv dividing H (grouped-query attention); lse is (B*H, N)."""
    q3, k3, v3, out = _heads(q3), _heads(k3), _heads(v3), _heads(out)
    nb, nh, n, d = q3.shape
    bh = nb * nh
    c = {"SPLIT": 1, "GROUP": _group(q3, k3), **cfg}
    split = c["SPLIT"]
    o_p, l_p = out, lse
    if split > 1:
        o_p = kernel_launch.scratch(torch.empty((split, nb, nh, n, d), dtype=torch.float32, device=q3.device))
        l_p = kernel_launch.scratch(torch.empty((split, bh, n), dtype=torch.float32, device=q3.device))
    launch(_fwd_kernel)[(cdiv(n, c["BLOCK_Q"]) * split, bh)](
        q3, k3, v3, o_p, l_p, nh, *_bhn(q3), *_bhn(k3), *_bhn(v3), *_strides(o_p),
        l_p.stride(0) if split > 1 else 0, n, **_scales(d),
        IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(q3.dtype), **c)
    if split > 1:
        block = 32
        launch(_fwd_combine_kernel)[(cdiv(n, block), bh)](
            o_p, l_p, out, lse, nh, *_strides(o_p), l_p.stride(0), *_bhn(out), n, D=d,
            D_PAD=d_pad(d), SPLIT=split, BLOCK=block, num_warps=4)


def launch_backward_dq(q3, k3, v3, o3, do3, lse, delta, dq, is_causal: bool, cfg: dict,
                       launch=lambda k: k) -> None:
    """dQ into dq, and Delta = rowsum(O * dO) for launch_backward_dkdv, with config cfg["dq"].
    SPLIT > 1: fp32 partial dQ per part, summed in a fixed order (no atomics: one result)."""
    q3, k3, v3, o3, do3, dq = (_heads(t) for t in (q3, k3, v3, o3, do3, dq))
    nb, nh, n, d = q3.shape
    c = {"SPLIT": 1, "GROUP": _group(q3, k3), **cfg["dq"]}
    split = c["SPLIT"]
    dq_p = _partials(dq, split)
    launch(_bwd_dq_kernel)[(cdiv(n, c["BLOCK_M2"]) * split, nb * nh)](
        q3, k3, v3, o3, do3, lse, delta, dq_p, nh, *_bhn(q3), *_bhn(k3), *_bhn(v3), *_bhn(o3), *_bhn(do3),
        *_strides(dq_p), n, **_scales(d), SM_SCALE=1.0 / math.sqrt(d), IS_CAUSAL=is_causal,
        DOT_PRECISION=_dot_precision(q3.dtype), **c)
    if split > 1:
        _sum_parts(dq_p, dq, launch)


def launch_backward_dkdv(q3, k3, v3, do3, lse, delta, dk, dv, is_causal: bool, cfg: dict,
                         launch=lambda k: k) -> None:
    """dK and dV into dk, dv (needs the Delta that launch_backward_dq wrote), with config
    cfg["dkdv"]: one program per key tile of each K/V head, summing over the query heads that
    read it. SPLIT > 1: fp32 partial sums per part (a buffer for dK and one for dV), summed
    after."""
    q3, k3, v3, do3, dk, dv = (_heads(t) for t in (q3, k3, v3, do3, dk, dv))
    nb, nh, n, d = q3.shape
    bh = nb * (nh // _group(q3, k3))
    c = {"SPLIT": 1, "GROUP": _group(q3, k3), **cfg["dkdv"]}
    split = c["SPLIT"]
    dk_p, dv_p = _partials(dk, split), _partials(dv, split)
    tiles = cdiv(n, c["BLOCK_N"]) * split
    launch(_bwd_dkdv_kernel)[(bh, tiles) if c["HEADS_FASTEST"] else (tiles, bh)](
        q3, k3, v3, do3, lse, delta, dk_p, dv_p, nh, *_bhn(q3), *_bhn(k3), *_bhn(v3), *_bhn(do3),
        *_strides(dk_p), *_strides(dv_p), n,
        **_scales(d), SM_SCALE=1.0 / math.sqrt(d), IS_CAUSAL=is_causal,
        DOT_PRECISION=_dot_precision(q3.dtype), **c)
    if split > 1:
        _sum_parts(dk_p, dk, launch)
        _sum_parts(dv_p, dv, launch)


def launch_backward_fused(q3, k3, v3, o3, do3, lse, dq, dk, dv, is_causal: bool, cfg: dict,
                          launch=lambda k: k) -> None:
    """dQ, dK and dV in one launch (_bwd_fused_kernel): cfg["dq"]'s tiles and split for the dQ
    programs, cfg["dkdv"]'s for the dK/dV programs, dQ's warps and stages for both (the
    best of tuning/flash_attention/NOTES.md step 25's sweep at one head: 3 stages for D <= 64, 2 for D = 128); no Delta buffer. Split partials are summed after, as in the two-kernel path."""
    q3, k3, v3, o3, do3, dq, dk, dv = (_heads(t) for t in (q3, k3, v3, o3, do3, dq, dk, dv))
    nb, nh, n, d = q3.shape
    group = _group(q3, k3)
    cq, ckv = {"SPLIT": 1, **cfg["dq"]}, {"SPLIT": 1, **cfg["dkdv"]}
    dq_p, dk_p, dv_p = _partials(dq, cq["SPLIT"]), _partials(dk, ckv["SPLIT"]), _partials(dv, ckv["SPLIT"])
    programs = cdiv(cdiv(n, ckv["BLOCK_N"]) * ckv["SPLIT"], group) + cdiv(n, cq["BLOCK_M2"]) * cq["SPLIT"]
    launch(_bwd_fused_kernel)[(programs, nb * nh)](
        q3, k3, v3, o3, do3, lse, dq_p, dk_p, dv_p, nh, *_bhn(q3), *_bhn(k3), *_bhn(v3), *_bhn(o3), *_bhn(do3),
        *_strides(dq_p), *_strides(dk_p), *_strides(dv_p), n, **_scales(d), SM_SCALE=1.0 / math.sqrt(d),
        IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(q3.dtype), BLOCK_M2=cq["BLOCK_M2"],
        BLOCK_N2=cq["BLOCK_N2"], SPLIT_Q=cq["SPLIT"], BLOCK_M=ckv["BLOCK_M"], BLOCK_N=ckv["BLOCK_N"],
        SPLIT=ckv["SPLIT"], GROUP=group, num_warps=cq["num_warps"], num_stages=cq["num_stages"])
    for parts, out in ((dq_p, dq), (dk_p, dk), (dv_p, dv)):
        if parts is not out:
            _sum_parts(parts, out, launch)


def launch_backward(q3, k3, v3, o3, do3, lse, dq, dk, dv, is_causal: bool, cfg: dict,
                    launch=lambda k: k, delta=None) -> None:
    """The backward with config cfg (bwd_config): one fused launch when cfg["fused"], else the
    dQ kernel (which writes Delta, into `delta` where given: fp32, lse's shape) and then the dK/dV
    kernel: the tile-language ones, or the Gluon ones where LMPERF_FA_BWD_BACKEND's rule (auto, the
    default) or =gluon picks them (=gluon-dkdv: the Gluon dK/dV after the tile dQ;
    flash_attention_gluon_bwd), or the fused Gluon kernel where auto's rule or =gluon-fused picks it
    (_gluon_fused)."""
    gluon_bwd = _gluon_dkdv(q3, k3, v3, is_causal)
    if cfg.get("fused") and gluon_bwd is None:
        launch_backward_fused(q3, k3, v3, o3, do3, lse, dq, dk, dv, is_causal, cfg, launch)
        return
    # the Gluon kernels: their launchers in eager mode (launch is plain_launch), else their opaque ops,
    # which launch the same kernels under torch.compile (the same bits); an op's dispatch adds host time
    # a call (tuning/flash_attention/NOTES.md, steps 43 and 51)
    direct = launch is plain_launch
    if _gluon_fused(gluon_bwd, q3, k3, v3, is_causal):  # dQ, dK, dV in one Gluon kernel (its own Delta)
        from lmperf.kernels import flash_attention_gluon_fused as gf
        (gf.launch if direct else gf.flash_attention_bwd_gluon_fused)(q3, k3, v3, o3, do3, lse, dq, dk, dv, is_causal)
        return
    if delta is None:  # written by the dQ kernel before the dK/dV kernel reads it: a plan's scratch
        delta = kernel_launch.scratch(torch.empty(lse.shape, dtype=torch.float32, device=q3.device))
    if gluon_bwd is not None and gluon_bwd.use_gluon_dq():
        (gluon_bwd.launch_dq if direct else gluon_bwd.flash_attention_dq_gluon)(
            q3, k3, v3, o3, do3, lse, delta, dq, is_causal)
    else:
        launch_backward_dq(q3, k3, v3, o3, do3, lse, delta, dq, is_causal, cfg, launch)
    if gluon_bwd is not None:
        (gluon_bwd.launch_dkdv if direct else gluon_bwd.flash_attention_dkdv_gluon)(
            q3, k3, v3, do3, lse, delta, dk, dv, is_causal)
    else:
        launch_backward_dkdv(q3, k3, v3, do3, lse, delta, dk, dv, is_causal, cfg, launch)


def _gluon_dkdv(q3, k3, v3, is_causal: bool):
    """The Gluon backward module where LMPERF_FA_BWD_BACKEND (auto, the default: its rule; gluon,
    gluon-dkdv: forced) picks it for this call (flash_attention_gluon_bwd.use_gluon_dkdv: a
    ValueError where a forced one cannot run it), else None; =triton never imports it."""
    if os.environ.get("LMPERF_FA_BWD_BACKEND") == "triton":
        return None
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    if not gb.use_gluon_dkdv(q3, k3, v3, is_causal):
        return None
    if gb.use_fused():  # the fused kernel's own limits (head dims, Gluon's TMA reduce)
        from lmperf.kernels import flash_attention_gluon_fused as gf
        if (why := gf.unsupported(q3, k3, v3, is_causal)) is not None:
            raise ValueError(f"{gb.BWD_BACKEND_ENV}=gluon-fused asks for the fused Gluon FlashAttention backward, "
                             f"which cannot run this call: {why}. Unset it (or set it to 'gluon' or 'triton') "
                             "for another backward")
    return gb


def _gluon_fused(gb, q3, k3, v3, is_causal: bool) -> bool:
    """Whether the Gluon backward that _gluon_dkdv picked (gb; None: the tile backward) runs as the
    fused kernel (flash_attention_gluon_fused): forced (gluon-fused, whose limits _gluon_dkdv
    checked), or "auto"'s rule (gb.prefers_fused) where that kernel can run the call."""
    if gb is None:
        return False
    if gb.use_fused():
        return True
    if gb.backend() != "auto" or not gb.prefers_fused(q3, k3, v3, is_causal):
        return False
    from lmperf.kernels import flash_attention_gluon_fused as gf
    return gf.unsupported(q3, k3, v3, is_causal) is None


def _register(name: str, fake):
    """A triton_op: torch.compile traces into it and Inductor launches the kernels itself.
    Under Triton's interpreter (CPU) the kernels cannot be traced (the interpreter would run on
    the data-less tensors of a trace), so there the op is opaque (custom_op) with `fake` giving
    its output shapes; schema, autograd and results are the same."""
    def register(fn):
        if not INTERPRET:
            return triton_op(name, mutates_args=())(fn)
        op = custom_op(name, mutates_args=())(fn)
        op.register_fake(fake)
        return op
    return register


def _forward_fake(q, k, v, is_causal):
    return _out_like(q).view(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _backward_fake(q, k, v, out, lse, grad_out, is_causal):
    return _like(q).view(q.shape), _like(k).view(k.shape), _like(v).view(v.shape)


def _check_heads(bh: int) -> None:
    if bh > 65535:  # the grid's second dimension
        raise ValueError(f"at most 65,535 (batch x heads) sequences per call; got {bh}: split the batch")


def check_device(q: torch.Tensor) -> None:
    """Triton kernels run on CUDA tensors, or on CPU tensors in Triton's interpreter."""
    if q.device.type != "cuda" and not INTERPRET:
        raise RuntimeError(f"FlashAttention2Triton got {q.device.type} tensors: its Triton kernels run on CUDA "
                           "tensors, or on the CPU in Triton's interpreter: set TRITON_INTERPRET=1 in the "
                           "environment before triton and lmperf are imported")


def _forward(q, k, v, is_causal: bool, launch):
    check_qkv(q, k, v)
    check_causal(is_causal)
    check_device(q)
    nb, nh, n, d = _heads_shape(q.shape)
    bh = nb * nh
    _check_heads(bh)
    out = _out_like(q)  # fresh (B, H, N, D): the kernels write it, not a view of it
    lse = torch.empty((bh, n), dtype=torch.float32, device=q.device)
    launch_forward(q, k, v, out, lse, is_causal, launch_fwd_config(n, d, q.dtype, is_causal, bh, host_launched(q)),
                   launch)
    return out.view(q.shape), lse.view(q.shape[:-1])


def kernels(q, k, v, is_causal: bool) -> str:
    """The kernels FlashAttention2Triton runs for these inputs, as the benchmark rows' `kernel`
    column names them: the forward's ("gluon" or "tile", _gluon_forward) and the backward's
    ("gluon fused", "gluon dq + gluon dkdv", "tile dq + gluon dkdv", "tile fused" or "tile dq + tile dkdv",
    launch_backward's choice under LMPERF_FA_BWD_BACKEND)."""
    nb, nh, n, d = _heads_shape(q.shape)
    fwd = "gluon" if _gluon_forward(q, k, v, is_causal) else "tile"
    gluon_bwd = _gluon_dkdv(q, k, v, is_causal)
    if _gluon_fused(gluon_bwd, q, k, v, is_causal):
        bwd = "gluon fused"
    elif gluon_bwd is not None:
        bwd = f"{'gluon' if gluon_bwd.use_gluon_dq() else 'tile'} dq + gluon dkdv"
    else:
        fused = launch_bwd_config(n, d, q.dtype, is_causal, nb * nh, int(nh // _heads_shape(k.shape)[1]),
                                  host_launched(q)).get("fused")
        bwd = "tile fused" if fused else "tile dq + tile dkdv"
    return f"forward: {fwd}; backward: {bwd}"


def _backward_kernels(q, k, v, out, lse, grad_out, is_causal: bool, launch):
    nb, nh, n, d = _heads_shape(q.shape)
    bh = nb * nh
    lse3 = lse.reshape(bh, n)
    lse3 = lse3 if lse3.is_contiguous() else lse3.contiguous()
    cfg = launch_bwd_config(n, d, q.dtype, is_causal, bh, int(nh // _heads_shape(k.shape)[1]), host_launched(q))
    grad_out = _heads(grad_out)  # once for both kernels: e.g. the expanded ones of out.sum().backward() copied once
    dq, dk, dv = _like(q), _like(k), _like(v)  # fresh (B, H, N, D) and (B, H_kv, N, D), written by the kernels
    launch_backward(q, k, v, out, grad_out, lse3, dq, dk, dv, is_causal, cfg, launch)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


@_register("lmperf::flash_attention_forward", _forward_fake)
def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, L): O like q, L the fp32 logsumexp of shape q.shape[:-1]. Inputs (..., N, D)."""
    return _forward(q, k, v, is_causal, wrap_triton)


@_register("lmperf::flash_attention_backward", _backward_fake)
def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, grad_out: torch.Tensor,
                             is_causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of flash_attention_forward, from its saved (O, L) and dO."""
    return _backward_kernels(q, k, v, out, lse, grad_out, is_causal, wrap_triton)


def _setup_context(ctx, inputs, output):
    q, k, v, is_causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal = is_causal
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, *_, direct: bool = False):
    """(dQ, dK, dV, None) from the saved (q, k, v, O, L): the backward op, or with `direct` the
    kernels without the op's dispatch (FlashAttention2Triton in eager mode). The op's own
    autograd always takes the op, so that every trace (Dynamo, AOTAutograd, opcheck) sees it."""
    q, k, v, out, lse = ctx.saved_tensors
    if direct and kernel_launch.planning():
        g = _heads(grad_out)  # the copy the kernels may need, outside the plan (it is the call's data)
        first = getattr(ctx, "plan_key", None)  # the forward's, where it was planned: only dO is new
        known = (q, k, v, out, lse)
        dq, dk, dv = kernel_launch.planned(("backward", ctx.is_causal), (*known, g),
                              lambda: _backward_kernels(q, k, v, out, lse, g, ctx.is_causal, plain_launch),
                              None if first is None else kernel_launch.then_key(first, ("backward",), known, g))
    elif direct:
        dq, dk, dv = _backward_kernels(q, k, v, out, lse, grad_out, ctx.is_causal, plain_launch)
    else:
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, ctx.is_causal)
    return dq, dk, dv, None


flash_attention_forward.register_autograd(_backward, setup_context=_setup_context)


def forward_with_lse(q, k, v, is_causal: bool = False):
    """(O, L) without autograd: O like q, L fp32 of shape q.shape[:-1]."""
    check_qkv(q, k, v)
    check_causal(is_causal)
    check_device(q)
    with torch.no_grad():
        return flash_attention_forward(q, k, v, is_causal)


def _gluon_forward(q, k, v, is_causal: bool, check: bool = False) -> bool:
    """Whether the forward runs the Gluon kernel (flash_attention_gluon, Hopper) instead of the
    tile-language one: LMPERF_FA_BACKEND=gluon forces it (an error where it cannot run), =triton
    never, unset or auto where its rule picks it. The backward is the tile-language one either
    way (the two forwards write the same O and L layouts)."""
    from lmperf.kernels import flash_attention_gluon

    def validate():
        check_qkv(q, k, v)
        check_causal(is_causal)
    return flash_attention_gluon.use_gluon(q, k, v, is_causal, validate=validate if check else None)


def eager_forward(q, k, v, is_causal: bool):
    """(O, L) in eager mode: the Gluon forward where _gluon_forward picks it, else the tile kernels
    without the op's dispatch (tens of us a call); both check q, k, v."""
    if _gluon_forward(q, k, v, is_causal, check=True):
        from lmperf.kernels import flash_attention_gluon
        return flash_attention_gluon.forward(q, k, v, is_causal)
    return _forward(q, k, v, is_causal, plain_launch)


def clear_plans() -> None:
    """Forget every plan (kernel_launch.PLANS) and the memoised tile configs: for whatever changes the
    dispatch's rules within a process (a rule, a threshold or a config table patched, as tests do): a
    plan replays the launches the rules chose when it was recorded."""
    kernel_launch.PLANS.clear()
    fwd_config_memo.cache_clear()
    bwd_config_memo.cache_clear()


class FlashAttention2Triton(torch.autograd.Function):
    """apply(q, k, v, is_causal=False) -> softmax(q k^T / sqrt(D)) v for (..., N, D) inputs.
    k and v may have fewer heads (dim -3) than q, dividing them: grouped-query attention, query
    head h reading K/V head h // (H / H_kv), as SDPA's enable_gqa (K and V are not copied).
    Saves (q, k, v, O, L) for backward, L being the fp32 logsumexp of shape q.shape[:-1].
    (B, H, N, D) inputs are read through their strides (a transposed (B, N, H, D) projection is
    not copied); O is (B, N, H, D) in memory, as SDPA's flash and cuDNN backends make it, and the
    gradients keep the layout of q, k and v.
    Works under torch.compile(fullgraph=True): forward and backward are PyTorch ops."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        if torch.compiler.is_compiling():  # the op: the compiler sees (and launches) the kernels
            check_qkv(q, k, v)
            check_causal(is_causal)
            if _gluon_forward(q, k, v, is_causal):  # an opaque op: the same kernel as eager mode
                out, lse = torch.ops.lmperf.flash_attention_forward_gluon(q, k, v, is_causal)
            else:
                check_device(q)
                out, lse = flash_attention_forward(q, k, v, is_causal)
        elif kernel_launch.planning():  # LMPERF_FA_LAUNCH=plan: the call's launches replayed (kernel_launch.Plan)
            ctx.plan_key = kernel_launch.plan_key(("forward", is_causal), (q, k, v))  # the backward's starts from it
            out, lse = kernel_launch.planned(("forward", is_causal), (q, k, v), lambda: eager_forward(q, k, v, is_causal),
                                             ctx.plan_key)
        else:
            out, lse = eager_forward(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return _backward(ctx, grad_out, direct=not torch.compiler.is_compiling())
