"""The ladder's choices by measured memory: of a rung's candidate settings (how many blocks to
checkpoint, how large a micro-batch), the first whose one training step peaks under a share of
the device's memory and whose timed steps (bench/e2e.py's time_steps) then run; every try is a
row. Without CUDA there is no peak to measure, and the last candidate (checkpointing) or the
first (micro-batches) is timed.
"""
from __future__ import annotations

import gc
import math

from lmperf import train
from lmperf.bench import common, e2e


def one_step_peak_mib(model, optimizer, inputs, targets, autocast, micro_batches: int = 1) -> float | None:
    """Peak allocated MiB of one training step with the optimizer's state in memory, None if it
    ran out of memory (freed again). AdamW allocates its moments at its first step, and every
    timed step has them: an optimizer without state takes a first, unmeasured step (a rung's
    first trial measured without them, 21.6 GB less for the 2.7B model, and its timed steps then
    ran out of memory)."""
    import torch

    try:
        if not optimizer.state:
            train.step(model, optimizer, inputs, targets, autocast, train.nothing, micro_batches)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        train.step(model, optimizer, inputs, targets, autocast, train.nothing, micro_batches)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    except torch.OutOfMemoryError:
        return None
    finally:
        optimizer.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()


def time_or_oom(case: dict, cfg, model, optimizer, inputs, targets, autocast) -> tuple[list[dict] | None, str]:
    """(rows, "") of e2e.time_steps, or (None, the message) where its steps ran out of memory,
    the failed steps' memory freed again."""
    import torch

    try:
        return e2e.time_steps(case, cfg, model, optimizer, inputs, targets, autocast), ""
    except torch.OutOfMemoryError as exc:
        message = common.classify_failure(exc)[1]
    # out of the except block: the failed steps' tensors are no longer referenced
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return None, message


def time_first_that_fits(tries: list[tuple[dict, dict, str]], memory_budget: float, cfg, model, optimizer,
                         inputs, targets, autocast) -> tuple[dict, list[dict], list[dict]]:
    """(case, rows of the tries, timed rows) of the first of `tries` that fits, each (case, the
    keys its rows carry, what it is in words), in order: the model set up for its case (its
    checkpointing), one step's
    peak under memory_budget x the device's memory, then its timed steps. A try whose peak is
    over the budget or whose timed steps run out of memory gives a row (its keys in it) and the
    next is tried; none fitting raises. Without CUDA there is no peak: the first is timed."""
    import torch

    cuda = torch.cuda.is_available()
    budget_mib = memory_budget * torch.cuda.get_device_properties(0).total_memory / 2**20 if cuda else math.inf
    rows = []
    for case, keys, what in tries:
        if case.get("checkpoint_every"):
            train.checkpoint_blocks(model, case["checkpoint_every"])
        if cuda:
            peak = one_step_peak_mib(model, optimizer, inputs, targets, autocast, case["micro_batches"])
            rows.append({**common.summarize("trial_peak_allocated_mib", "MiB", [math.nan if peak is None else peak]),
                         **keys, "message": "oom" if peak is None else
                         "" if peak <= budget_mib else f"over the budget of {budget_mib:,.0f} MiB"})
            if peak is None or peak > budget_mib:
                continue
        timed, message = time_or_oom(case, cfg, model, optimizer, inputs, targets, autocast)
        if timed is not None:
            return case, rows, timed
        value = float(next(iter(keys.values())))  # the try's own setting: k, or the micro-batch size
        rows.append({**common.summarize("timed_steps_oom", "setting", [value]), **keys,
                     "message": f"timed steps out of memory {what}: {message}"[:300]})
    raise torch.OutOfMemoryError(f"out of memory: none of {[what for _, _, what in tries]} fits under "
                                 f"{budget_mib:,.0f} MiB")


def time_checkpointed(case: dict, spec: dict, cfg, model, optimizer, inputs, targets, autocast) -> tuple[dict, list[dict]]:
    """(case, rows) of the checkpointing rung: every k-th block checkpointed for the first k of
    its candidates (fewest checkpointed blocks first) that fits (time_first_that_fits); without
    CUDA, the last candidate (the most memory saved)."""
    import torch

    candidates = [int(k) for k in case["checkpoint_candidates"].split(",")]
    if not torch.cuda.is_available():
        candidates = candidates[-1:]
    tries = [({**case, "checkpoint_every": k}, {"checkpoint_every": k}, f"at every {k}") for k in candidates]
    case, tried, timed = time_first_that_fits(tries, spec["checkpoint"]["memory_budget"], cfg, model, optimizer,
                                              inputs, targets, autocast)
    every = case["checkpoint_every"]
    return case, tried + [common.summarize("checkpoint_every", "blocks", [every]),
                          common.summarize("checkpointed_blocks", "blocks",
                                           [len(range(0, cfg.n_layers, every))])] + timed


def time_micro_batched(case: dict, spec: dict, cfg, model, optimizer, inputs, targets,
                       autocast) -> tuple[dict, list[dict]]:
    """(case, rows) of a rung with gradient accumulation: its global batch (batch_size x
    micro_batches sequences, the inputs) in micro-batches of the first of the candidate sizes
    (largest first) that fits (time_first_that_fits); the case returned has that size's
    batch_size and micro_batches."""
    global_batch = case["batch_size"] * case["micro_batches"]
    sizes = [int(s) for s in str(case["micro_batch_candidates"]).split(",")]
    tries = []
    for size in sizes:
        keys = {"batch_size": size, "micro_batches": global_batch // size}
        tries.append(({**case, **keys}, keys, f"in micro-batches of {size}"))
    case, tried, timed = time_first_that_fits(tries, spec["accumulate"].get("memory_budget", 0.9), cfg, model,
                                              optimizer, inputs, targets, autocast)
    return case, tried + [common.summarize("micro_batch_size", "sequences", [case["batch_size"]])] + timed
