"""Someone else's attention held to its contract as it runs: each output of a user's or a
peer's call checked for its shape, dtype and device and for NaN or inf, without costing a timed
call anything (lmperf.contenders wraps every contender's call so); an output that breaks it is a
`wrong` row (`Wrong`), a result about the code under test and not a failure of the job. The
checks that need the bench's timers (a stale result, an impossible time) are bench/honest.py's."""
from __future__ import annotations

import functools
from typing import Callable

from lmperf.failures import NotRun


class Wrong(NotRun):
    """An output that breaks the contract (shape, dtype, device, NaN, a stale result): a `wrong`
    row. A result about the code under test, not a failure of the job."""
    status = "wrong"


def check_output(out, q, what: str = "output") -> None:
    """Raise Wrong unless `out` is a tensor like `q` (shape, dtype, device) with no NaN or inf."""
    import torch
    if not isinstance(out, torch.Tensor):
        raise Wrong(f"{what} is a {type(out).__name__}, not a tensor")
    problems = []
    if tuple(out.shape) != tuple(q.shape):
        problems.append(f"shape {tuple(out.shape)} (expected {tuple(q.shape)})")
    if out.dtype != q.dtype:
        problems.append(f"dtype {out.dtype} (expected {q.dtype})")
    if out.device != q.device:
        problems.append(f"device {out.device} (expected {q.device})")
    if problems:
        raise Wrong(f"{what} has " + ", ".join(problems))
    if not bool(torch.isfinite(out).all()):
        raise Wrong(f"{what} holds NaN or inf")


def guarded(fn: Callable) -> Callable:
    """fn(q, k, v, is_causal) whose outputs are checked: the first call's wholly
    (`check_output`: shape, dtype, device, NaN or inf), every later call's shape, dtype and device
    (metadata: no device work, no synchronisation, so a timed call costs what the contender's
    own does). The bench checks the outputs of timed calls again afterwards (`stale_output`)."""
    checked = []

    @functools.wraps(fn)
    def call(q, k, v, is_causal):
        import torch
        out = fn(q, k, v, is_causal)
        # traced (the leaderboard's harness compiles the call, fullgraph): the metadata alone, which
        # a trace knows (a NaN test would be a data-dependent branch); the values are checked after
        # the timed calls (`stale_output`)
        if checked or torch.compiler.is_compiling():
            if not (getattr(out, "shape", None) == q.shape and out.dtype == q.dtype and out.device == q.device):
                check_output(out, q)  # raises Wrong, naming what differs
            return out
        check_output(out, q)
        checked.append(True)
        return out
    return call
