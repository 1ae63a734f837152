"""FlashAttention backward on Hopper GPUs (H100, H200) in Gluon: a dQ kernel and a dK/dV kernel
(design: tuning/flash_attention/research_gluon_backward.md, sections 3 and 4 (a)).

They compute what flash_attention_triton's `_bwd_dq_kernel` and `_bwd_dkdv_kernel` compute, from
the same inputs: q, k, v, O, dO and L (the forward's fp32 logsumexp in natural log, (B*H, N)).
The dQ kernel runs first and also writes Delta = rowsum(O * dO) ((B*H, N) fp32), which the dK/dV
kernel reads. The switch, LMPERF_FA_BWD_BACKEND (`use_gluon_dkdv`, `use_gluon_dq`): "auto" (the
default) runs both Gluon kernels where `prefers_gluon`'s rule, measured on an H100, says they are
faster, else the tile-language backward; "gluon" forces both (a ValueError saying why where they
cannot run the call); "gluon-dkdv" the Gluon dK/dV after the tile-language dQ; "gluon-fused" the
fused kernel of flash_attention_gluon_fused (dQ, dK and dV in one kernel; "auto" takes it where
`prefers_fused` says); "triton" the tile-language backward, never importing this module.

The dQ kernel (`_dq_kernel`): one program per (query tile of 128 rows, batch x query head), heads
fastest, causal query tiles longest first; two consumer warpgroups of 64 rows each holding their
dQ ([64, D] fp32) in registers, a one-warp producer loading by TMA the Q and dO halves once, then
the K and V tiles of BLOCK_N keys (the K/V head h // GROUP) into a ring of STAGES slots, each
released by both warpgroups. Per warpgroup and key tile: S = Q K^T and dP = dO V^T (SS wgmma,
in flight together), P = exp2(S log2(e) / sqrt(D) - L log2(e)), dS = P (dP - Delta), dQ += dS K
(RS wgmma); Delta of its rows is computed from O and dO before the loop. Causal: the key tiles on
the diagonal first (masked), then the others (unmasked); the order of the sums is fixed, no
atomics. dQ is scaled by 1/sqrt(D) once at the end.

The dK/dV kernel (`_dkdv_kernel`): one program per (key tile of 128 keys, batch x K/V head), heads fastest, causal key tiles with
the most query tiles first. Three partitions (`gl.warp_specialize`):
- two consumer warpgroups, each owning 64 of the tile's keys, holding their dK and dV ([64, D]
  fp32 each) in registers for the whole program;
- a one-warp producer that loads by TMA the K and V halves once, then per step (query head h,
  query tile of BLOCK_M rows: 128 at head dim 64, 64 at 128) the Q and dO tiles and that tile's L and Delta into a ring of STAGES
  shared-memory slots (ready/empty mbarriers; each slot released by both warpgroups).

Per consumer warpgroup and step (keys j of its half, query rows i of the tile):
    S^T  = K_half Q^T - sqrt(D) L          (SS wgmma, the accumulator started from -sqrt(D) L)
    dP^T = V_half dO^T - Delta             (SS wgmma, the accumulator started from -Delta)
    P^T  = exp2(S^T * log2(e) / sqrt(D))   = exp(q.k / sqrt(D) - L): the softmax, transposed
    dV  += P^T dO                          (RS wgmma: P^T from registers)
    dS^T = P^T * dP^T
    dK  += dS^T Q                          (RS wgmma), and dK *= 1/sqrt(D) once at the end.
Starting the accumulators from L and Delta (read from the slot, 2 x BLOCK_M x 4 bytes, just
before each product is issued) keeps no L or Delta in registers across the step: holding them
(16 rows a thread each) is what made head dim 128 spill (tuning/flash_attention/NOTES.md, step 42).

Causal: a key tile [k0, k0 + 128) sees query rows from k0 on; its query tiles within [k0, k0 + 128)
(two of 64 rows, or one of 128) cross the diagonal and are masked (where(row >= key, P, 0)) in both warpgroups, every later
one is unmasked (a separate, mask-free loop). Grouped-query attention: the program walks the
GROUP query heads of its K/V head in order (a fixed order: the same bits every run), adding into
the same dK and dV, written once. No atomics.

Both cover (`unsupported` says why anything else is refused): a Hopper GPU, bf16 or fp16, head dims
64, 80 and 128 (80 in two column slices, 64 and 16, as the forward computes it: every product over
the head dim is two wgmma summed in one accumulator, every [rows, D] result two accumulators), N a
multiple of 128 (no tile runs past a sequence's end), q, k, v in the layouts the
Gluon forward reads in place (flash_attention_gluon.head_rows); dO of any layout (copied to
contiguous where TMA cannot read it).
"""
from __future__ import annotations

import functools
import math
import os

import torch

from lmperf.kernels import flash_attention_gluon as fg
from lmperf.kernels import launch as kernel_launch
from lmperf.kernels.triton_op import opaque_op

LOG2E = 1.4426950408889634
HEAD_DIMS = (64, 80, 128)  # 80: two column slices, 64 and 16 (fg.split_head_dim)
AUTO_HEAD_DIMS = (64, 80, 128)  # where "auto" may pick these kernels (prefers_gluon)
DTYPES = (torch.float16, torch.bfloat16)
BLOCK_N = 128  # keys a program: two warpgroups of 64
BWD_BACKEND_ENV = "LMPERF_FA_BWD_BACKEND"
BWD_BACKENDS = ("auto", "triton", "gluon", "gluon-dkdv", "gluon-fused")
AUTO_MIN_N = 4096  # "auto": the Gluon backward from this many rows (prefers_gluon)
# ... and causal at these head dims from these many rows: faster than the tile backward outside the noise,
# GPU time and host included, once plans cut the host's cost of a call (tuning/flash_attention/NOTES.md, step 50)
AUTO_MIN_N_CAUSAL = {80: 2048, 128: 2048}
# ... and grouped-query causal at head dim 64 from 1,024 rows: the dK/dV kernel sums a group's query heads
# itself, 0.72x the tile backward's GPU time at 8 x 16q/4kv x 1,024 x 64 (NOTES.md, step 54, on an H200)
AUTO_MIN_N_GROUPED_CAUSAL = {64: 1024}
# ... in every class above, from this many 128-row query tiles in the call (batch x query heads x N / 128): with
# fewer (causal, one sequence of 2,048-16,384 rows) the tile backward splits its loops over the GPU's SMs:
# forward + backward 0.48-0.91x the GPU time with the Gluon kernels after the same forward; from 256 (one
# sequence of 32,768 or 65,536 rows, two to eight sequences of 8,192-16,384) the Gluon kernels are faster,
# 0.78-0.89x the tile backward's (NOTES.md step 69, on an H200)
AUTO_MIN_TILES = 256
# "auto": the fused kernel (flash_attention_gluon_fused) instead of the backward it took before, causal without
# grouped-query, in the classes measured faster (fused_class, prefers_fused). Head dim: classes of (rows from,
# rows up to, sequences (batch x heads) from, sequences up to (None: any number), the fused kernel's schedule
# there (its _turns' SCHEDULE)): NOTES.md steps 55 and 57, on an H200
AUTO_FUSED_CAUSAL = {64: ((16384, 16384, 16, 16, 0), (2048, 8192, 64, None, 1)), 128: ((2048, None, 64, None, 1),)}
# ... and non-causal, the same fields: at head dim 128 from 2,048 to 8,192 rows in 64 sequences or more, 0.77-0.83x
# the tile backward's time (where "auto" took it before) and 0.79-0.93x the two Gluon kernels' (NOTES.md step 67)
AUTO_FUSED_FULL = {128: ((2048, 8192, 64, None, 1),)}

