"""What a fixed-order dQ costs inside the dK/dV kernel (NOTES, next step 0): a one-off probe.

Each program owns one key tile of one head (as the dK/dV kernel) and walks the query tiles that
see it (causal: from its diagonal on), doing the backward's matmuls on random tiles; dQ's partial
of each query tile (dS K) goes out one of four ways:
  four     no dQ at all: the dK/dV kernel's four matmuls (the floor)
  local    the fifth matmul, summed in the program (kept live, never shared): its compute cost
  atomic   added to dQ by fp32 atomics (fast, but the sum's order and bits change run to run)
  ordered  added in a fixed order: key tiles descending per query tile, each program waiting on
           the query tile's counter (an acquire load) before a plain read-add-write of the tile,
           then a release increment; programs take their key tile from a ticket (an atomic
           counter), so every tile a program waits on belongs to one that started before it
Prints each variant's time (median of CUDA-event timings) and, for `ordered`, whether two runs
give the same bits and how far dQ is from the `atomic` sum.

    PYTHONPATH=src python tuning/flash_attention/fa_dq_order_probe.py --heads 16 --n 16384 --d 64
"""
import argparse

import torch
import triton
import triton.language as tl


@triton.jit
def _probe(Q, K, DO, DQ, COUNT, TICKET, SINK, N, NK, D: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, MODE: tl.constexpr):
    # MODE: 0 four, 1 local, 2 atomic, 3 ordered
    if MODE == 3:
        vid = tl.atomic_add(TICKET, 1)
    else:
        vid = tl.program_id(0)
    h = vid // NK
    j = NK - 1 - vid % NK  # the last key tile of a head first
    rn = j * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, D)
    base = h.to(tl.int64) * N * D
    k = tl.load(K + base + rn[:, None] * D + rd[None, :])
    v = tl.load(DO + base + rn[:, None] * D + rd[None, :])  # stands in for V (same shape)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    dq_sum = tl.zeros([BLOCK_M, D], tl.float32)
    m_tiles = N // BLOCK_M
    first = j * BLOCK_N // BLOCK_M
    for i in range(first, m_tiles):
        rm = i * BLOCK_M + tl.arange(0, BLOCK_M)
        q = tl.load(Q + base + rm[:, None] * D + rd[None, :])
        do = tl.load(DO + base + rm[:, None] * D + rd[None, :])
        s = tl.dot(q, tl.trans(k)) * 0.125
        p = tl.where(rm[:, None] >= rn[None, :], tl.math.exp2(s - 4.0), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - 1.0)
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv)
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk)
        if MODE != 0:
            dq = tl.dot(ds.to(k.dtype), k)
            ptrs = DQ + base + rm[:, None] * D + rd[None, :]
            if MODE == 1:
                dq_sum += dq
            elif MODE == 2:
                tl.atomic_add(ptrs, dq)
            else:
                # key tiles reach query tile i in descending order: j waits for i - j of them
                # (those of the tiles j + 1 .. i that see it); a count in this head's row
                c = COUNT + h * m_tiles + i
                want = (i * BLOCK_M + BLOCK_M - 1) // BLOCK_N - j
                while tl.atomic_add(c, 0, sem="acquire") < want:
                    pass
                cur = tl.load(ptrs, cache_modifier=".cg")
                tl.store(ptrs, cur + dq, cache_modifier=".cg")
                tl.debug_barrier()  # every thread's part of the tile stored before the one release
                tl.atomic_add(c, 1, sem="release")
    out = tl.sum(dk, 1) + tl.sum(dv, 1)
    tl.store(SINK + vid * BLOCK_N + tl.arange(0, BLOCK_N), out)
    if MODE == 1:
        tl.atomic_add(SINK + vid * BLOCK_N, tl.sum(tl.sum(dq_sum, 1), 0))


def launch(mode, q, k, do, dq, count, ticket, sink, block_m, block_n, warps, stages):
    h, n, d = q.shape
    _probe[(h * (n // block_n),)](q, k, do, dq, count, ticket, sink, n, n // block_n, D=d, BLOCK_M=block_m,
                                  BLOCK_N=block_n, MODE=mode, num_warps=warps, num_stages=stages)


def run(mode, q, k, do, dq, count, ticket, sink, *rest):
    dq.zero_(), count.zero_(), ticket.zero_()
    launch(mode, q, k, do, dq, count, ticket, sink, *rest)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--block-m", type=int, default=64)
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    dt = torch.bfloat16 if dev == "cuda" else torch.float16
    q, k, do = (torch.randn(a.heads, a.n, a.d, device=dev, dtype=dt, generator=g) for _ in range(3))
    dq = torch.zeros(a.heads, a.n, a.d, device=dev)
    count = torch.zeros(a.heads * (a.n // a.block_m), device=dev, dtype=torch.int32)
    ticket = torch.zeros(1, device=dev, dtype=torch.int32)
    sink = torch.zeros(a.heads * a.n, device=dev)
    args = (q, k, do, dq, count, ticket, sink, a.block_m, a.block_n, a.warps, a.stages)
    results = {}
    for name, mode in (("four", 0), ("local", 1), ("atomic", 2), ("ordered", 3)):
        run(mode, *args)  # compile and warm
        times = []
        for _ in range(a.reps if dev == "cuda" else 1):
            if dev != "cuda":
                run(mode, *args)
                times.append(float("nan"))
                continue
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dq.zero_(), count.zero_(), ticket.zero_()
            e0.record()
            launch(mode, *args)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1))
        results[name] = dq.clone()
        med = torch.tensor(times).median().item()
        print(f"{name:8s} {med:.3f} ms (median of {len(times)})", flush=True)
    run(3, *args)
    again = dq.clone()
    same = bool(torch.equal(again, results["ordered"]))
    rel = float((results["ordered"] - results["atomic"]).norm() / results["atomic"].norm().clamp(min=1e-30))
    print(f"ordered: two runs bitwise equal {same}; |ordered - atomic| / |atomic| = {rel:.2e}")


if __name__ == "__main__":
    main()
