"""Where a benchmark job's time goes: run one `python -m lmperf.bench.<x>` command in this
process with the functions every timing job calls timed (the model's set-up, the timed steps,
the idle-share profile, the collection after each case, the ladder's profiles and memory
trials), then print the seconds each took in all and how often it ran.

    PYTHONPATH=src python3 tools/job_phases.py lmperf.bench.e2e --study variants --size 2.7B \\
        --spec '{...}' --out /tmp/variants.csv --hw probe

Take the job's command from `snakemake -n -p <its CSV>` and give its arguments after the module.
The job runs as Snakemake runs it and writes its CSV; each timer adds about a microsecond a
call. tools/README.md ("Where an end-to-end job's time goes") has what it measured on an H100.
"""
from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import functools
import gc
import importlib
import sys
import time

SECONDS: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()


def timed(module, name: str) -> None:
    """Replace `module.name` (a function) by one that adds its time to SECONDS."""
    function, label = getattr(module, name), f"{module.__name__.rsplit('.', 1)[-1]}.{name}"

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - t0
            CALLS[label] += 1
    setattr(module, name, wrapper)


def timed_context(module, name: str) -> None:
    """Replace `module.name` (a context manager factory) by one that times its enter and exit,
    not the block inside it."""
    factory, label = getattr(module, name), f"{module.__name__.rsplit('.', 1)[-1]}.{name}"

    @contextlib.contextmanager
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        with factory(*args, **kwargs) as value:
            SECONDS[f"{label} (enter, exit)"] += time.perf_counter() - t0
            yield value
            t0 = time.perf_counter()
        SECONDS[f"{label} (enter, exit)"] += time.perf_counter() - t0
    setattr(module, name, wrapper)


def report(t0: float) -> None:
    SECONDS["the whole process after start-up"] = time.perf_counter() - t0
    for label, seconds in sorted(SECONDS.items(), key=lambda kv: -kv[1]):
        print(f"phase {label:42s} {seconds:9.2f} s  {CALLS[label] or '':>5}", file=sys.stderr)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("module", help="the benchmark's module, e.g. lmperf.bench.e2e")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the job's arguments")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    from lmperf import train
    from lmperf.bench import e2e, energy, honest, loop, memory_fit, profile, timing
    job = importlib.import_module(args.module)
    SECONDS["imports"] = time.perf_counter() - t0
    for module, name in ((train, "setup"), (e2e, "time_steps"), (e2e, "run_timed"), (timing, "gpu_idle"),
                         (loop, "clean_device"), (gc, "collect"), (profile, "kernel_times"),
                         (memory_fit, "one_step_peak_mib"), (timing, "do_bench_quantiles"),
                         (timing, "do_bench_cudagraph_quantiles"), (timing, "bench_calls"), (timing, "bench_graph"),
                         (honest, "stale_output")):
        if hasattr(module, name):  # the kernel timers of this version of bench/timing.py
            timed(module, name)
    timed_context(energy, "meter")
    # the ladder's, FlashAttention's and LRPE's, where the job has them
    for name in ("profile_step", "flop_rows", "phase_floors", "warm", "setup_bench", "measure_bench", "warm_bench",
                 "_gpu_time_rows", "kernel_ms", "graph_rows"):
        if hasattr(job, name):
            timed(job, name)
    atexit.register(report, t0)
    job.main(args.args)


if __name__ == "__main__":
    main(sys.argv[1:])
