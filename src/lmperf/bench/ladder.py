"""The ladder: from the assignment's setting to the GPU's limit, one change a rung, every rung of
one model size measured in the same job.

    python -m lmperf.bench.ladder --size xl --spec '{...}' --out results/cpu/ladder/xl.csv --hw cpu
    python -m lmperf.bench.ladder --size xl --spec '{...}' --cases 'xl-rung12-*' --out .../run1.csv --hw ...

A rung carries every setting of the rungs before it, so it can run alone (`--cases`, bench/jobs.py:
the repeats in fresh processes), the device rates of its floors then measured for it.

Each rung is the rung before plus one change (RUNGS, then the fused-kernel rungs the spec's
`fused` lists and the float8 peers its `float8` lists, then one rung per longer context, gradient
accumulation after the context `accumulate.context` if configured, then activation
checkpointing; the FP8 rung of our stack, `float8_ours`, right after the rung at its context:
bench/float8.py). A peer (PEERS: another library's kernels in place of ours, torchao's float8
training) is measured on the last carried rung's settings and carried nowhere; nor is float8, nor
a contender's attention (lmperf.contenders; measured in a process of its own: a crash is its row).
A rung that needs CUDA is a `skipped` row where there is none, its change not carried up. Every
rung is timed like the end-to-end studies (bench/e2e.py's time_steps: warm-up, then timed steps of
lmperf.train.step per phase until the stop rule stops them; every row of a rung says why, `stop`,
and after how many, `stop_after`), and adds:

- the FLOPs of one step counted by `torch.utils.flop_counter.FlopCounterMode` (the same step on
  fake tensors of the rung's device: no memory, no time), beside the closed form MFU uses
  (lmperf.flops);
- from one profiled step (bench/profile.py's profile_step): which attention kernel ran (its op
  and kernel names) and, on a GPU, its kernel time: all kernels, matrix multiplies, attention
  (against the timed step: what a rung is bound by), and `gpu_idle_pct`, the share of the
  median timed step in which the GPU sat idle (as bench/timing.py's gpu_idle, without profiling
  more steps);
- floors: the optimizer phase against params x 28 bytes / the copy bandwidth, the forward and
  backward against the bf16 matmul rate, both rates measured in this job (the `floors` case).

With `--workers N` (the config's `workers`), the rungs whose compiled blocks are known before they
run are first compiled in N worker processes on the model cut to two blocks (`warm`, bench/workers.py):
their first steps then load the graphs and kernels from the compile caches.

The checkpointing rung chooses how many blocks to checkpoint by measured peak memory
(bench/memory_fit.py): every k-th block for k in the configured order (fewest checkpointed blocks
first), one step each, the first whose peak fits under `memory_budget` x the device's memory. The
same way, the accumulation rung and the longer contexts after it (not the checkpointing rung, which
keeps the configured micro-batch) split their global batch into micro-batches of the largest of
`accumulate.micro_batch_sizes` that fits: the gradients, kept across micro-batches, need memory
that the step without accumulation frees before its next forward. With `accumulate.expandable_segments`,
a rung before the accumulation rung switches the CUDA caching allocator to expandable segments
(less fragmentation for a step near the device's memory).
"""
from __future__ import annotations

import threading
import time

from lmperf import contenders, csv_schema, failures, stats, train
from lmperf.bench import cli, e2e, float8, flop_count, isolation, jobs, memory_fit, profile, timing

# The rungs before the longer contexts, in order: (rung, what changes, the case keys it sets,
# whether it needs CUDA). The base is the assignment's model and optimizer in fp32, eager.
BASE = {"dtype": "fp32", "tf32": False, "compile": False, "optimizer": "foreach",
        "attention": "plain", "checkpoint_every": 0, "micro_batches": 1, "expandable_segments": False,
        "fused": "none", "float8": "none"}
