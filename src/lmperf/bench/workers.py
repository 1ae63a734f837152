"""Worker processes beside a benchmark job's own: a correctness check's cases run side by side
in them (`Ahead`), and a timing job's compiling cases are compiled in them before its timed
loop (`warm_up`).

What a job waits on, and what may run side by side
--------------------------------------------------
On a GPU, a correctness check spends its time compiling, not computing: Triton's JIT compiles
each kernel specialisation a case needs and Inductor each graph (an fp32 case of the
FlashAttention check takes up to 14 s on an H100, its kernels' run milliseconds). A check times
nothing, so its cases may run at once, each worker a process of its own (its own CUDA context
and compile state; `spawn`ed, since CUDA does not survive a fork). A timing job may not: its
numbers would share the GPU. What it can share is what compiling leaves on disk: Triton's
kernels and Inductor's graphs go to the results folder's caches (`.cache/<hw>/`,
lmperf.workflow.COMPILE_CACHES), so compiling its cases first in worker processes, results
discarded, leaves the timed loop, still serial and in one process, to load them. Compiled code
is the same code either way (our kernels' tiles come from a rule table, not a search), so the
times do not change, only the wait before them. One choice is not code: Inductor times a few
launch configs of some of its kernels the first time they run and caches the fastest. A worker
would time them beside the other workers, on a shared GPU, so the warm-up caches no such choice
(`autotune_local_cache` off in its workers, a setting Inductor's graph cache does not key on):
the timed process makes it on an idle GPU, as without a warm-up. (The warmed graphs, ours and
FlexAttention under torch.compile, have no matmul for Inductor to time padded and unpadded.)

Why both ways and not one: a warm-up of a check would run every case twice (the check's own
run is the work, compiling included), while running a timing job's cases in workers would time
them side by side. So a check's cases run in the workers, a timing job's compiles are warmed.

The journal stays the parent's
------------------------------
`Ahead` is a `measure` for loop.run_cases: the loop, its journal, its failure rows and its
interrupts are the serial job's. It hands the cases the loop has still to measure (in order) to
the workers ahead of the loop and gives each case's rows back when the loop reaches it, so the
journal records exactly what it records in a serial run: a case started when the loop reaches
it, done with its rows (the worker ran it through loop.run_case: a compile failure retried in
a fresh cache, a failure a row), interrupted by Ctrl-C or SIGTERM (the workers stop with the
parent). The parent does no device work, so a death the journal counts is still the death of
the job with that case open. A worker that dies in a case (an illegal memory access) is not the
job's death: the case is tried once more in a fresh worker, and a second death is an `error`
row, as a case that killed a serial job twice. Rows finished ahead of the loop and not yet
journalled are lost with the parent, never half-written.

The workers, as every job's own process (bench/device.py's `take`), leave the objects of what
they imported out of the garbage collector's work (`device.freeze_imports`): the collection after
every case would otherwise cost a quarter of a second.

A row's `wall_s` is the loop's wait for its case (a case finished ahead waits little), so a
job's sum of `wall_s` is still its time on the GPU; `worker_wall_s` is the case's own time in
its worker.
"""
from __future__ import annotations

import collections
import importlib
import json
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable

from lmperf.bench import device, loop

DEATHS = 2  # a case whose worker died this many times is an error row, as in a serial job


def qualified_name(fn: Callable) -> tuple[str, str]:
    """(module, name) a worker imports `fn` by: a module-level function; a benchmark run as
    `python -m lmperf.bench.<x>` defines its functions in `__main__`, named by its spec."""
    module = fn.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is None:
            raise ValueError(f"{fn.__qualname__} is defined in a script: workers import functions by module")
        module = spec.name
    if "<" in fn.__qualname__:
        raise ValueError(f"{fn.__qualname__}: workers run module-level functions, not lambdas or closures")
    return module, fn.__qualname__


class _Unjournalled:
    """What loop.run_case needs of a journal, in a worker: the parent keeps the journal."""

    def deaths(self, case_id: str) -> int:
        return 0

    def start(self, case_id: str) -> None:
        pass


class _ToParent:
    """A worker's progress lines, sent to the parent, which writes them to the job's log."""

    def __init__(self, conn):
        self.conn = conn

    def say(self, text: str) -> None:
        self.conn.send(("say", text))


