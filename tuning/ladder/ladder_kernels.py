"""One ladder rung's training step profiled on a GPU: every kernel's time per step, grouped, so
the time a rung spends outside matmuls and attention can be read (tuning/ladder/NOTES.md).

    python tuning/ladder/ladder_kernels.py --size 2.7B --context 2048 --batch 4 --out DIR
        [--optimizer master] [--fused ours]

Writes DIR/ladder_kernels_<size>_<context>.csv (kernel, category, ms per step, calls per step, and
the run's provenance: GPU, torch, triton, commit); with another optimizer or fused kernels
(kernels/fused.py: the ladder's bf16_weights and fused rungs) ..._<optimizer>_<fused>.csv.
"""
from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import pandas as pd
import torch
import yaml

from lmperf import hardware
from lmperf import train
from lmperf.bench import common, ladder, profile


def rung_case(args) -> dict:
    """The ladder rung of `args` (bf16, compiled, fused AdamW, our FlashAttention-2; the 2.7B's
    rung 9 by default) as an e2e case."""
    return {**ladder.BASE, "dtype": "bf16", "compile": True, "optimizer": args.optimizer, "attention": "flash-triton",
            "context": args.context, "batch_size": args.batch, "mode": "train"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2.7B")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warm-up steps)")
    ap.add_argument("--optimizer", default="fused", choices=["fused", "master"])
    ap.add_argument("--fused", default="none", choices=["none", "ours", "liger"],
                    help="fused kernels (kernels/fused.py)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ladder_kernels: needs CUDA (it profiles the GPU's kernels)")
    dims = yaml.safe_load(open("config/config.yaml"))["models"][args.size]
    cfg, model, optimizer, inputs, targets, autocast = train.setup(rung_case(args), dims)
    if args.fused != "none":
        from lmperf.kernels import fused
        fused.apply(model, args.fused)
    nothing = lambda phase: contextlib.nullcontext()
    for _ in range(3):
        train.step(model, optimizer, inputs, targets, autocast, nothing)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            train.step(model, optimizer, inputs, targets, autocast, nothing)
        torch.cuda.synchronize()
    kernels = profile.kernel_times(prof, cuda=True)
    prov = common.provenance(hardware.hw_slug(hardware.gpu_name()))
    rows = []
    for name, (us, calls) in kernels.items():
        cat = ("attention" if ladder.ATTENTION_KERNEL.search(name) else profile.category(name))
        rows.append({"kernel": name[:200], "category": cat, "ms_per_step": us / 1e3 / args.steps,
                     "calls_per_step": calls / args.steps, **prov})
    rows.sort(key=lambda r: -r["ms_per_step"])
    variant = "" if (args.optimizer, args.fused) == ("fused", "none") else f"_{args.optimizer}_{args.fused}"
    path = args.out / f"ladder_kernels_{args.size}_{args.context}{variant}.csv"
    common.write_csv_atomic(pd.DataFrame(rows), path)
    total = sum(r["ms_per_step"] for r in rows)
    by = {}
    for r in rows:
        by[r["category"]] = by.get(r["category"], 0) + r["ms_per_step"]
    print(f"{args.size} ctx {args.context} batch {args.batch}: kernels {total:.1f} ms a step; "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])))
    for r in rows[:25]:
        print(f"{r['ms_per_step']:8.2f} ms {r['calls_per_step']:6.0f}x {r['category']:9s} {r['kernel'][:110]}")


if __name__ == "__main__":
    main()