RUNGS = [
    ("fp32_eager", "fp32, eager, AdamW default (foreach), plain attention", {}, False),
    ("tf32", "TF32 matmuls: set_float32_matmul_precision('high')", {"tf32": True}, True),
    ("bf16", "bf16 autocast", {"dtype": "bf16"}, False),
    ("compiled", "torch.compile, regional (= the assignment's setting, bf16 compiled)", {"compile": True}, False),
    ("fused_adamw", "AdamW(fused=True)", {"optimizer": "fused"}, False),
    ("sdpa", "attention: SDPA", {"attention": "sdpa"}, False),
    ("flash-triton", "attention: our FlashAttention-2 (Triton, bf16)", {"attention": "flash-triton"}, True),
    ("bf16_weights", "AdamW on fp32 master weights writing bf16 Linear weights: no autocast casts "
     "(the same math; kernels/adamw_master.py)", {"optimizer": "master"}, True),
]
# After bf16_weights: our fused kernels (kernels/fused.py), one a rung in this order, for those the
# spec's `fused` lists, each carried up like every rung (the case's `fused`: the kernels so far,
# '+'-joined); then peers, measured on the last carried rung's settings and carried nowhere:
# Liger-Kernel's kernels in place of ours (`fused` lists liger) and torchao's float8 training in
# each recipe the spec's `float8` lists. A peer whose package is missing is a `skipped` row.
PEER = "peer (on the last carried rung's settings; not carried up): "
FUSED_RUNGS = {
    "rmsnorm": "our fused RMSNorm: each residual add fused into the RMSNorm after it, across blocks "
               "(Triton, the same math; kernels/rmsnorm.py)",
    "swiglu": "our fused SwiGLU product silu(a) * b (kernels/swiglu.py)",
    "rope": "our RoPE on q and k in one launch, in the projections' layout (kernels/rope.py)",
}
LIGER = PEER + ("Liger-Kernel's fused add-RMSNorm, RMSNorm and SiLU-mul in place of ours (RoPE the model's: "
                "Liger's rotates halves; its norms outside the compiled graph, which Dynamo traces wrongly)")
FLOAT8_RECIPES = float8.RECIPES
PEERS = {"liger", *(f"float8_{r}" for r in FLOAT8_RECIPES)}
ASSIGNMENT_RUNG = "compiled"  # the assignment's setting: batch x context as given, bf16 compiled
# AdamW's bytes a parameter: fp32 param, grad, exp_avg, exp_avg_sq read, param, exp_avg, exp_avg_sq
# written; MasterWeightAdamW's nn.Linear weights: bf16 weight + int16 remainder (the fp32 master),
# bf16 gradient and both moments read, all but the gradient written
ADAMW_BYTES_PER_PARAM = 28
MASTER_BYTES_PER_LINEAR_WEIGHT = 26


