"""The host's cost of one FlashAttention forward+backward on a GPU: do_bench with the host included
against the kernels' GPU time, ours (FlashAttention2Triton, its default launch mode) beside
SDPA-cuDNN and SDPA-flash, eager and torch.compile'd, bf16 (ours_jit, ours_cache, ours_plan: ours
with LMPERF_FA_LAUNCH=jit, =cache or =plan; ours_tile, ours_gluon: the tile-language or the Gluon
kernels forced); where ours spends its host time (cProfile), and where
ours and SDPA-cuDNN spend it by op (torch.profiler's CPU time); and what one Triton launch costs
through the JIT against the compiled kernel's own launcher.

    python tuning/flash_attention/fa_host_cost.py --out DIR [--only model64,assign64]
        [--impls ours,ours_jit,ours_tile,cudnn,flash] [--modes eager,compiled] [--bench-rounds R] [--rep-ms MS]
        [--profile] [--launch] [--tag TAG]
    python tuning/flash_attention/fa_host_cost.py --out DIR --bench-harness eager,leaderboard
        [--only grid1024_128,model64] [--impls ours,cudnn,flash] [--bench-rounds R] [--profile]
    python tuning/flash_attention/fa_host_cost.py --out DIR --floors [--only grid1024_128] [--rounds R]
    python tuning/flash_attention/fa_host_cost.py --out DIR --split-sweep [--only grid1024_64,grid4096] [--rounds R]

Writes DIR/fa_host_cost{TAG}.csv: one row per case x implementation x mode: do_bench's median and
20/80% quantiles (ms, host included: a call that the host cannot keep ahead of shows its host
time; with --bench-rounds R, the median of R rounds that time the implementations in turn, and
the rounds' min and max), the GPU time of the kernels per call (profiler), the host's time per call in a loop of 200
calls synchronised only at its end, the kernels per call, and the tensor maps made per call (the Gluon
kernels' TMA descriptors encoded by the driver); a failure is a row with its error.
--profile: DIR/fa_host_profile{TAG}.txt, at the first case, in each of --modes: cProfile of 300
calls of each implementation of ours among --impls, then torch.profiler's table of the host's time
by op of 100 calls of each of --impls.
--anatomy: DIR/fa_host_anatomy{TAG}.csv, do_bench's loop taken apart: the host's time of the
forward and of the backward and the events' time, with the L2 flush and the garbage collector on
and off (anatomy).
--launch: DIR/fa_host_launch{TAG}.csv, each kernel of ours at the first case launched 500 times
through Triton's JIT and through the compiled kernel's launcher (mean wall time a launch).
--bench-harness eager,leaderboard: DIR/fa_host_bench{TAG}.csv, the published figure as the FlashAttention
benchmark takes it (its own setup and timer, (B, H, N, D) inputs) at each --only case, then taken apart:
the GPU's idle share, the garbage collector off, the host's loop time, the plans a loop records
(bench_harness).
--floors: DIR/fa_host_floors{TAG}.csv, ours' host time in the benchmark's eager call taken apart: an allocation,
an autograd Function that only allocates, one that allocates what ours' plans do, one around SDPA-flash's own
ops, ours with and without its plans' scratch kept, cuDNN and flash, and the time inside ours' parts (floors,
ours_parts).
--split-sweep: DIR/fa_host_split{TAG}.csv, ours as the rule runs it, with the split a CUDA graph's capture gets
and with none, cuDNN beside: the host's time, do_bench's and the GPU time a call (split_sweep).
"""
from __future__ import annotations

import argparse
import csv
import cProfile
import io
import os
import pstats
import sys
import time
import traceback
from pathlib import Path

import torch

LAUNCH_ENV = "LMPERF_FA_LAUNCH"
# name: (batch, heads, N, D, layout); "model": (B, N, H, D) memory viewed as (B, H, N, D), the
# model's projections; "assign": (B, N, D), the assignment's layout (one head per sequence)
CASES = {
    "model64": (4, 16, 1024, 64, "model"),
    "assign64": (16, 1, 1024, 64, "assign"),
    "model128": (4, 16, 1024, 128, "model"),
    "assign128": (16, 1, 1024, 128, "assign"),
    "grid4096": (1, 1, 4096, 128, "assign"),
    "model80": (4, 32, 2048, 80, "model"),  # the 2.7B model's attention
    "grid1024_64": (1, 1, 1024, 64, "assign"),  # the assignment's grid (batch 1) from 1,024 rows
    "grid1024_128": (1, 1, 1024, 128, "assign"),
    "grid4096_64": (1, 1, 4096, 64, "assign"),
    "grid2048_64": (1, 1, 2048, 64, "assign"),
    "grid2048_128": (1, 1, 2048, 128, "assign"),
    "grid8192_64": (1, 1, 8192, 64, "assign"),
    "grid8192_128": (1, 1, 8192, 128, "assign"),
    "grid16384": (1, 1, 16384, 128, "assign"),
    "grid16384_64": (1, 1, 16384, 64, "assign"),
    "grid65536": (1, 1, 65536, 128, "assign"),
    "grid65536_64": (1, 1, 65536, 64, "assign"),
    "xl": (4, 25, 2048, 64, "model"),  # the xl model's attention (the fused Gluon backward)
    "model128_2048": (8, 16, 2048, 128, "model"),  # the model group's head-dim-128 shape (the same)
}


def leaves(case, seed=0):
    b, h, n, d, layout = CASES[case]
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (b, n, h, d) if layout == "model" else (b, n, d)
    return [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3)]


def attention(impl, layout):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    from lmperf.kernels.flash_attention_triton import FlashAttention2Triton
    view = (lambda t: t.transpose(1, 2)) if layout == "model" else (lambda t: t)
    if _ours(impl):
        # a code object of its own for each: torch.compile caches graphs by code object, and its guards
        # do not read the variables that pick the kernels (one would run another's graph)
        return eval(compile("lambda q, k, v: apply(view(q), view(k), view(v), True)", f"<{impl}>", "eval"),
                    {"apply": FlashAttention2Triton.apply, "view": view})
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[impl]
    heads = (lambda t: t.transpose(1, 2)) if layout == "model" else (lambda t: t.unsqueeze(1))

    def fn(q, k, v):
        with sdpa_kernel(backend):
            o = sdpa(heads(q), heads(k), heads(v), is_causal=True)
        return o if layout == "model" else o.squeeze(1)
    return fn


