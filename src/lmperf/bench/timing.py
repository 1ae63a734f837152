"""Device timers, one place for every benchmark: wall-clock time of work on the device with the
device synchronized at both ends (whole-model steps, eager attention), and do_bench's quantiles
for kernels.

    sync = timing.synchronizer()           # torch.cuda.synchronize on a GPU, a no-op on a CPU
    with timing.timed(sync) as t: work()   # t.seconds after the block
    median, q20, q80 = timing.do_bench_quantiles(fn, warmup_ms=25, rep_ms=100)
    median, q20, q80 = timing.do_bench_cudagraph_quantiles(fn, rep_ms=100)  # GPU time, no host
    idle_pct, why_not = timing.gpu_idle(fn, wall_ms=median)  # how long the GPU waited on the host
    samples, stop = timing.sample_until(take, rule)   # take() until the median is known (below)

`sample_until` is the stop rule of every step-timed case (whole-model steps, eager attention): it
takes samples until the distribution-free 99% confidence interval of their median (two order
statistics, from the binomial distribution of how many samples fall below the true median) lies
within ±1% of the sample median, and never fewer than `floor` samples (such an interval needs
8 samples at 99%), never more than `ceiling`; a `window` of seconds (the sum of the samples) ends
the sampling of a slow case once it has `floor` samples. Each row says why its case stopped:
"median ±1% at 99%", "ceiling" or "window". A case whose samples are noisy takes `ceiling`.

`gpu_idle` is the host-bound test of every GPU timing case: the share of a call's wall time (as
the case timed it, without the profiler) in which the GPU ran nothing, from `IDLE_CALLS` more
calls under torch.profiler (CUDA activity only: CUPTI's record of every kernel, copy and memset,
overlapping work counted once). A case whose GPU sits idle much of the time measures the host
(Python, the launch path), and its time moves with the host's speed; the report's threshold
(config `report.host_bound_idle_pct`) makes that a flag. The profiled calls run back to back, so
for a small memory-bound kernel that do_bench times with a cold L2 the share is an upper bound.

Every timer that times a case's work (sample_until, the do_bench family, bench_calls,
bench_graph) runs it inside `window()`, which reads the GPU's SM clock, memory clock, power and
temperature (bench/energy.py's `reading`, through NVML) before the first timed work of a case
starts and after the last ends, outside the clock. loop.run_case collects them per case
(`recording`) into every row of the case: `sm_clock_mhz_start`, `sm_clock_mhz_end`, ...
(`CLOCK_COLUMNS`), empty without CUDA and in a case that timed nothing (a correctness check).
lmperf does not lock the clocks: these say at what clocks a row ran.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import statistics
import time
from typing import Callable, Iterable

from lmperf import stats
from lmperf.bench import energy

QUANTILES = (0.5, 0.2, 0.8)  # do_bench's median and the spread the rows record
IDLE_CALLS = 2  # extra calls of a case profiled for its GPU idle share: a few, to keep GPU time small


@dataclasses.dataclass(frozen=True)
class StopRule:
    """When a case stops taking samples (module docstring): at `ceiling` samples; never before
    `floor`; then once the median's interval at `confidence` lies within `relative` of the median
    (relative 0: never; at 99% not before 8 samples), or once the samples add up to `window`
    seconds (None: no window)."""
    ceiling: int
    floor: int = 8
    window: float | None = None
    relative: float = 0.01
    confidence: float = 0.99

    @classmethod
    def from_case(cls, case: dict, ceiling: str = "timed_steps", floor: str = "min_timed_steps",
                  window: str = "timed_window_s") -> "StopRule":
        """The rule of a case's keys: `ceiling` samples at most; with `median_within` (a share of
        the median) the precision stop; with `window` (seconds) the window, after `floor`
        samples. A case without them takes all `ceiling` samples."""
        most, within = case[ceiling], case.get("median_within")
        return cls(ceiling=most, floor=min(most, case.get(floor, most)), window=case.get(window),
                   relative=within or 0.0)

    def reason(self) -> str:
        """The row's words for a stop by precision, e.g. 'median ±1% at 99%'."""
        return f"median ±{100 * self.relative:g}% at {100 * self.confidence:g}%"


CEILING, WINDOW = "ceiling", "window"