def cases(spec: dict, size: str, cuda: bool) -> list[dict]:
    """The floors case, then the rungs of one model size, each the one before plus its change.
    Without CUDA a rung that needs it is kept (it becomes a `skipped` row) but changes nothing
    for the rungs after it."""
    settings = {**BASE, "context": spec["context"], "batch_size": spec["batch_size"]}
    common_keys = {"size": size, "mode": "train", "warmup": spec["warmup"], **e2e.timing_keys(spec),
                   "checkpoint_candidates": "", "micro_batch_candidates": "",
                   **spec.get("models", {}).get(size, {})}  # the model's dims: what `warm` builds
    out = [{**common_keys, **settings, "rung": 0, "name": "floors",
            "change": "device rates: copy bandwidth, bf16 matmul", "needs_cuda": True}]
    steps = list(RUNGS)
    listed = spec.get("fused", [])
    unknown = [k for k in listed if k not in [*FUSED_RUNGS, "liger"]]
    if unknown:
        raise ValueError(f"ladder fused {unknown}: choose from {[*FUSED_RUNGS, 'liger']}")
    ours = [k for k in FUSED_RUNGS if k in listed]
    steps += [(f"fused_{k}", FUSED_RUNGS[k], {"fused": "+".join(ours[:i + 1])}, True) for i, k in enumerate(ours)]
    steps += [("liger", LIGER, {"fused": "liger"}, True)] if "liger" in listed else []
    steps += [(f"float8_{r}", f"{PEER}torchao float8 training, {r} scaling: every nn.Linear but the LM head "
               f"multiplies in fp8", {"float8": r}, True) for r in FLOAT8_RECIPES if r in spec.get("float8", [])]
    rivals = contenders.ladder_rungs(spec.get("contenders"))  # a user's attention in place of ours
    steps += rivals
    accumulate = spec.get("accumulate")

    sizes = []  # the micro-batch sizes the accumulating rungs choose from, largest first

    def accumulate_after(c: int) -> None:  # the accumulation rung, after the rung at context c
        if accumulate and accumulate["context"] == c:
            k, b = accumulate["micro_batches"], spec["batch_size"]
            sizes.extend(accumulate.get("micro_batch_sizes", [b]))
            if any(s < 1 or k * b % s for s in sizes):
                raise ValueError(f"ladder accumulate.micro_batch_sizes {sizes}: each must divide the global "
                                 f"batch {k} x {b} = {k * b}")
            if accumulate.get("expandable_segments"):  # its own rung first: the allocator alone
                steps.append(("expandable_segments", "CUDA caching allocator: expandable segments "
                              "(less fragmentation; the same math)", {"expandable_segments": True}, True))
            how = (f"{k} micro-batches of {b}" if sizes == [b] else
                   f"in micro-batches of the largest of {', '.join(map(str, sizes))} sequences whose measured "
                   f"peak memory fits")
            steps.append((f"accumulate{k}", f"gradient accumulation: global batch {k * b} x {c:,} a step, {how} "
                          f"(the optimizer's time spread over {k}x the tokens; not the model's math)",
                          {"micro_batches": k}, False))
    steps += float8.ours_rung(spec, spec["context"])  # the FP8 rung of our stack, after the rung at its context
    accumulate_after(spec["context"])
    for c in spec["contexts"]:
        steps.append((f"ctx{c}", f"context {c:,} (same batch)", {"context": c}, False))
        steps += float8.ours_rung(spec, c)
        accumulate_after(c)
    ck = spec["checkpoint"]
    steps.append(("checkpoint", f"activation checkpointing at context {ck['context']:,}: every k-th "
                  f"block, k by measured peak memory", {"context": ck["context"]}, False))
    for i, (name, change, sets, needs_cuda) in enumerate(steps, start=1):
        case = {**common_keys, **settings, **sets, "rung": i, "name": name, "change": change,
                "needs_cuda": needs_cuda}
        if name == "checkpoint":
            case["checkpoint_candidates"] = ",".join(map(str, ck["every"]))
        elif case["micro_batches"] > 1 and sizes:  # accumulating (the rung and the longer contexts after it)
            case["micro_batch_candidates"] = ",".join(map(str, sizes))
        out.append(case)
        if (cuda or not needs_cuda) and name not in PEERS and name not in {r[0] for r in rivals} \
                and "float8" not in sets:
            settings.update(sets)
    for case in out:
        case["case_id"] = f"{size}-rung{case['rung']:02d}-{case['name']}"
    return out


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (`arg`: the model
    size); the rungs' ids are the same with and without CUDA."""
    return cases(spec, arg, cuda=False)


# ---------------------------------------------------------------------------------------------
# Measurements


def floors_rows(spec: dict) -> list[dict]:
    rates = timing.device_rates(spec["floors"]["gemm_size"], spec["floors"]["copy_mib"])
    return [stats.summarize_quantiles("copy_ms", "ms", *rates["copy_ms"]),
            stats.summarize("copy_gb_per_s", "GB/s", [rates["copy_bytes_per_s"] / 1e9]),
            stats.summarize_quantiles("bf16_matmul_ms", "ms", *rates["gemm_ms"]),
            stats.summarize("bf16_matmul_tflops", "TFLOP/s", [rates["matmul_flops_per_s"] / 1e12])]


