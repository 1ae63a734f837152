"""A contender's DDP, FSDP or sharded optimizer against one process (bench/contenders.py's
`distributed` study): the assignment's correctness, for both handout years' adapters
(lmperf.contenders.CONTRACTS).

DDP (the 2026 `ddp`, the 2025 `ddp_individual_parameters` and `ddp_bucketed`) and the sharded
optimizer: a small model (two linear layers around a GELU, a LayerNorm, fp32) is trained for a few
AdamW steps on a global batch split evenly over `procs` processes (Gloo, on the CPU), through the
contender's adapters; the same model from the same initial weights is trained in one process on
the whole batch. Right when every weight equals the one-process weight within fp32 rounding (max
abs difference <= 1e-5). The bucketed DDP runs at each of BUCKETS_MB: buckets smaller than the
model, so that several are filled and the last one is partial (as the course's test_ddp.py does),
and one larger than the model; its `ddp_bucketed_on_train_batch_start` is called at each step's
start, before forward, as the course calls it.

FSDP (2026): the course's model kind (`course_model`: the repository's cs336_basics Transformer,
in fp16 the course test's model of its classes, where the contender has one; else lmperf's own,
of the same Linear and Embedding kinds the handout shards) trained as the course's test_fsdp.py
does: SGD, compute_dtype None (fp32) and float16, the course's tolerance for each
(`FSDP_TOLERANCE`, torch.allclose's rule). The reference computes in the same compute dtype (the
Linear and Embedding weights cast for forward and backward, fp32 weights and updates); rank 0
computes it once its own training is measured, so that it is built from the very classes the
ranks imported. Then sharding: the bytes each rank holds after its last step beyond what it held
before the model was built, less the replicated parameters and buffers (RMSNorm's gains, RoPE
tables), against 1/world of the Linear and Embedding weights; more than SHARD_TOLERANCE times
that share is a `wrong` row, "keeps full copies" where it is about the whole.

One row a case: `weights_max_abs_diff`, passed or not, the message saying how it was trained.
"""
from __future__ import annotations

import gc
import os
import tempfile

from lmperf import stats

TOLERANCE = 1e-5  # DDP and the sharded optimizer: fp32 rounding of the same AdamW steps
DIM, HIDDEN, BATCH_PER_RANK = 16, 32, 4
# The bucketed DDP's check: the model above is 1,136 fp32 values (4,544 bytes); 0.0001 MB puts
# each weight in a bucket of its own, 0.003 MB gives two buckets (the last one partial), whether
# an implementation reads MB as 1e6 or 2**20 bytes; 1 MB holds the whole model in one.
BUCKETS_MB = (0.0001, 0.003, 1.0)
# FSDP, as the course's test_fsdp.py (26.1.4) trains and judges it: SGD at lr 0.01, and
# torch.allclose(reference, got, atol, rtol) for each compute dtype.
FSDP_DTYPES = ("fp32", "fp16")
FSDP_TOLERANCE = {"fp32": (1e-6, 1e-4), "fp16": (1e-4, 1e-4)}  # (atol, rtol)
FSDP_LR, VOCAB, SEQ = 0.01, 100, 8
# A rank may hold at most this many times its 1/world share of the Linear and Embedding weights
# (padding to a multiple of the world size, a few bookkeeping tensors); a full copy is `world` times.
SHARD_TOLERANCE = 1.25


def cases(contract: str, spec: dict) -> list[dict]:
    """The settings each case of `contract` adds: one per bucket size for the bucketed DDP, one per
    compute dtype for FSDP, else one. `id` is the case id's part that tells them apart."""
    if contract == "ddp_bucketed":
        return [{"id": f"b{mb:g}", "bucket_size_mb": mb} for mb in spec.get("bucket_sizes_mb", BUCKETS_MB)]
    if contract == "fsdp":
        return [{"id": "" if dtype == "fp32" else dtype, "compute_dtype": dtype}
                for dtype in spec.get("fsdp_dtypes", FSDP_DTYPES)]
    return [{"id": ""}]


