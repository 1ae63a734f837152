"""What a failed case becomes: a status and a message that keeps the cause, whether the failure
is worth one retry in a fresh compile cache, and whether an `error` may end its job well.

    status, message = classify_failure(exc)   # ('oom' | 'error' | 'skipped' | 'unsupported', text)

The message is the whole exception chain, outer first, each exception as its first line and its
last lines: `torch.compile` wraps the cause of a failure (`BackendCompilerFailed: backend='inductor'
raised:` ... `ImportError: ...: file too short`), and the first line alone hides it. A long message
keeps its beginning and its end, which is where a cause is written.

`ok`, `oom`, `skipped` and `unsupported` are results; `error` is a failure, and it fails its job
(after the CSV and journal are written, see bench/loop.py) unless LMPERF_ACCEPT_ERRORS accepts it:
JSON `true` (every error), or a list of shell-style patterns of case ids (config `accept_errors`).
The tests of these paths inject failures by case id (LMPERF_INJECT_FAULT, `maybe_inject_fault`).
"""
from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import signal
import sys
import tempfile
import time

MESSAGE_LIMIT = 500  # characters: the head and the tail of a longer message are kept
ACCEPT_ERRORS_ENV = "LMPERF_ACCEPT_ERRORS"
FAULT_ENV = "LMPERF_INJECT_FAULT"  # e.g. "oom@small-fp32,crash@medium": for tests of failure paths
# Lines that name no cause: torch.compile's advice on how to get more logs.
BOILERPLATE = re.compile(r"TORCHDYNAMO_VERBOSE|TORCH_LOGS=|TORCHDYNAMO_DEBUG|^You can suppress this exception")
# The compile caches a retry points at a fresh folder (the workflow sets both, see workflow.bench).
COMPILE_CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "triton")


class NotRun(Exception):
    """Raised by a measurement that does not apply here; becomes a row with this status."""
    status = "skipped"


class Unsupported(NotRun):
    """The provider does not support this dtype or shape."""
    status = "unsupported"


def exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or while handling, outer first."""
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return chain


def bounded(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text`, or its first and last characters with ' ... ' between, at most `limit` long."""
    if len(text) <= limit:
        return text
    head = limit // 4
    return text[:head] + " ... " + text[len(text) - (limit - head - 5):]


def describe(exc: BaseException) -> str:
    """One line for an exception chain: each exception's name, its first line (with the next
    while a line ends in ':') and its last two lines, causes after ' <- '; bounded."""
    parts: list[str] = []
    for e in exception_chain(exc):
        lines = [" ".join(line.split()) for line in str(e).splitlines()]
        lines = [line for line in lines if line and not BOILERPLATE.search(line)]
        head = 1
        while head < min(len(lines), 3) and lines[head - 1].endswith(":"):
            head += 1
        tail = lines[max(head, len(lines) - 2):]
        gap = " ... " if len(lines) > head + len(tail) else " "
        text = " ".join(lines[:head]) + (gap + " | ".join(tail) if tail else "")
        if parts and text and text in parts[-1]:
            continue  # the outer message already quotes this cause
        parts.append(f"{type(e).__name__}: {text}" if text else type(e).__name__)
    return bounded(" <- ".join(parts))


def is_oom(exc: BaseException) -> bool:
    """Whether an exception chain is an allocation failure, on the device or the host."""
    for e in exception_chain(exc):
        text = str(e).lower()
        if type(e).__name__ == "OutOfMemoryError" or "out of memory" in text \
                or "can't allocate memory" in text:
            return True
    return False


def classify_failure(exc: BaseException) -> tuple[str, str]:
    """('oom' | 'error' | 'skipped' | 'unsupported', message) for an exception raised while
    measuring."""
    if isinstance(exc, NotRun):
        return exc.status, bounded(str(exc))
    return ("oom" if is_oom(exc) else "error"), describe(exc)


def is_compile_failure(exc: BaseException) -> bool:
    """Whether torch.compile or Triton raised somewhere in the chain: a failure that a bad entry
    in a compile cache can cause (a compiled library cut short by an interrupt: 'file too short')."""
    return any(type(e).__module__.startswith(COMPILER_MODULES) or "file too short" in str(e)
               for e in exception_chain(exc))


@contextlib.contextmanager
def fresh_compile_cache():
    """Inductor's and Triton's caches in a new, empty temporary folder inside the block; the
    previous settings come back after it and the folder is removed. Yields the folder."""
    saved = {var: os.environ.get(var) for var in COMPILE_CACHE_VARS}
    with tempfile.TemporaryDirectory(prefix="lmperf-fresh-compile-cache-") as fresh:
        os.environ.update({var: os.path.join(fresh, sub) for var, sub in COMPILE_CACHE_VARS.items()})
        try:
            yield fresh
        finally:
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value


def compile_caches() -> str:
    """Where the compile caches are, for messages: the variables' values, or torch's default."""
    return ", ".join(f"{var}={os.environ[var]}" for var in COMPILE_CACHE_VARS if var in os.environ) \
        or "torch's default /tmp/torchinductor_<user>"


def accepted_errors() -> bool | list[str]:
    """LMPERF_ACCEPT_ERRORS: True, False (unset) or a list of case-id patterns."""
    raw = os.environ.get(ACCEPT_ERRORS_ENV, "").strip()
    try:
        value = json.loads(raw) if raw else False
    except json.JSONDecodeError:
        value = None
    if not (isinstance(value, bool) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
        raise SystemExit(f"error: {ACCEPT_ERRORS_ENV}={raw!r}: expected JSON true, false or a list "
                         f"of case-id patterns, e.g. '[\"*-compiled-*\"]'")
    return value


def is_accepted(case_id: str, accept: bool | list[str]) -> bool:
    """Whether an error row of `case_id` is accepted (does not fail its job)."""
    return accept is True or (isinstance(accept, list) and any(fnmatch.fnmatchcase(case_id, p) for p in accept))


def maybe_inject_fault(case_id: str) -> None:
    """Simulated failures for the tests: LMPERF_INJECT_FAULT='kind@substr,...' for the cases whose
    id contains substr: oom, error (raised), crash (the process dies), interrupt or terminate (it
    sends itself SIGINT or SIGTERM)."""
    for spec in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        kind, _, pattern = spec.partition("@")
        if pattern and pattern in case_id:
            if kind == "oom":
                import torch
                raise torch.OutOfMemoryError(f"CUDA out of memory (injected for case {case_id})")
            if kind == "error":
                raise RuntimeError(f"injected error for case {case_id}")
            if kind == "crash":
                sys.stderr.write(f"injected crash in case {case_id}\n")
                sys.stderr.flush()
                os._exit(70)
            if kind in ("interrupt", "terminate"):
                os.kill(os.getpid(), signal.SIGINT if kind == "interrupt" else signal.SIGTERM)
                time.sleep(10)  # the signal's exception is raised here
