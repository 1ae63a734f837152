"""Someone else's code, measured in a process of its own: a case that kills its process or hangs
is a row, and the job goes on with the next case.

    with Isolated(measure, time_limit_s=300) as isolated:
        rows = isolated(case)          # measure(case)'s rows, or one row saying what went wrong

    with Isolated(outputs, 300, judge=judge) as isolated:
        rows = isolated(case)          # judge(case, outputs(case)) with `judge` run in this process

    with Ahead(measure, 300, workers=4, cases=cases, group=key) as isolated:   # 4 children, side by side
        rows = isolated(case)          # the same, measured ahead of the job's loop

One child process (spawned: CUDA does not survive a fork) measures the cases one after another,
so its imports and compiles are paid once. When a case does not answer within the time limit the
child is killed and the case is a `timeout` row; when the child dies (a segfault, os._exit, an
illegal memory access) the case is a `crashed` row with the exit code or signal. Either way the
next case starts in a fresh child. Both are results about the code under test, not failures of
the job (only `error` fails a job: lmperf.failures). A case that has not answered says so on
stderr (the job's log) every PROGRESS_S.

With `judge`, the child decides nothing: `measure(case)` returns bytes, which go back over the
pipe as bytes (never unpickled here) and `judge(case, payload)` makes the rows in this process
(the contenders' attention check: bench/contender_attention.py). The child then keeps what it
compiled from case to case (torch.compile's caches are not reset after each case).

`measure` must be importable by its module and qualified name (a module-level function).
"""
from __future__ import annotations

import multiprocessing
import signal
import sys
import time
from typing import Callable

from lmperf import csv_schema, failures
from lmperf.bench import loop

PROGRESS_S = 30.0  # a case that has not answered says so this often
MAX_REPLY_BYTES = 1 << 31  # a longer reply of a child sending bytes (`judge`) is refused as a crash


def _serve(module: str, name: str, conn, raw: bool = False) -> None:
    """The child: measure each case it is sent, send its rows (a failure becomes a row here, as
    in loop.run_case) until it is sent None. `raw`: measure returns bytes, sent as they are
    (nothing when it raises), and what the case compiled is kept for the next."""
    import importlib
    measure = importlib.import_module(module)
    for part in name.split("."):
        measure = getattr(measure, part)
    while True:
        try:
            case = conn.recv()
        except EOFError:  # the parent is gone
            return
        if case is None:
            return
        if raw:
            try:
                payload = bytes(measure(case))
            except Exception:  # the parent's judge says what an empty reply is
                payload = b""
            _tidy()
            conn.send_bytes(payload)
            continue
        try:
            rows = loop.with_clocks(measure, case)  # the clocks of its timed work, read here
        except Exception as exc:  # a failed case is data
            status, message = failures.classify_failure(exc)
            rows = [csv_schema.failure_row(status, message)]
        loop.clean_device()
        conn.send(rows)


def _tidy() -> None:
    """A finished case's device work waited for (an asynchronous error is its case's), its
    compiled code and the allocator's cache kept for the next case. No gc.collect: with torch and
    its compilers imported one takes 0.2-1 s, more than many a case; a case's tensors are freed
    as their references go."""
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _death(exitcode: int | None) -> str:
    if exitcode is None:
        return "the process died"
    if exitcode < 0:
        try:
            return f"the process was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"the process was killed by signal {-exitcode}"
    return f"the process exited with code {exitcode}"


