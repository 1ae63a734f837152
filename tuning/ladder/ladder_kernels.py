"""One ladder rung's training step profiled on a GPU: every kernel's time per step, grouped, so
the time a rung spends outside matmuls and attention can be read (tuning/ladder/NOTES.md).

    python tuning/ladder/ladder_kernels.py --size 2.7B --context 2048 --batch 4 --out DIR
        [--optimizer master] [--fused rmsnorm+swiglu] [--float8 tensorwise]

Writes DIR/ladder_kernels_<size>_<context>.csv (kernel, category, ms per step, calls per step, and
the run's provenance: GPU, torch, triton, commit); with another optimizer, fused kernels or float8
..._<optimizer>_<fused, its + as ->[_float8_<recipe>].csv (a lent GPU returns no name with +). --fused and --float8 take the ladder's values
(a rung's `fused` and `float8` columns) and change the model as the ladder does
(bench/ladder.py's model_changes): the best bf16 rung of the 2.7B ladder is
`--optimizer master --fused rmsnorm+swiglu`, its FP8 rung the same with `--float8 tensorwise`.
"""
from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import pandas as pd
import torch
import yaml

from lmperf import csv_schema, failures, hardware, provenance, train
from lmperf.bench import ladder, profile


def rung_case(args) -> dict:
    """The ladder rung of `args` (bf16, compiled, fused AdamW, our FlashAttention-2; the 2.7B's
    rung 9 by default) as an e2e case."""
    return {**ladder.BASE, "dtype": "bf16", "compile": True, "optimizer": args.optimizer, "attention": "flash-triton",
            "context": args.context, "batch_size": args.batch, "mode": "train", "fused": args.fused,
            "float8": args.float8}


def step_kernels(model, optimizer, inputs, targets, autocast, steps: int) -> list[dict]:
    """Every kernel of `steps` training steps under the profiler: kernel (name), category
    (`attention` for our FlashAttention's and SDPA's kernels, else profile.category),
    ms_per_step and calls_per_step, longest first."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    nothing = lambda phase: contextlib.nullcontext()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            train.step(model, optimizer, inputs, targets, autocast, nothing)
        torch.cuda.synchronize()
    rows = []
    for name, (us, calls) in profile.kernel_times(prof, cuda=True).items():
        cat = ("attention" if profile.ATTENTION_KERNEL.search(name) else profile.category(name))
        rows.append({"kernel": name[:200], "category": cat, "ms_per_step": us / 1e3 / steps,
                     "calls_per_step": calls / steps})
    return sorted(rows, key=lambda r: -r["ms_per_step"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2.7B")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warm-up steps)")
    ap.add_argument("--optimizer", default="fused", choices=["fused", "master"])
    ap.add_argument("--fused", default="none",
                    help="fused kernels as the ladder's `fused` column: none, liger, or our parts joined by + "
                         "(kernels/fused.py's PARTS; 'ours': all of them)")
    ap.add_argument("--float8", default="none", choices=["none", *ladder.FLOAT8_RECIPES],
                    help="torchao float8 training in this recipe (bench/float8.py)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.fused == "ours":
        from lmperf.kernels import fused
        args.fused = "+".join(fused.PARTS)
    case = rung_case(args)
    try:  # before CUDA: a bad part is a ValueError, a missing package (Liger, torchao) NotRun
        change = ladder.model_changes(case)
    except failures.NotRun as exc:
        raise SystemExit(f"ladder_kernels: {exc}") from None
    if not torch.cuda.is_available():
        raise SystemExit("ladder_kernels: needs CUDA (it profiles the GPU's kernels)")
    dims = yaml.safe_load(open("config/config.yaml"))["models"][args.size]
    cfg, model, optimizer, inputs, targets, autocast = train.setup(case, dims)
    change(model)
    nothing = lambda phase: contextlib.nullcontext()
    for _ in range(3):
        train.step(model, optimizer, inputs, targets, autocast, nothing)
    torch.cuda.synchronize()
    prov = provenance.provenance(hardware.hw_slug(hardware.gpu_name()))
    rows = [{**r, **prov} for r in step_kernels(model, optimizer, inputs, targets, autocast, args.steps)]
    variant = ("" if (args.optimizer, args.fused) == ("fused", "none")
               else f"_{args.optimizer}_{args.fused.replace('+', '-')}")
    variant += "" if args.float8 == "none" else f"_float8_{args.float8}"
    path = args.out / f"ladder_kernels_{args.size}_{args.context}{variant}.csv"
    csv_schema.write_csv_atomic(pd.DataFrame(rows), path)
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
