"""Can a warp-specialised forward write its logsumexp (NOTES step 26, next step 0): a one-off probe.

Triton 3.6's warp-specialised loop (`tl.range(..., warp_specialize=True)`) gave the non-causal
forward 553-565 TFLOP/s on the H100 (4 x 16 x 8,192 x 128) with O right but L unwritten at some
rows. Each variant here is that kernel (tensor descriptors, 128-query tiles, 4 warps, 2 stages)
with L written another way, checked on 1 x 4 x 4,096 x 128 against torch's logsumexp (L
poisoned with NaN before the call, twice: the same bits?) and timed at the bar's shape:
  after       the masked pointer store after the loop (the broken one, for reference)
  in_loop     the same store inside the loop, every iteration (the last one wins)
  wide_desc   L through a descriptor of a (rows, 4) fp32 array, column 0 read back
  halves      the tile as two 64-row halves in the source, each with its m, l and L store
  no_ws       `after` without warp specialisation (the pointer kernel's speed)
  lazy        `after`, rescaling O and l only when a row's max grew by more than 2^8 (a uniform branch)
  ex2_bf16    `after`, P's exponentials two an instruction (ex2.approx.ftz.bf16x2; GPU only)
  lazy_ex2    both

    PYTHONPATH=src python tuning/flash_attention/fa_ws_lse_probe.py
"""
import argparse

import torch
import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _exp2(x, EX2: tl.constexpr):
    if EX2 == 1:  # two values an instruction: ex2.approx.ftz.bf16x2 (sm_90), p in bf16
        return tl.inline_asm_elementwise("ex2.approx.ftz.bf16x2 $0, $1;", "=r,r", [x.to(tl.bfloat16)],
                                         dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        return tl.math.exp2(x)


@triton.jit
def _half(q, dk, dv, m_i, l_i, acc, start, QK_SCALE: tl.constexpr, LAZY: tl.constexpr = False,
          EX2: tl.constexpr = 0):
    s = tl.dot(q, dk.load([start, 0]).T)
    m_new = tl.maximum(m_i, tl.max(s, 1) * QK_SCALE)
    if LAZY:  # rescale only when some row's max grew by more than 2^8 (exact: l and acc share m)
        if tl.max(m_new - m_i, 0) > 8.0:
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        p = _exp2(s * QK_SCALE - m_i[:, None], EX2)
        l_i = l_i + tl.sum(p.to(tl.float32), 1)
        v = dv.load([start, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        return m_i, l_i, acc
    p = _exp2(s * QK_SCALE - m_new[:, None], EX2)
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p.to(tl.float32), 1)
    v = dv.load([start, 0])
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _fwd(Q, K, V, O, L, LW, N, H, QK_SCALE: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr,
         BLOCK_K: tl.constexpr, WS: tl.constexpr, MODE: tl.constexpr, LAZY: tl.constexpr = False,
         EX2: tl.constexpr = 0):
    # MODE: 0 after, 1 in_loop, 2 wide_desc, 3 halves
    q_tile = tl.program_id(0)
    bh = tl.program_id(1)
    row0 = bh * N  # q, k, v, o are (B*H*N, D), contiguous
    q0 = q_tile * BLOCK_Q
    rows = tl.num_programs(1) * N
    HALF: tl.constexpr = BLOCK_Q // 2
    dk = tl.make_tensor_descriptor(K, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_K, D])
    dv = tl.make_tensor_descriptor(V, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_K, D])
    offs = q0 + tl.arange(0, BLOCK_Q)
    if MODE == 3:
        dqh = tl.make_tensor_descriptor(Q, shape=[rows, D], strides=[D, 1], block_shape=[HALF, D])
        doh = tl.make_tensor_descriptor(O, shape=[rows, D], strides=[D, 1], block_shape=[HALF, D])
        qa = dqh.load([row0 + q0, 0])
        qb = dqh.load([row0 + q0 + HALF, 0])
        ma = tl.full([HALF], float("-inf"), tl.float32)
        mb = tl.full([HALF], float("-inf"), tl.float32)
        la = tl.zeros([HALF], tl.float32)
        lb = tl.zeros([HALF], tl.float32)
        aa = tl.zeros([HALF, D], tl.float32)
        ab = tl.zeros([HALF, D], tl.float32)
        for start in tl.range(row0, row0 + N, BLOCK_K, warp_specialize=WS):
            ma, la, aa = _half(qa, dk, dv, ma, la, aa, start, QK_SCALE)
            mb, lb, ab = _half(qb, dk, dv, mb, lb, ab, start, QK_SCALE)
        doh.store([row0 + q0, 0], (aa / la[:, None]).to(O.dtype.element_ty))
        doh.store([row0 + q0 + HALF, 0], (ab / lb[:, None]).to(O.dtype.element_ty))
        oa = q0 + tl.arange(0, HALF)
        tl.store(L + bh * N + oa, (ma + tl.math.log2(la)) * LN2, mask=oa < N)
        tl.store(L + bh * N + oa + HALF, (mb + tl.math.log2(lb)) * LN2, mask=oa + HALF < N)
    else:
        dq = tl.make_tensor_descriptor(Q, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_Q, D])
        do = tl.make_tensor_descriptor(O, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_Q, D])
        q = dq.load([row0 + q0, 0])
        m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q], tl.float32)
        acc = tl.zeros([BLOCK_Q, D], tl.float32)
        for start in tl.range(row0, row0 + N, BLOCK_K, warp_specialize=WS):
            m_i, l_i, acc = _half(q, dk, dv, m_i, l_i, acc, start, QK_SCALE, LAZY, EX2)
            if MODE == 1:
                tl.store(L + bh * N + offs, (m_i + tl.math.log2(l_i)) * LN2, mask=offs < N)
        do.store([row0 + q0, 0], (acc / l_i[:, None]).to(O.dtype.element_ty))
        lse = (m_i + tl.math.log2(l_i)) * LN2
        if MODE == 0:
            tl.store(L + bh * N + offs, lse, mask=offs < N)
        if MODE == 2:
            dl = tl.make_tensor_descriptor(LW, shape=[rows, 4], strides=[4, 1], block_shape=[BLOCK_Q, 4])
            dl.store([row0 + q0, 0], tl.broadcast_to(lse[:, None], [BLOCK_Q, 4]))


