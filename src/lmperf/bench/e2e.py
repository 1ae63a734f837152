"""End-to-end timings of the Transformer LM: forward only, or a training step (lmperf.train.step)
timed per phase (forward, backward, optimizer). One study and one model size per call; the
ladder (bench/ladder.py) times its rungs with the same `time_steps`.

A case runs its warm-up steps, then timed steps until the stop rule (bench/timing.py's
sample_until) stops it: once the 99% interval of the median step lies within `median_within`
(±1%) of it, after at least 8 steps; at `timed_steps` at most; or, after at least
`min_timed_steps`, once the timed steps add up to `timed_window_s` seconds (config/sections/e2e.yaml).
Every row of a case says why it stopped (`stop`) and after how many timed steps (`stop_after`).
Rows keep every
step's value and give its median and 20% / 80% quantiles; tokens/s, TFLOP/s and MFU are the
step's work over the median step time (stats.summarize_rate); MFU against the peak of the
case's dtype (`mfu_pct`) and against the bf16 tensor-core peak (`mfu_bf16_pct`). On a GPU the
timed steps' energy per token, mean power, power limit and mean SM clock (bench/energy.py) are
rows too. Every row of a case carries
`gpu_idle_pct`, the share of its median step in which the GPU sat idle (bench/timing.py's
gpu_idle, from a few more steps profiled; empty without CUDA).

    python -m lmperf.bench.e2e --study variants --size small --spec '{...}' \
        --out results/cpu/e2e/variants/small.csv --hw cpu
"""
from __future__ import annotations

import contextlib
import itertools
import math
import statistics

from lmperf import hardware, stats, train
from lmperf.bench import cli, energy, loop, timing

DTYPES = ("fp32", "bf16")
MODES = ("forward", "train")