def phase_floors(cfg, case: dict, spec: dict) -> list[dict]:
    """Each phase's floor at this job's measured rates: the optimizer moves its bytes once
    (optimizer_bytes); forward and backward (2x forward) run their closed-form FLOPs at the bf16
    matmul rate (recomputation by checkpointing not included: it is not the model's work)."""
    from lmperf.flops import flops_per_token

    rates = timing.device_rates(spec["floors"]["gemm_size"], spec["floors"]["copy_mib"])
    tokens = case["batch_size"] * case["context"] * case.get("micro_batches", 1)
    forward = flops_per_token(cfg, case["context"], "forward") * tokens
    floor = lambda work, rate: [1e3 * work / rate]
    return [stats.summarize("optimizer_floor_ms", "ms",
                             floor(optimizer_bytes(cfg, case["optimizer"]), rates["copy_bytes_per_s"])),
            stats.summarize("forward_floor_ms", "ms", floor(forward, rates["matmul_flops_per_s"])),
            stats.summarize("backward_floor_ms", "ms", floor(2 * forward, rates["matmul_flops_per_s"]))]


def optimizer_bytes(cfg, optimizer: str) -> int:
    """Bytes one AdamW step must read and write: 28 a parameter; with 'master'
    (MasterWeightAdamW) 26 for each nn.Linear weight and 28 for the rest."""
    import torch
    from lmperf.kernels.adamw_master import linear_weights
    from lmperf.model import TransformerLM, count_parameters

    total = count_parameters(cfg)
    if optimizer != "master":
        return total * ADAMW_BYTES_PER_PARAM
    with torch.device("meta"):
        linear = sum(w.numel() for w in linear_weights(TransformerLM(cfg)))
    return linear * MASTER_BYTES_PER_LINEAR_WEIGHT + (total - linear) * ADAMW_BYTES_PER_PARAM


def flop_rows(cfg, case: dict, dims: dict, device: str) -> list[dict]:
    """Counted and closed-form FLOPs of one micro-batch's forward and backward (the whole step
    when micro_batches is 1): the check of the closed form that MFU uses."""
    from lmperf.flops import closed_form_attention, flops_per_token

    tokens = case["batch_size"] * case["context"]
    try:  # a check beside the timing: if counting fails, the rung's timings still stand
        counted = flop_count.count_step(case, dims, device)
        note = ""
    except Exception as exc:  # noqa: BLE001
        counted, note = {"total": float("nan"), "attention": float("nan")}, "count failed: " + failures.classify_failure(exc)[1]
    rows = [stats.summarize("counted_flops", "FLOP", [counted["total"]]),
            stats.summarize("counted_attention_flops", "FLOP", [counted["attention"]]),
            stats.summarize("closed_form_flops", "FLOP", [flops_per_token(cfg, case["context"], "train") * tokens]),
            stats.summarize("closed_form_attention_flops", "FLOP",
                             [closed_form_attention(cfg, case["context"], "train") * tokens])]
    return [{**r, "message": note} for r in rows]


def model_changes(case: dict):
    """fn(model): what the case's rung does to the model it builds, in place: our fused kernels or
    Liger's (kernels/fused.apply, before the compiled blocks' first call), then torchao's float8
    training. NotRun, before any model is built, where a package it needs is missing."""
    fused_kernels, recipe = case.get("fused", "none"), case.get("float8", "none")
    patch = None
    if fused_kernels != "none":  # (impl, parts) of kernels/fused.apply
        from lmperf.kernels import fused
        patch = ("liger", fused.PARTS) if fused_kernels == "liger" else ("ours", fused_kernels.split("+"))
        try:
            fused.kernels(*patch)
        except fused.MissingPackage as exc:
            raise failures.NotRun(str(exc)) from None
    convert = float8.training(recipe) if recipe != "none" else None

    def change(model) -> None:
        if patch is not None:
            fused.apply(model, *patch)
        if convert is not None:
            convert(model)
    return change