def forward(q, k, v, mode, ws, block_q=128, block_k=128, warps=4, stages=2, lazy=False, ex2=0):
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    lse = torch.full((b * h, n), float("nan"), device=q.device)
    wide = torch.full((b * h * n, 4), float("nan"), device=q.device)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=q.device))
    flat = [t.reshape(b * h * n, d) for t in (q, k, v, o)]
    _fwd[(triton.cdiv(n, block_q), b * h)](*flat, lse, wide, n, h, QK_SCALE=1.4426950408889634 / d ** 0.5, D=d,
                                           BLOCK_Q=block_q, BLOCK_K=block_k, WS=ws, MODE=mode, LAZY=lazy, EX2=ex2, num_warps=warps,
                                           num_stages=stages)
    return o, (wide[:, 0].reshape(b * h, n) if mode == 2 else lse)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a small check only (the interpreter)")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float16
    g = torch.Generator(device=dev).manual_seed(2)
    n, d, bq, bk, w = (4096, 128, 128, 128, 4) if not a.small else (64, 16, 32, 16, 4)
    qs, ks, vs = (torch.randn(1, 4, n, d, device=dev, dtype=dt, generator=g) for _ in range(3))
    s = qs.float() @ ks.float().transpose(-1, -2) / d ** 0.5
    ref_l, ref_o = torch.logsumexp(s, -1).reshape(4, n), torch.softmax(s, -1) @ vs.float()
    big = [torch.randn(4, 16, 8192, 128, device=dev, dtype=dt, generator=g) for _ in range(3)] if dev == "cuda" else []
    flops = 4 * 4 * 16 * 8192 ** 2 * 128
    variants = (("after", 0, True, False, 0), ("in_loop", 1, True, False, 0), ("wide_desc", 2, True, False, 0),
                ("halves", 3, True, False, 0), ("no_ws", 0, False, False, 0), ("lazy", 0, True, True, 0),
                ("ex2_bf16", 0, True, False, 1), ("lazy_ex2", 0, True, True, 1))
    for name, mode, ws, lazy, ex2 in variants:
        if ex2 and dev == "cpu":
            print(f"{name:10s} needs CUDA (inline PTX)")
            continue
        try:
            o1, l1 = forward(qs, ks, vs, mode, ws, bq, bk, w, lazy=lazy, ex2=ex2)
            o2, l2 = forward(qs, ks, vs, mode, ws, bq, bk, w, lazy=lazy, ex2=ex2)
            lerr, oerr = float((l1 - ref_l).abs().max()), float((o1.float() - ref_o).abs().max())
            nan_rows = int(l1.isnan().sum())
            same = torch.equal(l1, l2) and torch.equal(o1, o2)
            tf = ""
            if big:
                ms = triton.testing.do_bench(lambda: forward(*big, mode, ws, lazy=lazy, ex2=ex2), warmup=25, rep=150, return_mode="median")
                tf = f"  {flops / ms / 1e9:.1f} TFLOP/s"
            print(f"{name:10s} L err {lerr:.3g} (NaN rows {nan_rows})  O err {oerr:.3g}  repeatable {same}{tf}",
                  flush=True)
        except Exception as exc:  # a variant that does not compile is a line, not the end
            lines = str(exc).splitlines() or [""]
            print(f"{name:10s} {type(exc).__name__}: {lines[0][:150]} ... {lines[-1][:300]}", flush=True)
    if big:
        fl = torch.nn.attention.SDPBackend.CUDNN_ATTENTION
        with torch.nn.attention.sdpa_kernel(fl):
            ms = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(*big), warmup=25,
                                         rep=150, return_mode="median")
        print(f"cudnn      {flops / ms / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
