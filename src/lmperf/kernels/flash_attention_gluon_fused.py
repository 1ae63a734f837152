"""FlashAttention backward on Hopper GPUs (H100, H200) in Gluon, fused: dQ, dK and dV in one kernel,
dQ summed in a fixed order without atomic adds (design: tuning/flash_attention/research_gluon_backward.md,
section 4 (c)). LMPERF_FA_BWD_BACKEND=gluon-fused forces it; "auto" takes it where
flash_attention_gluon_bwd.prefers_fused's rule says it is faster than the two-kernel backward.

The two-kernel backward (flash_attention_gluon_bwd) computes S and dP twice, once for dQ and once for
dK/dV: seven matrix products a pair of tiles. This kernel computes them once (five products): it is
the dK/dV kernel (`_dkdv_kernel`'s program: a key tile of 128 keys, two consumer warpgroups of 64
keys each, a one-warp TMA producer streaming the Q and dO tiles) that also multiplies each step's
dS by its K tile, giving that query tile's share of dQ from this key tile. The shares of a query tile
from its key tiles are added in a fixed order of the key tiles, in a fp32 buffer (dQacc, tile-major):

- each step the two consumer warpgroups store their halves of dS (bf16, transposed) into shared
  memory; each then computes half of the step's dQ share (dS [BLOCK_M, 128] times K [128, D]: at head
  dim 128 the columns [0, 64) or [64, 128) of it, K being loaded as two column slices; at 64 the
  query rows [0, 64) or [64, 128) of a 128-row tile) and hands it to the writer through shared memory,
  as two [64, 32] pieces each 128-byte swizzled (the accumulator's rows stored into unswizzled
  256-byte rows conflict on the same banks: NOTES.md step 55);
- a writer partition (two warps) waits for its key tile's turn at that query tile (a per-tile
  counter in global memory, `_turns`), then the first in turn stores the share into dQacc by TMA
  and a later one adds it there in L2 (a TMA reduce); each but the last passes the turn on once its
  writes are performed. The consumers run up to two steps ahead of it (two buffers). At DEFER_DIMS'
  head dims a step's half share is stored by the next step, once that step's first product is issued
  (the store under a product instead of between two).
- causal at head dim 128 (WHOLE_DIMS) a head is loaded whole, so that dK and dV are one accumulator
  each, and (TRIM_DIMS) a key tile's first step, whose second warpgroup's keys all come after its
  query rows, computes no product for that warpgroup.

Programs take their key tile in the order they start (a ticket from a global counter), so that a
program only ever waits for programs that started before it (or, where a sequence's key tiles run
together, `_turns`' SCHEDULE 1, for programs of its own sequence, all of which fit on the GPU at
once): no deadlock whatever order the GPU starts them in. Causal at schedule 1, the last sequences (a tail,
TAIL_DIMS) take their key tiles across the tail, the longest first, with schedule 0's turns, so that the
programs that start last are short ones. Asked for (`launch(schedule=2)`, causal),
a program takes a pair of a sequence's key tiles, n_kt - 1 - j then j, so that every program does as
many steps. The same bits every run: every sum is in a fixed order.

A small kernel runs first: Delta = rowsum(O * dO) (fp32, what the consumers read as the two-kernel
path's dQ kernel writes it), and the turn counters and the ticket set to zero; another runs after:
dQ from the sums in dQacc, scaled and cast (`_cast_kernel`), so that no program's writer does more
than add (the last in turn at every query tile is the same program, a sequence's first key tile).

Covers what flash_attention_gluon_bwd covers (`unsupported`), at head dims 64 and 128 (HEAD_DIMS).
"""
from __future__ import annotations

import math

import torch

from lmperf.kernels import flash_attention_gluon as fg
from lmperf.kernels import flash_attention_gluon_bwd as gb
from lmperf.kernels import launch as kernel_launch
from lmperf.kernels.triton_op import opaque_op

HEAD_DIMS = (64, 128)
BLOCK_N = gb.BLOCK_N  # keys a program: two warpgroups of 64
# (STAGES, consumer registers, BLOCK_M query rows a step, writer registers, writer warps) by head dim.
# Writer warps 4: the writer is the partition the kernel starts in (with the registers the others
# leave) and both consumer warpgroups are workers, at 232 registers each at most (the pool's limit: at
# 240 ptxas sets no register counts and spills everywhere), spilling about 40% fewer instructions than
# the first consumer does as that partition (the layout at writer warps 2). At head dim 128 it is the
# default (forward + backward faster outside the noise of three processes in three of eight readings,
# slower in none); at 64 it is no faster (tuning/flash_attention/NOTES.md steps 59-60). The two
# layouts as launch's keywords; `config` makes a CONFIGS entry of one.
WRITER_FIRST = {"stages": 2, "consumer_regs": 232, "writer_regs": 24, "writer_warps": 4}
CONSUMER_FIRST = {"stages": 2, "consumer_regs": 240, "writer_regs": 32, "writer_warps": 2}


def config(layout: dict, block_m: int) -> tuple:
    """A CONFIGS entry: `layout` (WRITER_FIRST or CONSUMER_FIRST, or launch's keywords like them) at
    BLOCK_M query rows a step."""
    return (layout["stages"], layout["consumer_regs"], block_m, layout["writer_regs"], layout["writer_warps"])


CONFIGS = {64: config(CONSUMER_FIRST, 128), 128: config(WRITER_FIRST, 64)}
# Head dims whose kernel is persistent at schedule 0 (launch's `persistent`): a program an SM, its
# producer taking key tiles by ticket for the others, the next tile's K and V loaded while the last
# tile's dK and dV are stored. Opt-in (none): tuning/flash_attention/NOTES.md step 61.
PERSISTENT_DIMS: tuple[int, ...] = ()
# Head dims whose non-causal kernel takes its first R = BLOCK_N / BLOCK_M steps out of the step loop as
# the causal kernel does its diagonal's (launch's `peel`; the same steps in the same order, the same
# bits). Opt-in (none): at head dim 128 ptxas then spills none of the loop's registers (8 stores and 22
# loads a step otherwise) but the backward is no faster outside the noise of four processes; at 64 it
# spills more (tuning/flash_attention/NOTES.md step 71).
PEEL_DIMS: tuple[int, ...] = ()
# Head dims whose causal kernel loads a head whole (launch's `whole`): Q, dO, K and V one [rows, D] tile
# each, so that dK and dV are one accumulator each and their products 128 columns wide (as cuDNN's), the
# dQ share's B operand this warpgroup's 64 columns of K. The same bits as in two column slices. Causal at
# head dim 128 the backward 2-3% faster (H200, three processes); not causal 3-7% slower, so not there
# (tuning/flash_attention/NOTES.md steps 77-78).
WHOLE_DIMS: tuple[int, ...] = (128,)
# Head dims whose causal kernel skips the all-masked half of each key tile's first step (launch's `trim`):
# at BLOCK_M = 64 the second warpgroup's keys all come after that step's query rows, so its P and dS are
# zeros: it computes no product there and the dQ share takes the first warpgroup's keys alone. The same
# bits; at 8 x 16 x 2,048 x 128 causal 1-2% off the backward (NOTES.md step 78).
TRIM_DIMS: tuple[int, ...] = (128,)
# Head dims whose kernel stores each step's dQ share in the next step, once that step's first product is
# issued (launch's `defer`; the same products and sums, the same bits): the store into shared memory under
# that product instead of between two. Causal, or with the first steps peeled; not persistent, not under
# schedule 2; unasked, without grouped-query (measured there; grouped-query at 64 spills 2 more loads a
# step with it). At head dim 64 the backward 2-4% faster in two processes (4 x 25 x 2,048 and
# 1 x 16 x 16,384, causal); at 128 no faster outside the noise (tuning/flash_attention/NOTES.md step 72).
DEFER_DIMS: tuple[int, ...] = (64,)
# Head dims whose causal kernel at schedule 1 takes its last sequences key tile by key tile (a tail; launch's
# `tail`): at schedule 1 a sequence's key tiles start one after another, so the last programs to start
# include the last sequences' longest (key tile 0), which run on while the other SMs have nothing left
# (Nsight Compute: the SMs idle 7% of the kernel at 8 x 16 x 2,048 x 128). A tail's sequences take their
# key tiles in order across the tail (the longest first), their turns in key tile order: they get schedule
# 0's bits, the others schedule 1's. TAIL_FILL x SMs / key tiles a sequence of them, at most a quarter of
# the sequences (the tail reads its sequences' tiles as schedule 0 does, from HBM more than L2; at
# 8 x 16 x 2,048 x 128 a tail of 48 of 128 was slower than none). tuning/flash_attention/NOTES.md step 80.
TAIL_DIMS: tuple[int, ...] = (64, 128)
TAIL_FILL = 3
H100_SMS = 132  # the grid of a persistent compile_only (no GPU to ask)
PIECE = 32  # columns of a dQ share's piece in shared memory (128 bytes of fp32: 128-byte swizzled)

