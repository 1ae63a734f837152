"""The rank protocol of the distributed section: who this process is in the job torchrun started,
and how rank 0 hands each case to the other ranks and gathers their results over a Gloo control
group. Rank 0 runs the harness (journal, failures as rows, the atomic CSV: loop.run_cases);
every rank measures."""
from __future__ import annotations

import contextlib
import datetime as dt
import os
from dataclasses import dataclass
from typing import Callable

from lmperf import failures
from lmperf.bench import loop


@dataclass
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    nccl: bool = False          # every rank has a GPU of its own, so CUDA tensors go through NCCL
    gpus: int = 0               # GPUs this machine has
    control: object = None      # a Gloo group for Python objects (cases, outcomes)

    def broadcast(self, obj):
        if self.world == 1:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, obj) -> list:
        if self.world == 1:
            return [obj]
        import torch.distributed as dist
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def needs_gpus(self) -> str:
        return f"needs {self.world} GPUs (this machine has {self.gpus})"


def init_ranks(timeout_s: float) -> Ranks:
    """Join the job torchrun started (WORLD_SIZE, RANK, LOCAL_RANK); a plain `python -m` call is
    a job of one process. CUDA tensors go through NCCL only where each rank has its own GPU."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        if gpus:
            torch.cuda.set_device(0)
        return Ranks(nccl=gpus >= 1, gpus=gpus)
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    nccl = gpus >= world
    # NCCL's kernels on high-priority streams: DDP's and FSDP2's collectives are scheduled ahead of
    # the backward's compute kernels as SMs free up (a 4-GPU DDP step 3% faster, tuning/distributed)
    os.environ.setdefault("TORCH_NCCL_HIGH_PRIORITY", "1")
    if nccl:
        torch.cuda.set_device(local)
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if nccl else "gloo",
                            timeout=dt.timedelta(seconds=timeout_s))
    return Ranks(rank, world, local, nccl, gpus, dist.new_group(backend="gloo"))


class RankFailure(failures.NotRun):
    """A case failed on some rank: its status (oom, error, skipped) and message become the row."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def run_everywhere(case: dict, ranks: Ranks, measure_local: Callable) -> list:
    """Run one case on this rank and gather every rank's result; any rank's failure is raised
    (the first failing rank's status and message), so no rank writes a row alone."""
    try:
        outcome = ("ok", measure_local(case, ranks))
    except Exception as exc:  # a failed case is data; keep only its text (not the frames' tensors)
        outcome = ("failed", failures.classify_failure(exc))
    outcomes = ranks.gather(outcome)
    for rank, (kind, result) in enumerate(outcomes):
        if kind == "failed":
            status, message = result
            raise RankFailure(status, message if status == "skipped" else f"rank {rank}: {message}")
    return [result for _, result in outcomes]


def lead(ranks: Ranks, measure_local: Callable, to_rows: Callable) -> Callable[[dict], list[dict]]:
    """Rank 0's measure(case) for run_cases: hand the case to every rank, run it, make rows."""
    def measure(case: dict) -> list[dict]:
        ranks.broadcast(case)
        return to_rows(case, run_everywhere(case, ranks, measure_local))
    return measure


def follow(ranks: Ranks, measure_local: Callable) -> None:
    """Ranks other than 0: run each case rank 0 hands out, until it sends None."""
    while (case := ranks.broadcast(None)) is not None:
        with contextlib.suppress(RankFailure):
            run_everywhere(case, ranks, measure_local)
        loop.clean_device()
