"""FlashAttention-2: correctness against float64 (`check`) and speed against PyTorch's attention
(`bench`).

    python -m lmperf.bench.flash_attention check --spec '{...}' --out .../check.csv --hw cpu [--workers 6]
    python -m lmperf.bench.flash_attention bench --spec '{...}' --out .../bench_d64.csv --hw h100-80gb-hbm3

With `--workers N` the check's cases run in N worker processes, and a bench job first compiles
its compiling cases in N worker processes, then times every case in its own (bench/jobs.py).

The forward and forward+backward rows of a bench case carry `gpu_idle_pct`, the share of the
call's median time the GPU sat idle (bench/timing.py's gpu_idle): high where do_bench times the
host. The backward alone, the derived rows and the CUDA-graph rows (no host in them) have none.
Calls are timed as do_bench times them and CUDA graphs replayed until the median is known (a
group's `median_within`; bench/timing.py's bench_calls and bench_graph), each row saying why it
stopped (`stop`) and after how many samples (`stop_after`); the leaderboard's harness times with
do_bench itself.
"""
from __future__ import annotations

import itertools
import random
import time

from lmperf import contenders, csv_schema, dtypes, failures, providers, stats
from lmperf.bench import cli, honest, isolation, jobs, timing

# ---------------------------------------------------------------------------------------------
# check


def check_cases(spec: dict) -> list[dict]:
    """impl x dtype x causal x shape, each impl a provider of the attention contract
    (lmperf.providers); one that runs under the leaderboard's harness (triton_compiled: ours
    under torch.compile, fullgraph) on `compiled_shapes` (each shape compiles anew, seconds a
    case); every impl also on `grouped_shapes` [B, H, H_kv, N, D] (grouped-query attention: k and
    v with H_kv heads)."""
    providers.load(spec.get("provider_modules", []))
    cases = []
    for impl, dtype, causal in itertools.product(spec["impls"], spec["dtypes"], spec["causal"]):
        compiled = providers.get(impl).harness == "leaderboard"
        shapes = spec.get("compiled_shapes", spec["shapes"]) if compiled else spec["shapes"]
        for shape in shapes:
            cases.append(_check_case(impl, dtype, causal, shape))
        for b, h, h_kv, n, d in spec.get("grouped_shapes", []):
            if h % h_kv:
                raise ValueError(f"flash_attention check grouped_shapes: H_kv={h_kv} does not divide H={h}")
            cases.append(_check_case(impl, dtype, causal, (b, h, n, d), h_kv))
    return cases


def _check_case(impl, dtype, causal, shape, kv_heads=None) -> dict:
    case = {"impl": impl, "dtype": dtype, "causal": causal, "shape": "x".join(map(str, shape))}
    case["case_id"] = f"{impl}-{dtype}-{'causal' if causal else 'full'}-{case['shape']}"
    if kv_heads is not None:  # q's shape; k and v with kv_heads heads
        case["kv_heads"] = kv_heads
        case["case_id"] += f"-kv{kv_heads}"
    return case


def attention_case(case: dict) -> dict:
    """A check case as the attention contract's providers read it (lmperf.providers): heads,
    K/V heads, N and D from its shape (..., [H,] N, D)."""
    shape = [int(x) for x in case["shape"].split("x")]
    heads = shape[-3] if len(shape) >= 3 else 1
    return {**case, "provider": case["impl"], "heads": heads, "kv_heads": case.get("kv_heads", heads),
            "seq_len": shape[-2], "head_dim": shape[-1]}