def step_fn(fn, q, k, v):
    def step():
        fn(q, k, v).sum().backward()
    return step


def gpu_ms(step, reps=20):
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    evs = [e for e in prof.key_averages()]
    total = sum(e.self_device_time_total for e in evs)
    count = sum(e.count for e in evs if e.self_device_time_total > 0)
    return total / reps / 1e3, count / reps


def host_ms(step, reps=200):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e3


_MAPS = {"made": 0, "counting": False}


def count_tensor_maps() -> None:
    """From now on count the tensor maps Triton makes in this process (make_tensordesc_arg: a Gluon
    kernel's descriptor encoded by the CUDA driver); before any plan is recorded, so that plans'
    launches, which keep the function they found, count too."""
    if _MAPS["counting"]:
        return
    try:
        import triton.backends.nvidia.driver as nvidia
    except ImportError:
        return
    real = nvidia.make_tensordesc_arg

    def make(arg, meta):
        _MAPS["made"] += 1
        return real(arg, meta)
    nvidia.make_tensordesc_arg = make
    _MAPS["counting"] = True


def maps_per_call(step, leaves, calls=50) -> float | None:
    """Tensor maps made a call, over `calls` calls with the leaves' gradients set to None before
    each (as do_bench does); None where this process does not count them."""
    if not _MAPS["counting"]:
        return None
    made = _MAPS["made"]
    for _ in range(calls):
        for t in leaves:
            t.grad = None
        step()
    torch.cuda.synchronize()
    return (_MAPS["made"] - made) / calls


def bench(cases, impls, modes, out_csv, log, rounds=1, rep_ms=200):
    """Each case x mode: every implementation set up (compiled, warmed), then `rounds` rounds, each
    timing every implementation in turn by do_bench (rep_ms each), so that a host that drifts
    while the process runs weighs on all of them alike; a row's do_bench_ms is the median of its
    rounds' medians (with one round: do_bench's median and its 20/80% quantiles)."""
    import statistics
    import triton
    count_tensor_maps()
    rows = []
    for case in cases:
        layout = CASES[case][4]
        for mode in modes:
            torch._dynamo.reset()
            setups = []
            for impl in impls:
                row = dict(case=case, shape="x".join(map(str, CASES[case][:4])), layout=layout, impl=impl, mode=mode,
                           gpu=torch.cuda.get_device_name())
                env = IMPL_ENV.get(impl, {})
                if not _runs_in(impl, mode):
                    continue
                try:
                    _launch_env(env)
                    q, k, v = leaves(case)
                    fn = attention(impl, layout)
                    if mode == "compiled":
                        fn = torch.compile(fn, fullgraph=True)
                    step = step_fn(fn, q, k, v)
                    for _ in range(3):
                        step()
                    setups.append((row, env, step, (q, k, v), []))
                except Exception as exc:  # noqa: BLE001 - a failure is a row
                    traceback.print_exc()
                    row.update(error=f"{type(exc).__name__}: {exc}"[:300])
                    rows.append(row)
                    log(row)
            for _ in range(rounds):
                for row, env, step, leaves_, times in setups:
                    try:
                        _launch_env(env)
                        times.append(triton.testing.do_bench(step, warmup=25, rep=rep_ms, grad_to_none=list(leaves_),
                                                             quantiles=[0.5, 0.2, 0.8]))
                    except Exception as exc:  # noqa: BLE001
                        traceback.print_exc()
                        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            for row, env, step, leaves_, times in setups:
                if times and not row.get("error"):
                    try:
                        _launch_env(env)
                        g, kernels = gpu_ms(step)
                        medians = [t[0] for t in times]
                        lo, hi = (min(medians), max(medians)) if rounds > 1 else times[0][1:]
                        row.update(do_bench_ms=statistics.median(medians), p20_ms=lo, p80_ms=hi, rounds=len(times),
                                   gpu_ms=g, kernels_per_call=kernels, host_loop_ms=host_ms(step),
                                   tensor_maps_per_call=maps_per_call(step, leaves_), error="")
                    except Exception as exc:  # noqa: BLE001
                        traceback.print_exc()
                        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
                log(row)
                write(out_csv, rows)  # after every row: a run cut short keeps what it measured
            _launch_env(None)
    return rows


# the variables an implementation of ours sets (the others unset): a launch mode, or the tile or Gluon kernels forced
IMPL_ENV = {"ours_jit": {LAUNCH_ENV: "jit"}, "ours_cache": {LAUNCH_ENV: "cache"}, "ours_plan": {LAUNCH_ENV: "plan"},
            "ours_tile": {"LMPERF_FA_BACKEND": "triton", "LMPERF_FA_BWD_BACKEND": "triton"},
            "ours_gluon": {"LMPERF_FA_BACKEND": "gluon", "LMPERF_FA_BWD_BACKEND": "gluon"}}


def _ours(impl) -> bool:
    """Whether `impl` is ours: "ours" (the defaults) or one of IMPL_ENV's."""
    return impl == "ours" or impl in IMPL_ENV


def _runs_in(impl, mode) -> bool:
    """Whether `impl` is timed in `mode`: a launch mode is eager mode's."""
    return mode == "eager" or LAUNCH_ENV not in IMPL_ENV.get(impl, {})


def _launch_env(env):
    """The variables of IMPL_ENV set as `env` has them ({} or None: all unset, the defaults)."""
    for name in {k for e in IMPL_ENV.values() for k in e}:
        if env and name in env:
            os.environ[name] = env[name]
        else:
            os.environ.pop(name, None)


def write(path, rows):
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)


