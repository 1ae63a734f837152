"""Multi-dimensional LRPE-cosine: correctness against float64 (`check`) and speed and memory
against PyTorch (`bench`), on the seed benchmark's grid.

    python -m lmperf.bench.lrpe check --spec '{...}' --out results/cpu/lrpe/check.csv --hw cpu [--workers 4]
    python -m lmperf.bench.lrpe bench --spec '{...}' --out results/h100-80gb-hbm3/lrpe/bench_1d.csv --hw ...

With `--workers N` the check's cases run in N worker processes, and a bench job first compiles
its compiling cases in N worker processes, then times every case in its own (bench/jobs.py).

A bench case's call-time rows (ms, GB/s, share of copy bandwidth, per direction) carry
`gpu_idle_pct`, the share of the median call the GPU sat idle (bench/timing.py's gpu_idle): high
where do_bench times the host. Two GPU times leave the host out and have none: the kernel-time
rows (`*_kernel_ms`: the profiler's record of the call's GPU work, cold L2) and the CUDA-graph rows
(`*_gpu_ms`: the forward, and the forward with its backward, replayed as CUDA graphs,
bench/timing.py's bench_graph; the backward their difference), so that a small case's time per
call, mostly the host's, never stands alone as the kernel's speed. The call times and the graph
replays stop once their median is known (spec `median_within`; bench/timing.py's bench_calls and
bench_graph): each row says why (`stop`) and after how many samples (`stop_after`).
"""
from __future__ import annotations

import functools
import itertools
import math
import random

from lmperf.bench import common, jobs, timing

PROVIDERS = ("triton", "triton_cache", "torch", "torch_compile")


def check_cases(spec: dict) -> list[dict]:
    cases = []
    for impl, dtype, grid, l in itertools.product(spec["impls"], spec["dtypes"], spec["grids"], spec["extra_tokens"]):
        shape = "x".join(map(str, grid["shape"]))
        case = {"impl": impl, "dtype": dtype, "grid": shape, "l": l, "d": grid["d"], "e": grid["e"],
                "batch": spec["batch"], "heads": spec["heads"]}
        case["case_id"] = f"{impl}-{dtype}-grid{shape}-l{l}-d{grid['d']}-e{grid['e']}"
        cases.append(case)
    return cases


def measure_check(case: dict) -> list[dict]:
    import torch
    from lmperf.kernels.lrpe import compare

    cuda = torch.cuda.is_available()
    if case["impl"] != "torch" and case["dtype"] == "bf16" and not cuda:
        raise common.NotRun("needs CUDA: bf16 Triton kernels are checked on the GPU")
    device = "cuda" if cuda else "cpu"
    seed = random.randrange(2**31)
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = tuple(int(s) for s in case["grid"].split("x"))
    n = case["l"] + math.prod(shape)
    dtype = common.torch_dtype(case["dtype"])
    x = torch.randn(case["batch"], case["heads"], n, case["d"], generator=gen, device=device).to(dtype)
    theta = torch.rand(case["heads"], case["e"], generator=gen, device=device)
    grad = torch.randn(*x.shape[:-1], 2 * case["d"], generator=gen, device=device).to(dtype)
    rows = []
    for r in compare(x, theta, shape, case["l"], case["impl"], grad_out=grad):
        row = one_value(f"{r['quantity']}_max_abs_err", "abs", r["max_abs_err"])
        row.update(tolerance=r["tolerance"], passed=r["passed"], seed=seed)
        rows.append(row)
    return rows


