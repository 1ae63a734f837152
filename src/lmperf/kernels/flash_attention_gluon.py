"""FlashAttention forward for Hopper GPUs (H100, H200) written in Gluon, Triton's lower-level
frontend (`triton.experimental.gluon`): explicit layouts and shared memory, TMA loads completing
on mbarriers, asynchronous warpgroup matrix multiplies (wgmma).

It computes what flash_attention_triton's forward computes, in the same layouts: O (B, N, H, D)
in memory like SDPA's flash and cuDNN backends, L = the fp32 logsumexp in natural log, (B*H, N);
so the tile-language backward runs on its output unchanged. Covered: CUDA tensors on a GPU of
compute capability 9.x, bf16 or fp16, head dims 64 and 128 (and 80 in the ping-pong kernel, as two
column slices of 64 and 16: Gluon's tiles are powers of two), k/v heads dividing q's (grouped-query
attention), q/k/v read in place where each head is a dense run of rows (B, H, N, D) contiguous,
or the (B, N, H, D) memory of a transposed projection); `unsupported(...)` says why anything
else is refused, and the dispatch in flash_attention_triton then keeps the tile-language kernel.
One file (about 800 lines) on purpose: the three kernels share their pieces (tile order, softmax
steps, epilogue), a config is only valid for the kernel beside it, and the dispatch rule is the
measurement of these kernels.

Three kernels, one algorithm:
- `_fwd_kernel` ("plain"): one program per (query tile, sequence), all warps computing. K/V tiles stream
  through a ring of STAGES shared-memory buffers loaded by TMA; QK^T and PV are asynchronous
  wgmma. The schedule is FlashAttention-3's intra-warpgroup overlap: QK^T of tile j is issued
  before PV of tile j-1, and the softmax of tile j runs while PV of tile j-1 is in the tensor
  cores.
- `_fwd_ws_kernel` ("ws"): persistent and warp-specialised: a one-warp producer partition issues
  the TMA loads of Q and the K/V ring (empty/ready mbarrier pairs), the default partition's
  warpgroups compute with the same overlap.
- `_fwd_pp_kernel` ("pp", the one the dispatch runs): ws with FlashAttention-3's ping-pong: two
  consumer warpgroups, each 64 rows of a 128-row query tile, take turns at the tensor cores
  (a pair of mbarriers), so one's softmax runs while the other's QK^T and PV are computed.
Persistent programs walk tiles tile-fastest within a head (the head's K/V stay in L2); causal
tiles longest first, every odd round of the programs walked backwards (each program's sum of
tile lengths about equal), at head dim 64 heads fastest within groups of 16 sequences (a snake).

The dispatch (`use_gluon`, called by flash_attention_triton.FlashAttention2Triton): the
environment variable LMPERF_FA_BACKEND=gluon forces this forward (a ValueError saying why where
it cannot run the call), =triton the tile-language one; unset or "auto", this one runs only
where it was measured faster on the H100 (`prefers_gluon`). Under torch.compile it is the opaque
op `lmperf::flash_attention_forward_gluon`, so compiled and eager calls run the same kernel.

Key tiles are visited last to first, so the only tile that needs a mask (the causal diagonal, or
the ragged end of a non-causal sequence) is the first one; every later tile runs unmasked.
Causal tiles are square (BLOCK_M == BLOCK_N), so the diagonal is one tile.

TMA reads of the tiles that run past a sequence's end read the next sequence's rows (or zeros
past the tensor): those query rows are never stored, those keys are masked to -inf, and those
values are weighted by exactly 0; so with a ragged N (not a multiple of 128) q, k and v must
hold finite numbers (inf or NaN in one sequence could reach a neighbour's output as 0 * inf).
"auto" picks this forward only where N is a multiple of 128, where no tile runs past a
sequence's end.
"""
from __future__ import annotations

import functools
import math
import os

import torch

from lmperf.kernels import launch as kernel_launch
from lmperf.kernels.triton_op import opaque_op

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

try:  # Triton >= 3.5 on CUDA; absent or broken elsewhere: the Gluon path is then unavailable
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    IMPORT_ERROR = None
except Exception as exc:  # noqa: BLE001 - any failure means: no Gluon here
    gluon = None
    IMPORT_ERROR = f"{type(exc).__name__}: {exc}"

HEAD_DIMS = (64, 80, 128)  # 80: the ping-pong variant only, in two column slices (64 + 16)
DTYPES = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# What the Gluon path covers


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device | None = None) -> str | None:
    """None where the Gluon kernels can run on `device` (None: this process's current CUDA device),
    else why not: first what this process lacks, then a device that is not a CUDA one (named without
    asking torch for a CUDA device: a CPU call's dispatch asks for none)."""
    if IMPORT_ERROR is not None:
        return f"Gluon is not importable from this Triton ({IMPORT_ERROR})"
    if _interpreting():
        return "Gluon does not run in the Triton interpreter (TRITON_INTERPRET=1)"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU of compute capability 9.x (Hopper); none is visible"
    if device is not None and device.type != "cuda":
        return f"needs CUDA tensors; got {device.type}"
    major = _major(device.index if device is not None and device.index is not None else torch.cuda.current_device())
    if major != 9:
        return f"needs a Hopper GPU (compute capability 9.x); this one is {major}.x"
    return None


@functools.cache
def _major(device: int) -> int:
    """A CUDA device's compute capability major (read once a device: every call asks)."""
    return torch.cuda.get_device_capability(device)[0]


def heads(t: torch.Tensor) -> torch.Tensor:
    """A (B, H, N, D) view of t (..., H, N, D): what the Gluon kernels' descriptors read."""
    if t.dim() == 4:
        return t
    shape = tuple(t.shape)
    shape = (1,) * (4 - len(shape)) + shape if len(shape) < 4 else (math.prod(shape[:-3]), *shape[-3:])
    return t.reshape(shape)


