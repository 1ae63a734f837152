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
"""
from __future__ import annotations

import functools
import itertools

from lmperf import contenders, csv_schema, stats
from lmperf.bench import cli, isolation, jobs, timing

def predicted_saved_bytes(batch: int, seq_len: int, d: int, element_bytes: int = 4) -> int:
    """What eager attention holds between forward and backward, beyond nothing: q, k, v and the
    output (B x N x d each) and the softmax output P (B x N x N), which softmax's and PV's
    backward both need. The scaled scores are freed: softmax's backward uses its output."""
    return element_bytes * (4 * batch * seq_len * d + batch * seq_len * seq_len)

def cases(spec: dict) -> list[dict]:
    """impl x head dim x N: PyTorch's eager and compiled attention, then the spec's contenders'
    attention providers (lmperf.contenders) on the same grid, (batch, N, D) inputs as the
    assignment passes them."""
    out = []
    impls = list(spec["impls"]) + contenders.provider_names(spec.get("contenders"))
    for impl, d, n in itertools.product(impls, spec["head_dims"], spec["seq_lens"]):
        out.append({"impl": impl, "head_dim": d, "seq_len": n, "batch": spec["batch"],
                    "iters": spec["iters"], "min_iters": min(spec["iters"], spec.get("min_iters", spec["iters"])),
                    "window_s": spec.get("window_s"), "median_within": spec.get("median_within"),
                    "tiled_max_seq_len": spec.get("tiled_max_seq_len", 1024), "case_id": f"{impl}-d{d}-n{n}"})
    return out

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
    q, k, v = (torch.randn(b, n, d, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, n, d, device=device)
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
    predicted = predicted_saved_bytes(b, n, d)
    rows.append(stats.summarize("predicted_saved_mib", "MiB", [predicted / 2**20]))
    if cuda:
        rows.append(stats.summarize("allocated_before_backward_mib", "MiB",
                                     [x / 2**20 for x in before_backward]))
    return rows

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
        jobs.run(section="attention", study="attention", cases=cases(args.spec),
                 measure=lambda case: isolated(case) if case["impl"] in rivals else measure(case),
                 args=args, fingerprint={"spec": args.spec, **contenders.fingerprint(args.spec.get("contenders"))},
                 warm=warm,
                 compiles=lambda case: case["impl"] == "compiled",
                 prepare=lambda todo, say: isolated.warm([c for c in todo if c["impl"] in rivals], say))

if __name__ == "__main__":
    main()