# ---------------------------------------------------------------------------------------------
# The contender's adapters, for this check and the timed study (bench/distributed/ddp.py)

# contract -> (the wrapper's adapter, the after-backward hook, the hook at each step's start)
WRAPPERS = {
    "ddp": ("get_ddp", "ddp_on_after_backward", None),
    "ddp_individual_parameters": ("get_ddp_individual_parameters", "ddp_individual_parameters_on_after_backward",
                                  None),
    "ddp_bucketed": ("get_ddp_bucketed", "ddp_bucketed_on_after_backward", "ddp_bucketed_on_train_batch_start"),
    "fsdp": ("get_fsdp", "fsdp_on_after_backward", None),
}


def wrap(contender, contract: str, model, bucket_size_mb: float | None = None, compute_dtype=None):
    """(wrapped model, after_backward(model, optimizer), batch_start(model, optimizer) or None)
    through the contender's adapters of a DDP or FSDP contract. The bucketed DDP gets
    `bucket_size_mb`, FSDP `compute_dtype` (a torch dtype or None). NotImplementedError from the
    contender's code propagates."""
    get, after, start = WRAPPERS[contract]
    if contract == "ddp_bucketed":
        if bucket_size_mb is None:
            raise ValueError("the bucketed DDP needs a bucket size")
        wrapped = contender.adapter(get)(model, bucket_size_mb)
    elif contract == "fsdp":
        wrapped = contender.adapter(get)(model, compute_dtype=compute_dtype)
    else:
        wrapped = contender.adapter(get)(model)
    return wrapped, contender.adapter(after), (contender.adapter(start) if start else None)


# ---------------------------------------------------------------------------------------------
# DDP and the sharded optimizer: a toy model, AdamW, one process's weights within fp32 rounding


def toy_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(), torch.nn.LayerNorm(HIDDEN),
                               torch.nn.Linear(HIDDEN, DIM))


def _batches(steps: int, world: int):
    import torch
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(world * BATCH_PER_RANK, DIM, generator=gen), torch.randn(world * BATCH_PER_RANK, DIM, generator=gen))
            for _ in range(steps)]


def _reference(steps: int, world: int) -> dict:
    import torch
    model = toy_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in _batches(steps, world):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _train_ddp(contender, case: dict, rank: int, world: int) -> dict:
    """This rank's training through the contender's DDP or sharded optimizer; its weights."""
    import torch
    import torch.distributed as dist
    model = toy_model()
    start = None
    if case["contract"] == "sharded_optimizer":  # gradients averaged here, its state sharded by the contender
        wrapped = model
        opt = contender.adapter("get_sharded_optimizer")(model.parameters(), torch.optim.AdamW, lr=1e-2)

        def after(model, optimizer):
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= world
    else:
        wrapped, after, start = wrap(contender, case["contract"], model, case.get("bucket_size_mb"))
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    for x, y in _batches(case["steps"], world):
        shard = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
        if start is not None:  # where the course's test_ddp.py calls it: first thing in the step
            start(wrapped, opt)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(wrapped(x[shard]), y[shard]).backward()
        after(wrapped, opt)
        opt.step()
    return {"weights": {name: p.detach().clone() for name, p in wrapped.named_parameters()}}


# ---------------------------------------------------------------------------------------------
# FSDP: the course's model kind, SGD, the course's tolerance per compute dtype, and sharding


