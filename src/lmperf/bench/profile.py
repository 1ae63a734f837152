"""Kernel-level profile of the training step: torch.profiler over warm steps, one phase at a
time (forward, backward, optimizer); the top kernels with call counts and share of the phase,
the share of matrix multiplies, and the three parts of attention against their FLOPs.

    python -m lmperf.bench.profile --spec '{...}' --out results/cpu/profile/profile.csv --hw cpu

On a GPU the times are the kernels' device times; on a CPU, the operators' self CPU times.
The same phases and attention parts are NVTX ranges, so `nsys profile` shows them too.
"""
from __future__ import annotations

import contextlib
import math
import re

from lmperf import stats, train
from lmperf.bench import cli, loop, timing

PHASES = ("forward", "backward", "optimizer")
ATTENTION_PARTS = ("attention.scores", "attention.softmax", "attention.values")
MATMUL = re.compile(r"gemm|xmma|cutlass|wgmma|cublas|nvjet|sm\d\d_|aten::(mm|bmm|addmm|baddbmm|_?mm)\b", re.I)


def category(kernel: str) -> str:
    if MATMUL.search(kernel):
        return "matmul"
    if "softmax" in kernel.lower():
        return "softmax"
    return "other"


# Named ranges (record_function): ours, torch.optim's and the profiler's own. On a GPU each is
# also listed as a device-side annotation spanning its kernels, which is not a kernel.
ANNOTATIONS = ("phase.", "attention.", "ProfilerStep", "Optimizer.")


def is_annotation(name: str) -> bool:
    return name.startswith(ANNOTATIONS)


def kernel_times(prof, cuda: bool) -> dict[str, tuple[float, int]]:
    """{name: (self time in us, calls)} of the kernels (GPU) or operators (CPU) in one profile,
    named ranges left out."""
    out = {}
    for e in prof.key_averages():
        if is_annotation(e.key) or getattr(e, "is_user_annotation", False):
            continue
        if cuda:
            if not timing.is_device_work(e):
                continue
            t = e.self_device_time_total
        else:
            t = e.self_cpu_time_total
        name, (total, calls) = e.key, out.get(e.key, (0.0, 0))
        out[name] = (total + t, calls + e.count)
    return out


def range_times(prof, cuda: bool) -> dict[str, float]:
    """Total time (us) inside each named attention part: its kernels' device time on a GPU, its
    CPU time on a CPU. On a GPU a range appears twice, as the CPU-side range (whose device time
    is the sum of the kernels launched inside it) and as a device-side annotation spanning
    them; only the first is counted."""
    out = {}
    for e in prof.key_averages():
        if e.key in ATTENTION_PARTS and str(e.device_type) == "DeviceType.CPU":
            out[e.key] = out.get(e.key, 0.0) + (e.device_time_total if cuda else e.cpu_time_total)
    return out


def attention_flops(cfg, case: dict) -> dict[str, float]:
    """Forward FLOPs of the attention parts over all layers (full square: the causal mask is
    applied after the scores are computed)."""
    b, n, d, layers = case["batch_size"], case["context"], cfg.d_model, cfg.n_layers
    matmul = 2 * b * n * n * d * layers          # heads x (2 N^2 d_head) = 2 N^2 d per layer
    return {"attention.scores": matmul, "attention.values": matmul,
            "attention.softmax": 5 * b * cfg.n_heads * n * n * layers}  # max, sub, exp, sum, div