# (STAGES, consumer registers, BLOCK_M query rows a step) by head dim; shared memory at 3 stages:
# 134 KB (D 64, BLOCK_M 128; 84 KB at 64), 166 KB (D 128)
CONFIGS = {64: (3, 240, 128), 80: (3, 240, 64), 128: (3, 232, 64)}
# the dQ kernel: (STAGES, consumer registers, BLOCK_N keys a step) by head dim; 128 query rows a
# program (two warpgroups of 64); shared memory at 3 stages: 128 KB (D 64), 160 KB (D 128)
DQ_CONFIGS = {64: (3, 240, 128), 80: (3, 240, 128), 128: (3, 240, 64)}
DQ_BLOCK_M = 128

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except Exception:  # noqa: BLE001 - fg.IMPORT_ERROR says why; `unsupported` refuses every call
    gluon = None


# ---------------------------------------------------------------------------------------------
# What the kernel covers


def shape_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> str | None:
    """None where the kernel's contract covers these tensors (dtype, head dim, N, layout), on
    whatever device they are; else why not. `unsupported` adds the machine's checks."""
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"covers bf16 and fp16 inputs of one dtype; got {q.dtype}, {k.dtype}, {v.dtype}"
    d = q.shape[-1]
    if d not in HEAD_DIMS or k.shape[-1] != d or v.shape[-1] != d:
        return f"covers head dims {HEAD_DIMS}; got {d}"
    if q.dim() < 2 or q.shape[-2] < 1 or q.shape[-2] % BLOCK_N:
        return f"covers N a multiple of {BLOCK_N}; got N = {q.shape[-2] if q.dim() >= 2 else None}"
    q4, k4, v4 = fg.heads(q), fg.heads(k), fg.heads(v)
    if k4.shape != v4.shape or k4.shape[0] != q4.shape[0] or k4.shape[2] != q4.shape[2] \
            or q4.shape[1] % k4.shape[1] != 0:
        return "q, k, v shapes do not match the contract"
    for name, t in (("q", q4), ("k", k4), ("v", v4)):
        if fg.head_rows(t) is None:
            return (f"{name} is neither (B, H, N, D) contiguous nor a (B, H, N, D) view of (B, N, H, D) "
                    f"memory (strides {tuple(t.stride())})")
    if q4.shape[0] * q4.shape[1] * q4.shape[2] >= 2 ** 31:
        return "more than 2^31 query rows"
    if q4.shape[0] * k4.shape[1] > 65535:
        return "more than 65,535 (batch x K/V heads) sequences"
    return None


def unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> str | None:
    """None where this kernel can run the call on this process's GPU, else the reason."""
    if (why := shape_unsupported(q, k, v, is_causal)) is not None:
        return why
    if (why := fg.available(q.device)) is not None:
        return why
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not _aligned(t):
            return f"{name}'s data is not 16-byte aligned (TMA)"
    return None


def _aligned(t: torch.Tensor) -> bool:
    try:
        return t.data_ptr() % 16 == 0
    except Exception:  # noqa: BLE001 - a trace's tensors have no data; the op checks when it runs
        return True


def backend(name: str | None = None) -> str:
    """The backward's backend: `name`, else $LMPERF_FA_BWD_BACKEND, else "auto"; a ValueError
    for anything but BWD_BACKENDS."""
    name = name or os.environ.get(BWD_BACKEND_ENV) or "auto"
    if name not in BWD_BACKENDS:
        raise ValueError(f"{BWD_BACKEND_ENV}={name!r}: expected one of {', '.join(BWD_BACKENDS)}")
    return name


