"""What every benchmark shares: provenance, tidy rows, progress lines, atomic CSV writes, and
`run_cases`, the loop that measures a benchmark's cases.

A benchmark is a list of cases (dicts) and a `measure(case) -> list[row]` function. `run_cases`
runs them one by one; an exception in one case becomes a row with its status and the whole cause
(bench/failures.py; a compile failure is first tried once more in a fresh compile cache), and
the next case starts on a clean device. Each finished case goes to a journal beside the output
(bench/journal.py): a crash loses nothing and a rerun measures only what is left; Ctrl-C or
SIGTERM marks the case interrupted and exits 128 + the signal. An `error` row fails the job
(exit 1) once the CSV is written, the journal keeping every other case, so that Snakemake reports
it and a rerun measures only the failed cases, unless the config accepts it (accept_errors).
A journal of other code (commit, or digest of the modules the benchmark can import) is discarded.
Timers live in bench/timing.py; every row of a case carries the GPU's clocks, power and
temperature as its timed work started and ended (CLOCK_COLUMNS, bench/timing.py's `recording`),
empty without CUDA and where the case timed nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from lmperf import hardware, sources
from lmperf.bench import device, failures, timing
from lmperf.bench.failures import NotRun, Unsupported, classify_failure  # noqa: F401 (benchmarks use common.*)
from lmperf.bench.journal import Journal, interrupts_raise, signal_number
from lmperf.bench.timing import is_device_work  # noqa: F401 (benchmarks use common.*)

# Columns every results row has, in this order; benchmark-specific case columns go between
# CASE_START and the metric columns.
ID_COLUMNS = ["section", "study", "case_id"]
METRIC_COLUMNS = ["metric", "unit", "mean", "std", "median", "q20", "q80", "min", "max", "n",
                  "samples", "status", "message"]
# The GPU's SM and memory clocks (MHz), power (W) and temperature (C) at the start and end of a
# case's timed work (bench/timing.py), after the metric columns; a CSV written before them lacks them
CLOCK_COLUMNS = list(timing.CLOCK_COLUMNS)
PROVENANCE_COLUMNS = ["hw", "gpu", "torch", "triton", "cuda", "python", "commit", "measured_at"]

FAULT_ENV = failures.FAULT_ENV
DIED_TWICE = "the process died in this case on two earlier attempts (e.g. an illegal memory access); not retried"


# ---------------------------------------------------------------------------------------------
# Provenance


def git_commit(cwd: Path | None = None) -> str:
    if os.environ.get("LMPERF_COMMIT"):
        return os.environ["LMPERF_COMMIT"]
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=cwd, capture_output=True, text=True,
                                        timeout=10, check=True).stdout.strip()
        sha = run("rev-parse", "--short=12", "HEAD")
        dirty = run("status", "--porcelain", "--untracked-files=no", "--", "src", "Snakefile",
                    "rules", "config")
        return sha + ("-dirty" if dirty else "")
    except (subprocess.SubprocessError, OSError):
        return "unknown"


def provenance(hw: str) -> dict:
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    cuda = torch.cuda.is_available()
    return {
        "hw": hw,
        "gpu": torch.cuda.get_device_name() if cuda else "none",
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": (torch.version.cuda or "none") if cuda else "none",
        "python": platform.python_version(),
        "commit": git_commit(),
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def check_environment(args) -> None:
    """Refuse to measure in an environment other than the one the workflow planned with: the
    library versions it passed, and a CUDA device whenever the results folder is a GPU's."""
    versions = hardware.library_versions()
    for lib in ("torch", "triton"):
        expected = getattr(args, f"expect_{lib}", None)
        if expected is not None and versions[lib] != expected:
            sys.exit(f"error: the workflow planned with {lib} {expected}, but this process "
                     f"imports {lib} {versions[lib]}; run snakemake from the same environment")
    if args.hw != "cpu":
        import torch
        if not torch.cuda.is_available():
            sys.exit(f"error: --hw {args.hw} names a GPU, but torch {torch.__version__} sees no "
                     f"CUDA device (a CPU-only torch build?); results would be mislabelled")
    import torch
    if not torch.cuda.is_available():  # Triton kernels run in its interpreter; set before import
        os.environ.setdefault("TRITON_INTERPRET", "1")


DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(name: str):
    """'fp32' | 'fp16' | 'bf16' -> the torch dtype."""
    import torch
    return getattr(torch, DTYPES[name])


# ---------------------------------------------------------------------------------------------
# Rows


def summarize(metric: str, unit: str, samples: Iterable[float]) -> dict:
    """One tidy row for a metric measured over several steps (per-step values kept): mean, std,
    median, 20% and 80% quantiles of the finite samples. With one sample there is no spread to
    state: std is left empty, not 0."""
    xs = [float(x) for x in samples]
    finite = [x for x in xs if math.isfinite(x)]
    # linear interpolation between order statistics, as numpy's and pandas' quantile
    q = statistics.quantiles(finite, n=5, method="inclusive") if len(finite) > 1 else finite * 4 or [math.nan] * 4
    return {
        "metric": metric, "unit": unit,
        "mean": statistics.fmean(finite) if finite else math.nan,
        "std": statistics.stdev(finite) if len(finite) > 1 else math.nan,
        "median": statistics.median(finite) if finite else math.nan,
        "q20": q[0], "q80": q[3],
        "min": min(finite) if finite else math.nan,
        "max": max(finite) if finite else math.nan,
        "n": len(xs),
        "samples": ";".join(f"{x:.6g}" for x in xs),
        "status": "ok", "message": "",
    }


