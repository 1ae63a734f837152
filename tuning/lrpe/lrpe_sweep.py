"""LRPE launch-parameter sweep on a GPU, for the tuning log (tuning/lrpe/NOTES.md), not the report:
kernel times (bench.lrpe.kernel_ms: profiler, host left out) of our Triton kernel, forward and
backward, over tile size, warps, the batch split and offset width, at the sizes where the bars are
closest, beside torch.compile's in the same run.

    python tuning/lrpe/lrpe_sweep.py OUT.csv

Writes OUT.csv after each size (a sweep cut short keeps what it measured): one row per size,
provider, setting and direction (kernel ms, share of the copy bandwidth, status) with the run's
provenance.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd
import torch

from lmperf import csv_schema, hardware, provenance
from lmperf.bench.lrpe import compiled_torch, copy_bandwidth_gbs, kernel_ms
from lmperf.kernels import lrpe

KERNEL_CALLS, COPY_WINDOWS = 10, (25, 200)  # config/schema.yaml's lrpe bench defaults
B, H, D = 12, 12, 128
# (grid shape, e, extra tokens l)
SIZES = [((256,), 128, 0), ((256,), 128, 10), ((512,), 128, 0), ((1024,), 128, 0), ((16, 16), 64, 10),
         ((4, 4, 4), 64, 0), ((4, 4, 4), 64, 10), ((8, 8, 8), 64, 0), ((8, 8, 8), 64, 10)]
# (tile elements, warps, PROGRAMS_PER_SM, MIN_BATCH_PER_PROGRAM, WIDE_OFFSETS): the current
# setting first, then one knob at a time
SETTINGS = [(2048, 4, 16, 2, "auto"),
            (2048, 4, 16, 1, "auto"), (2048, 4, 16, 3, "auto"),   # batch elements per part
            (2048, 4, 16, 2, True),                              # 64-bit offsets
            (1024, 4, 16, 2, "auto"), (1024, 4, 16, 1, "auto"),   # tile
            (2048, 4, 32, 2, "auto")]                            # batch split


def times(fn, x, theta, grad) -> tuple[float, float]:
    """Kernel ms of one forward and one backward of `fn`."""
    fwd = kernel_ms(lambda: fn(x, theta), KERNEL_CALLS)
    out = fn(x, theta)
    bwd = kernel_ms(lambda: torch.autograd.grad(out, x, grad, retain_graph=True), KERNEL_CALLS)
    return fwd, bwd


def sweep(out_path: Path) -> None:
    copy = copy_bandwidth_gbs(*COPY_WINDOWS)
    prov = provenance.provenance(hardware.hw_slug(hardware.gpu_name()))
    rows, start = [], time.time()
    for shape, e, l in SIZES:
        n = l + math.prod(shape)
        torch._dynamo.reset()  # a fresh compile per size: past 8 recompiles Dynamo falls back to eager
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(B, H, n, D, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        theta = torch.rand(H, e, device="cuda", generator=gen)
        grad = torch.randn(B, H, n, 2 * D, device="cuda", dtype=torch.bfloat16, generator=gen)
        floor = 3 * x.numel() * x.element_size()
        for provider, (tile, warps, split, min_batch, wide) in [("torch_compile", (None,) * 5)] + [
                ("triton", setting) for setting in SETTINGS]:
            if provider == "torch_compile":
                fn = lambda x, theta: compiled_torch()(x, theta, shape, l)
            else:
                lrpe.TILE_ELEMENTS, lrpe.NUM_WARPS = tile, warps
                lrpe.PROGRAMS_PER_SM, lrpe.MIN_BATCH_PER_PROGRAM, lrpe.WIDE_OFFSETS = split, min_batch, wide
                fn = lambda x, theta: lrpe.lrpe_cosine_md(x, theta, shape, l, "triton")
            try:
                fwd, bwd = times(fn, x, theta, grad)
                status = "ok"
            except Exception as exc:  # a failed setting is a row, and the sweep goes on
                fwd = bwd = float("nan")
                status = f"error: {type(exc).__name__}: {exc}"[:200]
                torch.cuda.empty_cache()
            for direction, ms in (("forward", fwd), ("backward", bwd)):
                rows.append({"shape": "x".join(map(str, shape)), "l": l, "x_elements": x.numel(),
                             "provider": provider, "tile_elements": tile, "num_warps": warps,
                             "programs_per_sm": split, "min_batch": min_batch, "wide": wide, "direction": direction,
                             "kernel_ms": ms, "copy_fraction": floor / (ms * 1e-3) / 1e9 / copy,
                             "copy_gbs": copy, "status": status, **prov})
            print(f"[{time.time() - start:5.0f} s] {shape} l={l} {provider} tile={tile} warps={warps} "
                  f"split={split} min_batch={min_batch} wide={wide}: fwd {fwd * 1e3:.1f} us, bwd {bwd * 1e3:.1f} us"
                  + ("" if status == "ok" else f" ({status})"), flush=True)
        csv_schema.write_csv_atomic(pd.DataFrame(rows), out_path)
        print(f"wrote {out_path}: {len(rows)} rows", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the CSV to write")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("lrpe_sweep: needs CUDA (it times the kernels on the GPU)")
    sweep(args.out)


if __name__ == "__main__":
    main()
