"""Tensor-descriptor (TMA) forward kernels, warp-specialised or not (Triton 3.6, H100): why L from the warp-specialised descriptor forward is wrong: variants of its epilogue and
tiles, L against torch's logsumexp (1 x 4 x 4,096 x 128) twice, and speed at 4 x 16 x 8,192 x 128."""
import torch, triton, triton.language as tl
from lmperf.kernels import flash_attention_triton as fa  # its private helpers: a one-off probe

@triton.jit
def _k(Q, K, V, O, L, H, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, N, QK_SCALE: tl.constexpr,
       D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, WS: tl.constexpr, MASK_L: tl.constexpr,
       LSE_IN_LOOP: tl.constexpr):
    q_tile = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    q0 = q_tile * BLOCK_Q
    dq_ = tl.make_tensor_descriptor(Q + b * sqb + h * sqh, shape=[N, D], strides=[sqn, 1], block_shape=[BLOCK_Q, D])
    dk = tl.make_tensor_descriptor(K + b * skb + h * skh, shape=[N, D], strides=[skn, 1], block_shape=[BLOCK_K, D])
    dv = tl.make_tensor_descriptor(V + b * svb + h * svh, shape=[N, D], strides=[svn, 1], block_shape=[BLOCK_K, D])
    do_ = tl.make_tensor_descriptor(O + b * sob + h * soh, shape=[N, D], strides=[son, 1], block_shape=[BLOCK_Q, D])
    q = dq_.load([q0, 0])
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    lse = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, D], tl.float32)
    for start in tl.range(0, N, BLOCK_K, warp_specialize=WS):
        s = tl.dot(q, dk.load([start, 0]).T)
        m_new = tl.maximum(m_i, tl.max(s, 1) * QK_SCALE)
        p = tl.math.exp2(s * QK_SCALE - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = dv.load([start, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
        if LSE_IN_LOOP:
            lse = m_i + tl.math.log2(l_i)
    do_.store([q0, 0], (acc / l_i[:, None]).to(O.dtype.element_ty))
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    if not LSE_IN_LOOP:
        lse = m_i + tl.math.log2(l_i)
    if MASK_L:
        tl.store(L + bh * N + offs_q, lse * 0.6931471805599453, mask=offs_q < N)
    else:  # L through a [B*H, N] descriptor, a [1, BLOCK_Q] box
        dl = tl.make_tensor_descriptor(L, shape=[tl.num_programs(1), N], strides=[N, 1], block_shape=[1, BLOCK_Q])
        dl.store([bh.to(tl.int32), q0], (lse * 0.6931471805599453)[None, :])

def run(q, k, v, bq, bk, w, s, ws, mask_l, in_loop):
    b, h, n, d = q.shape
    out = fa._out_like(q); lse = torch.full((b * h, n), float("nan"), device="cuda")
    triton.set_allocator(fa._scratch)
    _k[(triton.cdiv(n, bq), b * h)](q, k, v, out, lse, h, *fa._bhn(q), *fa._bhn(k), *fa._bhn(v), *fa._bhn(out), n,
        QK_SCALE=1.4426950408889634 / d ** 0.5, D=d, BLOCK_Q=bq, BLOCK_K=bk, WS=ws, MASK_L=mask_l, LSE_IN_LOOP=in_loop,
        num_warps=w, num_stages=s)
    return out, lse

g = torch.Generator(device="cuda").manual_seed(2)
qs, ks, vs = (torch.randn(1, 4, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
ref_l = torch.logsumexp(qs.float() @ ks.float().transpose(-1, -2) / 128 ** 0.5, -1).reshape(4, 4096)
ref_o = torch.softmax(qs.float() @ ks.float().transpose(-1, -2) / 128 ** 0.5, -1) @ vs.float()
qb, kb, vb = (torch.randn(4, 16, 8192, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
fl = 4 * 4 * 16 * 8192 ** 2 * 128
# (name, BLOCK_Q, BLOCK_K, warps, stages, warp-specialised, L by a masked pointer store (else by
# a descriptor), L computed in the loop). Run 4 (notes step 26) had the six after the first three,
# with L by pointer stores (unmasked in ws_unmasked_L); run 5 the first three.
variants = [("ws_L_desc", 128, 128, 4, 2, True, False, False), ("ws_L_desc_inloop", 128, 128, 4, 2, True, False, True),
            ("nows_L_desc", 128, 128, 8, 3, False, False, False), ("ws_rule", 128, 128, 4, 2, True, True, False), ("ws_unmasked_L", 128, 128, 4, 2, True, False, False),
            ("ws_lse_in_loop", 128, 128, 4, 2, True, True, True), ("nows_tma", 128, 128, 8, 3, False, True, False),
            ("ws_bq64_w4", 64, 128, 4, 3, True, True, False), ("ws_256x64", 256, 64, 4, 2, True, True, False)]
for name, bq, bk, w, s, ws, ml, il in variants:
    try:
        o1, l1 = run(qs, ks, vs, bq, bk, w, s, ws, ml, il)
        o2, l2 = run(qs, ks, vs, bq, bk, w, s, ws, ml, il)
        torch.cuda.synchronize()
        lerr = float((l1 - ref_l).abs().max()); oerr = float((o1.float() - ref_o).abs().max())
        same = torch.equal(l1, l2) and torch.equal(o1, o2)
        ms = triton.testing.do_bench(lambda: run(qb, kb, vb, bq, bk, w, s, ws, ml, il), warmup=25, rep=150, return_mode="median")
        print(f"{name:16s} L err {lerr:.3g}  O err {oerr:.3g}  repeatable {same}  {fl / ms / 1e9:.1f} TFLOP/s", flush=True)
    except Exception as exc:
        print(f"{name:16s} {type(exc).__name__}: {str(exc).splitlines()[0][:150] if str(exc) else ''}", flush=True)
