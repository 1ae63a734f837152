"""The fused kernels (lmperf.kernels.rmsnorm, swiglu, rope) and the model patched to run them
(lmperf.kernels.fused), checked against float64 (`check`).

    python -m lmperf.bench.fused check --spec '{...}' --out results/cpu/fused/check.csv --hw cpu

Every case draws fresh random inputs (its seed is in each row). Each kernel runs on the spec's
shapes in each dtype, eagerly and (on `compiled_shapes`) under torch.compile(fullgraph=True):
its outputs and the gradients of its inputs for random output gradients, against float64, with
the house rule (attention_contract.tolerance): at most twice the error of the same computation
in plain PyTorch (the model's code) in that dtype, plus a floor. RMSNorm runs in three variants:
`add` (x + delta, then the norm, all in the dtype), `norm` (no delta: the first block's) and,
in 16 bits, `add_fp32_residual` (the model under autocast: an fp32 residual, a 16-bit delta, the
output in 16 bits).

`model` cases: the model patched with our kernels (`fused.apply(model, "ours")`) against the
same model unpatched, both against the model in float64 (plain attention; its loss in fp32, as
every step's), one training step's loss and every parameter's gradient (the largest error
over the parameters, each relative to its largest float64 gradient), under bf16 autocast or in
fp32, eager and with the blocks compiled.
"""
from __future__ import annotations

import itertools
import random

from lmperf import dtypes, failures, stats
from lmperf.bench import cli, jobs

KERNELS = ("rmsnorm", "swiglu", "rope")
MODEL_DIMS = ("d_model", "d_ff", "n_layers", "n_heads", "vocab_size")
BF16_ON_CPU = "needs CUDA: Triton's interpreter rounds to bfloat16 by truncation (checked on the GPU)"


def _variants(kernel: str, dtype: str) -> list[str]:
    if kernel != "rmsnorm":
        return [""]
    return ["add", "norm"] + (["add_fp32_residual"] if dtype != "fp32" else [])


