"""PyTorch attention, eager and compiled: time of forward and backward passes, each direction
timed until the stop rule (bench/timing.py's sample_until) stops it: once the 99% interval of its
median lies within `median_within` of it (after at least 8 passes), at `iters` (100) at most, or,
not under `min_iters`, once its passes add up to `window_s` seconds; and the memory held for
backward against what the saved tensors predict. Each row says why its direction stopped (`stop`)
and after how many passes (`stop_after`).

    python -m lmperf.bench.attention --spec '{...}' --out results/cpu/attention/attention.csv --hw cpu

The forward rows carry `gpu_idle_pct`, the share of the median forward pass the GPU sat idle
(bench/timing.py's gpu_idle; empty without CUDA), and the backward rows that of a forward and
backward against the two medians' sum (a backward needs a fresh graph each call).

With `--workers N` (the config's `workers`), the compiled cases are first compiled in N worker
processes and a contender's cases in its own process (bench/jobs.py), beside the other jobs'
checks and warm-ups: the timed loop then loads their graphs and kernels, and times.

A spec with `dtypes` (the deep target's grid, config `attention.<scale>.deep`) runs each case in
each dtype (fp32, bf16; the case id names it), and with `oom_max_seq_len` goes on past its
`seq_lens`, doubling N for each implementation, dtype and head dim up to that N: the first case
of such a line that runs out of memory is its `oom` row, and every longer N of the line is a
`skipped` row naming it (a case of the line measured in an earlier run of the job, then resumed
from its journal, runs again instead). An out-of-memory case frees what it allocated before the
next starts (loop.clean_device).
"""
from __future__ import annotations

import functools
import itertools

from lmperf import contenders, csv_schema, failures, stats
from lmperf.attention_memory import ELEMENT_BYTES, predicted_peak_bytes, predicted_saved_bytes
from lmperf.bench import cli, isolation, jobs, loop, timing


def seq_lens(spec: dict) -> list[int]:
    """The spec's N, then, with `oom_max_seq_len`, N doubled from the largest up to that N: the
    line that goes on to its first out-of-memory case."""
    out = list(spec["seq_lens"])
    cap = spec.get("oom_max_seq_len")
    while cap and out[-1] * 2 <= cap:
        out.append(out[-1] * 2)
    return out


def cases(spec: dict) -> list[dict]:
    """impl x (dtype) x head dim x N: PyTorch's eager and compiled attention, then the spec's
    contenders' attention providers (lmperf.contenders) on the same grid, (batch, N, D) inputs as
    the assignment passes them. A spec without `dtypes` runs fp32 with case ids that name none;
    N past the spec's `seq_lens` (`oom_max_seq_len`) come last in their line, marked `past_grid`."""
    out = []
    impls = list(spec["impls"]) + contenders.provider_names(spec.get("contenders"))
    dtypes = spec.get("dtypes")
    grid_max = max(spec["seq_lens"])
    for impl, dtype, d, n in itertools.product(impls, dtypes or [None], spec["head_dims"], seq_lens(spec)):
        named = f"{impl}-{dtype}" if dtype else impl
        out.append({"impl": impl, "dtype": dtype or "fp32", "head_dim": d, "seq_len": n, "batch": spec["batch"],
                    "iters": spec["iters"], "min_iters": min(spec["iters"], spec.get("min_iters", spec["iters"])),
                    "window_s": spec.get("window_s"), "median_within": spec.get("median_within"),
                    "tiled_max_seq_len": spec.get("tiled_max_seq_len", 1024), "past_grid": n > grid_max,
                    "peak": bool(dtypes),
                    "case_id": f"{named}-d{d}-n{n}"})
    return out


def study(spec: dict) -> str:
    """The job's study (its rows' `study`): `attention_deep` for the deep target's grid (a spec
    with `dtypes`), else `attention`."""
    return "attention_deep" if spec.get("dtypes") else "attention"


def line(case: dict) -> tuple:
    """The doubling line a case is on: its implementation, dtype and head dim."""
    return case["impl"], case["dtype"], case["head_dim"]