def study_cases(spec: dict, size: str) -> list[dict]:
    """The study's grid for one model size: the product of its lists, as data."""
    grid = spec["grid"]
    cases = []
    for context, dtype, compiled, mode, warmup, optimizer in itertools.product(
            grid["contexts"], grid["dtypes"], grid["compile"], grid["modes"], grid["warmup"],
            grid.get("optimizers", ["foreach"])):
        case = {"size": size, "context": context, "dtype": dtype, "compile": bool(compiled),
                "mode": mode, "warmup": warmup, "batch_size": spec["batch_size"],
                **timing_keys(spec), "attention": spec.get("attention", "plain"), "optimizer": optimizer}
        case["case_id"] = (f"{size}-ctx{context}-{dtype}-{'compiled' if compiled else 'eager'}"
                           f"-{mode}-warmup{warmup}" + ("" if optimizer == "foreach" else f"-{optimizer}"))
        cases.append(case)
    return cases


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning; `arg`: the model size)."""
    return study_cases(spec, arg)


def timing_keys(spec: dict) -> dict:
    """How many steps a case times, from its spec (bench/timing.py's StopRule): `timed_steps` at
    most; fewer once the median is known to `median_within`, or, not under `min_timed_steps`,
    once the steps fill `timed_window_s` seconds. A spec without them (one written by hand)
    times all `timed_steps`."""
    most = spec["timed_steps"]
    return {"timed_steps": most, "min_timed_steps": min(most, spec.get("min_timed_steps", most)),
            "timed_window_s": spec.get("timed_window_s"), "median_within": spec.get("median_within")}


def run_timed(timed_step, case: dict) -> tuple[list[dict], str]:
    """The timed steps of a case ({phase: seconds} each) and why they stopped: the stop rule of
    its keys (timing_keys) on the steps' total seconds."""
    return timing.sample_until(timed_step, timing.StopRule.from_case(case),
                               seconds=lambda t: sum(t.values()))


def measure(case: dict, model_dims: dict) -> list[dict]:
    with train.matmul_precision(case.get("tf32", False)):
        return time_steps(case, *train.setup(case, model_dims))


def peak_key(case: dict) -> str:
    """Which peak of hardware.PEAK_TFLOPS a case's MFU is against: its dtype, or 'tf32'."""
    return "tf32" if case["dtype"] == "fp32" and case.get("tf32") else case["dtype"]


def time_steps(case: dict, cfg, model, optimizer, inputs, targets, autocast, idle: bool = True) -> list[dict]:
    """Warm-up steps, then timed steps of a set-up case: the rows of its metrics. Without `idle`,
    no GPU idle share (NaN): a caller that profiles a step of its own measures it there (the
    ladder: bench/profile.py's profile_step)."""
    import torch
    from lmperf.model import count_parameters
    from lmperf.flops import flops_per_token

    device = inputs.device.type
    sync = timing.synchronizer()
    b, n = case["batch_size"], case["context"]

    def timed_step() -> dict:
        """Seconds per phase, the device synchronized after each."""
        times = {}

        @contextlib.contextmanager
        def timer(phase):  # a phase seen once per micro-batch: its times add up
            with timing.timed(sync) as t:
                yield
            times[phase] = times.get(phase, 0.0) + t.seconds
        train.step(model, optimizer, inputs, targets, autocast, timer, case.get("micro_batches", 1))
        return times

    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    first_step_s = None
    for _ in range(case["warmup"]):
        t = timed_step()
        first_step_s = first_step_s or sum(t.values())
    with energy.meter() as meter:
        timed, stop = run_timed(timed_step, case)
    first_step_s = first_step_s or sum(timed[0].values())

    phases = {p: [t[p] * 1e3 for t in timed] for p in timed[0]}
    step_ms = [sum(t.values()) * 1e3 for t in timed]
    # host-bound? the GPU's idle share of the median step, from a few more steps profiled
    idle, why_not = timing.gpu_idle(timed_step, wall_ms=statistics.median(step_ms)) if idle else (math.nan, "")
    tokens_per_step = b * n * case.get("micro_batches", 1)
    flops_per_step = flops_per_token(cfg, n, case["mode"]) * tokens_per_step
    rows = [stats.summarize(f"{p}_ms", "ms", xs) for p, xs in phases.items()]
    rows.append({**stats.summarize("step_ms", "ms", step_ms), "message": why_not})
    rows.append(stats.summarize_rate("tokens_per_s", "tokens/s", tokens_per_step, step_ms))
    rows.append(stats.summarize_rate("tflops", "TFLOP/s", flops_per_step / 1e12, step_ms))
    gpu = torch.cuda.get_device_name() if device == "cuda" else ""
    for metric, key in (("mfu_pct", peak_key(case)), ("mfu_bf16_pct", "bf16")):
        peak = hardware.peak_tflops(gpu, key) if gpu else None
        if peak:  # against the dense datasheet peak of the case's dtype, and of bf16 (hardware.py)
            row = stats.summarize_rate(metric, "%", 100 * flops_per_step / 1e12 / peak, step_ms)
            rows.append({**row, "peak_tflops": peak})
    if device == "cuda":  # over the timed steps (bench/energy.py): J/token, and whether the power limit binds
        tokens = tokens_per_step * len(timed)
        rows.append({**stats.summarize("joules_per_token", "J/token", [meter.joules / tokens]),
                     "message": meter.why_not})
        rows += [stats.summarize(m, unit, [value]) for m, unit, value in (
            ("mean_power_w", "W", meter.mean_power_w), ("power_limit_w", "W", meter.power_limit_w),
            ("mean_sm_clock_mhz", "MHz", meter.mean_sm_clock_mhz))]
    rows.append(stats.summarize("first_step_ms", "ms", [first_step_s * 1e3]))
    rows.append(stats.summarize("parameters", "count", [count_parameters(cfg)]))
    if device == "cuda":
        rows.append(stats.summarize("peak_allocated_mib", "MiB", [torch.cuda.max_memory_allocated() / 2**20]))
    return [{**r, "gpu_idle_pct": idle, "stop": stop, "stop_after": len(timed)} for r in rows]


def main(argv=None):
    study = lambda p: p.add_argument("--study", required=True, help="study name (variants, warmup, context, ...)")
    args = cli.bench_args(__doc__, argv, size=True, options=study)
    dims = args.spec["models"][args.size]
    loop.run_cases(section="e2e", study=args.study, cases=study_cases(args.spec, args.size),
                     measure=lambda case: measure(case, dims), out_csv=args.out, hw=args.hw,
                     log_path=args.log, fingerprint={"spec": args.spec, "size": args.size})


if __name__ == "__main__":
    main()
