"""One training step of the Transformer LM, the only one in lmperf, and the model, optimizer and
batch it runs on. Every study steps through `step`: the end-to-end timings and the ladder (whose
FLOP count runs it on fake tensors), the kernel-level profile, the memory recorder and the
data-parallel step of the distributed section.

    cfg, model, optimizer, inputs, targets, autocast = setup(case, dims)
    step(model, optimizer, inputs, targets, autocast, around, micro_batches=1, reduce=None)

A step is, per micro-batch, forward with the loss (`loss`, under autocast) and backward; then,
for data parallelism by hand, the gradient reduce; then the optimizer. Each phase runs inside
`around(phase)` (a timer, a profiler, a memory probe) and is a named range (NVTX). With an
optimizer of None the step is one forward pass under no_grad (a forward-only case).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from lmperf.model import ModelConfig, TransformerLM
from lmperf.ranges import annotate

LR = 1e-4
# AdamW's implementation: PyTorch's default on CUDA, one kernel, or one kernel on fp32 master
# weights that writes bf16 nn.Linear weights (kernels/adamw_master.py; bf16 autocast only)
OPTIMIZERS = ("foreach", "fused", "master")


def nothing(phase: str):
    """The `around` of a step that nobody watches."""
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------
# The model, optimizer and batch of a case


class Setup(NamedTuple):
    cfg: ModelConfig
    model: torch.nn.Module
    optimizer: object | None  # None: forward only
    inputs: torch.Tensor
    targets: torch.Tensor
    autocast: contextlib.AbstractContextManager


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_model(cfg: ModelConfig, device: str, seed: int = 0) -> TransformerLM:
    """The model with the same weights on every call and every rank (seeded: `seed`, 0 unless a
    case sets `init_seed`), initialised on the device: a 3B model is slow to initialise on a CPU."""
    torch.manual_seed(seed)
    with torch.device(device):
        return TransformerLM(cfg)


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


def adamw_options(impl: str) -> dict:
    """torch.optim.AdamW's arguments for the implementation `impl` ('foreach' or 'fused'):
    lr 1e-4, PyTorch's other defaults."""
    if impl not in OPTIMIZERS or impl == "master":
        raise ValueError(f"optimizer={impl!r}; torch.optim.AdamW takes one of {OPTIMIZERS[:2]}")
    return {"lr": LR, impl: True}


def make_optimizer(model, impl: str):
    """AdamW (lr 1e-4, PyTorch's other defaults) in the implementation `impl`: 'foreach' (PyTorch's
    default on CUDA: a few kernels per parameter group, with temporaries), 'fused' (one kernel)
    or 'master' (MasterWeightAdamW: the nn.Linear weights become bf16, with fp32 master weights in
    the optimizer; the same math as bf16 autocast on fp32 weights, without its casts)."""
    if impl not in OPTIMIZERS:
        raise ValueError(f"optimizer={impl!r}; choose one of {OPTIMIZERS}")
    if impl == "master":
        from lmperf.kernels.adamw_master import MasterWeightAdamW
        return MasterWeightAdamW(model, lr=LR)
    return torch.optim.AdamW(model.parameters(), **adamw_options(impl))


def autocast(dtype: str, device_type: str):
    """bf16 autocast on the device for dtype 'bf16', nothing for 'fp32'."""
    if dtype == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def matmul_precision(tf32: bool):
    """fp32 matmuls as TF32 on tensor cores ('high') inside the block when `tf32`, else PyTorch's
    default ('highest'); the previous setting is restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def check_optimizer(impl: str, dtype: str) -> None:
    """MasterWeightAdamW keeps bf16 weights: it trains under bf16 autocast only."""
    if impl == "master" and dtype != "bf16":
        raise ValueError(f"optimizer 'master' keeps bf16 weights for bf16 autocast; dtype is {dtype!r}")


def random_tokens(cfg: ModelConfig, rows: int, context: int, device: str):
    """(inputs, targets) of `rows` random sequences: the targets are the inputs shifted by one."""
    tokens = torch.randint(cfg.vocab_size, (rows, context + 1), device=device)
    return tokens[:, :-1], tokens[:, 1:]


def setup(case: dict, model_dims: dict, device: str | None = None) -> Setup:
    """Model, optimizer (training only), batch and autocast context of one case, on the device.
    The case's keys: context, dtype, mode (train | forward), compile, attention, batch_size, and
    optionally optimizer (OPTIMIZERS), checkpoint_every and micro_batches (the batch is then
    micro_batches x batch_size sequences, split again by `step`)."""
    device = device or default_device()
    check_optimizer(case.get("optimizer", "foreach"), case["dtype"])
    cfg = ModelConfig(**model_dims, context_length=case["context"], attention=case["attention"])
    model = build_model(cfg, device, case.get("init_seed", 0))
    optimizer = (make_optimizer(model, case.get("optimizer", "foreach"))
                 if case["mode"] == "train" else None)
    checkpoint_blocks(model, case.get("checkpoint_every", 0))
    if case["compile"]:
        compile_blocks(model)
    rows = case["batch_size"] * case.get("micro_batches", 1)
    return Setup(cfg, model, optimizer, *random_tokens(cfg, rows, case["context"], device),
                 autocast(case["dtype"], torch.device(device).type))


# ---------------------------------------------------------------------------------------------
# The step


def loss(model, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The training loss: mean cross-entropy of the next-token logits against the targets,
    computed in fp32 (under autocast the logits are bf16)."""
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def gradient_sync(model, enabled: bool) -> None:
    """Whether a data-parallel engine communicates the gradients in the next backward: DDP
    (`require_backward_grad_sync`, what its no_sync() sets) and FSDP2
    (`set_requires_gradient_sync`). Off for all micro-batches but the last, whose backward then
    reduces the sum; a model without an engine has nothing to switch."""
    if hasattr(model, "require_backward_grad_sync"):
        model.require_backward_grad_sync = enabled
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)


def step(model, optimizer, inputs, targets, autocast, around: Callable = nothing, micro_batches: int = 1,
         reduce: Callable[[], None] | None = None) -> None:
    """One forward pass (optimizer None) or training step, each phase inside `around(phase)`.
    With micro_batches = k the batch is split in k along its first dimension, forward and
    backward run once per part (gradients accumulate, each loss scaled by 1/k: the mean over the
    whole batch), then `reduce` (the explicit gradient all-reduce of data parallelism by hand,
    phase 'allreduce', where given) and one optimizer step; `around` sees forward and backward k
    times."""
    if optimizer is None:
        with around("forward"), annotate("phase.forward"), torch.no_grad(), autocast:
            model(inputs)
        return
    if hasattr(optimizer, "accumulate"):  # MasterWeightAdamW: micro-batches' gradients into fp32 sums as they come
        optimizer.accumulate = micro_batches > 1
    parts = list(zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)))
    for i, (x, y) in enumerate(parts):
        if micro_batches > 1:
            gradient_sync(model, i == len(parts) - 1)
        with around("forward"), annotate("phase.forward"):
            with autocast:
                part_loss = loss(model, x, y)
                if micro_batches > 1:
                    part_loss = part_loss / micro_batches
        with around("backward"), annotate("phase.backward"):
            part_loss.backward()
    if reduce is not None:
        with around("allreduce"), annotate("phase.allreduce"):
            reduce()
    with around("optimizer"), annotate("phase.optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