def cprofile_calls(step, calls, title, stream):
    """cProfile of `calls` calls of step() (a forward + backward), the GPU synchronised before it stops:
    its top functions by their own time and by their cumulative time, written to `stream` under `title`."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
    pr.disable()
    stream.write(f"\n\n# cProfile, {title}: {calls} forward + backward calls\n")
    st = pstats.Stats(pr, stream=stream)
    st.sort_stats("tottime").print_stats(40)
    st.sort_stats("cumulative").print_stats(50)


def profile_ours(case, out_txt, impls=("ours", "cudnn"), modes=("eager",)):
    """cProfile of 300 calls of each implementation of ours among `impls`, then torch.profiler's
    table of the host's time by op of 100 calls of every one of `impls`, in each of `modes`."""
    s = io.StringIO()
    from torch.profiler import ProfilerActivity, profile
    q, k, v = leaves(case)
    for mode in modes:
        for impl in impls:
            if not _runs_in(impl, mode):
                continue
            _launch_env(IMPL_ENV.get(impl))
            fn = attention(impl, CASES[case][4])
            step = step_fn(torch.compile(fn, fullgraph=True) if mode == "compiled" else fn, q, k, v)
            for _ in range(20):
                step()
                q.grad = k.grad = v.grad = None
            torch.cuda.synchronize()
            if _ours(impl):
                def again(step=step):
                    step()
                    q.grad = k.grad = v.grad = None
                cprofile_calls(again, 300, f"{impl}, {mode}, {case}", s)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(100):
                    step()
                    q.grad = k.grad = v.grad = None
                torch.cuda.synchronize()
            s.write(f"\n\n# torch.profiler, {impl}, {mode}, {case}: 100 forward + backward calls, the host's time by op\n")
            s.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=35, max_name_column_width=60))
    _launch_env(None)
    Path(out_txt).write_text(s.getvalue())


def anatomy(cases, impls, out_csv, log, reps=300):
    """do_bench's loop taken apart (eager): each rep sets the gradients to None, clears the L2 cache
    (do_bench's buffer zeroed) or not, records a start event, runs the forward, then `.sum().backward()`,
    and records an end event; the host's time of the forward, of the backward and of both (perf_counter),
    and the events' time, medians over `reps`, with Python's garbage collector on and off. The
    implementations take turns rep by rep, so that a host that drifts weighs on all alike."""
    import gc
    import statistics
    import triton
    cache = triton.runtime.driver.active.get_empty_cache_for_benchmark()
    rows = []
    for case in cases:
        layout = CASES[case][4]
        runs = []
        for impl in impls:
            q, k, v = leaves(case)
            fn = attention(impl, layout)
            for _ in range(20):
                fn(q, k, v).sum().backward()
            runs.append((impl, fn, (q, k, v)))
        for flush in (True, False):
            for collect in (True, False):
                gc.enable() if collect else gc.disable()
                seen = {impl: [] for impl in impls}
                torch.cuda.synchronize()
                for _ in range(reps):
                    for impl, fn, (q, k, v) in runs:
                        q.grad = k.grad = v.grad = None
                        if flush:
                            cache.zero_()
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        t0 = time.perf_counter()
                        start.record()
                        out = fn(q, k, v)
                        t1 = time.perf_counter()
                        out.sum().backward()
                        end.record()
                        t2 = time.perf_counter()
                        seen[impl].append((t1 - t0, t2 - t1, t2 - t0, start, end))
                torch.cuda.synchronize()
                gc.enable()
                for impl in impls:
                    xs = seen[impl]
                    row = dict(case=case, impl=impl, flush=flush, gc=collect, reps=reps,
                               host_fwd_ms=statistics.median(x[0] for x in xs) * 1e3,
                               host_bwd_ms=statistics.median(x[1] for x in xs) * 1e3,
                               host_ms=statistics.median(x[2] for x in xs) * 1e3,
                               host_p80_ms=sorted(x[2] for x in xs)[int(0.8 * len(xs))] * 1e3,
                               event_ms=statistics.median(x[3].elapsed_time(x[4]) for x in xs),
                               gpu=torch.cuda.get_device_name())
                    rows.append(row)
                    log(row)
                    write(out_csv, rows)
    return rows


# the benchmark's providers of each implementation here (lmperf.providers)
BENCH_PROVIDERS = {"ours": "triton", "cudnn": "sdpa_cudnn", "flash": "sdpa_flash"}


def bench_harness(cases, impls, harnesses, out_csv, log, rounds=3, profile_txt=None):
    """The published figure as the benchmark takes it, then taken apart: each case's (B, H, N, D) inputs
    and call from the FlashAttention benchmark's own setup (lmperf.bench.flash_attention.setup_bench,
    the case's harness: "eager", the call as it is, `.backward(dout)`; "leaderboard", torch.compile'd,
    `.sum().backward()`), timed by its timer (lmperf.bench.timing.bench_calls: do_bench's, the L2
    flushed before each call, the gradients cleared), `rounds` rounds with the implementations in
    turn; then each: its GPU's idle share of the median call (timing.gpu_idle), the same timer with
    Python's garbage collector off, the host's time a call in a loop of 200 synchronised only at its
    end, and how many plans (launch.PLANS) that loop recorded (a replayed call records none).
    profile_txt: cProfile of 200 calls of ours at each case and harness."""
    import gc
    import statistics
    from lmperf.bench import flash_attention as fa_bench
    from lmperf.bench import timing
    from lmperf.kernels import launch as kernel_launch
    rows = []
    prof = io.StringIO()
    for case in cases:
        b, h, n, d, layout = CASES[case]
        for harness in harnesses:
            setups = []
            for impl in impls:
                spec = dict(provider=BENCH_PROVIDERS[impl], harness=harness, dtype="bf16", causal=True, batch=b,
                            heads=h, seq_len=n, head_dim=d)
                row = dict(case=case, shape=f"{b}x{h}x{n}x{d}", impl=impl, harness=harness,
                           gpu=torch.cuda.get_device_name())
                try:
                    _, context, fwd_bwd, (q, k, v, _) = fa_bench.setup_bench(spec)

                    def run(context=context, fwd_bwd=fwd_bwd):
                        with context():
                            fwd_bwd()
                    for _ in range(3):
                        run()
                        q.grad = k.grad = v.grad = None
                    setups.append((row, run, (q, k, v), []))
                except Exception as exc:  # noqa: BLE001 - a failure is a row
                    traceback.print_exc()
                    row.update(error=f"{type(exc).__name__}: {exc}"[:300])
                    rows.append(row)
            for _ in range(rounds):
                for row, run, leaves_, medians in setups:
                    medians.append(timing.bench_calls(run, 25, 100, None, grad_to_none=list(leaves_)).median)
            for row, run, leaves_, medians in setups:
                median = statistics.median(medians)

                def again(run=run, leaves_=leaves_):
                    for t in leaves_:
                        t.grad = None
                    run()
                idle, why = timing.gpu_idle(again, wall_ms=median)
                gc.disable()
                try:
                    no_gc = timing.bench_calls(run, 25, 100, None, grad_to_none=list(leaves_)).median
                finally:
                    gc.enable()
                plans = len(kernel_launch.PLANS.plans)
                row.update(bench_ms=median, bench_min_ms=min(medians), bench_max_ms=max(medians), rounds=len(medians),
                           gpu_idle_pct=idle, bench_ms_gc_off=no_gc, host_loop_ms=host_ms(again),
                           plans_recorded=len(kernel_launch.PLANS.plans) - plans, error=why)
                rows.append(row)
                log(row)
                write(out_csv, rows)  # after every row: a run cut short keeps what it measured
                if profile_txt is not None and row["impl"] == "ours":
                    cprofile_calls(again, 200, f"ours, {harness}, {case}", prof)
                    Path(profile_txt).write_text(prof.getvalue())
    return rows