def head_rows(t: torch.Tensor):
    """(row_stride, per-batch row offset, per-head row offset, per-head column offset) of a 2-D
    view [rows, row_stride] of a (B, H, N, D) tensor in which each head's N rows are a dense
    run of rows, or None. Two layouts qualify: (B, H, N, D) contiguous (row = (b*H + h)*N + n,
    column 0) and (B, N, H, D) memory (row = b*N + n, column h*D)."""
    b, h, n, d = t.shape
    sb, sh, sn, sd = t.stride()
    if sd != 1:
        return None
    ok = lambda size, stride, want: size == 1 or stride == want  # noqa: E731
    if ok(n, sn, d) and ok(h, sh, n * d) and ok(b, sb, h * n * d):
        return d, h * n, n, 0  # (B, H, N, D) contiguous
    if ok(h, sh, d) and ok(n, sn, h * d) and ok(b, sb, n * h * d):
        return h * d, n, 0, d  # (B, N, H, D) memory
    return None


def unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> str | None:
    """None where the Gluon forward covers this call, else the reason it does not (the caller
    then uses the tile-language kernel, or raises where Gluon was forced)."""
    if (why := available(q.device)) is not None:
        return why
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"covers bf16 and fp16 inputs of one dtype; got {q.dtype}, {k.dtype}, {v.dtype}"
    d = q.shape[-1]
    if d not in HEAD_DIMS or k.shape[-1] != d or v.shape[-1] != d:
        return f"covers head dims {HEAD_DIMS}; got {d}"
    if q.dim() < 2 or q.shape[-2] < 1:
        return "needs a sequence of at least one row"
    q4, k4, v4 = heads(q), heads(k), heads(v)
    if k4.shape != v4.shape or k4.shape[0] != q4.shape[0] or k4.shape[2] != q4.shape[2] \
            or q4.shape[1] % k4.shape[1] != 0:
        return "q, k, v shapes do not match the contract"
    for name, t in (("q", q4), ("k", k4), ("v", v4)):
        if head_rows(t) is None:
            return (f"{name} is neither (B, H, N, D) contiguous nor a (B, H, N, D) view of (B, N, H, D) "
                    f"memory (strides {tuple(t.stride())})")
        if not torch.compiler.is_compiling() and t.data_ptr() % 16:  # (a trace's tensors have no data)
            return f"{name}'s data is not 16-byte aligned (TMA)"
    if q4.shape[0] * q4.shape[1] * q4.shape[2] >= 2 ** 31:
        return "more than 2^31 query rows"
    return None


# ---------------------------------------------------------------------------------------------
# Configs: (BLOCK_M, BLOCK_N, num_warps, STAGES), by head dim and causality; measured on the H100
# (tuning/flash_attention/NOTES.md, steps 37-)

# Causal persistent schedules (SNAKE): 0 tile-fastest (a sequence's tiles one after another, longest
# first: its K/V stay in L2); 1 the snake: heads fastest in groups of 16 sequences, longest tiles first,
# every odd round of the programs walked backwards; 2 tile-fastest with every odd round walked backwards
# (each program's sum of tile lengths closer to the others'). SNAKE_CAUSAL: None = by head dim, else
# forced (the probe).
SNAKE_CAUSAL = None
SNAKE_BY_HEAD_DIM = {64: 1, 80: 2, 128: 2}  # measured: notes steps 39, 41, 45 and 53
DEFAULT_VARIANT = "pp"  # the variant `forward` (and the dispatch) runs unless asked: the fastest measured
PP_REGS = 232  # registers per thread of the second consumer warpgroup (the producer warp gets 24)

CONFIGS = {
    ("pp", 64, False): (128, 128, 4, 3),
    ("pp", 64, True): (128, 128, 4, 3),  # 3 stages: 432 TFLOP/s against 2 stages' 416 (headline)
    ("pp", 128, False): (128, 128, 4, 3),  # 3 stages (224 KB of shared memory): 598-628 TFLOP/s against
    ("pp", 128, True): (128, 128, 4, 3),   # 2 stages' 532-576 at 4 x 16 x 8,192 non-causal
    ("pp", 80, False): (128, 128, 4, 3),
    ("pp", 80, True): (128, 128, 4, 3),
    ("plain", 64, False): (128, 128, 8, 3),
    ("plain", 64, True): (128, 128, 8, 3),
    ("plain", 128, False): (128, 128, 8, 2),
    ("plain", 128, True): (128, 128, 8, 2),
    ("ws", 64, False): (128, 128, 8, 3),
    ("ws", 64, True): (128, 128, 8, 3),
    ("ws", 128, False): (128, 128, 8, 2),
    ("ws", 128, True): (128, 128, 8, 2),
}


