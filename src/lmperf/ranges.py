"""Named ranges that show up in torch.profiler traces and, on a GPU, in Nsight Systems (NVTX),
so a user's `nsys profile` of any lmperf run sees the same phases as the report."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def annotate(name: str):
    """A torch.profiler range and an NVTX range named `name`; nothing while torch.compile
    traces (an NVTX call would break the graph)."""
    if torch.compiler.is_compiling():
        yield
        return
    nvtx = torch.cuda.is_available()
    with torch.profiler.record_function(name):
        if nvtx:
            torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()