class StopAtOom:
    """measure() over a job's cases that stops each line at its first out-of-memory case: a
    longer N of the line is a `skipped` row naming that case (module docstring)."""

    def __init__(self, measure):
        self.measure, self.first_oom = measure, {}

    def __call__(self, case: dict) -> list[dict]:
        at = self.first_oom.get(line(case))
        if at is not None and case["seq_len"] > at:
            raise failures.NotRun(f"not run: N = {at} ran out of memory on this line "
                                  f"({case['impl']}, {case['dtype']}, d = {case['head_dim']})")
        try:
            rows = self.measure(case)
        except Exception as exc:
            if failures.is_oom(exc):
                self.first_oom[line(case)] = min(case["seq_len"], self.first_oom.get(line(case), case["seq_len"]))
            raise
        if any(r.get("status") == "oom" for r in rows):  # an isolated case's row
            self.first_oom[line(case)] = min(case["seq_len"], self.first_oom.get(line(case), case["seq_len"]))
        return rows


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning)."""
    return cases(spec)


@functools.cache
def _compiled():
    import torch
    from lmperf.model import plain_attention
    return torch.compile(plain_attention)

def stop_rule(case: dict) -> timing.StopRule:
    """How many passes a direction times (module docstring; a case without a window or
    `median_within` times all `iters`)."""
    return timing.StopRule.from_case(case, ceiling="iters", floor="min_iters", window="window_s")


def measure(case: dict) -> list[dict]:
    import torch
    from lmperf.model import plain_attention

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    sync = timing.synchronizer()
    if case["impl"] in ("eager", "compiled"):
        fn = plain_attention if case["impl"] == "eager" else _compiled()
    else:  # a contender's, its every output checked (shape, dtype, device, NaN)
        from lmperf.model import ATTENTION
        if case["impl"].endswith("_pytorch"):
            contenders.refuse_tiled(case)
        contenders.register_from_environment()
        fn = contenders.guarded(ATTENTION[case["impl"]])
    b, n, d = case["batch"], case["seq_len"], case["head_dim"]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[case.get("dtype", "fp32")]
    q, k, v = (torch.randn(b, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, n, d, device=device, dtype=dtype)
    for _ in range(3):  # warm-up (and compilation) of both timed paths
        with torch.no_grad():
            fn(q, k, v, False)
        fn(q, k, v, False).backward(grad)
    sync()
    if case.get("warm_only"):  # `warm`: compiled, nothing timed
        return [{**csv_schema.failure_row("ok", ""), "metric": "compiled"}]
    def timed_forward() -> float:
        with timing.timed(sync) as t, torch.no_grad():
            fn(q, k, v, False)
        return t.seconds

    forward_s, stop = timing.sample_until(timed_forward, stop_rule(case))
    forward = {**stats.summarize("forward_ms", "ms", [t * 1e3 for t in forward_s]),
               "stop": stop, "stop_after": len(forward_s)}

    def no_grad_forward():
        with torch.no_grad():
            fn(q, k, v, False)
    idle, why_not = timing.gpu_idle(no_grad_forward, wall_ms=forward["median"])
    rows = [{**forward, "gpu_idle_pct": idle, "message": why_not}]
    before_backward = []

    inputs = sum(t.numel() * t.element_size() for t in (q, k, v))

    def timed_backward() -> float:
        # held for the backward: what the forward adds, plus Q, K and V, which the backward keeps;
        # not the absolute figure, which counts what ran before in the process (a library's
        # workspace: cuBLAS keeps 64 MiB on an H100 once any case has multiplied matrices)
        base = torch.cuda.memory_allocated() if cuda else 0
        out = fn(q, k, v, False)
        sync()
        if cuda:
            before_backward.append(torch.cuda.memory_allocated() - base + inputs)
        with timing.timed(sync) as t:
            out.backward(grad)
        q.grad = k.grad = v.grad = None
        return t.seconds

    backward_s, stop = timing.sample_until(timed_backward, stop_rule(case))
    backward = {**stats.summarize("backward_ms", "ms", [t * 1e3 for t in backward_s]),
                "stop": stop, "stop_after": len(backward_s)}

    def forward_backward():
        fn(q, k, v, False).backward(grad)
        q.grad = k.grad = v.grad = None
    idle, why_not = timing.gpu_idle(forward_backward, wall_ms=forward["median"] + backward["median"])
    rows.append({**backward, "gpu_idle_pct": idle, "message": why_not})
    element_bytes = ELEMENT_BYTES[case.get("dtype", "fp32")]
    predicted = predicted_saved_bytes(b, n, d, element_bytes)
    rows.append(stats.summarize("predicted_saved_mib", "MiB", [predicted / 2**20]))
    if case.get("peak"):  # the deep grid's: the memory model's peak, and on CUDA the measured one
        rows.append(stats.summarize("predicted_peak_mib", "MiB", [
            predicted_peak_bytes(case["impl"], b, n, d, element_bytes) / 2**20]))
    if cuda and case.get("peak"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        forward_backward()
        torch.cuda.synchronize()
        rows.append(stats.summarize("peak_mib", "MiB", [(torch.cuda.max_memory_allocated() - base + inputs
                                                         + grad.numel() * grad.element_size()) / 2**20]))
    if cuda:
        rows.append(stats.summarize("allocated_before_backward_mib", "MiB",
                                     [x / 2**20 for x in before_backward]))
    return rows

# The most a compiled case warmed in a worker may need by the memory model: the workers share the
# GPU with each other and with other jobs' checks (the standard grid's largest case needs 4.6 GB)
WARM_MAX_BYTES = 8 * 2**30


def warms_in_workers(case: dict) -> bool:
    """Whether a case is compiled in the workers before the timed loop: a compiled case of the
    grid (not N past it: its line may run out of memory first) whose peak by the memory model is
    at most WARM_MAX_BYTES; a larger one compiles in its timed run."""
    return (case["impl"] == "compiled" and not case["past_grid"]
            and predicted_peak_bytes(case["impl"], case["batch"], case["seq_len"], case["head_dim"],
                                     ELEMENT_BYTES[case["dtype"]]) <= WARM_MAX_BYTES)


def warm(case: dict) -> list[dict]:
    """measure() up to its timed passes: the compiles a case's timed loop then loads."""
    return measure({**case, "warm_only": True})


def main(argv=None):
    args = cli.bench_args(__doc__, argv, options=jobs.options, warms=True)
    try:
        rivals = set(contenders.register(args.spec.get("contenders")))
    except contenders.ContenderError as exc:
        raise SystemExit(f"error: {exc}") from None
    # a contender's case in a process of its own, with a time limit: a hang or a crash is a row
    # each contender in processes of its own: our cases never run where a contender's code was imported
    with isolation.Separate(measure, float(args.spec.get("contender_time_limit_s", 600)),
                            key=lambda case: contenders.owner(case["impl"])) as isolated:
        jobs.run(section="attention", study=study(args.spec), cases=cases(args.spec),
                 measure=StopAtOom(lambda case: isolated(case) if case["impl"] in rivals else measure(case)),
                 args=args, fingerprint={"spec": args.spec, **contenders.fingerprint(args.spec.get("contenders"))},
                 warm=warm,
                 compiles=warms_in_workers,
                 prepare=lambda todo, say: isolated.warm([c for c in todo if c["impl"] in rivals], say))

if __name__ == "__main__":
    main()
