"""A persistent warp-specialised forward (NOTES, next steps 0 (a)): a one-off probe.

Step 32's kernel (one flat descriptor over B x H x N rows, 128 x 128 tiles, 4 warps, 2 stages,
L by a pointer store after the loop) with its tiles walked by persistent programs, one per SM:
  tile        a program per tile, the key loop warp-specialised (step 32's `after`, the reference)
  persist_in  a program per SM walking tiles (plain outer loop), the key loop warp-specialised
  persist_out the same with the outer loop warp-specialised instead (upstream's Blackwell idiom:
              the next tile's loads can start while this tile's epilogue runs)
Each is checked on 1 x 4 x N x 128 (L poisoned with NaN, twice) and timed at 4 x 16 x 8,192 x 128
non-causal beside cuDNN in the same process.

    PYTHONPATH=src python tuning/flash_attention/fa_ws_persist_probe.py [--small]
"""
import argparse

import torch
import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _tile(dq, dk, dv, do, L, tile, N, n_q, QK_SCALE: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr,
          BLOCK_K: tl.constexpr, WS: tl.constexpr):
    bh = tile // n_q
    q0 = (tile % n_q) * BLOCK_Q
    row0 = bh * N
    q = dq.load([row0 + q0, 0])
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, D], tl.float32)
    for start in tl.range(row0, row0 + N, BLOCK_K, warp_specialize=WS):
        s = tl.dot(q, dk.load([start, 0]).T)
        m_new = tl.maximum(m_i, tl.max(s, 1) * QK_SCALE)
        p = tl.math.exp2(s * QK_SCALE - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = dv.load([start, 0])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    do.store([row0 + q0, 0], (acc / l_i[:, None]).to(do.dtype))
    offs = q0 + tl.arange(0, BLOCK_Q)
    tl.store(L + bh * N + offs, (m_i + tl.math.log2(l_i)) * LN2, mask=offs < N)


@triton.jit
def _fwd(Q, K, V, O, L, N, BH, QK_SCALE: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr,
         BLOCK_K: tl.constexpr, MODE: tl.constexpr):
    # MODE: 0 tile, 1 persist_in, 2 persist_out
    rows = BH * N
    dq = tl.make_tensor_descriptor(Q, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_Q, D])
    dk = tl.make_tensor_descriptor(K, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_K, D])
    dv = tl.make_tensor_descriptor(V, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_K, D])
    do = tl.make_tensor_descriptor(O, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_Q, D])
    n_q = N // BLOCK_Q
    if MODE == 0:
        _tile(dq, dk, dv, do, L, tl.program_id(0), N, n_q, QK_SCALE, D, BLOCK_Q, BLOCK_K, True)
    elif MODE == 1:
        for tile in tl.range(tl.program_id(0), BH * n_q, tl.num_programs(0)):
            _tile(dq, dk, dv, do, L, tile, N, n_q, QK_SCALE, D, BLOCK_Q, BLOCK_K, True)
    else:
        for tile in tl.range(tl.program_id(0), BH * n_q, tl.num_programs(0), warp_specialize=True):
            _tile(dq, dk, dv, do, L, tile, N, n_q, QK_SCALE, D, BLOCK_Q, BLOCK_K, False)


def forward(q, k, v, mode, block_q=128, block_k=128, warps=4, stages=2, programs=None):
    b, h, n, d = q.shape
    if n % block_q or n % block_k:
        raise ValueError(f"N = {n} must be a multiple of the tiles ({block_q}, {block_k})")
    o = torch.empty_like(q)
    lse = torch.full((b * h, n), float("nan"), device=q.device)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=q.device))
    tiles = b * h * (n // block_q)
    grid = tiles if mode == 0 else min(tiles, programs or tiles)
    flat = [t.reshape(b * h * n, d) for t in (q, k, v, o)]
    _fwd[(grid,)](*flat, lse, n, b * h, QK_SCALE=1.4426950408889634 / d ** 0.5, D=d, BLOCK_Q=block_q,
                  BLOCK_K=block_k, MODE=mode, num_warps=warps, num_stages=stages)
    return o, lse


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a small check only (the interpreter)")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float16
    g = torch.Generator(device=dev).manual_seed(4)
    n, d, bq, bk = (8192, 128, 128, 128) if not a.small else (64, 16, 32, 16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 3
    qs, ks, vs = (torch.randn(1, 4, n, d, device=dev, dtype=dt, generator=g) for _ in range(3))
    s = qs.float() @ ks.float().transpose(-1, -2) / d ** 0.5
    ref_l, ref_o = torch.logsumexp(s, -1).reshape(4, n), torch.softmax(s, -1) @ vs.float()
    big = [torch.randn(4, 16, 8192, 128, device=dev, dtype=dt, generator=g) for _ in range(3)] if dev == "cuda" else []
    flops = 4 * 4 * 16 * 8192 ** 2 * 128
    for name, mode, stages, mult in (("tile", 0, 2, 1), ("persist_in", 1, 2, 1), ("persist_in_x2", 1, 2, 2),
                                     ("persist_out", 2, 2, 1), ("persist_out_s3", 2, 3, 1)):
        try:
            kw = dict(block_q=bq, block_k=bk, warps=4, stages=stages, programs=sms * mult)
            o1, l1 = forward(qs, ks, vs, mode, **kw)
            o2, l2 = forward(qs, ks, vs, mode, **kw)
            lerr, oerr = float((l1 - ref_l).abs().max()), float((o1.float() - ref_o).abs().max())
            same = torch.equal(l1, l2) and torch.equal(o1, o2)
            tf = ""
            if big:
                ms = triton.testing.do_bench(lambda: forward(*big, mode, **kw), warmup=25, rep=150,
                                             return_mode="median")
                tf = f"  {flops / ms / 1e9:.1f} TFLOP/s"
            print(f"{name:14s} L err {lerr:.3g} (NaN rows {int(l1.isnan().sum())})  O err {oerr:.3g}  "
                  f"repeatable {same}{tf}", flush=True)
        except Exception as exc:  # a variant that does not compile is a line, not the end
            lines = str(exc).splitlines() or [""]
            print(f"{name:14s} {type(exc).__name__}: {lines[0][:150]} ... {lines[-1][:300]}", flush=True)
    if big:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            ms = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(*big), warmup=25,
                                         rep=150, return_mode="median")
        print(f"cudnn          {flops / ms / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