def check_cases(spec: dict) -> list[dict]:
    """kernel x dtype x shape (x variant), eager on the kernel's shapes and compiled on its
    `compiled_shapes`; then model size x dtype x compile."""
    compiled_shapes = spec.get("compiled_shapes", {})
    odd = [r for r in spec["rope"] + compiled_shapes.get("rope", []) if r[-1] % 2]
    if odd:
        raise ValueError(f"fused check rope shapes {odd}: the head dim D (last entry) must be even "
                         "(RoPE rotates pairs)")
    cases = []
    for kernel, dtype in itertools.product(KERNELS, spec["dtypes"]):
        for compiled, shapes in ((False, spec[kernel]), (True, compiled_shapes.get(kernel, []))):
            for shape, variant in itertools.product(shapes, _variants(kernel, dtype)):
                case = {"impl": kernel, "dtype": dtype, "variant": variant, "compiled": compiled,
                        "shape": "x".join(map(str, shape))}
                case["case_id"] = "-".join(filter(None, (kernel, variant, dtype, "compiled" if compiled else "eager",
                                                         case["shape"])))
                cases.append(case)
    model = spec["model"]
    for size, dtype, compiled in itertools.product(model["sizes"], model["dtypes"], model["compile"]):
        cases.append({"impl": "model", "dtype": dtype, "variant": "", "compiled": compiled, "size": size,
                      "attention": model["attention"], "context": model["context"],
                      "batch_size": model["batch_size"], **model["models"][size],
                      "vocab_size": model["vocab_size"],
                      "case_id": f"model-{size}-{dtype}-{'compiled' if compiled else 'eager'}"})
    return cases


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning: the correctness check, study `check`)."""
    return check_cases(spec)


def _compiled(fn, compiled: bool):
    """fn, or fn under torch.compile(fullgraph=True): Inductor on a GPU; on the CPU the same
    trace through Dynamo and AOTAutograd, the kernels interpreted."""
    import torch

    if not compiled:
        return fn
    import torch._dynamo
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="inductor" if torch.cuda.is_available() else "aot_eager")


def check_rmsnorm(case: dict, device: str) -> list[dict]:
    import torch
    from lmperf.kernels import rmsnorm

    shape = tuple(int(s) for s in case["shape"].split("x"))
    dtype = dtypes.torch_dtype(case["dtype"])
    x = torch.randn(shape, device=device, dtype=torch.float32 if case["variant"] == "add_fp32_residual" else dtype)
    delta = torch.randn(shape, device=device, dtype=dtype) if case["variant"] != "norm" else None
    weight = 1 + 0.1 * torch.randn(shape[-1], device=device)  # fp32, as the model's (trained weights near 1)
    return rmsnorm.compare(x, delta, weight, 1e-5, dtype, impl=_compiled(rmsnorm.add_rmsnorm, case["compiled"]))


def check_swiglu(case: dict, device: str) -> list[dict]:
    import torch
    from lmperf.kernels import swiglu

    shape = tuple(int(s) for s in case["shape"].split("x"))
    dtype = dtypes.torch_dtype(case["dtype"])
    a = 3 * torch.randn(shape, device=device, dtype=dtype)  # sigmoid's tails too
    b = torch.randn(shape, device=device, dtype=dtype)
    return swiglu.compare(a, b, impl=_compiled(swiglu.silu_mul, case["compiled"]))


def check_rope(case: dict, device: str) -> list[dict]:
    """q and k as the model makes them: (B, H, N, D) views of (B, N, H, D) projections."""
    import torch
    from lmperf.kernels import rope
    from lmperf.model import rope_tables

    b, h, h_kv, n, d = (int(s) for s in case["shape"].split("x"))
    dtype = dtypes.torch_dtype(case["dtype"])
    q = torch.randn(b, n, h, d, device=device, dtype=dtype).transpose(1, 2)
    k = torch.randn(b, n, h_kv, d, device=device, dtype=dtype).transpose(1, 2)
    cos, sin = (t.to(device) for t in rope_tables(d, n, 10_000.0))
    return rope.compare(q, k, cos, sin, impl=_compiled(rope.rope, case["compiled"]))


def check_model(case: dict, device: str) -> list[dict]:
    import dataclasses

    import torch
    from lmperf import train
    from lmperf.kernels import fused
    from lmperf.kernels.attention_contract import tolerance
    from lmperf.model import ModelConfig

    cfg = ModelConfig(**{k: case[k] for k in MODEL_DIMS}, context_length=case["context"], attention=case["attention"])
    models = {"ref": train.build_model(dataclasses.replace(cfg, attention="plain"), device).double(),
              "torch": train.build_model(cfg, device), "impl": fused.apply(train.build_model(cfg, device))}
    if case["compiled"]:
        import torch._dynamo
        torch._dynamo.reset()
        for name in ("torch", "impl"):
            for block in models[name].blocks:
                block.compile(fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    x, y = train.random_tokens(cfg, case["batch_size"], case["context"], device)
    results = {}
    for name, model in models.items():
        with train.autocast(case["dtype"] if name != "ref" else "fp32", device):
            loss = train.loss(model, x, y)
        loss.backward()
        results[name] = (loss.detach(), [p.grad for p in model.parameters()])
    dtype = dtypes.torch_dtype(case["dtype"])
    ref_loss, ref_grads = results["ref"]
    loss_err = lambda name: float((results[name][0].double() - ref_loss).abs())
    grads_err = lambda name: max(float((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-30))
                                 for g, r in zip(results[name][1], ref_grads))
    rows = []
    for quantity, err in (("loss_max_abs_err", loss_err), ("grads_max_rel_err", grads_err)):
        impl_err, torch_err = err("impl"), err("torch")
        tol = tolerance(torch_err, dtype)
        rows.append({"metric": quantity, "max_abs_err": impl_err, "torch_err": torch_err, "tolerance": tol,
                     "passed": bool(impl_err <= tol)})
    return rows


def measure_check(case: dict) -> list[dict]:
    import torch

    cuda = torch.cuda.is_available()
    if case["dtype"] == "bf16" and not cuda:
        raise failures.NotRun(BF16_ON_CPU)
    seed = random.randrange(2**31)  # fresh inputs every run; the seed is kept to reproduce them
    torch.manual_seed(seed)
    check = {"rmsnorm": check_rmsnorm, "swiglu": check_swiglu, "rope": check_rope, "model": check_model}[case["impl"]]
    rows = []
    for r in check(case, "cuda" if cuda else "cpu"):
        metric = r.get("metric") or f"{r['quantity']}_max_abs_err"
        row = stats.summarize(metric, "rel" if metric.endswith("_rel_err") else "abs", [r["max_abs_err"]])
        row.update(torch_err=r["torch_err"], tolerance=r["tolerance"], passed=r["passed"], seed=seed)
        rows.append(row)
    return rows


def main(argv=None):
    args = cli.bench_args(__doc__, argv, studies=("check",), options=jobs.options)
    jobs.run(section="fused", study=args.study, cases=check_cases(args.spec), measure=measure_check,
             args=args, fingerprint={"spec": args.spec}, parallel=True)  # --workers: cases side by side


if __name__ == "__main__":
    main()