gluon = None
TMA_REDUCE_ERROR = "Gluon is not importable"  # why this Triton cannot build the kernel, or None
if gb.gluon is not None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    tma_load, tma_store = fg.tma_load, fg.tma_store
    try:  # the TMA reduce: in Gluon's builder (Triton 3.6), not in its language
        from triton._C.libtriton import ir as _ir
        from triton._C.libtriton.gluon_ir import GluonOpBuilder as _Builder
        from triton.experimental.gluon.language._core import builtin as _builtin
        _ADD = _ir.DESCRIPTOR_REDUCE_KIND.ADD
        if not hasattr(_Builder, "create_async_tma_reduce"):
            raise AttributeError("GluonOpBuilder.create_async_tma_reduce")
        TMA_REDUCE_ERROR = None
    except (ImportError, AttributeError) as exc:
        TMA_REDUCE_ERROR = f"this Triton's Gluon has no TMA reduce ({type(exc).__name__}: {exc})"
        _builtin = lambda fn: fn  # noqa: E731 - never called: `unsupported` refuses every call

    @_builtin
    def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
        """Add the shared-memory tile src into the global tile of tensor_desc at coord, in L2 (a TMA
        reduce, cp.reduce.async.bulk.tensor .add): Gluon's builder has it, its language not yet."""
        coord = _semantic._convert_to_ir_values(coord, require_i64=False)
        _semantic.builder.create_async_tma_reduce(_ADD, tensor_desc.handle, coord, src.handle)


def unsupported(q, k, v, is_causal: bool) -> str | None:
    """None where the fused kernel can run the call on this process's GPU, else the reason."""
    if q.shape[-1] not in HEAD_DIMS:
        return f"the fused Gluon backward covers head dims {HEAD_DIMS}; got {q.shape[-1]}"
    if (why := gb.unsupported(q, k, v, is_causal)) is not None:
        return why
    return TMA_REDUCE_ERROR


def split(d: int, whole: bool = False) -> tuple[int, int]:
    """(DA, DB): the column slices the kernel loads a head in: head dim 128 in two of 64 (so that each
    warpgroup's half of a dQ share reads its own K slice) unless whole, 64 in one."""
    return (64, 64) if d == 128 and not whole else (d, 0)