if gluon is not None:

    # TMA copies by the names of the Triton that runs: async_load and async_store where it has them
    # (Triton 3.9: there the names of 3.6, the pinned one, are stubs that raise), else async_copy_*
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

    # -----------------------------------------------------------------------------------------
    # Shared pieces

    @gluon.jit
    def _persistent_tile(i, total, REVERSE: gl.constexpr):
        """The tile a persistent program takes at its step i (= program id + round * programs):
        in order, or, with REVERSE, every odd round that all programs share walked backwards, so
        that with tiles sorted longest first each program's sum of tile lengths is about the
        same (causal: a tile's length is its number of key tiles)."""
        if REVERSE:
            nprog = gl.num_programs(0)
            r = i // nprog
            p = i - r * nprog
            rev = ((r % 2) == 1) & ((r + 1) * nprog <= total)
            i = i + rev.to(gl.int32) * (nprog - 1 - 2 * p)
        return i

    @gluon.jit
    def _tile_coords(t, N, H, GROUP: gl.constexpr, n_qt, QRB, QRH, QCH, KRB, KRH, KCH,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                     HEADS_FASTEST: gl.constexpr = False, total=0, HEAD_GROUP: gl.constexpr = 16):
        """Tile t -> (bh, qt, the query tile's TMA row and column, the K/V sequence's first TMA
        row and column, the number of key tiles). Tile-fastest within a sequence (its K/V stay
        in L2), or with HEADS_FASTEST the same query tile of each of HEAD_GROUP sequences in
        turn, group after group; causal tiles longest first."""
        if HEADS_FASTEST:  # in groups of HEAD_GROUP sequences, so that few sequences' K/V are in flight
            n_bh = total // n_qt
            g = t // (HEAD_GROUP * n_qt)
            r = t - g * (HEAD_GROUP * n_qt)
            in_group = gl.minimum(n_bh - g * HEAD_GROUP, HEAD_GROUP)
            bh = g * HEAD_GROUP + r % in_group
            qt = r // in_group
        else:
            bh = t // n_qt
            qt = t % n_qt
        if IS_CAUSAL:
            qt = n_qt - 1 - qt
        b = bh // H
        h = bh % H
        hk = h // GROUP
        q_row = b * QRB + h * QRH + qt * BLOCK_M
        q_col = h * QCH
        k_row = b * KRB + hk * KRH
        k_col = hk * KCH
        if IS_CAUSAL:
            n_tiles = qt + 1  # square tiles: the diagonal tile is tile qt
        else:
            n_tiles = (N + BLOCK_N - 1) // BLOCK_N
        return bh, qt, q_row, q_col, k_row, k_col, n_tiles

    @gluon.jit
    def _first_tile_softmax(s, row0, n_tiles, N, QK_SCALE: gl.constexpr, BLOCK_M: gl.constexpr,
                            BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, s_layout: gl.constexpr):
        """The first key tile visited (the last one), masked: the diagonal when causal, columns
        >= N otherwise. Every row keeps at least one key, so m is finite from here on."""
        cols = (n_tiles - 1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        if IS_CAUSAL:
            keep = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
        else:
            keep = (gl.expand_dims(rows, 1) * 0 + gl.expand_dims(cols, 0)) < N
        s = gl.where(keep, s, float("-inf"))
        m_i = gl.max(s, 1) * QK_SCALE
        p = gl.exp2(s * QK_SCALE - gl.expand_dims(m_i, 1))
        l_i = gl.sum(p, 1)
        return p, m_i, l_i

    @gluon.jit
    def _softmax_step(s, m_i, l_i, QK_SCALE: gl.constexpr):
        m_new = gl.maximum(m_i, gl.max(s, 1) * QK_SCALE)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * QK_SCALE - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _epilogue(o, m_i, l_i, O, L, bh, row0, N, H, stride_ob, stride_oh, stride_on,
                  BLOCK_M: gl.constexpr, D: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr):
        """O = acc / l (rows < N) into (b, h)'s rows; L = (m + log2 l) ln 2 (natural log)."""
        inv = gl.convert_layout(1.0 / l_i, gl.SliceLayout(1, o_layout))
        o = o * gl.expand_dims(inv, 1)
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
        bh64 = bh.to(gl.int64)
        b = bh64 // H
        h = bh64 % H
        rows_o = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        cols_o = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        rows2 = gl.expand_dims(rows_o, 1) + gl.expand_dims(cols_o, 0) * 0
        ptrs = O + b * stride_ob + h * stride_oh + gl.expand_dims(rows_o.to(gl.int64) * stride_on, 1) \
            + gl.expand_dims(cols_o, 0)
        gl.store(ptrs, o.to(O.dtype.element_ty), mask=rows2 < N)
        rows_l = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        gl.store(L + bh64 * N + rows_l, lse, mask=rows_l < N)

    @gluon.jit
    def _store_cols(o, l_i, O, bh, row0, N, H, stride_ob, stride_oh, stride_on, BLOCK_M: gl.constexpr,
                    COL0: gl.constexpr, DC: gl.constexpr, o_layout: gl.constexpr):
        """O's columns [COL0, COL0 + DC) = acc / l (rows < N): the second slice of a split head dim
        (_epilogue writes the first, and L)."""
        inv = gl.convert_layout(1.0 / l_i, gl.SliceLayout(1, o_layout))
        o = o * gl.expand_dims(inv, 1)
        bh64 = bh.to(gl.int64)
        b = bh64 // H
        h = bh64 % H
        rows_o = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        cols_o = COL0 + gl.arange(0, DC, layout=gl.SliceLayout(0, o_layout))
        rows2 = gl.expand_dims(rows_o, 1) + gl.expand_dims(cols_o, 0) * 0
        ptrs = O + b * stride_ob + h * stride_oh + gl.expand_dims(rows_o.to(gl.int64) * stride_on, 1) \
            + gl.expand_dims(cols_o, 0)
        gl.store(ptrs, o.to(O.dtype.element_ty), mask=rows2 < N)

    # -----------------------------------------------------------------------------------------
    # One program per tile, all warps computing, loads issued ahead by the same warps

    @gluon.jit
    def _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, slot, row, col):
        mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes)
        tma_load(k_desc, [row, col], k_bars.index(slot), k_smem.index(slot))
        mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes)
        tma_load(v_desc, [row, col], v_bars.index(slot), v_smem.index(slot))

    @gluon.jit
    def _fwd_kernel(q_desc, k_desc, v_desc, O, L, N, H, stride_ob, stride_oh, stride_on,
                    QRB, QRH, QCH, KRB, KRH, KCH, QK_SCALE: gl.constexpr, GROUP: gl.constexpr,
                    IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    D: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
        dtype: gl.constexpr = q_desc.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

        n_qt = (N + BLOCK_M - 1) // BLOCK_M
        t = gl.program_id(1) * n_qt + gl.program_id(0)
        bh, qt, q_row, q_col, k_row, k_col, n_tiles = _tile_coords(
            t, N, H, GROUP, n_qt, QRB, QRH, QCH, KRB, KRH, KCH, BLOCK_M, BLOCK_N, IS_CAUSAL)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)

        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma_load(q_desc, [q_row, q_col], q_bar, q_smem)
        for i in gl.static_range(STAGES):  # key tiles visited last to first
            if i < n_tiles:
                _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, i,
                         k_row + (n_tiles - 1 - i) * BLOCK_N, k_col)

        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_bars.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        p, m_i, l_i = _first_tile_softmax(s, qt * BLOCK_M, n_tiles, N, QK_SCALE, BLOCK_M, BLOCK_N, IS_CAUSAL, s_layout)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        o = gl.zeros([BLOCK_M, D], gl.float32, o_layout)

        for i in range(1, n_tiles):
            slot = i % STAGES
            prev = (i - 1) % STAGES
            mbarrier.wait(k_bars.index(slot), (i // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(prev), ((i - 1) // STAGES) & 1)
            o = warpgroup_mma(p_op, v_smem.index(prev), o, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))  # QK^T of tile i done; PV of i-1 runs on
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, QK_SCALE)
            o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
            nxt = i - 1 + STAGES  # buffer `prev` is free: fetch the tile STAGES ahead into it
            if nxt < n_tiles:
                _load_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, prev,
                         k_row + (n_tiles - 1 - nxt) * BLOCK_N, k_col)
            o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)

        last = (n_tiles - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
        o = warpgroup_mma(p_op, v_smem.index(last), o, is_async=True)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))
        _epilogue(o, m_i, l_i, O, L, bh, qt * BLOCK_M, N, H, stride_ob, stride_oh, stride_on, BLOCK_M, D,
                  s_layout, o_layout)

    # -----------------------------------------------------------------------------------------
    # Persistent, warp-specialised: a TMA producer warp, the default partition computing

    @gluon.jit
    def _ws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, N, H, total, n_qt,
                     QRB, QRH, QCH, KRB, KRH, KCH, GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     SNAKE: gl.constexpr):
        q_ready, q_empty, k_ready, v_ready, kv_empty = bars
        c = 0
        tc = 0
        for i_t in range(gl.program_id(0), total, gl.num_programs(0)):
            t = _persistent_tile(i_t, total, SNAKE != 0)
            bh, qt, q_row, q_col, k_row, k_col, n_tiles = _tile_coords(
                t, N, H, GROUP, n_qt, QRB, QRH, QCH, KRB, KRH, KCH, BLOCK_M, BLOCK_N, IS_CAUSAL,
                SNAKE == 1, total)
            mbarrier.wait(q_empty, (tc & 1) ^ 1)
            mbarrier.expect(q_ready, q_desc.block_type.nbytes)
            tma_load(q_desc, [q_row, q_col], q_ready, q_smem)
            for i in range(n_tiles):
                slot = c % STAGES
                mbarrier.wait(kv_empty.index(slot), ((c // STAGES) & 1) ^ 1)
                row = k_row + (n_tiles - 1 - i) * BLOCK_N
                mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
                tma_load(k_desc, [row, k_col], k_ready.index(slot), k_smem.index(slot))
                mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
                tma_load(v_desc, [row, k_col], v_ready.index(slot), v_smem.index(slot))
                c += 1
            tc += 1

    @gluon.jit
    def _ws_consumer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, N, H, total, n_qt,
                     QRB, QRH, QCH, KRB, KRH, KCH, O, L, stride_ob, stride_oh, stride_on,
                     QK_SCALE: gl.constexpr, GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
                     STAGES: gl.constexpr, SNAKE: gl.constexpr, num_warps: gl.constexpr):
        q_ready, q_empty, k_ready, v_ready, kv_empty = bars
        dtype: gl.constexpr = q_desc.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        c = 0
        tc = 0
        for i_t in range(gl.program_id(0), total, gl.num_programs(0)):
            t = _persistent_tile(i_t, total, SNAKE != 0)
            bh, qt, q_row, q_col, k_row, k_col, n_tiles = _tile_coords(
                t, N, H, GROUP, n_qt, QRB, QRH, QCH, KRB, KRH, KCH, BLOCK_M, BLOCK_N, IS_CAUSAL,
                SNAKE == 1, total)
            mbarrier.wait(q_ready, tc & 1)
            slot = c % STAGES
            mbarrier.wait(k_ready.index(slot), (c // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            p, m_i, l_i = _first_tile_softmax(s, qt * BLOCK_M, n_tiles, N, QK_SCALE, BLOCK_M, BLOCK_N, IS_CAUSAL,
                                              s_layout)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            o = gl.zeros([BLOCK_M, D], gl.float32, o_layout)
            for i in range(1, n_tiles):
                cur = c + i
                slot = cur % STAGES
                prev = (cur - 1) % STAGES
                mbarrier.wait(k_ready.index(slot), (cur // STAGES) & 1)
                s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
                mbarrier.wait(v_ready.index(prev), ((cur - 1) // STAGES) & 1)
                o = warpgroup_mma(p_op, v_smem.index(prev), o, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
                p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, QK_SCALE)
                o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
                mbarrier.arrive(kv_empty.index(prev), count=1)
                o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            mbarrier.arrive(q_empty, count=1)  # every QK^T of this tile is done
            cur = c + n_tiles - 1
            last = cur % STAGES
            mbarrier.wait(v_ready.index(last), (cur // STAGES) & 1)
            o = warpgroup_mma(p_op, v_smem.index(last), o, is_async=True)
            o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
            mbarrier.arrive(kv_empty.index(last), count=1)
            _epilogue(o, m_i, l_i, O, L, bh, qt * BLOCK_M, N, H, stride_ob, stride_oh, stride_on, BLOCK_M, D,
                      s_layout, o_layout)
            c += n_tiles
            tc += 1

    @gluon.jit
    def _fwd_ws_kernel(q_desc, k_desc, v_desc, O, L, N, H, total, stride_ob, stride_oh, stride_on,
                       QRB, QRH, QCH, KRB, KRH, KCH, QK_SCALE: gl.constexpr, GROUP: gl.constexpr,
                       IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       D: gl.constexpr, STAGES: gl.constexpr, SNAKE: gl.constexpr,
                       num_warps: gl.constexpr):
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        mbarrier.init(q_empty, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=1)
        bars = (q_ready, q_empty, k_ready, v_ready, kv_empty)
        n_qt = (N + BLOCK_M - 1) // BLOCK_M
        # the argument tuples are written out in the call: a tuple assigned to a name first turns
        # its constexprs into tensors (Triton 3.6)
        gl.warp_specialize([
            (_ws_consumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, N, H, total, n_qt,
                            QRB, QRH, QCH, KRB, KRH, KCH, O, L, stride_ob, stride_oh, stride_on,
                            QK_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, D, STAGES, SNAKE, num_warps)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, N, H, total, n_qt,
                            QRB, QRH, QCH, KRB, KRH, KCH, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, STAGES, SNAKE)),
        ], [1], [24])


    # -----------------------------------------------------------------------------------------
    # Persistent, warp-specialised, ping-pong: a TMA producer warp and two consumer warpgroups,
    # each computing 64 rows of a 128-row query tile from the same K/V buffers, issuing their
    # matrix multiplies in turns (mbarriers turn0/turn1), so that one warpgroup's softmax runs
    # while the other's QK^T and PV are in the tensor cores (FlashAttention-3's ping-pong)

    @gluon.jit
    def _pp_producer(q_desc, k_desc, v_desc, qb_desc, kb_desc, vb_desc, q_smem, k_smem, v_smem, qb_smem,
                     kb_smem, vb_smem, bars, N, H, total, n_qt, QRB, QRH, QCH, KRB, KRH, KCH,
                     GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_N: gl.constexpr, DA: gl.constexpr, DB: gl.constexpr, STAGES: gl.constexpr,
                     SNAKE: gl.constexpr):
        """Loads Q (two 64-row halves) and the K/V ring. DB > 0: a head's columns are two slices,
        [0, DA) through the *_desc descriptors and [DA, DA + DB) through the *b_desc ones (Gluon's
        tiles are powers of two), each slice's tile landing on the same barrier."""
        q_ready, q_empty, k_ready, v_ready, kv_empty, turn0, turn1 = bars
        HALF: gl.constexpr = BLOCK_M // 2
        c = 0
        tc = 0
        for i_t in range(gl.program_id(0), total, gl.num_programs(0)):
            t = _persistent_tile(i_t, total, SNAKE != 0)
            bh, qt, q_row, q_col, k_row, k_col, n_tiles = _tile_coords(
                t, N, H, GROUP, n_qt, QRB, QRH, QCH, KRB, KRH, KCH, BLOCK_M, BLOCK_N, IS_CAUSAL,
                SNAKE == 1, total)
            mbarrier.wait(q_empty, (tc & 1) ^ 1)
            if DB > 0:
                mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes + 2 * qb_desc.block_type.nbytes)
            else:
                mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
            tma_load(q_desc, [q_row, q_col], q_ready, q_smem.index(0))
            tma_load(q_desc, [q_row + HALF, q_col], q_ready, q_smem.index(1))
            if DB > 0:
                tma_load(qb_desc, [q_row, q_col + DA], q_ready, qb_smem.index(0))
                tma_load(qb_desc, [q_row + HALF, q_col + DA], q_ready, qb_smem.index(1))
            for i in range(n_tiles):
                slot = c % STAGES
                mbarrier.wait(kv_empty.index(slot), ((c // STAGES) & 1) ^ 1)
                row = k_row + (n_tiles - 1 - i) * BLOCK_N
                if DB > 0:
                    mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes + kb_desc.block_type.nbytes)
                    tma_load(k_desc, [row, k_col], k_ready.index(slot), k_smem.index(slot))
                    tma_load(kb_desc, [row, k_col + DA], k_ready.index(slot), kb_smem.index(slot))
                    mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes + vb_desc.block_type.nbytes)
                    tma_load(v_desc, [row, k_col], v_ready.index(slot), v_smem.index(slot))
                    tma_load(vb_desc, [row, k_col + DA], v_ready.index(slot), vb_smem.index(slot))
                else:
                    mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
                    tma_load(k_desc, [row, k_col], k_ready.index(slot), k_smem.index(slot))
                    mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
                    tma_load(v_desc, [row, k_col], v_ready.index(slot), v_smem.index(slot))
                c += 1
            tc += 1

    @gluon.jit
    def _pp_turn(bars, r, WG: gl.constexpr):
        """Wait for this warpgroup's turn r at the tensor cores (warpgroup 0 goes first)."""
        q_ready, q_empty, k_ready, v_ready, kv_empty, turn0, turn1 = bars
        if WG == 0:
            mbarrier.wait(turn0, (r & 1) ^ 1)
        else:
            mbarrier.wait(turn1, r & 1)

    @gluon.jit
    def _pp_pass(bars, WG: gl.constexpr):
        """Hand the tensor cores to the other warpgroup."""
        q_ready, q_empty, k_ready, v_ready, kv_empty, turn0, turn1 = bars
        if WG == 0:
            mbarrier.arrive(turn1, count=1)
        else:
            mbarrier.arrive(turn0, count=1)

    @gluon.jit
    def _pp_consumer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, qb_smem, kb_smem, vb_smem, bars, N, H,
                     total, n_qt, QRB, QRH, QCH, KRB, KRH, KCH, O, L, stride_ob, stride_oh, stride_on,
                     QK_SCALE: gl.constexpr, GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DA: gl.constexpr, DB: gl.constexpr,
                     STAGES: gl.constexpr, SNAKE: gl.constexpr, WG: gl.constexpr):
        """One warpgroup's 64 rows of each query tile. DB > 0: S = Q_a K_a^T + Q_b K_b^T over the
        head's two column slices, and O in two accumulators, O_a = P V_a and O_b = P V_b."""
        q_ready, q_empty, k_ready, v_ready, kv_empty, turn0, turn1 = bars
        HALF: gl.constexpr = BLOCK_M // 2
        PV: gl.constexpr = 1 + (DB > 0)  # PV products in flight while the softmax runs
        dtype: gl.constexpr = q_desc.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, DA, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        ob_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DB + (DB == 0) * 8, 16])
        pb_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ob_layout, k_width=2)
        zero_s = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
        q_mine = q_smem.index(WG)
        qb_mine = qb_smem.index(WG)
        c = 0
        tc = 0
        r = 0  # turns taken at the tensor cores
        for i_t in range(gl.program_id(0), total, gl.num_programs(0)):
            t = _persistent_tile(i_t, total, SNAKE != 0)
            bh, qt, q_row, q_col, k_row, k_col, n_tiles = _tile_coords(
                t, N, H, GROUP, n_qt, QRB, QRH, QCH, KRB, KRH, KCH, BLOCK_M, BLOCK_N, IS_CAUSAL,
                SNAKE == 1, total)
            row0 = qt * BLOCK_M + WG * HALF
            mbarrier.wait(q_ready, tc & 1)
            slot = c % STAGES
            mbarrier.wait(k_ready.index(slot), (c // STAGES) & 1)
            _pp_turn(bars, r, WG)
            s = warpgroup_mma(q_mine, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if DB > 0:
                s = warpgroup_mma(qb_mine, kb_smem.index(slot).permute((1, 0)), s, is_async=True)
            _pp_pass(bars, WG)
            r += 1
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            p, m_i, l_i = _first_tile_softmax(s, row0, n_tiles, N, QK_SCALE, HALF, BLOCK_N, IS_CAUSAL,
                                              s_layout)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            o = gl.zeros([HALF, DA], gl.float32, o_layout)
            if DB > 0:
                pb_op = gl.convert_layout(p_op, pb_layout)
                ob = gl.zeros([HALF, DB], gl.float32, ob_layout)
            for i in range(1, n_tiles):
                cur = c + i
                slot = cur % STAGES
                prev = (cur - 1) % STAGES
                mbarrier.wait(k_ready.index(slot), (cur // STAGES) & 1)
                mbarrier.wait(v_ready.index(prev), ((cur - 1) // STAGES) & 1)
                _pp_turn(bars, r, WG)
                s = warpgroup_mma(q_mine, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
                if DB > 0:
                    s = warpgroup_mma(qb_mine, kb_smem.index(slot).permute((1, 0)), s, is_async=True)
                o = warpgroup_mma(p_op, v_smem.index(prev), o, is_async=True)
                if DB > 0:
                    ob = warpgroup_mma(pb_op, vb_smem.index(prev), ob, is_async=True)
                _pp_pass(bars, WG)
                r += 1
                s = warpgroup_mma_wait(num_outstanding=PV, deps=(s, ))
                p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, QK_SCALE)
                if DB > 0:
                    o, ob = warpgroup_mma_wait(num_outstanding=0, deps=(o, ob))
                    ob = ob * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, ob_layout)), 1)
                else:
                    o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
                mbarrier.arrive(kv_empty.index(prev), count=1)
                o = o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
                if DB > 0:
                    pb_op = gl.convert_layout(p_op, pb_layout)
            mbarrier.arrive(q_empty, count=1)
            cur = c + n_tiles - 1
            last = cur % STAGES
            mbarrier.wait(v_ready.index(last), (cur // STAGES) & 1)
            _pp_turn(bars, r, WG)
            o = warpgroup_mma(p_op, v_smem.index(last), o, is_async=True)
            if DB > 0:
                ob = warpgroup_mma(pb_op, vb_smem.index(last), ob, is_async=True)
            _pp_pass(bars, WG)
            r += 1
            if DB > 0:
                o, ob = warpgroup_mma_wait(num_outstanding=0, deps=(o, ob))
            else:
                o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
            mbarrier.arrive(kv_empty.index(last), count=1)
            _epilogue(o, m_i, l_i, O, L, bh, row0, N, H, stride_ob, stride_oh, stride_on, HALF, DA,
                      s_layout, o_layout)
            if DB > 0:
                _store_cols(ob, l_i, O, bh, row0, N, H, stride_ob, stride_oh, stride_on, HALF, DA, DB, ob_layout)
            c += n_tiles
            tc += 1

    @gluon.jit
    def _fwd_pp_kernel(q_desc, k_desc, v_desc, qb_desc, kb_desc, vb_desc, O, L, N, H, total, stride_ob,
                       stride_oh, stride_on, QRB, QRH, QCH, KRB, KRH, KCH, QK_SCALE: gl.constexpr,
                       GROUP: gl.constexpr, IS_CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, D: gl.constexpr, DB: gl.constexpr, STAGES: gl.constexpr,
                       SNAKE: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """DB = 0: a head's D columns in one tile (q/k/v_desc); DB > 0: in two, the first D - DB
        columns and the last DB (qb/kb/vb_desc), both powers of two (head dim 80 = 64 + 16)."""
        gl.static_assert(num_warps == 4, "one consumer warpgroup in the default partition")
        HALF: gl.constexpr = BLOCK_M // 2
        DA: gl.constexpr = D - DB
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2, HALF, DA], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DA], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DA], v_desc.layout)
        if DB > 0:
            qb_smem = gl.allocate_shared_memory(dtype, [2, HALF, DB], qb_desc.layout)
            kb_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DB], kb_desc.layout)
            vb_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DB], vb_desc.layout)
        else:  # not read
            qb_smem = q_smem
            kb_smem = k_smem
            vb_smem = v_smem
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        turn0 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        turn1 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        mbarrier.init(q_empty, count=2)  # both consumer warpgroups release Q
        mbarrier.init(turn0, count=1)
        mbarrier.init(turn1, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=2)  # and each K/V buffer
        bars = (q_ready, q_empty, k_ready, v_ready, kv_empty, turn0, turn1)
        n_qt = (N + BLOCK_M - 1) // BLOCK_M
        gl.warp_specialize([
            (_pp_consumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, qb_smem, kb_smem, vb_smem, bars, N, H,
                            total, n_qt, QRB, QRH, QCH, KRB, KRH, KCH, O, L, stride_ob, stride_oh, stride_on,
                            QK_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, DA, DB, STAGES, SNAKE, 0)),
            (_pp_consumer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, qb_smem, kb_smem, vb_smem, bars, N, H,
                            total, n_qt, QRB, QRH, QCH, KRB, KRH, KCH, O, L, stride_ob, stride_oh, stride_on,
                            QK_SCALE, GROUP, IS_CAUSAL, BLOCK_M, BLOCK_N, DA, DB, STAGES, SNAKE, 1)),
            (_pp_producer, (q_desc, k_desc, v_desc, qb_desc, kb_desc, vb_desc, q_smem, k_smem, v_smem, qb_smem,
                            kb_smem, vb_smem, bars, N, H, total, n_qt, QRB, QRH, QCH, KRB, KRH, KCH, GROUP,
                            IS_CAUSAL, BLOCK_M, BLOCK_N, DA, DB, STAGES, SNAKE)),
        ], [4, 1], [CONSUMER_REGS, 24])


