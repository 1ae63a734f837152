"""A causal warp-specialised forward (NOTES step 35): a one-off probe.

Step 26 found that a causal loop with its mask inside does not compile warp-specialised with 4
warps in Triton 3.6. Here the causal forward is two loops, as upstream's tutorial splits it: the
key tiles left of the diagonal (no mask) in a warp-specialised loop, then the diagonal tile(s)
with the mask in a plain one. Tensor descriptors over B x H x N rows (step 32's form), L by a
pointer store after both loops, programs ordered longest query tile first.
  ws      the off-diagonal loop warp-specialised
  plain   the same two loops, nothing specialised
Each is checked on 1 x 4 x N x D against float32 (L poisoned with NaN, twice), and timed beside
lmperf's rule kernel and cuDNN at the headline (1 x 16 x 16,384 x 64) and the throughput shape
(4 x 16 x 8,192 x 128), causal, forward only.

    PYTHONPATH=src python tuning/flash_attention/fa_ws_causal_probe.py [--small]
"""
import argparse

import torch
import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _step(q, dk, dv, m_i, l_i, acc, start, offs_q, QK_SCALE: tl.constexpr, BLOCK_K: tl.constexpr,
          MASK: tl.constexpr):
    s = tl.dot(q, dk.load([start, 0]).T)
    if MASK:
        offs_k = start + tl.arange(0, BLOCK_K)
        s = tl.where(offs_q[:, None] >= offs_k[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * QK_SCALE)
    p = tl.math.exp2(s * QK_SCALE - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = dv.load([start, 0])
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _fwd(Q, K, V, O, L, N, BH, QK_SCALE: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr,
         BLOCK_K: tl.constexpr, WS: tl.constexpr, DIAG_FIRST: tl.constexpr = False):
    pid = tl.program_id(0)
    n_q = N // BLOCK_Q
    bh = pid % BH
    q0 = (n_q - 1 - pid // BH) * BLOCK_Q  # the longest query tiles first
    row0 = bh * N
    rows = BH * N
    dq = tl.make_tensor_descriptor(Q, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_Q, D])
    dk = tl.make_tensor_descriptor(K, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_K, D])
    dv = tl.make_tensor_descriptor(V, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_K, D])
    do = tl.make_tensor_descriptor(O, shape=[rows, D], strides=[D, 1], block_shape=[BLOCK_Q, D])
    q = dq.load([row0 + q0, 0])
    offs_q = row0 + q0 + tl.arange(0, BLOCK_Q)  # in the flat rows, as the keys' offsets
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, D], tl.float32)
    if DIAG_FIRST:  # the masked diagonal first, then the specialised loop last in the kernel
        for start in tl.range(row0 + q0, row0 + q0 + BLOCK_Q, BLOCK_K):
            m_i, l_i, acc = _step(q, dk, dv, m_i, l_i, acc, start, offs_q, QK_SCALE, BLOCK_K, True)
    for start in tl.range(row0, row0 + q0, BLOCK_K, warp_specialize=WS):
        m_i, l_i, acc = _step(q, dk, dv, m_i, l_i, acc, start, offs_q, QK_SCALE, BLOCK_K, False)
    if not DIAG_FIRST:
        for start in tl.range(row0 + q0, row0 + q0 + BLOCK_Q, BLOCK_K):
            m_i, l_i, acc = _step(q, dk, dv, m_i, l_i, acc, start, offs_q, QK_SCALE, BLOCK_K, True)
    do.store([row0 + q0, 0], (acc / l_i[:, None]).to(do.dtype))
    offs = q0 + tl.arange(0, BLOCK_Q)
    tl.store(L + bh * N + offs, (m_i + tl.math.log2(l_i)) * LN2, mask=offs < N)


