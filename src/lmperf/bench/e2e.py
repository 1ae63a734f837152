"""End-to-end timings of the Transformer LM: forward only, or a training step timed per phase
(forward, backward, optimizer). One study and one model size per call.

    python -m lmperf.bench.e2e --spec '{...}' --size small --out results/cpu/e2e/variants/small.csv --hw cpu
"""
from __future__ import annotations

import contextlib
import itertools
import json
import time

from lmperf import hardware
from lmperf.bench import common

DTYPES = ("fp32", "bf16")
MODES = ("forward", "train")


def study_cases(spec: dict, size: str) -> list[dict]:
    """The study's grid for one model size: the product of its lists, as data."""
    grid = spec["grid"]
    cases = []
    for context, dtype, compiled, mode, warmup in itertools.product(
            grid["contexts"], grid["dtypes"], grid["compile"], grid["modes"], grid["warmup"]):
        case = {"size": size, "context": context, "dtype": dtype, "compile": bool(compiled),
                "mode": mode, "warmup": warmup, "batch_size": spec["batch_size"],
                "timed_steps": spec["timed_steps"], "attention": spec.get("attention", "plain")}
        case["case_id"] = (f"{size}-ctx{context}-{dtype}-{'compiled' if compiled else 'eager'}"
                           f"-{mode}-warmup{warmup}")
        cases.append(case)
    return cases


def compile_blocks(model) -> None:
    """torch.compile each Transformer block (regional compilation). The blocks share one
    compiled graph, so compile time does not grow with depth; embedding, final norm and head stay
    eager. PyTorch's recipe for models made of repeated blocks."""
    for block in model.blocks:
        block.compile()


def measure(case: dict, model_dims: dict) -> list[dict]:
    import torch
    from lmperf.model import ModelConfig, TransformerLM, count_parameters
    from lmperf.flops import flops_per_token

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    cfg = ModelConfig(**model_dims, context_length=case["context"], attention=case["attention"])
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the device: a 3B model is slow to init on a CPU
        model = TransformerLM(cfg)
    train = case["mode"] == "train"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if train else None
    if case["compile"]:
        compile_blocks(model)
    autocast = (torch.autocast(device_type=device, dtype=torch.bfloat16)
                if case["dtype"] == "bf16" else contextlib.nullcontext())
    b, n = case["batch_size"], case["context"]
    tokens = torch.randint(cfg.vocab_size, (b, n + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def forward_step() -> dict:
        t0 = time.perf_counter()
        with torch.no_grad(), autocast:
            model(inputs)
        sync()
        return {"forward": time.perf_counter() - t0}

    def train_step() -> dict:
        t0 = time.perf_counter()
        with autocast:
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        t3 = time.perf_counter()
        return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2}

    step = train_step if train else forward_step
    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    first_step_s = None
    for _ in range(case["warmup"]):
        t = step()
        first_step_s = first_step_s or sum(t.values())
    timed = [step() for _ in range(case["timed_steps"])]
    first_step_s = first_step_s or sum(timed[0].values())

    phases = {p: [t[p] * 1e3 for t in timed] for p in timed[0]}
    step_ms = [sum(t.values()) * 1e3 for t in timed]
    tokens_per_step = b * n
    flops_per_step = flops_per_token(cfg, n, case["mode"]) * tokens_per_step
    rows = [common.summarize(f"{p}_ms", "ms", xs) for p, xs in phases.items()]
    rows.append(common.summarize("step_ms", "ms", step_ms))
    rows.append(common.summarize("tokens_per_s", "tokens/s", [tokens_per_step / (s / 1e3) for s in step_ms]))
    rows.append(common.summarize("tflops", "TFLOP/s", [flops_per_step / (s / 1e3) / 1e12 for s in step_ms]))
    peak = hardware.peak_tflops(torch.cuda.get_device_name(), case["dtype"]) if device == "cuda" else None
    if peak:
        row = common.summarize("mfu_pct", "%", [100 * flops_per_step / (s / 1e3) / 1e12 / peak for s in step_ms])
        row["message"] = f"peak {peak:g} TFLOP/s ({case['dtype']} dense, datasheet)"
        rows.append(row)
    rows.append(common.summarize("first_step_ms", "ms", [first_step_s * 1e3]))
    rows.append(common.summarize("parameters", "count", [count_parameters(cfg)]))
    if device == "cuda":
        rows.append(common.summarize("peak_allocated_mib", "MiB", [torch.cuda.max_memory_allocated() / 2**20]))
    return rows


def main(argv=None):
    p = common.base_parser(__doc__)
    p.add_argument("--study", required=True, help="study name (variants, warmup, context, ...)")
    p.add_argument("--size", required=True, help="model size name")
    p.add_argument("--spec", required=True, help="the study's spec as JSON: batch_size, timed_steps, "
                   "grid, and the model dims under 'models'")
    args = p.parse_args(argv)
    common.check_environment(args)
    spec = json.loads(args.spec)
    if args.size not in spec["models"]:
        p.error(f"--size {args.size!r} is not among the spec's models {sorted(spec['models'])}")
    dims = spec["models"][args.size]
    cases = study_cases(spec, args.size)
    common.run_cases(section="e2e", study=args.study, cases=cases,
                     measure=lambda case: measure(case, dims), out_csv=args.out, hw=args.hw,
                     log_path=args.log, fingerprint={"spec": spec, "size": args.size})


if __name__ == "__main__":
    main()