class Isolated:
    """measure(case) run in a child process, one case at a time, with a time limit per case; with
    `judge`, judge(case, measure(case)) with judge run in this process. `started`: how many child
    processes it has started."""

    def __init__(self, measure: Callable[[dict], list[dict]], time_limit_s: float,
                 judge: Callable[[dict, bytes], list[dict]] | None = None):
        if time_limit_s <= 0:
            raise ValueError(f"time limit {time_limit_s} s: must be positive")
        self.module, self.name = measure.__module__, measure.__qualname__
        if self.module == "__main__":  # a `python -m` module: its importable name
            spec = getattr(sys.modules["__main__"], "__spec__", None)
            self.module = spec.name if spec else self.module
        self.time_limit_s = time_limit_s
        self.ctx = multiprocessing.get_context("spawn")
        self.proc = self.conn = None
        self.judge, self.started, self.released = judge, 0, False

    def __enter__(self) -> "Isolated":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        parent, child = self.ctx.Pipe()
        # not a daemon: a case may start processes of its own (the distributed study); it ends
        # when the parent closes the pipe (recv raises EOFError) or kills it
        self.proc = self.ctx.Process(target=_serve, args=(self.module, self.name, child, self.judge is not None))
        self.proc.start()
        self.started, self.released = self.started + 1, False
        child.close()
        self.conn = parent

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(10)
            self.conn.close()
        self.proc = self.conn = None

    def __call__(self, case: dict) -> list[dict]:
        if self.proc is None or not self.proc.is_alive():
            self._kill()
            self._start()
        try:
            self.conn.send(case)
            answered = self._wait(case)
            if answered and self.judge is None:
                return self.conn.recv()
            payload = self.conn.recv_bytes(MAX_REPLY_BYTES) if answered else None
        except (EOFError, OSError, BrokenPipeError):  # it died in the case
            self.proc.join(10)
            code = self.proc.exitcode
            self._kill()
            return [csv_schema.failure_row("crashed", f"{_death(code)} in this case; the next case runs in a "
                                                  f"fresh process")]
        if answered:
            return self.judge(case, payload)
        if not self.proc.is_alive():
            code = self.proc.exitcode
            self._kill()
            return [csv_schema.failure_row("crashed", f"{_death(code)} in this case; the next case runs in a "
                                                  f"fresh process")]
        self._kill()
        return [csv_schema.failure_row("timeout", f"no answer within {self.time_limit_s:g} s (the time limit per "
                                              f"case, config contender_time_limit_s); the process was killed")]

    def _wait(self, case: dict) -> bool:
        """Whether the child answered within the time limit; a line on stderr (the job's log)
        every PROGRESS_S while it has not."""
        t0 = time.monotonic()
        while True:
            left = self.time_limit_s - (time.monotonic() - t0)
            if left <= 0:
                return False
            if self.conn.poll(min(PROGRESS_S, left)):
                return True
            if not self.proc.is_alive():
                return self.conn.poll(0)
            waited = time.monotonic() - t0
            if waited < self.time_limit_s:
                print(f"[{case.get('case_id', 'case')} {time.strftime('%H:%M:%S')}] still running in its own "
                      f"process after {waited:.0f} s (time limit {self.time_limit_s:g} s)", file=sys.stderr, flush=True)

    def warm(self, cases: list[dict], say) -> None:
        """Each case once, marked `warm_only` (the measure compiles and times nothing:
        bench/flash_attention.py's measure_or_warm), before the timed loop: Triton compiles a
        kernel the first time a process calls it (6-13 s a new shape on an H100), and the job's
        warm-up workers, without a time limit, never run someone else's code. The cases that fail
        here are named; the loop measures them anyway and their rows say what happened."""
        if not cases:
            return
        t0 = time.monotonic()
        say(f"compiling {len(cases)} cases in their own process")
        failed = []
        for case in cases:
            rows = self({**case, "warm_only": True})
            if rows[0]["status"] not in ("ok", "skipped", "unsupported"):
                failed.append(f"{case['case_id']} ({rows[0]['status']}: {rows[0]['message'][:120]})")
        say(f"compiled in their own process in {time.monotonic() - t0:.1f} s"
            + (f"; {len(failed)} cases did not compile there: {', '.join(failed[:5])}" if failed else ""))

    def release(self) -> None:
        """Tell the child to end (it returns once its case is done); close() waits for it. Several
        children released first end side by side: a child's exit (its CUDA context, torch.compile's
        worker pool) takes seconds."""
        if self.proc is not None and self.proc.is_alive() and not self.released:
            self.released = True
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass

    def close(self, wait_s: float = 10.0) -> None:
        """The child ended: released and given `wait_s` to exit, then killed."""
        if self.proc is not None and self.proc.is_alive():
            self.release()
            self.proc.join(max(0.0, wait_s))
        self._kill()