def floors(cases, out_csv, log, rounds=5, reps=200):
    """What ours' host time is made of, in the benchmark's eager call (its (B, H, N, D) inputs,
    `.backward(dout)`): the host's time a call in a loop of `reps` synchronised only at its end (host_ms),
    `rounds` rounds with the steps in turn, the median and the rounds' min and max, of: one
    torch.empty_strided like q ("empty"); an autograd Function that only allocates O, L, dQ, dK and dV
    ("bare", the floor of any Python Function); one that allocates what ours' two plans allocate, outputs
    and scratch ("bare_plan"); one that runs SDPA-flash's own forward and backward ops ("flash_fn": what a
    Python Function adds to the kernels that SDPA-flash launches from C++ autograd, its gradients checked
    against SDPA-flash's); ours forward only and forward + backward, and the latter with its plans'
    scratch kept ("ours_kept", launch.KEEP_SCRATCH_ENV); SDPA-cuDNN's and SDPA-flash's the same. Each row
    also has ours' plans: outputs, scratch buffers and launches of the forward's and the backward's
    (launch.PLANS, recorded by the first call)."""
    import statistics
    from lmperf.bench import flash_attention as fa_bench
    from lmperf.kernels import launch as kernel_launch
    from lmperf.kernels.flash_attention_triton import clear_plans
    rows = []
    for case in cases:
        b, h, n, d, _ = CASES[case]
        steps, plans = {}, {}
        for impl in ("ours", "cudnn", "flash"):
            spec = dict(provider=BENCH_PROVIDERS[impl], harness="eager", dtype="bf16", causal=True, batch=b,
                        heads=h, seq_len=n, head_dim=d)
            if impl == "ours":
                clear_plans()
            fn, context, fwd_bwd, (q, k, v, dout) = fa_bench.setup_bench(spec)
            if impl == "ours":
                fwd_bwd()
                plans = [p for p in kernel_launch.PLANS.plans.values() if p]

            def fwd(fn=fn, context=context, q=q, k=k, v=v):
                with context():
                    fn(q, k, v)

            def both(context=context, fwd_bwd=fwd_bwd, leaves_=(q, k, v)):
                for t in leaves_:
                    t.grad = None
                with context():
                    fwd_bwd()
            steps[f"{impl}_fwd"], steps[impl] = fwd, both
            if impl == "ours":
                steps["ours_kept"] = both  # with its plans' scratch kept (launch.KEEP_SCRATCH_ENV=1)
        q, k, v, dout = (t.detach().requires_grad_(t is not dout) for t in (q, k, v, dout))
        steps["empty"] = lambda q=q: torch.empty_strided(q.shape, q.stride(), dtype=q.dtype, device=q.device)

        def bare(q=q, k=k, v=v, dout=dout):
            q.grad = k.grad = v.grad = None
            Bare.apply(q, k, v, True).backward(dout)
        steps["bare"] = bare

        def flash_fn(q=q, k=k, v=v, dout=dout):
            q.grad = k.grad = v.grad = None
            FlashInFunction.apply(q, k, v).backward(dout)
        try:  # SDPA-flash's kernels behind a Python Function: its floor with real kernels (a failure is a row)
            flash_fn()
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                                           (q, k, v), dout)
            # FlashAttention-2's dQ is summed with atomics: the same to bf16's rounding, not bit for bit
            close = (torch.allclose(t.grad.float(), w.float(), rtol=2e-2, atol=2e-2) for t, w in zip((q, k, v), want))
            if not all(close):
                raise AssertionError("flash_fn's gradients are not SDPA-flash's")
            steps["flash_fn"] = flash_fn
        except Exception as e:  # noqa: BLE001
            rows.append(dict(case=case, shape=f"{b}x{h}x{n}x{d}", step="flash_fn", error=f"{type(e).__name__}: {e}"))
            log(rows[-1])
        if len(plans) == 2:
            fwd_plan, bwd_plan = plans

            class BarePlan(torch.autograd.Function):
                @staticmethod
                def forward(ctx, q, k, v):
                    outs = fwd_plan.allocate()
                    ctx.save_for_backward(q, k, v, *outs[:2])
                    return outs[0]

                @staticmethod
                def backward(ctx, grad_out):
                    ctx.saved_tensors
                    return tuple(bwd_plan.allocate()[:3])

            def bare_plan(q=q, k=k, v=v, dout=dout):
                q.grad = k.grad = v.grad = None
                BarePlan.apply(q, k, v).backward(dout)
            steps["bare_plan"] = bare_plan
        for step in steps.values():
            for _ in range(20):
                step()
        times = {name: [] for name in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                os.environ[kernel_launch.KEEP_SCRATCH_ENV] = "1" if name == "ours_kept" else "0"
                times[name].append(host_ms(step, reps))
        os.environ.pop(kernel_launch.KEEP_SCRATCH_ENV)
        parts = ours_parts(steps["ours"], reps)
        shape = dict(case=case, shape=f"{b}x{h}x{n}x{d}", gpu=torch.cuda.get_device_name())
        for i, (which, plan) in enumerate(zip(("fwd", "bwd"), plans)):
            shape.update({f"{which}_outputs": plan.n_outputs, f"{which}_scratch": len(plan.outputs) - plan.n_outputs,
                          f"{which}_launches": len(plan.launches),
                          f"{which}_direct": sum(entry[0] is not None for entry in plan.launches)})
        for name, t in times.items():
            row = dict(shape, step=name, host_ms=statistics.median(t), min_ms=min(t), max_ms=max(t), rounds=rounds,
                       reps=reps)
            rows.append(row)
            log(row)
        for name, ms in parts.items():
            row = dict(shape, step=f"ours:{name}", host_ms=ms, rounds=1, reps=reps)
            rows.append(row)
            log(row)
        write(out_csv, rows)
    return rows


_REAL = {}  # flash_attention_triton's own launch_fwd_config, launch_bwd_config and host_launched (variant)


def variant(name: str) -> None:
    """Ours' tile kernels as `name` runs them: "ours", the rule as it is; "ours_split", with the configs a
    CUDA graph's capture gets (the rule's split: host_launched False); "ours_unsplit", no split in the
    forward or either backward kernel. The plans and memoised configs forgotten."""
    from lmperf.kernels import flash_attention_triton as ft
    if not _REAL:
        _REAL.update(fwd=ft.launch_fwd_config, bwd=ft.launch_bwd_config, host=ft.host_launched)
    ft.launch_fwd_config, ft.launch_bwd_config, ft.host_launched = _REAL["fwd"], _REAL["bwd"], _REAL["host"]
    if name == "ours_split":
        ft.host_launched = lambda q: False
    elif name == "ours_unsplit":
        ft.launch_fwd_config = lambda *a: {**_REAL["fwd"](*a), "SPLIT": 1}
        ft.launch_bwd_config = lambda *a: {**(c := _REAL["bwd"](*a)), "dq": {**c["dq"], "SPLIT": 1},
                                           "dkdv": {**c["dkdv"], "SPLIT": 1}}
    ft.clear_plans()


def split_sweep(cases, out_csv, log, rounds=5, reps=200):
    """Ours as the rule runs it, with the split a CUDA graph's capture gets, and with no split (variant),
    cuDNN beside them, in the benchmark's eager call: each round times each by the host's time a call in a
    loop of `reps` (host_ms) and by the benchmark's timer (timing.bench_calls: do_bench's, host included),
    ours' variants switched and warmed before their turn; then each one's GPU time a call (the profiler,
    gpu_ms) and ours' launches a call. (Before the rule kept the calls the host launches unsplit, "ours"
    was the split.)"""
    import statistics
    from lmperf.bench import flash_attention as fa_bench
    from lmperf.bench import timing
    from lmperf.kernels import launch as kernel_launch
    rows = []
    for case in cases:
        b, h, n, d, _ = CASES[case]
        runs = {}
        for impl in ("ours", "ours_split", "ours_unsplit", "cudnn"):
            spec = dict(provider=BENCH_PROVIDERS[impl.split("_")[0]], harness="eager", dtype="bf16", causal=True,
                        batch=b, heads=h, seq_len=n, head_dim=d)
            _, context, fwd_bwd, (q, k, v, _) = fa_bench.setup_bench(spec)

            def run(context=context, fwd_bwd=fwd_bwd, leaves_=(q, k, v)):
                for t in leaves_:
                    t.grad = None
                with context():
                    fwd_bwd()
            runs[impl] = (run, (q, k, v))
        host, bench, gpu, launches = ({name: [] for name in runs} for _ in range(4))
        for r in range(rounds + 1):
            for name, (run, leaves_) in runs.items():
                variant(name)
                for _ in range(3):
                    run()
                if r == 0:  # a round to warm, then the GPU time and the launches
                    gpu[name] = gpu_ms(run)[0]
                    before = sum(len(p.launches) for p in kernel_launch.PLANS.plans.values() if p)
                    launches[name] = before
                    continue
                host[name].append(host_ms(run, reps))
                bench[name].append(timing.bench_calls(run, 25, 100, None, grad_to_none=list(leaves_)).median)
        variant("ours")
        for name in runs:
            row = dict(case=case, shape=f"{b}x{h}x{n}x{d}", impl=name, gpu=torch.cuda.get_device_name(),
                       host_ms=statistics.median(host[name]), host_min_ms=min(host[name]),
                       host_max_ms=max(host[name]), bench_ms=statistics.median(bench[name]),
                       bench_min_ms=min(bench[name]), bench_max_ms=max(bench[name]), gpu_ms=gpu[name],
                       plan_launches=launches[name] if name.startswith("ours") else "", rounds=rounds, reps=reps)
            rows.append(row)
            log(row)
        write(out_csv, rows)
    return rows


def ours_parts(step, reps=200) -> dict:
    """ms a call that ours' eager path spends in each of its parts (inclusive: a part's time holds the
    parts it calls), `reps` calls of step() with each part wrapped in a timer, and the whole call."""
    from lmperf.kernels import flash_attention_triton as ft
    from lmperf.kernels import launch as kernel_launch
    spent = {}

    def timed(name, fn):
        def wrapped(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0
        return wrapped
    Function = ft.FlashAttention2Triton
    patches = [(kernel_launch.Plan, "allocate"), (kernel_launch.Plan, "replay"), (kernel_launch, "planned"),
               (kernel_launch, "plan_key"), (kernel_launch, "then_key"), (ft, "_backward"), (ft, "_heads")]
    saved = [(owner, name, owner.__dict__[name]) for owner, name in patches]
    forward = Function.__dict__["forward"]
    try:
        for owner, name, fn in saved:
            setattr(owner, name, timed(name, fn))
        Function.forward = staticmethod(timed("Function.forward", forward.__func__))
        step()
        spent.clear()
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        spent["call"] = time.perf_counter() - t0
        torch.cuda.synchronize()
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)
        Function.forward = forward
    return {name: t / reps * 1e3 for name, t in spent.items()}


def launch_cost(case, out_csv, log):
    """Each Triton kernel of ours, as the eager path launches it: through the JIT (kernel[grid])
    and through the compiled kernel's launcher with the same arguments."""
    from triton import knobs
    from triton.runtime import driver
    import lmperf.kernels.flash_attention_triton as ft
    from lmperf.kernels import launch as kernel_launch
    calls = []
    real = ft.plain_launch

    class Rec:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def go(*args, **kwargs):
                compiled = self.kernel[grid](*args, **kwargs)
                calls.append((self.kernel, grid, args, kwargs, compiled))
                return compiled
            return go

    # the tile kernels' launches (ft's name) and the Gluon kernels' (kernel_launch's)
    ft.plain_launch = kernel_launch.plain_launch = lambda kernel: Rec(kernel)
    try:
        q, k, v = leaves(case)
        step_fn(attention("ours", CASES[case][4]), q, k, v)()
    finally:
        ft.plain_launch = kernel_launch.plain_launch = real
    torch.cuda.synchronize()
    rows = []
    for kernel, grid, args, kwargs, compiled in calls:
        names = kernel.arg_names
        bound = list(args) + [kwargs[n] if n in kwargs else kernel.params[i].default
                              for i, n in enumerate(names) if i >= len(args)]
        reps = 500
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            kernel[grid](*args, **kwargs)
        t_jit = (time.perf_counter() - t0) / reps * 1e3
        torch.cuda.synchronize()
        g = tuple(grid) + (1,) * (3 - len(grid))
        dev = driver.active.get_current_device()
        t0 = time.perf_counter()
        for _ in range(reps):
            stream = driver.active.get_current_stream(dev)
            compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, None,
                         knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound)
        t_direct = (time.perf_counter() - t0) / reps * 1e3
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.empty(1, device="cuda").zero_()
        t_torch = (time.perf_counter() - t0) / reps * 1e3
        torch.cuda.synchronize()
        row = dict(case=case, kernel=kernel.__name__ if hasattr(kernel, "__name__") else str(kernel), grid=str(grid),
                   jit_ms=t_jit, direct_ms=t_direct, torch_zero_ms=t_torch, gpu=torch.cuda.get_device_name())
        rows.append(row)
        log(row)
    write(out_csv, rows)


