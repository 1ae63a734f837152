"""Scaling across GPUs with PyTorch's own engines: all-reduce bandwidth (NCCL, Gloo) and the
data-parallel training step (per-parameter and flattened all-reduce, DistributedDataParallel,
FSDP2, ZeroRedundancyOptimizer). One study and one process count per call, under torchrun:

    torchrun --standalone --nproc_per_node=2 -m lmperf.bench.distributed allreduce \
        --spec '{...}' --out results/h200-x2/distributed/allreduce_n2.csv --hw h200-x2
    python -m lmperf.bench.distributed ddp --spec '{...}' --out results/cpu/distributed/ddp_n1.csv --hw cpu

Every rank measures; rank 0 runs the harness (journal, failures as rows, the atomic CSV), hands
each case to the other ranks over a Gloo control group and gathers their numbers. A case that
needs more GPUs than the machine has is a `skipped` row "needs N GPUs", never a crash. A rank
that dies mid-collective takes the job down (torchrun stops the others); the journal keeps every
finished case, and a case that killed the job twice is an `error` row, as in every section.

One file above 300 lines on purpose: the rank-0 harness, the control-group protocol and the two
studies share the same process group set-up and case hand-off; split apart, each piece would
need the others to be read.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lmperf.bench import common

SECTION = "distributed"
MB = 10**6  # message sizes and bandwidths are decimal, as in nccl-tests: 1 MB = 1e6 bytes, GB/s = 1e9 B/s
VARIANTS = ("single", "per_param", "flat", "ddp", "fsdp2", "zero")
ZERO_BUCKET_MB = 25  # ZeroRedundancyOptimizer runs under DDP with its default bucket size

# NVLink bandwidth per GPU and direction (GB/s), by datasheet, keyed by a substring of the GPU's
# name: the ceiling of nccl-tests' bus bandwidth. NVLink 4 is 18 links x 25 GB/s a direction.
LINK_DATASHEET = {
    "H100 80GB HBM3": (450.0, "H100 SXM5, NVLink 4: 900 GB/s bidirectional"),
    "H200": (450.0, "H200 SXM, NVLink 4: 900 GB/s bidirectional"),
    "H100 NVL": (300.0, "H100 NVL, NVLink bridge: 600 GB/s bidirectional"),
    "A100-SXM4": (300.0, "A100 SXM4, NVLink 3: 600 GB/s bidirectional"),
    "B200": (900.0, "B200, NVLink 5: 1.8 TB/s bidirectional"),
}
# PCIe bandwidth per lane and direction after line coding (GB/s), by generation.
PCIE_LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


# ---------------------------------------------------------------------------------------------
# Ranks: who we are, and the control channel rank 0 uses to hand out cases


@dataclass
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    nccl: bool = False          # every rank has a GPU of its own, so CUDA tensors go through NCCL
    gpus: int = 0               # GPUs this machine has
    control: object = None      # a Gloo group for Python objects (cases, outcomes)

    def broadcast(self, obj):
        if self.world == 1:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather(self, obj) -> list:
        if self.world == 1:
            return [obj]
        import torch.distributed as dist
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def needs_gpus(self) -> str:
        return f"needs {self.world} GPUs (this machine has {self.gpus})"


def init_ranks(timeout_s: float) -> Ranks:
    """Join the job torchrun started (WORLD_SIZE, RANK, LOCAL_RANK); a plain `python -m` call is
    a job of one process. CUDA tensors go through NCCL only where each rank has its own GPU."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        if gpus:
            torch.cuda.set_device(0)
        return Ranks(nccl=gpus >= 1, gpus=gpus)
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    nccl = gpus >= world
    if nccl:
        torch.cuda.set_device(local)
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if nccl else "gloo",
                            timeout=dt.timedelta(seconds=timeout_s))
    return Ranks(rank, world, local, nccl, gpus, dist.new_group(backend="gloo"))