def cases(spec: dict) -> list[dict]:
    out = []
    for c in spec["cases"]:
        for dtype in spec["dtypes"]:
            case = {"size": c["size"], "context": c["context"], "dtype": dtype, "mode": "train",
                    "compile": False, "attention": "plain", "batch_size": spec["batch_size"],
                    "warmup": spec["warmup"], "profiled_steps": spec["profiled_steps"]}
            case["case_id"] = f"{c['size']}-ctx{c['context']}-{dtype}"
            out.append(case)
    return out


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning)."""
    return cases(spec)


def measure(case: dict, models: dict) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sync = timing.synchronizer()
    cfg, model, optimizer, inputs, targets, autocast = train.setup(case, models[case["size"]])
    for _ in range(case["warmup"]):
        train.step(model, optimizer, inputs, targets, autocast)
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    per_phase = {p: {} for p in PHASES}
    parts: dict[str, float] = {}
    with timing.window():  # the GPU's clocks as the profiled steps start and end (the rows' clock columns)
        for _ in range(case["profiled_steps"]):
            for phase in PHASES:  # one profile per phase, so every kernel is attributed to its phase
                prof = profile(activities=activities)

                @contextlib.contextmanager
                def around(p, prof=prof, phase=phase):
                    if p != phase:
                        yield
                        return
                    sync()  # the previous phase's kernels finish outside this profile
                    prof.start()
                    yield
                    sync()
                    prof.stop()
                train.step(model, optimizer, inputs, targets, autocast, around)
                for name, (t, calls) in kernel_times(prof, cuda).items():
                    total, n = per_phase[phase].get(name, (0.0, 0))
                    per_phase[phase][name] = (total + t, n + calls)
                if phase == "forward":
                    for name, t in range_times(prof, cuda).items():
                        parts[name] = parts.get(name, 0.0) + t
    steps = case["profiled_steps"]
    rows = []
    for phase, kernels in per_phase.items():
        phase_us = sum(t for t, _ in kernels.values())
        for name, (t, calls) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
            row = stats.summarize("kernel_us_per_step", "us", [t / steps])
            row.update(phase=phase, kernel=name, category=category(name), calls_per_step=calls / steps,
                       share=t / phase_us if phase_us else float("nan"))
            rows.append(row)
    flops = attention_flops(cfg, case)
    for name in ATTENTION_PARTS:
        if name in parts:
            us = parts[name] / steps
            row = stats.summarize("attention_part_us_per_step", "us", [us])
            row.update(phase="forward", kernel=name, category="attention part", flops=flops[name],
                       tflops=flops[name] / (us * 1e-6) / 1e12 if us else float("nan"))
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# One profiled training step of the ladder's rungs (bench/ladder.py)


# Substrings of profiler op and kernel names -> the attention kernel they belong to; first match wins.
BACKENDS = [("lmperf::flash_attention", "flash-triton (ours)"), ("_fwd_kernel", "flash-triton (ours)"),
            ("cudnn_attention", "cudnn"), ("flash_attention", "flash"), ("efficient_attention", "efficient"),
            ("attention_math", "math")]


# Kernel names of attention (ours, SDPA's flash and cuDNN backends, FlexAttention's).
ATTENTION_KERNEL = re.compile(r"_fwd_kernel|_fwd_combine_kernel|_bwd_dq_kernel|_bwd_dkdv_kernel|flash|fmha|"
                              r"cudnn.*(sdpa|attention|mha)|sdpa|flex_attention", re.I)


def kernel_rows(kernels: dict[str, tuple[float, int]]) -> list[dict]:
    """The GPU's time in one profiled training step, from {kernel: (device us, calls)}: all its
    kernels, the matrix multiplies and the attention kernels. Against the timed step (which
    runs unprofiled) the first says how busy the GPU is: a step far longer than its kernels
    waits on the host."""
    total = matmul = attention = 0.0
    for name, (t, _) in kernels.items():  # attention first: cuDNN's attention kernels look like GEMMs (sm90_...)
        total += t
        if ATTENTION_KERNEL.search(name):
            attention += t
        elif category(name) == "matmul":
            matmul += t
    return [stats.summarize(metric, "ms", [us / 1e3]) for metric, us in
            (("step_kernel_ms", total), ("step_matmul_kernel_ms", matmul), ("step_attention_kernel_ms", attention))]


def profile_step(case: dict, model, optimizer, inputs, targets, autocast) -> tuple[str, list[dict], float]:
    """One profiled training step: which attention kernel it runs (from its op and kernel names;
    'plain matmuls' for the model's own attention) and, on a GPU, its kernels' time
    (kernel_rows) and the GPU's busy ms (bench/timing.py's busy_ms; NaN without a GPU)."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    cuda = torch.cuda.is_available()
    if case["attention"] == "plain" and not cuda:
        return "plain matmuls", [], math.nan
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        train.step(model, optimizer, inputs, targets, autocast, train.nothing, case.get("micro_batches", 1))
        timing.synchronizer()()
    rows = kernel_rows(kernel_times(prof, cuda=True)) if cuda else []
    busy = timing.busy_ms(prof.events(), calls=1) if cuda else math.nan
    if case["attention"] == "plain":
        return "plain matmuls", rows, busy
    names = [e.key for e in prof.key_averages()]
    for pattern, backend in BACKENDS:
        if any(pattern in name for name in names):
            return backend, rows, busy
    return "unknown", rows, busy


def idle_share(rows: list[dict], busy_ms: float) -> float:
    """The GPU's idle share (%) of the median timed step (the `step_ms` row) in which the profiled
    step kept it busy `busy_ms` (bench/timing.py's idle_pct); NaN without either."""
    step = next((r["median"] for r in rows if r.get("metric") == "step_ms"), math.nan)
    return timing.idle_pct(busy_ms, step) if busy_ms == busy_ms and step == step else math.nan


def main(argv=None):
    args = cli.bench_args(__doc__, argv)  # spec: cases, dtypes, steps and the model dims
    loop.run_cases(section="profile", study="profile", cases=cases(args.spec),
                     measure=lambda case: measure(case, args.spec["models"]), out_csv=args.out,
                     hw=args.hw, log_path=args.log, fingerprint={"spec": args.spec})


if __name__ == "__main__":
    main()
