"""Honest timing of someone else's code: its timed outputs checked afterwards for a result
cached for the same input storage, and its times checked against what is possible: none under
the roofline floor of its FLOPs and bytes, and none under the device work that the profiler
records on every stream (work launched on another CUDA stream, which events on the caller's
stream never wait for) (lmperf.contenders; bench/flash_attention.py). Its outputs are held to
the contract as it runs by lmperf.guard."""
from __future__ import annotations

from typing import Callable

from lmperf.guard import check_output


# How far an output on the same storage may be from one on a fresh copy of the same contents
# (rounding: a kernel may pick another path for other addresses), times the output's scale
STALE_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def stale_tolerance(dtype) -> float:
    return STALE_TOLERANCE.get(str(dtype).removeprefix("torch."), 1e-2)


def stale_message(err: float, tol: float) -> str:
    return (f"stale result: after the inputs' contents changed in place, the output differs by {err:.3g} "
            f"from the output on a fresh copy of the same contents (tolerance {tol:.3g}): a result "
            f"cached for the same storage")


def stale_output(fn: Callable, q, k, v, is_causal: bool) -> str | None:
    """Why `fn`'s result is stale, or None. After `fn` has been called on q, k, v (as a timing
    loop calls it), their contents are changed in place (the same storage) and `fn` called again;
    its output must equal (to rounding) its output on a fresh copy of the new contents (new
    storage). An implementation that returns a result cached for the same storage is caught here;
    one that is merely wrong is not (the float64 check says so)."""
    import torch
    with torch.no_grad():
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        same_storage = fn(q, k, v, is_causal)
        fresh = fn(q.clone(), k.clone(), v.clone(), is_causal)
        check_output(fresh, q)  # NaN or inf: what a compiled call's guard leaves to here
        err = float((same_storage.double() - fresh.double()).abs().max())
        scale = max(1.0, float(fresh.double().abs().max()))
        tol = stale_tolerance(q.dtype) * scale
    return None if err <= tol else stale_message(err, tol)


def impossible_time(ms: float, flops: float, bytes_moved: float, gpu_name: str | None) -> str | None:
    """Why `ms` cannot be the time of `flops` and `bytes_moved` on this GPU, or None: under the
    roofline floor, the larger of the FLOPs at the dense bf16 peak and the bytes at the peak
    bandwidth (datasheets: lmperf.hardware). None where the GPU's peaks are unknown."""
    from lmperf import hardware
    peak = hardware.peak_tflops(gpu_name or "", "bf16")
    bandwidth = hardware.peak_bandwidth_tbs(gpu_name or "")
    if peak is None or bandwidth is None or not ms == ms:
        return None
    floor_ms = max(flops / (peak * 1e12), bytes_moved / (bandwidth * 1e12)) * 1e3
    if ms < floor_ms:
        return (f"impossible time: {ms:.4g} ms is under the roofline floor of {floor_ms:.4g} ms "
                f"({flops:.3g} FLOP at {peak:g} TFLOP/s, {bytes_moved:.3g} bytes at {bandwidth:g} TB/s on "
                f"{gpu_name}): not a speed-up; the timer did not see the work")
    return None


def device_busy_ms(call: Callable, calls: int = 20) -> float:
    """The GPU's busy time (ms) a call of `call`, on every stream, after one call unprofiled
    (bench/timing.profiled_busy_ms: every kernel, copy and memset, whichever stream runs it)."""
    from lmperf.bench import timing
    call()
    return timing.profiled_busy_ms(call, calls)


def outside_stream(call: Callable, timed_ms: float, busy: Callable[[Callable], float] = device_busy_ms,
                   ratio: float = 0.5) -> str | None:
    """Why `timed_ms` (the harness's time of one `call`, from events on the caller's stream) is not
    the call's time, or None: the device's work a call, on every stream (`busy`: profiled), is
    more than 1 / `ratio` times what the harness saw. Work launched on another stream and not
    waited for does that: the events record the launch alone. (An honest call's time is at least
    its device work; a host-bound one's is more.)"""
    busy_ms = busy(call)
    if timed_ms < ratio * busy_ms:
        return (f"outside the caller's stream: the harness timed {timed_ms:.4g} ms a call, but the device worked "
                f"{busy_ms:.4g} ms a call on all its streams: work the caller's stream never waits for is not counted")
    return None
