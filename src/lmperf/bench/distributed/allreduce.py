"""The all-reduce study of the distributed section: the time of one all-reduce per backend
(NCCL between GPUs, Gloo between CPUs) and message size, its algorithm and bus bandwidth as
nccl-tests defines them, and the `link` case: the GPU0-GPU1 link's peak from the driver and the
datasheet (lmperf.hardware), the ceiling of the bus bandwidth."""
from __future__ import annotations

import time

from lmperf import failures, hardware, stats
from lmperf.bench import timing
from lmperf.bench.distributed.ranks import Ranks

MB = 10**6  # message sizes and bandwidths are decimal, as in nccl-tests: 1 MB = 1e6 bytes, GB/s = 1e9 B/s


def cases(spec: dict, world: int) -> list[dict]:
    out = [{"case_id": f"link-n{world}", "kind": "link", "backend": "nccl", "world_size": world}]
    for backend, sizes in spec["backends"].items():
        for size_mb in sizes:
            out.append({"case_id": f"{backend}-{size_mb}MB-n{world}", "kind": "allreduce",
                        "backend": backend, "world_size": world, "size_mb": size_mb,
                        "dtype": "fp32", "warmup": spec["warmup"], "iters": spec["iters"]})
    return out


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning; `arg`: the process count)."""
    return cases(spec, int(arg))


def bus_bandwidth(algbw: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: each rank sends and receives 2(n-1)/n of the
    buffer, so busbw is comparable with one link's peak whatever the process count."""
    return algbw * 2 * (world - 1) / world


def measure_local(case: dict, ranks: Ranks, spec: dict) -> dict:
    """This rank's seconds per all-reduce, each synchronised (CUDA) before and after."""
    import torch
    import torch.distributed as dist

    if case["kind"] == "link":
        return link_rows() if ranks.rank == 0 else {}
    if ranks.world == 1:
        raise failures.NotRun("an all-reduce needs 2 or more processes")
    if case["backend"] == "nccl" and not ranks.nccl:
        raise failures.NotRun(ranks.needs_gpus())
    device = f"cuda:{ranks.local_rank}" if case["backend"] == "nccl" else "cpu"
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    x = torch.ones(case["size_mb"] * MB // 4, dtype=torch.float32, device=device)
    seconds = []
    with timing.window():  # this rank's GPU clocks at the start and end (the rows' clock columns)
        for i in range(case["warmup"] + case["iters"]):
            sync()
            dist.barrier(group=ranks.control)  # every rank starts together; the barrier is not timed
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync()
            if i >= case["warmup"]:
                seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds}


def link_rows() -> dict:
    """The rows of the `link` case: the link's peak as the driver reports it and as the datasheet
    gives it (lmperf.hardware.link_peaks), GB/s per GPU and direction; or why there are none."""
    import torch

    if not torch.cuda.is_available():
        return {"rows": [], "why": "no CUDA device"}
    name = torch.cuda.get_device_name(0)
    rows = []
    for source, gbps, how in hardware.link_peaks(name):
        row = stats.summarize(f"link_peak_{source}_gbps", "GB/s", [gbps])
        row["message"] = how
        rows.append(row)
    return {"rows": rows, "why": f"no topology from nvidia-smi and no datasheet entry for {name!r}"}


def rows(case: dict, results: list) -> list[dict]:
    if case["kind"] == "link":
        link = results[0]["rows"]
        if not link:
            raise failures.NotRun("no GPU link to report here: " + results[0]["why"])
        return link
    # an all-reduce is done when the slowest rank is done: per iteration, the max over ranks
    seconds = [max(ts) for ts in zip(*(r["seconds"] for r in results))]
    nbytes, n = case["size_mb"] * MB, case["world_size"]
    algbw = [nbytes / s / 1e9 for s in seconds]
    return [stats.summarize("time_ms", "ms", [s * 1e3 for s in seconds]),
            stats.summarize("algbw_gbps", "GB/s", algbw),
            stats.summarize("busbw_gbps", "GB/s", [bus_bandwidth(a, n) for a in algbw])]