class RankFailure(common.NotRun):
    """A case failed on some rank: its status (oom, error, skipped) and message become the row."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def run_everywhere(case: dict, ranks: Ranks, measure_local: Callable) -> list:
    """Run one case on this rank and gather every rank's result; any rank's failure is raised
    (the first failing rank's status and message), so no rank writes a row alone."""
    try:
        outcome = ("ok", measure_local(case, ranks))
    except Exception as exc:  # a failed case is data; keep only its text (not the frames' tensors)
        outcome = ("failed", common.classify_failure(exc))
    outcomes = ranks.gather(outcome)
    for rank, (kind, result) in enumerate(outcomes):
        if kind == "failed":
            status, message = result
            raise RankFailure(status, message if status == "skipped" else f"rank {rank}: {message}")
    return [result for _, result in outcomes]


def lead(ranks: Ranks, measure_local: Callable, to_rows: Callable) -> Callable[[dict], list[dict]]:
    """Rank 0's measure(case) for run_cases: hand the case to every rank, run it, make rows."""
    def measure(case: dict) -> list[dict]:
        ranks.broadcast(case)
        return to_rows(case, run_everywhere(case, ranks, measure_local))
    return measure


def follow(ranks: Ranks, measure_local: Callable) -> None:
    """Ranks other than 0: run each case rank 0 hands out, until it sends None."""
    while (case := ranks.broadcast(None)) is not None:
        with contextlib.suppress(RankFailure):
            run_everywhere(case, ranks, measure_local)
        common.clean_device()


# ---------------------------------------------------------------------------------------------
# All-reduce


def allreduce_cases(spec: dict, world: int) -> list[dict]:
    cases = [{"case_id": f"link-n{world}", "kind": "link", "backend": "nccl", "world_size": world}]
    for backend, sizes in spec["backends"].items():
        for size_mb in sizes:
            cases.append({"case_id": f"{backend}-{size_mb}MB-n{world}", "kind": "allreduce",
                          "backend": backend, "world_size": world, "size_mb": size_mb,
                          "dtype": "fp32", "warmup": spec["warmup"], "iters": spec["iters"]})
    return cases


def bus_bandwidth(algbw: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: each rank sends and receives 2(n-1)/n of the
    buffer, so busbw is comparable with one link's peak whatever the process count."""
    return algbw * 2 * (world - 1) / world


def measure_allreduce_local(case: dict, ranks: Ranks, spec: dict) -> dict:
    """This rank's seconds per all-reduce, each synchronised (CUDA) before and after."""
    import torch
    import torch.distributed as dist

    if case["kind"] == "link":
        return link_peaks() if ranks.rank == 0 else {}
    if ranks.world == 1:
        raise common.NotRun("an all-reduce needs 2 or more processes")
    if case["backend"] == "nccl" and not ranks.nccl:
        raise common.NotRun(ranks.needs_gpus())
    device = f"cuda:{ranks.local_rank}" if case["backend"] == "nccl" else "cpu"
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    x = torch.ones(case["size_mb"] * MB // 4, dtype=torch.float32, device=device)
    seconds = []
    for i in range(case["warmup"] + case["iters"]):
        sync()
        dist.barrier(group=ranks.control)  # every rank starts together; the barrier is not timed
        t0 = time.perf_counter()
        dist.all_reduce(x)
        sync()
        if i >= case["warmup"]:
            seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds}


def allreduce_rows(case: dict, results: list) -> list[dict]:
    if case["kind"] == "link":
        rows = results[0]["rows"]
        if not rows:
            raise common.NotRun("no GPU link to report here: " + results[0]["why"])
        return rows
    # an all-reduce is done when the slowest rank is done: per iteration, the max over ranks
    seconds = [max(ts) for ts in zip(*(r["seconds"] for r in results))]
    nbytes, n = case["size_mb"] * MB, case["world_size"]
    algbw = [nbytes / s / 1e9 for s in seconds]
    return [common.summarize("time_ms", "ms", [s * 1e3 for s in seconds]),
            common.summarize("algbw_gbps", "GB/s", algbw),
            common.summarize("busbw_gbps", "GB/s", [bus_bandwidth(a, n) for a in algbw])]


def _nvidia_smi(*args: str) -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return ""


def topo_link(topo: str, a: int = 0, b: int = 1) -> str | None:
    """The connection between GPU a and GPU b in `nvidia-smi topo -m`'s matrix ('NV18', 'PIX',
    'SYS', ...), or None if the matrix has no such pair."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).split() for line in topo.splitlines()]
    first = next((i for i, words in enumerate(lines) if words[:1] == ["GPU0"]), None)
    if first is None:  # the header is the first line that starts with GPU0, the rows follow
        return None
    header = lines[first]
    row = next((words for words in lines[first + 1:] if words[:1] == [f"GPU{a}"]), None)
    if not row or f"GPU{b}" not in header:
        return None
    col = header.index(f"GPU{b}") + 1  # a row starts with its own name
    return row[col] if col < len(row) else None


def nvlink_speeds(status: str) -> list[float]:
    """GB/s of each active link in `nvidia-smi nvlink -s -i 0` ('Link 3: 26.562 GB/s');
    inactive links are left out."""
    return [float(m[1]) for m in re.finditer(r"Link\s+\d+:\s+([0-9.]+)\s*GB/s", status)]


def link_peaks() -> dict:
    """The link's peak as the driver reports it (topology, NVLink speeds or PCIe generation) and
    as the datasheet gives it, GB/s per GPU and direction: the rows of the `link` case."""
    import torch

    if not torch.cuda.is_available():
        return {"rows": [], "why": "no CUDA device"}
    name = torch.cuda.get_device_name(0)
    rows = []
    link = topo_link(_nvidia_smi("topo", "-m"))
    if link and link.startswith("NV"):
        speeds = nvlink_speeds(_nvidia_smi("nvlink", "-s", "-i", "0"))
        if speeds:
            row = common.summarize("link_peak_driver_gbps", "GB/s", [sum(speeds)])
            row["message"] = (f"GPU0-GPU1 {link} (nvidia-smi topo -m); GPU0 has {len(speeds)} active "
                              f"NVLinks at {speeds[0]:g} GB/s a direction (nvidia-smi nvlink -s)")
            rows.append(row)
    elif link:
        pcie = _nvidia_smi("--query-gpu=pcie.link.gen.max,pcie.link.width.max",
                           "--format=csv,noheader", "-i", "0").strip()
        m = re.match(r"\s*(\d+)\s*,\s*(\d+)", pcie)
        if m and int(m[1]) in PCIE_LANE_GBPS:
            row = common.summarize("link_peak_driver_gbps", "GB/s",
                                   [PCIE_LANE_GBPS[int(m[1])] * int(m[2])])
            row["message"] = f"GPU0-GPU1 {link} (nvidia-smi topo -m): PCIe gen {m[1]} x{m[2]}"
            rows.append(row)
    for key, (gbps, what) in LINK_DATASHEET.items():
        if key in name:
            row = common.summarize("link_peak_datasheet_gbps", "GB/s", [gbps])
            row["message"] = f"{what}, so {gbps:g} GB/s a direction (datasheet)"
            rows.append(row)
            break
    return {"rows": rows, "why": f"no topology from nvidia-smi and no datasheet entry for {name!r}"}


# ---------------------------------------------------------------------------------------------
# Data-parallel training step: the variants, shared with tests/test_distributed.py


MEMORY_BUCKET_MB = 25  # DDP's default bucket: the DDP case of the memory context


def ddp_cases(spec: dict, world: int) -> list[dict]:
    """One case per (size, variant, bucket size) at `context` ("scaling"); a job of one process
    runs the single-GPU baseline only, at the same per-GPU batch. With `memory_context`, each
    size also runs at that (shorter) per-GPU context, where the model's state rather than its
    activations fills the memory: DDP (25 MB buckets) and FSDP2 ("memory"; on one process, the
    single-GPU baseline), whose peaks are what sharding changes."""
    cases = []
    variants = [("single", None)] if world == 1 else [
        (v, b) for v in spec["variants"] for b in (spec["bucket_caps_mb"] if v == "ddp" else [None])]
    memory = [("single", None)] if world == 1 else [
        (v, MEMORY_BUCKET_MB if v == "ddp" else None) for v in ("ddp", "fsdp2") if v in spec["variants"]]
    contexts = [("scaling", spec["context"], variants)]
    if spec.get("memory_context"):
        contexts.append(("memory", spec["memory_context"], memory))
    for size in spec["sizes"]:
        for purpose, context, runs in contexts:
            for variant, bucket in runs:
                name = (f"{variant}-b{bucket}" if bucket else variant) + (f"-ctx{context}" if purpose == "memory" else "")
                cases.append({"case_id": f"{size}-{name}-n{world}", "size": size, "variant": variant,
                              "bucket_cap_mb": bucket if bucket else (ZERO_BUCKET_MB if variant == "zero" else None),
                              "world_size": world, "batch_per_gpu": spec["batch_per_gpu"],
                              "global_batch": spec["batch_per_gpu"] * world, "context": context,
                              "purpose": purpose, "dtype": spec["dtype"], "warmup": spec["warmup"],
                              "timed_steps": spec["timed_steps"], "profiled_steps": spec["profiled_steps"]})
    return cases


def build(variant: str, cfg, device, world: int, bucket_cap_mb: float | None,
          optimizer_class, optimizer_kwargs: dict):
    """(model, optimizer, reduce_gradients) of one variant. The weights are the same on every
    rank (seeded); reduce_gradients is the explicit all-reduce after backward, None where the
    engine communicates inside backward (DDP, FSDP2) or not at all (single)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lmperf.model import TransformerLM

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}; choose one of {VARIANTS}")
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the device: a 3B model is slow to init on a CPU
        model = TransformerLM(cfg)
    device_ids = [torch.device(device).index] if torch.device(device).type == "cuda" else None
    reduce = None
    if variant == "per_param":
        reduce = lambda: allreduce_per_parameter(list(model.parameters()), world)
    elif variant == "flat":
        reduce = lambda: allreduce_flat(list(model.parameters()), world)
    elif variant in ("ddp", "zero"):
        # buffers (RoPE tables) are the same on every rank: no broadcast each forward; gradients
        # live in DDP's buckets (no copy into them after backward)
        model = DDP(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb, broadcast_buffers=False,
                    gradient_as_bucket_view=True)
    elif variant == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:  # one all-gather / reduce-scatter unit per block, then the rest
            fully_shard(block)
        fully_shard(model)
    if variant == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_class,
                                            **optimizer_kwargs)
    else:
        optimizer = optimizer_class(model.parameters(), **optimizer_kwargs)
    return model, optimizer, reduce