# The GPU's state at a case's timed work's start and end (module docstring): the rows' columns
CLOCK_COLUMNS = tuple(f"{name}_{at}" for name in energy.READINGS for at in ("start", "end"))


class _Span:
    """The readings of the current case's windows: the first's at its start, the last's at its end."""
    depth = 0
    start: dict | None = None
    end: dict | None = None


_span = _Span()


@contextlib.contextmanager
def window():
    """A stretch of a case's timed work: the outermost window of a case reads the GPU's state
    (energy.reading) before it starts, if no window of the case has, and after it ends; a window
    inside another reads nothing. The readings are taken outside the timed work."""
    outer = _span.depth == 0
    if outer and _span.start is None:
        _span.start = energy.reading()
    _span.depth += 1
    try:
        yield
    finally:
        _span.depth -= 1
    if outer:
        _span.end = energy.reading()


def clock_columns(start: dict | None, end: dict | None) -> dict:
    """The rows' CLOCK_COLUMNS of a case's first and last reading (NaN where there is none)."""
    return {f"{name}_{at}": float((reading or {}).get(name, math.nan))
            for name in energy.READINGS for at, reading in (("start", start), ("end", end))}


@contextlib.contextmanager
def recording():
    """The block is one case: yields a dict that holds, once the block ends (raised or not), the
    CLOCK_COLUMNS of the windows it ran (all NaN where it ran none)."""
    global _span
    outer, _span = _span, _Span()
    columns: dict = {}
    try:
        yield columns
    finally:
        columns.update(clock_columns(_span.start, _span.end))
        _span = outer


@functools.cache
def median_interval_ranks(n: int, confidence: float) -> tuple[int, int] | None:
    """The 1-based ranks (k, n + 1 - k) of the order statistics that bound a distribution-free
    `confidence` interval of the median of n samples: the largest k with P(B < k) <= (1 -
    confidence) / 2, B ~ Binomial(n, 1/2), so the interval covers the median with probability
    1 - 2 P(B < k) >= confidence. None when n samples are too few (n < 8 at 99%)."""
    tail, below, k = (1 - confidence) / 2, 0.0, 0
    while k < n // 2:
        below += math.comb(n, k) / 2**n  # P(B <= k)
        if below > tail:
            break
        k += 1
    return (k, n + 1 - k) if k >= 1 else None


def median_within(samples: list[float], relative: float, confidence: float) -> bool:
    """Whether the distribution-free `confidence` interval of the median of `samples` lies within
    +-`relative` of their median (False while they are too few for such an interval)."""
    ranks = median_interval_ranks(len(samples), confidence)
    if ranks is None or relative <= 0:
        return False
    xs = sorted(samples)
    median = statistics.median(xs)
    lo, hi = xs[ranks[0] - 1], xs[ranks[1] - 1]
    return median - lo <= relative * abs(median) and hi - median <= relative * abs(median)


def stop_reason(values: list[float], rule: StopRule) -> str | None:
    """Why sampling stops after `values` (samples in seconds), or None to take another."""
    n = len(values)
    if n >= rule.ceiling:
        return CEILING
    if n < rule.floor:
        return None
    if median_within(values, rule.relative, rule.confidence):
        return rule.reason()
    if rule.window is not None and sum(values) >= rule.window:
        return WINDOW
    return None


def sample_until(take: Callable[[], object], rule: StopRule,
                 seconds: Callable[[object], float] = float) -> tuple[list, str]:
    """(the samples `take()` returned, why it stopped): samples until `rule` stops them
    (module docstring); `seconds(sample)` is a sample's value in seconds (a sum of phases)."""
    samples, values = [], []
    with window():
        while True:
            samples.append(take())
            values.append(seconds(samples[-1]))
            why = stop_reason(values, rule)
            if why is not None:
                return samples, why


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
    with window():
        median, q20, q80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=list(QUANTILES), **kwargs)
    return float(median), float(q20), float(q80)


def do_bench_cudagraph_quantiles(fn: Callable, rep_ms: int, **kwargs) -> tuple[float, float, float]:
    """(median, 20% quantile, 80% quantile) in ms of `fn` replayed as a CUDA graph by
    `triton.testing.do_bench_cudagraph` (no host time, no L2 flush): what `fn` costs the GPU
    when the host runs ahead of it, as it does in a training step."""
    import triton.testing
    with window():
        median, q20, q80 = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, quantiles=list(QUANTILES), **kwargs)
    return float(median), float(q20), float(q80)