# ---------------------------------------------------------------------------------------------
# Launchers


def head_desc(t4: torch.Tensor, block_rows: int, block_cols: int | None = None):
    """A 2-D TMA descriptor over t4's rows (see head_rows) and the (row-per-batch, row-per-head,
    column-per-head) offsets of its heads. Its tiles are [block_rows, block_cols] (default: the
    head dim; fewer columns for one slice of a split head dim, loaded at the slice's column)."""
    b, h, n, d = t4.shape
    stride, rb, rh, ch = head_rows(t4)
    rows = (b - 1) * rb + (h - 1) * rh + n
    cols = (h - 1) * ch + d
    block_cols = block_cols or d
    layout = _smem_layout(block_rows, block_cols, t4.dtype == torch.bfloat16)
    return TensorDescriptor(t4, [rows, cols], [stride, 1], [block_rows, block_cols], layout), (rb, rh, ch)


def split_head_dim(d: int) -> tuple[int, int]:
    """(DA, DB): the column slices a head dim is computed in, each a power of two (Gluon's tiles):
    (d, 0) for 64 and 128, (64, 16) for 80."""
    if d & (d - 1) == 0:
        return d, 0
    da = 1 << (d.bit_length() - 1)
    return da, d - da


@functools.cache
def _smem_layout(block_rows: int, d: int, bf16: bool):
    """The shared-memory layout of a [block_rows, d] tile (built once: Gluon's rule costs tens of
    us a call, and a forward + backward builds a dozen descriptors)."""
    return gl.NVMMASharedLayout.get_default_for([block_rows, d], gl.bfloat16 if bf16 else gl.float16)