def course_model(compute_dtype: str = "fp32"):
    """(build() -> a fresh model with the same weights every call, the module classes the
    handout shards, what it is), from the cs336_basics.model that the contender's process
    imports: in fp32 its Transformer (BasicsTransformerLM, at a tiny size), in fp16 (or where the
    Transformer does not build) the course test's model (test_fsdp.py: embedding, RMSNorm,
    linear, ReLU, RMSNorm, linear, LM head) from its Embedding, RMSNorm and Linear: the staff
    Transformer does not run with only those weights in fp16 (its RoPE tables stay fp32), which
    the course never asks of it. Without cs336_basics: lmperf's own Transformer, built from torch's
    Linear (no bias) and Embedding, the same kinds."""
    import importlib

    import torch
    try:
        basics = importlib.import_module("cs336_basics.model")
    except ImportError:
        basics = None
    linear, embedding = (getattr(basics, "Linear", None), getattr(basics, "Embedding", None)) if basics else (None,) * 2
    if linear is not None and embedding is not None:
        kinds = (linear, embedding)
        lm = getattr(basics, "BasicsTransformerLM", None)
        if lm is not None and compute_dtype == "fp32":
            build = _seeded(lambda: lm(vocab_size=VOCAB, context_length=SEQ, d_model=32, num_layers=1, num_heads=2,
                                       d_ff=64, rope_theta=10000.0))
            if _builds(build):
                return build, kinds, "cs336_basics.model.BasicsTransformerLM (the contender's)"
        norm = getattr(basics, "RMSNorm", None)
        if norm is not None:
            build = _seeded(lambda: _course_shaped_class()(linear, embedding, norm))
            if _builds(build):
                return build, kinds, "the course test's model of cs336_basics.model's Embedding, RMSNorm and Linear " \
                                     "(the contender's)"
    from lmperf import model as lm_model
    cfg = lm_model.ModelConfig(d_model=32, d_ff=64, n_layers=1, n_heads=2, vocab_size=VOCAB, context_length=SEQ)
    return (_seeded(lambda: lm_model.TransformerLM(cfg)), (torch.nn.Linear, torch.nn.Embedding),
            "lmperf's Transformer (no cs336_basics.model to import)")


def _seeded(make):
    def build():
        import torch
        torch.manual_seed(0)
        return make()
    return build


def _builds(build) -> bool:
    try:
        build()
    except Exception:  # a student's changed signature: the next model kind
        return False
    return True


def _course_shaped_class():
    import torch

    class CourseShaped(torch.nn.Module):
        """The course test's toy shape: embedding, norm, linear, ReLU, norm, linear, LM head."""

        def __init__(self, linear, embedding, norm, d_model=32, d_ff=64):
            super().__init__()
            self.embedding = embedding(VOCAB, d_model)
            self.norm1, self.up, self.norm2 = norm(d_model), linear(d_model, d_ff), norm(d_ff)
            self.down, self.lm_head = linear(d_ff, d_model), linear(d_model, VOCAB)

        def forward(self, tokens):
            x = self.up(self.norm1(self.embedding(tokens)))
            return self.lm_head(self.down(self.norm2(torch.relu(x))))
    return CourseShaped


def _compute_dtype(name: str):
    import torch
    return {"fp32": None, "fp16": torch.float16}[name]


def _tokens(steps: int, world: int):
    import torch
    gen = torch.Generator().manual_seed(2)
    return [(torch.randint(VOCAB, (world * BATCH_PER_RANK, SEQ), generator=gen),
             torch.randint(VOCAB, (world * BATCH_PER_RANK,), generator=gen)) for _ in range(steps)]


def _loss(logits, labels):
    """The course test's loss: cross-entropy of the last position's logits, in fp32."""
    import torch
    return torch.nn.functional.cross_entropy(logits[:, -1, :].float(), labels)


def sharded_names(model, kinds) -> set[str]:
    """The parameters of the modules of the sharded kinds, by name."""
    return {f"{mod_name}.{name}" if mod_name else name
            for mod_name, mod in model.named_modules() if isinstance(mod, kinds)
            for name, _ in mod.named_parameters(recurse=False)}


