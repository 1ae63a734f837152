"""The master-weight AdamW (lmperf.kernels.adamw_master), checked over several steps (`check`):
against AdamW in float64, and against PyTorch's fused AdamW under bf16 autocast, the recipe it
replaces in the ladder's best rungs.

    python -m lmperf.bench.adamw_master check --spec '{...}' --out results/cpu/adamw_master/check.csv --hw cpu

With `--workers N` its cases run in N worker processes (bench/jobs.py).

Every case draws fresh random inputs (its seed is in each row); two kinds:

- `float64`: Linear weights of awkward sizes around the kernel's chunk (under one, exactly one,
  one past, ragged ends, one element), `steps` steps on random bf16 gradients. The fp32 master
  weights against AdamW in float64 from the same start; the tolerance is twice the error of
  torch.optim.AdamW (fused) run in fp32 on the same gradients, plus one fp32 ulp of the largest
  weight. And every bf16 weight against its master rounded to nearest even: no mismatch allowed.
- `lm`: the Transformer LM trained `steps` steps through lmperf.train.step under bf16 autocast
  (random tokens, fresh each step), optimizer 'master' against 'fused' (fp32 weights: what
  autocast training does without it), and the same model and tokens trained in float64 (its loss
  in fp32, as every step's). After the first step ours and fused agree to 8 fp32 ulps of each
  parameter's largest weight (AdamW's scalars round apart in the two kernels); after the last,
  the RMS of ours - fused over all parameters is at most that of fused - float64 (the autocast
  recipe's own error): later steps' bf16 copies may round apart, the two must stay closer to
  each other than to exact arithmetic.
"""
from __future__ import annotations

import itertools
import math
import random

from lmperf import stats
from lmperf.bench import cli, jobs

FP32_ULP = 2.0**-23  # at 1.0
MODEL_DIMS = ("d_model", "d_ff", "n_layers", "n_heads", "vocab_size")
# what the correctness table names the kernel and its dtypes by
KERNEL = {"impl": "triton", "dtype": "bf16 weights, fp32 masters"}