def measure_check(case: dict) -> list[dict]:
    import torch
    from lmperf.kernels.attention_contract import compare

    cuda = torch.cuda.is_available()
    provider = providers.get(case["impl"])
    fn, context = provider.make(attention_case(case))
    if provider.harness == "leaderboard":  # Inductor on a GPU; on the CPU the same trace, kernels interpreted
        import torch._dynamo
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True, backend="inductor" if cuda else "aot_eager")

    def impl(q, k, v, causal):  # the case's causal is the provider's
        with context():
            return fn(q, k, v)
    seed = random.randrange(2**31)  # fresh inputs every run; the seed is kept to reproduce them
    gen = torch.Generator(device="cuda" if cuda else "cpu").manual_seed(seed)
    shape = tuple(int(x) for x in case["shape"].split("x"))
    kv_shape = (*shape[:-3], case["kv_heads"], *shape[-2:]) if case.get("kv_heads") else shape
    q, k, v = (torch.randn(s, generator=gen, device=gen.device, dtype=dtypes.torch_dtype(case["dtype"]))
               for s in (shape, kv_shape, kv_shape))
    rows = []
    for r in compare(impl, q, k, v, case["causal"]):
        row = stats.summarize(f"{r['quantity']}_max_abs_err", "abs", [r["max_abs_err"]])
        row.update(torch_err=r["torch_err"], tolerance=r["tolerance"], passed=r["passed"], seed=seed)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# bench

# How a case is timed (providers.HARNESSES). "eager": the provider as it is, forward+backward =
# fn(q, k, v).backward(dO). "leaderboard" (the CS336 leaderboard's harness): torch.compile around
# the provider, forward+backward = fn(q, k, v).sum().backward(). A provider with a harness of its
# own (triton_compiled: ours under the leaderboard's) runs under it whatever the group's.


def attention_flops(b: int, h: int, n: int, d: int, causal: bool, direction: str) -> float:
    """4*B*H*N^2*D for the forward, halved when causal; backward 2.5x, forward+backward 3.5x."""
    forward = 4 * b * h * n * n * d / (2 if causal else 1)
    return forward * {"forward": 1.0, "backward": 2.5, "fwd_bwd": 3.5}[direction]