def split_bytes(model, kinds) -> tuple[int, int]:
    """(bytes of the sharded kinds' parameters, bytes of every other parameter and buffer): the
    whole that FSDP shards, and what each rank keeps whole."""
    sharded = sharded_names(model, kinds)
    params = dict(model.named_parameters())
    whole = sum(p.numel() * p.element_size() for n, p in params.items() if n in sharded)
    rest = sum(p.numel() * p.element_size() for n, p in params.items() if n not in sharded)
    rest += sum(b.numel() * b.element_size() for b in model.buffers())
    return whole, rest


def live_storages() -> dict:
    """{address: storage} of every tensor this process's Python objects hold (parameters,
    attributes, closures), after a collection. The storages are kept (so no new tensor takes an
    address of theirs while this is held)."""
    import warnings

    import torch
    gc.collect()
    out = {}
    with warnings.catch_warnings():  # isinstance on a deprecated alias (torch.distributed.reduce_op) warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if not isinstance(obj, torch.Tensor):
                    continue
                storage = obj.untyped_storage()
                if storage.device.type != "meta" and storage.nbytes():
                    out[storage.data_ptr()] = storage
            except Exception:  # a wrapper subclass without storage of its own (its local tensor is counted)
                continue
    return out


def held_since(before: dict) -> int:
    """Bytes of the storages alive now that were not alive in `before` (live_storages)."""
    return sum(s.nbytes() for ptr, s in live_storages().items() if ptr not in before)


def _reference_fsdp(build, kinds, compute_dtype: str, steps: int, world: int) -> dict:
    """One process on the whole batch, SGD, the sharded kinds' weights cast to the compute dtype
    for forward and backward (their gradients back in fp32, the weights and updates fp32)."""
    import torch
    model = build()
    dtype = _compute_dtype(compute_dtype)
    cast = sharded_names(model, kinds) if dtype is not None else set()
    opt = torch.optim.SGD(model.parameters(), lr=FSDP_LR)
    for tokens, labels in _tokens(steps, world):
        opt.zero_grad(set_to_none=True)
        params = {n: (p.to(dtype) if n in cast else p) for n, p in model.named_parameters()}
        _loss(torch.func.functional_call(model, params, (tokens,)), labels).backward()
        opt.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _train_fsdp(contender, case: dict, rank: int, world: int) -> dict:
    """This rank's FSDP training: the full weights it gathers, the bytes it holds after its last
    step, and on rank 0 the one-process reference."""
    import torch
    build, kinds, what = course_model(case["compute_dtype"])
    batches = _tokens(case["steps"], world)
    before = live_storages()  # what this process held before the model: not the contender's
    model = build()
    whole, replicated = split_bytes(model, kinds)
    wrapped, after, _ = wrap(contender, "fsdp", model, compute_dtype=_compute_dtype(case["compute_dtype"]))
    del model  # the wrapper keeps what it needs of it
    opt = torch.optim.SGD(wrapped.parameters(), lr=FSDP_LR)
    logits_dtype = None
    for tokens, labels in batches:
        shard = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
        opt.zero_grad(set_to_none=True)
        logits = wrapped(tokens[shard])
        logits_dtype = str(logits.dtype).removeprefix("torch.")
        _loss(logits, labels[shard]).backward()
        del logits
        after(wrapped, opt)
        opt.step()
    opt.zero_grad(set_to_none=True)
    held = held_since(before)
    full = contender.adapter("fsdp_gather_full_params")(wrapped)
    if not isinstance(full, dict):
        from lmperf import contenders
        raise contenders.Wrong(f"fsdp_gather_full_params returned {type(full).__name__}, not a dict")
    out = {"weights": {name: t.detach().float().cpu() for name, t in full.items()}, "held_bytes": held,
           "whole_bytes": whole, "replicated_bytes": replicated, "model": what, "logits_dtype": logits_dtype}
    if rank == 0:  # in a process that imported what the ranks did: the same model kinds, whatever ran before
        out["reference"] = _reference_fsdp(build, kinds, case["compute_dtype"], case["steps"], world)
    return out


# ---------------------------------------------------------------------------------------------
# The processes and the verdict