if gluon is not None:

    @gluon.jit
    def _delta_kernel(O, DO, DELTA, SEM, N, H, stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                      D: gl.constexpr, ROWS: gl.constexpr, num_warps: gl.constexpr):
        """Delta of rows [i ROWS, (i + 1) ROWS) of head bh, and that query tile's turn counter set to
        zero (program (0, 0) also the ticket, which follows the counters)."""
        bh = gl.program_id(0)
        i = gl.program_id(1)
        n_qt = N // ROWS
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [num_warps, 1], [1, 0])
        b = (bh // H).to(gl.int64)
        h = (bh % H).to(gl.int64)
        rows = (i * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))).to(gl.int64)
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
        o = gl.load(O + b * stride_ob + h * stride_oh + gl.expand_dims(rows * stride_on, 1) + gl.expand_dims(cols, 0))
        do = gl.load(DO + b * stride_dob + h * stride_doh + gl.expand_dims(rows * stride_don, 1)
                     + gl.expand_dims(cols, 0))
        gl.store(DELTA + bh.to(gl.int64) * N + rows, gl.sum(o.to(gl.float32) * do.to(gl.float32), axis=1))
        gl.store(SEM + bh * n_qt + i, 0)
        if (bh == 0) & (i == 0):
            gl.store(SEM + gl.num_programs(0) * n_qt, 0)

    @gluon.jit
    def _cast_kernel(ACC, DQ, H, stride_dqb, stride_dqh, stride_dqn, SM_SCALE: gl.constexpr, BLOCK_M: gl.constexpr,
                     DB: gl.constexpr, W: gl.constexpr, num_warps: gl.constexpr):
        """dQ of query tile i of head bh (q heads) from its sum in dQacc (tile-major: the warpgroups' two
        halves, each in P pieces of [64, W]), scaled by SM_SCALE and cast to dQ's dtype."""
        bh = gl.program_id(0)
        i = gl.program_id(1)
        P: gl.constexpr = 64 // W
        layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (W // 4), W // 4], [num_warps, 1], [1, 0])
        b = (bh // H).to(gl.int64)
        h = (bh % H).to(gl.int64)
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
        cc = gl.arange(0, W, layout=gl.SliceLayout(0, layout))
        tile = ACC + (bh.to(gl.int64) * gl.num_programs(1) + i) * (2 * P * 64 * W)
        dq_tile = DQ + b * stride_dqb + h * stride_dqh + (i * BLOCK_M).to(gl.int64) * stride_dqn
        for wp in gl.static_range(2 * P):
            w = wp // P
            pc = wp % P
            x = gl.load(tile + wp * 64 * W + gl.expand_dims(r * W, 1) + gl.expand_dims(cc, 0))
            row0 = (DB == 0) * w * 64
            col0 = (DB > 0) * w * 64 + pc * W
            gl.store(dq_tile + (row0 * stride_dqn + col0) + gl.expand_dims(r * stride_dqn, 1) + gl.expand_dims(cc, 0),
                     (x * SM_SCALE).to(DQ.dtype.element_ty))

    @gluon.jit
    def _fused_step(dk, dv, dkb, dvb, dq, c, q0, key0, k_mine, v_mine, kb_mine, vb_mine, k_smem, kb_smem, q_smem,
                    do_smem, qb_smem, dob_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars,
                    QK_SCALE: gl.constexpr, MASK: gl.constexpr, BLOCK_M: gl.constexpr, HALF: gl.constexpr,
                    STAGES: gl.constexpr, DB: gl.constexpr, WG: gl.constexpr, s_layout: gl.constexpr,
                    a_layout: gl.constexpr, ab_layout: gl.constexpr, q_layout: gl.constexpr,
                    PROBE: gl.constexpr, DEFER: gl.constexpr, HAS_PREV: gl.constexpr, TRIM: gl.constexpr = 0):
        """flash_attention_gluon_bwd's step for one query tile (rows [q0, q0 + BLOCK_M)) into this warpgroup's
        dK, dV (keys [key0, key0 + HALF)), then this warpgroup's half of the tile's dQ share, handed
        to the writer (dq_smem). DEFER: the share is returned (dq) and stored by the next step (HAS_PREV:
        dq is the last step's) once its S^T is issued, so that the store overlaps that product; the
        tile's last share by _store_share after its steps. TRIM (causal, a key tile's first step at BLOCK_M
        = HALF): 1 for the second warpgroup, whose keys all come after the step's query rows (P and dS
        zero): no products, its dS not stored, Q and dO not read; 2 for the first; both then take the
        dQ share from the first warpgroup's keys alone (the same sums: the second's products are zeros)."""
        kv_ready, q_ready, do_ready, qdo_empty = bars
        ds_ready, ds_free, dq_ready, dq_empty = fbars
        dtype: gl.constexpr = q_smem.dtype
        if TRIM == 1:
            gl.static_assert(not HAS_PREV, "a trimmed step is a key tile's first")
            mbarrier.arrive(ds_ready, count=1)  # its dS is not read (the other takes its own half alone)
            mbarrier.arrive(qdo_empty.index(c % STAGES), count=1)
        else:
            st = gb.issue_st(c, k_mine, kb_mine, q_smem, qb_smem, l_smem, bars, QK_SCALE, BLOCK_M, HALF, STAGES, DB,
                             s_layout)
            if HAS_PREV:  # the last step's share (dq: in registers) stored while S^T runs
                _store_share(dq, c - 1, dq_smem, fbars, WG, PROBE)
            dv, dvb, dst, s = gb.products_after_st(st, dv, dvb, c, q0, key0, v_mine, vb_mine, do_smem, dob_smem,
                                                   dl_smem, bars, QK_SCALE, MASK, BLOCK_M, HALF, STAGES, DB, s_layout,
                                                   a_layout, ab_layout)
            ds16 = dst.to(dtype)  # dS^T of this warpgroup's keys
            # dS^T into shared memory as dS ([BLOCK_M, HALF] of keys [WG HALF, (WG + 1) HALF)) once both
            # warpgroups have read its previous contents (the last step's)
            if PROBE < 3:
                mbarrier.wait(ds_free, (c & 1) ^ 1)
            if PROBE != 6:
                ds_smem.index(WG).permute((1, 0)).store(ds16)
            fence_async_shared()
            mbarrier.arrive(ds_ready, count=1)
            ds_op = gl.convert_layout(ds16, a_layout)
            dk = warpgroup_mma(ds_op, q_smem.index(s), dk, is_async=True)
            if DB > 0:
                dkb = warpgroup_mma(gl.convert_layout(ds_op, ab_layout), qb_smem.index(s), dkb, is_async=True)
            # dK and dV done before the dQ share is issued: the registers of P^T and dS^T are free then
            # (issuing it first was no faster: NOTES.md step 55)
            if DB > 0:
                dk, dv, dkb, dvb = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, dkb, dvb))
            else:
                dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
            mbarrier.arrive(qdo_empty.index(s), count=1)
        # this warpgroup's half of dS K: head dim 128, the columns of its K slice (k_smem: [0, 64),
        # kb_smem: [64, 128)); head dim 64, the query rows [WG 64, WG 64 + 64) of the tile
        if PROBE < 3:
            mbarrier.wait(ds_ready, c & 1)
        DA: gl.constexpr = k_smem.shape[2]
        if DB > 0 or DA == 128:
            a0 = ds_smem.index(0)
            a1 = ds_smem.index(1)
        else:
            a0 = ds_smem.index(0).slice(WG * 64, 64, dim=0)
            a1 = ds_smem.index(1).slice(WG * 64, 64, dim=0)
        if DB > 0 and WG == 1:
            b0 = kb_smem.index(0)
            b1 = kb_smem.index(1)
        elif DA == 128:  # the head whole: this warpgroup's 64 columns of K
            b0 = k_smem.index(0).slice(WG * 64, 64, dim=1)
            b1 = k_smem.index(1).slice(WG * 64, 64, dim=1)
        else:
            b0 = k_smem.index(0)
            b1 = k_smem.index(1)
        dq = gl.zeros([64, 64], gl.float32, q_layout)
        if PROBE != 4:
            dq = warpgroup_mma(a0, b0, dq, use_acc=False, is_async=True)
            if TRIM == 0:  # trimmed: the second warpgroup's dS is zero
                dq = warpgroup_mma(a1, b1, dq, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
        mbarrier.arrive(ds_free, count=1)
        if not DEFER:
            _store_share(dq, c, dq_smem, fbars, WG, PROBE)
        return dk, dv, dkb, dvb, dq

    @gluon.jit
    def _store_share(dq, c, dq_smem, fbars, WG: gl.constexpr, PROBE: gl.constexpr):
        """Step c's half share (dq) handed to the writer: stored into dq_smem's buffer c % 2 once the
        writer has read what it held two steps before."""
        ds_ready, ds_free, dq_ready, dq_empty = fbars
        buf = c % 2  # the dQ share's buffer
        bph = (c // 2) & 1
        mbarrier.wait(dq_empty.index(buf), bph ^ 1)
        if PROBE < 4:
            # two [64, 32] column pieces (the accumulator's columns split in registers)
            lo, hi = gl.split(gl.permute(gl.reshape(dq, [64, 2, 32]), (0, 2, 1)))
            dq_smem.index((buf * 2 + WG) * 2).store(lo)
            dq_smem.index((buf * 2 + WG) * 2 + 1).store(hi)
            fence_async_shared()  # the writer's TMA reads it
        mbarrier.arrive(dq_ready.index(buf), count=1)

    @gluon.jit
    def _fused_consumer(q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars, DK, DV,
                        N, H_KV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                        QK_SCALE: gl.constexpr, SM_SCALE: gl.constexpr, GROUP: gl.constexpr,
                        IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        D: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, qb_smem, dob_smem,
                        kb_smem, vb_smem, DB: gl.constexpr, bkv, jt, kv_empty, PROBE: gl.constexpr,
                        SCHEDULE: gl.constexpr, PERSISTENT: gl.constexpr, PEEL: gl.constexpr, tk,
                        DEFER: gl.constexpr, TRIM: gl.constexpr):
        kv_ready, q_ready, do_ready, qdo_empty = bars
        HALF: gl.constexpr = BLOCK_N // 2
        DA: gl.constexpr = D - DB
        DBP: gl.constexpr = DB + (DB == 0) * 8
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_M, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, DA, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        ob_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DBP, 16])
        ab_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ob_layout, k_width=2)
        q_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, 64, 16])
        if PERSISTENT:  # bkv: the count of (batch, K/V head) pairs; the tiles from the producer's tickets
            c = gl.to_tensor(0)
            part = 0
            ticket = _read_ticket(tk, part)
            while ticket < bkv * (N // BLOCK_N):
                t_bkv = ticket % bkv
                kt = ticket // bkv
                c = _consumer_tile(q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars,
                                   DK, DV, N, H_KV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh,
                                   stride_dvn, QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, WG,
                                   qb_smem, dob_smem, kb_smem, vb_smem, DB, t_bkv, kt, part, c, kv_empty, PROBE, False,
                                   True, PEEL, False, s_layout, o_layout, a_layout, ob_layout, ab_layout, q_layout)
                part += 1
                ticket = _read_ticket(tk, part)
        elif SCHEDULE == 2:
            c = gl.to_tensor(0)
            for part in range(_n_parts(jt, N, BLOCK_N, SCHEDULE)):
                c = _consumer_tile(q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars,
                                   DK, DV, N, H_KV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh,
                                   stride_dvn, QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, WG,
                                   qb_smem, dob_smem, kb_smem, vb_smem, DB, bkv, _part_kt(jt, part, N, BLOCK_N, SCHEDULE),
                                   part, c, kv_empty, PROBE, True, True, PEEL, False, s_layout, o_layout, a_layout,
                                   ob_layout, ab_layout, q_layout)
        else:
            _consumer_tile(q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars, DK, DV, N,
                           H_KV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn, QK_SCALE,
                           SM_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, WG, qb_smem, dob_smem, kb_smem,
                           vb_smem, DB, bkv, jt, 0, gl.to_tensor(0), kv_empty, PROBE, False, False, PEEL, DEFER,
                           s_layout, o_layout, a_layout, ob_layout, ab_layout, q_layout, TRIM)

    @gluon.jit
    def _consumer_tile(q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars, DK, DV, N,
                       H_KV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                       QK_SCALE: gl.constexpr, SM_SCALE: gl.constexpr, GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, qb_smem,
                       dob_smem, kb_smem, vb_smem, DB: gl.constexpr, bkv, kt, part, c, kv_empty, PROBE: gl.constexpr,
                       HEADS_INNER: gl.constexpr, RELEASE_KV: gl.constexpr, PEEL: gl.constexpr, DEFER: gl.constexpr,
                       s_layout: gl.constexpr,
                       o_layout: gl.constexpr,
                       a_layout: gl.constexpr, ob_layout: gl.constexpr, ab_layout: gl.constexpr,
                       q_layout: gl.constexpr, TRIM: gl.constexpr = False):
        """This warpgroup's keys of key tile kt (the program's part `part`, from step c on): its steps over
        the group's query heads and query tiles (HEADS_INNER: query tile by query tile, else head by
        head), then its dK and dV stored. RELEASE_KV (the program takes more key tiles): kv_empty
        arrived at once the steps are done (K and V read), so that the producer loads the next tile's
        while dK and dV are stored. Returns the next step's count."""
        kv_ready, q_ready, do_ready, qdo_empty = bars
        HALF: gl.constexpr = BLOCK_N // 2
        DA: gl.constexpr = o_layout.instr_shape[1]
        DBP: gl.constexpr = ob_layout.instr_shape[1]
        R: gl.constexpr = BLOCK_N // BLOCK_M
        k_mine = k_smem.index(WG)
        v_mine = v_smem.index(WG)
        kb_mine = kb_smem.index(WG)
        vb_mine = vb_smem.index(WG)
        k0 = kt * BLOCK_N
        key0 = k0 + WG * HALF
        dk = gl.zeros([HALF, DA], gl.float32, o_layout)
        dv = gl.zeros([HALF, DA], gl.float32, o_layout)
        dkb = gl.zeros([HALF, DBP], gl.float32, ob_layout)
        dvb = gl.zeros([HALF, DBP], gl.float32, ob_layout)
        n_qt = N // BLOCK_M
        mbarrier.wait(kv_ready, part & 1)
        if HEADS_INNER:
            dq0 = gl.zeros([64, 64], gl.float32, q_layout)  # no deferred shares here
            first = 0
            if IS_CAUSAL:
                first = k0 // BLOCK_M
                for j in gl.static_range(R):
                    for g in range(GROUP):
                        dk, dv, dkb, dvb, _ = _fused_step(dk, dv, dkb, dvb, dq0, c, k0 + j * BLOCK_M, key0, k_mine,
                                                          v_mine, kb_mine, vb_mine, k_smem, kb_smem, q_smem, do_smem,
                                                          qb_smem, dob_smem, l_smem, dl_smem, ds_smem, dq_smem, bars,
                                                          fbars, QK_SCALE, True, BLOCK_M, HALF, STAGES, DB, WG,
                                                          s_layout, a_layout, ab_layout, q_layout, PROBE, False, False)
                        c += 1
                first += R
            for it in range(first, n_qt):
                for g in range(GROUP):
                    dk, dv, dkb, dvb, _ = _fused_step(dk, dv, dkb, dvb, dq0, c, it * BLOCK_M, key0, k_mine, v_mine,
                                                      kb_mine, vb_mine, k_smem, kb_smem, q_smem, do_smem, qb_smem,
                                                      dob_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars,
                                                      QK_SCALE, False, BLOCK_M, HALF, STAGES, DB, WG, s_layout,
                                                      a_layout, ab_layout, q_layout, PROBE, False, False)
                    c += 1
        else:
            # DEFER: a step's share handed on by the next (_fused_step), so the first R steps out of the loop
            gl.static_assert(not DEFER or IS_CAUSAL or PEEL, "deferred shares: the first steps peeled")
            for g in range(GROUP):
                first = 0
                dq = gl.zeros([64, 64], gl.float32, q_layout)  # DEFER: the last step's share (none yet)
                if IS_CAUSAL or PEEL:  # the first R steps (causal: the diagonal's, masked) out of the loop
                    if IS_CAUSAL:
                        first = k0 // BLOCK_M
                    for j in gl.static_range(R):
                        # TRIM: causal at R = 2, the first step's second warpgroup all masked (_fused_step)
                        dk, dv, dkb, dvb, dq = _fused_step(dk, dv, dkb, dvb, dq, c, (first + j) * BLOCK_M, key0,
                                                           k_mine, v_mine, kb_mine, vb_mine, k_smem, kb_smem, q_smem,
                                                           do_smem, qb_smem, dob_smem, l_smem, dl_smem, ds_smem,
                                                           dq_smem, bars, fbars, QK_SCALE, IS_CAUSAL, BLOCK_M, HALF,
                                                           STAGES, DB, WG, s_layout, a_layout, ab_layout, q_layout,
                                                           PROBE, DEFER, DEFER and j > 0,
                                                           (2 - WG) * (TRIM and IS_CAUSAL and R == 2 and j == 0))
                        c += 1
                    first += R
                for it in range(first, n_qt):
                    dk, dv, dkb, dvb, dq = _fused_step(dk, dv, dkb, dvb, dq, c, it * BLOCK_M, key0, k_mine, v_mine,
                                                       kb_mine, vb_mine, k_smem, kb_smem, q_smem, do_smem, qb_smem,
                                                       dob_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars,
                                                       QK_SCALE, False, BLOCK_M, HALF, STAGES, DB, WG, s_layout,
                                                       a_layout, ab_layout, q_layout, PROBE, DEFER, DEFER)
                    c += 1
                if DEFER:
                    _store_share(dq, c - 1, dq_smem, fbars, WG, PROBE)
        if RELEASE_KV:
            mbarrier.arrive(kv_empty, count=1)  # this key tile's K and V read: the producer may load the next
        gb.store_dkdv(dk, dv, dkb, dvb, DK, DV, bkv, H_KV, key0, stride_dkb, stride_dkh, stride_dkn, stride_dvb,
                       stride_dvh, stride_dvn, SM_SCALE, HALF, DA, DB, o_layout, ob_layout)
        return c

    @gluon.jit
    def _n_parts(jt, N, BLOCK_N: gl.constexpr, SCHEDULE: gl.constexpr):
        """The key tiles program jt of its sequence takes: one, or under SCHEDULE 2 a pair (two unless
        the pair's tiles are the same, the middle of an odd count)."""
        if SCHEDULE == 2:
            return 1 + (jt != N // BLOCK_N - 1 - jt).to(gl.int32)
        return 1

    @gluon.jit
    def _part_kt(jt, part, N, BLOCK_N: gl.constexpr, SCHEDULE: gl.constexpr):
        """The key tile of program jt's part `part` (_n_parts): under SCHEDULE 2 the pair (n_kt - 1 - jt,
        jt), the shorter (causal) first, as its turns come first at every query tile; else jt."""
        if SCHEDULE == 2:
            return (N // BLOCK_N - 1 - jt) * (1 - part) + jt * part
        return jt

    @gluon.jit
    def _tail_tile(ticket, n_bkv, n_jt, TAIL):
        """(sequence, key tile, ascending turns) of a ticket under schedule 1 with a tail: the first n_bkv -
        TAIL sequences as schedule 1 takes them (a sequence's key tiles one after another, turns from the
        diagonal's key tile down), then the last TAIL sequences key tile by key tile (0, the longest causal,
        first; the sequences fastest) with their turns in key tile order (schedule 0's), so that the programs
        taken last are the shortest. A tail sequence's key tile waits only for its lower key tiles, which took
        earlier tickets; the others as schedule 1's (NOTES.md step 80)."""
        head = (n_bkv - TAIL) * n_jt
        asc = (ticket >= head).to(gl.int32)
        t = ticket - asc * head
        bkv = (1 - asc) * (t // n_jt) + asc * (n_bkv - TAIL + t % TAIL)
        jt = (1 - asc) * (t % n_jt) + asc * (t // TAIL)
        return bkv, jt, asc

    @gluon.jit
    def _publish_ticket(tk, part, ticket):
        """The producer's: ticket (the key tile the program takes as its part `part`, in the order of
        the tickets: the sequences fastest) into the program's slot part % 2 for the other partitions,
        once they have read what the slot held two parts before."""
        slot, ticks, tick_ready, tick_free = tk
        buf = part % 2
        mbarrier.wait(tick_free.index(buf), ((part // 2) & 1) ^ 1)
        gl.atomic_xchg(ticks + buf, ticket, sem="relaxed")
        mbarrier.arrive(tick_ready.index(buf), count=1)

    @gluon.jit
    def _take_ticket(tk, part):
        """The producer's: the next ticket (a global counter), published as part `part`'s."""
        slot, ticks, tick_ready, tick_free = tk
        ticket = gl.atomic_add(slot, 1, sem="relaxed")
        _publish_ticket(tk, part, ticket)
        return ticket

    @gluon.jit
    def _read_ticket(tk, part):
        """The consumers' and the writer's: part `part`'s ticket, as the producer published it."""
        slot, ticks, tick_ready, tick_free = tk
        buf = part % 2
        mbarrier.wait(tick_ready.index(buf), (part // 2) & 1)
        ticket = gl.atomic_add(ticks + buf, 0, sem="relaxed")
        mbarrier.arrive(tick_free.index(buf), count=1)
        return ticket

    @gluon.jit
    def _proxy_fence(x):
        """fence.proxy.async.global: order this thread's generic-proxy accesses to global memory
        with its later TMA (async-proxy) ones (x: any scalar, returned)."""
        return gl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, $1;", "=r,r", [x], dtype=gl.int32,
                                         is_pure=False, pack=1)

    @gluon.jit
    def _turns(it, kt, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
               SCHEDULE: gl.constexpr, asc):
        """(query tile, turn, key tiles adding into it) of key tile kt's step `it`. SCHEDULE 0 (the
        programs of all sequences interleaved): step it is tile it, turns in key tile order. SCHEDULE 1
        (a sequence's key tiles run together): causal, turns from the last key tile seeing the tile to
        the first (the order the programs reach it in: key tile kt starts at its diagonal); not causal,
        key tile kt starts at tile kt BLOCK_N / BLOCK_M and wraps round, and the turns follow (the
        step it, in units of BLOCK_N / BLOCK_M): programs in step never wait. SCHEDULE 2 (causal only):
        SCHEDULE 1's turns."""
        R: gl.constexpr = BLOCK_N // BLOCK_M
        n_kt = N // BLOCK_N
        if IS_CAUSAL:
            n_add = (it * BLOCK_M + BLOCK_M - 1) // BLOCK_N + 1  # key tiles 0 .. n_add - 1 see query tile it
            turn = kt
            if SCHEDULE >= 1:  # asc (a tail's sequence, _tail_tile): schedule 0's
                turn = kt + (1 - asc) * (n_add - 1 - 2 * kt)
            return it, turn, n_add
        if SCHEDULE == 1:
            return (it + kt * R) % (N // BLOCK_M), it // R, n_kt
        return it, kt, n_kt

    @gluon.jit
    def _bulk_wait(x):
        """cp.async.bulk.wait_group 0: this thread's bulk copies and reductions complete, their
        writes performed (not only their reads of shared memory, which is all .read waits for)."""
        return gl.inline_asm_elementwise("cp.async.bulk.wait_group 0; mov.u32 $0, $1;", "=r,r", [x],
                                         dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _fused_writer(dq_smem, fbars, acc_desc, SEM, N, H, H_KV, GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, PROBE: gl.constexpr, SCHEDULE: gl.constexpr,
                      bkv, jt, PERSISTENT: gl.constexpr, tk, asc):
        """Each step's dQ share (the warpgroups' two halves, each in two [64, 32] fp32 pieces in dq_smem)
        added to its query tile's sum (dQacc, tile-major: (B*H, N / BLOCK_M, 4, 64, 32)) in the order of
        the turns (`_turns`), by TMA from shared memory: the first in turn stores it, a later one waits
        for its turn (SEM[bh, tile] == turn) and adds it in L2 (a TMA reduce); each but the last then
        passes the turn on once its writes are performed. `_cast_kernel` writes dQ from the sums after.
        PROBE (timing only, wrong results): 1 skips the turns, 2 writes nothing; 3 also (the consumers)
        skips the warpgroups' wait for each other's dS, 4 also the dQ product and its store into shared
        memory, 5 the store alone, 6 the store and dS's."""
        n_qt = N // BLOCK_M
        if PERSISTENT:  # bkv: the count of (batch, K/V head) pairs; the tiles from the producer's tickets
            c = 0
            part = 0
            ticket = _read_ticket(tk, part)
            while ticket < bkv * (N // BLOCK_N):
                t_bkv = ticket % bkv
                kt = ticket // bkv
                first = 0
                if IS_CAUSAL:
                    first = kt * BLOCK_N // BLOCK_M
                b = t_bkv // H_KV
                hk = t_bkv % H_KV
                for g in range(GROUP):
                    for it in range(first, n_qt):
                        _write_share(dq_smem, fbars, acc_desc, SEM, c, b * H + hk * GROUP + g, it, kt, N, BLOCK_M,
                                     BLOCK_N, IS_CAUSAL, PROBE, SCHEDULE, asc)
                        c += 1
                part += 1
                ticket = _read_ticket(tk, part)
        else:
            b = bkv // H_KV
            hk = bkv % H_KV
            c = 0
            for part in range(_n_parts(jt, N, BLOCK_N, SCHEDULE)):
                kt = _part_kt(jt, part, N, BLOCK_N, SCHEDULE)
                first = 0
                if IS_CAUSAL:
                    first = kt * BLOCK_N // BLOCK_M
                if SCHEDULE == 2:  # the group's heads inner, as the consumers take them
                    for it in range(first, n_qt):
                        for g in range(GROUP):
                            _write_share(dq_smem, fbars, acc_desc, SEM, c, b * H + hk * GROUP + g, it, kt, N, BLOCK_M,
                                         BLOCK_N, IS_CAUSAL, PROBE, SCHEDULE, asc)
                            c += 1
                else:
                    for g in range(GROUP):
                        for it in range(first, n_qt):
                            _write_share(dq_smem, fbars, acc_desc, SEM, c, b * H + hk * GROUP + g, it, kt, N, BLOCK_M,
                                         BLOCK_N, IS_CAUSAL, PROBE, SCHEDULE, asc)
                            c += 1
        _bulk_wait(c)  # the last shares' writes performed before the program ends (_cast_kernel reads them)

    @gluon.jit
    def _write_share(dq_smem, fbars, acc_desc, SEM, c, bh, it, kt, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     IS_CAUSAL: gl.constexpr, PROBE: gl.constexpr, SCHEDULE: gl.constexpr, asc):
        """The writer's step c: key tile kt's share at its step `it` of query head bh, in its turn."""
        ds_ready, ds_free, dq_ready, dq_empty = fbars
        NP: gl.constexpr = 4  # pieces a share (PIECE columns each)
        n_qt = N // BLOCK_M
        # this step's query tile (tq), this key tile's turn there and how many key tiles add into it (_turns)
        tq, turn, n_add = _turns(it, kt, N, BLOCK_M, BLOCK_N, IS_CAUSAL, SCHEDULE, asc)
        buf = c % 2
        sem = SEM + bh * n_qt + tq
        row = (bh * n_qt + tq) * (NP * 64)  # the tile's first row in dQacc's 2-D view
        mbarrier.wait(dq_ready.index(buf), (c // 2) & 1)
        if PROBE < 2:
            if turn > 0 and PROBE == 0:  # this key tile's turn at this query tile
                while gl.atomic_add(sem, 0, sem="acquire") != turn:
                    pass
                _proxy_fence(turn)  # the sum's writes, seen by the acquire, before the TMA
            for j in gl.static_range(NP):
                if turn == 0:
                    tma_store(acc_desc, [row + j * 64, 0], dq_smem.index(buf * NP + j))
                else:
                    _tma_reduce_add(acc_desc, [row + j * 64, 0], dq_smem.index(buf * NP + j))
            tma.store_wait(0)  # dq_smem read: the consumers may refill it
        mbarrier.arrive(dq_empty.index(buf), count=1)  # after a barrier of the partition's warps
        if turn != n_add - 1 and PROBE == 0:  # the writes above performed before this release
            _bulk_wait(turn)
            _proxy_fence(turn)
            gl.atomic_add(sem, 1, sem="release")

    @gluon.jit
    def _fused_producer(q_desc, do_desc, k_desc, v_desc, l_desc, dl_desc, q_smem, do_smem, k_smem, v_smem, l_smem,
                        dl_smem, bars, N, H, H_KV, QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH, GROUP: gl.constexpr,
                        IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, qb_desc, dob_desc, kb_desc, vb_desc, qb_smem, dob_smem, kb_smem,
                        vb_smem, DA: gl.constexpr, DB: gl.constexpr, bkv, jt, kv_empty, SCHEDULE: gl.constexpr,
                        PERSISTENT: gl.constexpr, tk):
        """The loads: the dK/dV kernel's producer for one key tile (SCHEDULE 0, 1); SCHEDULE 2, program
        jt's two key tiles (_part_kt) one after the other, the second's K and V once the consumers have
        read the first's (kv_empty), the group's heads inner at each query tile; PERSISTENT, the tiles
        of the tickets it takes (schedule 0's order), each in the dK/dV producer's order."""
        if PERSISTENT:  # bkv: the count of (batch, K/V head) pairs
            R: gl.constexpr = BLOCK_N // BLOCK_M
            n_qt = N // BLOCK_M
            c = 0
            part = 0
            ticket = _take_ticket(tk, part)
            while ticket < bkv * (N // BLOCK_N):
                t_bkv = ticket % bkv
                kt = ticket // bkv
                b = t_bkv // H_KV
                hk = t_bkv % H_KV
                if part > 0:
                    mbarrier.wait(kv_empty, (part - 1) & 1)
                gb.load_kv(k_desc, v_desc, kb_desc, vb_desc, k_smem, v_smem, kb_smem, vb_smem, bars[0],
                           b * KRB + hk * KRH + kt * BLOCK_N, hk * KCH, BLOCK_N // 2, DA, DB)
                # the next tile's ticket now: a program holds it while it works on this one, which is safe
                # as every tile waits only for tiles of earlier tickets (schedule 0)
                next_ticket = _take_ticket(tk, part + 1)
                first = 0
                if IS_CAUSAL:
                    first = kt * R
                for g in range(GROUP):
                    h = hk * GROUP + g
                    for it in range(first, n_qt):
                        gb.load_qdo(q_desc, do_desc, l_desc, dl_desc, q_smem, do_smem, l_smem, dl_smem, bars,
                                    qb_desc, dob_desc, qb_smem, dob_smem, c, b, h, b * H + h, it * BLOCK_M, QRB,
                                    QRH, QCH, DRB, DRH, DCH, STAGES, DA, DB)
                        c += 1
                ticket = next_ticket
                part += 1
        elif SCHEDULE == 2:
            b = bkv // H_KV
            hk = bkv % H_KV
            c = 0
            for part in range(_n_parts(jt, N, BLOCK_N, SCHEDULE)):
                kt = _part_kt(jt, part, N, BLOCK_N, SCHEDULE)
                if part > 0:
                    mbarrier.wait(kv_empty, (part - 1) & 1)
                gb.load_kv(k_desc, v_desc, kb_desc, vb_desc, k_smem, v_smem, kb_smem, vb_smem, bars[0],
                           b * KRB + hk * KRH + kt * BLOCK_N, hk * KCH, BLOCK_N // 2, DA, DB)
                for it in range(kt * BLOCK_N // BLOCK_M, N // BLOCK_M):
                    for g in range(GROUP):
                        h = hk * GROUP + g
                        gb.load_qdo(q_desc, do_desc, l_desc, dl_desc, q_smem, do_smem, l_smem, dl_smem, bars,
                                    qb_desc, dob_desc, qb_smem, dob_smem, c, b, h, b * H + h, it * BLOCK_M, QRB,
                                    QRH, QCH, DRB, DRH, DCH, STAGES, DA, DB)
                        c += 1
        else:
            gb.dkdv_producer(q_desc, do_desc, k_desc, v_desc, l_desc, dl_desc, q_smem, do_smem, k_smem, v_smem,
                             l_smem, dl_smem, bars, N, H, H_KV, QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH, GROUP,
                             IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, qb_desc, dob_desc, kb_desc, vb_desc, qb_smem,
                             dob_smem, kb_smem, vb_smem, DA, DB, False, bkv, jt, SCHEDULE == 1 and not IS_CAUSAL)

    @gluon.jit
    def _fused_kernel(q_desc, do_desc, k_desc, v_desc, l_desc, dl_desc, acc_desc, DK, DV, SEM, N, H, H_KV, N_BKV,
                      QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH,
                      stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                      QK_SCALE: gl.constexpr, SM_SCALE: gl.constexpr, GROUP: gl.constexpr,
                      IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      D: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                      WRITER_REGS: gl.constexpr, WRITER_WARPS: gl.constexpr, PROBE: gl.constexpr, SCHEDULE: gl.constexpr,
                      PERSISTENT: gl.constexpr, num_warps: gl.constexpr, qb_desc, dob_desc, kb_desc, vb_desc,
                      DB: gl.constexpr, PEEL: gl.constexpr, DEFER: gl.constexpr, TRIM: gl.constexpr, TAIL,
                      TAILED: gl.constexpr):
        gl.static_assert(num_warps == 4, "the default partition: a consumer warpgroup, or the writer's four warps")
        gl.static_assert(D - DB == 64 or (D == 128 and DB == 0), "dQ halves of 64 columns")
        gl.static_assert(WRITER_WARPS != 4 or CONSUMER_REGS <= 232, "two worker consumers: 232 registers at most")
        HALF: gl.constexpr = BLOCK_N // 2
        DA: gl.constexpr = D - DB
        dtype: gl.constexpr = q_desc.dtype
        gl.static_assert(SCHEDULE != 2 or IS_CAUSAL, "schedule 2 (pairs of key tiles) is causal only")
        # the ticket: programs take their key tiles (jt: one, or a pair under SCHEDULE 2, _part_kt) in
        # the order they start, heads fastest
        n_jt = N // BLOCK_N
        asc = 0  # TAILED: this program's turns in key tile order
        if SCHEDULE == 2:
            n_jt = (n_jt + 1) // 2
        gl.static_assert(SCHEDULE == 0 or not PERSISTENT, "persistent: schedule 0")
        if PERSISTENT:  # the producer takes the tickets and hands them on (_take_ticket)
            bkv = N_BKV
            jt = gl.program_id(0)
        else:
            n_bkv = gl.num_programs(0) // n_jt
            ticket = gl.atomic_add(SEM + n_bkv * GROUP * (N // BLOCK_M), 1)
            if TAILED:  # schedule 1, its last TAIL sequences key tile by key tile, turns ascending
                bkv, jt, asc = _tail_tile(ticket, n_bkv, n_jt, TAIL)
            elif SCHEDULE >= 1:  # a sequence's key tiles together (_turns)
                bkv = ticket // n_jt
                jt = ticket % n_jt
            else:
                bkv = ticket % n_bkv
                jt = ticket // n_bkv
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, DA], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, DA], do_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [2, HALF, DA], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2, HALF, DA], v_desc.layout)
        if DB > 0:
            qb_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, DB], qb_desc.layout)
            dob_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, DB], dob_desc.layout)
            kb_smem = gl.allocate_shared_memory(dtype, [2, HALF, DB], kb_desc.layout)
            vb_smem = gl.allocate_shared_memory(dtype, [2, HALF, DB], vb_desc.layout)
        else:
            qb_smem = q_smem
            dob_smem = do_smem
            kb_smem = k_smem
            vb_smem = v_smem
        l_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], l_desc.layout)
        dl_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], dl_desc.layout)
        # dS ([BLOCK_M, HALF] a warpgroup), the dQ shares (two [64, 32] fp32 pieces a warpgroup, two buffers)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HALF], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HALF], ds_layout)
        dq_smem = gl.allocate_shared_memory(gl.float32, [8, 64, 32], acc_desc.layout)  # TMA's source: 2 steps' shares
        kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        qdo_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        dq_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_ready, count=1)
        if SCHEDULE == 2 or PERSISTENT:
            mbarrier.init(kv_empty, count=2)
        for i in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(qdo_empty.index(i), count=2)
        mbarrier.init(ds_ready, count=2)
        mbarrier.init(ds_free, count=2)
        for i in gl.static_range(2):
            mbarrier.init(dq_ready.index(i), count=2)
            mbarrier.init(dq_empty.index(i), count=1)
        bars = (kv_ready, q_ready, do_ready, qdo_empty)
        fbars = (ds_ready, ds_free, dq_ready, dq_empty)
        if PERSISTENT:  # the ticket counter, this program's two slots of tickets in SEM after it, their barriers
            tick_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            tick_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(2):
                mbarrier.init(tick_ready.index(i), count=1)
                mbarrier.init(tick_free.index(i), count=3)  # both consumers and the writer
            slot = SEM + N_BKV * GROUP * (N // BLOCK_M)
            tk = (slot, slot + 1 + 2 * gl.program_id(0), tick_ready, tick_free)
        else:
            tk = (SEM, SEM, kv_ready, kv_ready)  # not read
        # the consumers, producer and writer: the first in the list is the partition the kernel starts in
        # (the argument tuples written out: Gluon keeps their constexprs only as literals)
        if WRITER_WARPS == 4:  # the writer first: both consumers workers (fewer spills)
            gl.warp_specialize([
                (_fused_writer, (dq_smem, fbars, acc_desc, SEM, N, H, H_KV, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, PROBE,
                                 SCHEDULE, bkv, jt, PERSISTENT, tk, asc)),
                (_fused_consumer, (q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars, DK,
                                   DV, N, H_KV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                   QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, D, STAGES, 0, qb_smem,
                                   dob_smem, kb_smem, vb_smem, DB, bkv, jt, kv_empty, PROBE, SCHEDULE,
                                   PERSISTENT, PEEL, tk, DEFER, TRIM)),
                (_fused_consumer, (q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars, DK,
                                   DV, N, H_KV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                   QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, D, STAGES, 1, qb_smem,
                                   dob_smem, kb_smem, vb_smem, DB, bkv, jt, kv_empty, PROBE, SCHEDULE,
                                   PERSISTENT, PEEL, tk, DEFER, TRIM)),
                (_fused_producer, (q_desc, do_desc, k_desc, v_desc, l_desc, dl_desc, q_smem, do_smem, k_smem, v_smem,
                                   l_smem, dl_smem, bars, N, H, H_KV, QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH,
                                   GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, qb_desc, dob_desc, kb_desc, vb_desc,
                                   qb_smem, dob_smem, kb_smem, vb_smem, D - DB, DB, bkv, jt, kv_empty, SCHEDULE,
                                   PERSISTENT, tk)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([
                (_fused_consumer, (q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars, DK,
                                   DV, N, H_KV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                   QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, D, STAGES, 0, qb_smem,
                                   dob_smem, kb_smem, vb_smem, DB, bkv, jt, kv_empty, PROBE, SCHEDULE,
                                   PERSISTENT, PEEL, tk, DEFER, TRIM)),
                (_fused_consumer, (q_smem, do_smem, k_smem, v_smem, l_smem, dl_smem, ds_smem, dq_smem, bars, fbars, DK,
                                   DV, N, H_KV, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                   QK_SCALE, SM_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, D, STAGES, 1, qb_smem,
                                   dob_smem, kb_smem, vb_smem, DB, bkv, jt, kv_empty, PROBE, SCHEDULE,
                                   PERSISTENT, PEEL, tk, DEFER, TRIM)),
                (_fused_producer, (q_desc, do_desc, k_desc, v_desc, l_desc, dl_desc, q_smem, do_smem, k_smem, v_smem,
                                   l_smem, dl_smem, bars, N, H, H_KV, QRB, QRH, QCH, DRB, DRH, DCH, KRB, KRH, KCH,
                                   GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, qb_desc, dob_desc, kb_desc, vb_desc,
                                   qb_smem, dob_smem, kb_smem, vb_smem, D - DB, DB, bkv, jt, kv_empty, SCHEDULE,
                                   PERSISTENT, tk)),
                (_fused_writer, (dq_smem, fbars, acc_desc, SEM, N, H, H_KV, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, PROBE,
                                 SCHEDULE, bkv, jt, PERSISTENT, tk, asc)),
            ], [4, 1, WRITER_WARPS], [CONSUMER_REGS, 24, WRITER_REGS])


def _acc_desc(dqacc: torch.Tensor):
    """A TMA descriptor over dQacc (fp32, tile-major: (B*H, N / BLOCK_M, 4, 64, 32), each query tile's
    share the warpgroups' two halves, each in two [64, 32] pieces) as rows of 32, in [64, 32] tiles,
    128-byte swizzled (the shares' layout in shared memory)."""
    rows = dqacc.numel() // PIECE
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    return gb.TensorDescriptor(dqacc.view(rows, PIECE), [rows, PIECE], [PIECE, 1], [64, PIECE], layout)


def default_schedule(q, k, is_causal: bool) -> int:
    """The launcher's schedule (_turns' SCHEDULE) for (B, H, N, D) inputs: that of the class of "auto"
    the call is in (flash_attention_gluon_bwd.fused_class); else 1 (a sequence's key tiles together) at
    head dim 128 without grouped-query where a sequence's key tiles fit on the GPU at once, measured
    faster than 0 there (H200, tuning/flash_attention/NOTES.md step 48); else 0. Schedule 2 (pairs of
    key tiles) is right but taken only when asked for: where it beats 0 (grouped-query) the fused
    kernel is still slower than the two-kernel backward (step 56)."""
    schedule = gb.fused_class(q, k, is_causal)
    if schedule is not None:
        return schedule
    n, d = q.shape[-2:]
    return int(d == 128 and k.shape[1] == q.shape[1] and n // BLOCK_N <= fg.sm_count(q.device))


def defers(d: int, is_causal: bool, peel: bool, persistent: bool, schedule: int, grouped: bool,
           asked: bool | None = None) -> bool:
    """Whether the kernel stores each step's dQ share in the next step (launch's `defer`): asked (True
    or False), else at DEFER_DIMS without grouped-query, where a key tile's first steps are out of its
    step loop (causal, or peeled) and the program takes its key tiles one after another (neither
    persistent nor schedule 2's pairs). Asked where it cannot be, a ValueError."""
    deferrable = (is_causal or peel) and not persistent and schedule != 2
    if asked and not deferrable:
        raise ValueError("the fused backward defers its dQ shares only where a key tile's first steps are out of "
                         "its step loop (causal, or peel=True) and not persistent or under schedule 2")
    if asked is not None:
        return asked
    return d in DEFER_DIMS and deferrable and not grouped


def tails(d: int, is_causal: bool, schedule: int, persistent: bool, n_bkv: int, n_kt: int, sms: int,
          asked: int | None = None) -> int:
    """Sequences in schedule 1's tail (launch's `tail`; 0: none): asked, else causal at schedule 1 at
    TAIL_DIMS, TAIL_FILL x sms / n_kt sequences, at most a quarter of the n_bkv. Asked where a tail cannot
    be (not causal, another schedule, persistent) or outside 0 to n_bkv, a ValueError."""
    if asked is None:
        if d not in TAIL_DIMS or not is_causal or schedule != 1 or persistent:
            return 0
        return min(TAIL_FILL * sms // n_kt, n_bkv // 4)
    if asked == 0:
        return 0
    if not is_causal or schedule != 1 or persistent:
        raise ValueError("the fused backward takes a tail of sequences key tile by key tile only causal at "
                         "schedule 1, not persistent")
    if not 0 < asked <= n_bkv:
        raise ValueError(f"a tail of {asked} sequences of {n_bkv}")
    return int(asked)


def launch(q, k, v, out, do, lse, dq, dk, dv, is_causal: bool, stages: int | None = None,
           consumer_regs: int | None = None, writer_regs: int | None = None, writer_warps: int | None = None,
           compile_only: bool = False, probe: int = 0, schedule: int | None = None, persistent: bool | None = None,
           programs: int | None = None, peel: bool | None = None, defer: bool | None = None,
           whole: bool | None = None, trim: bool | None = None, tail: int | None = None):
    """dQ, dK, dV into dq, dk, dv ((B, H, N, D) and (B, H_kv, N, D) views, unit stride along D) for
    q, k, v that `unsupported` accepts, from the forward's O (out) and L (lse, (B*H, N) fp32) and dO.
    Returns the compiled fused kernel; compile_only: compile the three kernels for the active
    driver's target and launch nothing. probe (timing only): the kernel's PROBE. schedule: _turns'
    SCHEDULE (None: default_schedule's); 1 and 2 need a sequence's programs to fit on the GPU at once
    (one program an SM: then the sequence whose programs started first can always finish, so no
    program waits for ever); 2 (causal only) gives each program a pair of key tiles, n_kt - 1 - j
    then j, the group's heads inner at each query tile, so that programs are of one length. persistent
    (None: the head dim in PERSISTENT_DIMS, at schedule 0): a program an SM (or `programs`, tests:
    fewer, so that small inputs give a program several tiles) taking key tiles by ticket, schedule 0
    only (_take_ticket). peel (None: the head dim in PEEL_DIMS): a non-causal call's first steps of a
    key tile out of its step loop (the causal kernel's always are). defer (None: the head dim in
    DEFER_DIMS, without grouped-query, where the call can take it): each step's dQ share stored by the
    next step (causal, or peeled; not persistent, not schedule 2). whole (None: causal at WHOLE_DIMS): a
    head loaded as one tile, not two column slices. trim (None: causal at TRIM_DIMS): a key tile's
    first step without the products of its all-masked warpgroup (causal at BLOCK_M = 64 only). tail
    (causal at schedule 1 only; None: `tails`' rule): the last `tail` sequences taken key tile by key tile,
    their turns in key tile order (`_tail_tile`)."""
    if schedule == 2 and not is_causal:
        raise ValueError("the fused backward's schedule 2 (pairs of key tiles) is causal only")
    q4, k4, v4, o4, do4, dq4, dk4, dv4 = (fg.heads(t) for t in (q, k, v, out, do, dq, dk, dv))
    if fg.head_rows(do4) is None or do4.data_ptr() % 16:
        do4 = do4.contiguous()
    if o4.stride(-1) != 1:
        o4 = o4.contiguous()
    nb, nh, n, d = q4.shape
    h_kv = k4.shape[1]
    if schedule is None:
        schedule = 1 if compile_only else default_schedule(q4, k4, is_causal)
    n_kt = n // BLOCK_N
    grid = (nb * h_kv * ((n_kt + 1) // 2 if schedule == 2 else n_kt),)
    if persistent is None:
        persistent = d in PERSISTENT_DIMS and schedule == 0
    if persistent:
        if schedule != 0:
            raise ValueError(f"the persistent fused backward takes schedule 0 only (there a tile waits only for "
                             f"tiles of earlier tickets), not {schedule}")
        grid = (min(grid[0], programs or (H100_SMS if compile_only else fg.sm_count(q4.device))),)
    peel = d in PEEL_DIMS if peel is None else peel
    tail = tails(d, is_causal, schedule, bool(persistent), nb * h_kv, n_kt,
                 H100_SMS if compile_only else fg.sm_count(q4.device), tail)
    defer = defers(d, is_causal, peel, persistent, schedule, h_kv != nh, defer)
    st, regs, bm, wregs, wwarps = CONFIGS[d]
    stages, consumer_regs, writer_regs = stages or st, consumer_regs or regs, writer_regs or wregs
    writer_warps = writer_warps or wwarps
    whole = (d in WHOLE_DIMS and bool(is_causal)) if whole is None else whole
    da, db = split(d, whole)
    trim = (d in TRIM_DIMS and bool(is_causal)) if trim is None else trim
    dev = q4.device
    lse2 = lse.reshape(nb * nh, n)
    lse2 = lse2 if lse2.is_contiguous() and lse2.data_ptr() % 16 == 0 else lse2.contiguous()
    # scratch, written before it is read: Delta, the turn counters and the ticket (zeroed by the
    # delta kernel), dQ's fp32 sums (the first key tile of a query tile stores, not adds)
    delta = kernel_launch.scratch(torch.empty((nb * nh, n), dtype=torch.float32, device=dev))
    # (+ two slots of tickets a program when persistent)
    sem = kernel_launch.scratch(torch.empty(nb * nh * (n // bm) + 1 + 2 * grid[0] * bool(persistent), dtype=torch.int32,
                                            device=dev))
    dqacc = kernel_launch.scratch(torch.empty((nb * nh, n // bm, 128 // PIECE, 64, PIECE), dtype=torch.float32,
                                              device=dev))
    q_desc, (qrb, qrh, qch) = fg.head_desc(q4, bm, da)
    do_desc, (drb, drh, dch) = fg.head_desc(do4, bm, da)
    k_desc, (krb, krh, kch) = fg.head_desc(k4, BLOCK_N // 2, da)
    v_desc, _ = fg.head_desc(v4, BLOCK_N // 2, da)
    tile_grid = (nb * nh, n // bm)  # a program a query tile (the delta and cast kernels)
    grid_kw = (lambda g: dict(grid=g)) if compile_only else (lambda g: {})
    pre = _delta_kernel.warmup if compile_only else kernel_launch.plain_launch(_delta_kernel)[tile_grid]
    pre(o4, do4, delta, sem, n, nh, o4.stride(0), o4.stride(1), o4.stride(2), do4.stride(0), do4.stride(1),
        do4.stride(2), D=d, ROWS=bm, num_warps=4, **grid_kw(tile_grid))
    kernel = _fused_kernel.warmup if compile_only else kernel_launch.plain_launch(_fused_kernel)[grid]
    fused = kernel(
        q_desc, do_desc, k_desc, v_desc, gb.row_desc(lse2, bm), gb.row_desc(delta, bm), _acc_desc(dqacc),
        dk4, dv4, sem, n, nh, h_kv, nb * h_kv, qrb, qrh, qch, drb, drh, dch, krb, krh, kch,
        dk4.stride(0), dk4.stride(1), dk4.stride(2), dv4.stride(0), dv4.stride(1), dv4.stride(2),
        QK_SCALE=gb.LOG2E / math.sqrt(d), SM_SCALE=1.0 / math.sqrt(d), GROUP=nh // h_kv, IS_CAUSAL=bool(is_causal),
        BLOCK_M=bm, BLOCK_N=BLOCK_N, D=d, STAGES=stages, CONSUMER_REGS=consumer_regs, WRITER_REGS=writer_regs,
        WRITER_WARPS=writer_warps, PROBE=probe, SCHEDULE=schedule, PERSISTENT=bool(persistent), num_warps=4,
        qb_desc=q_desc, dob_desc=do_desc, kb_desc=k_desc, vb_desc=v_desc, DB=db,
        PEEL=bool(peel), DEFER=bool(defer), TRIM=bool(trim), TAIL=tail, TAILED=tail > 0, **grid_kw(grid))
    post = _cast_kernel.warmup if compile_only else kernel_launch.plain_launch(_cast_kernel)[tile_grid]
    post(dqacc, dq4, nh, dq4.stride(0), dq4.stride(1), dq4.stride(2), SM_SCALE=1.0 / math.sqrt(d), BLOCK_M=bm,
         DB=64 if d == 128 else 0, W=PIECE, num_warps=4, **grid_kw(tile_grid))
    return fused


@opaque_op("lmperf::flash_attention_bwd_gluon_fused", ("dq", "dk", "dv"), lambda *args: None)
def flash_attention_bwd_gluon_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                                    do: torch.Tensor, lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor,
                                    dv: torch.Tensor, is_causal: bool) -> None:
    """dQ, dK, dV into dq, dk, dv, as a PyTorch op opaque to torch.compile (a compiled backward launches
    the same kernels as eager mode: the same bits). With plans on (LMPERF_FA_LAUNCH=plan), a call's
    three launches are replayed from the plan of its signature, as in eager mode: its descriptors
    are not built again, nor their tensor maps made while their data's address is one seen lately."""
    inputs = (q, k, v, out, do, lse, dq, dk, dv)
    kernel_launch.launch_in_place(("gluon fused", is_causal), inputs, lambda: launch(*inputs, is_causal))
