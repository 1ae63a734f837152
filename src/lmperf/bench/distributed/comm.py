"""The communication a data-parallel step waits for: the collective (NCCL) kernel time of a
profiled step that no compute kernel overlaps, from kernel intervals (ddp.py's measurement)."""
from __future__ import annotations

from typing import Callable


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two unions (each sorted and disjoint)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def comm_exposure(kernels: list[tuple[str, float, float]]) -> dict:
    """From GPU kernel intervals (name, start, end), in us: time with a collective (NCCL kernel)
    running, time with any other kernel running, and the collective time no other kernel
    overlaps, i.e. the communication the step waits for."""
    comm = union([(s, e) for name, s, e in kernels if "nccl" in name.lower()])
    compute = union([(s, e) for name, s, e in kernels if "nccl" not in name.lower()])
    return {"comm_us": length(comm), "compute_us": length(compute),
            "exposed_comm_us": length(comm) - overlap(comm, compute)}


def profiled_comm(step: Callable, steps: int) -> dict:
    """Communication and compute kernel time per step, from torch.profiler over `steps` steps."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == DeviceType.CUDA]
    return {k.replace("_us", "_ms"): v / 1e3 / steps for k, v in comm_exposure(kernels).items()}
