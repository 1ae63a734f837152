"""Device timers, one place for every benchmark: wall-clock time of work on the device with the
device synchronized at both ends (whole-model steps, eager attention), and do_bench's quantiles
for kernels.

    sync = timing.synchronizer()           # torch.cuda.synchronize on a GPU, a no-op on a CPU
    with timing.timed(sync) as t: work()   # t.seconds after the block
    median, q20, q80 = timing.do_bench_quantiles(fn, warmup_ms=25, rep_ms=100)
    median, q20, q80 = timing.do_bench_cudagraph_quantiles(fn, rep_ms=100)  # GPU time, no host
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

QUANTILES = (0.5, 0.2, 0.8)  # do_bench's median and the spread the rows record


def synchronizer() -> Callable[[], None]:
    """A function that waits for the device's queued work: torch.cuda.synchronize, or nothing
    without a GPU."""
    import torch
    return torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def is_device_work(e) -> bool:
    """A profiler key_averages() entry for GPU work (a kernel, copy or memset), not a CPU-side
    operator or runtime call."""
    return str(e.device_type) == "DeviceType.CUDA" and e.self_device_time_total > 0


class Elapsed:
    seconds: float = float("nan")


@contextlib.contextmanager
def timed(sync: Callable[[], None], start_synced: bool = False):
    """Time a block: the clock stops after `sync()`, so queued device work is counted. With
    start_synced, also synchronize before starting the clock (else the caller has)."""
    if start_synced:
        sync()
    out = Elapsed()
    t0 = time.perf_counter()
    yield out
    sync()
    out.seconds = time.perf_counter() - t0


def do_bench_quantiles(fn: Callable, warmup_ms: int, rep_ms: int, **kwargs) -> tuple[float, float, float]:
    """(median, 20% quantile, 80% quantile) in ms of `fn` by `triton.testing.do_bench` (an L2
    flush before each repeat); kwargs go to do_bench (e.g. grad_to_none)."""
    import triton.testing
    median, q20, q80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=list(QUANTILES), **kwargs)
    return float(median), float(q20), float(q80)


def do_bench_cudagraph_quantiles(fn: Callable, rep_ms: int, **kwargs) -> tuple[float, float, float]:
    """(median, 20% quantile, 80% quantile) in ms of `fn` replayed as a CUDA graph by
    `triton.testing.do_bench_cudagraph` (no host time, no L2 flush): what `fn` costs the GPU
    when the host runs ahead of it, as it does in a training step."""
    import triton.testing
    median, q20, q80 = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, quantiles=list(QUANTILES), **kwargs)
    return float(median), float(q20), float(q80)
