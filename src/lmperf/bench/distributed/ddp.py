"""The data-parallel study of the distributed section: the training step (lmperf.train.step, the
one every study runs) on every rank, each on its slice of the global batch, in one variant a
case: one process ("single", the baseline), an all-reduce per parameter or of all gradients
flattened into one buffer after backward (by hand: train.step's `reduce`), DDP (its buckets
all-reduced in fp32, or in bf16 through its bf16_compress_hook: "ddp_bf16"), FSDP2, or DDP with
ZeroRedundancyOptimizer. Per rank: the phase times, the memory of parameters, gradients,
optimizer state and activations, and (on a GPU, profiled) the communication no compute kernel
hides."""
from __future__ import annotations

import contextlib
import json
import time

from lmperf import failures, stats
from lmperf.bench import timing
from lmperf.bench.distributed.comm import profiled_comm
from lmperf.bench.distributed.ranks import Ranks

VARIANTS = ("single", "per_param", "flat", "ddp", "ddp_bf16", "fsdp2", "zero")
BUCKETED = ("ddp", "ddp_bf16")  # the variants timed at every bucket size of the spec
ZERO_BUCKET_MB = 25  # ZeroRedundancyOptimizer runs under DDP with its default bucket size

MEMORY_BUCKET_MB = 25  # DDP's default bucket: the DDP case of the memory context
# A contender's bucketed DDP (the 2025 handout's get_ddp_bucketed) is timed at DDP's default bucket
# (its check, bench/contender_distributed.py, runs it at buckets smaller than a model as well)
CONTENDER_BUCKET_MB = MEMORY_BUCKET_MB
DATA_PARALLEL = ("ddp", "ddp_individual_parameters", "ddp_bucketed", "fsdp")  # a contender's, in the memory context


def cases(spec: dict, world: int) -> list[dict]:
    """One case per (size, variant, bucket size) at `context` ("scaling"); a job of one process
    runs the single-GPU baseline only, at the same per-GPU batch. With `memory_context`, each
    size also runs at that (shorter) per-GPU context, where the model's state rather than its
    activations fills the memory: DDP (25 MB buckets) and FSDP2 ("memory"; on one process, the
    single-GPU baseline), whose peaks are what sharding changes. Each rank's step is
    `micro_batches` micro-batches of `batch_per_gpu` sequences (default 1) with AdamW in the
    implementation `optimizer` (lmperf.train.OPTIMIZERS; default foreach). With `accumulate`
    ({micro_batches, bucket_caps_mb}), DDP at those buckets and the one-GPU job again with that
    many micro-batches a step ("accumulate"): one all-reduce behind more compute."""
    out = []
    from lmperf import contenders
    rivals = contenders.distributed_variants(spec.get("contenders"))  # a user's DDP, FSDP, sharded optimizer
    variants = [("single", None)] if world == 1 else [
        (v, b) for v in spec["variants"] for b in (spec["bucket_caps_mb"] if v in BUCKETED else [None])] + [
        (v, _contender_bucket(contract)) for v, (_, _, contract) in rivals.items()]
    memory = [("single", None)] if world == 1 else [
        (v, MEMORY_BUCKET_MB if v == "ddp" else None) for v in ("ddp", "fsdp2") if v in spec["variants"]] + [
        (v, _contender_bucket(contract)) for v, (_, _, contract) in rivals.items() if contract in DATA_PARALLEL]
    micro_batches, optimizer = spec.get("micro_batches", 1), spec.get("optimizer", "foreach")
    contexts = [("scaling", spec["context"], variants, micro_batches)]
    if spec.get("memory_context"):
        contexts.append(("memory", spec["memory_context"], memory, micro_batches))
    if (acc := spec.get("accumulate")) and "ddp" in spec["variants"]:
        # DDP (and the one-GPU job) again with `micro_batches` micro-batches a step: the gradients
        # all-reduced once, in the last one's backward (train.gradient_sync), behind more compute
        if acc["micro_batches"] == micro_batches:
            raise ValueError(f"ddp accumulate micro_batches {micro_batches}: the grid's own; choose another")
        runs = [("single", None)] if world == 1 else [("ddp", b) for b in acc["bucket_caps_mb"]]
        contexts.append(("accumulate", spec["context"], runs, acc["micro_batches"]))
    attention, compiled = spec.get("attention", "plain"), bool(spec.get("compile", False))
    how = lambda k: ((f"-x{k}" if k > 1 else "") + (f"-{optimizer}" if optimizer != "foreach" else "")
                     + ("-compiled" if compiled else ""))
    for size in spec["sizes"]:
        for purpose, context, runs, k in contexts:
            for variant, bucket in runs:
                name = (f"{variant}-b{bucket}" if bucket else variant) + (f"-ctx{context}" if purpose == "memory" else "")
                out.append({"case_id": f"{size}-{name}{how(k)}-n{world}", "size": size, "variant": variant,
                            "bucket_cap_mb": bucket if bucket else (ZERO_BUCKET_MB if variant == "zero" else None),
                            "world_size": world, "batch_per_gpu": spec["batch_per_gpu"],
                            "micro_batches": k, "optimizer": optimizer,
                            "global_batch": spec["batch_per_gpu"] * k * world, "context": context,
                            "purpose": purpose, "dtype": spec["dtype"], "attention": attention, "compile": compiled,
                            "warmup": spec["warmup"],
                            "timed_steps": spec["timed_steps"], "profiled_steps": spec["profiled_steps"],
                            **({"contender": rivals[variant][0], "contender_source": json.dumps(rivals[variant][1])}
                               if variant in rivals else {})})
    # every rank runs every case in one process: ours first, then each contender's together, so
    # that no row of ours runs where a contender's code was imported
    return sorted(out, key=lambda c: (c.get("contender") is not None, c.get("contender") or ""))