def prefers_gluon(q, k, v, is_causal: bool) -> bool:
    """The rule of "auto": both Gluon kernels where they can run the call and were measured right
    and faster than the tile-language backward outside the noise of fresh processes on an H100
    (tuning/flash_attention/NOTES.md, step 43): bf16, N from AUTO_MIN_N, causal at head dims 64
    and 128 (grouped-query or not), non-causal at head dim 64 (at 128 non-causal the two overlap
    across processes); head dim 80 causal or not (step 46, on an H200); causal at head dims 80 and
    128 from 2,048 rows (AUTO_MIN_N_CAUSAL; step 50, on an H200); grouped-query causal at head dim
    64 from 1,024 rows (AUTO_MIN_N_GROUPED_CAUSAL; step 54, on an H200); below those rows, in the fused
    kernel's classes (prefers_fused; where that kernel cannot run, its two kernels, as fast as the tile
    backward there: step 50). Elsewhere, and wherever `unsupported` refuses the call, the
    tile-language backward (no error). Non-causal at head dim 128 only in the fused kernel's classes
    (AUTO_FUSED_FULL; step 67, on an H200). Everywhere only from AUTO_MIN_TILES query tiles of 128
    rows in the call (step 69, on an H200: the tile backward's split is faster below)."""
    if q.dtype != torch.bfloat16 or q.dim() < 2 or q.shape[-1] not in AUTO_HEAD_DIMS:
        return False
    n, d = q.shape[-2:]
    if (q.numel() // d) // 128 < AUTO_MIN_TILES:
        return False
    min_n = AUTO_MIN_N
    if is_causal:
        min_n = _by_head_dim(AUTO_MIN_N_CAUSAL, d, min_n)
        if _grouped(q, k):
            min_n = min(min_n, _by_head_dim(AUTO_MIN_N_GROUPED_CAUSAL, d, min_n))
    fused = prefers_fused(q, k, v, is_causal)
    if n < min_n and not fused:
        return False
    if not (is_causal or q.shape[-1] in (64, 80) or fused):
        return False
    return unsupported(q, k, v, is_causal) is None


def _by_head_dim(table: dict, d, default=None):
    """table[d], default where d is not a key: compared by value, for a head dim that a trace may give
    as a symbolic size (torch.SymInt, under torch.compile's dynamic shapes), which cannot be hashed."""
    for key, value in table.items():
        if d == key:
            return value
    return default


def _grouped(q, k) -> bool:
    """Whether k and v have fewer heads than q (grouped-query): (..., H, N, D) layouts."""
    return q.dim() >= 3 and k.shape[-3] != q.shape[-3]


def use_gluon_dkdv(q, k, v, is_causal: bool, backend_name: str | None = None) -> bool:
    """Whether the backward's dK/dV runs this module's kernel: the backend (`backend`) is "auto"
    (the default: `prefers_gluon`), "triton" (never: the tile-language kernels), "gluon" (both
    Gluon kernels, dQ and dK/dV) or "gluon-dkdv" (the Gluon dK/dV after the tile-language dQ); a
    forced Gluon backend that cannot run the call is a ValueError saying why."""
    name = backend(backend_name)
    if name == "triton":
        return False
    if name == "auto":
        return prefers_gluon(q, k, v, is_causal)
    if (why := unsupported(q, k, v, is_causal)) is not None:
        raise ValueError(f"{BWD_BACKEND_ENV}={name} asks for the Gluon FlashAttention backward, which "
                         f"cannot run this call: {why}. Unset it (or set it to 'triton') for the "
                         "tile-language backward")
    return True


def use_fused(backend_name: str | None = None) -> bool:
    """Whether the backward is forced to the fused kernel (flash_attention_gluon_fused), where
    use_gluon_dkdv said yes: the backend is "gluon-fused" (whose own limits,
    flash_attention_gluon_fused.unsupported, the caller checks: that module builds on this one)."""
    return backend(backend_name) == "gluon-fused"


def prefers_fused(q, k, v, is_causal: bool) -> bool:
    """The rule of "auto" for the fused kernel, where the Gluon backward is taken: the call is in one of
    AUTO_FUSED_CAUSAL's classes, or non-causal in one of AUTO_FUSED_FULL's (fused_class). The caller
    checks that the fused kernel can run the call (flash_attention_gluon_fused.unsupported)."""
    return fused_class(q, k, is_causal) is not None


def fused_class(q, k, is_causal: bool) -> int | None:
    """The fused kernel's schedule in the class the call is in (AUTO_FUSED_CAUSAL's, or AUTO_FUSED_FULL's
    for a non-causal call), else None: without grouped-query, (..., H, N, D) inputs; a class at
    schedule 1 only while a sequence's key tiles fit on the GPU at once (that schedule's condition).
    Each class was measured faster than the backward "auto" took there before, outside the noise of
    fresh processes, on an H200 (tuning/flash_attention/NOTES.md): by GPU time and with the host,
    forward + backward, 8 x 16 x 2,048 x 128, 4 x 16 x 8,192 x 128 and 1 x 16 x 16,384 x 64 (step 55);
    4 x 25 x 2,048 x 64, 8 x 16 x 4,096 x 64 and 4 x 16 x 8,192 x 64 (step 57); non-causal, the
    backward alone, 4 x 16 x 2,048, 4,096 and 8,192 x 128 (step 67); slower with grouped-query
    (steps 55-56); not timed elsewhere."""
    if q.dim() < 3 or _grouped(q, k):
        return None
    n, d = q.shape[-2:]
    seqs = q.numel() // (n * d)
    classes = _by_head_dim(AUTO_FUSED_CAUSAL if is_causal else AUTO_FUSED_FULL, d, ())
    for min_n, max_n, min_seqs, max_seqs, schedule in classes:
        if n < min_n or (max_n is not None and n > max_n):
            continue
        if seqs < min_seqs or (max_seqs is not None and seqs > max_seqs):
            continue
        if schedule == 1 and n // BLOCK_N > fg.sm_count(q.device):
            return None
        return schedule
    return None


def use_gluon_dq(backend_name: str | None = None) -> bool:
    """Whether dQ (and Delta) come from this module's dQ kernel too, where use_gluon_dkdv said yes:
    the backend is "gluon" or "auto" (which picks both kernels or neither)."""
    return backend(backend_name) in ("gluon", "auto")


# ---------------------------------------------------------------------------------------------
# The kernel


if gluon is not None:

    tma_load = fg.tma_load
    from triton.experimental.gluon.language._core import builtin as _builtin

    @_builtin
    def _smem_reinterpret(smem, dtype, shape, layout, _semantic=None):
        """smem's memory read as another dtype, shape and layout: the descriptor's reinterpret where
        this Triton has it (3.9), its _reinterpret before (3.6, the pinned one)."""
        view = getattr(smem, "reinterpret", None) or smem._reinterpret
        return view(dtype, shape, layout, _semantic=_semantic)

    @gluon.jit
    def dkdv_producer(q_desc, do_desc, k_desc, v_desc, l_desc, dl_desc, q_smem, do_smem, k_smem, v_smem,
                       l_smem, dl_smem, bars, N, H, H_KV, QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH,
                       GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, STAGES: gl.constexpr, qb_desc, dob_desc, kb_desc, vb_desc,
                       qb_smem, dob_smem, kb_smem, vb_smem, DA: gl.constexpr, DB: gl.constexpr,
                       FROM_GRID: gl.constexpr, bkv, kt, ROTATE: gl.constexpr = False):
        """The loads of key tile kt of batch x K/V head bkv (FROM_GRID: the program's ids, (bkv, kt)
        not read). DB > 0: each tile in two column slices, [0, DA) (q/do/k/v_desc) and [DA, DA + DB)
        (the *b_desc), landing on the same barrier. ROTATE (not causal): the query tiles from tile
        kt BLOCK_N / BLOCK_M on, wrapping round (flash_attention_gluon_fused's schedule)."""
        kv_ready, q_ready, do_ready, qdo_empty = bars
        if FROM_GRID:
            bkv = gl.program_id(0)
            kt = gl.program_id(1)
        b = bkv // H_KV
        hk = bkv % H_KV
        k0 = kt * BLOCK_N
        load_kv(k_desc, v_desc, kb_desc, vb_desc, k_smem, v_smem, kb_smem, vb_smem, kv_ready,
                b * KRB + hk * KRH + k0, hk * KCH, BLOCK_N // 2, DA, DB)
        n_qt = N // BLOCK_M
        first = 0
        if IS_CAUSAL:
            first = k0 // BLOCK_M
        c = 0
        for g in range(GROUP):
            h = hk * GROUP + g
            for it in range(first, n_qt):
                if ROTATE:
                    q0 = ((it + kt * (BLOCK_N // BLOCK_M)) % n_qt) * BLOCK_M
                else:
                    q0 = it * BLOCK_M
                load_qdo(q_desc, do_desc, l_desc, dl_desc, q_smem, do_smem, l_smem, dl_smem, bars, qb_desc,
                         dob_desc, qb_smem, dob_smem, c, b, h, b * H + h, q0, QRB, QRH, QCH, DRB, DRH, DCH, STAGES,
                         DA, DB)
                c += 1

    @gluon.jit
    def load_kv(k_desc, v_desc, kb_desc, vb_desc, k_smem, v_smem, kb_smem, vb_smem, kv_ready, k_row, k_col,
                HALF: gl.constexpr, DA: gl.constexpr, DB: gl.constexpr):
        """A key tile's K and V (rows [k_row, k_row + 2 HALF) of the descriptors' 2-D views, from column
        k_col), each as two halves of HALF keys, onto kv_ready; DB > 0: also their columns [DA, DA + DB)."""
        if DB > 0:
            mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes
                            + 2 * kb_desc.block_type.nbytes + 2 * vb_desc.block_type.nbytes)
        else:
            mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
        tma_load(k_desc, [k_row, k_col], kv_ready, k_smem.index(0))
        tma_load(k_desc, [k_row + HALF, k_col], kv_ready, k_smem.index(1))
        tma_load(v_desc, [k_row, k_col], kv_ready, v_smem.index(0))
        tma_load(v_desc, [k_row + HALF, k_col], kv_ready, v_smem.index(1))
        if DB > 0:
            tma_load(kb_desc, [k_row, k_col + DA], kv_ready, kb_smem.index(0))
            tma_load(kb_desc, [k_row + HALF, k_col + DA], kv_ready, kb_smem.index(1))
            tma_load(vb_desc, [k_row, k_col + DA], kv_ready, vb_smem.index(0))
            tma_load(vb_desc, [k_row + HALF, k_col + DA], kv_ready, vb_smem.index(1))

    @gluon.jit
    def load_qdo(q_desc, do_desc, l_desc, dl_desc, q_smem, do_smem, l_smem, dl_smem, bars, qb_desc, dob_desc,
                 qb_smem, dob_smem, c, b, h, bh, q0, QRB, QRH, QCH, DRB, DRH, DCH, STAGES: gl.constexpr,
                 DA: gl.constexpr, DB: gl.constexpr):
        """Step c's loads into the ring's slot c % STAGES once the consumers have freed it: the query tile
        of rows [q0, q0 + BLOCK_M) of head h of batch b (bh = b H + h): Q and L onto q_ready, dO and
        Delta onto do_ready; DB > 0: also Q's and dO's columns [DA, DA + DB)."""
        kv_ready, q_ready, do_ready, qdo_empty = bars
        s = c % STAGES
        mbarrier.wait(qdo_empty.index(s), ((c // STAGES) & 1) ^ 1)
        if DB > 0:
            mbarrier.expect(q_ready.index(s), q_desc.block_type.nbytes + l_desc.block_type.nbytes
                            + qb_desc.block_type.nbytes)
        else:
            mbarrier.expect(q_ready.index(s), q_desc.block_type.nbytes + l_desc.block_type.nbytes)
        tma_load(q_desc, [b * QRB + h * QRH + q0, h * QCH], q_ready.index(s), q_smem.index(s))
        if DB > 0:
            tma_load(qb_desc, [b * QRB + h * QRH + q0, h * QCH + DA], q_ready.index(s), qb_smem.index(s))
        tma_load(l_desc, [bh, q0], q_ready.index(s), l_smem.index(s))
        if DB > 0:
            mbarrier.expect(do_ready.index(s), do_desc.block_type.nbytes + dl_desc.block_type.nbytes
                            + dob_desc.block_type.nbytes)
        else:
            mbarrier.expect(do_ready.index(s), do_desc.block_type.nbytes + dl_desc.block_type.nbytes)
        tma_load(do_desc, [b * DRB + h * DRH + q0, h * DCH], do_ready.index(s), do_smem.index(s))
        if DB > 0:
            tma_load(dob_desc, [b * DRB + h * DRH + q0, h * DCH + DA], do_ready.index(s), dob_smem.index(s))
        tma_load(dl_desc, [bh, q0], do_ready.index(s), dl_smem.index(s))

    @gluon.jit
    def _row_init(vec_smem, scale: gl.constexpr, HALF: gl.constexpr, BLOCK_M: gl.constexpr,
                  s_layout: gl.constexpr):
        """[HALF, BLOCK_M] in s_layout, every row = scale * the slot's BLOCK_M values (one per query
        row, i.e. per column of the transposed scores)."""
        flat = _smem_reinterpret(vec_smem, gl.float32, [BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        x = flat.load(gl.SliceLayout(0, s_layout)) * scale
        return gl.expand_dims(x, 0) + gl.zeros([HALF, BLOCK_M], gl.float32, s_layout)

    @gluon.jit
    def dkdv_products(dv, dvb, c, q0, key0, k_mine, v_mine, kb_mine, vb_mine, q_smem, do_smem, qb_smem, dob_smem,
                       l_smem, dl_smem, bars, QK_SCALE: gl.constexpr, MASK: gl.constexpr, BLOCK_M: gl.constexpr,
                       HALF: gl.constexpr, STAGES: gl.constexpr, DB: gl.constexpr, s_layout: gl.constexpr,
                       a_layout: gl.constexpr, ab_layout: gl.constexpr):
        """A step's products up to dS^T (query rows [q0, q0 + BLOCK_M), this warpgroup's keys [key0,
        key0 + HALF)): S^T and dP^T, P^T, dV += P^T dO issued (not waited for); (dv, dvb, dS^T in
        fp32, the slot). MASK: the tile crosses the causal diagonal. DB > 0: over both column
        slices."""
        st = issue_st(c, k_mine, kb_mine, q_smem, qb_smem, l_smem, bars, QK_SCALE, BLOCK_M, HALF, STAGES, DB, s_layout)
        return products_after_st(st, dv, dvb, c, q0, key0, v_mine, vb_mine, do_smem, dob_smem, dl_smem, bars,
                                 QK_SCALE, MASK, BLOCK_M, HALF, STAGES, DB, s_layout, a_layout, ab_layout)

    @gluon.jit
    def issue_st(c, k_mine, kb_mine, q_smem, qb_smem, l_smem, bars, QK_SCALE: gl.constexpr, BLOCK_M: gl.constexpr,
                 HALF: gl.constexpr, STAGES: gl.constexpr, DB: gl.constexpr, s_layout: gl.constexpr):
        """dkdv_products' first product, S^T, issued (not waited for) once step c's Q tile is in."""
        kv_ready, q_ready, do_ready, qdo_empty = bars
        s = c % STAGES
        mbarrier.wait(q_ready.index(s), (c // STAGES) & 1)
        # S^T * QK_SCALE - L log2(e) = (S^T - L sqrt(D)) * QK_SCALE: start S^T from -L sqrt(D)
        st = _row_init(l_smem.index(s), -1.4426950408889634 / QK_SCALE, HALF, BLOCK_M, s_layout)
        st = warpgroup_mma(k_mine, q_smem.index(s).permute((1, 0)), st, is_async=True)
        if DB > 0:
            st = warpgroup_mma(kb_mine, qb_smem.index(s).permute((1, 0)), st, is_async=True)
        return st

    @gluon.jit
    def products_after_st(st, dv, dvb, c, q0, key0, v_mine, vb_mine, do_smem, dob_smem, dl_smem, bars,
                          QK_SCALE: gl.constexpr, MASK: gl.constexpr, BLOCK_M: gl.constexpr, HALF: gl.constexpr,
                          STAGES: gl.constexpr, DB: gl.constexpr, s_layout: gl.constexpr, a_layout: gl.constexpr,
                          ab_layout: gl.constexpr):
        """dkdv_products after issue_st (st in flight): dP^T, P^T, dV += P^T dO issued; (dv, dvb, dS^T, the
        slot)."""
        kv_ready, q_ready, do_ready, qdo_empty = bars
        dtype: gl.constexpr = do_smem.dtype
        PAIR: gl.constexpr = 1 + (DB > 0)  # wgmma groups a product takes
        s = c % STAGES
        ph = (c // STAGES) & 1
        mbarrier.wait(do_ready.index(s), ph)
        dpt = _row_init(dl_smem.index(s), -1.0, HALF, BLOCK_M, s_layout)
        dpt = warpgroup_mma(v_mine, do_smem.index(s).permute((1, 0)), dpt, is_async=True)
        if DB > 0:
            dpt = warpgroup_mma(vb_mine, dob_smem.index(s).permute((1, 0)), dpt, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=PAIR, deps=(st, ))
        pt = gl.exp2(st * QK_SCALE)
        if MASK:
            rows = q0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
            keys = key0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
            pt = gl.where(gl.expand_dims(rows, 0) >= gl.expand_dims(keys, 1), pt, 0.0)
        pt_op = gl.convert_layout(pt.to(dtype), a_layout)
        dv = warpgroup_mma(pt_op, do_smem.index(s), dv, is_async=True)
        if DB > 0:
            dvb = warpgroup_mma(gl.convert_layout(pt_op, ab_layout), dob_smem.index(s), dvb, is_async=True)
        dpt = warpgroup_mma_wait(num_outstanding=PAIR, deps=(dpt, ))  # S^T, dP^T done; dV may run on
        dst = pt * dpt  # dS^T = P^T (dP^T - Delta)
        return dv, dvb, dst, s

    @gluon.jit
    def _dkdv_step(dk, dv, dkb, dvb, c, q0, key0, k_mine, v_mine, kb_mine, vb_mine, q_smem, do_smem, qb_smem,
                   dob_smem, l_smem, dl_smem, bars, QK_SCALE: gl.constexpr, MASK: gl.constexpr,
                   BLOCK_M: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr, DB: gl.constexpr,
                   s_layout: gl.constexpr, a_layout: gl.constexpr, ab_layout: gl.constexpr):
        """One query tile (rows [q0, q0 + BLOCK_M)) into this warpgroup's dK, dV (keys [key0,
        key0 + HALF)). MASK: the tile crosses the causal diagonal. DB > 0: the products over the
        head's second column slice too (S^T and dP^T summed over both; dK, dV of that slice in
        dkb, dvb)."""
        dtype: gl.constexpr = q_smem.dtype
        kv_ready, q_ready, do_ready, qdo_empty = bars
        dv, dvb, dst, s = dkdv_products(dv, dvb, c, q0, key0, k_mine, v_mine, kb_mine, vb_mine, q_smem, do_smem,
                                         qb_smem, dob_smem, l_smem, dl_smem, bars, QK_SCALE, MASK, BLOCK_M, HALF,
                                         STAGES, DB, s_layout, a_layout, ab_layout)
        dst_op = gl.convert_layout(dst.to(dtype), a_layout)
        dk = warpgroup_mma(dst_op, q_smem.index(s), dk, is_async=True)
        if DB > 0:
            dkb = warpgroup_mma(gl.convert_layout(dst_op, ab_layout), qb_smem.index(s), dkb, is_async=True)
            dk, dv, dkb, dvb = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, dkb, dvb))
        else:
            dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
        mbarrier.arrive(qdo_empty.index(s), count=1)
        return dk, dv, dkb, dvb

    @gluon.jit
    def _dkdv_consumer(q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, bars, DK, DV, N, H_KV,
                       stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                       QK_SCALE: gl.constexpr, SM_SCALE: gl.constexpr, GROUP: gl.constexpr,
                       IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, qb_smem, dob_smem,
                       kb_smem, vb_smem, DB: gl.constexpr):
        kv_ready, q_ready, do_ready, qdo_empty = bars
        HALF: gl.constexpr = BLOCK_N // 2
        DA: gl.constexpr = D - DB
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_M, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, DA, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        ob_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DB + (DB == 0) * 8, 16])
        ab_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ob_layout, k_width=2)
        bkv = gl.program_id(0)
        kt = gl.program_id(1)
        k0 = kt * BLOCK_N
        key0 = k0 + WG * HALF
        k_mine = k_smem.index(WG)
        v_mine = v_smem.index(WG)
        kb_mine = kb_smem.index(WG)
        vb_mine = vb_smem.index(WG)
        dk = gl.zeros([HALF, DA], gl.float32, o_layout)
        dv = gl.zeros([HALF, DA], gl.float32, o_layout)
        dkb = gl.zeros([HALF, DB + (DB == 0) * 8], gl.float32, ob_layout)  # not used where DB = 0
        dvb = gl.zeros([HALF, DB + (DB == 0) * 8], gl.float32, ob_layout)
        n_qt = N // BLOCK_M
        mbarrier.wait(kv_ready, 0)
        c = 0
        for g in range(GROUP):
            first = 0
            if IS_CAUSAL:  # the query tiles that cross the diagonal, masked; then the rest, unmasked
                first = k0 // BLOCK_M
                for j in gl.static_range(BLOCK_N // BLOCK_M):
                    dk, dv, dkb, dvb = _dkdv_step(dk, dv, dkb, dvb, c, k0 + j * BLOCK_M, key0, k_mine, v_mine,
                                                  kb_mine, vb_mine, q_smem, do_smem, qb_smem, dob_smem, l_smem,
                                                  dl_smem, bars, QK_SCALE, True, BLOCK_M, HALF, STAGES, DB,
                                                  s_layout, a_layout, ab_layout)
                    c += 1
                first += BLOCK_N // BLOCK_M
            for it in range(first, n_qt):
                dk, dv, dkb, dvb = _dkdv_step(dk, dv, dkb, dvb, c, it * BLOCK_M, key0, k_mine, v_mine, kb_mine,
                                              vb_mine, q_smem, do_smem, qb_smem, dob_smem, l_smem, dl_smem, bars,
                                              QK_SCALE, False, BLOCK_M, HALF, STAGES, DB, s_layout, a_layout,
                                              ab_layout)
                c += 1
        store_dkdv(dk, dv, dkb, dvb, DK, DV, bkv, H_KV, key0, stride_dkb, stride_dkh, stride_dkn, stride_dvb,
                    stride_dvh, stride_dvn, SM_SCALE, HALF, DA, DB, o_layout, ob_layout)

    @gluon.jit
    def store_dkdv(dk, dv, dkb, dvb, DK, DV, bkv, H_KV, key0, stride_dkb, stride_dkh, stride_dkn, stride_dvb,
                    stride_dvh, stride_dvn, SM_SCALE: gl.constexpr, HALF: gl.constexpr, DA: gl.constexpr,
                    DB: gl.constexpr, o_layout: gl.constexpr, ob_layout: gl.constexpr):
        """dK (scaled by SM_SCALE), dV of keys [key0, key0 + HALF) of batch x K/V head bkv: every row
        < N (N is a multiple of BLOCK_N); DB > 0: the second column slice's from dkb, dvb."""
        b = (bkv // H_KV).to(gl.int64)
        hk = (bkv % H_KV).to(gl.int64)
        rows = (key0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, o_layout))).to(gl.int64)
        cols = gl.arange(0, DA, layout=gl.SliceLayout(0, o_layout))
        dk_out = (dk * SM_SCALE).to(DK.dtype.element_ty)
        gl.store(DK + b * stride_dkb + hk * stride_dkh + gl.expand_dims(rows * stride_dkn, 1)
                 + gl.expand_dims(cols, 0), dk_out)
        dv_out = dv.to(DV.dtype.element_ty)
        gl.store(DV + b * stride_dvb + hk * stride_dvh + gl.expand_dims(rows * stride_dvn, 1)
                 + gl.expand_dims(cols, 0), dv_out)
        if DB > 0:  # the second column slice
            rows_b = (key0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, ob_layout))).to(gl.int64)
            cols_b = DA + gl.arange(0, DB, layout=gl.SliceLayout(0, ob_layout))
            gl.store(DK + b * stride_dkb + hk * stride_dkh + gl.expand_dims(rows_b * stride_dkn, 1)
                     + gl.expand_dims(cols_b, 0), (dkb * SM_SCALE).to(DK.dtype.element_ty))
            gl.store(DV + b * stride_dvb + hk * stride_dvh + gl.expand_dims(rows_b * stride_dvn, 1)
                     + gl.expand_dims(cols_b, 0), dvb.to(DV.dtype.element_ty))

    @gluon.jit
    def _dkdv_kernel(q_desc, do_desc, k_desc, v_desc, l_desc, dl_desc, DK, DV, N, H, H_KV,
                     QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH,
                     stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                     QK_SCALE: gl.constexpr, SM_SCALE: gl.constexpr, GROUP: gl.constexpr,
                     IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     D: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                     num_warps: gl.constexpr, qb_desc, dob_desc, kb_desc, vb_desc, DB: gl.constexpr):
        """DB = 0: a head's D columns in one tile; DB > 0: in two, the first D - DB columns (q/do/
        k/v_desc) and the last DB (the *b_desc), both powers of two (head dim 80 = 64 + 16)."""
        gl.static_assert(num_warps == 4, "one consumer warpgroup in the default partition")
        HALF: gl.constexpr = BLOCK_N // 2
        DA: gl.constexpr = D - DB
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, DA], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, DA], do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [2, HALF, DA], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2, HALF, DA], v_desc.layout)
        if DB > 0:
            qb_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, DB], qb_desc.layout)
            dob_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, DB], dob_desc.layout)
            kb_smem = gl.allocate_shared_memory(dtype, [2, HALF, DB], kb_desc.layout)
            vb_smem = gl.allocate_shared_memory(dtype, [2, HALF, DB], vb_desc.layout)
        else:  # not read
            qb_smem = q_smem
            dob_smem = do_smem
            kb_smem = k_smem
            vb_smem = v_smem
        l_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], l_desc.layout)
        dl_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], dl_desc.layout)
        kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        qdo_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_ready, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(qdo_empty.index(i), count=2)  # both consumer warpgroups release a slot
        bars = (kv_ready, q_ready, do_ready, qdo_empty)
        # the argument tuples are written out in the call (a tuple assigned to a name first turns
        # its constexprs into tensors: Triton 3.6)
        gl.warp_specialize([
            (_dkdv_consumer, (q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, bars, DK, DV, N, H_KV,
                              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                              QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, D, STAGES, 0, qb_smem,
                              dob_smem, kb_smem, vb_smem, DB)),
            (_dkdv_consumer, (q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, bars, DK, DV, N, H_KV,
                              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                              QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, D, STAGES, 1, qb_smem,
                              dob_smem, kb_smem, vb_smem, DB)),
            (dkdv_producer, (q_desc, do_desc, k_desc, v_desc, l_desc, dl_desc, q_smem, do_smem, k_smem, v_smem,
                              l_smem, dl_smem, bars, N, H, H_KV, QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH,
                              GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, qb_desc, dob_desc, kb_desc, vb_desc,
                              qb_smem, dob_smem, kb_smem, vb_smem, D - DB, DB, True, 0, 0)),
        ], [4, 1], [CONSUMER_REGS, 24])


    # -----------------------------------------------------------------------------------------
    # The dQ kernel: one program per (query tile of 128 rows, batch x query head); two consumer
    # warpgroups of 64 rows, a one-warp producer streaming the K/V tiles

    @gluon.jit
    def _dq_coords(N, H, GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr):
        """(bh, b, h, K/V head, first query row) of this program: heads fastest, causal query
        tiles from the last (the longest loop) to the first."""
        bh = gl.program_id(0)
        qt = gl.program_id(1)
        if IS_CAUSAL:
            qt = N // BLOCK_M - 1 - qt
        b = bh // H
        h = bh % H
        return bh, b, h, h // GROUP, qt * BLOCK_M

    @gluon.jit
    def _dq_producer(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, bars, N, H,
                     QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH, GROUP: gl.constexpr,
                     IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     STAGES: gl.constexpr, qb_desc, dob_desc, kb_desc, vb_desc, qb_smem, dob_smem, kb_smem,
                     vb_smem, DA: gl.constexpr, DB: gl.constexpr):
        """DB > 0: each tile in two column slices, as in dkdv_producer."""
        qdo_ready, k_ready, v_ready, kv_empty = bars
        HALF: gl.constexpr = BLOCK_M // 2
        bh, b, h, hk, q0 = _dq_coords(N, H, GROUP, IS_CAUSAL, BLOCK_M)
        q_row = b * QRB + h * QRH + q0
        d_row = b * DRB + h * DRH + q0
        if DB > 0:
            mbarrier.expect(qdo_ready, 2 * q_desc.block_type.nbytes + 2 * do_desc.block_type.nbytes
                            + 2 * qb_desc.block_type.nbytes + 2 * dob_desc.block_type.nbytes)
        else:
            mbarrier.expect(qdo_ready, 2 * q_desc.block_type.nbytes + 2 * do_desc.block_type.nbytes)
        tma_load(q_desc, [q_row, h * QCH], qdo_ready, q_smem.index(0))
        tma_load(q_desc, [q_row + HALF, h * QCH], qdo_ready, q_smem.index(1))
        tma_load(do_desc, [d_row, h * DCH], qdo_ready, do_smem.index(0))
        tma_load(do_desc, [d_row + HALF, h * DCH], qdo_ready, do_smem.index(1))
        if DB > 0:
            tma_load(qb_desc, [q_row, h * QCH + DA], qdo_ready, qb_smem.index(0))
            tma_load(qb_desc, [q_row + HALF, h * QCH + DA], qdo_ready, qb_smem.index(1))
            tma_load(dob_desc, [d_row, h * DCH + DA], qdo_ready, dob_smem.index(0))
            tma_load(dob_desc, [d_row + HALF, h * DCH + DA], qdo_ready, dob_smem.index(1))
        k_row = b * KRB + hk * KRH
        k_col = hk * KCH
        # the consumers' order: causal, the key tiles on the diagonal ([q0, q0 + BLOCK_M)) first,
        # then [0, q0); else every key tile from the first
        n_kt = N // BLOCK_N
        shift = 0
        if IS_CAUSAL:
            shift = q0 // BLOCK_N
            n_kt = shift + BLOCK_M // BLOCK_N
        for i in range(n_kt):
            kt = (i + shift) % n_kt
            slot = i % STAGES
            mbarrier.wait(kv_empty.index(slot), ((i // STAGES) & 1) ^ 1)
            if DB > 0:
                mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes + kb_desc.block_type.nbytes)
                tma_load(k_desc, [k_row + kt * BLOCK_N, k_col], k_ready.index(slot), k_smem.index(slot))
                tma_load(kb_desc, [k_row + kt * BLOCK_N, k_col + DA], k_ready.index(slot), kb_smem.index(slot))
                mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes + vb_desc.block_type.nbytes)
                tma_load(v_desc, [k_row + kt * BLOCK_N, k_col], v_ready.index(slot), v_smem.index(slot))
                tma_load(vb_desc, [k_row + kt * BLOCK_N, k_col + DA], v_ready.index(slot), vb_smem.index(slot))
            else:
                mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
                tma_load(k_desc, [k_row + kt * BLOCK_N, k_col], k_ready.index(slot), k_smem.index(slot))
                mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
                tma_load(v_desc, [k_row + kt * BLOCK_N, k_col], v_ready.index(slot), v_smem.index(slot))

    @gluon.jit
    def _dq_step(dq, dqb, c, row0, key0, lse2, delta, q_mine, do_mine, qb_mine, dob_mine, k_smem, v_smem,
                 kb_smem, vb_smem, bars, zero_s, QK_SCALE: gl.constexpr, MASK: gl.constexpr, HALF: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DB: gl.constexpr, s_layout: gl.constexpr,
                 a_layout: gl.constexpr, ab_layout: gl.constexpr):
        """One key tile (keys [key0, key0 + BLOCK_N)) into this warpgroup's dQ (rows [row0, row0 +
        HALF)). MASK: the tile crosses the causal diagonal. DB > 0: S and dP summed over both column
        slices, dQ's second slice in dqb."""
        qdo_ready, k_ready, v_ready, kv_empty = bars
        dtype: gl.constexpr = q_mine.dtype
        PAIR: gl.constexpr = 1 + (DB > 0)  # wgmma groups a product takes
        slot = c % STAGES
        ph = (c // STAGES) & 1
        mbarrier.wait(k_ready.index(slot), ph)
        s = warpgroup_mma(q_mine, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if DB > 0:
            s = warpgroup_mma(qb_mine, kb_smem.index(slot).permute((1, 0)), s, is_async=True)
        mbarrier.wait(v_ready.index(slot), ph)
        dp = warpgroup_mma(do_mine, v_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if DB > 0:
            dp = warpgroup_mma(dob_mine, vb_smem.index(slot).permute((1, 0)), dp, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=PAIR, deps=(s, ))
        p = gl.exp2(s * QK_SCALE - gl.expand_dims(lse2, 1))
        if MASK:
            rows = row0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
            keys = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            p = gl.where(gl.expand_dims(rows, 1) >= gl.expand_dims(keys, 0), p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        ds = p * (dp - gl.expand_dims(delta, 1))
        ds_op = gl.convert_layout(ds.to(dtype), a_layout)
        dq = warpgroup_mma(ds_op, k_smem.index(slot), dq, is_async=True)
        if DB > 0:
            dqb = warpgroup_mma(gl.convert_layout(ds_op, ab_layout), kb_smem.index(slot), dqb, is_async=True)
            dq, dqb = warpgroup_mma_wait(num_outstanding=0, deps=(dq, dqb))
        else:
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
        mbarrier.arrive(kv_empty.index(slot), count=1)
        return dq, dqb

    @gluon.jit
    def _dq_consumer(q_smem, do_smem, k_smem, v_smem, bars, O, DO, L, DELTA, DQ, N, H,
                     stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                     stride_dqb, stride_dqh, stride_dqn, QK_SCALE: gl.constexpr, SM_SCALE: gl.constexpr,
                     GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
                     qb_smem, dob_smem, kb_smem, vb_smem, DB: gl.constexpr):
        qdo_ready, k_ready, v_ready, kv_empty = bars
        HALF: gl.constexpr = BLOCK_M // 2
        DA: gl.constexpr = D - DB
        DBP: gl.constexpr = DB + (DB == 0) * 8  # the second slice's width (a placeholder where DB = 0)
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, DA, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        ob_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DBP, 16])
        ab_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ob_layout, k_width=2)
        bh, b, h, hk, q0 = _dq_coords(N, H, GROUP, IS_CAUSAL, BLOCK_M)
        row0 = q0 + WG * HALF
        b64 = b.to(gl.int64)
        h64 = h.to(gl.int64)
        # Delta = rowsum(O * dO) of this warpgroup's rows, in fp32; written for the dK/dV kernel
        rows_o = (row0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, o_layout))).to(gl.int64)
        cols = gl.arange(0, DA, layout=gl.SliceLayout(0, o_layout))
        o = gl.load(O + b64 * stride_ob + h64 * stride_oh + gl.expand_dims(rows_o * stride_on, 1)
                    + gl.expand_dims(cols, 0))
        do = gl.load(DO + b64 * stride_dob + h64 * stride_doh + gl.expand_dims(rows_o * stride_don, 1)
                     + gl.expand_dims(cols, 0))
        delta_o = gl.sum(o.to(gl.float32) * do.to(gl.float32), axis=1)
        rows_b = (row0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, ob_layout))).to(gl.int64)
        cols_b = DA + gl.arange(0, DBP, layout=gl.SliceLayout(0, ob_layout))
        if DB > 0:  # the second column slice's share of the row sums
            o_b = gl.load(O + b64 * stride_ob + h64 * stride_oh + gl.expand_dims(rows_b * stride_on, 1)
                          + gl.expand_dims(cols_b, 0))
            do_b = gl.load(DO + b64 * stride_dob + h64 * stride_doh + gl.expand_dims(rows_b * stride_don, 1)
                           + gl.expand_dims(cols_b, 0))
            delta_o += gl.convert_layout(gl.sum(o_b.to(gl.float32) * do_b.to(gl.float32), axis=1),
                                         gl.SliceLayout(1, o_layout))
        gl.store(DELTA + bh.to(gl.int64) * N + rows_o, delta_o)
        delta = gl.convert_layout(delta_o, gl.SliceLayout(1, s_layout))
        rows_s = row0 + gl.arange(0, HALF, layout=gl.SliceLayout(1, s_layout))
        lse2 = gl.load(L + bh.to(gl.int64) * N + rows_s) * 1.4426950408889634
        zero_s = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
        dq = gl.zeros([HALF, DA], gl.float32, o_layout)
        dqb = gl.zeros([HALF, DBP], gl.float32, ob_layout)  # not used where DB = 0
        q_mine = q_smem.index(WG)
        do_mine = do_smem.index(WG)
        qb_mine = qb_smem.index(WG)
        dob_mine = dob_smem.index(WG)
        mbarrier.wait(qdo_ready, 0)
        c = 0
        n_kt = N // BLOCK_N
        if IS_CAUSAL:  # the key tiles on the diagonal, masked; then those before it, unmasked
            for j in gl.static_range(BLOCK_M // BLOCK_N):
                dq, dqb = _dq_step(dq, dqb, c, row0, q0 + j * BLOCK_N, lse2, delta, q_mine, do_mine, qb_mine,
                                   dob_mine, k_smem, v_smem, kb_smem, vb_smem, bars, zero_s, QK_SCALE, True, HALF,
                                   BLOCK_N, STAGES, DB, s_layout, a_layout, ab_layout)
                c += 1
            n_kt = q0 // BLOCK_N
        for kt in range(n_kt):
            dq, dqb = _dq_step(dq, dqb, c, row0, kt * BLOCK_N, lse2, delta, q_mine, do_mine, qb_mine, dob_mine,
                               k_smem, v_smem, kb_smem, vb_smem, bars, zero_s, QK_SCALE, False, HALF, BLOCK_N,
                               STAGES, DB, s_layout, a_layout, ab_layout)
            c += 1
        dq_out = (dq * SM_SCALE).to(DQ.dtype.element_ty)
        gl.store(DQ + b64 * stride_dqb + h64 * stride_dqh + gl.expand_dims(rows_o * stride_dqn, 1)
                 + gl.expand_dims(cols, 0), dq_out)
        if DB > 0:
            gl.store(DQ + b64 * stride_dqb + h64 * stride_dqh + gl.expand_dims(rows_b * stride_dqn, 1)
                     + gl.expand_dims(cols_b, 0), (dqb * SM_SCALE).to(DQ.dtype.element_ty))

    @gluon.jit
    def _dq_kernel(q_desc, do_desc, k_desc, v_desc, O, DO, L, DELTA, DQ, N, H,
                   QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH,
                   stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                   stride_dqb, stride_dqh, stride_dqn, QK_SCALE: gl.constexpr, SM_SCALE: gl.constexpr,
                   GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                   CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr, qb_desc, dob_desc, kb_desc, vb_desc,
                   DB: gl.constexpr):
        """DB > 0: a head's columns in two slices, as in _dkdv_kernel."""
        gl.static_assert(num_warps == 4, "one consumer warpgroup in the default partition")
        HALF: gl.constexpr = BLOCK_M // 2
        DA: gl.constexpr = D - DB
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2, HALF, DA], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [2, HALF, DA], do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DA], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DA], v_desc.layout)
        if DB > 0:
            qb_smem = gl.allocate_shared_memory(dtype, [2, HALF, DB], qb_desc.layout)
            dob_smem = gl.allocate_shared_memory(dtype, [2, HALF, DB], dob_desc.layout)
            kb_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DB], kb_desc.layout)
            vb_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DB], vb_desc.layout)
        else:  # not read
            qb_smem = q_smem
            dob_smem = do_smem
            kb_smem = k_smem
            vb_smem = v_smem
        qdo_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(qdo_ready, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=2)  # both consumer warpgroups release a slot
        bars = (qdo_ready, k_ready, v_ready, kv_empty)
        gl.warp_specialize([
            (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, bars, O, DO, L, DELTA, DQ, N, H,
                            stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                            stride_dqb, stride_dqh, stride_dqn, QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL,
                            BLOCK_M, BLOCK_N, D, STAGES, 0, qb_smem, dob_smem, kb_smem, vb_smem, DB)),
            (_dq_consumer, (q_smem, do_smem, k_smem, v_smem, bars, O, DO, L, DELTA, DQ, N, H,
                            stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                            stride_dqb, stride_dqh, stride_dqn, QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL,
                            BLOCK_M, BLOCK_N, D, STAGES, 1, qb_smem, dob_smem, kb_smem, vb_smem, DB)),
            (_dq_producer, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, bars, N, H,
                            QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH, GROUP, IS_CAUSAL, BLOCK_M,
                            BLOCK_N, STAGES, qb_desc, dob_desc, kb_desc, vb_desc, qb_smem, dob_smem, kb_smem,
                            vb_smem, D - DB, DB)),
        ], [4, 1], [CONSUMER_REGS, 24])


