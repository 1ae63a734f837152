"""Record the memory-snapshot test fixture on this machine: a forward pass of the 2-layer model
of tests/test_memory.py (batch 2, context 16, d_model 32), recorded the way the memory
benchmark records it (on a GPU the CUDA allocator's history, on a CPU the profiler's), written
as gzipped JSON.

    PYTHONPATH=src python3 tools/record_memory_fixture.py tests/fixtures/memory_snapshot_cuda_forward.json.gz
"""
import argparse
import contextlib
import gzip
import json

import torch

from lmperf import train
from lmperf.bench import memory

CASE = {"size": "tiny", "context": 16, "mode": "forward", "dtype": "fp32", "compile": False,
        "attention": "plain", "batch_size": 2}
DIMS = {"d_model": 32, "d_ff": 64, "n_layers": 2, "n_heads": 2}


def record(out: str) -> None:
    cfg, model, optimizer, inputs, targets, autocast = train.setup(CASE, DIMS)
    nothing = lambda phase: contextlib.nullcontext()
    run = lambda: train.step(model, optimizer, inputs, targets, autocast, nothing)
    run()
    snapshot = memory.record_snapshot(run, torch.cuda.is_available())
    keep = {"device_traces": [memory.device_trace(snapshot)]}  # segments are not needed
    with gzip.open(out, "wt") as f:
        json.dump(keep, f)
    print(f"wrote {out}: {len(keep['device_traces'][0])} events")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the .json.gz to write")
    record(ap.parse_args().out)


if __name__ == "__main__":
    main()