def forward(q, k, v, ws, block_q=128, block_k=64, warps=4, stages=2, diag_first=False):
    b, h, n, d = q.shape
    if n % block_q or block_q % block_k:
        raise ValueError(f"N = {n} must be a multiple of block_q = {block_q}, and block_q of block_k = {block_k}")
    o = torch.empty_like(q)
    lse = torch.full((b * h, n), float("nan"), device=q.device)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=q.device))
    flat = [t.reshape(b * h * n, d) for t in (q, k, v, o)]
    _fwd[(b * h * (n // block_q),)](*flat, lse, n, b * h, QK_SCALE=1.4426950408889634 / d ** 0.5, D=d,
                                     BLOCK_Q=block_q, BLOCK_K=block_k, WS=ws, DIAG_FIRST=diag_first, num_warps=warps,
                                     num_stages=stages)
    return o, lse


def reference(q, k, v):
    n = q.shape[-2]
    s = q.float() @ k.float().transpose(-1, -2) / q.shape[-1] ** 0.5
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.logsumexp(s, -1).reshape(-1, n), torch.softmax(s, -1) @ v.float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a small check only (the interpreter)")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float16
    g = torch.Generator(device=dev).manual_seed(7)
    shapes = {"headline": (1, 16, 16384, 64), "throughput": (4, 16, 8192, 128)} if dev == "cuda" else {}
    configs = ((128, 64, 4, 2), (128, 128, 4, 2), (128, 64, 8, 2), (64, 64, 4, 2)) if dev == "cuda" else \
        ((32, 16, 4, 2),)
    for d in ((64, 128) if dev == "cuda" else (16,)):
        n = 4096 if dev == "cuda" else 64
        qs, ks, vs = (torch.randn(1, 4, n, d, device=dev, dtype=dt, generator=g) for _ in range(3))
        ref_l, ref_o = reference(qs, ks, vs)
        for cfg in configs:
            for name, ws, first in (("ws", True, False), ("ws_diag_first", True, True), ("plain", False, False)):
                try:
                    o1, l1 = forward(qs, ks, vs, ws, *cfg, diag_first=first)
                    o2, l2 = forward(qs, ks, vs, ws, *cfg, diag_first=first)
                    lerr, oerr = float((l1 - ref_l).abs().max()), float((o1.float() - ref_o).abs().max())
                    same = torch.equal(l1, l2) and torch.equal(o1, o2)
                    print(f"D {d} {cfg} {name:13s} L err {lerr:.3g} (NaN rows {int(l1.isnan().sum())})  O err "
                          f"{oerr:.3g}  repeatable {same}", flush=True)
                except Exception as exc:  # a variant that does not compile is a line, not the end
                    lines = str(exc).splitlines() or [""]
                    print(f"D {d} {cfg} {name:13s} {type(exc).__name__}: {lines[0][:120]} ... {lines[-1][:200]}",
                          flush=True)
    if not shapes:
        return
    from lmperf.kernels.flash_attention_triton import flash_attention_forward

    def bench(f):
        return triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")

    for label, shape in shapes.items():
        big = [torch.randn(*shape, device=dev, dtype=dt, generator=g) for _ in range(3)]
        flops = 2 * shape[0] * shape[1] * shape[2] ** 2 * shape[3]  # causal: half of 4 B H N^2 D
        d = shape[3]
        fns = {"rule": lambda: flash_attention_forward(*big, True)}
        for cfg in configs:
            if cfg[0] == 128:
                fns[f"ws{cfg}"] = (lambda c: lambda: forward(*big, True, *c))(cfg)
                fns[f"ws_diag_first{cfg}"] = (lambda c: lambda: forward(*big, True, *c, diag_first=True))(cfg)
        fns["cudnn"] = lambda: _cudnn(big)
        times = {}
        for _ in range(3):  # interleaved rounds
            for key, f in fns.items():
                try:
                    times.setdefault(key, []).append(bench(f))
                except Exception as exc:
                    times[key] = [float("nan")]
        cud = sorted(times["cudnn"])[len(times["cudnn"]) // 2]
        for key, ts in times.items():
            ms = sorted(ts)[len(ts) // 2]
            print(f"{label:10s} {key:22s} {ms:.3f} ms  {flops / ms / 1e9:.1f} TFLOP/s  / cudnn time {ms / cud:.3f}",
                  flush=True)


def _cudnn(big):
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(*big, is_causal=True)


if __name__ == "__main__":
    main()
