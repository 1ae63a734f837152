"""Memory of one step (mode `forward`: a forward pass; `fwd_bwd`: forward and backward, no
optimizer step; `train`: a training step): peak allocated and reserved, the active-memory
timeline and the largest allocations from a memory snapshot, the size of one residual-stream
activation checked against the snapshot, and a picture of the snapshot's allocations over time.

    python -m lmperf.bench.memory --spec '{...}' --out results/cpu/memory/memory.csv --hw cpu

On a GPU the snapshot comes from torch.cuda.memory._record_memory_history; on a CPU from
torch.profiler(profile_memory=True), converted by torch's own _profile_to_snapshot: the same
format, but it sees only what the step allocates (no baseline, no reserved memory).
An interactive HTML view of each snapshot (torch's memory visualizer) is written beside the CSV
(html/, not kept in git), and a PNG of its allocations stacked over time (snapshots/<case>.png, at
most MAX_PNG_BYTES: the picture the report shows beside the peaks).
"""
from __future__ import annotations

import itertools
from pathlib import Path

from lmperf import stats, train
from lmperf.bench import cli, loop, timing

TIMELINE_POINTS = 400
TOP_ALLOCATIONS = 8
MODES = ("forward", "fwd_bwd", "train")
# The snapshot picture: its largest allocations each a band of their own, at most this size
MAX_PNG_BYTES = 1_000_000
PNG_BANDS = 120
PNG_POINTS = 800
SNAPSHOTS = "snapshots"   # the PNGs' folder beside the CSV


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


def step_of(case: dict, model, optimizer, inputs, targets, autocast):
    """The step a case records: a forward pass (`forward`), a training step (`train`), or forward
    and backward without the optimizer step (`fwd_bwd`: the gradients are released at the end, as
    the optimizer's zero_grad(set_to_none=True) would, so that each step starts from the same
    memory)."""
    if case["mode"] not in MODES:
        raise ValueError(f"memory: mode {case['mode']!r} is not one of {MODES}")
    if case["mode"] != "fwd_bwd":
        return lambda: train.step(model, optimizer, inputs, targets, autocast)

    def forward_backward():
        with autocast:
            loss = train.loss(model, inputs, targets)
        loss.backward()
        model.zero_grad(set_to_none=True)
    return forward_backward


def measure(case: dict, dims: dict, html_dir: Path, png_dir: Path | None = None) -> list[dict]:
    import torch
    from torch.cuda import _memory_viz

    cuda = torch.cuda.is_available()
    cfg, model, optimizer, inputs, targets, autocast = train.setup(case, dims)
    run_step = step_of(case, model, optimizer, inputs, targets, autocast)
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
    title = f"{case['size']}, {case['mode']}, {case['dtype']}, context {case['context']:,}"
    png_dir = png_dir or html_dir.parent / SNAPSHOTS  # beside the HTML pages' folder, both beside the CSV
    timeline_png(trace, baseline, png_dir / f"{case['case_id']}.png", title)
    return rows


def allocations(trace: list[dict]) -> tuple[list[dict], list[int]]:
    """The trace's allocations, each {size, start, end, category} (`start`: the event index of its
    alloc, `end`: of its free, len(trace) where the step left it allocated), and after each event
    the bytes freed so far that were allocated before the trace began (a GPU's parameters and
    optimizer state, recorded from the step's start)."""
    live, out, freed_before, gone = {}, [], [], 0
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = len(out)
            out.append({"size": event["size"], "start": i, "end": len(trace),
                        "category": event.get("category") or ""})
        elif event["action"] == "free_completed":
            k = live.pop(event["addr"], None)
            if k is None:
                gone += event["size"]
            else:
                out[k]["end"] = i
        freed_before.append(gone)
    return out, freed_before


def stacked_bands(trace: list[dict], baseline: int, bands: int = PNG_BANDS, points: int = PNG_POINTS):
    """The snapshot's allocations stacked over time, as torch's memory visualizer draws its active
    memory timeline: (the sampled event indices, the bottom band: memory allocated before the step
    and still allocated, then the allocations below the largest `bands`, summed; and each of the
    largest as (lower, upper) edges at those events, stacked in the order they were allocated,
    in bytes). The samples are evenly spaced events with the peak's among them."""
    import numpy as np
    allocs, freed_before = allocations(trace)
    n = len(trace)
    if n == 0:
        return np.zeros(0, dtype=int), np.zeros(0), np.zeros(0), []
    # without a measured baseline (a CPU's), at least what the step frees of the memory before it
    baseline = max(baseline, freed_before[-1])
    active = np.array(timeline(trace), dtype=float) + baseline
    t = np.unique(np.concatenate([np.linspace(0, n - 1, min(points, n)).round().astype(int), [int(active.argmax())]]))
    before = baseline - np.array(freed_before, dtype=float)[t]
    big = sorted(sorted(range(len(allocs)), key=lambda k: -allocs[k]["size"])[:bands])  # allocation order
    sizes = np.array([allocs[k]["size"] for k in big], dtype=float)
    alive = np.array([(allocs[k]["start"] <= t) & (t < allocs[k]["end"]) for k in big]).reshape(len(big), len(t))
    heights = alive * sizes[:, None]
    small = active[t] - before - heights.sum(axis=0)
    lower = before + small + np.vstack([np.zeros((1, len(t))), heights.cumsum(axis=0)[:-1]])
    edges = [(lower[i], lower[i] + heights[i], allocs[k]["category"]) for i, k in enumerate(big)]
    return t, before, small, edges


def timeline_png(trace: list[dict], baseline: int, path: Path, title: str) -> Path:
    """A PNG of the snapshot's allocations stacked over time (`stacked_bands`), each of the largest
    a band of its own, at most MAX_PNG_BYTES: written at a lower resolution until it fits."""
    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: no global state, no display
    t, before, small, edges = stacked_bands(trace, baseline)
    mib = 2**20
    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    if len(t):
        ax.fill_between(t, 0, before / mib, color="0.55", lw=0, label="allocated before the step")
        ax.fill_between(t, before / mib, (before + small) / mib, color="0.8", lw=0,
                        label=f"smaller allocations (all but the largest {len(edges)})")
        colors = matplotlib.colormaps["tab20"].colors
        for i, (lo, hi, _) in enumerate(edges):
            alive = hi > lo
            ax.fill_between(t, lo / mib, hi / mib, where=alive, color=colors[i % len(colors)], lw=0,
                            step=None)
    else:
        ax.text(0.5, 0.5, "the snapshot recorded no allocation", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("snapshot events")
    ax.set_ylabel("allocated MiB")
    ax.set_title(f"Allocations over one step: {title}", fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    try:
        for dpi in (110, 80, 60, 40):
            fig.savefig(part, dpi=dpi, format="png")
            if part.stat().st_size <= MAX_PNG_BYTES:
                part.replace(path)
                return path
        raise RuntimeError(f"{path}: the snapshot picture is over {MAX_PNG_BYTES:,} bytes at every resolution")
    finally:
        part.unlink(missing_ok=True)


def main(argv=None):
    args = cli.bench_args(__doc__, argv)  # spec: size, contexts, modes, dtypes and the model dims
    html_dir = args.out.parent / "html"
    loop.run_cases(section="memory", study="memory", cases=cases(args.spec),
                     measure=lambda case: measure(case, args.spec["model"], html_dir), out_csv=args.out,
                     hw=args.hw, log_path=args.log, fingerprint={"spec": args.spec})


if __name__ == "__main__":
    main()