# do_bench's way of timing a call, with the stop rule: `bench_calls` and `bench_graph` time calls
# as triton.testing's do_bench and do_bench_cudagraph do, but stop once the median is known
# (the 99% interval of the median within ±median_within of it; checked after CALL_STEP samples,
# then each time a quarter more are taken), and never take more than do_bench would in its window. A row says
# why its timing stopped (`stop`) and after how many samples (`stop_after`).
CALL_STEP = 10
GRAPH_REPLAYS = 10  # do_bench_cudagraph replays 10 graphs of rep_ms; bench_graph graphs of rep_ms / 10


class Quantiles(tuple):
    """(median, q20, q80) in ms, unpacked as do_bench_quantiles' tuple, with `n` (the samples
    taken: calls, or graph replays) and `stop` (why sampling stopped; "" for do_bench's own)."""

    def __new__(cls, median: float, q20: float, q80: float, n: float = math.nan, stop: str = ""):
        self = super().__new__(cls, (float(median), float(q20), float(q80)))
        self.n, self.stop = n, stop
        return self

    @property
    def median(self) -> float:
        return self[0]

    def fields(self) -> dict:
        """What a row records of how it was timed: `stop`, `stop_after` (empty for do_bench's own)."""
        return {"stop": self.stop, "stop_after": self.n}