def allreduce_per_parameter(params, world: int) -> None:
    """Average the gradients one all-reduce per parameter, all in flight at once, after backward."""
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    for work in [dist.all_reduce(g, async_op=True) for g in grads]:
        work.wait()
    for g in grads:
        g.div_(world)


def allreduce_flat(params, world: int) -> None:
    """Average the gradients with one all-reduce of all of them, flattened into one buffer."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    grads = [p.grad for p in params if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat.div_(world)
    for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(reduced)


def rank_batch(global_tokens, rank: int, world: int):
    """This rank's slice of the global batch (equal slices: the mean of the ranks' mean losses
    is the global mean loss), as (inputs, targets)."""
    per_rank = global_tokens.shape[0] // world
    tokens = global_tokens[rank * per_rank:(rank + 1) * per_rank]
    return tokens[:, :-1], tokens[:, 1:]


def train_step(model, optimizer, reduce, inputs, targets, autocast, around) -> None:
    """One training step, each phase inside `around(phase)` (a timer, a profiler, a memory
    probe): forward, backward, the explicit all-reduce (only where the variant has one), optimizer."""
    import torch
    from lmperf.ranges import annotate

    with around("forward"), annotate("phase.forward"):
        with autocast:
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    with around("backward"), annotate("phase.backward"):
        loss.backward()
    if reduce is not None:
        with around("allreduce"), annotate("phase.allreduce"):
            reduce()
    with around("optimizer"), annotate("phase.optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def train_steps(variant: str, cfg, rank: int, world: int, batches, optimizer_class,
                optimizer_kwargs: dict, bucket_cap_mb: float = ZERO_BUCKET_MB, device: str = "cpu") -> dict:
    """Train `variant` on this rank's slice of each global batch (fp32, no autocast) and return
    the full weights: the correctness check against single-process training on the same batches."""
    model, optimizer, reduce = build(variant, cfg, device, world, bucket_cap_mb, optimizer_class,
                                     optimizer_kwargs)
    for tokens in batches:
        inputs, targets = rank_batch(tokens.to(device), rank, world)
        train_step(model, optimizer, reduce, inputs, targets, contextlib.nullcontext(),
                   lambda phase: contextlib.nullcontext())
    return full_state(model)


def full_state(model) -> dict:
    """{name: full fp32 tensor on the CPU} whatever the wrapper (DDP's `module.` prefix dropped,
    FSDP2's DTensor shards gathered): what tests compare."""
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name.removeprefix("module.")] = t.detach().float().cpu().clone()
    return out


