"""How far the fused add+RMSNorm's kernels are from their bytes at the 2.7B rung's shape (ladder
NOTES section 6): a one-off probe.

In the best bf16 rung's profiled step the RMSNorm backward takes 9.5 ms and the forward 5.3 ms
(65 calls each), about 2.9x and 1.6x what their bytes cost at the H100's bandwidth. This times the
ops as lmperf runs them (8,192 rows x 2,560, bf16, with the residual add and h's own gradient)
beside variants of the same kernels, and checks each variant's outputs against the op's:
  backward  programs per SM (the op: 2), the row loop software-pipelined (tl.range num_stages),
            warps
  forward   rows per program and warps (the op: one 4,096-wide row, 8 warps)
Prints each one's time (do_bench median), its share of the bytes' floor at the copy bandwidth
measured in the same process, and its largest difference from the op's outputs.

    PYTHONPATH=src python tuning/ladder/rmsnorm_probe.py [--rows 8192 --d 2560]
"""
import argparse

import torch
import triton
import triton.language as tl

from lmperf.kernels import rmsnorm
from lmperf.kernels.triton_op import cdiv, multiprocessors, next_pow2


@triton.jit
def _bwd(DY, DH, H, W, RSTD, DX, DW_PARTS, n_rows, D, rows_per_program, BLOCK_D: tl.constexpr,
         ROWS: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    w = tl.load(W + cols, mask=cols < D, other=0.0).to(tl.float32)
    dw = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    first = pid.to(tl.int64) * rows_per_program
    last = tl.minimum(first + rows_per_program, n_rows)
    for start in tl.range(first, last, ROWS, num_stages=STAGES):
        rows = start + tl.arange(0, ROWS)
        mask = (rows[:, None] < last) & (cols[None, :] < D)
        offs = rows[:, None] * D + cols[None, :]
        rstd = tl.load(RSTD + rows, mask=rows < last, other=0.0)
        n = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32) * rstd[:, None]
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        dn = dy * w[None, :]
        dw += dy * n
        dh = (dn - n * (tl.sum(dn * n, axis=1) / D)[:, None]) * rstd[:, None]
        dh += tl.load(DH + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + offs, dh.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW_PARTS + pid * D + cols, tl.sum(dw, axis=0), mask=cols < D)


def backward(dy, dh, h, w, rstd, per_sm, stages, warps, rows=1):
    n_rows, d = h.shape
    block_d = next_pow2(d)
    programs = max(1, min(cdiv(n_rows, rows), per_sm * multiprocessors(h.device)))
    rpp = cdiv(cdiv(n_rows, programs), rows) * rows
    programs = cdiv(n_rows, rpp)
    dx = torch.empty_like(h)
    parts = torch.empty((programs, d), dtype=torch.float32, device=h.device)
    _bwd[(programs,)](dy, dh, h, w, rstd, dx, parts, n_rows, d, rpp, BLOCK_D=block_d, ROWS=rows, STAGES=stages,
                      num_warps=warps)
    return dx, parts.sum(0).to(w.dtype)


def forward(x, delta, w, eps, rows, warps):
    n_rows, d = x.shape
    h, y = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    rmsnorm._rmsnorm_forward_kernel[(cdiv(n_rows, rows),)](
        x, delta, w, h, y, rstd, n_rows, d, d, d, d, d, eps, HAS_DELTA=True, BLOCK_D=next_pow2(d), ROWS=rows,
        num_warps=warps)
    return h, y, rstd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--d", type=int, default=2560)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float16
    g = torch.Generator(device=dev).manual_seed(8)
    rows, d = (a.rows, a.d) if dev == "cuda" else (40, 48)
    x, delta, dy, dh = (torch.randn(rows, d, device=dev, dtype=dt, generator=g) for _ in range(4))
    w = torch.rand(d, device=dev, dtype=dt, generator=g) + 0.5
    eps = 1e-5
    h, y, rstd = rmsnorm.add_rmsnorm_forward(x, delta, w, eps, dt)
    dx_op, _, dw_op = rmsnorm.rmsnorm_backward(dy, dh, h, w, rstd, dt, False, dt)

    def bench(f):
        if dev != "cuda":
            f()
            return float("nan")
        return triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")

    elem = dt.itemsize
    copy_ms = bench(lambda: x.clone())
    bw = 2 * rows * d * elem / copy_ms / 1e6  # GB/s of a copy: read and write
    print(f"copy {copy_ms * 1e3:.1f} us, {bw:.0f} GB/s", flush=True)
    floor_bwd = 4 * rows * d * elem / bw / 1e6  # ms: read h, dy, dh; write dx
    floor_fwd = 4 * rows * d * elem / bw / 1e6  # read x, delta; write h, y
    t = bench(lambda: rmsnorm.rmsnorm_backward(dy, dh, h, w, rstd, dt, False, dt))
    print(f"backward op             {t * 1e3:7.1f} us  {t / floor_bwd:.2f}x floor", flush=True)
    for per_sm in (2, 4, 8, 16):
        for stages in (1, 2, 3):
            for warps in (4, 8, 16):
                try:
                    dx, dw = backward(dy, dh, h, w, rstd, per_sm, stages, warps)
                    diff = float((dx.float() - dx_op.float()).abs().max())
                    dwd = float((dw.float() - dw_op.float()).abs().max())
                    t = bench(lambda: backward(dy, dh, h, w, rstd, per_sm, stages, warps))
                    print(f"backward per_sm {per_sm:2d} stages {stages} warps {warps:2d} {t * 1e3:7.1f} us  "
                          f"{t / floor_bwd:.2f}x floor  dx diff {diff:.3g}  dw diff {dwd:.3g}", flush=True)
                except Exception as exc:  # a variant that does not compile or fit is a line
                    print(f"backward per_sm {per_sm} stages {stages} warps {warps}: {type(exc).__name__}",
                          flush=True)
    t = bench(lambda: rmsnorm.add_rmsnorm_forward(x, delta, w, eps, dt))
    print(f"forward op              {t * 1e3:7.1f} us  {t / floor_fwd:.2f}x floor", flush=True)
    for rows_p in (1, 2, 4):
        for warps in (2, 4, 8, 16):
            try:
                h2, y2, r2 = forward(x, delta, w, eps, rows_p, warps)
                diff = float((y2.float() - y.float()).abs().max()) + float((h2.float() - h.float()).abs().max())
                t = bench(lambda: forward(x, delta, w, eps, rows_p, warps))
                print(f"forward rows {rows_p} warps {warps:2d}       {t * 1e3:7.1f} us  {t / floor_fwd:.2f}x floor  "
                      f"diff {diff:.3g}", flush=True)
            except Exception as exc:
                print(f"forward rows {rows_p} warps {warps}: {type(exc).__name__}", flush=True)


if __name__ == "__main__":
    main()