def measure(case: dict, dims: dict, spec: dict) -> list[dict]:
    import torch
    contenders.register_from_environment()  # a contender's attention, by its provider name

    cuda = torch.cuda.is_available()
    change = model_changes(case)
    if case["needs_cuda"] and not cuda:
        raise failures.NotRun("needs CUDA")
    if case["name"] == "floors":
        return floors_rows(spec)
    device = "cuda" if cuda else "cpu"
    if cuda:  # the allocator setting applies to segments allocated from here on: return the cached ones
        torch.cuda.empty_cache()
        torch.cuda.memory._set_allocator_settings(f"expandable_segments:{bool(case['expandable_segments'])}")
    rows = []
    with train.matmul_precision(case["tf32"]):
        cfg, model, optimizer, inputs, targets, autocast = train.setup(case, dims)
        change(model)
        if case["checkpoint_candidates"]:
            case, checkpointed = memory_fit.time_checkpointed(case, spec, cfg, model, optimizer, inputs, targets,
                                                              autocast, idle=False)
            rows += checkpointed
        elif case.get("micro_batch_candidates"):
            case, fitted = memory_fit.time_micro_batched(case, spec, cfg, model, optimizer, inputs, targets,
                                                         autocast, idle=False)
            rows += fitted
        else:
            rows += e2e.time_steps(case, cfg, model, optimizer, inputs, targets, autocast, idle=False)
        idle = {}
        try:
            backend, kernel_time, busy = profile.profile_step(case, model, optimizer, inputs, targets, autocast)
            rows += kernel_time
            idle = {"gpu_idle_pct": profile.idle_share(rows, busy)}
        except Exception as exc:  # noqa: BLE001  (the timings stand without it)
            backend = "unknown (" + failures.classify_failure(exc)[1][:80] + ")"
        rows = [{**r, **idle} for r in rows]
    del model, optimizer
    rows += flop_rows(cfg, case, dims, device)
    if cuda:
        rows += phase_floors(cfg, case, spec)
    # every row of the rung says how its timed steps stopped (bench/timing.py's sample_until)
    stop = next(({"stop": r["stop"], "stop_after": r["stop_after"]} for r in rows if r.get("stop")), {})
    return [{"checkpoint_every": case["checkpoint_every"], "batch_size": case["batch_size"],
             "micro_batches": case["micro_batches"], **stop, **r, "attention_backend": backend} for r in rows]


# The blocks of the model `warm` compiles: the first (with our fused RMSNorm it takes no residual
# delta) and one like all the others; the model's blocks share those graphs whatever its depth.
WARM_LAYERS = 2
DIM_KEYS = ("d_model", "d_ff", "n_layers", "n_heads")


def known_ahead(case: dict) -> bool:
    """Whether what a rung runs (its shapes, so its compiles and FLOP count) is known before it
    runs: not the floors, nor the rungs whose micro-batch or checkpointed blocks measured memory
    chooses."""
    return case["name"] != "floors" and not case["checkpoint_candidates"] and not case.get("micro_batch_candidates")


def compiles(case: dict) -> bool:
    """Whether `warm` compiles what a rung's timed steps will: its blocks are compiled and its
    shapes are known before it runs (not the rungs that choose a micro-batch or the blocks to
    checkpoint by measured memory)."""
    return bool(case["compile"]) and known_ahead(case)


def warm(case: dict) -> list[dict]:
    """One training step of a rung on its model cut to WARM_LAYERS blocks, timing nothing: run in
    worker processes before the timed loop (bench/workers.py), it leaves in the compile caches
    the graphs and Triton kernels the rung's blocks compile, which its first step then loads (a
    third of a cold compile). The step times do not change, only the wait before them."""
    import torch
    contenders.register_from_environment()

    dims = {k: case[k] for k in DIM_KEYS} | {"n_layers": min(WARM_LAYERS, case["n_layers"])}
    change = model_changes(case)
    if case["needs_cuda"] and not torch.cuda.is_available():
        raise failures.NotRun("needs CUDA")
    with train.matmul_precision(case["tf32"]):
        cfg, model, optimizer, inputs, targets, autocast = train.setup(case, dims)
        change(model)
        train.step(model, optimizer, inputs, targets, autocast, train.nothing, case["micro_batches"])
    timing.synchronizer()()
    return [{**csv_schema.failure_row("ok", ""), "metric": "compiled"}]