def local_mib(tensors) -> float:
    """MiB this rank holds of these tensors (a DTensor counts its local shard)."""
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total / 2**20


def optimizer_state_tensors(optimizer):
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer holds its shard's optimizer
    return [v for state in inner.state.values() for v in state.values()
            if hasattr(v, "numel") and v.numel() > 1]  # Adam's `step` counters are not state memory


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two unions (each sorted and disjoint)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def comm_exposure(kernels: list[tuple[str, float, float]]) -> dict:
    """From GPU kernel intervals (name, start, end), in us: time with a collective (NCCL kernel)
    running, time with any other kernel running, and the collective time no other kernel
    overlaps, i.e. the communication the step waits for."""
    comm = union([(s, e) for name, s, e in kernels if "nccl" in name.lower()])
    compute = union([(s, e) for name, s, e in kernels if "nccl" not in name.lower()])
    return {"comm_us": length(comm), "compute_us": length(compute),
            "exposed_comm_us": length(comm) - overlap(comm, compute)}


def train_device(ranks: Ranks) -> str:
    import torch

    if torch.cuda.is_available():
        if ranks.world > 1 and not ranks.nccl:
            raise common.NotRun(ranks.needs_gpus())
        return f"cuda:{ranks.local_rank}"
    return "cpu"  # a CPU-only machine trains on its CPU over Gloo (the smoke run)