# ---------------------------------------------------------------------------------------------
# Launchers


def row_desc(t2: torch.Tensor, block_m: int):
    """A TMA descriptor over a (rows, N) fp32 tensor (L or Delta), a block of one row of block_m."""
    return TensorDescriptor(t2, list(t2.shape), list(t2.stride()), [1, block_m], fp32_layout())


@functools.cache
def fp32_layout():
    """The shared-memory layout of an fp32 tile that TMA loads or stores unswizzled (its rows can be
    sliced): L and Delta's rows."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def launch_dkdv(q, k, v, do, lse, delta, dk, dv, is_causal: bool, stages: int | None = None,
                consumer_regs: int | None = None, compile_only: bool = False, block_m: int | None = None):
    """dK, dV into dk, dv ((B, H_kv, N, D) views, any batch/head/row strides, unit stride along
    D) for q, k, v that `unsupported` accepts; lse and delta (B*H, N) fp32. Returns the compiled
    kernel (its n_regs, n_spills, asm). compile_only: compile for the active driver's target
    and launch nothing (the CPU's sm_90 compile check)."""
    q4, k4, v4, do4, dk4, dv4 = (fg.heads(t) for t in (q, k, v, do, dk, dv))
    if fg.head_rows(do4) is None or do4.data_ptr() % 16:
        do4 = do4.contiguous()  # e.g. the expanded ones of out.sum().backward()
    nb, nh, n, d = q4.shape
    h_kv = k4.shape[1]
    st, regs, bm = CONFIGS[d]
    stages, consumer_regs, block_m = stages or st, consumer_regs or regs, block_m or bm
    lse2, delta2 = lse.reshape(nb * nh, n), delta.reshape(nb * nh, n)
    lse2 = lse2 if lse2.is_contiguous() and lse2.data_ptr() % 16 == 0 else lse2.contiguous()
    delta2 = delta2 if delta2.is_contiguous() and delta2.data_ptr() % 16 == 0 else delta2.contiguous()
    (q_desc, qb_desc), (qrb, qrh, qch) = _slices(q4, block_m)
    (do_desc, dob_desc), (drb, drh, dch) = _slices(do4, block_m)
    (k_desc, kb_desc), (krb, krh, kch) = _slices(k4, BLOCK_N // 2)
    (v_desc, vb_desc), _ = _slices(v4, BLOCK_N // 2)
    grid = (nb * h_kv, n // BLOCK_N)
    kernel = _dkdv_kernel.warmup if compile_only else kernel_launch.plain_launch(_dkdv_kernel)[grid]
    return kernel(
        q_desc, do_desc, k_desc, v_desc, row_desc(lse2, block_m), row_desc(delta2, block_m), dk4, dv4, n, nh, h_kv,
        qrb, qrh, qch, drb, drh, dch, krb, krh, kch, dk4.stride(0), dk4.stride(1), dk4.stride(2),
        dv4.stride(0), dv4.stride(1), dv4.stride(2), QK_SCALE=LOG2E / math.sqrt(d), SM_SCALE=1.0 / math.sqrt(d),
        GROUP=nh // h_kv, IS_CAUSAL=bool(is_causal), BLOCK_M=block_m, BLOCK_N=BLOCK_N, D=d, STAGES=stages,
        CONSUMER_REGS=consumer_regs, num_warps=4, qb_desc=qb_desc, dob_desc=dob_desc, kb_desc=kb_desc,
        vb_desc=vb_desc, DB=fg.split_head_dim(d)[1], **(dict(grid=grid) if compile_only else {}))


def _slices(t4: torch.Tensor, block_rows: int):
    """((descriptor of a head's first column slice, of its second), the head offsets): the second is
    the first where the head dim is one slice (not read then; fg.split_head_dim)."""
    da, db = fg.split_head_dim(t4.shape[-1])
    first, offsets = fg.head_desc(t4, block_rows, da)
    return (first, fg.head_desc(t4, block_rows, db)[0] if db else first), offsets


@opaque_op("lmperf::flash_attention_dkdv_gluon", ("dk", "dv"), lambda *args: None)
def flash_attention_dkdv_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                               lse: torch.Tensor, delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                               is_causal: bool) -> None:
    """dK, dV into dk, dv, as a PyTorch op opaque to torch.compile (a compiled backward launches
    the same kernel as eager mode: the same bits). With plans on (LMPERF_FA_LAUNCH=plan), a call's
    launch is replayed from the plan of its signature, as in eager mode."""
    inputs = (q, k, v, do, lse, delta, dk, dv)
    kernel_launch.launch_in_place(("gluon dkdv", is_causal), inputs, lambda: launch_dkdv(*inputs, is_causal))


def launch_dq(q, k, v, out, do, lse, delta, dq, is_causal: bool, stages: int | None = None,
              consumer_regs: int | None = None, block_n: int | None = None, compile_only: bool = False):
    """dQ into dq ((B, H, N, D) view, any batch/head/row strides, unit stride along D) and Delta =
    rowsum(O * dO) into delta ((B*H, N) fp32, contiguous: what launch_dkdv reads) for q, k, v that
    `unsupported` accepts, from the forward's O (out) and L (lse, (B*H, N) fp32) and dO. Returns
    the compiled kernel; compile_only: compile for the active driver's target, launch nothing."""
    q4, k4, v4, o4, do4, dq4 = (fg.heads(t) for t in (q, k, v, out, do, dq))
    if fg.head_rows(do4) is None or do4.data_ptr() % 16:
        do4 = do4.contiguous()
    if o4.stride(-1) != 1:
        o4 = o4.contiguous()
    nb, nh, n, d = q4.shape
    st, regs, bn = DQ_CONFIGS[d]
    stages, consumer_regs, block_n = stages or st, consumer_regs or regs, block_n or bn
    lse2 = lse.reshape(nb * nh, n)
    lse2 = lse2 if lse2.is_contiguous() else lse2.contiguous()
    delta2 = delta.view(nb * nh, n)  # written: a view, never a copy
    if not delta2.is_contiguous():
        raise ValueError("delta must be a contiguous (B*H, N) fp32 tensor")
    (q_desc, qb_desc), (qrb, qrh, qch) = _slices(q4, DQ_BLOCK_M // 2)
    (do_desc, dob_desc), (drb, drh, dch) = _slices(do4, DQ_BLOCK_M // 2)
    (k_desc, kb_desc), (krb, krh, kch) = _slices(k4, block_n)
    (v_desc, vb_desc), _ = _slices(v4, block_n)
    grid = (nb * nh, n // DQ_BLOCK_M)
    kernel = _dq_kernel.warmup if compile_only else kernel_launch.plain_launch(_dq_kernel)[grid]
    return kernel(
        q_desc, do_desc, k_desc, v_desc, o4, do4, lse2, delta2, dq4, n, nh, qrb, qrh, qch, drb, drh, dch,
        krb, krh, kch, o4.stride(0), o4.stride(1), o4.stride(2), do4.stride(0), do4.stride(1), do4.stride(2),
        dq4.stride(0), dq4.stride(1), dq4.stride(2), QK_SCALE=LOG2E / math.sqrt(d), SM_SCALE=1.0 / math.sqrt(d),
        GROUP=nh // k4.shape[1], IS_CAUSAL=bool(is_causal), BLOCK_M=DQ_BLOCK_M, BLOCK_N=block_n, D=d,
        STAGES=stages, CONSUMER_REGS=consumer_regs, num_warps=4, qb_desc=qb_desc, dob_desc=dob_desc,
        kb_desc=kb_desc, vb_desc=vb_desc, DB=fg.split_head_dim(d)[1], **(dict(grid=grid) if compile_only else {}))


@opaque_op("lmperf::flash_attention_dq_gluon", ("delta", "dq"), lambda *args: None)
def flash_attention_dq_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             do: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor, dq: torch.Tensor,
                             is_causal: bool) -> None:
    """dQ into dq and Delta into delta, as a PyTorch op opaque to torch.compile (a compiled
    backward launches the same kernel as eager mode: the same bits). With plans on
    (LMPERF_FA_LAUNCH=plan), a call's launch is replayed from the plan of its signature."""
    inputs = (q, k, v, out, do, lse, delta, dq)
    kernel_launch.launch_in_place(("gluon dq", is_causal), inputs, lambda: launch_dq(*inputs, is_causal))
