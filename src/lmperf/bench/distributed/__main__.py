"""Scaling across GPUs with PyTorch's own engines: all-reduce bandwidth (NCCL, Gloo; allreduce.py)
and the data-parallel training step (per-parameter and flattened all-reduce,
DistributedDataParallel, FSDP2, ZeroRedundancyOptimizer; ddp.py). One study and one process
count per call, under torchrun:

    torchrun --standalone --nproc_per_node=2 -m lmperf.bench.distributed allreduce \
        --spec '{...}' --out results/h200-x2/distributed/allreduce_n2.csv --hw h200-x2
    python -m lmperf.bench.distributed ddp --spec '{...}' --out results/cpu/distributed/ddp_n1.csv --hw cpu

`--cases PATTERN ...` runs only those cases (the repeats in fresh processes, bench/jobs.py).

Every rank measures; rank 0 runs the harness (journal, failures as rows, the atomic CSV), hands
each case to the other ranks over a Gloo control group and gathers their numbers (ranks.py). A
case that needs more GPUs than the machine has is a `skipped` row "needs N GPUs", never a crash.
A rank that dies mid-collective takes the job down (torchrun stops the others); the journal keeps
every finished case, and a case that killed the job twice is an `error` row, as in every section.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from lmperf.bench import cli, jobs, loop
from lmperf.bench.distributed import allreduce, ddp
from lmperf.bench.distributed.ranks import follow, init_ranks, lead

SECTION = "distributed"
# study -> (its cases for a process count, one rank's measurement, the rows from every rank's)
STUDIES = {"allreduce": (allreduce.cases, allreduce.measure_local, allreduce.rows),
           "ddp": (ddp.cases, ddp.measure_local, ddp.rows)}


def progress_log(p) -> None:
    # torchrun reads every option up to its script's, and refuses --log as a prefix of its own
    # --log-dir / --logs-specs: under torchrun, name the progress log this way
    p.add_argument("--progress-log", dest="log", type=Path, help="the same as --log")


def options(p) -> None:
    progress_log(p)
    jobs.options(p, workers=False)  # --cases: some cases alone (the repeats, bench/jobs.py)


def main(argv=None):
    args = cli.bench_args(__doc__, argv, studies=STUDIES, options=options)
    make_cases, measure, to_rows = STUDIES[args.study]
    try:  # on every rank, before they join: a pattern that selects nothing stops them all
        cases = jobs.select(make_cases(args.spec, int(os.environ.get("WORLD_SIZE", "1"))), args.cases)
    except ValueError as exc:
        raise SystemExit(f"error: --cases: {exc}") from None
    ranks = init_ranks(args.spec.get("timeout_s", 600))
    measure_local = lambda case, ranks: measure(case, ranks, args.spec)
    try:
        if ranks.rank == 0:
            loop.run_cases(section=SECTION, study=args.study, cases=cases,
                             measure=lead(ranks, measure_local, to_rows), out_csv=args.out,
                             hw=args.hw, log_path=args.log,
                             fingerprint={"spec": args.spec, "world_size": ranks.world})
            ranks.broadcast(None)  # done: the other ranks leave their loop
        else:
            follow(ranks, measure_local)
    finally:
        if ranks.world > 1:
            import torch.distributed as dist
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