def bench_cases(spec: dict) -> list[dict]:
    cases = []
    m = spec["dims"]
    e = 1 << math.ceil(math.log2(math.ceil(spec["d"] / m)))  # next power of two of ceil(d/m)
    for n, l, provider in itertools.product(spec["sizes"], spec["extra_tokens"], spec["providers"]):
        case = {"dims": m, "side": n, "tokens": l + n**m, "l": l, "provider": provider, "batch": spec["batch"],
                "heads": spec["heads"], "d": spec["d"], "e": e, "dtype": spec["dtype"],
                # timing windows and calls (config/schema.yaml's defaults)
                "timing_ms": "/".join(map(str, spec["timing_ms"])), "median_within": spec.get("median_within"),
                "copy_timing_ms": "/".join(map(str, spec["copy_timing_ms"])), "kernel_calls": spec["kernel_calls"]}
        case["case_id"] = f"{m}d-n{n}-l{l}-{provider}"
        cases.append(case)
    return cases


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning)."""
    return {"check": check_cases, "bench": bench_cases}[study](spec)


@functools.cache
def compiled_torch():
    """lrpe_torch under torch.compile (static shapes), made once: the torch.compile peer."""
    import torch
    from lmperf.kernels.lrpe import lrpe_torch
    return torch.compile(lrpe_torch, dynamic=False)


# Timings are do_bench's quantiles over its repeats: 20%, median, 80%.
QUANTILES = (0.2, 0.5, 0.8)


def one_value(metric: str, unit: str, value: float) -> dict:
    """A row for one measured number: no spread to claim, so std is empty (summarize writes 0
    for a single sample)."""
    return dict(common.summarize(metric, unit, [value]), std=math.nan)


def quantile_row(metric: str, unit: str, q20: float, median: float, q80: float) -> dict:
    """A row for a quantity do_bench summarised by quantiles of its repeats: the median as mean
    and median (what the report reads), q20 and q80 beside it; std, min and max are empty
    (do_bench keeps no samples to take them from)."""
    return dict(one_value(metric, unit, median), min=math.nan, max=math.nan, q20=q20, q80=q80)


@functools.cache
def copy_bandwidth_quantiles(warmup_ms: int, rep_ms: int) -> tuple[float, float, float]:
    """Device-to-device copy bandwidth of this GPU in GB/s (bytes read + written), measured
    now: (20%, median, 80%) over do_bench's repeats (windows: the spec's copy_timing_ms)."""
    import torch
    import triton.testing
    src = torch.randn(2**28, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    q = triton.testing.do_bench(lambda: dst.copy_(src), warmup=warmup_ms, rep=rep_ms, quantiles=list(QUANTILES))
    gbs = lambda ms: 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9
    return gbs(q[2]), gbs(q[1]), gbs(q[0])  # the slowest repeats give the lowest bandwidth


def copy_bandwidth_gbs(warmup_ms: int, rep_ms: int) -> float:
    """The median of copy_bandwidth_quantiles(): the denominator of every copy fraction."""
    return copy_bandwidth_quantiles(warmup_ms, rep_ms)[1]


def windows(text: str) -> tuple[int, int]:
    """A case's "warmup/rep" windows in ms (the schema's timing_ms, copy_timing_ms)."""
    warmup, rep = (int(x) for x in text.split("/"))
    return warmup, rep


def device_us(key_averages, calls: int, flush_kernels: dict) -> float:
    """Device time (us) per call in a profile of `calls` calls, each after one L2 flush: the
    summed self time of its GPU work, the flush's kernels left out (`flush_kernels`: name ->
    launches per flush). Raises if the flushes cannot be told apart (not `calls` of each)."""
    total, flushes = 0.0, {}
    for e in key_averages:
        if not common.is_device_work(e):
            continue
        if e.key in flush_kernels:
            flushes[e.key] = flushes.get(e.key, 0) + e.count
        else:
            total += e.self_device_time_total
    if flushes != {k: n * calls for k, n in flush_kernels.items()}:
        raise RuntimeError(f"L2-flush kernels per name {flushes} in a profile of {calls} calls: "
                           "cannot tell them from the op's own")
    return total / calls


FLUSH_ELEMENTS = 2**26  # int32: 256 MiB, as do_bench's L2 flush


@functools.cache
def _flush_kernels() -> dict:
    """{name: launches} of the GPU work of one L2 flush (an in-place negation of a 256 MiB
    buffer), as the profiler names it, read from a profile of the flush alone."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    buf = torch.zeros(FLUSH_ELEMENTS, dtype=torch.int32, device="cuda")
    buf.bitwise_not_()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        buf.bitwise_not_()
        torch.cuda.synchronize()
    kernels = {e.key: e.count for e in prof.key_averages() if common.is_device_work(e)}
    if not kernels:
        raise RuntimeError("the profiler recorded no GPU work (CUPTI unavailable?)")
    return kernels


