"""Memory of one forward pass or training step: peak allocated and reserved, the active-memory
timeline and the largest allocations from a memory snapshot, and the size of one residual-stream
activation checked against the snapshot.

    python -m lmperf.bench.memory --spec '{...}' --out results/cpu/memory/memory.csv --hw cpu

On a GPU the snapshot comes from torch.cuda.memory._record_memory_history; on a CPU from
torch.profiler(profile_memory=True), converted by torch's own _profile_to_snapshot: the same
format, but it sees only what the step allocates (no baseline, no reserved memory).
An interactive HTML view of each snapshot (torch's memory visualizer) is written beside the CSV.
"""
from __future__ import annotations

import itertools
from pathlib import Path

from lmperf import stats, train
from lmperf.bench import cli, loop, timing

TIMELINE_POINTS = 400
TOP_ALLOCATIONS = 8


def timeline(trace: list[dict]) -> list[int]:
    """Bytes allocated by the trace's events and not yet freed, after each event."""
    active, out = 0, []
    for event in trace:
        if event["action"] == "alloc":
            active += event["size"]
        elif event["action"] == "free_completed":
            active -= event["size"]
        out.append(active)
    return out


def downsample(xs: list[float], points: int = TIMELINE_POINTS) -> list[float]:
    """At most `points` values, each the max of its bucket, so peaks survive."""
    if len(xs) <= points:
        return list(xs)
    step = len(xs) / points
    return [max(xs[int(i * step):max(int((i + 1) * step), int(i * step) + 1)]) for i in range(points)]


def frame_text(frame: dict) -> str:
    filename = frame.get("filename", "none")
    if filename in ("none", "??", ""):
        return frame["name"]
    path = Path(filename)
    where = "/".join(path.parts[path.parts.index("lmperf"):]) if "lmperf" in path.parts else path.name
    return f"{where}:{frame['line']} {frame['name']}"


# Python frames are recorded for allocations made from Python; backward runs on the autograd
# engine's own thread, whose allocations have none.
NO_STACK = "(no Python frame: autograd engine thread, i.e. backward)"


def made_by(frames: list[dict]) -> str:
    """The operation that made an allocation: the innermost frame, and the innermost frame in
    lmperf's own code if there is one."""
    frames = [f for f in frames if f.get("filename", "").endswith(".py")] or frames
    if not frames:
        return NO_STACK
    texts = [frame_text(f) for f in frames]
    ours = next((t for t, f in zip(texts, frames)
                 if "lmperf" in f.get("filename", "") + f.get("name", "")), None)
    return texts[0] + (f" from {ours}" if ours and ours != texts[0] else "")


def largest(trace: list[dict], k: int = TOP_ALLOCATIONS) -> list[dict]:
    allocs = sorted((e for e in trace if e["action"] == "alloc"), key=lambda e: -e["size"])[:k]
    return [{"bytes": e["size"], "made_by": made_by(e.get("frames", [])),
             "category": e.get("category", "")} for e in allocs]


def device_trace(snapshot: dict) -> list[dict]:
    traces = [t for t in snapshot["device_traces"] if t]
    return traces[0] if traces else []


def record_snapshot(run_step, cuda: bool) -> dict:
    import torch
    if cuda:
        # Python frames only: C++ frames would have to be symbolized, which takes minutes.
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
        try:
            run_step()
            timing.synchronizer()()
            return torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    from torch.cuda import _memory_viz
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        run_step()
    return _memory_viz._profile_to_snapshot(prof)


def cases(spec: dict) -> list[dict]:
    out = []
    for context, mode, dtype in itertools.product(spec["contexts"], spec["modes"], spec["dtypes"]):
        case = {"size": spec["size"], "context": context, "mode": mode, "dtype": dtype, "compile": False,
                "attention": "plain", "batch_size": spec["batch_size"]}
        case["case_id"] = f"{spec['size']}-ctx{context}-{mode}-{dtype}"
        out.append(case)
    return out


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning)."""
    return cases(spec)


def measure(case: dict, dims: dict, html_dir: Path) -> list[dict]:
    import torch
    from torch.cuda import _memory_viz

    cuda = torch.cuda.is_available()
    cfg, model, optimizer, inputs, targets, autocast = train.setup(case, dims)
    run_step = lambda: train.step(model, optimizer, inputs, targets, autocast)
    run_step()  # warm-up: optimizer state and allocator pools exist before the recorded step
    timing.synchronizer()()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = 0
    snapshot = record_snapshot(run_step, cuda)
    trace = device_trace(snapshot)
    active = [baseline + a for a in timeline(trace)]
    rows = []
    if cuda:
        rows.append(stats.summarize("peak_allocated_mib", "MiB", [torch.cuda.max_memory_allocated() / 2**20]))
        rows.append(stats.summarize("peak_reserved_mib", "MiB", [torch.cuda.max_memory_reserved() / 2**20]))
    else:
        row = stats.summarize("peak_allocated_mib", "MiB", [max(active, default=0) / 2**20])
        row["message"] = "allocations made during the step only (CPU: no baseline, no reserved memory)"
        rows.append(row)
    row = stats.summarize("timeline_mib", "MiB", [a / 2**20 for a in downsample(active)])
    row["message"] = f"{len(trace)} events, max of each of {min(len(active), TIMELINE_POINTS)} buckets"
    rows.append(row)
    # One residual-stream activation: batch x context x d_model, fp32 (the residual add promotes
    # to fp32 under autocast too, since the embedding output is fp32).
    residual = case["batch_size"] * case["context"] * cfg.d_model * 4
    row = stats.summarize("residual_stream_mib", "MiB", [residual / 2**20])
    matching = sum(1 for e in trace if e["action"] == "alloc" and e["size"] == residual)
    row.update(matching_allocations=matching, n_layers=cfg.n_layers)
    rows.append(row)
    for rank, a in enumerate(largest(trace), 1):
        row = stats.summarize("allocation_mib", "MiB", [a["bytes"] / 2**20])
        row.update(rank=rank, made_by=a["made_by"], category=a["category"])
        rows.append(row)
    html_dir.mkdir(parents=True, exist_ok=True)
    (html_dir / f"{case['case_id']}.html").write_text(_memory_viz.trace_plot(snapshot))
    return rows


def main(argv=None):
    args = cli.bench_args(__doc__, argv)  # spec: size, contexts, modes, dtypes and the model dims
    html_dir = args.out.parent / "html"
    loop.run_cases(section="memory", study="memory", cases=cases(args.spec),
                     measure=lambda case: measure(case, args.spec["model"], html_dir), out_csv=args.out,
                     hw=args.hw, log_path=args.log, fingerprint={"spec": args.spec})


if __name__ == "__main__":
    main()