def check_cases(spec: dict) -> list[dict]:
    cases = [{**KERNEL, "kind": "float64", "steps": spec["steps"], "lr": spec["lr"],
              "weight_decay": spec["weight_decay"], "case_id": f"float64-steps{spec['steps']}"}]
    for size, micro, compiled in itertools.product(spec["models"], spec["micro_batches"], spec["compile"]):
        case = {**KERNEL, "kind": "lm", "steps": spec["steps"], "size": size, "micro_batches": micro,
                "compile": compiled, "context": spec["context"], "batch_size": spec["batch_size"],
                **spec["models"][size], "vocab_size": spec["vocab_size"]}
        case["case_id"] = f"lm-{size}-mb{micro}-{'compiled' if compiled else 'eager'}-steps{spec['steps']}"
        cases.append(case)
    return cases


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning: the correctness check, study `check`)."""
    return check_cases(spec)


def _row(metric: str, value: float, tolerance: float, seed: int, torch_err: float = math.nan) -> dict:
    row = dict(stats.summarize(metric, "abs", [value]), std=math.nan)
    row.update(torch_err=torch_err, tolerance=tolerance, passed=bool(value <= tolerance), seed=seed)
    return row


def awkward_shapes(block: int) -> list[tuple[int, ...]]:
    """Weight shapes around the kernel's chunk of `block` elements (1-d: a bias)."""
    return [(3, 5), (block // 8, 8), (block + 1,), (3, block // 2 + 7), (1, 1)]


def check_float64(case: dict, seed: int, device: str) -> list[dict]:
    import torch
    from torch import nn
    from lmperf.kernels import adamw_master

    gen = torch.Generator(device=device).manual_seed(seed)
    holder = nn.ModuleList()  # each weight as a Linear's: the weights the optimizer takes
    for shape in awkward_shapes(adamw_master.BLOCK):
        holder.append(nn.Linear(1, 1, bias=False, device=device))
        holder[-1].weight = nn.Parameter(torch.randn(shape, generator=gen, device=device))
    start = [layer.weight.detach().clone() for layer in holder]
    fp32 = [p.clone().requires_grad_() for p in start]
    lr, wd = case["lr"], case["weight_decay"]
    torch_adamw = torch.optim.AdamW(fp32, lr=lr, weight_decay=wd, fused=True)
    ours = adamw_master.MasterWeightAdamW(holder, lr=lr, weight_decay=wd)
    exact = [p.double() for p in start]
    m = [torch.zeros_like(p) for p in exact]
    v = [torch.zeros_like(p) for p in exact]
    (beta1, beta2), eps = ours.betas, ours.eps
    for t in range(1, case["steps"] + 1):
        grads = [torch.randn(p.shape, generator=gen, device=device).to(torch.bfloat16) for p in start]
        for w, p, g in zip(ours.weights, fp32, grads):
            w.grad, p.grad = g.clone(), g.float()
        ours.step()
        torch_adamw.step()
        for i, g in enumerate(grads):  # AdamW in float64, PyTorch's formula
            g = g.double()
            exact[i] = exact[i] - lr * wd * exact[i]
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            exact[i] = exact[i] - lr / (1 - beta1**t) * m[i] / (v[i].sqrt() / math.sqrt(1 - beta2**t) + eps)
    masters = ours.master_weights()
    err = max((a.double() - b).abs().max().item() for a, b in zip(masters, exact))
    torch_err = max((a.detach().double() - b).abs().max().item() for a, b in zip(fp32, exact))
    largest = max(b.abs().max().item() for b in exact)
    mismatches = sum(int((w != a.to(torch.bfloat16)).sum()) for w, a in zip(ours.weights, masters))
    return [_row("master_vs_float64_max_abs_err", err, 2 * torch_err + FP32_ULP * largest, seed, torch_err),
            _row("bf16_weight_not_nearest_count", mismatches, 0, seed)]


def check_lm(case: dict, seed: int, device: str) -> list[dict]:
    import contextlib
    import torch
    from lmperf import train

    setup_case = {"context": case["context"], "attention": "plain", "mode": "train", "dtype": "bf16",
                  "compile": case["compile"], "batch_size": case["batch_size"],
                  "micro_batches": case["micro_batches"]}
    dims = {k: case[k] for k in MODEL_DIMS}
    runs = {impl: train.setup({**setup_case, "optimizer": impl}, dims, device) for impl in ("fused", "master")}
    ours = runs["master"].optimizer
    exact_model = train.build_model(runs["fused"].cfg, device).double()  # the same start (seeded)
    exact_opt = torch.optim.AdamW(exact_model.parameters(), lr=ours.lr, betas=ours.betas, eps=ours.eps,
                                  weight_decay=ours.weight_decay)
    gen = torch.Generator(device=device).manual_seed(seed)
    rows_per_step = case["batch_size"] * case["micro_batches"]
    first = None
    for step in range(case["steps"]):
        tokens = torch.randint(runs["fused"].cfg.vocab_size, (rows_per_step, case["context"] + 1), generator=gen,
                               device=device)
        x, y = tokens[:, :-1], tokens[:, 1:]
        for run in runs.values():
            train.step(run.model, run.optimizer, x, y, run.autocast, micro_batches=case["micro_batches"])
        train.step(exact_model, exact_opt, x, y, contextlib.nullcontext(), micro_batches=case["micro_batches"])
        if step == 0:
            first = _step_one(runs, ours, seed)
    ref, mine = _fp32_parameters(runs["fused"].model), _fp32_parameters(runs["master"].model, ours)
    exact = [p.detach() for p in exact_model.parameters()]
    rms = lambda pairs: math.sqrt(sum(float(((a.double() - b.double()) ** 2).sum()) for a, b in pairs)
                                  / sum(a.numel() for a, _ in pairs))
    recipe_err = rms(list(zip(ref, exact)))
    return [first, _row(f"after_{case['steps']}_steps_vs_fused_rms_err", rms(list(zip(mine, ref))), recipe_err,
                        seed, recipe_err)]


def _fp32_parameters(model, master=None) -> list:
    """The model's parameters in order, fp32: a master-weight optimizer's masters for its weights."""
    masters = {id(w): m for w, m in zip(master.weights, master.master_weights())} if master else {}
    return [masters.get(id(p), p.detach()) for p in model.parameters()]


def _step_one(runs, ours, seed: int) -> dict:
    """After the first step: the worst parameter's max |ours - fused| against 8 fp32 ulps of its
    largest weight."""
    pairs = zip(_fp32_parameters(runs["master"].model, ours), _fp32_parameters(runs["fused"].model))
    errors = [((a - b).abs().max().item(), 8 * FP32_ULP * b.abs().max().item()) for a, b in pairs]
    err, tolerance = max(errors, key=lambda e: e[0] / e[1] if e[1] else (math.inf if e[0] else 0.0))
    return _row("step1_vs_fused_max_abs_err", err, tolerance, seed)


def measure_check(case: dict) -> list[dict]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    seed = random.randrange(2**31)  # fresh inputs every run; the seed is kept to reproduce them
    torch.manual_seed(seed)
    check = {"float64": check_float64, "lm": check_lm}[case["kind"]]
    return check(case, seed, device)


def main(argv=None):
    args = cli.bench_args(__doc__, argv, studies=("check",), options=jobs.options)
    jobs.run(section="adamw_master", study=args.study, cases=check_cases(args.spec), measure=measure_check,
             args=args, fingerprint={"spec": args.spec}, parallel=True)  # --workers: cases side by side


if __name__ == "__main__":
    main()
