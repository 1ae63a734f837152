"""How a benchmark job runs its cases beyond loop.run_cases' loop: in worker processes
(`--workers`, bench/workers.py) and, for a repeat in a fresh process, only some of them
(`--cases`).

    python -m lmperf.bench.flash_attention check --spec '{...}' --workers 6 ...
    python -m lmperf.bench.lrpe bench --spec '{...}' --cases '1d-n32768-l0-*' --out .../run1.csv ...

`--workers N` (N > 1): a correctness check measures its cases in N worker processes, a timing
job first compiles its compiling cases in N worker processes and then times every case in its
own (bench/workers.py says why each). 1, the default, runs everything in the job's process.

`--cases PATTERN ...`: only the cases whose id matches one of the shell-style patterns, in the
job's order, with the job's spec: the same cases, measured again in a fresh process (the
workflow's repeats, rules/repeats.smk). A pattern that matches no case is an error.
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import threading
from pathlib import Path
from typing import Callable

from lmperf.bench import cli, device, loop, workers as worker_processes


def options(parser: argparse.ArgumentParser, workers: bool = True) -> None:
    """Add `--cases` and, where the job can use them, `--workers` to a benchmark's command line."""
    parser.add_argument("--cases", nargs="+", metavar="PATTERN",
                        help="only the cases whose id matches one of these shell-style patterns")
    if workers:
        parser.add_argument("--workers", type=int, default=1, metavar="N",
                            help="worker processes: a check's cases run in them, a timing job's "
                                 "compiles are warmed in them (default %(default)s: none)")


def select(cases: list[dict], patterns: list[str] | None) -> list[dict]:
    """The cases whose id matches one of `patterns` (all of them for None), in their order;
    ValueError naming a pattern that matches none."""
    if patterns is None:
        return cases
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(c["case_id"], p) for c in cases)]
    if unmatched:
        raise ValueError(f"case patterns {unmatched} match none of the job's {len(cases)} cases "
                         f"(e.g. {', '.join(c['case_id'] for c in cases[:3])})")
    return [c for c in cases if any(fnmatch.fnmatchcase(c["case_id"], p) for p in patterns)]


def run(*, section: str, study: str, cases: list[dict], measure: Callable[[dict], list[dict]], args,
        fingerprint: dict, parallel: bool = False, warm: Callable[[dict], list[dict]] | None = None,
        compiles: Callable[[dict], bool] | None = None, ahead=None,
        prepare: Callable[[list[dict], Callable[[str], None]], None] | None = None):
    """loop.run_cases over the cases of `cases` that args.cases selects, with the job's
    workers (args.workers): `parallel`, the cases measured in them (a check); or `warm` run
    first in them on the cases that `compiles` (a timing job), those the journal already holds
    left out. `ahead(cases)`: a context manager measuring the selected cases the journal does not
    hold ahead of the loop (bench/isolation.py's Ahead), the loop's measure in place of `measure`.
    `prepare(cases, say)`: run on the cases still to measure while a warmed job shares the device,
    beside the workers' warm-up (in a thread: both compile or count, neither times anything),
    and finished before the job waits for the device to itself (a contender's compiles in its own
    process: bench/flash_attention.py; the ladder's FLOP counts: bench/ladder.py)."""
    n = getattr(args, "workers", 1)
    if n < 1:
        raise SystemExit(f"error: --workers {n}: at least 1")
    try:
        cases = select(cases, args.cases)
    except ValueError as exc:
        raise SystemExit(f"error: --cases: {exc}") from None
    run_cases = lambda measure: loop.run_cases(section=section, study=study, cases=cases, measure=measure,
                                                 out_csv=args.out, hw=args.hw, log_path=args.log,
                                                 fingerprint=fingerprint)
    progress = lambda: loop.Progress(f"{section}/{study}", len(cases), args.log)
    if ahead is not None:
        done, _ = worker_processes.journalled(args.out)
        with ahead([c for c in cases if c["case_id"] not in done]) as measure_ahead:
            return run_cases(measure_ahead)
    if n > 1 and parallel:
        log = progress()
        try:
            with worker_processes.Pool(measure, n, log.say) as pool:
                return run_cases(worker_processes.Ahead(pool, cases, Path(args.out)))
        finally:
            log.close()
    warming = device.warming()  # a job that warms beside others (cli.bench_args' `warms`): alone next
    if warming or (n > 1 and warm is not None):
        done, _ = worker_processes.journalled(args.out)
        todo = [c for c in cases if c["case_id"] not in done]
        log = progress()
        lock = threading.Lock()

        def say(text: str) -> None:  # whole lines from the job's thread and the preparation's
            with lock:
                log.say(text)
        try:
            with beside(prepare if warming else None, todo, say):
                if n > 1 and warm is not None:
                    worker_processes.warm_up(warm, [c for c in todo if compiles(c)], n, say)
            if warming:
                device.alone(say=say)
        finally:
            log.close()
    return run_cases(measure)


@contextlib.contextmanager
def beside(prepare, cases: list[dict], say):
    """Run `prepare(cases, say)` in a thread while the body runs (None: nothing); wait for it
    after the body and raise what it raised. Not waited for when the body raises (an interrupt
    ends the job: the thread is a daemon)."""
    if prepare is None:
        yield
        return
    raised: list[BaseException] = []

    def target():
        try:
            prepare(cases, say)
        except BaseException as exc:  # noqa: BLE001  (raised in the job's thread below)
            raised.append(exc)
    thread = threading.Thread(target=target, name="prepare", daemon=True)
    thread.start()
    yield
    thread.join()
    if raised:
        raise raised[0]
