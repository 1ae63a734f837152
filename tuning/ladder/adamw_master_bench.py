"""The optimizer step alone, for one model size (default 2.7B): torch's fused AdamW on fp32
weights and fp32 gradients against MasterWeightAdamW (kernels/adamw_master.py) on bf16 weights and
bf16 gradients, each timed with triton.testing.do_bench in this process, one after the other
(tuning/ladder/NOTES.md: the ladder's bf16_weights rung).

    python tuning/ladder/adamw_master_bench.py --out DIR [--size 2.7B]

Writes DIR/adamw_master_bench_<size>.csv: optimizer, median ms, bytes moved a step, GB/s, and
the run's provenance.
"""
from __future__ import annotations

import argparse
import gc
from pathlib import Path

import pandas as pd
import torch
import yaml
from triton.testing import do_bench

from lmperf import csv_schema, hardware, provenance
from lmperf.bench import ladder
from lmperf.kernels.adamw_master import MasterWeightAdamW, linear_weights
from lmperf.model import ModelConfig, TransformerLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2.7B")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("adamw_master_bench: needs CUDA")
    dims = yaml.safe_load(open("config/config.yaml"))["models"][args.size]
    prov = provenance.provenance(hardware.hw_slug(hardware.gpu_name()))
    rows = []
    for impl in ("fused", "master"):
        torch.manual_seed(0)
        cfg = ModelConfig(**dims, context_length=256)
        with torch.device("cuda"):
            model = TransformerLM(cfg)
        n_linear = sum(w.numel() for w in linear_weights(model))
        n_other = sum(p.numel() for p in model.parameters()) - n_linear
        opt = (torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True) if impl == "fused"
               else MasterWeightAdamW(model, lr=1e-4))
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt.step()  # allocates the state
        ms = do_bench(opt.step, warmup=50, rep=500, return_mode="median")
        moved = ladder.optimizer_bytes(cfg, impl)  # what the ladder's optimizer floor counts
        rows.append({"size": args.size, "optimizer": impl, "median_ms": ms, "bytes": moved,
                     "gb_per_s": moved / ms / 1e6, "linear_params": n_linear, "other_params": n_other, **prov})
        print(f"{impl:7s} {ms:8.2f} ms  {moved / 1e9:6.1f} GB  {moved / ms / 1e6:7.0f} GB/s", flush=True)
        del model, opt
        gc.collect()
        torch.cuda.empty_cache()
    path = args.out / f"adamw_master_bench_{args.size}.csv"
    csv_schema.write_csv_atomic(pd.DataFrame(rows), path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
