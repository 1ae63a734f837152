"""The ladder's best bf16 rung with its blocks compiled in another torch.compile mode, in one
process on one GPU: does Inductor's max-autotune (Triton GEMM templates beside cuBLAS, chosen per
shape, with the elementwise work after a matmul fused into its epilogue) move the 2.7B step toward
55% MFU (tuning/ladder/NOTES.md, "Left")? Each variant is a fresh model; step time (CUDA events,
after 3 warm-up steps) and kernel time a step by category and by kernel.

    python tuning/ladder/compile_mode_bench.py --out DIR [--size 2.7B --context 2048 --batch 4]
        [--steps 15] [--variants default,autotune,default_unfused,autotune_unfused]

Variants: `default` the rung as the ladder runs it (rung 15: MasterWeightAdamW, our FlashAttention-2,
our RMSNorm and SwiGLU kernels, blocks compiled in the default mode); `autotune` the same blocks
compiled with mode="max-autotune-no-cudagraphs"; `*_unfused` without our RMSNorm and SwiGLU
(Inductor's own kernels for them, which it can fuse into a matmul's epilogue; ours it cannot).
Writes DIR/compile_mode_bench_<size>_<context>.csv with the run's provenance.
"""
from __future__ import annotations

import argparse
from pathlib import Path

VARIANTS = {"default": ("rmsnorm+swiglu", None), "autotune": ("rmsnorm+swiglu", "max-autotune-no-cudagraphs"),
            "default_unfused": ("none", None), "autotune_unfused": ("none", "max-autotune-no-cudagraphs")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2.7B")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=15, help="timed steps of each variant (after 3 warm-up steps)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from " + ", ".join(VARIANTS))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import pandas as pd
    import torch
    import yaml

    from lmperf import hardware, train
    from lmperf.bench import common, ladder
    if not torch.cuda.is_available():
        raise SystemExit("compile_mode_bench: needs CUDA (it times the GPU's steps)")
    from float8_bench import measure_variant  # this folder's
    from ladder_kernels import rung_case
    dims = yaml.safe_load(open("config/config.yaml"))["models"][args.size]
    rows, prov = [], common.provenance(hardware.hw_slug(hardware.gpu_name()))
    tokens = args.batch * args.context
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"compile_mode_bench: variant {variant!r}; choose from {list(VARIANTS)}")
        fused, mode = VARIANTS[variant]
        case = rung_case(argparse.Namespace(optimizer="master", fused=fused, float8="none", context=args.context,
                                            batch=args.batch))
        torch._dynamo.reset()
        cfg, model, optimizer, inputs, targets, autocast = train.setup({**case, "compile": mode is None}, dims)
        ladder.model_changes(case)(model)
        if mode is not None:
            for block in model.blocks:
                block.compile(mode=mode)
        rows += measure_variant(variant, model, optimizer, inputs, targets, autocast, args.steps, tokens, prov)
        del model, optimizer, cfg, inputs, targets
        torch.cuda.empty_cache()
        args.out.mkdir(parents=True, exist_ok=True)  # after each variant: a cut run keeps what it measured
        common.write_csv_atomic(pd.DataFrame(rows), args.out / f"compile_mode_bench_{args.size}_{args.context}.csv")


if __name__ == "__main__":
    main()