def kernel_ms(call, calls: int) -> float:
    """Device time of one call with the host left out, from the profiler's (CUPTI's) record of
    the GPU work it launched, cold L2 as in do_bench: at small sizes a plain call's time is the
    host's (Python, the autograd engine's thread hand-off), not the kernels'. Gaps between
    kernels are left out too, which favours ops made of several kernels, if anything. Run it
    after the peak-memory measurements: its flush buffer lives only while it runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    flush_kernels = _flush_kernels()
    buf = torch.empty(FLUSH_ELEMENTS, dtype=torch.int32, device="cuda")
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            buf.bitwise_not_()
            call()
        torch.cuda.synchronize()
    return device_us(prof.key_averages(), calls, flush_kernels) / 1e3


def setup_bench(case: dict):
    """(fn, (x, theta, grad)) of a bench case: the provider's call fn(x, theta) and its inputs
    (the same every run). Raises NotRun without CUDA."""
    import torch
    from lmperf.kernels.lrpe import lrpe_cosine_md

    if not torch.cuda.is_available():
        raise common.NotRun("needs CUDA")
    shape, l = (case["side"],) * case["dims"], case["l"]
    b, h, d, n = case["batch"], case["heads"], case["d"], case["tokens"]
    dtype = common.torch_dtype(case["dtype"])
    provider = case["provider"]
    if provider == "torch_compile":
        from lmperf.kernels.lrpe import check_inputs
        fn = lambda x, theta: (check_inputs(x, theta, shape, l, "torch"), compiled_torch()(x, theta, shape, l))[1]
    else:
        fn = lambda x, theta: lrpe_cosine_md(x, theta, shape, l, provider)
    # A seeded generator of the case's own: the same inputs in every run.
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
    theta = torch.rand(h, case["e"], device="cuda", generator=gen)
    grad = torch.randn(b, h, n, 2 * d, device="cuda", dtype=dtype, generator=gen)
    return fn, (x, theta, grad)


def compiles(case: dict) -> bool:
    """Whether a bench case compiles (what the compile-cache warm-up of bench/workers.py can
    leave for its timed run): our Triton kernels and torch.compile; plain PyTorch does not."""
    return case["provider"] != "torch"


def warm_bench(case: dict) -> list[dict]:
    """Compile what measure_bench compiles for `case` and time nothing: one forward and one
    backward (the warm-up of bench/workers.py)."""
    import torch

    fn, (x, theta, grad) = setup_bench(case)
    fn(x, theta).backward(grad)
    torch.cuda.synchronize()
    return [{**common.failure_row("ok", ""), "metric": "compiled"}]


def measure_bench(case: dict) -> list[dict]:
    import torch

    fn, (x, theta, grad) = setup_bench(case)
    d = case["d"]
    provider = case["provider"]
    warmup, rep_ms = windows(case["timing_ms"])
    copy_windows, calls = windows(case["copy_timing_ms"]), case["kernel_calls"]
    within = case.get("median_within")

    bench = lambda f, grad_to_none=None: timing.bench_calls(f, warmup_ms=warmup, rep_ms=rep_ms, median_within=within,
                                                           grad_to_none=grad_to_none)  # (median, q20, q80) ms
    x_bytes = x.numel() * x.element_size()
    floor_bytes = 3 * x_bytes  # read x, write out (2d); backward: read dO (2d), write dx
    copy = copy_bandwidth_gbs(*copy_windows)
    rows = []

    # forward: speed, then peak memory during one call (inputs included), as the seed measures
    fwd_ms = bench(lambda: fn(x, theta))
    idle = {"forward": timing.gpu_idle(lambda: fn(x, theta), wall_ms=fwd_ms.median)}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn(x, theta)
    torch.cuda.synchronize()
    fwd_peak, fwd_extra = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_allocated() - before
    # backward: replay on one retained graph
    bwd_ms = bench(lambda: out.backward(grad, retain_graph=True), grad_to_none=[x])

    def backward():  # the gradient cleared before each call, as do_bench does
        x.grad = None
        out.backward(grad, retain_graph=True)
    idle["backward"] = timing.gpu_idle(backward, wall_ms=bwd_ms.median)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out.backward(grad)
    torch.cuda.synchronize()
    bwd_peak, bwd_extra = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_allocated() - before

    gbs = lambda ms: floor_bytes / (ms * 1e-3) / 1e9
    for direction, t, peak, extra in (("forward", fwd_ms, fwd_peak, fwd_extra),
                                      ("backward", bwd_ms, bwd_peak, bwd_extra)):
        # bandwidths from the same quantiles: the 80% time gives the 20% bandwidth
        ms, q20, q80 = t
        gpu_idle_pct, why_not = idle[direction]
        timed = [{**quantile_row(f"{direction}_ms", "ms", q20, ms, q80), "message": why_not, **t.fields()},
                 quantile_row(f"{direction}_gbs", "GB/s", gbs(q80), gbs(ms), gbs(q20)),
                 quantile_row(f"{direction}_copy_fraction", "fraction", gbs(q80) / copy, gbs(ms) / copy,
                              gbs(q20) / copy)]
        rows += [{**r, "gpu_idle_pct": gpu_idle_pct} for r in timed]
        rows += [one_value(f"{direction}_peak_mib", "MiB", peak / 2**20),
                 one_value(f"{direction}_extra_mib", "MiB", extra / 2**20)]
    # The same without the host: the kernels' device time (what the bandwidth bar is about).
    device = {}
    try:
        device["forward"] = kernel_ms(lambda: fn(x, theta), calls)
        out = fn(x, theta)
        device["backward"] = kernel_ms(lambda: torch.autograd.grad(out, x, grad, retain_graph=True), calls)
    except Exception as exc:  # the call times above still stand
        rows[0]["message"] = (f"no kernel time for the {('forward', 'backward')[len(device)]}: "
                              f"{type(exc).__name__}: {exc}")[:300]
    out = None
    for direction, ms in device.items():  # the mean of `calls` calls' summed device time
        rows += [dict(one_value(f"{direction}_kernel_ms", "ms", ms), kernel_calls=calls),
                 one_value(f"{direction}_kernel_gbs", "GB/s", gbs(ms)),
                 one_value(f"{direction}_kernel_copy_fraction", "fraction", gbs(ms) / copy)]
    rows += graph_rows(fn, x, theta, grad, rep_ms, gbs, copy, within)
    rows.append(quantile_row("copy_gbs", "GB/s", *copy_bandwidth_quantiles(*copy_windows)))
    rows.append(one_value("x_elements", "count", x.numel()))
    config = ""
    if provider.startswith("triton"):  # the tile it ran with, for the tuning notes
        from lmperf.kernels import lrpe
        cfg = lrpe.launch_config(d)
        config = f"BLOCK_N={cfg['BLOCK_N']} warps={cfg['num_warps']} programs_per_sm={lrpe.PROGRAMS_PER_SM} min_batch={lrpe.MIN_BATCH_PER_PROGRAM}"
    for row in rows:
        row["config"] = config
    return rows


def graph_rows(fn, x, theta, grad, rep_ms: int, gbs, copy: float, within: float | None = None) -> list[dict]:
    """The forward, and the forward with its backward, replayed as CUDA graphs
    (`forward_gpu_ms`, `fwd_bwd_gpu_ms`, with their 20% / 80% quantiles), and the backward as
    their difference (`backward_gpu_ms`, the median only: quantiles do not subtract), with their
    shares of the copy bandwidth: the GPU's time of a call with no host in it. The backward is
    captured with its forward, as autograd runs it on the stream its forward ran on. A capture
    that fails is a row of its own (status and message); the other rows stand."""
    import torch

    def fwd_bwd():
        torch.autograd.grad(fn(x, theta), x, grad)
    rows, ms = [], {}
    for name, call in (("forward", lambda: fn(x, theta)), ("fwd_bwd", fwd_bwd)):
        try:
            timed = timing.bench_graph(call, rep_ms=rep_ms, median_within=within)
            ms[name], q20, q80 = timed
        except Exception as exc:  # noqa: BLE001  (the other timings stand without it)
            status, message = common.classify_failure(exc)
            rows.append({**common.failure_row(status, ("CUDA graph: " + message)[:300]),
                         "metric": f"{name}_gpu_ms", "unit": "ms"})
            continue
        rows.append({**quantile_row(f"{name}_gpu_ms", "ms", q20, ms[name], q80), **timed.fields()})
        if name == "forward":
            rows.append(quantile_row("forward_gpu_copy_fraction", "fraction", gbs(q80) / copy,
                                     gbs(ms[name]) / copy, gbs(q20) / copy))
    if len(ms) == 2:
        backward = ms["fwd_bwd"] - ms["forward"]
        rows += [{**one_value("backward_gpu_ms", "ms", backward), "q20": math.nan, "q80": math.nan,
                  "message": "backward = (forward+backward) - forward, both CUDA graphs"},
                 one_value("backward_gpu_copy_fraction", "fraction", gbs(backward) / copy)]
    return rows


def main(argv=None):
    studies = {"check": (check_cases, measure_check), "bench": (bench_cases, measure_bench)}
    args = common.bench_args(__doc__, argv, studies=studies, options=jobs.options)
    cases, measure = studies[args.study]
    # a check's cases run side by side in the workers; a timing job's compiles are warmed in them
    jobs.run(section="lrpe", study=args.study, cases=cases(args.spec), measure=measure, args=args,
             fingerprint={"spec": args.spec}, parallel=args.study == "check", warm=warm_bench, compiles=compiles)


if __name__ == "__main__":
    main()
