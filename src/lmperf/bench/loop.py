"""The run loop of every benchmark: `run_cases` measures a benchmark's cases one by one and
writes their rows as one tidy CSV; progress lines go to stderr and the job's log.

A benchmark is a list of cases (dicts) and a `measure(case) -> list[row]` function. `run_cases`
runs them one by one; an exception in one case becomes a row with its status and the whole cause
(lmperf.failures; a compile failure is first tried once more in a fresh compile cache), and
the next case starts on a clean device. Each finished case goes to a journal beside the output
(bench/journal.py): a crash loses nothing and a rerun measures only what is left; Ctrl-C or
SIGTERM marks the case interrupted and exits 128 + the signal. An `error` row fails the job
(exit 1) once the CSV is written, the journal keeping every other case, so that Snakemake reports
it and a rerun measures only the failed cases, unless the config accepts it (accept_errors).
A journal of other code (commit, or digest of the modules the benchmark can import) is discarded.
Timers live in bench/timing.py; every row of a case carries the GPU's clocks, power and
temperature as its timed work started and ended (lmperf.csv_schema.CLOCK_COLUMNS, bench/timing.py's
`recording`), empty without CUDA and where the case timed nothing. The rows' columns and their
order are lmperf.csv_schema's; each row ends with its provenance (lmperf.provenance).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import gc
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from lmperf import csv_schema, failures, sources
from lmperf.bench import timing
from lmperf.bench.journal import Journal, interrupts_raise, signal_number
from lmperf.provenance import provenance

DIED_TWICE = "the process died in this case on two earlier attempts (e.g. an illegal memory access); not retried"


class Progress:
    """Progress lines to stderr and to the job's log file."""

    def __init__(self, name: str, total: int, log_path: Path | None):
        self.name, self.total, self.t0 = name, total, time.monotonic()
        self.log = open(log_path, "a") if log_path else None

    def say(self, text: str) -> None:
        line = f"[{self.name} {dt.datetime.now():%H:%M:%S}] {text}"
        print(line, file=sys.stderr, flush=True)
        if self.log:
            self.log.write(line + "\n")
            self.log.flush()

    def case(self, i: int, case_id: str, done_before: int) -> None:
        elapsed = time.monotonic() - self.t0
        measured = i - done_before
        eta = ""
        if measured > 0:
            eta = f", about {elapsed / measured * (self.total - i):.0f} s left"
        self.say(f"case {i + 1}/{self.total} ({self.total - i - 1} after it{eta}): {case_id}")

    def close(self):
        if self.log:
            self.log.close()


def clean_device() -> None:
    """Free what a finished or failed case left behind, so the next one starts clean."""
    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with contextlib.suppress(Exception):
        torch._dynamo.reset()