def count_ahead(cases: list[dict], dims: dict) -> None:
    """The FLOP counts of `cases` (flop_count.count_step caches them in this process, about 5 s a
    setting at 2.7B): a count that fails is counted, and its failure written, in its rung."""
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for case in filter(known_ahead, cases):
        try:
            flop_count.count_step(case, dims, device)
        except Exception:  # noqa: BLE001  (the rung counts again and says why it failed)
            pass


def measure_isolated(case: dict) -> list[dict]:
    """measure() of a contender's rung in bench/isolation's child (the case carries dims and spec);
    a case marked `warm_only` (Isolated.warm, before the timed loop): `warm` and the rung's FLOP
    count, timing nothing."""
    dims, spec, warm_only = case["_dims"], case["_spec"], case.get("warm_only", False)
    case = {k: v for k, v in case.items() if k not in ("_dims", "_spec", "warm_only")}
    if not warm_only:
        return measure(case, dims, spec)
    rows = warm(case) if compiles(case) else [{**csv_schema.failure_row("ok", ""), "metric": "compiled"}]
    count_ahead([case], dims)
    return rows


def prepare(todo: list[dict], say, isolated, dims: dict, spec: dict, rivals: set) -> None:
    """Beside the workers' warm-up (bench/jobs.py): a contender's rungs warmed in their own
    process, which then measures them (its start, its compiles and its FLOP counts paid before
    the timed loop), and the FLOP counts of ours here."""
    theirs = [{**c, "_dims": dims, "_spec": spec} for c in todo if c["attention"] in rivals]
    child = threading.Thread(target=isolated.warm, args=(theirs, say), daemon=True)
    child.start()
    t0 = time.monotonic()
    ours = [c for c in todo if c["attention"] not in rivals and known_ahead(c)]
    count_ahead(ours, dims)
    if ours:
        say(f"counted the FLOPs of {len(ours)} rungs in {time.monotonic() - t0:.1f} s")
    child.join()


def main(argv=None):
    # spec: settings and model dims; --cases: rungs alone (bench/jobs.py); --workers: `warm` first
    args = cli.bench_args(__doc__, argv, size=True, options=jobs.options, warms=True)
    import torch

    contenders.register_or_exit(args.spec.get("contenders"))  # the model can use them; workers inherit them
    dims, rungs = args.spec["models"][args.size], cases(args.spec, args.size, cuda=torch.cuda.is_available())
    rivals = set(contenders.provider_names(args.spec.get("contenders")))
    # each contender in processes of its own: our rungs never run where a contender's code was imported
    with isolation.Separate(measure_isolated, float(args.spec.get("contender_time_limit_s", 600)),
                            key=lambda case: contenders.owner(case["attention"])) as isolated:
        def run(case: dict) -> list[dict]:  # a contender's rung in a process of its own
            return (isolated({**case, "_dims": dims, "_spec": args.spec}) if case["attention"] in rivals
                    else measure(case, dims, args.spec))
        jobs.run(section="ladder", study="ladder", cases=rungs, measure=run,
                 args=args, fingerprint={"spec": args.spec, "size": args.size,
                                         **contenders.fingerprint(args.spec.get("contenders"))}, warm=warm,
                 # a contender's rungs are warmed in its own process, with its time limit (prepare)
                 compiles=lambda case: compiles(case) and case["attention"] not in rivals,
                 prepare=lambda todo, say: prepare(todo, say, isolated, dims, args.spec, rivals))


if __name__ == "__main__":
    main()