def serve(conn, module: str, name: str, workers: int = 1, warming: bool = False) -> None:
    """A worker's loop: receive a case, run it through loop.run_case with `module.name` as its
    measure, send its rows back; stop at None or when the parent is gone. Inductor compiles in
    this worker's share of the CPU cores (it starts a pool of compile processes of the machine's
    size in every process otherwise); `warming`: compile only, leaving the kernels'
    launch-config choices to the timed process (module docstring). Neither setting is in
    Inductor's cache key."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's, which stops the workers
    measure = getattr(importlib.import_module(module), name)
    import torch._inductor.config
    torch._inductor.config.compile_threads = max(1, (os.cpu_count() or 1) // workers)
    if warming:
        torch._inductor.config.autotune_local_cache = False
    device.freeze_imports()
    while True:
        try:
            case = conn.recv()
        except (EOFError, OSError):
            return
        if case is None:
            return
        try:
            conn.send(("rows", loop.run_case(case, measure, _Unjournalled(), _ToParent(conn))))
        except (BrokenPipeError, ConnectionResetError):
            return  # the parent is gone (killed): nothing to send the rows to


class Pool:
    """`size` worker processes, each running cases with `measure` one at a time. Use as a
    context manager: the workers are stopped on the way out, whatever happened."""

    def __init__(self, measure: Callable[[dict], list[dict]], size: int, say: Callable[[str], None],
                 warming: bool = False):
        if size < 1:
            raise ValueError(f"a pool needs at least one worker, got {size}")
        self.target, self.size, self.say, self.warming = qualified_name(measure), size, say, warming
        self.context = multiprocessing.get_context("spawn")
        self.idle: list = []
        self.busy: dict = {}  # connection -> (process, case)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def free(self) -> int:
        return self.size - len(self.busy)

    def holds(self, case_id: str) -> bool:
        return any(case["case_id"] == case_id for _, case in self.busy.values())

    def submit(self, case: dict) -> None:
        """Hand `case` to an idle worker, or a new one (there must be a free slot)."""
        if not self.free():
            raise RuntimeError("every worker is busy")
        if self.idle:
            proc, conn = self.idle.pop()
        else:
            conn, child = self.context.Pipe()
            proc = self.context.Process(target=serve, args=(child, *self.target, self.size, self.warming), daemon=True,
                                        name=f"lmperf-worker-{self.target[1]}")
            proc.start()
            child.close()
        conn.send(case)
        self.busy[conn] = (proc, case)

    def collect(self) -> list[tuple[dict, list[dict] | None, int | None]]:
        """Wait until a busy worker finishes its case or dies: [(case, rows, None)] for a
        finished case, [(case, None, exit code)] for one its worker died in."""
        if not self.busy:
            raise RuntimeError("no case is running")
        while True:
            wait([*self.busy, *(proc.sentinel for proc, _ in self.busy.values())])
            out = []
            for conn, (proc, case) in list(self.busy.items()):
                try:
                    while conn in self.busy and conn.poll():
                        kind, payload = conn.recv()
                        if kind == "say":
                            self.say(f"  [{case['case_id']}] {payload}")
                        else:
                            del self.busy[conn]
                            self.idle.append((proc, conn))
                            out.append((case, payload, None))
                except (EOFError, OSError):
                    pass  # its end is closed: the process is gone, as its sentinel says
                if conn in self.busy and not proc.is_alive():
                    proc.join()
                    del self.busy[conn]
                    conn.close()
                    out.append((case, None, proc.exitcode))
            if out:
                return out

    def close(self) -> None:
        """Stop every worker: idle ones are asked to, busy ones (an interrupted job) terminated."""
        for proc, conn in self.idle:
            try:
                conn.send(None)
            except OSError:
                pass
        for conn, (proc, _) in self.busy.items():
            proc.terminate()
        for proc, conn in [*self.idle, *((p, c) for c, (p, _) in self.busy.items())]:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()
        self.idle, self.busy = [], {}


def journal_path(out_csv: Path) -> Path:
    """Where loop.run_cases keeps the journal of `out_csv` (bench/journal.py's Journal)."""
    out_csv = Path(out_csv)
    return out_csv.parent / ".journal" / (out_csv.name + ".jsonl")


def journalled(out_csv: Path) -> tuple[set[str], collections.Counter]:
    """(the cases done, the deaths of each case: starts neither done nor interrupted) in the
    journal of `out_csv` as it is on disk now; empty when there is none."""
    path = journal_path(out_csv)
    done, starts, ends = set(), collections.Counter(), collections.Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a crash
                continue
            if event.get("event") == "start":
                starts[event["case_id"]] += 1
            elif event.get("event") in ("done", "interrupted"):
                ends[event["case_id"]] += 1
                if event["event"] == "done":
                    done.add(event["case_id"])
    return done, starts - ends


class WorkerDied(RuntimeError):
    """A case's worker process died in it DEATHS times: its row says so."""


class Ahead:
    """A `measure(case)` for loop.run_cases that runs the loop's cases ahead of it in `pool`'s
    workers (module docstring). The first call reads the journal run_cases has just opened, so
    that the cases it resumes or has given up on (died twice) are not run again."""

    def __init__(self, pool: Pool, cases: list[dict], out_csv: Path):
        self.pool, self.cases, self.out_csv = pool, cases, out_csv
        self.queue: collections.deque | None = None
        self.results: dict[str, list[dict] | WorkerDied] = {}
        self.deaths: collections.Counter = collections.Counter()

    def _plan(self, first: str) -> None:
        done, deaths = journalled(self.out_csv)
        deaths[first] -= 1  # the loop has just journalled this case's start
        self.queue = collections.deque(c for c in self.cases if c["case_id"] not in done
                                       and (c["case_id"] == first or deaths[c["case_id"]] < DEATHS))

    def __call__(self, case: dict) -> list[dict]:
        case_id = case["case_id"]
        if self.queue is None:
            self._plan(case_id)
        if (case_id not in self.results and not self.pool.holds(case_id)
                and all(c["case_id"] != case_id for c in self.queue)):
            self.queue.appendleft(case)  # not one the plan expected: run it next
        while case_id not in self.results:
            while self.queue and self.pool.free():
                self.pool.submit(self.queue.popleft())
            for done, rows, exitcode in self.pool.collect():
                self._record(done, rows, exitcode)
        result = self.results.pop(case_id)
        if isinstance(result, WorkerDied):
            raise result
        return [{**row, "worker_wall_s": row["wall_s"]} for row in result]

    def _record(self, case: dict, rows: list[dict] | None, exitcode: int | None) -> None:
        case_id = case["case_id"]
        if rows is not None:
            self.results[case_id] = rows
            return
        self.deaths[case_id] += 1
        why = f"the worker process died in this case (exit code {exitcode})"
        if self.deaths[case_id] < DEATHS:
            self.pool.say(f"  {case_id}: {why}; trying it once more in a fresh worker")
            self.queue.appendleft(case)
        else:
            self.results[case_id] = WorkerDied(f"{why}, {DEATHS} times (e.g. an illegal memory access); not retried")


def warm_up(warm: Callable[[dict], list[dict]], cases: list[dict], workers: int,
            say: Callable[[str], None]) -> None:
    """Run `warm(case)` once for every case in up to `workers` worker processes, rows discarded,
    each step a line to `say`: what compiling leaves in the compile caches is what the timed loop
    then loads (module docstring). A case that fails or kills its worker is named in the log and
    costs the timed loop only its compile. Fewer than two cases a worker and the warm-up would cost more than it
    saves (each worker starts torch and CUDA, about ten seconds, and a cached compile still
    traces: a third of a cold one): so at most one worker for every two cases, and with fewer
    than two cases nothing is warmed."""
    size = min(workers, len(cases) // 2)
    if size < 1:
        if cases:
            say(f"not warming the compile caches: {len(cases)} compiling case, fewer than two")
        return
    t0 = time.monotonic()
    say(f"warming the compile caches: {len(cases)} cases in {size} worker processes")
    queue, failed = collections.deque(cases), []
    with Pool(warm, size, say, warming=True) as pool:
        while queue or pool.busy:
            while queue and pool.free():
                pool.submit(queue.popleft())
            for case, rows, exitcode in pool.collect():
                if rows is None:
                    failed.append(f"{case['case_id']} (its worker died, exit code {exitcode})")
                elif rows[0]["status"] not in ("ok", "skipped", "unsupported"):
                    failed.append(f"{case['case_id']} ({rows[0]['status']}: {rows[0]['message'][:120]})")
    say(f"compile caches warm in {time.monotonic() - t0:.1f} s"
        + (f"; {len(failed)} cases did not compile there: {', '.join(failed[:5])}" if failed else ""))
