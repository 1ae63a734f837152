"""Does our FlashAttention-2's speed depend on what ran before it? The headline configuration
(16 heads x 16,384 x 64, causal, bf16) under the leaderboard's harness (torch.compile around
apply, out.sum().backward(), do_bench), timed

    first:      in a fresh process on an empty Triton cache, before anything else;
    after-grid: in a fresh process that first ran forward+backward on every shape of the FA grid
                (head dims 16/64/128, bf16 and fp32, N = 128 ... 65,536, batch 1, 1 head).

    TRITON_CACHE_DIR=$(mktemp -d) python tuning/flash_attention/fa_history.py first --out first.csv
    python tuning/flash_attention/fa_history.py after-grid --out after.csv

Each writes one row: the mode, the median and 20/80% quantiles in ms, the configs the rule table
chose, and provenance.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time

import torch


def grid_shapes():
    for d in (16, 64, 128):
        for dtype in (torch.bfloat16, torch.float32):
            for n in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):
                yield d, dtype, n


def run_grid() -> int:
    from lmperf.kernels.flash_attention_triton import FlashAttention2Triton
    count = 0
    for d, dtype, n in grid_shapes():
        q, k, v = (torch.randn(1, 1, n, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        FlashAttention2Triton.apply(q, k, v, True).sum().backward()
        count += 1
    torch.cuda.synchronize()
    return count


def headline() -> tuple[float, float, float]:
    from lmperf.bench import timing
    from lmperf.kernels.flash_attention_triton import FlashAttention2Triton
    torch._functorch.config.donated_buffer = False
    fn = torch.compile(FlashAttention2Triton.apply, fullgraph=True)
    q, k, v = (torch.randn(1, 16, 16384, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    return timing.do_bench_quantiles(lambda: fn(q, k, v, True).sum().backward(), warmup_ms=25,
                                     rep_ms=100, grad_to_none=[q, k, v])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["first", "after-grid"])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import triton
    from lmperf.provenance import git_commit
    from lmperf.kernels import flash_attention_triton as fa
    t0 = time.time()
    ran = run_grid() if args.mode == "after-grid" else 0
    median, q20, q80 = headline()
    bwd = fa.bwd_config(16384, 64, torch.bfloat16, True, 16)
    row = {"mode": args.mode, "shapes_run_before": ran, "fwd_bwd_ms": median, "q20_ms": q20, "q80_ms": q80,
           "config": f"fwd {fa.fwd_config(16384, 64, torch.bfloat16, True, 16)}; dq {bwd['dq']}; dkdv {bwd['dkdv']}",
           "wall_s": round(time.time() - t0, 1), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "commit": git_commit()}
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, list(row))
        w.writeheader()
        w.writerow(row)
    print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