# ---------------------------------------------------------------------------------------------
# --stub: the Python cost of ours on the CPU, kernel launches stubbed out

# name: (the case, the tiny CPU shape (batch, heads, N, D) taking its dispatch's branches, the
# backends forced (LMPERF_FA_BACKEND, LMPERF_FA_BWD_BACKEND) or None)
STUB_CASES = {
    "model64": ("model64", (2, 2, 64, 64), None),
    "assign64": ("assign64", (2, 1, 64, 64), None),
    "model128": ("model128", (2, 2, 64, 128), None),
    "grid4096": ("grid4096", (1, 1, 128, 128), ("gluon", "gluon")),  # both Gluon kernels (N a multiple of 128)
    "grid1024_64": ("grid1024_64", (1, 1, 64, 64), None),
    "model128_tile": ("model128", (2, 2, 128, 128), ("triton", "triton")),  # the tile kernels at N = 128
    "model128_gluon": ("model128", (2, 2, 128, 128), ("gluon", "gluon")),  # both Gluon kernels there
    "grid4096_tile": ("grid4096", (1, 1, 128, 128), None),  # the tile kernels, split as at 4,096 rows
    "grid16384_64_tile": ("grid16384_64", (1, 1, 128, 64), None),
    "grid16384_64_gluon": ("grid16384_64", (1, 1, 128, 64), ("gluon", "gluon")),
}
STUB_IMPLS = ("trivial", "bare", "jit", "cache", "plan")


