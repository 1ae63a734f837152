"""End-to-end timings of the Transformer LM: forward only, or a training step timed per phase
(forward, backward, optimizer). One study and one model size per call. The ladder study (one
change a rung, from the assignment's setting to the GPU's limit) is built in bench/ladder.py.

    python -m lmperf.bench.e2e --spec '{...}' --size small --out results/cpu/e2e/variants/small.csv --hw cpu
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import json

from lmperf import hardware
from lmperf.bench import common, timing

DTYPES = ("fp32", "bf16")
MODES = ("forward", "train")
# AdamW's implementation: PyTorch's default on CUDA, one kernel, or one kernel on fp32 master
# weights that writes bf16 nn.Linear weights (kernels/adamw_master.py; bf16 autocast only)
OPTIMIZERS = ("foreach", "fused", "master")

def study_cases(spec: dict, size: str) -> list[dict]:
    """The study's grid for one model size: the product of its lists, as data."""
    grid = spec["grid"]
    cases = []
    for context, dtype, compiled, mode, warmup, optimizer in itertools.product(
            grid["contexts"], grid["dtypes"], grid["compile"], grid["modes"], grid["warmup"],
            grid.get("optimizers", ["foreach"])):
        case = {"size": size, "context": context, "dtype": dtype, "compile": bool(compiled),
                "mode": mode, "warmup": warmup, "batch_size": spec["batch_size"],
                "timed_steps": spec["timed_steps"], "attention": spec.get("attention", "plain"),
                "optimizer": optimizer}
        case["case_id"] = (f"{size}-ctx{context}-{dtype}-{'compiled' if compiled else 'eager'}"
                           f"-{mode}-warmup{warmup}" + ("" if optimizer == "foreach" else f"-{optimizer}"))
        cases.append(case)
    return cases

def compile_blocks(model) -> None:
    """torch.compile each Transformer block (regional compilation). The blocks share one
    compiled graph, so compile time does not grow with depth; embedding, final norm and head stay
    eager. PyTorch's recipe for models made of repeated blocks."""
    for block in model.blocks:
        block.compile()

def checkpoint_blocks(model, every: int) -> int:
    """Activation checkpointing on every `every`-th Transformer block (blocks 0, every, 2*every,
    ...; none for 0): such a block keeps only its input for backward and recomputes the rest
    there. Call before compile_blocks (the compiled block then traces the checkpoint). Calling it
    again re-chooses the blocks. Returns how many blocks are checkpointed."""
    import torch.utils.checkpoint

    def checkpointed(block, *args):
        return torch.utils.checkpoint.checkpoint(type(block).forward, block, *args, use_reentrant=False)

    n = 0
    for i, block in enumerate(model.blocks):
        block.__dict__.pop("forward", None)  # back to Block.forward
        if every and i % every == 0:
            block.forward = functools.partial(checkpointed, block)
            n += 1
    return n


def make_optimizer(model, impl: str):
    """AdamW (lr 1e-4, PyTorch's other defaults) in the implementation `impl`: 'foreach' (PyTorch's
    default on CUDA: a few kernels per parameter group, with temporaries), 'fused' (one kernel)
    or 'master' (MasterWeightAdamW: the nn.Linear weights become bf16, with fp32 master weights in
    the optimizer; the same math as bf16 autocast on fp32 weights, without its casts)."""
    import torch

    if impl not in OPTIMIZERS:
        raise ValueError(f"optimizer={impl!r}; choose one of {OPTIMIZERS}")
    if impl == "master":
        from lmperf.kernels.adamw_master import MasterWeightAdamW
        return MasterWeightAdamW(model, lr=1e-4)
    return torch.optim.AdamW(model.parameters(), lr=1e-4, **{impl: True})


