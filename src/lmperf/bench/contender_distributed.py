"""A contender's DDP, FSDP or sharded optimizer against one process (bench/contenders.py's
`distributed` study): the assignment's correctness.

A small model (two linear layers around a GELU, a LayerNorm, fp32) is trained for a few AdamW
steps on a global batch split evenly over `procs` processes (Gloo, on the CPU), through the
contender's adapters; the same model from the same initial weights is trained in one process on
the whole batch. The contender is right when every weight equals the one-process weight within
fp32 rounding (max abs difference <= 1e-5). One row: `weights_max_abs_diff`, passed or not.
"""
from __future__ import annotations

import os
import tempfile

from lmperf.bench import common

TOLERANCE = 1e-5
DIM, HIDDEN, BATCH_PER_RANK = 16, 32, 4


def _model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(), torch.nn.LayerNorm(HIDDEN),
                               torch.nn.Linear(HIDDEN, DIM))


def _batches(steps: int, world: int):
    import torch
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(world * BATCH_PER_RANK, DIM, generator=gen), torch.randn(world * BATCH_PER_RANK, DIM, generator=gen))
            for _ in range(steps)]


def _reference(steps: int, world: int) -> dict:
    import torch
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in _batches(steps, world):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _train(contender, contract: str, rank: int, world: int, steps: int) -> dict:
    """This rank's training through the contender's adapters; the full weights it ends with."""
    import torch
    import torch.distributed as dist
    from lmperf import contenders
    model = _model()
    if contract == "ddp":
        wrapped = contender.adapter("get_ddp")(model)
        after = contender.adapter("ddp_on_after_backward")
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    elif contract == "fsdp":
        wrapped = contender.adapter("get_fsdp")(model)
        after = contender.adapter("fsdp_on_after_backward")
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    else:  # sharded_optimizer: gradients averaged here, the optimizer's state sharded by the contender
        wrapped = model
        opt = contender.adapter("get_sharded_optimizer")(model.parameters(), torch.optim.AdamW, lr=1e-2)

        def after(model, optimizer):
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
    for x, y in _batches(steps, world):
        shard = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(wrapped(x[shard]), y[shard]).backward()
        after(wrapped, opt)
        opt.step()
    if contract == "fsdp":
        full = contender.adapter("fsdp_gather_full_params")(wrapped)
        if not isinstance(full, dict):
            raise contenders.Wrong(f"fsdp_gather_full_params returned {type(full).__name__}, not a dict")
        return {name: t.detach().float().cpu() for name, t in full.items()}
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _rank(rank: int, world: int, case: dict, init_file: str, queue) -> None:
    """One process of the group: its weights, or its failure, to the queue."""
    import torch.distributed as dist
    from lmperf import contenders
    from lmperf.bench import failures
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        contender = contenders.load(case["contender"], case["source"])
        weights = _train(contender, case["contract"], rank, world, case["steps"])
        # as numpy arrays: torch would send tensors as shared-memory handles that die with this process
        queue.put((rank, "ok", {name: t.numpy().copy() for name, t in weights.items()}))
    except NotImplementedError as exc:
        queue.put((rank, "skipped", f"not implemented: an adapter of {case['contract']} raised "
                                    f"NotImplementedError" + (f" ({exc})" if str(exc) else "")))
    except failures.NotRun as exc:
        queue.put((rank, exc.status, str(exc)))
    except Exception as exc:
        queue.put((rank, "failed", failures.describe(exc)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _match(reference: dict, got: dict) -> dict:
    """`got`'s tensors by the reference's names (a wrapper may prefix them: 'module.0.weight')."""
    matched = {}
    for name in reference:
        hits = [g for g in got if g == name or g.endswith("." + name)]
        if len(hits) != 1:
            raise KeyError(name)
        matched[name] = got[hits[0]]
    return matched


def first_cause(bad: dict[int, tuple[str, str]]) -> tuple[int, tuple[str, str]]:
    """The rank whose (status, message) a case reports of those that did not train: a rank's own
    answer (`skipped`: an adapter raised NotImplementedError; `wrong`) before a `failed` one, which
    can be its consequence (a rank that leaves early breaks another's Gloo connection: "remote
    worker crashing"); the lowest rank among equals."""
    return min(bad.items(), key=lambda item: (item[1][0] == "failed", item[0]))


def measure(case: dict, contender) -> list[dict]:
    import multiprocessing
    import queue as queue_mod

    from lmperf import contenders
    world, steps = case["procs"], case["steps"]
    for name in contenders.CONTRACTS[case["contract"]]:
        contender.adapter(name)  # a missing adapter: a `skipped` row before any process starts
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="lmperf-contender-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank, args=(r, world, case, init_file, queue), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        results = {}
        try:
            while len(results) < world:
                try:
                    rank, status, payload = queue.get(timeout=5)
                    results[rank] = (status, payload)
                except queue_mod.Empty:
                    dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                    if dead:
                        raise contenders.Failed(f"rank {procs.index(dead[0])} died (exit code {dead[0].exitcode})")
        finally:
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
    bad = {r: (s, m) for r, (s, m) in results.items() if s != "ok"}
    if bad:
        rank, (status, message) = first_cause(bad)
        raise {"skipped": contenders.NotImplementedByContender, "wrong": contenders.Wrong}.get(
            status, contenders.Failed)(f"rank {rank}: {message}" if status != "skipped" else message)
    reference = _reference(steps, world)
    worst = 0.0
    import torch
    for rank, (_, arrays) in sorted(results.items()):
        weights = {name: torch.from_numpy(a) for name, a in arrays.items()}
        try:
            got = _match(reference, weights)
        except KeyError as exc:
            raise contenders.Wrong(f"rank {rank}: no weight named like {exc.args[0]!r} among "
                                   f"{sorted(weights)[:6]}") from None
        for name, ref in reference.items():
            if tuple(got[name].shape) != tuple(ref.shape):
                raise contenders.Wrong(f"rank {rank}: {name} has shape {tuple(got[name].shape)}, expected {tuple(ref.shape)}")
            worst = max(worst, float((got[name].double() - ref.double()).abs().max()))
    row = common.summarize("weights_max_abs_diff", "abs", [worst])
    row.update(passed=worst <= TOLERANCE, tolerance=TOLERANCE,
               message=f"{world} processes (Gloo) against one, {steps} AdamW steps")
    return [row]