class StubCompiled:
    """Stands in for a compiled Triton kernel: its launcher (run) launches nothing; it counts."""
    function = None
    packed_metadata = None

    def __init__(self):
        self.runs = 0

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        self.runs += 1


class CudaLauncher:
    """Stands in for Triton's launcher of a kernel taking TMA descriptors (the Gluon kernels'): a
    class of that name, no scratch, its C launch function `launch` being Triton's own descriptor
    wrapper (wrap_handle_tensordesc: each descriptor to a tensor map, the map's encoding stubbed)
    around a launch function that launches nothing; it counts."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, False

    def __init__(self, compiled, bound):
        import triton.backends.nvidia.driver as nvidia
        self.compiled = compiled
        signature = {i: "tensordesc" if type(a).__name__ == "TensorDescriptor" else "i32" for i, a in enumerate(bound)}
        meta = dict(swizzle=128, elem_size=2, elem_type="bf16", block_size=[64, 64], fp4_padded=False)
        self.launch = nvidia.wrap_handle_tensordesc(self.launched, signature,
                                                    [meta] * sum(v == "tensordesc" for v in signature.values()))

    def __call__(self, *args):
        return self.launch(*args[:4], args[4], False, False, None, None, *args[5:])

    def launched(self, *args):
        self.compiled.runs += 1


def stub_tensor_maps() -> None:
    """Triton's descriptor-to-tensor-map step (make_tensordesc_arg, which has the CUDA driver encode
    the map) stood in for by one that makes a bytes object of a map's size."""
    import triton.backends.nvidia.driver as nvidia
    nvidia.make_tensordesc_arg = lambda arg, meta: [bytes(128), *arg.shape, *arg.strides]


class StubKernel:
    """Stands in for a Triton JITFunction in CachedLaunch: the kernel's parameters; kernel[grid](...)
    (the JIT) returns the StubCompiled without launching anything, and counts. A kernel taking TMA
    descriptors gets a CudaLauncher stand-in at its first call (maps: see stub_tensor_maps)."""

    def __init__(self, kernel):
        self.arg_names, self.params, self.pre_run_hooks = kernel.arg_names, kernel.params, []
        self.compiled = StubCompiled()
        self.jit_calls = 0

    def __getitem__(self, grid):
        return self.jit

    def jit(self, *args, **kwargs):
        self.jit_calls += 1
        if self.jit_calls == 1:
            bound = [*args, *[kwargs.get(p.name, p.default) for p in self.params[len(args):]]]
            if any(type(a).__name__ == "TensorDescriptor" for a in bound):
                self.compiled.run = CudaLauncher(self.compiled, bound)
        return self.compiled