def _rank(rank: int, world: int, case: dict, init_file: str, queue) -> None:
    """One process of the group: what it trained, or its failure, to the queue."""
    import torch.distributed as dist
    from lmperf import contenders, failures
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        contender = contenders.load(case["contender"], case["source"])
        train = _train_fsdp if case["contract"] == "fsdp" else _train_ddp
        result = train(contender, case, rank, world)
        # as numpy arrays: torch would send tensors as shared-memory handles that die with this process
        for key in ("weights", "reference"):
            if key in result:
                result[key] = {name: t.detach().cpu().numpy().copy() for name, t in result[key].items()}
        queue.put((rank, "ok", result))
    except NotImplementedError as exc:
        queue.put((rank, "skipped", f"not implemented: an adapter of {case['contract']} raised "
                                    f"NotImplementedError" + (f" ({exc})" if str(exc) else "")))
    except failures.NotRun as exc:
        queue.put((rank, exc.status, str(exc)))
    except Exception as exc:
        queue.put((rank, "failed", failures.describe(exc)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _match(reference: dict, got: dict) -> dict:
    """`got`'s tensors by the reference's names (a wrapper may prefix them: 'module.0.weight')."""
    matched = {}
    for name in reference:
        hits = [g for g in got if g == name or g.endswith("." + name)]
        if len(hits) != 1:
            raise KeyError(name)
        matched[name] = got[hits[0]]
    return matched


def first_cause(bad: dict[int, tuple[str, str]]) -> tuple[int, tuple[str, str]]:
    """The rank whose (status, message) a case reports of those that did not train: a rank's own
    answer (`skipped`: an adapter raised NotImplementedError; `wrong`) before a `failed` one, which
    can be its consequence (a rank that leaves early breaks another's Gloo connection: "remote
    worker crashing"); the lowest rank among equals."""
    return min(bad.items(), key=lambda item: (item[1][0] == "failed", item[0]))


def _run_ranks(case: dict) -> dict:
    """{rank: result} of `procs` processes over Gloo; the first cause as a NotRun if any did not train."""
    import multiprocessing
    import queue as queue_mod

    from lmperf import contenders
    world = case["procs"]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="lmperf-contender-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank, args=(r, world, case, init_file, queue), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        results = {}
        try:
            while len(results) < world:
                try:
                    rank, status, payload = queue.get(timeout=5)
                    results[rank] = (status, payload)
                except queue_mod.Empty:
                    dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                    if dead:
                        raise contenders.Failed(f"rank {procs.index(dead[0])} died (exit code {dead[0].exitcode})")
        finally:
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
    bad = {r: (s, m) for r, (s, m) in results.items() if s != "ok"}
    if bad:
        rank, (status, message) = first_cause(bad)
        raise {"skipped": contenders.NotImplementedByContender, "wrong": contenders.Wrong}.get(
            status, contenders.Failed)(f"rank {rank}: {message}" if status != "skipped" else message)
    return {rank: payload for rank, (_, payload) in results.items()}


def compare_weights(reference: dict, results: dict, atol: float, rtol: float) -> tuple[float, float, bool]:
    """(max |got - reference| over every rank's weights, atol + rtol |reference| where the
    difference is largest against its own tolerance, whether all are within torch.allclose's
    rule); Wrong for a weight that is missing, of the wrong shape, or not finite."""
    import torch

    from lmperf import contenders
    worst, worst_ratio, tolerance = 0.0, -1.0, atol
    for rank, result in sorted(results.items()):
        weights = {name: torch.from_numpy(a) for name, a in result["weights"].items()}
        try:
            got = _match(reference, weights)
        except KeyError as exc:
            raise contenders.Wrong(f"rank {rank}: no weight named like {exc.args[0]!r} among "
                                   f"{sorted(weights)[:6]}") from None
        for name, ref in reference.items():
            if tuple(got[name].shape) != tuple(ref.shape):
                raise contenders.Wrong(f"rank {rank}: {name} has shape {tuple(got[name].shape)}, expected {tuple(ref.shape)}")
            if not bool(torch.isfinite(got[name]).all()):  # a NaN compares as nothing: strictly wrong
                raise contenders.Wrong(f"rank {rank}: {name} holds NaN or inf after training")
            diff = (got[name].double() - ref.double()).abs()
            allowed = atol + rtol * ref.double().abs()
            worst = max(worst, float(diff.max()))
            ratio = diff / allowed
            i = int(ratio.argmax())
            if float(ratio.flatten()[i]) > worst_ratio:
                worst_ratio, tolerance = float(ratio.flatten()[i]), float(allowed.flatten()[i])
    return worst, tolerance, worst_ratio <= 1.0


def sharding_verdict(results: dict, world: int) -> tuple[bool, str]:
    """(sharded, what each rank holds): the bytes a rank holds less the replicated parameters and
    buffers, against 1/world of the Linear and Embedding weights, within SHARD_TOLERANCE."""
    parts, ok, full = [], True, False
    for rank, r in sorted(results.items()):
        share = r["whole_bytes"] / world
        mine = r["held_bytes"] - r["replicated_bytes"]
        ok = ok and mine <= SHARD_TOLERANCE * share
        full = full or mine >= 0.9 * r["whole_bytes"]
        parts.append(f"rank {rank} {mine / 1024:.1f} KiB ({mine / share:.2f}x)")
    lead = results[min(results)]
    whole = lead["whole_bytes"] / 1024
    said = (f"Linear/Embedding weights {whole:.1f} KiB, 1/{world} = {whole / world:.1f} KiB a rank; held beyond the "
            f"replicated {lead['replicated_bytes'] / 1024:.1f} KiB: {', '.join(parts)}; at most "
            f"{SHARD_TOLERANCE:g}x its share")
    if ok:
        return True, said
    return False, ("keeps full copies of the weights it should shard: " if full else
                   "holds more than its share of the weights it should shard: ") + said


def measure(case: dict, contender) -> list[dict]:
    from lmperf import contenders
    world, steps = case["procs"], case["steps"]
    for name in contenders.CONTRACTS[case["contract"]]:
        contender.adapter(name)  # a missing adapter: a `skipped` row before any process starts
    results = _run_ranks(case)
    if case["contract"] != "fsdp":
        worst, tolerance, passed = compare_weights(_reference(steps, world), results, TOLERANCE, 0.0)
        how = f"{world} processes (Gloo) against one, {steps} AdamW steps"
        if case["contract"] == "ddp_bucketed":
            how += (f", {case['bucket_size_mb']:g} MB buckets, ddp_bucketed_on_train_batch_start called at "
                    f"each step's start")
        row = stats.summarize("weights_max_abs_diff", "abs", [worst])
        row.update(passed=passed, tolerance=TOLERANCE, message=how)
        return [row]
    import torch
    lead = results[0]
    what = lead["model"]
    atol, rtol = FSDP_TOLERANCE[case["compute_dtype"]]
    reference = {name: torch.from_numpy(a) for name, a in lead.pop("reference").items()}
    worst, tolerance, passed = compare_weights(reference, results, atol, rtol)
    sharded, held = sharding_verdict(results, world)
    how = (f"{world} processes (Gloo) against one, {steps} SGD steps (lr {FSDP_LR:g}), compute_dtype "
           f"{'float16' if case['compute_dtype'] == 'fp16' else 'None'} (logits in {lead['logits_dtype']}), "
           f"{what}; tolerance atol {atol:g} + rtol {rtol:g} x |reference| (the course's test_fsdp.py)")
    if not sharded:
        raise contenders.Wrong(f"{held}. Weights: max abs difference {worst:.3g} "
                               f"({'within' if passed else 'beyond'} tolerance); {how}")
    row = stats.summarize("weights_max_abs_diff", "abs", [worst])
    row.update(passed=passed, tolerance=tolerance, message=f"{how}. Sharded: {held}")
    return [row]