@contextlib.contextmanager
def matmul_precision(tf32: bool):
    """fp32 matmuls as TF32 on tensor cores ('high') inside the block when `tf32`, else PyTorch's
    default ('highest'); the previous setting is restored after."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def setup(case: dict, model_dims: dict):
    """Model, optimizer (training only), batch and autocast context of one case, on the device."""
    import torch
    from lmperf.model import ModelConfig, TransformerLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if case.get("optimizer") == "master" and case["dtype"] != "bf16":
        raise ValueError(f"optimizer 'master' keeps bf16 weights for bf16 autocast; dtype is {case['dtype']!r}")
    cfg = ModelConfig(**model_dims, context_length=case["context"], attention=case["attention"])
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the device: a 3B model is slow to init on a CPU
        model = TransformerLM(cfg)
    optimizer = (make_optimizer(model, case.get("optimizer", "foreach"))
                 if case["mode"] == "train" else None)
    checkpoint_blocks(model, case.get("checkpoint_every", 0))
    if case["compile"]:
        compile_blocks(model)
    autocast = (torch.autocast(device_type=device, dtype=torch.bfloat16)
                if case["dtype"] == "bf16" else contextlib.nullcontext())
    # micro_batches > 1 (gradient accumulation): that many batches of batch_size a step
    rows = case["batch_size"] * case.get("micro_batches", 1)
    tokens = torch.randint(cfg.vocab_size, (rows, case["context"] + 1), device=device)
    return cfg, model, optimizer, tokens[:, :-1], tokens[:, 1:], autocast

def step(model, optimizer, inputs, targets, autocast, around, micro_batches: int = 1) -> None:
    """One forward pass (mode forward, optimizer None) or training step, each phase inside
    `around(phase)`: a timer, a profiler, or both. Phases are also named ranges (NVTX). With
    micro_batches = k the batch is split in k along its first dimension, forward and backward
    run once per part (gradients accumulate, each loss scaled by 1/k: the mean over the whole
    batch), then the optimizer steps once; `around` sees each phase k times."""
    import torch
    from lmperf.ranges import annotate

    if optimizer is None:
        with around("forward"), annotate("phase.forward"), torch.no_grad(), autocast:
            model(inputs)
        return
    if hasattr(optimizer, "accumulate"):  # MasterWeightAdamW: micro-batches' gradients into fp32 sums as they come
        optimizer.accumulate = micro_batches > 1
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        with around("forward"), annotate("phase.forward"):
            with autocast:
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
                if micro_batches > 1:
                    loss = loss / micro_batches
        with around("backward"), annotate("phase.backward"):
            loss.backward()
    with around("optimizer"), annotate("phase.optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

def measure(case: dict, model_dims: dict) -> list[dict]:
    with matmul_precision(case.get("tf32", False)):
        return time_steps(case, *setup(case, model_dims))


def peak_key(case: dict) -> str:
    """Which peak of hardware.PEAK_TFLOPS a case's MFU is against: its dtype, or 'tf32'."""
    return "tf32" if case["dtype"] == "fp32" and case.get("tf32") else case["dtype"]


def time_steps(case: dict, cfg, model, optimizer, inputs, targets, autocast) -> list[dict]:
    """Warm-up steps, then timed steps of a set-up case: the rows of its metrics."""
    import torch
    from lmperf.model import count_parameters
    from lmperf.flops import flops_per_token

    device = inputs.device.type
    sync = timing.synchronizer()
    b, n = case["batch_size"], case["context"]

    def timed_step() -> dict:
        """Seconds per phase, the device synchronized after each."""
        times = {}

        @contextlib.contextmanager
        def timer(phase):  # a phase seen once per micro-batch: its times add up
            with timing.timed(sync) as t:
                yield
            times[phase] = times.get(phase, 0.0) + t.seconds
        step(model, optimizer, inputs, targets, autocast, timer, case.get("micro_batches", 1))
        return times

    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    first_step_s = None
    for _ in range(case["warmup"]):
        t = timed_step()
        first_step_s = first_step_s or sum(t.values())
    timed = [timed_step() for _ in range(case["timed_steps"])]
    first_step_s = first_step_s or sum(timed[0].values())

    phases = {p: [t[p] * 1e3 for t in timed] for p in timed[0]}
    step_ms = [sum(t.values()) * 1e3 for t in timed]
    tokens_per_step = b * n * case.get("micro_batches", 1)
    flops_per_step = flops_per_token(cfg, n, case["mode"]) * tokens_per_step
    rows = [common.summarize(f"{p}_ms", "ms", xs) for p, xs in phases.items()]
    rows.append(common.summarize("step_ms", "ms", step_ms))
    rows.append(common.summarize("tokens_per_s", "tokens/s", [tokens_per_step / (s / 1e3) for s in step_ms]))
    rows.append(common.summarize("tflops", "TFLOP/s", [flops_per_step / (s / 1e3) / 1e12 for s in step_ms]))
    peak = hardware.peak_tflops(torch.cuda.get_device_name(), peak_key(case)) if device == "cuda" else None
    if peak:
        row = common.summarize("mfu_pct", "%", [100 * flops_per_step / (s / 1e3) / 1e12 / peak for s in step_ms])
        row["peak_tflops"] = peak  # the dense datasheet peak of the case's dtype (hardware.py)
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
                   "grid (or, for the ladder study, 'ladder'), and the model dims under 'models'")
    args = p.parse_args(argv)
    common.check_environment(args)
    spec = json.loads(args.spec)
    if args.size not in spec["models"]:
        p.error(f"--size {args.size!r} is not among the spec's models {sorted(spec['models'])}")
    dims = spec["models"][args.size]
    if "ladder" in spec:  # the ladder study: its rungs, each with its extra rows (bench/ladder.py)
        import torch
        from lmperf.bench import ladder
        cases = ladder.cases(spec["ladder"], args.size, cuda=torch.cuda.is_available())
        run = lambda case: ladder.measure(case, dims, spec["ladder"])
    else:
        cases, run = study_cases(spec, args.size), lambda case: measure(case, dims)
    common.run_cases(section="e2e", study=args.study, cases=cases, measure=run, out_csv=args.out,
                     hw=args.hw, log_path=args.log, fingerprint={"spec": spec, "size": args.size})

if __name__ == "__main__":
    main()