def code_identity(measure: Callable, commit: str) -> dict:
    """The code a benchmark runs, for its journal: the commit, and the digest of every lmperf
    module its command (`python -m lmperf.bench.<x>`, else the module of `measure`) can import."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    module = spec.name if spec and spec.name.startswith("lmperf.") else measure.__module__
    return {"commit": commit, "module": module, "digest": sources.digest(module)}


def attempt(case: dict, measure: Callable[[dict], list[dict]]) -> tuple[list[dict], bool]:
    """One try at a case: (its rows, or its failure's row; whether a retry in a fresh compile
    cache may help), each with the clocks of its timed work (with_clocks)."""
    try:
        failures.maybe_inject_fault(case["case_id"])
        return with_clocks(measure, case), False
    except Exception as exc:  # a failed case is data, not a crash
        status, message = failures.classify_failure(exc)
        return [csv_schema.failure_row(status, message)], status == "error" and failures.is_compile_failure(exc)


def with_clocks(measure: Callable[[dict], list[dict]], case: dict) -> list[dict]:
    """measure(case)'s rows, each with csv_schema.CLOCK_COLUMNS: the GPU's state as the case's timed work
    started and ended (bench/timing.py's `recording`), NaN where it timed nothing here. A row that
    carries them already (measured in a process of its own, which called this too) keeps its own."""
    with timing.recording() as clocks:
        rows = measure(case)
    return [{**clocks, **row} for row in rows]


def run_case(case: dict, measure: Callable[[dict], list[dict]], journal: Journal,
             progress: Progress) -> list[dict]:
    """A case's rows, journalled as started first; a compile failure is tried once more in a fresh
    compile cache, and a case the process died in twice is an error row, not tried again."""
    case_id = case["case_id"]
    if journal.deaths(case_id) >= 2:
        return [csv_schema.failure_row("error", DIED_TWICE)]
    journal.start(case_id)
    t0 = time.monotonic()
    rows, retry = attempt(case, measure)
    if retry:
        progress.say(f"  compile failed ({rows[0]['message']}); trying once more in a fresh compile "
                     f"cache (in use: {failures.compile_caches()})")
        clean_device()
        with failures.fresh_compile_cache():
            rows, _ = attempt(case, measure)
        if rows[0]["status"] == "ok":
            progress.say("  ok in a fresh compile cache: the cache in use holds a bad entry; "
                         "delete it to stop these retries")
        rows = [{**r, "message": failures.bounded(f"in a fresh compile cache too: {r['message']}")}
                if r["status"] == "error" else r for r in rows]
    rows = [{**r, "wall_s": round(time.monotonic() - t0, 3)} for r in rows]
    clean_device()
    return rows


def run_cases(*, section: str, study: str, cases: list[dict], measure: Callable[[dict], list[dict]],
              out_csv: Path, hw: str, log_path: Path | None, fingerprint: dict) -> pd.DataFrame:
    """Measure every case (resuming from the journal) and write one tidy CSV atomically. Exits
    128 + the signal on Ctrl-C or SIGTERM, and 1 after writing when a case ended in an error
    that is not accepted."""
    prov = provenance(hw)
    accept = failures.accepted_errors()
    journal = Journal(out_csv, {"section": section, "study": study, "cases": cases, **fingerprint,
                                "torch": prov["torch"], "triton": prov["triton"], "gpu": prov["gpu"]},
                      code=code_identity(measure, prov["commit"]))
    progress = Progress(f"{section}/{study}", len(cases), log_path)
    if journal.discarded:
        progress.say(f"starting over: {journal.discarded}")
    done_before = len(journal.rows)
    if done_before:
        progress.say(f"resuming: {done_before} of {len(cases)} cases already in {journal.path}")
    try:
        with interrupts_raise():
            for i, case in enumerate(cases):
                case_id = case["case_id"]
                if case_id in journal.rows:
                    continue
                progress.case(i, case_id, done_before)
                rows = run_case(case, measure, journal, progress)
                status = rows[0]["status"]
                progress.say(f"  -> {status}" + (f": {rows[0]['message']}" if status != "ok" else ""))
                journal.done(case_id, [{**case, **prov, **r} for r in rows])
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (journal.Interrupted)
        signum = signal_number(exc)
        where = journal.open_case
        if where:
            journal.interrupted(where, signum)
        progress.say(f"interrupted by {signal.Signals(signum).name}"
                     + (f" in case {where} (a rerun measures it again)" if where else "")
                     + f"; the finished cases are kept in {journal.path}")
        progress.close()
        raise SystemExit(128 + signum) from None
    all_rows = [{"section": section, "study": study, **r}
                for case in cases for r in journal.rows[case["case_id"]]]
    df = csv_schema.in_column_order(pd.DataFrame(all_rows))
    csv_schema.write_csv_atomic(df, out_csv)
    n_bad = int((df.drop_duplicates("case_id")["status"] != "ok").sum())
    progress.say(f"wrote {out_csv}: {len(cases)} cases, {n_bad} not ok, "
                 f"{time.monotonic() - progress.t0:.1f} s")
    failed = [c["case_id"] for c in cases if not failures.is_accepted(c["case_id"], accept)
              and any(r["status"] == "error" for r in journal.rows[c["case_id"]])]
    if failed:
        journal.keep([c["case_id"] for c in cases if c["case_id"] not in failed])
        progress.say(f"error: {len(failed)} of {len(cases)} cases ended in error ({', '.join(failed[:5])}"
                     f"{', ...' if len(failed) > 5 else ''}); a rerun measures them again and takes "
                     f"the others from {journal.path}. To accept known errors, list their case ids "
                     f"(shell-style patterns) under accept_errors in the config (by hand: "
                     f"{failures.ACCEPT_ERRORS_ENV}='[\"<pattern>\"]')")
        progress.close()
        raise SystemExit(1)
    journal.remove()
    progress.close()
    return df
