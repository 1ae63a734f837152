"""The ceiling of a delayed-scaling float8 linear (tuning/ladder/NOTES.md, section 4): the 2.7B's
best bf16 rung against the same model whose every nn.Linear but the LM head multiplies in fp8 with
scales fixed before the timed steps (no amax pass at all: what delayed scaling can at most save
over torchao's dynamic tensorwise scaling), in one process on one GPU.

    python tuning/ladder/float8_static_probe.py --out DIR [--size 2.7B --context 2048 --batch 4]
    python tuning/ladder/float8_static_probe.py --self-check      # the fp8 linear against bf16, any device

Scales come from one calibration step run eagerly at batch 1 (forward pre-hooks and backward hooks
record each linear's input and output-gradient amax; the gradients' amax is divided by the batch,
the loss being a mean over tokens), with one power of two of headroom. Writes
DIR/float8_static_probe_<size>_<context>.csv: step time (median, 20/80% quantiles of CUDA-event
timed steps) and kernel time a step by category, bf16 and static fp8, with provenance.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path

import torch
import torch.nn as nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HEADROOM = 2.0


def _cast(t: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    fmax = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype)


class _StaticF8Matmul(torch.autograd.Function):
    """y = x @ w.T with x, w and dy cast to fp8 by fixed scales (x, w e4m3; dy e5m2), as
    torch._scaled_mm needs them: the first operand row-major, the second column-major."""

    @staticmethod
    def forward(ctx, x, w, sx, sw, sg):
        x2 = x.reshape(-1, x.shape[-1])
        xf, wf = _cast(x2, sx, E4M3), _cast(w, sw, E4M3)
        y = torch._scaled_mm(xf, wf.t(), scale_a=sx.reciprocal(), scale_b=sw.reciprocal(),
                             out_dtype=torch.bfloat16, use_fast_accum=True)
        ctx.save_for_backward(xf, wf, sx, sw, sg)
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, w.dtype
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        xf, wf, sx, sw, sg = ctx.saved_tensors
        gf = _cast(gy.reshape(-1, gy.shape[-1]), sg, E5M2)
        gx = torch._scaled_mm(gf, wf.t().contiguous().t(), scale_a=sg.reciprocal(), scale_b=sw.reciprocal(),
                              out_dtype=torch.bfloat16)
        gw = torch._scaled_mm(gf.t().contiguous(), xf.t().contiguous().t(), scale_a=sg.reciprocal(),
                              scale_b=sx.reciprocal(), out_dtype=torch.bfloat16)
        return gx.reshape(ctx.x_shape).to(ctx.x_dtype), gw.to(ctx.w_dtype), None, None, None


class StaticF8Linear(nn.Linear):
    """nn.Linear (no bias) multiplying in fp8 with the scales in its buffers."""

    def forward(self, x):
        return _StaticF8Matmul.apply(x, self.weight, self.sx, self.sw, self.sg)


def to_static_f8(lin: nn.Linear, x_amax: float, g_amax: float) -> None:
    dev = lin.weight.device
    scale = lambda amax, dtype: torch.tensor(torch.finfo(dtype).max / (max(amax, 1e-12) * HEADROOM),
                                             dtype=torch.float32, device=dev)
    lin.register_buffer("sx", scale(x_amax, E4M3))
    lin.register_buffer("sw", scale(lin.weight.detach().abs().max().item(), E4M3))
    lin.register_buffer("sg", scale(g_amax, E5M2))
    lin.__class__ = StaticF8Linear


def linears(model):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != "lm_head"]


def calibrate(model, inputs, targets, autocast, batch: int) -> dict:
    """{name: (input amax, output-gradient amax at `batch`)} from one eager step at batch 1."""
    from lmperf import train
    amax, hooks = {}, []
    for name, m in linears(model):
        amax[name] = [0.0, 0.0]
        hooks.append(m.register_forward_pre_hook(
            lambda mod, args, n=name: amax[n].__setitem__(0, args[0].detach().abs().max().item())))
        hooks.append(m.register_full_backward_hook(
            lambda mod, gin, gout, n=name: amax[n].__setitem__(1, gout[0].detach().abs().max().item())))
    with torch.compiler.set_stance("force_eager"), autocast:
        train.loss(model, inputs[:1], targets[:1]).backward()
    for h in hooks:
        h.remove()
    model.zero_grad(set_to_none=True)
    return {n: (a, g / batch) for n, (a, g) in amax.items()}


def self_check() -> None:
    """The fp8 linear against a float64 matmul on random data: relative errors of y, dx, dw."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    lin = nn.Linear(256, 512, bias=False, device=dev, dtype=torch.bfloat16)
    x = torch.randn(4, 64, 256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(4, 64, 512, device=dev, dtype=torch.bfloat16) * 1e-3
    ref_x, ref_w = x.detach().double().requires_grad_(), lin.weight.detach().double().requires_grad_()
    (ref_x @ ref_w.t()).backward(gy.double())
    to_static_f8(lin, x.abs().max().item(), gy.abs().max().item())
    y = lin(x)
    y.backward(gy)
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
    errs = {"y": rel(y, (ref_x @ ref_w.t()).detach()), "dx": rel(x.grad, ref_x.grad), "dw": rel(lin.weight.grad, ref_w.grad)}
    print("fp8 linear, relative error against float64:", {k: f"{v:.4f}" for k, v in errs.items()})
    assert all(v < 0.1 for v in errs.values()), errs  # e4m3 has 3 mantissa bits, e5m2 2: a few % each


def timed(model, optimizer, inputs, targets, autocast, steps: int) -> list[float]:
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
    return out


def kernels(model, optimizer, inputs, targets, autocast, steps: int = 2) -> dict:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    from lmperf import train
    from lmperf.bench import ladder, profile
    nothing = lambda phase: contextlib.nullcontext()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            train.step(model, optimizer, inputs, targets, autocast, nothing)
        torch.cuda.synchronize()
    by = {}
    for name, (us, _) in profile.kernel_times(prof, cuda=True).items():
        cat = "attention" if ladder.ATTENTION_KERNEL.search(name) else profile.category(name)
        if "abs_max" in name or "amax" in name:
            cat = "amax"
        by[cat] = by.get(cat, 0.0) + us / 1e3 / steps
    return by


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2.7B")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=15, help="timed steps of each variant (after 3 warm-up steps)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--self-check", action="store_true")
    args = ap.parse_args()
    self_check()
    if args.self_check:
        return
    if not torch.cuda.is_available() or args.out is None:
        raise SystemExit("float8_static_probe: needs CUDA and --out")
    import pandas as pd
    import yaml

    from lmperf import hardware, train
    from lmperf.bench import common, ladder
    case = {**ladder.BASE, "dtype": "bf16", "compile": True, "optimizer": "master", "attention": "flash-triton",
            "context": args.context, "batch_size": args.batch, "mode": "train", "fused": "rmsnorm", "float8": "none"}
    dims = yaml.safe_load(open("config/config.yaml"))["models"][args.size]
    cfg, model, optimizer, inputs, targets, autocast = train.setup(case, dims)
    ladder.model_changes(case)(model)
    rows, prov = [], common.provenance(hardware.hw_slug(hardware.gpu_name()))
    tokens = args.batch * args.context
    for variant in ("bf16", "fp8_static"):
        if variant == "fp8_static":
            amax = calibrate(model, inputs, targets, autocast, args.batch)
            for name, m in linears(model):
                to_static_f8(m, *amax[name])
            torch._dynamo.reset()
        times = timed(model, optimizer, inputs, targets, autocast, 3 + args.steps)[3:]
        q = statistics.quantiles(times, n=5)
        by = kernels(model, optimizer, inputs, targets, autocast)
        rows.append({"variant": variant, "metric": "step_ms", "median": statistics.median(times), "q20": q[0],
                     "q80": q[3], "n": len(times), "samples": " ".join(f"{t:.3f}" for t in times),
                     "tokens_per_s": tokens / statistics.median(times) * 1e3, **prov})
        rows += [{"variant": variant, "metric": f"kernel_ms_{cat}", "median": ms, **prov} for cat, ms in by.items()]
        print(f"{variant}: step {statistics.median(times):.1f} ms (q20 {q[0]:.1f}, q80 {q[3]:.1f}); kernels "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])), flush=True)
    base, f8 = rows[0]["median"], next(r for r in rows if r["variant"] == "fp8_static" and r["metric"] == "step_ms")
    print(f"fp8_static / bf16 tokens/s: {base / f8['median']:.3f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    common.write_csv_atomic(pd.DataFrame(rows), args.out / f"float8_static_probe_{args.size}_{args.context}.csv")


if __name__ == "__main__":
    main()