class Ahead:
    """`workers` Isolated children measuring `cases` side by side, ahead of the job's loop (which
    takes their rows in order, journalling each): calling it with a case returns that case's
    rows, waiting for them if they are being measured. For checks, whose cases share the device.

    `group(case)` keys the cases that must run in one child, one after another in the order
    given (a shape class, whose compiles the first case pays and the others reuse): each group
    goes whole to the child with the fewest cases so far (None: each case a group of its own).
    With `judge`, each child's replies are judged in this process (Isolated)."""

    def __init__(self, measure: Callable[[dict], list[dict]], time_limit_s: float, workers: int,
                 cases: list[dict], judge: Callable[[dict, bytes], list[dict]] | None = None,
                 group: Callable[[dict], object] | None = None):
        import concurrent.futures
        import threading
        groups: dict = {}
        for case in cases:
            groups.setdefault(group(case) if group else case["case_id"], []).append(case)
        lanes: list[list[dict]] = [[] for _ in range(max(1, min(workers, len(groups))))]
        for members in groups.values():
            min(lanes, key=len).extend(members)
        self.measure, self.time_limit_s, self.judge = measure, time_limit_s, judge
        self.children = [Isolated(measure, time_limit_s, judge) for _ in lanes]
        self.futures = {c["case_id"]: concurrent.futures.Future() for c in cases}
        self.stop = threading.Event()
        self.measuring: dict[int, str] = {}  # each child's case now
        self.extra: Isolated | None = None  # a case not given ahead: measured alone, in a child of its own
        self.threads = [threading.Thread(target=self._lane, daemon=True, name=f"isolated-{i}",
                                         args=(child, [(c, self.futures[c["case_id"]]) for c in lane]))
                        for i, (child, lane) in enumerate(zip(self.children, lanes))]
        for thread in self.threads:
            thread.start()

    def _lane(self, child: Isolated, lane: list) -> None:
        """Measure a lane's (case, future) pairs in order, in its child."""
        for case, future in lane:
            if self.stop.is_set() or not future.set_running_or_notify_cancel():
                future.cancel()
                continue
            self.measuring[id(child)] = case["case_id"]
            try:
                future.set_result(child(case))
            except BaseException as exc:  # noqa: BLE001  (raised in the job's loop, by result())
                future.set_exception(exc)
        self.measuring.pop(id(child), None)

    @property
    def started(self) -> int:
        """Child processes started so far."""
        return sum(c.started for c in self.children + ([self.extra] if self.extra else []))

    def __call__(self, case: dict) -> list[dict]:
        """The case's rows; a line on stderr every PROGRESS_S while they are not there (the
        children may be measuring other cases first)."""
        import concurrent.futures
        future = self.futures.pop(case["case_id"], None)
        if future is not None:
            t0 = time.monotonic()
            while True:
                try:
                    return future.result(timeout=PROGRESS_S)
                except concurrent.futures.TimeoutError:
                    busy = ", ".join(sorted(set(self.measuring.values()))) or "no case now"
                    print(f"[{case['case_id']} {time.strftime('%H:%M:%S')}] waiting for {time.monotonic() - t0:.0f} s; "
                          f"its processes are measuring {busy}", file=sys.stderr, flush=True)
        if self.extra is None:
            self.extra = Isolated(self.measure, self.time_limit_s, self.judge)
        return self.extra(case)

    def __enter__(self) -> "Ahead":
        return self

    def __exit__(self, *exc) -> None:
        interrupted = exc[0] is not None
        if interrupted:
            self.stop.set()
            for future in self.futures.values():
                future.cancel()
        for child in self.children + ([self.extra] if self.extra else []):
            if interrupted:
                child._kill()
        for thread in self.threads:
            thread.join(None if not interrupted else 10)
        children = self.children + ([self.extra] if self.extra else [])
        if interrupted:
            for child in children:
                child._kill()
            return
        for child in children:  # all told first, so that they end side by side
            child.release()
        deadline = time.monotonic() + 10
        for child in children:
            child.close(deadline - time.monotonic())


class Separate:
    """An Isolated child per key (a contender's name: lmperf.contenders.owner): two contenders'
    code never runs in one process, so packages of the same name (every CS336 student's
    `cs336_systems`) cannot collide, and neither shares a process with ours."""

    def __init__(self, measure: Callable[[dict], list[dict]], time_limit_s: float, key: Callable[[dict], str]):
        Isolated(measure, time_limit_s)  # the same checks of its arguments, before any case
        self.measure, self.time_limit_s, self.key = measure, time_limit_s, key
        self.children: dict[str, Isolated] = {}

    def _child(self, case: dict) -> Isolated:
        key = self.key(case)
        if key not in self.children:
            self.children[key] = Isolated(self.measure, self.time_limit_s)
        return self.children[key]

    def __call__(self, case: dict) -> list[dict]:
        """The case's rows from its key's child; an `error` there (an exception the case's code
        raised) is a result about the contender, a `failed` row, and the job goes on."""
        rows = self._child(case)(case)
        for row in rows:
            if row.get("status") == "error":
                row["status"] = "failed"
        return rows

    def warm(self, cases: list[dict], say) -> None:
        """Isolated.warm, each key's cases in that key's child."""
        groups: dict[str, list[dict]] = {}
        for case in cases:
            groups.setdefault(self.key(case), []).append(case)
        for group in groups.values():
            self._child(group[0]).warm(group, say)

    def __enter__(self) -> "Separate":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for child in self.children.values():  # all told first, so that they end side by side
            child.release()
        deadline = time.monotonic() + 10
        for child in self.children.values():
            child.close(deadline - time.monotonic())
