"""Each fused kernel at one model size's shapes (default 2.7B at 4 x 2,048 tokens), against the
model's own code compiled by Inductor (what the ladder's rungs before `fused` run): forward and
forward+backward, timed with triton.testing.do_bench in this process (tuning/fused/NOTES.md).

    python tuning/fused/fused_bench.py --out DIR [--size 2.7B] [--tokens 4x2048]

Writes DIR/fused_bench_<size>.csv: kernel, impl (ours, inductor), direction, median ms, the bytes
the kernel must move and the rate that makes, and the run's provenance. The shapes are the
model's under bf16 autocast: an fp32 residual with bf16 sublayer outputs for RMSNorm, bf16 a and
b for SwiGLU, bf16 q and k in the projections' layout for RoPE.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
import yaml
from triton.testing import do_bench

from lmperf import csv_schema, hardware, provenance
from lmperf.kernels import rmsnorm, rope, swiglu
from lmperf.kernels.rope_contract import apply_rope
from lmperf.model import rope_tables


def cases(dims: dict, batch: int, context: int) -> list[tuple]:
    """(kernel, ours, inductor's twin, make inputs, bytes forward, bytes backward)."""
    d, f, heads = dims["d_model"], dims["d_ff"], dims["n_heads"]
    rows, bf16 = batch * context, torch.bfloat16
    cos, sin = (t.cuda() for t in rope_tables(d // heads, context, 10_000.0))

    def norm_inputs():
        return (torch.randn(rows, d, device="cuda", requires_grad=True),
                torch.randn(rows, d, device="cuda", dtype=bf16, requires_grad=True),
                torch.ones(d, device="cuda", requires_grad=True))

    def model_norm(x, delta, w):  # the model's residual add, RMSNorm and autocast's cast
        h = x + delta
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w
        return h, y.to(bf16)

    def qk_inputs():
        return tuple(torch.randn(batch, context, heads, d // heads, device="cuda", dtype=bf16)
                     .transpose(1, 2).requires_grad_() for _ in range(2))

    e = rows * d
    return [
        ("add_rmsnorm", lambda x, dl, w: rmsnorm.add_rmsnorm(x, dl, w, 1e-5, bf16), model_norm, norm_inputs,
         e * (4 + 2 + 4 + 2), e * (2 + 4 + 4 + 4 + 2)),
        ("silu_mul", swiglu.silu_mul, lambda a, b: F.silu(a) * b,
         lambda: tuple(torch.randn(rows, f, device="cuda", dtype=bf16, requires_grad=True) for _ in range(2)),
         rows * f * 6, rows * f * 10),
        ("rope", lambda q, k: rope.rope(q, k, cos, sin),
         lambda q, k: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)), qk_inputs, e * 8, e * 8),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2.7B")
    ap.add_argument("--tokens", default="4x2048", help="batch x context")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("fused_bench: needs CUDA")
    dims = yaml.safe_load(open("config/config.yaml"))["models"][args.size]
    batch, context = (int(x) for x in args.tokens.split("x"))
    prov = provenance.provenance(hardware.hw_slug(hardware.gpu_name()))
    rows = []
    for kernel, ours, twin, make, bytes_fwd, bytes_bwd in cases(dims, batch, context):
        for impl, fn in (("ours", ours), ("inductor", torch.compile(twin, fullgraph=True))):
            inputs = make()
            outs = fn(*inputs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            grads = [torch.randn_like(o) for o in outs]

            def fwd_bwd():
                out = fn(*inputs)
                torch.autograd.backward(out if isinstance(out, tuple) else (out,), grads)
            for direction, call, moved in (("forward", lambda: fn(*inputs), bytes_fwd),
                                           ("forward+backward", fwd_bwd, bytes_fwd + bytes_bwd)):
                ms = do_bench(call, warmup=25, rep=200, grad_to_none=list(inputs), return_mode="median")
                rows.append({"size": args.size, "tokens": args.tokens, "kernel": kernel, "impl": impl,
                             "direction": direction, "median_ms": ms, "bytes": moved, "gb_per_s": moved / ms / 1e6,
                             **prov})
                print(f"{kernel:12s} {impl:9s} {direction:17s} {ms:7.3f} ms {moved / ms / 1e6:7.0f} GB/s", flush=True)
    path = args.out / f"fused_bench_{args.size}.csv"
    csv_schema.write_csv_atomic(pd.DataFrame(rows), path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
