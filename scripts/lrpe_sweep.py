"""LRPE launch-parameter sweep on a GPU, for the tuning notes (notes/lrpe.md), not the report:
kernel times (bench.lrpe.kernel_ms: profiler, host left out) of our Triton kernel, forward and
backward, over tile size, warps and the batch-split target, at the sizes where the bars are
closest, beside torch.compile's in the same run.

    python3 scripts/lrpe_sweep.py OUT.csv
"""
import csv
import itertools
import sys
import time

import torch

from lmperf.bench.lrpe import _compiled_torch, copy_bandwidth_gbs, kernel_ms
from lmperf.kernels import lrpe

B, H, D = 12, 12, 128
SIZES = [((512,), 128), ((1024,), 128), ((2048,), 128), ((8192,), 128), ((4, 4, 4), 64),
         ((8, 8, 8), 64)]                                      # (grid shape, e), l = 0
TILES, WARPS, SPLITS = (1024, 2048), (4, 8), (4, 8, 16, 32)


def times(fn, x, theta, grad):
    fwd = kernel_ms(lambda: fn(x, theta))
    out = fn(x, theta)
    bwd = kernel_ms(lambda: torch.autograd.grad(out, x, grad, retain_graph=True))
    return fwd, bwd


def main(out_path):
    copy = copy_bandwidth_gbs()
    rows, start = [], time.time()
    for shape, e in SIZES:
        n = 1
        for s in shape:
            n *= s
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(B, H, n, D, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        theta = torch.rand(H, e, device="cuda", generator=gen)
        grad = torch.randn(B, H, n, 2 * D, device="cuda", dtype=torch.bfloat16, generator=gen)
        floor = 3 * x.numel() * x.element_size()
        settings = [("torch_compile", None, None, None)] + [
            ("triton", t, w, s) for t, w, s in itertools.product(TILES, WARPS, SPLITS)]
        for provider, tile, warps, split in settings:
            if provider == "torch_compile":
                fn = lambda x, theta: _compiled_torch()(x, theta, shape, 0)
            else:
                lrpe.TILE_ELEMENTS, lrpe.NUM_WARPS, lrpe.PROGRAMS_PER_SM = tile, warps, split
                fn = lambda x, theta: lrpe.lrpe_cosine_md(x, theta, shape, 0, "triton")
            fwd, bwd = times(fn, x, theta, grad)
            for direction, ms in (("forward", fwd), ("backward", bwd)):
                rows.append({"shape": "x".join(map(str, shape)), "x_elements": x.numel(),
                             "provider": provider, "tile_elements": tile, "num_warps": warps,
                             "programs_per_sm": split, "direction": direction, "kernel_ms": ms,
                             "copy_fraction": floor / (ms * 1e-3) / 1e9 / copy, "copy_gbs": copy})
            print(f"[{time.time() - start:5.0f} s] {shape} {provider} tile={tile} warps={warps} "
                  f"split={split}: fwd {fwd * 1e3:.1f} us, bwd {bwd * 1e3:.1f} us", flush=True)
    with open(out_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out_path}: {len(rows)} rows")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not torch.cuda.is_available():
        sys.exit(__doc__ + "\nneeds CUDA and one argument, the output CSV")
    main(sys.argv[1])