def _shapes(group: dict):
    """(heads, head_dim, model) triples: the product of `heads` and `head_dims`, or the group's
    `models` (each model size's heads and d_model / heads)."""
    if "models" in group:
        return [(m["n_heads"], m["d_model"] // m["n_heads"], name) for name, m in group["models"].items()]
    heads = group["heads"] if isinstance(group["heads"], list) else [group["heads"]]
    return [(h, d, None) for h in heads for d in group["head_dims"]]


def _kv_heads(group: dict, heads: int) -> int:
    """The group's K/V heads (grouped-query attention), or `heads`; ValueError if they do not
    divide."""
    kv = group.get("kv_heads", heads)
    if heads % kv:
        raise ValueError(f"flash_attention group {group['name']!r}: kv_heads={kv} does not divide heads={heads}")
    return kv


def bench_cases(spec: dict) -> list[dict]:
    """group x provider x dtype x causal x N x shape; each provider one of the attention
    contract's (lmperf.providers), under its own harness or the group's; the spec's contenders
    (lmperf.contenders) in every group, beside the group's providers."""
    providers.load(spec.get("provider_modules", []))
    rivals = contenders.register(spec.get("contenders"))
    cases = []
    for group in spec["groups"]:
        for provider, dtype, causal, n, (heads, d, model) in itertools.product(
                group["providers"] + rivals, group["dtypes"], group["causal"], group["seq_lens"], _shapes(group)):
            harness = providers.get(provider).harness or group.get("harness", "eager")
            gpu_time = group.get("gpu_time", False)
            kv = _kv_heads(group, heads)
            case = {"group": group["name"], "provider": provider, "harness": harness, "dtype": dtype,
                    "causal": causal, "batch": group["batch"], "heads": heads, "kv_heads": kv, "seq_len": n,
                    "head_dim": d, "model": model or "",
                    "timing_ms": "/".join(map(str, group["timing_ms"])), "median_within": group.get("median_within"),
                    "tiled_max_seq_len": group["tiled_max_seq_len"],
                    "gpu_time": gpu_time is True or provider in (gpu_time or ())}
            if providers.get(provider).role == "contender":
                case["call_budget_s"] = float(spec.get("contender_call_budget_s", 0.5))
            skip = [s["reason"] for s in group.get("skip", [])
                    if (s["provider"], s["dtype"]) == (provider, dtype)]
            if skip:
                case["skip_reason"] = skip[0]
            case["case_id"] = providers.attention_case_id(case)
            cases.append(case)
    return cases


def _compile_caches(case: dict) -> None:
    """Inductor's caches off for a provider whose compiled graphs the cache cannot tell apart
    (`cache_compiled` False: SDPA's backends) under the leaderboard harness, on for every other
    case (set per case: one process runs several providers). Inductor's graph cache does not key
    on the SDPA backend (pytorch/pytorch#185449): with it, sdpa_cudnn ran the graph compiled for
    sdpa_flash (the same times at every shape of the model group;
    tuning/flash_attention/NOTES.md v5), so those graphs are compiled anew every time (about a
    second: SDPA and a sum). Every other compiled graph (ours under torch.compile, FlexAttention,
    plain_compiled) keys on what it runs, so a cached one is the same code compiled earlier: the
    compile-cache warm-up (bench/workers.py) leaves it there for the timed loop to load."""
    import torch._inductor.config
    uncached = not providers.get(case["provider"]).cache_compiled
    torch._inductor.config.force_disable_caches = uncached and case.get("harness", "eager") == "leaderboard"


def provider_fn(case: dict):
    """(fn(q, k, v), context) for the case's provider (lmperf.providers): each timed call runs
    inside `context()` (SDPA's backend choice; a no-op otherwise). Raises Unsupported / NotRun,
    the provider's needs checked first."""
    return providers.get(case["provider"]).make(case)


def setup_bench(case: dict):
    """(fn, context, fwd_bwd, (q, k, v, dout)) of a bench case: the provider's call (under the
    leaderboard harness, torch.compile'd), the context each timed call runs in, forward+backward
    as the case's harness runs it, and the inputs (the same every run). Raises NotRun."""
    import torch

    if case.get("skip_reason"):  # left out by the config: a row that says why
        raise failures.NotRun(case["skip_reason"])
    if not torch.cuda.is_available():
        raise failures.NotRun("needs CUDA")
    fn, context = provider_fn(case)
    _compile_caches(case)
    leaderboard = case.get("harness", "eager") == "leaderboard"
    if leaderboard:
        import torch._dynamo
        providers.no_donated_buffers()
        torch._dynamo.reset()  # each case compiles its own graph; no recompile limit across cases
        fn = torch.compile(fn, fullgraph=True, dynamic=False)
    b, h, n, d = case["batch"], case["heads"], case["seq_len"], case["head_dim"]
    dtype = dtypes.torch_dtype(case["dtype"])
    # a generator of the case's own: a CUDA-graph capture that fails leaves the default one unusable
    gen = torch.Generator(device="cuda").manual_seed(0)
    h_kv = case.get("kv_heads", h)
    q, k, v = (torch.randn(b, heads, n, d, device="cuda", dtype=dtype, generator=gen).requires_grad_()
               for heads in (h, h_kv, h_kv))
    dout = torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=gen)

    def fwd_bwd():
        if leaderboard:
            fn(q, k, v).sum().backward()
        else:
            fn(q, k, v).backward(dout)
    return fn, context, fwd_bwd, (q, k, v, dout)


# In a contender's process (bench/isolation.py keeps one a contender): its settings (provider,
# group, dtype, causal, head dim, batch, heads) -> (N, seconds) of the first N whose one warm
# forward+backward call took longer than the case's `call_budget_s`
OVER_BUDGET: dict[tuple, tuple[int, float]] = {}


def _budget_key(case: dict) -> tuple:
    return (case["provider"], case["group"], case["dtype"], case["causal"], case["head_dim"], case["batch"],
            case["heads"], case.get("kv_heads"), case.get("harness"))


def within_budget(case: dict, fwd_bwd, context) -> None:
    """NotRun for a contender's case that would take minutes to time: one warm forward+backward
    call (a second call when the first, which may compile, is over) longer than its
    `call_budget_s`, or a smaller N at the same settings found so before (its calls grow with N).
    A case without a budget (ours, the peers') passes."""
    import torch
    budget = case.get("call_budget_s")
    if budget is None:
        return
    key = _budget_key(case)
    if key in OVER_BUDGET and case["seq_len"] >= OVER_BUDGET[key][0]:
        n, took = OVER_BUDGET[key]
        raise failures.NotRun(f"not timed: one forward+backward call took {took:.1f} s at N = {n}, over the "
                            f"budget of {budget:g} s a call (config contender_call_budget_s)")
    for _ in range(2):
        t0 = time.perf_counter()
        with context():
            fwd_bwd()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        if took <= budget:
            return
    OVER_BUDGET[key] = (case["seq_len"], took)
    raise failures.NotRun(f"not timed: one forward+backward call takes {took:.1f} s, over the budget of "
                        f"{budget:g} s a call (config contender_call_budget_s); larger N are not timed either")


def compiles(case: dict) -> bool:
    """Whether a bench case compiles what the compile-cache warm-up can leave for its timed run:
    a provider that compiles (lmperf.providers), or any under the leaderboard harness, but none
    whose compiled graphs the cache cannot tell apart (SDPA: compiled anew each case)."""
    if case.get("skip_reason"):
        return False
    p = providers.get(case["provider"])
    return p.cache_compiled and (p.compiles or case.get("harness") == "leaderboard")


def warm_bench(case: dict) -> list[dict]:
    """Compile what measure_bench compiles for `case` and time nothing: its forward without
    gradients and its forward+backward, once each (the warm-up of bench/workers.py). The backward
    alone and the CUDA-graph replays call the same compiled code."""
    import torch

    fn, context, fwd_bwd, (q, k, v, _) = setup_bench(case)
    with torch.no_grad(), context():
        fn(q, k, v)
    with context():
        fwd_bwd()
    torch.cuda.synchronize()
    within_budget(case, fwd_bwd, context)
    return [{**csv_schema.failure_row("ok", ""), "metric": "compiled"}]


def measure_bench(case: dict) -> list[dict]:
    import torch

    fn, context, fwd_bwd, (q, k, v, dout) = setup_bench(case)
    within_budget(case, fwd_bwd, context)
    leaderboard = case.get("harness", "eager") == "leaderboard"
    b, h, n, d = case["batch"], case["heads"], case["seq_len"], case["head_dim"]
    dtype = dtypes.torch_dtype(case["dtype"])
    h_kv = case.get("kv_heads", h)
    warmup, rep = (int(x) for x in case["timing_ms"].split("/"))

    # the leaderboard's harness times with do_bench itself; the others stop once the median is known
    within = None if leaderboard else case.get("median_within")

    def bench(f, idle_of: str = "", grad_to_none=()):  # Quantiles: (median, q20, q80) in ms
        def run():
            with context():
                f()
        t = timing.bench_calls(run, warmup_ms=warmup, rep_ms=rep, median_within=within, grad_to_none=grad_to_none)
        median = t.median

        def again():  # gradients cleared before each call, as do_bench does
            for x in grad_to_none:
                x.grad = None
            run()
        if idle_of:  # the GPU's idle share of the median call
            idle[idle_of] = timing.gpu_idle(again, wall_ms=median)
        return t

    idle = {}  # direction -> (GPU idle %, why it was not measured)
    with torch.no_grad():
        times = {"forward": bench(lambda: fn(q, k, v), "forward")}

    times["fwd_bwd"] = bench(fwd_bwd, "fwd_bwd", grad_to_none=[q, k, v])
    note = ""
    try:  # backward alone, replaying one retained graph
        if leaderboard:
            raise RuntimeError("modified by an inplace operation")  # compiled: not replayable
        with context():
            out = fn(q, k, v)
        times["backward"] = bench(lambda: out.backward(dout, retain_graph=True), grad_to_none=[q, k, v])
    except RuntimeError as exc:  # compiled graphs may reuse saved buffers in place
        if "modified by an inplace operation" not in str(exc):
            raise
        # quantiles do not subtract: the median only
        times["backward"] = timing.Quantiles(times["fwd_bwd"][0] - times["forward"][0], float("nan"), float("nan"))
        note = "backward = (forward+backward) - forward: this graph cannot be replayed with retain_graph"
    # free the retained graph first: it keeps the leaves' AccumulateGrad nodes (and the stream they
    # were made on, the default one) alive, and a backward captured while they live fails
    out = None
    gpu_rows = []
    if case.get("gpu_time"):  # the same calls replayed as CUDA graphs: the GPU's time alone
        gpu_rows = _gpu_time_rows(case, fn, fwd_bwd, context, q, k, v, rep, case.get("median_within"))
    describe = providers.get(case["provider"]).config  # e.g. the rule table's choice, for the notes
    config = describe(case) if describe else ""
    which = providers.get(case["provider"]).kernel  # the kernels that ran (Gluon or tile-language)
    kernel = which(q, k, v, case["causal"]) if which else ""
    rows = []
    for direction in ("forward", "backward", "fwd_bwd"):
        ms, q20, q80 = times[direction]
        gpu_idle_pct, why_not = idle.get(direction, (float("nan"), ""))
        row = stats.summarize_quantiles(f"{direction}_ms", "ms", ms, q20, q80)
        row["message"] = note if direction == "backward" else why_not
        flops = attention_flops(b, h, n, d, case["causal"], direction)
        tflops = lambda t: flops / (t * 1e-3) / 1e12  # the 20% quantile of TFLOP/s is the 80% of time
        rows += [{**r, "gpu_idle_pct": gpu_idle_pct, **times[direction].fields()} for r in (
            row, stats.summarize_quantiles(f"{direction}_tflops", "TFLOP/s", tflops(ms), tflops(q80), tflops(q20)))]
    rows += gpu_rows
    if providers.get(case["provider"]).role == "contender":  # its times and timed outputs checked afterwards
        _check_possible(case, times, fn, fwd_bwd, context, q, k, v)
        with context():
            why = honest.stale_output(lambda q, k, v, causal: fn(q, k, v), q.detach(), k.detach(), v.detach(),
                                          case["causal"])
        if why:  # a result cached for the same storage is no time: a `wrong` row instead
            raise contenders.Wrong(why)
    for row in rows:
        row["config"] = config
        row["kernel"] = kernel
    return rows


def _check_possible(case: dict, times: dict, fn, fwd_bwd, context, q, k, v) -> None:
    """Wrong for a contender's time that cannot be its work's (bench/honest.py): under the roofline
    floor of its FLOPs and the bytes of Q, K, V and O, or not confirmed by a whole-device
    synchronisation (work left running on another CUDA stream)."""
    import torch
    b, h, n, d = case["batch"], case["heads"], case["seq_len"], case["head_dim"]
    io_bytes = sum(t.numel() * t.element_size() for t in (q, k, v, q))  # Q, K, V read, O written
    gpu = torch.cuda.get_device_name()

    def forward():
        with context(), torch.no_grad():
            fn(q, k, v)

    def forward_backward():
        with context():
            fwd_bwd()
    for direction, call in (("forward", forward), ("fwd_bwd", forward_backward)):
        ms = times[direction][0]
        why = (honest.impossible_time(ms, attention_flops(b, h, n, d, case["causal"], direction), io_bytes, gpu)
               or honest.outside_stream(call, ms))
        if why:
            raise contenders.Wrong(f"{direction}: {why}")


def _gpu_time_rows(case: dict, fn, fwd_bwd, context, q, k, v, rep: int, within: float | None) -> list[dict]:
    """forward and forward+backward replayed as CUDA graphs (`*_gpu_ms`, `*_gpu_tflops`; replays
    until the median is known to `within`: timing.bench_graph), and backward as their difference
    (median only: quantiles do not subtract). A capture that fails is a row; the host-timed rows
    stand."""
    import torch
    b, h, n, d = case["batch"], case["heads"], case["seq_len"], case["head_dim"]

    def forward():
        with context(), torch.no_grad():
            fn(q, k, v)

    def graphed():
        with context():
            fwd_bwd()
    rows, ms = [], {}
    for direction, f in (("forward", forward), ("fwd_bwd", graphed)):
        try:
            timed = timing.bench_graph(f, rep_ms=rep, median_within=within, grad_to_none=[q, k, v])
            t, q20, q80 = timed
        except Exception as exc:
            status, message = failures.classify_failure(exc)
            rows.append({**csv_schema.failure_row(status, "CUDA graph: " + message), "metric": f"{direction}_gpu_ms",
                         "unit": "ms"})
            continue
        ms[direction] = t
        flops = attention_flops(b, h, n, d, case["causal"], direction)
        rows.append({**stats.summarize_quantiles(f"{direction}_gpu_ms", "ms", t, q20, q80), **timed.fields()})
        rows.append({**stats.summarize_quantiles(f"{direction}_gpu_tflops", "TFLOP/s", flops / (t * 1e-3) / 1e12,
                                                  flops / (q80 * 1e-3) / 1e12, flops / (q20 * 1e-3) / 1e12),
                     **timed.fields()})
    if len(ms) == 2:
        t = ms["fwd_bwd"] - ms["forward"]
        row = stats.summarize_quantiles("backward_gpu_ms", "ms", t, float("nan"), float("nan"))
        row["message"] = "backward = (forward+backward) - forward, both CUDA graphs"
        rows.append(row)
    return rows


def measure_or_warm(case: dict) -> list[dict]:
    """A contender's process (bench/isolation.py): `warm_bench` for a case marked `warm_only`
    (Isolated.warm: its compiles before the timed loop), else `measure_bench`."""
    return warm_bench(case) if case.get("warm_only") else measure_bench(case)


STUDIES = {"check": (check_cases, measure_check), "bench": (bench_cases, measure_bench)}


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning)."""
    return STUDIES[study][0](spec)


def main(argv=None):
    args = cli.bench_args(__doc__, argv, studies=STUDIES, options=jobs.options, warms=True)
    measure = STUDIES[args.study][1]
    try:
        cases = job_cases(args.study, args.spec)  # loads the spec's provider_modules and contenders first
    except contenders.ContenderError as exc:
        raise SystemExit(f"error: {exc}") from None
    providers.share()  # and the workers load them too
    # a resume never mixes rows of two versions of a provider module's file
    fingerprint = {"spec": args.spec, **({"provider_sources": providers.digest()} if providers.sources() else {}),
                   **contenders.fingerprint(args.spec.get("contenders"))}
    if args.study == "check":  # our providers' cases (a contender's: bench/contenders.py), side by side in
        # the workers, which run a module-level function
        jobs.run(section="flash_attention", study=args.study, cases=cases, measure=measure, args=args,
                 fingerprint=fingerprint, parallel=True)
        return
    # a contender's case in a process of its own, with a time limit: a hang or a crash is a row
    limit = float(args.spec.get("contender_time_limit_s", 600))
    contender = lambda case: not case.get("skip_reason") and providers.get(case["provider"]).role == "contender"
    # each contender in processes of its own: our cases never run where a contender's code was imported
    with isolation.Separate(measure_or_warm, limit, key=lambda case: contenders.owner(case["provider"])) as isolated:
        def run(case: dict) -> list[dict]:
            return isolated(case) if contender(case) else measure(case)
        # a timing job's compiles are warmed in the workers first
        jobs.run(section="flash_attention", study=args.study, cases=cases, measure=run, args=args,
                 fingerprint=fingerprint, parallel=False, warm=warm_bench,
                 compiles=lambda case: compiles(case) and not contender(case),
                 prepare=lambda todo, say: isolated.warm([c for c in todo if contender(c)], say))


if __name__ == "__main__":
    main()