_SMS: dict = {}


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device; 0 of any other (a CPU tensor's: these kernels never
    run there, and asking torch for a CUDA device would fail where it has none)."""
    if device.type != "cuda":
        return 0
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


def config(d: int, causal: bool, variant: str = "ws") -> tuple:
    key = (variant, d, bool(causal))
    if key not in CONFIGS:
        heads = sorted({k[1] for k in CONFIGS if k[0] == variant})
        raise ValueError(f"the Gluon {variant!r} forward covers head dims {heads}; got {d}")
    return CONFIGS[key]


def launch_forward(q, k, v, out, lse, is_causal: bool, variant: str = "ws", cfg: tuple | None = None,
                   compile_only: bool = False):
    """Write O into out ((B, H, N, D) view, any row/head/batch strides) and L into lse ((B*H, N)
    fp32) for q, k, v that `unsupported` accepts. variant: "pp" (ping-pong), "ws" (persistent,
    warp-specialised) or "plain" (a program per tile); cfg: (BLOCK_M, BLOCK_N, num_warps, STAGES),
    else the table's. compile_only ("pp"): compile for the active driver's target and launch
    nothing (the CPU's sm_90 compile check); returns the compiled kernel."""
    q4, k4, v4, o4 = heads(q), heads(k), heads(v), heads(out)
    nb, nh, n, d = q4.shape
    bm, bn, warps, stages = cfg or config(d, is_causal, variant)
    if is_causal and bm != bn:
        raise ValueError(f"causal Gluon tiles are square; got BLOCK_M={bm}, BLOCK_N={bn}")
    da, db = split_head_dim(d)
    if db and variant != "pp":
        raise ValueError(f"head dim {d} runs in the Gluon ping-pong forward only (variant 'pp'); got {variant!r}")
    q_desc, (qrb, qrh, qch) = head_desc(q4, bm, da)
    k_desc, (krb, krh, kch) = head_desc(k4, bn, da)
    v_desc, _ = head_desc(v4, bn, da)
    group = nh // k4.shape[1]
    n_qt = (n + bm - 1) // bm
    snake = 0 if not is_causal else SNAKE_BY_HEAD_DIM[d] if SNAKE_CAUSAL is None else int(SNAKE_CAUSAL)
    common = dict(QK_SCALE=LOG2E / math.sqrt(d), GROUP=group, IS_CAUSAL=bool(is_causal), BLOCK_M=bm,
                  BLOCK_N=bn, D=d, STAGES=stages, num_warps=warps)
    if variant == "plain":
        return kernel_launch.plain_launch(_fwd_kernel)[(n_qt, nb * nh)](q_desc, k_desc, v_desc, o4, lse, n, nh, o4.stride(0), o4.stride(1),
                                     o4.stride(2), qrb, qrh, qch, krb, krh, kch, **common)
    elif variant == "pp":
        if bm != 128 or warps != 4:
            raise ValueError(f"the ping-pong forward takes 128-row tiles and 4 warps per warpgroup; got {cfg}")
        q_desc, _ = head_desc(q4, bm // 2, da)  # each warpgroup's half of the query tile
        if db:  # the head's last db columns: a second tile of each
            qb_desc, kb_desc, vb_desc = head_desc(q4, bm // 2, db)[0], head_desc(k4, bn, db)[0], head_desc(v4, bn, db)[0]
        else:
            qb_desc, kb_desc, vb_desc = q_desc, k_desc, v_desc  # not read
        total = n_qt * nb * nh
        grid = (min(total, sm_count(q.device) if not compile_only else 132),)
        kernel = _fwd_pp_kernel.warmup if compile_only else kernel_launch.plain_launch(_fwd_pp_kernel)[grid]
        return kernel(q_desc, k_desc, v_desc, qb_desc, kb_desc, vb_desc, o4, lse, n, nh, total, o4.stride(0),
                      o4.stride(1), o4.stride(2), qrb, qrh, qch, krb, krh, kch, SNAKE=snake, DB=db,
                      CONSUMER_REGS=PP_REGS, **common, **(dict(grid=grid) if compile_only else {}))
    elif variant == "ws":
        total = n_qt * nb * nh
        grid = (min(total, sm_count(q.device)),)
        return kernel_launch.plain_launch(_fwd_ws_kernel)[grid](q_desc, k_desc, v_desc, o4, lse, n, nh, total, o4.stride(0), o4.stride(1),
                                    o4.stride(2), qrb, qrh, qch, krb, krh, kch, SNAKE=snake, **common)
    else:
        raise ValueError(f"unknown Gluon variant {variant!r}: 'pp', 'ws' or 'plain'")


def forward(q, k, v, is_causal: bool = False, variant: str | None = None, cfg: tuple | None = None):
    """(O, L) like flash_attention_triton's forward: O shaped like q ((B, N, H, D) in memory for a
    4-D q), L fp32 of shape q.shape[:-1]. Raises ValueError with the reason where the Gluon path
    does not cover the call."""
    if (why := unsupported(q, k, v, is_causal)) is not None:
        raise ValueError(f"the Gluon FlashAttention forward cannot run this call: {why}")
    variant = variant or DEFAULT_VARIANT
    q4 = heads(q)
    nb, nh, n, d = q4.shape
    if q.dim() == 4:
        out = q.new_empty_strided((nb, nh, n, d), (n * nh * d, d, nh * d, 1))
    else:
        out = q.new_empty(q4.shape)
    lse = torch.empty((nb * nh, n), dtype=torch.float32, device=q.device)
    launch_forward(q, k, v, out, lse, is_causal, variant, cfg)
    return out.view(q.shape), lse.view(q.shape[:-1])



# ---------------------------------------------------------------------------------------------
# Dispatch: which forward FlashAttention2Triton runs

BACKEND_ENV = "LMPERF_FA_BACKEND"
BACKENDS = ("auto", "gluon", "triton")
# "auto" at head dims 80 and 128: the Gluon forward from this many sequences (batch x heads), or a sequence from
# AUTO_LONG_N rows. With fewer the tile kernel splits its loop over the GPU's SMs (flash_attention_triton._split)
# and is faster (causal, H200; tuning/flash_attention/NOTES.md step 69): one sequence of 2,048-16,384 rows
# 0.46-0.85x this kernel's GPU time, two or four sequences of 16,384 rows 0.72-0.78x; one of 32,768 the same.
# From 8 sequences this one is faster or the same (eight of 8,192 rows: 0.98x at head dim 80, 1.03x at 128;
# 32 of 2,048 at head dim 80: 0.90x), and one sequence of 65,536 rows 0.85-0.88x
AUTO_MIN_SEQS = 8
AUTO_LONG_N = 65536
# ... and head dim 64 causal from 16,384 rows: from this many sequences to 16 (one or two of 16,384 rows: the
# tile kernel 0.59-0.74x this one's GPU time, one of 65,536 0.93-0.97x; four and eight of 16,384: this one
# 0.77-0.89x the tile kernel's; step 69)
AUTO_MIN_SEQS_64 = 4


def prefers_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> bool:
    """Where "auto" picks the Gluon forward (its ping-pong variant): the shapes at which it was
    measured faster than the tile-language kernel on the H100 (tuning/flash_attention/NOTES.md,
    steps 37-41): head dim 128 from 2,048 rows, causal or not, grouped-query or not; head dim 64
    causal from 16,384 rows in at most 16 sequences (the headline; with 256 sequences its causal
    schedule loses); head dim 80 from 2,048 rows, causal or not (measured on the H200, step 45).
    Of those, on an H200 (step 69): at head dims 80 and 128 only from AUTO_MIN_SEQS sequences, or
    from AUTO_LONG_N rows; at head dim 64 only from AUTO_MIN_SEQS_64 sequences (fewer: the tile
    kernel splits its loop over the SMs and is faster). N a multiple of
    128 (no tile past a sequence's end: see the module's note). Elsewhere (shorter or ragged
    sequences, fewer sequences, head dim 64 otherwise, every shape not measured) the tile-language
    kernel stays."""
    if q.dim() < 2 or q.shape[-2] % 128:
        return False
    n, d = q.shape[-2], q.shape[-1]
    seqs = math.prod(q.shape[:-2])
    if d in (80, 128):
        return n >= 2048 and (seqs >= AUTO_MIN_SEQS or n >= AUTO_LONG_N)
    return d == 64 and is_causal and n >= 16384 and AUTO_MIN_SEQS_64 <= seqs <= 16


def use_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              backend: str | None = None, validate=None) -> bool:
    """True where the Gluon forward runs this call: `backend` (else $LMPERF_FA_BACKEND, else
    "auto") is "gluon" (forced: a clear ValueError where it cannot run the call), "triton" (never),
    or "auto" (where it covers the call and was measured faster: `prefers_gluon`). `validate`
    (the contract's checks) runs first wherever the answer depends on the inputs."""
    backend = backend or os.environ.get(BACKEND_ENV) or "auto"
    if backend == "triton":
        return False
    if backend == "auto":
        if not prefers_gluon(q, k, v, is_causal):
            return False
        if validate is not None:
            validate()
        return unsupported(q, k, v, is_causal) is None
    if backend == "gluon":
        if validate is not None:
            validate()
        if (why := unsupported(q, k, v, is_causal)) is not None:
            raise ValueError(f"{BACKEND_ENV}=gluon asks for the Gluon FlashAttention forward, which cannot run "
                             f"this call: {why}. Unset it (or set it to 'auto' or 'triton') for the "
                             "tile-language kernel")
        return True
    raise ValueError(f"{BACKEND_ENV}={backend!r}: expected one of {', '.join(BACKENDS)}")


def _forward_fake(q, k, v, is_causal):
    if q.dim() == 4:
        b, h, n, d = q.shape
        out = q.new_empty_strided((b, h, n, d), (n * h * d, d, h * d, 1))
    else:
        out = q.new_empty(q.shape)
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32)


@opaque_op("lmperf::flash_attention_forward_gluon", (), _forward_fake)
def flash_attention_forward_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, L) of the Gluon forward as a PyTorch op, opaque to torch.compile (the compiled graph
    launches the same kernel as eager mode: the same bits). With plans on (LMPERF_FA_LAUNCH=plan),
    a call's launch is replayed from the plan of its signature, as in eager mode."""
    if kernel_launch.planning():
        out, lse = kernel_launch.planned(("gluon forward", is_causal), (q, k, v), lambda: forward(q, k, v, is_causal))
    else:
        out, lse = forward(q, k, v, is_causal)
    return out, lse
