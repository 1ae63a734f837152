"""One GPU, several jobs at once: a timing job has the device to itself, checks share it.

Snakemake runs a local workflow's jobs side by side (`snakemake --cores all`). Each benchmark
job imports first (torch, triton, Dynamo: several seconds of a process start), then waits here
for the device before it touches CUDA:

- a timing job (`take(shared=False)`) until no other job holds the device;
- a correctness check (`take(shared=True)`) until no timing job does: checks run together.

So the next job's start overlaps the job before it, and nothing runs beside a timing job but
processes asleep on the lock. The lock is a file, named by LMPERF_DEVICE_LOCK; the workflow
sets it for a local run (rules/common.smk). Without it (a cluster job has its GPU to itself; a
job run by hand) `take` does nothing.

A command that is not a benchmark module's (torchrun and its ranks) holds the lock for its
whole run through this module:

    python -m lmperf.bench.device -- python -m torch.distributed.run ... -m lmperf.bench.distributed ...

which takes the device for timing, then runs the command with the lock held and the variable
removed, so that its ranks do not wait for a lock their launcher holds.
"""
from __future__ import annotations

import fcntl
import gc
import os
import sys
import time

ENV = "LMPERF_DEVICE_LOCK"
_held: int | None = None   # the lock's file descriptor, kept open for the life of the process


def _preload() -> None:
    """What a job imports anyway, imported before the wait, so that it overlaps the job ahead."""
    import torch  # noqa: F401
    try:
        import torch._dynamo  # noqa: F401  (every job's clean-up resets Dynamo: common.clean_device)
        import triton  # noqa: F401
    except ImportError:
        pass


def _lock(path: str, shared: bool, say) -> float:
    """Open `path` and flock it (shared or exclusive); the seconds waited."""
    global _held
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    t0 = time.monotonic()
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        say(f"waiting for the device ({'shared with other checks' if shared else 'to itself'}): "
            f"another job of this run holds it")
        fcntl.flock(fd, mode)
    _held = fd
    waited = time.monotonic() - t0
    if waited >= 1:
        say(f"the device is this job's after {waited:.0f} s")
    return waited


def take(shared: bool, say=lambda text: print(text, file=sys.stderr, flush=True)) -> float:
    """Wait for the device (module docstring): `shared` for a correctness check, else the device
    to itself. Then leave what the process imported out of the garbage collector's work, so that
    the collection after every case (common.clean_device) takes milliseconds, not a quarter of a
    second (inside a timed loop a collection then has fewer objects to walk, never more). The
    seconds waited; 0 without LMPERF_DEVICE_LOCK or when this process holds it already."""
    _preload()
    path = os.environ.get(ENV)
    waited = _lock(path, shared, say) if path and _held is None else 0.0
    gc.collect()
    gc.freeze()
    return waited


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise SystemExit("usage: python -m lmperf.bench.device -- COMMAND [ARG ...]")
    path = os.environ.pop(ENV, None)
    if path:
        _lock(path, shared=False, say=lambda text: print(f"lmperf.bench.device: {text}", file=sys.stderr, flush=True))
        os.set_inheritable(_held, True)  # held by the command and its children until they exit
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
