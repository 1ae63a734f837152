"""Float8 training of the ladder's best bf16 rung, in one process on one GPU: the rung in bf16,
then a fresh model with every nn.Linear but the LM head in fp8 (kernels/float8_delayed.py:
delayed scaling; or torchao's dynamic `tensorwise` where torchao imports), and for delayed
scaling also with each SwiGLU's layers alone (no fp8 product kernels); step time and kernel time
a step by category and by kernel, so the float8 recipe's cost outside the matmuls can be read
(tuning/ladder/NOTES.md, section 4).

    python tuning/ladder/float8_bench.py --out DIR [--size 2.7B --context 2048 --batch 4]
        [--recipe delayed|tensorwise] [--steps 15] [--variants bf16,fp8,fp8_layers]

The rung: our FlashAttention-2, MasterWeightAdamW, our RMSNorm and SwiGLU, compiled blocks (the
ladder's rung 15 at 4 x 2,048 for the 2.7B). Writes DIR/float8_bench_<size>_<context>_<recipe>.csv:
per variant the step time (median, 20/80% quantiles and samples of CUDA-event timed steps, after
3 warm-up steps), tokens/s, the loss of the last step, and kernel ms a step by category (`amax`
for the amax reductions, `float8_cast` for our cast, `float8_swiglu` for our fp8 SwiGLU product)
and each kernel's ms a step, with the run's provenance.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path


VARIANTS = {"bf16": "the rung in bf16", "fp8": "every nn.Linear but the LM head in fp8 (--recipe)",
            "fp8_layers": "delayed, each SwiGLU's three layers alone (float8_delayed.convert(swiglu=False))"}


def timed(model, optimizer, inputs, targets, autocast, steps: int) -> tuple[list[float], float]:
    import torch

    from lmperf import train
    nothing = lambda phase: contextlib.nullcontext()
    out = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        train.step(model, optimizer, inputs, targets, autocast, nothing)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    with torch.no_grad(), autocast:
        loss = train.loss(model, inputs, targets).item()
    return out, loss


def kernels(model, optimizer, inputs, targets, autocast, steps: int = 2) -> list[tuple[str, str, float]]:
    """(kernel, category, ms a step) of every kernel, longest first (ladder_kernels.step_kernels),
    with the categories `amax` for the amax reductions, `float8_cast` for our cast kernel and
    `float8_swiglu` for our fp8 SwiGLU product's."""
    from ladder_kernels import step_kernels  # this folder's: the same profile of a step
    out = []
    for r in step_kernels(model, optimizer, inputs, targets, autocast, steps):
        name = r["kernel"]
        cat = ("float8_cast" if "_cast_kernel" in name else "float8_swiglu" if "_swiglu_" in name
               else "amax" if "abs_max" in name or "amax" in name else r["category"])
        out.append((name, cat, r["ms_per_step"]))
    return out


def measure_variant(name: str, model, optimizer, inputs, targets, autocast, steps: int, tokens: int,
                    prov: dict) -> list[dict]:
    """One variant's rows: its step time (3 warm-up steps, then `steps` timed: median, 20/80%
    quantiles, samples; tokens/s; the last loss; the first step's seconds, its compile in them),
    kernel ms a step by category and by kernel; a line printed."""
    times, loss = timed(model, optimizer, inputs, targets, autocast, 3 + steps)
    first_s, times = times[0] / 1e3, times[3:]
    q = statistics.quantiles(times, n=5)
    per_kernel = kernels(model, optimizer, inputs, targets, autocast)
    by = {}
    for _, cat, ms in per_kernel:
        by[cat] = by.get(cat, 0.0) + ms
    med = statistics.median(times)
    rows = [{"variant": name, "metric": "step_ms", "median": med, "q20": q[0], "q80": q[3], "n": len(times),
             "samples": " ".join(f"{t:.3f}" for t in times), "tokens_per_s": tokens / med * 1e3, "loss": loss,
             "first_step_s": first_s, **prov}]
    rows += [{"variant": name, "metric": f"kernel_ms_{cat}", "median": ms, **prov} for cat, ms in by.items()]
    rows += [{"variant": name, "metric": "kernel_ms", "kernel": k, "category": cat, "median": ms, **prov}
             for k, cat, ms in per_kernel]
    print(f"{name}: step {med:.1f} ms (q20 {q[0]:.1f}, q80 {q[3]:.1f}), loss {loss:.4f}, first step {first_s:.0f} s; "
          "kernels " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2.7B")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--recipe", default="delayed", choices=["delayed", "tensorwise"])
    ap.add_argument("--steps", type=int, default=15, help="timed steps of each variant (after 3 warm-up steps)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated, each in its own model: " + "; ".join(f"{k}: {v}" for k, v in VARIANTS.items()))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import pandas as pd
    import torch
    import yaml

    from lmperf import csv_schema, hardware, provenance, train
    from lmperf.bench import float8, ladder
    from lmperf.kernels import float8_delayed
    if not torch.cuda.is_available():
        raise SystemExit("float8_bench: needs CUDA (it times the GPU's steps)")
    from ladder_kernels import rung_case  # this folder's
    case = rung_case(argparse.Namespace(optimizer="master", fused="rmsnorm+swiglu", float8="none",
                                        context=args.context, batch=args.batch))
    dims = yaml.safe_load(open("config/config.yaml"))["models"][args.size]
    rows, prov = [], provenance.provenance(hardware.hw_slug(hardware.gpu_name()))
    tokens = args.batch * args.context
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"float8_bench: variant {variant!r}; choose from {list(VARIANTS)}")
        torch._dynamo.reset()
        cfg, model, optimizer, inputs, targets, autocast = train.setup(case, dims)
        ladder.model_changes(case)(model)
        if variant == "fp8":
            float8.training(args.recipe)(model)
        elif variant == "fp8_layers":
            float8_delayed.convert(model, skip=("lm_head",), swiglu=False)
        name = variant if variant == "bf16" else f"{variant}_{args.recipe}"
        rows += measure_variant(name, model, optimizer, inputs, targets, autocast, args.steps, tokens, prov)
        del model, optimizer, cfg, inputs, targets
        torch.cuda.empty_cache()
    steps = {r["variant"]: r["median"] for r in rows if r["metric"] == "step_ms"}
    for name, ms in steps.items():
        if name != "bf16" and "bf16" in steps:
            print(f"{name} / bf16 tokens/s: {steps['bf16'] / ms:.3f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    csv_schema.write_csv_atomic(pd.DataFrame(rows),
                            args.out / f"float8_bench_{args.size}_{args.context}_{args.recipe}.csv")


if __name__ == "__main__":
    main()