def summarize_rate(metric: str, unit: str, work: float, step_ms: Iterable[float]) -> dict:
    """One tidy row for a rate (tokens/s, TFLOP/s, MFU) of `work` done in each timed step: the
    per-step rates as samples, and as median and 20% / 80% quantiles the work over the step
    time's median and 80% / 20% quantiles (tokens / median step, not a median of rates)."""
    ms = [float(x) for x in step_ms]
    row = summarize(metric, unit, [work / (x / 1e3) for x in ms])
    step = summarize("", "", ms)
    rate = lambda key: work / (step[key] / 1e3)
    return {**row, "median": rate("median"), "q20": rate("q80"), "q80": rate("q20")}


def summarize_quantiles(metric: str, unit: str, median: float, q20: float, q80: float) -> dict:
    """One tidy row for a timing that `triton.testing.do_bench` summarised as quantiles
    (`bench.timing.do_bench_quantiles`): the median and the 20% / 80% quantiles of its repeats.
    `mean`, `std` and `samples` stay empty (do_bench does not return them); the report reads
    `median` for these rows and shows [q20, q80] as their spread."""
    return {**failure_row("ok", ""), "metric": metric, "unit": unit, "median": float(median),
            "q20": float(q20), "q80": float(q80), "min": math.nan, "max": math.nan, "n": math.nan}


def failure_row(status: str, message: str) -> dict:
    return {"metric": "", "unit": "", "mean": math.nan, "std": math.nan, "median": math.nan,
            "q20": math.nan, "q80": math.nan, "min": math.nan, "max": math.nan, "n": 0,
            "samples": "", "status": status, "message": message}


# ---------------------------------------------------------------------------------------------
# Output


def write_csv_atomic(df: pd.DataFrame, path: Path) -> None:
    """Write to a temporary file in the same folder, then rename: readers never see half a file.
    The file gets the mode a plain open() gives (0644 under the usual umask 022; mkstemp's
    temporary file is 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", newline="") as f:
            df.to_csv(f, index=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
        status, message = classify_failure(exc)
        return [failure_row(status, message)], status == "error" and failures.is_compile_failure(exc)


def with_clocks(measure: Callable[[dict], list[dict]], case: dict) -> list[dict]:
    """measure(case)'s rows, each with CLOCK_COLUMNS: the GPU's state as the case's timed work
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
        return [failure_row("error", DIED_TWICE)]
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
    df = pd.DataFrame(all_rows)
    df = df.reindex(columns=[*df.columns, *(c for c in ("q20", "q80") if c not in df)])
    df = df.reindex(columns=[*df.columns, *(c for c in CLOCK_COLUMNS if c not in df)])
    known = ID_COLUMNS + METRIC_COLUMNS + CLOCK_COLUMNS + PROVENANCE_COLUMNS
    case_cols = [c for c in df.columns if c not in known]
    df = df[ID_COLUMNS + case_cols + METRIC_COLUMNS + CLOCK_COLUMNS + PROVENANCE_COLUMNS]
    write_csv_atomic(df, out_csv)
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


def base_parser(description: str, add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, add_help=add_help)
    p.add_argument("--out", type=Path, required=True, help="CSV to write")
    p.add_argument("--hw", required=True, help="hardware name for the results folder and rows")
    p.add_argument("--log", type=Path, help="also append progress lines to this file")
    p.add_argument("--expect-torch", help="fail unless this torch version is the one imported")
    p.add_argument("--expect-triton", help="fail unless this triton version is the one imported")
    return p


def bench_args(doc: str, argv=None, *, studies: Iterable[str] = (), spec: bool = True, size: bool = False,
               options: Callable[[argparse.ArgumentParser], None] | None = None,
               shares_device: bool | Callable[[argparse.Namespace], bool] = lambda args: getattr(args, "study", None) == "check",
               warms: bool = False) -> argparse.Namespace:
    """The command line of every bench module, parsed and checked: base_parser's options,
    `--spec` (the grid as JSON, parsed into args.spec; not with spec=False), with size=True
    `--size` (one model size a call: a key of the spec's `models`), and what `options(parser)`
    adds; with `studies`, each is a subcommand (`python -m lmperf.bench.lrpe check ...`, named by
    args.study). Then check_environment, before anything is measured, and the wait for the device
    (bench/device.py): beside other checks where `shares_device` (by default, the study `check`);
    for a job that `warms` its compiles in workers (`--workers` above 1: bench/jobs.py), beside
    them until jobs.run has warmed them; else alone."""
    def add(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        if spec:
            p.add_argument("--spec", required=True, type=_json, help="the grid as JSON (see config/config.yaml)")
        if size:
            p.add_argument("--size", required=True, help="model size: one of the spec's `models`")
        if options:
            options(p)
        return p

    if studies:
        top = argparse.ArgumentParser(description=doc.splitlines()[0])
        sub = top.add_subparsers(dest="study", required=True)
        for name in studies:
            add(sub.add_parser(name, parents=[base_parser(doc, add_help=False)]))
    else:
        top = add(base_parser(doc))
    args = top.parse_args(argv)
    if size and args.size not in args.spec["models"]:
        top.error(f"--size {args.size!r} is not among the spec's models {sorted(args.spec['models'])}")
    check_environment(args)
    shared = shares_device(args) if callable(shares_device) else shares_device
    progress = Progress(getattr(args, "study", None) or Path(sys.argv[0]).stem, 0, args.log)
    device.take(shared, say=progress.say, warming=warms and getattr(args, "workers", 1) > 1)
    progress.close()
    return args


def _json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text[:80]!r}") from None
