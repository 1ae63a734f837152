"""The ladder's choices by measured memory: of a rung's candidate settings (how many blocks to
checkpoint, how large a micro-batch), the first whose one training step peaks under a share of
the device's memory and whose timed steps (bench/e2e.py's time_steps) then run; every try is a
row. Without CUDA there is no peak to measure, and the last candidate (checkpointing) or the
first (micro-batches) is timed.

A micro-batch size is not tried where an earlier rung of the job, on the same settings but for
its context, ran out of memory (or over the budget) with micro-batches of no more tokens at no
longer a context: a step's memory does not shrink with more tokens or a longer context (the
weights, gradients and optimizer state are the same; activations grow with both). Its row says
which rung showed it. The fitting trial's steps are the first of the timed steps' warm-up steps:
the same step, compiled and with the optimizer's state.
"""
from __future__ import annotations

import gc
import math

from lmperf import failures, stats, train
from lmperf.bench import e2e


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


def time_or_oom(case: dict, cfg, model, optimizer, inputs, targets, autocast,
                idle: bool = True) -> tuple[list[dict] | None, str]:
    """(rows, "") of e2e.time_steps, or (None, the message) where its steps ran out of memory,
    the failed steps' memory freed again."""
    import torch

    try:
        return e2e.time_steps(case, cfg, model, optimizer, inputs, targets, autocast, idle=idle), ""
    except torch.OutOfMemoryError as exc:
        message = failures.classify_failure(exc)[1]
    # out of the except block: the failed steps' tensors are no longer referenced
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return None, message


def time_first_that_fits(tries: list[tuple[dict, dict, str]], memory_budget: float, cfg, model, optimizer,
                         inputs, targets, autocast, idle: bool = True) -> tuple[dict, list[dict], list[dict]]:
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
        trial_steps = 0
        if cuda:
            trial_steps = 1 if optimizer.state else 2  # one_step_peak_mib's steps
            peak = one_step_peak_mib(model, optimizer, inputs, targets, autocast, case["micro_batches"])
            rows.append({**stats.summarize("trial_peak_allocated_mib", "MiB", [math.nan if peak is None else peak]),
                         **keys, "message": "oom" if peak is None else
                         "" if peak <= budget_mib else f"over the budget of {budget_mib:,.0f} MiB"})
            if peak is None or peak > budget_mib:
                continue
        # the trial's steps were the first warm-up steps (at least one is left: first_step_ms)
        warm = {**case, "warmup": max(1, case["warmup"] - trial_steps)} if "warmup" in case else case
        timed, message = time_or_oom(warm, cfg, model, optimizer, inputs, targets, autocast, idle)
        if timed is not None:
            return case, rows, timed
        value = float(next(iter(keys.values())))  # the try's own setting: k, or the micro-batch size
        rows.append({**stats.summarize("timed_steps_oom", "setting", [value]), **keys,
                     "message": f"timed steps out of memory {what}: {message}"[:300]})
    raise torch.OutOfMemoryError(f"out of memory: none of {[what for _, _, what in tries]} fits under "
                                 f"{budget_mib:,.0f} MiB")


def time_checkpointed(case: dict, spec: dict, cfg, model, optimizer, inputs, targets, autocast,
                      idle: bool = True) -> tuple[dict, list[dict]]:
    """(case, rows) of the checkpointing rung: every k-th block checkpointed for the first k of
    its candidates (fewest checkpointed blocks first) that fits (time_first_that_fits); without
    CUDA, the last candidate (the most memory saved)."""
    import torch

    candidates = [int(k) for k in case["checkpoint_candidates"].split(",")]
    if not torch.cuda.is_available():
        candidates = candidates[-1:]
    tries = [({**case, "checkpoint_every": k}, {"checkpoint_every": k}, f"at every {k}") for k in candidates]
    case, tried, timed = time_first_that_fits(tries, spec["checkpoint"]["memory_budget"], cfg, model, optimizer,
                                              inputs, targets, autocast, idle)
    every = case["checkpoint_every"]
    return case, tried + [stats.summarize("checkpoint_every", "blocks", [every]),
                          stats.summarize("checkpointed_blocks", "blocks",
                                           [len(range(0, cfg.n_layers, every))])] + timed


# (settings, context, micro-batch size, rung name) of every micro-batch size that did not fit in
# this process's rungs: what a later rung need not try (module docstring)
DID_NOT_FIT: list[tuple[tuple, int, int, str]] = []
# the keys in which an accumulating rung and the longer contexts after it differ from each other
VARYING = frozenset({"context", "batch_size", "micro_batches", "rung", "name", "change", "case_id", "warmup",
                     "micro_batch_candidates", "checkpoint_candidates", "needs_cuda"})


def settings(case: dict) -> tuple:
    """What else a step's memory depends on: the case's keys but VARYING."""
    return tuple(sorted((k, str(v)) for k, v in case.items() if k not in VARYING))


def known_not_to_fit(case: dict, size: int) -> str:
    """Why micro-batches of `size` sequences at the case's context cannot fit (an earlier try of
    no more tokens a micro-batch at no longer a context, on the same settings, did not), or ""."""
    mine, context = settings(case), case.get("context")
    if context is None:
        return ""
    for other, c, s, rung in DID_NOT_FIT:
        if other == mine and c <= context and s * c <= size * context:
            return (f"not tried: {size} x {context:,} tokens a micro-batch need at least the memory of the "
                    f"{s} x {c:,} that did not fit in rung {rung}")
    return ""


def time_micro_batched(case: dict, spec: dict, cfg, model, optimizer, inputs, targets,
                       autocast, idle: bool = True) -> tuple[dict, list[dict]]:
    """(case, rows) of a rung with gradient accumulation: its global batch (batch_size x
    micro_batches sequences, the inputs) in micro-batches of the first of the candidate sizes
    (largest first) that fits (time_first_that_fits), past those known not to fit
    (known_not_to_fit: a row each); the case returned has that size's batch_size and
    micro_batches."""
    import torch

    global_batch = case["batch_size"] * case["micro_batches"]
    sizes = [int(s) for s in str(case["micro_batch_candidates"]).split(",")]
    tries, skipped = [], []
    for size in sizes:
        keys = {"batch_size": size, "micro_batches": global_batch // size}
        why = known_not_to_fit(case, size)
        if why:
            skipped.append({**stats.summarize("trial_peak_allocated_mib", "MiB", [math.nan]), **keys, "message": why})
        else:
            tries.append(({**case, **keys}, keys, f"in micro-batches of {size}"))
    if not tries:
        raise torch.OutOfMemoryError("out of memory: " + "; ".join(r["message"] for r in skipped))
    failed = []
    try:
        chosen, tried, timed = time_first_that_fits(tries, spec["accumulate"].get("memory_budget", 0.9), cfg,
                                                    model, optimizer, inputs, targets, autocast, idle)
    except torch.OutOfMemoryError:
        failed = [keys["batch_size"] for _, keys, _ in tries]
        raise
    else:  # a trial out of memory or over the budget, timed steps out of memory
        failed = [r["batch_size"] for r in tried if r["message"]]
    finally:
        if "context" in case:
            DID_NOT_FIT.extend((settings(case), case["context"], s, case.get("name", "")) for s in failed)
    return chosen, skipped + tried + [stats.summarize("micro_batch_size", "sequences", [chosen["batch_size"]])] + timed
