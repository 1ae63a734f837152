"""One GPU, several jobs at once: a timing job has the device to itself, checks share it.

Snakemake runs a local workflow's jobs side by side (`snakemake --cores all`). Each benchmark
job imports first (torch, triton, Dynamo: several seconds of a process start), then waits here
for the device before it touches CUDA:

- a timing job (`take(shared=False)`) until no other job holds the device;
- a correctness check (`take(shared=True)`) until no timing job does: checks run together;
- a timing job whose compiles are warmed in worker processes first (`take(shared=False,
  warming=True)`) beside the checks and other warm-ups, then (`alone`) until it has the device to
  itself for its timed cases: compiling times nothing, so it need not wait for the device alone.

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
POLL_S = 0.1   # how often a waiting job asks again: a hand-over costs at most this
_held: int | None = None   # the lock's file descriptor, kept open for the life of the process
_warming = False           # held shared for a timing job's warm-up: `alone` before its timed cases


def lock_path(workdir) -> str:
    """The lock file of a workflow run in `workdir`: in the machine's temporary folder (a local
    disk: flock on a network filesystem may not work), named after the working directory, so that
    two runs in one folder share it and runs in other folders (the tests' own) do not."""
    import hashlib
    import tempfile
    digest = hashlib.sha1(str(os.path.abspath(workdir)).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"lmperf-device-{digest}.lock")


def configure(local: bool) -> None:
    """The workflow's side (rules/common.smk), in Snakemake's process, whose environment its
    local jobs inherit: a local run's lock file (`lock_path` of the working directory); none for
    a cluster run."""
    if local:
        os.environ[ENV] = lock_path(os.getcwd())
    else:
        os.environ.pop(ENV, None)


def _preload() -> None:
    """What a job imports anyway, imported before the wait, so that it overlaps the job ahead."""
    import torch  # noqa: F401
    try:
        import torch._dynamo  # noqa: F401  (every job's clean-up resets Dynamo: loop.clean_device)
        import triton  # noqa: F401
    except ImportError:
        pass


def _sleep(say) -> None:
    """One poll's wait; Ctrl-C or Snakemake's SIGINT there ends the job with a line saying so
    (exit 130), not a traceback: nothing was measured yet."""
    try:
        time.sleep(POLL_S)
    except KeyboardInterrupt:
        say("interrupted while waiting for the device: nothing measured")
        raise SystemExit(130) from None


def _lock(path: str, shared: bool, say) -> float:
    """Open `path` and flock it (shared or exclusive); the seconds waited."""
    global _held
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    t0 = time.monotonic()
    said = False
    while True:  # polled: some filesystems answer a blocking flock at once with EAGAIN
        try:
            fcntl.flock(fd, mode)
            break
        except BlockingIOError:
            if not said:
                say(f"waiting for the device ({'shared with other checks' if shared else 'to itself'}): "
                    f"another job of this run holds it")
                said = True
            _sleep(say)
    _held = fd
    waited = time.monotonic() - t0
    if waited >= 1:
        say(f"the device is this job's after {waited:.0f} s")
    return waited


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def take(shared: bool, say=_say, warming: bool = False) -> float:
    """Wait for the device (module docstring): `shared` for a correctness check or, with
    `warming`, a timing job's warm-up (which then calls `alone`), else the device to itself. Then
    leave what the process imported out of the garbage collector's work, so that the collection
    after every case (loop.clean_device) takes milliseconds, not a quarter of a second (inside a
    timed loop a collection then has fewer objects to walk, never more). The seconds waited; 0
    without LMPERF_DEVICE_LOCK or when this process holds it already."""
    global _warming
    _preload()
    path = os.environ.get(ENV)
    waited = 0.0
    if path and _held is None:
        waited = _lock(path, shared or warming, say)
        _warming = warming and not shared
        if not (shared or warming):
            in_use(say)
    freeze_imports()
    return waited


def in_use(say) -> None:
    """Say how much of the device's memory is in use as a timing job starts to time: its own
    CUDA context and what other processes of the run hold while they wait (a warmed job's
    contender process), which a case near the device's capacity runs beside. Nothing without CUDA."""
    try:
        import torch
        if not torch.cuda.is_available():
            return
        free, total = torch.cuda.mem_get_info()
    except Exception:  # noqa: BLE001  (a line in a log; the job goes on)
        return
    say(f"device memory in use as this job times: {(total - free) / 2**30:.2f} of {total / 2**30:.1f} GiB "
        f"(its own CUDA context and other processes' included)")


def warming() -> bool:
    """Whether this process holds the device shared for a timing job's warm-up (`alone` next)."""
    return _warming


def alone(say=_say) -> float:
    """After a warm-up taken with `take(shared=False, warming=True)`: wait until this job has the
    device to itself (the checks and warm-ups beside it done), before anything is timed. The
    seconds waited; 0 where the process holds it alone already, or holds no lock."""
    global _warming
    if not _warming:
        return 0.0
    _warming = False
    t0 = time.monotonic()
    said = False
    while True:
        try:
            fcntl.flock(_held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            # the shared lock given up while waiting (flock(2) may or may not have dropped it in the
            # failed conversion): two warmed jobs never wait for each other's shared hold
            fcntl.flock(_held, fcntl.LOCK_UN)
            if not said:
                say("warmed; waiting for the device to itself: another job of this run holds it")
                said = True
            _sleep(say)
    waited = time.monotonic() - t0
    if waited >= 1:
        say(f"the device is this job's after {waited:.0f} s")
    in_use(say)
    return waited


def freeze_imports() -> None:
    """Leave what the process has imported (torch, triton: long-lived, hundreds of thousands of
    objects) out of the garbage collector's work: every benchmark job (`take`) and every worker
    process (bench/workers.py) calls it once its imports are done."""
    gc.collect()
    gc.freeze()


def main(argv=None) -> None:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m lmperf.bench.device", description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [-h] -- COMMAND [ARG ...]")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="run with the device held for timing (the lock of LMPERF_DEVICE_LOCK, if set)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        parser.parse_args(argv[:1])  # prints the help and exits
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        parser.error("no COMMAND to run")
    path = os.environ.pop(ENV, None)
    if path:
        _lock(path, shared=False, say=lambda text: print(f"lmperf.bench.device: {text}", file=sys.stderr, flush=True))
        os.set_inheritable(_held, True)  # held by the command and its children until they exit
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