def measure_train_local(case: dict, ranks: Ranks, spec: dict) -> dict:
    """This rank's phase times, memory split and (on a GPU) profiled communication."""
    import torch

    from lmperf.model import ModelConfig

    device = train_device(ranks)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = ModelConfig(**spec["models"][case["size"]], context_length=case["context"])
    model, optimizer, reduce = build(case["variant"], cfg, device, ranks.world, case["bucket_cap_mb"],
                                     torch.optim.AdamW, {"lr": 1e-4})
    autocast = (torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
                if case["dtype"] == "bf16" else contextlib.nullcontext())
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(cfg.vocab_size, (case["global_batch"], case["context"] + 1), generator=gen)
    inputs, targets = (t.to(device) for t in rank_batch(tokens, ranks.rank, ranks.world))
    probe = {}

    def step(around=lambda phase: contextlib.nullcontext()):
        train_step(model, optimizer, reduce, inputs, targets, autocast, around)

    @contextlib.contextmanager
    def grads_probe(phase):  # gradients are all there when the optimizer phase starts
        if phase == "optimizer":
            probe["grad_mib"] = local_mib(p.grad for p in model.parameters() if p.grad is not None)
        yield

    for _ in range(case["warmup"]):
        step()
    step(grads_probe)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    timed = []
    for _ in range(case["timed_steps"]):
        times = {}

        @contextlib.contextmanager
        def timer(phase):
            t0 = time.perf_counter()
            yield
            sync()
            times[phase] = (time.perf_counter() - t0) * 1e3
        step(timer)
        timed.append(times)
    out = {"phases_ms": {p: [t[p] for t in timed] for p in timed[0]},
           "param_mib": local_mib(model.parameters()), "grad_mib": probe["grad_mib"],
           "optimizer_state_mib": local_mib(optimizer_state_tensors(optimizer))}
    if cuda:
        out["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        out.update(profiled_comm(step, case["profiled_steps"]))
    return out


def profiled_comm(step: Callable, steps: int) -> dict:
    """Communication and compute kernel time per step, from torch.profiler over `steps` steps."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == DeviceType.CUDA]
    return {k.replace("_us", "_ms"): v / 1e3 / steps for k, v in comm_exposure(kernels).items()}


def ddp_rows(case: dict, results: list) -> list[dict]:
    """Rows: phases and step time (rank 0; collectives keep the ranks in step), throughput of
    the whole job, and per-rank memory and communication (samples = one value per rank)."""
    lead_rank = results[0]
    phases = lead_rank["phases_ms"]
    step_ms = [sum(ts) for ts in zip(*phases.values())]
    tokens = case["global_batch"] * case["context"]
    rows = [common.summarize(f"{p}_ms", "ms", xs) for p, xs in phases.items()]
    rows.append(common.summarize("step_ms", "ms", step_ms))
    rows.append(common.summarize("tokens_per_s", "tokens/s", [tokens / (s / 1e3) for s in step_ms]))
    per_rank = lambda key: [r[key] for r in results]
    for key in ("param_mib", "grad_mib", "optimizer_state_mib", "peak_allocated_mib"):
        if key in lead_rank:
            rows.append(common.summarize(key, "MiB", per_rank(key)))
    if "peak_allocated_mib" in lead_rank:
        rest = [r["peak_allocated_mib"] - r["param_mib"] - r["grad_mib"] - r["optimizer_state_mib"]
                for r in results]
        row = common.summarize("activations_mib", "MiB", rest)
        row["message"] = "peak allocated less parameters, gradients and optimizer state (buffers included)"
        rows.append(row)
    for key in ("comm_ms", "exposed_comm_ms", "compute_ms"):
        if key in lead_rank:
            rows.append(common.summarize(key, "ms", per_rank(key)))
    return rows


# ---------------------------------------------------------------------------------------------
# CLI

STUDIES = {"allreduce": (allreduce_cases, measure_allreduce_local, allreduce_rows),
           "ddp": (ddp_cases, measure_train_local, ddp_rows)}


def main(argv=None):
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="study", required=True)
    for name in STUDIES:
        p = sub.add_parser(name, parents=[common.base_parser(__doc__, add_help=False)])
        p.add_argument("--spec", required=True, help="the study's grid as JSON (config/config.yaml)")
        # torchrun reads every option up to its script's, and refuses --log as a prefix of its own
        # --log-dir / --logs-specs: under torchrun, name the progress log this way
        p.add_argument("--progress-log", dest="log", type=Path, help="the same as --log")
    args = top.parse_args(argv)
    common.check_environment(args)
    spec = json.loads(args.spec)
    ranks = init_ranks(spec.get("timeout_s", 600))
    make_cases, measure, to_rows = STUDIES[args.study]
    measure_local = lambda case, ranks: measure(case, ranks, spec)
    try:
        if ranks.rank == 0:
            common.run_cases(section=SECTION, study=args.study, cases=make_cases(spec, ranks.world),
                             measure=lead(ranks, measure_local, to_rows), out_csv=args.out,
                             hw=args.hw, log_path=args.log,
                             fingerprint={"spec": spec, "world_size": ranks.world})
            ranks.broadcast(None)  # done: the other ranks leave their loop
        else:
            follow(ranks, measure_local)
    finally:
        if ranks.world > 1:
            import torch.distributed as dist
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