def stub_out_launches():
    """Every kernel of ours launched through a CachedLaunch of a StubKernel (the JIT and the
    launcher stubbed; the Gluon kernels' launcher through Triton's descriptor wrapper, tensor maps
    stubbed); the CUDA-only checks answered as on a Hopper GPU; returns the StubKernels.
    Needs a process whose TRITON_INTERPRET is not 1 (plain_launch's compiled path)."""
    import triton.runtime.jit as triton_jit
    from lmperf.kernels import flash_attention_gluon as fg
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    from lmperf.kernels import flash_attention_gluon_fused as gf
    from lmperf.kernels import flash_attention_triton as ft
    from lmperf.kernels import launch as kernel_launch
    stubs = []
    for module in (ft, fg, gb, gf):
        for value in vars(module).values():
            if isinstance(value, triton_jit.JITFunction) and value.arg_names and value.__name__.endswith("kernel"):
                stubs.append(StubKernel(value))
                kernel_launch.LAUNCHES[value] = kernel_launch.CachedLaunch(stubs[-1])
    kernel_launch.current_stream = lambda: (0, 0)
    stub_tensor_maps()
    ft.check_device = lambda q: None
    fg.available = lambda device=None: None
    fg.sm_count = lambda device: 132
    fg.unsupported = lambda *a: None  # its CUDA-only checks; gb's shape checks run as they are
    gb.unsupported = gb.shape_unsupported
    return stubs


def pin_configs(case):
    """The tile configs (ft's rule memos) of the case's real shape, whatever the shape called."""
    import functools
    from lmperf.kernels import flash_attention_triton as ft
    b, h, n, _, _ = CASES[case]
    ft.fwd_config_memo = functools.lru_cache(maxsize=64)(lambda _n, d, dtype, causal, _bh, host=False: ft.fwd_config(
        n, d, dtype, causal, b * h, host))
    ft.bwd_config_memo = functools.lru_cache(maxsize=64)(
        lambda _n, d, dtype, causal, _bh, group, host=False: ft.bwd_config(n, d, dtype, causal, b * h, group, host))