def _contender_bucket(contract: str) -> float | None:
    return CONTENDER_BUCKET_MB if contract == "ddp_bucketed" else None


def job_cases(study: str, spec: dict | None, arg: str | None = None) -> list[dict]:
    """The cases of one job, by the signature every benchmark module shares (lmperf.workflow
    lists them at planning; `arg`: the process count)."""
    return cases(spec, int(arg))


def build(variant: str, cfg, device, world: int, bucket_cap_mb: float | None, optimizer="foreach",
          contender: tuple | None = None, dtype: str = "fp32", compiled: bool = False):
    """(model, optimizer, reduce_gradients) of one variant. The weights are the same on every
    rank (lmperf.train.build_model); with `compiled`, each Transformer block is compiled
    (`_compile_blocks`) before any engine wraps or shards it: the engines' hooks stay outside the
    compiled blocks, so DDP's buckets all-reduce as the backward reaches them and FSDP2 gathers
    block by block. reduce_gradients is the explicit all-reduce after backward,
    None where the engine communicates inside backward (DDP, FSDP2) or not at all (single).
    `optimizer` is an implementation of lmperf.train.OPTIMIZERS or a torch optimizer as
    (class, kwargs); MasterWeightAdamW ('master') only for one process: its hooks move each
    gradient into its own fp32 sums, which none of the engines here reduces. A user's contender
    (name, source, contract: lmperf.contenders) wraps the model or makes the optimizer through its
    adapters; its `*_on_after_backward` is the reduce."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lmperf import train

    if variant not in VARIANTS and contender is None:
        raise ValueError(f"variant {variant!r}; choose one of {VARIANTS}")
    if variant == "ddp_bf16" and torch.device(device).type != "cuda":
        raise failures.Unsupported("DDP's bf16 all-reduce (bf16_compress_hook) needs NCCL on GPUs: Gloo has no bf16 "
                                 "all-reduce")
    model = train.build_model(cfg, device)
    if compiled:
        _compile_blocks(model, cfg.context_length)
    if contender is not None:
        return contender_build(contender, model, world, optimizer, bucket_cap_mb)
    if optimizer == "master":
        if variant != "single":
            raise failures.Unsupported(f"optimizer 'master' (MasterWeightAdamW) with variant {variant!r}: its "
                                     "gradients go into its own fp32 sums, which no engine here reduces")
        return model, train.make_optimizer(model, "master"), None
    optimizer_class, optimizer_kwargs = ((torch.optim.AdamW, train.adamw_options(optimizer))
                                         if isinstance(optimizer, str) else optimizer)
    device_ids = [torch.device(device).index] if torch.device(device).type == "cuda" else None
    reduce = None
    if variant == "per_param":
        reduce = lambda: allreduce_per_parameter(list(model.parameters()), world)
    elif variant == "flat":
        reduce = lambda: allreduce_flat(list(model.parameters()), world)
    elif variant in ("ddp", "ddp_bf16", "zero"):
        # buffers (RoPE tables) are the same on every rank: no broadcast each forward; gradients
        # live in DDP's buckets (no copy into them after backward)
        model = DDP(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb, broadcast_buffers=False,
                    gradient_as_bucket_view=True)
        if variant == "ddp_bf16":
            # PyTorch's bf16_compress_hook: each bucket cast to bf16, all-reduced (half the bytes of
            # fp32, so half of NCCL's time on the SMs the backward also needs) and cast back; the
            # gradients' average carries bf16's rounding (8 bits of mantissa)
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
            model.register_comm_hook(None, bf16_compress_hook)
    elif variant == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        # bf16: FSDP2's own mixed precision, as its users train: each block's weights gathered and
        # used in bf16 (half the all-gather's bytes, and no fp32 copy of an unsharded weight, or
        # autocast's bf16 copy of one, kept for backward), gradients reduced in fp32
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if dtype == "bf16" else MixedPrecisionPolicy())
        for block in model.blocks:  # one all-gather / reduce-scatter unit per block, then the rest
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    if variant == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_class,
                                            **optimizer_kwargs)
    else:
        optimizer = optimizer_class(model.parameters(), **optimizer_kwargs)
    return model, optimizer, reduce


_compiled_context: list[int] = []  # the context the blocks' compiled code of this process is for


def _compile_blocks(model, context: int) -> None:
    """Compile each block (lmperf.train.compile_blocks) for this case, the same way whatever ran
    before it in the process: one graph a block, never split at DDP's buckets (Dynamo's
    DDPOptimizer would split it only when the first compile happens under DDP, so a job's case
    order would decide), and static shapes (a new context starts Dynamo afresh rather than
    recompiling the blocks for any length). The blocks of every case of one context share the
    code compiled for the first (a new model of the same shapes is no new graph)."""
    import torch

    from lmperf import train
    torch._dynamo.config.optimize_ddp = False
    if _compiled_context and _compiled_context[-1] != context:
        torch._dynamo.reset()
    _compiled_context[:] = [context]
    train.compile_blocks(model)


def contender_build(contender: tuple, model, world: int, optimizer, bucket_cap_mb: float | None = None):
    """(model, optimizer, reduce) through a contender's adapters (CS336 assignment 2's, either
    handout year: bench/contender_distributed.wrap). Its `*_on_after_backward` is the reduce; the
    bucketed DDP gets `bucket_cap_mb`, and its `ddp_bucketed_on_train_batch_start` runs at each
    step's start, before the first forward (a forward pre-hook: train.step has no step-start phase
    of its own), inside the timed step."""
    import torch

    from lmperf import contenders, train
    from lmperf.bench import contender_distributed
    name, source, contract = contender
    rival = contenders.load(name, source)
    optimizer_class, optimizer_kwargs = ((torch.optim.AdamW, train.adamw_options(optimizer))
                                         if isinstance(optimizer, str) else optimizer)
    try:
        if contract == "sharded_optimizer":
            sharded = rival.adapter("get_sharded_optimizer")(model.parameters(), optimizer_class, **optimizer_kwargs)
            return model, sharded, lambda: allreduce_flat(list(model.parameters()), world)
        wrapped, after, start = contender_distributed.wrap(rival, contract, model, bucket_size_mb=bucket_cap_mb)
        opt = optimizer_class(wrapped.parameters(), **optimizer_kwargs)
    except NotImplementedError as exc:
        raise contenders.NotImplementedByContender(f"not implemented: an adapter of {contract} raised "
                                                   f"NotImplementedError" + (f" ({exc})" if str(exc) else "")) from None
    if start is None:
        return wrapped, opt, lambda: after(wrapped, opt)
    step_started = [False]  # the hook once a step, however many micro-batches it has

    def at_step_start(module, args):
        if not step_started[0]:
            step_started[0] = True
            start(wrapped, opt)

    def reduce():  # after the step's last backward: the next forward starts a new step
        after(wrapped, opt)
        step_started[0] = False
    wrapped.register_forward_pre_hook(at_step_start)
    return wrapped, opt, reduce


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


def train_steps(variant: str, cfg, rank: int, world: int, batches, optimizer,
                bucket_cap_mb: float = ZERO_BUCKET_MB, device: str = "cpu", micro_batches: int = 1,
                compiled: bool = False) -> dict:
    """Train `variant` with lmperf.train.step on this rank's slice of each global batch (fp32,
    no autocast; `micro_batches` a step; `compiled`: the blocks compiled) and return the full
    weights: the correctness check against single-process training on the same batches."""
    from lmperf import train

    model, optimizer, reduce = build(variant, cfg, device, world, bucket_cap_mb, optimizer, compiled=compiled)
    for tokens in batches:
        inputs, targets = rank_batch(tokens.to(device), rank, world)
        train.step(model, optimizer, inputs, targets, contextlib.nullcontext(), train.nothing,
                   micro_batches, reduce)
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


def optimizer_state_tensors(optimizer) -> list:
    """The optimizer's state in memory: AdamW's moments (ZeroRedundancyOptimizer: its shard's);
    MasterWeightAdamW's flat moments and the 16-bit remainders of its fp32 master weights, then
    the AdamW state of the model's other parameters."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer holds its shard's optimizer
    if hasattr(inner, "exp_avg"):  # MasterWeightAdamW
        own = [t for t in (inner.exp_avg, inner.exp_avg_sq, inner.rest) if t is not None]
        return own + (optimizer_state_tensors(inner.others) if inner.others is not None else [])
    return [v for state in inner.state.values() for v in state.values()
            if hasattr(v, "numel") and v.numel() > 1]  # Adam's `step` counters are not state memory


def gradient_tensors(model, optimizer) -> list:
    """The gradients the optimizer will read: the parameters' `.grad`, and MasterWeightAdamW's fp32
    sums of micro-batches' gradients where it keeps them."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    acc = getattr(optimizer, "acc", None)
    return grads + ([acc] if acc is not None else [])


def train_device(ranks: Ranks) -> str:
    import torch

    if torch.cuda.is_available():
        if ranks.world > 1 and not ranks.nccl:
            raise failures.NotRun(ranks.needs_gpus())
        return f"cuda:{ranks.local_rank}"
    return "cpu"  # a CPU-only machine trains on its CPU over Gloo (the smoke run)


def measure_local(case: dict, ranks: Ranks, spec: dict) -> dict:
    """One case on this rank (`_measure_local`); for a contender's variant, what its code raises
    is a `failed` row about it, and the job goes on (a second contender whose packages share the
    first's names cannot be imported into these ranks: its variants say so)."""
    if not case.get("contender"):
        return _measure_local(case, ranks, spec)
    from lmperf import contenders, failures
    try:
        return _measure_local(case, ranks, spec)
    except failures.NotRun:
        raise
    except Exception as exc:
        if failures.is_oom(exc):
            raise
        raise contenders.Failed(failures.describe(exc)) from None


def _measure_local(case: dict, ranks: Ranks, spec: dict) -> dict:
    """This rank's phase times, memory split and (on a GPU) profiled communication."""
    import torch

    from lmperf import train
    from lmperf.model import ModelConfig

    device = train_device(ranks)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = ModelConfig(**spec["models"][case["size"]], context_length=case["context"],
                      attention=case.get("attention", "plain"))
    train.check_optimizer(case["optimizer"], case["dtype"])
    rival = ((case["contender"], json.loads(case["contender_source"]), case["variant"].rsplit("-", 1)[-1])
             if case.get("contender") else None)
    model, optimizer, reduce = build(case["variant"], cfg, device, ranks.world, case["bucket_cap_mb"],
                                     case["optimizer"], rival, case["dtype"], case.get("compile", False))
    autocast = train.autocast(case["dtype"], torch.device(device).type)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(cfg.vocab_size, (case["global_batch"], case["context"] + 1), generator=gen)
    inputs, targets = (t.to(device) for t in rank_batch(tokens, ranks.rank, ranks.world))
    probe = {}

    def step(around=train.nothing):
        train.step(model, optimizer, inputs, targets, autocast, around, case["micro_batches"], reduce)

    @contextlib.contextmanager
    def grads_probe(phase):  # gradients are all there when the optimizer phase starts
        if phase == "optimizer":
            probe["grad_mib"] = local_mib(gradient_tensors(model, optimizer))
        yield

    for _ in range(case["warmup"]):
        step()
    step(grads_probe)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    timed = []
    with timing.window():  # this rank's GPU clocks at the start and end (the rows' clock columns)
        for _ in range(case["timed_steps"]):
            times = {}

            @contextlib.contextmanager
            def timer(phase):  # a phase seen once per micro-batch: its times add up
                t0 = time.perf_counter()
                yield
                sync()
                times[phase] = times.get(phase, 0.0) + (time.perf_counter() - t0) * 1e3
            step(timer)
            timed.append(times)
    out = {"phases_ms": {p: [t[p] for t in timed] for p in timed[0]},
           "param_mib": local_mib(model.parameters()), "grad_mib": probe["grad_mib"],
           "optimizer_state_mib": local_mib(optimizer_state_tensors(optimizer))}
    if cuda:
        out["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        out.update(profiled_comm(step, case["profiled_steps"]))
    return out


def rows(case: dict, results: list) -> list[dict]:
    """Rows: phases and step time (rank 0; collectives keep the ranks in step), throughput of
    the whole job, and per-rank memory and communication (samples = one value per rank)."""
    lead_rank = results[0]
    phases = lead_rank["phases_ms"]
    step_ms = [sum(ts) for ts in zip(*phases.values())]
    tokens = case["global_batch"] * case["context"]
    rows = [stats.summarize(f"{p}_ms", "ms", xs) for p, xs in phases.items()]
    rows.append(stats.summarize("step_ms", "ms", step_ms))
    rows.append(stats.summarize("tokens_per_s", "tokens/s", [tokens / (s / 1e3) for s in step_ms]))
    per_rank = lambda key: [r[key] for r in results]
    for key in ("param_mib", "grad_mib", "optimizer_state_mib", "peak_allocated_mib"):
        if key in lead_rank:
            rows.append(stats.summarize(key, "MiB", per_rank(key)))
    if "peak_allocated_mib" in lead_rank:
        rest = [r["peak_allocated_mib"] - r["param_mib"] - r["grad_mib"] - r["optimizer_state_mib"]
                for r in results]
        row = stats.summarize("activations_mib", "MiB", rest)
        row["message"] = "peak allocated less parameters, gradients and optimizer state (buffers included)"
        rows.append(row)
    for key in ("comm_ms", "exposed_comm_ms", "compute_ms"):
        if key in lead_rank:
            rows.append(stats.summarize(key, "ms", per_rank(key)))
    return rows