def samples_until(time_samples: Callable[[int], list[float]], rule: StopRule, step: int = CALL_STEP) -> Quantiles:
    """Quantiles of the samples (ms) `time_samples(k)` returns, k more at a time, until `rule`
    stops them: checked at `rule.floor`, then every `step` samples or a quarter of those taken,
    whichever is more (a check sorts them all)."""
    ms: list[float] = []
    with window():
        while True:
            k = max(min(max(step, len(ms) // 4), rule.ceiling - len(ms)), rule.floor - len(ms), 1)
            ms += [float(x) for x in time_samples(k)]
            why = stop_reason([x / 1e3 for x in ms], rule)
            if why is not None:
                return Quantiles(*stats.quantiles(ms), len(ms), why)


def _clear_grads(grad_to_none) -> None:
    for x in grad_to_none or ():
        x.grad = None


def bench_calls(fn: Callable, warmup_ms: int, rep_ms: int, median_within: float | None,
                grad_to_none=None) -> Quantiles:
    """`fn`'s time a call in ms as triton.testing.do_bench takes it (an estimate from 5 calls, warm-up
    calls filling `warmup_ms`, then each call timed by CUDA events with the L2 cache flushed before
    it and `grad_to_none`'s gradients cleared), sampled until the median is known to
    `median_within` (the block above), at most the calls do_bench makes in `rep_ms`. Without
    `median_within` (None or 0), do_bench itself."""
    if not median_within:
        return Quantiles(*do_bench_quantiles(fn, warmup_ms=warmup_ms, rep_ms=rep_ms, grad_to_none=grad_to_none))
    from triton import runtime
    driver = runtime.driver.active
    di = driver.get_device_interface()
    fn()
    di.synchronize()
    cache = driver.get_empty_cache_for_benchmark()
    start, end = di.Event(enable_timing=True), di.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        driver.clear_cache(cache)
        fn()
    end.record()
    di.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-6)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    most = max(1, int(rep_ms / estimate_ms))

    def time_calls(k: int) -> list[float]:
        starts = [di.Event(enable_timing=True) for _ in range(k)]
        ends = [di.Event(enable_timing=True) for _ in range(k)]
        for s, e in zip(starts, ends):
            _clear_grads(grad_to_none)
            driver.clear_cache(cache)
            s.record()
            fn()
            e.record()
        di.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return samples_until(time_calls, StopRule(ceiling=most, floor=min(most, CALL_STEP), relative=median_within))


def bench_graph(fn: Callable, rep_ms: int, median_within: float | None, grad_to_none=None) -> Quantiles:
    """`fn`'s time a call in ms replayed as a CUDA graph, as triton.testing.do_bench_cudagraph takes
    it (no host time, no L2 flush: what `fn` costs the GPU when the host runs ahead of it, as in a
    training step), but with graphs of rep_ms / GRAPH_REPLAYS of calls, each replay a sample,
    replayed until the median is known to `median_within` (at least GRAPH_REPLAYS replays, at most
    the GPU time do_bench_cudagraph spends). Without `median_within`, do_bench_cudagraph itself."""
    if not median_within:
        return Quantiles(*do_bench_cudagraph_quantiles(fn, rep_ms=rep_ms, grad_to_none=grad_to_none))
    import torch
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()
        for x in grad_to_none or ():  # as do_bench_cudagraph: the warm-up call's graph let go
            x.detach_()
            x.requires_grad_(True)
            x.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate_ms = max(start.elapsed_time(end) / 5, 1e-6)
        unrolled = max(1, int(rep_ms / GRAPH_REPLAYS / estimate_ms))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(unrolled):
                _clear_grads(grad_to_none)
                fn()
        torch.cuda.synchronize()

        def time_replays(k: int) -> list[float]:
            out = []
            for _ in range(k):
                start.record()
                graph.replay()
                end.record()
                torch.cuda.synchronize()
                out.append(start.elapsed_time(end) / unrolled)
            return out
        rule = StopRule(ceiling=GRAPH_REPLAYS * GRAPH_REPLAYS, floor=GRAPH_REPLAYS, relative=median_within)
        return samples_until(time_replays, rule, step=GRAPH_REPLAYS)


def busy_ms(events: Iterable, calls: int) -> float:
    """The GPU's busy time (ms) a call in a profile of `calls` calls: the union of the intervals
    of its device work (torch.profiler events on CUDA; device-side copies of named ranges left
    out, they span idle time too), overlapping work counted once. Raises if there is none."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if str(e.device_type) == "DeviceType.CUDA" and e.time_range.end > e.time_range.start
                   and not getattr(e, "is_user_annotation", False)
                   and "annotation" not in str(getattr(e, "activity_type", "") or ""))
    if not spans:
        raise RuntimeError("the profiler recorded no GPU work (CUPTI unavailable?)")
    busy_us, (start, end) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > end:  # a gap: the GPU ran nothing between `end` and `s`
            busy_us, start = busy_us + end - start, s
        end = max(end, e)
    return (busy_us + end - start) / 1e3 / calls


def idle_pct(busy: float, wall_ms: float) -> float:
    """100 x (1 - busy / wall), at least 0 (a busy time a little over the wall time is noise)."""
    return max(0.0, 100 * (1 - busy / wall_ms))


def profiled_busy_ms(fn: Callable, calls: int) -> float:
    """The GPU's busy time (ms) a call of `fn`: `calls` calls under torch.profiler (CUDA activity,
    every stream), `busy_ms` of their events."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return busy_ms(prof.events(), calls)


def gpu_idle(fn: Callable, wall_ms: float, calls: int = IDLE_CALLS) -> tuple[float, str]:
    """(the share in % of `wall_ms` a call of `fn` leaves the GPU idle, or NaN; why it is NaN, or
    ""): `calls` calls of `fn` profiled (module docstring). Without CUDA (NaN, ""); a failure of
    the measurement is its reason, never the case's failure."""
    import torch
    if not torch.cuda.is_available():
        return math.nan, ""
    try:
        if not wall_ms > 0:
            raise ValueError(f"no wall time to compare with ({wall_ms} ms)")
        return idle_pct(profiled_busy_ms(fn, calls), wall_ms), ""
    except Exception as exc:  # noqa: BLE001  (the timings stand without it)
        return math.nan, f"GPU idle share not measured: {type(exc).__name__}: {exc}"[:200]


@functools.cache
def device_rates(gemm_size: int, copy_mib: int) -> dict:
    """The rates the floors are against, measured once a process with do_bench: a device-to-
    device copy (bytes read + written per second) and an n x n x n bf16 matmul (FLOP/s)."""
    import torch

    src = torch.empty(copy_mib * 2**20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = do_bench_quantiles(lambda: dst.copy_(src), warmup_ms=25, rep_ms=100)
    a, b = (torch.randn(gemm_size, gemm_size, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    gemm_ms = do_bench_quantiles(lambda: a @ b, warmup_ms=25, rep_ms=100)
    return {"copy_ms": copy_ms, "gemm_ms": gemm_ms,
            "copy_bytes_per_s": 2 * src.numel() / (copy_ms[0] / 1e3),
            "matmul_flops_per_s": 2 * gemm_size**3 / (gemm_ms[0] / 1e3)}