def stub_step(impl, shape, layout):
    """A forward + `.sum().backward()` of `impl` on fresh CPU bf16 leaves of the tiny shape."""
    from lmperf.kernels.flash_attention_triton import FlashAttention2Triton
    b, h, n, d = shape
    leaf_shape = (b, n, h, d) if layout == "model" else (b * h, n, d)
    q, k, v = (torch.randn(leaf_shape, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    view = (lambda t: t.transpose(1, 2)) if layout == "model" else (lambda t: t)
    if impl == "trivial":
        fn = lambda q, k, v: q * 1  # noqa: E731
    elif impl == "bare":
        fn = lambda q, k, v: Bare.apply(q, k, v, True)  # noqa: E731
    else:
        fn = lambda q, k, v: FlashAttention2Triton.apply(q, k, v, True)  # noqa: E731

    def step():
        fn(view(q), view(k), view(v)).sum().backward()
        q.grad = k.grad = v.grad = None
    return step


class Bare(torch.autograd.Function):
    """The floor of an autograd Function with ours' allocations and saved tensors, no kernels."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


class FlashInFunction(torch.autograd.Function):
    """SDPA-flash's causal forward and backward ops (aten's, the kernels `flash` launches) behind a
    Python autograd Function: the Function's host cost with real kernels, against SDPA's C++ node."""

    @staticmethod
    def forward(ctx, q, k, v):
        out, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True)
        ctx.save_for_backward(q, k, v, out, lse, cq, ck, seed, offset)
        ctx.max_qk = (mq, mk)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cq, ck, seed, offset = ctx.saved_tensors
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, cq, ck, *ctx.max_qk, 0.0, True, seed, offset)


def stub_cost(cases, out_csv, log, reps=300, rounds=7, profile_txt=None):
    """us a call of each STUB_IMPLS at each case: rounds interleaved across impls, the median of
    the rounds' means; the launches a call (JIT and launcher) counted in one extra call."""
    import statistics
    os.environ.pop("TRITON_INTERPRET", None)
    import lmperf.kernels.flash_attention_gluon as fg
    stubs = stub_out_launches()
    rows = []
    for case in cases:
        real, shape, backends = STUB_CASES[case]
        layout = CASES[real][4]
        if backends and fg.IMPORT_ERROR is not None:
            continue
        pin_configs(real)
        for name, value in zip(("LMPERF_FA_BACKEND", "LMPERF_FA_BWD_BACKEND"), backends or (None, None)):
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        steps = {impl: stub_step(impl, shape, layout) for impl in STUB_IMPLS}
        times = {impl: [] for impl in STUB_IMPLS}
        launches = {}
        for impl in STUB_IMPLS:
            os.environ[LAUNCH_ENV] = impl
            for _ in range(20):
                steps[impl]()
            before = [(s.jit_calls, s.compiled.runs) for s in stubs]
            steps[impl]()
            after = [(s.jit_calls, s.compiled.runs) for s in stubs]
            launches[impl] = tuple(sum(a[i] - b[i] for a, b in zip(after, before)) for i in (0, 1))
        for _ in range(rounds):
            for impl in STUB_IMPLS:
                os.environ[LAUNCH_ENV] = impl
                step = steps[impl]
                t0 = time.perf_counter()
                for _ in range(reps):
                    step()
                times[impl].append((time.perf_counter() - t0) / reps * 1e6)
        if profile_txt and case == cases[0]:
            os.environ[LAUNCH_ENV] = "plan"
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(reps):
                steps["plan"]()
            pr.disable()
            s = io.StringIO()
            st = pstats.Stats(pr, stream=s)
            st.sort_stats("tottime").print_stats(40)
            st.sort_stats("cumulative").print_stats(50)
            Path(profile_txt).write_text(s.getvalue())
        for impl in STUB_IMPLS:
            row = dict(case=case, real_shape="x".join(map(str, CASES[real][:4])), cpu_shape="x".join(map(str, shape)),
                       layout=layout, impl=impl, us_per_call=statistics.median(times[impl]),
                       min_us=min(times[impl]), max_us=max(times[impl]), jit_launches=launches[impl][0],
                       launcher_launches=launches[impl][1], rounds=rounds, reps=reps)
            rows.append(row)
            log(row)
    os.environ.pop(LAUNCH_ENV, None)
    write(out_csv, rows)
    return rows


def stub_op_cost(out_csv, log, reps=2000, rounds=5):
    """us a call of each Gluon kernel's op (torch.compile's graphs call them: lmperf::
    flash_attention_forward_gluon, _dq_gluon, _dkdv_gluon, _bwd_gluon_fused) against its launcher called directly,
    launches stubbed, at (1, 1, 128, 128) bf16, through the JIT, the launch cache and plans (stub_cost's
    set-up; the ops' plans replay to the launchers)."""
    import statistics
    os.environ.pop("TRITON_INTERPRET", None)
    import lmperf.kernels.flash_attention_gluon as fg
    if fg.IMPORT_ERROR is not None:
        return []
    import lmperf.kernels.flash_attention_gluon_bwd as gb
    import lmperf.kernels.flash_attention_gluon_fused as gf
    stub_out_launches()
    q, k, v, out, do, dq, dk, dv = (torch.randn(1, 1, 128, 128, dtype=torch.bfloat16) for _ in range(8))
    lse, delta = torch.randn(1, 128), torch.randn(1, 128)
    ops = torch.ops.lmperf
    calls = {
        ("forward", "direct"): lambda: fg.forward(q, k, v, True),
        ("forward", "op"): lambda: ops.flash_attention_forward_gluon(q, k, v, True),
        ("dq", "direct"): lambda: gb.launch_dq(q, k, v, out, do, lse, delta, dq, True),
        ("dq", "op"): lambda: ops.flash_attention_dq_gluon(q, k, v, out, do, lse, delta, dq, True),
        ("dkdv", "direct"): lambda: gb.launch_dkdv(q, k, v, do, lse, delta, dk, dv, True),
        ("dkdv", "op"): lambda: ops.flash_attention_dkdv_gluon(q, k, v, do, lse, delta, dk, dv, True),
        ("fused", "direct"): lambda: gf.launch(q, k, v, out, do, lse, dq, dk, dv, True),
        ("fused", "op"): lambda: ops.flash_attention_bwd_gluon_fused(q, k, v, out, do, lse, dq, dk, dv, True),
    }
    rows = []
    for mode in ("jit", "cache", "plan"):
        os.environ[LAUNCH_ENV] = mode
        for (kernel, how), call in calls.items():
            if how == "direct" and mode == "plan":
                continue  # a plan is the op's (or FlashAttention2Triton's), not the launcher's
            for _ in range(20):
                call()
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(reps):
                    call()
                times.append((time.perf_counter() - t0) / reps * 1e6)
            row = dict(case="gluon ops", kernel=kernel, call=how, launch=mode, us_per_call=statistics.median(times),
                       min_us=min(times), rounds=rounds, reps=reps)
            rows.append(row)
            log(row)
    os.environ.pop(LAUNCH_ENV, None)
    write(out_csv, rows)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default=None, help="cases, comma-separated (default: model64,assign64; with --stub, "
                                                  "every stub case)")
    ap.add_argument("--impls", default="ours,ours_jit,cudnn,flash")
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--launch", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--anatomy", action="store_true", help="do_bench's loop taken apart (fa_host_anatomy.csv)")
    ap.add_argument("--bench-harness", default="",
                    help="the benchmark's own setup and timer at --only's shapes, in these harnesses (eager, "
                         "leaderboard), each of --impls among ours, cudnn, flash (fa_host_bench{TAG}.csv; "
                         "with --profile, cProfile of ours: fa_host_bench_profile{TAG}.txt)")
    ap.add_argument("--floors", action="store_true",
                    help="ours' host time in the benchmark's eager call taken apart: allocations, an autograd Function "
                         "that only allocates, ours' plans, cuDNN and flash (fa_host_floors{TAG}.csv)")
    ap.add_argument("--split-sweep", action="store_true",
                    help="ours as the rule runs it, with a capture's split and with none, cuDNN beside, in the benchmark's eager call: "
                         "host time, do_bench, GPU time (fa_host_split{TAG}.csv)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--stub", action="store_true", help="the CPU's measure of our Python, launches stubbed")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=7, help="rounds of --stub, --floors and --split-sweep")
    ap.add_argument("--bench-rounds", type=int, default=1,
                    help="rounds of do_bench, the implementations in turn (p20_ms/p80_ms: the rounds' min/max)")
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench's rep (ms) a round")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    log = lambda r: print(r, flush=True)  # noqa: E731
    if a.stub:
        cases = a.only.split(",") if a.only else list(STUB_CASES)
        stub_cost(cases, a.out / f"fa_host_stub{a.tag}.csv", log, a.reps, a.rounds,
                  a.out / f"fa_host_stub_profile{a.tag}.txt" if a.profile else None)
        stub_op_cost(a.out / f"fa_host_stub_ops{a.tag}.csv", log)
        return 0
    cases = (a.only or "model64,assign64").split(",")
    if a.split_sweep:
        split_sweep(cases, a.out / f"fa_host_split{a.tag}.csv", log, a.rounds)
        return 0
    if a.floors:
        floors(cases, a.out / f"fa_host_floors{a.tag}.csv", log, a.rounds)
        return 0
    if a.bench_harness:
        bench_harness(cases, a.impls.split(","), a.bench_harness.split(","), a.out / f"fa_host_bench{a.tag}.csv", log,
                      a.bench_rounds, a.out / f"fa_host_bench_profile{a.tag}.txt" if a.profile else None)
        return 0
    if a.launch:
        launch_cost(cases[0], a.out / f"fa_host_launch{a.tag}.csv", log)
    if a.profile:
        profile_ours(cases[0], a.out / f"fa_host_profile{a.tag}.txt", a.impls.split(","), a.modes.split(","))
    if a.anatomy:
        anatomy(cases, a.impls.split(","), a.out / f"fa_host_anatomy{a.tag}.csv", log)
    if not a.skip_bench:
        bench(cases, a.impls.split(","), a.modes.split(","), a.out / f"fa_host_cost{a.tag}.csv", log,
              a.bench_rounds, a.rep_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
