"""Contenders: a user's own implementations, named once, run beside ours and the peers.

A contender is a Python module with any of the Stanford CS336 assignment-2 adapter functions:

    get_flashattention_autograd_function_pytorch() -> autograd.Function class   contract "attention"
    get_flashattention_autograd_function_triton()  -> autograd.Function class   contract "attention"
    get_ddp(module) + ddp_on_after_backward(model, optimizer)                   contract "ddp"
    get_fsdp(module, compute_dtype=None) + fsdp_on_after_backward(model, optimizer)
        + fsdp_gather_full_params(model)                                       contract "fsdp"
    get_sharded_optimizer(params, optimizer_cls, **kwargs)                     contract "sharded_optimizer"

It is named on the command line (`--config contenders=path/to/adapters.py`) or, several at once,
as a mapping in a config file (docs/contenders.md).
A contender's name is the mapping's key, or the file's stem for a bare path. What it does not
define, or defines as `raise NotImplementedError`, is "not implemented": the studies of that
contract are `skipped` rows saying so. A module that does not import stops planning with an error
naming the file (`ContenderError`), before any job runs.

Each attention adapter becomes one provider of the attention contract (lmperf.providers), named
`<contender>_triton` or `<contender>_pytorch`, role "contender": the benchmarks run it as they run
ours. Its calls are wrapped (`guarded`) so that an output of the wrong shape, dtype or device, or
with NaN, is a `wrong` row naming what was wrong, never a time.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lmperf.bench.failures import NotRun
from lmperf.bench.honest import Wrong, guarded

# The adapter functions of each contract, as CS336 assignment 2 names them (tests/adapters.py):
# the 2026 handout's `ddp` and `fsdp`, the 2025 handout's `ddp_individual_parameters` and
# `ddp_bucketed` (get_ddp_bucketed(module, bucket_size_mb), its hook called at each step's start).
CONTRACTS: dict[str, tuple[str, ...]] = {
    "attention_triton": ("get_flashattention_autograd_function_triton",),
    "attention_pytorch": ("get_flashattention_autograd_function_pytorch",),
    "ddp": ("get_ddp", "ddp_on_after_backward"),
    "ddp_individual_parameters": ("get_ddp_individual_parameters", "ddp_individual_parameters_on_after_backward"),
    "ddp_bucketed": ("get_ddp_bucketed", "ddp_bucketed_on_after_backward", "ddp_bucketed_on_train_batch_start"),
    "fsdp": ("get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params"),
    "sharded_optimizer": ("get_sharded_optimizer",),
}
ADAPTERS = tuple(name for names in CONTRACTS.values() for name in names)
# The attention adapters, by the suffix of the provider each becomes.
ATTENTION = {"triton": "get_flashattention_autograd_function_triton",
             "pytorch": "get_flashattention_autograd_function_pytorch"}
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_")


class ContenderError(ValueError):
    """A contender that cannot be used at all: its module does not import, or its config entry
    is malformed. Raised while planning, before any job runs."""


class NotImplementedByContender(NotRun):
    """The contender does not implement this adapter: a `skipped` row saying so."""
    status = "skipped"


class Failed(NotRun):
    """The contender's code raised: a `failed` row with the whole cause. A result about the
    contender, not a failure of the job."""
    status = "failed"


@dataclass(frozen=True)
class Contender:
    """One contender: its name, where its adapters come from (`sources`: the files that are code
    inputs of every job running it) and, per adapter function name, the callable or None."""
    name: str
    origin: str
    sources: tuple[str, ...]
    adapters: dict = field(hash=False, compare=False)

    def adapter(self, name: str) -> Callable:
        """The adapter function `name`, or NotImplementedByContender saying it is not defined."""
        fn = self.adapters.get(name)
        if fn is None:
            raise NotImplementedByContender(f"not implemented: contender {self.name!r} ({self.origin}) "
                                            f"defines no {name}")
        return fn

    def implements(self, contract: str) -> bool:
        """Whether every adapter function of `contract` is defined (it may still raise
        NotImplementedError when called)."""
        return all(self.adapters.get(n) is not None for n in CONTRACTS[contract])


# ---------------------------------------------------------------------------------------------
# The config's `contenders` value -> {name: {adapter: "file-or-module[:attr]"}}


def normalise(value) -> dict[str, dict[str, str] | str]:
    """The config's `contenders` (a path string, or a mapping name -> path | module | mapping of
    adapter function -> 'module:attr') as {name: source-or-mapping}; ContenderError naming what
    is malformed. Empty: {}."""
    if value in (None, "", {}):
        return {}
    if isinstance(value, str):
        items = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            items[_name_from_source(part)] = part
        return items
    if not isinstance(value, dict):
        raise ContenderError(f"config contenders: expected a path or a mapping of name -> source, got "
                             f"{type(value).__name__} {value!r}")
    for name, source in value.items():
        if not isinstance(name, str) or not name or set(name) - NAME_CHARS:
            raise ContenderError(f"config contenders: name {name!r}: use lower-case letters, digits and _")
        if isinstance(source, dict):
            unknown = sorted(set(source) - set(ADAPTERS))
            if unknown:
                raise ContenderError(f"config contenders.{name}: {unknown} are no adapter functions; "
                                     f"known: {', '.join(ADAPTERS)}")
            if not all(isinstance(s, str) and s for s in source.values()):
                raise ContenderError(f"config contenders.{name}: each adapter names 'module:attr' or 'file.py:attr'")
        elif not isinstance(source, str) or not source:
            raise ContenderError(f"config contenders.{name}: expected a path, a module or a mapping, got {source!r}")
    return dict(value)


def _name_from_source(source: str) -> str:
    stem = Path(source.split(":")[0]).stem if source.endswith(".py") or "/" in source else source.split(".")[-1]
    name = "".join(c if c in NAME_CHARS else "_" for c in stem.lower()) or "contender"
    return name


# ---------------------------------------------------------------------------------------------
# Loading


def _is_file(source: str) -> bool:
    return source.endswith(".py") or os.sep in source


def _import_file(path: str):
    """The module at `path` (a fresh import, cached by the file's absolute path and contents)."""
    file = Path(path)
    if not file.is_file():
        raise ContenderError(f"contender file {path} does not exist")
    digest = hashlib.sha256(file.read_bytes()).hexdigest()[:12]
    mod_name = f"lmperf_contender_{file.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    folder = str(file.resolve().parent)  # its own helpers import as they would beside it
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(mod_name, None)
        raise ContenderError(f"contender file {path} does not import: {type(exc).__name__}: {exc}") from exc
    finally:
        if added:
            sys.path.remove(folder)
    return module


def _import(source: str):
    """A module from a file path or an importable name; ContenderError naming it if it fails."""
    if _is_file(source):
        return _import_file(source)
    try:
        return importlib.import_module(source)
    except BaseException as exc:
        raise ContenderError(f"contender module {source} does not import: {type(exc).__name__}: {exc}") from exc


def _module_file(module) -> str | None:
    path = getattr(module, "__file__", None)
    if not path:
        return None
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


def load(name: str, source: str | dict) -> Contender:
    """One contender from its config entry; ContenderError if a module does not import or an
    entry's attribute is missing."""
    if isinstance(source, str):
        module = _import(source)
        adapters = {a: getattr(module, a, None) for a in ADAPTERS}
        adapters = {a: (fn if callable(fn) else None) for a, fn in adapters.items()}
        files = tuple(filter(None, [_module_file(module)]))
        return Contender(name, source, files, adapters)
    adapters, files = {a: None for a in ADAPTERS}, []
    for adapter, where in source.items():
        mod_source, _, attr = where.rpartition(":") if ":" in where else (where, "", adapter)
        module = _import(mod_source)
        fn = getattr(module, attr or adapter, None)
        if not callable(fn):
            raise ContenderError(f"contender {name}: {mod_source} has no callable {attr or adapter}")
        adapters[adapter] = fn
        files.append(_module_file(module))
    return Contender(name, ", ".join(sorted(set(source.values()))), tuple(sorted(set(filter(None, files)))), adapters)


def load_all(value) -> list[Contender]:
    """Every contender the config's `contenders` names, loaded (ContenderError on the first that
    cannot be)."""
    return [load(name, source) for name, source in normalise(value).items()]


def code_inputs(value) -> list[str]:
    """The files a job running these contenders depends on (a change reruns it): each contender's
    source files. Used by the workflow as code inputs; loading errors surface here, at planning."""
    return sorted({f for c in load_all(value) for f in c.sources})


def digest(value) -> str:
    """The sha256 of every contender file `value` names (code_inputs), for journals."""
    h = hashlib.sha256()
    for path in code_inputs(value):
        h.update(path.encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# The attention contract


def attention_class(contender: Contender, kind: str):
    """The autograd Function class of `kind` ('triton' | 'pytorch'); NotImplementedByContender
    when the adapter is missing or raises NotImplementedError."""
    getter = contender.adapter(ATTENTION[kind])
    try:
        cls = getter()
    except NotImplementedError as exc:
        raise NotImplementedByContender(f"not implemented: {ATTENTION[kind]} raised NotImplementedError"
                                        + (f" ({exc})" if str(exc) else "")) from None
    if not (inspect.isclass(cls) and hasattr(cls, "apply")):
        raise Wrong(f"{ATTENTION[kind]} returned {cls!r}, not an autograd.Function class")
    return cls


def attention_fn(contender: Contender, kind: str) -> Callable:
    """fn(q, k, v, is_causal) over lmperf's attention contract, from the contender's class: CS336's
    contract is (batch, N, D) inputs, so (B, H, N, D) inputs with as many K/V heads as Q heads are
    passed as (B * H, N, D) views and the output viewed back; fewer K/V heads (grouped-query) are
    passed as they are (a contender that cannot take them raises, an `unsupported` row)."""
    cls = attention_class(contender, kind)

    def fn(q, k, v, is_causal):
        if q.dim() == 4 and q.shape == k.shape == v.shape:
            b, h, n, d = q.shape
            return cls.apply(q.reshape(b * h, n, d), k.reshape(b * h, n, d), v.reshape(b * h, n, d),
                             is_causal).reshape(b, h, n, d)
        return cls.apply(q, k, v, is_causal)
    fn.__qualname__ = f"{contender.name}_{kind}"
    return fn


# ---------------------------------------------------------------------------------------------
# The workflow's jobs (rules/contenders.smk)

STUDIES = ("attention", "distributed")


def study_spec(config: dict, scale: str, study: str) -> str:
    """The JSON spec of one contenders job: the contenders (normalised) and that study's
    settings at `scale`, with the time limit per case."""
    import json
    settings = config.get("contenders_check", {}).get(scale, {})
    return json.dumps({"contenders": normalise(config.get("contenders")), **settings.get(study, {}),
                       "time_limit_s": config.get("contender_time_limit_s", 600)}, sort_keys=True)



# ---------------------------------------------------------------------------------------------
# Contenders as providers (lmperf.providers) and as the model's attention (lmperf.model)

ENV = "LMPERF_CONTENDERS"  # JSON of the normalised config value: what child processes register
TILED_NOTE = "the Python tile loop of a PyTorch implementation takes seconds a case above it"


def refuse_tiled(case: dict) -> None:
    """NotRun for a case of a PyTorch attention (a Python tile loop) above its tiled_max_seq_len."""
    limit = case.get("tiled_max_seq_len")
    if limit is not None and case.get("seq_len", 0) > limit:
        raise NotRun(f"N > {limit} (tiled_max_seq_len): {TILED_NOTE}")


def provider_names(value) -> list[str]:
    """The attention providers the contenders become, `<name>_triton` and `<name>_pytorch` for
    each (one that is not implemented gives `skipped` rows saying so)."""
    return [f"{name}_{kind}" for name in normalise(value) for kind in ATTENTION]


def _attention_or_reason(contender: Contender, kind: str) -> Callable:
    """fn(q, k, v, is_causal) of a contender's attention, resolved now (so that a compiled model
    traces the contender's own code, nothing of lmperf's loading); for an adapter that is missing
    or not a class, a function that raises why when called (a `skipped` or `wrong` row)."""
    try:
        return attention_fn(contender, kind)
    except NotRun as exc:
        def unavailable(q, k, v, is_causal, exc=exc):
            raise type(exc)(str(exc))
        return unavailable


def register(value) -> list[str]:
    """Register every contender of the config's `contenders` as attention providers (role
    "contender") and as attention choices of the model (lmperf.model.ATTENTION), and pass them to
    the processes this one starts (ENV). Returns the provider names. ContenderError for a module
    that does not import."""
    items = normalise(value)
    if not items:  # nothing imported: planning without contenders never loads torch here
        return []
    import json

    from lmperf import model, providers
    loaded = {name: load(name, source) for name, source in items.items()}  # errors name the file, here
    names = []
    for name, source in items.items():
        contender = loaded[name]
        source_file = contender.sources[0] if contender.sources else None
        for kind in ATTENTION:
            provider = f"{name}_{kind}"
            names.append(provider)
            existing = providers.find(provider)
            if existing is not None:  # registered already (by this process, or the name is taken)
                if existing.role != "contender" or existing.source != source_file:
                    raise ContenderError(f"contender {name!r}: provider name {provider!r} is taken by "
                                         f"{existing.source or 'lmperf'}; choose another contender name")
                continue
            fn = _attention_or_reason(contender, kind)
            providers.register(providers.Provider(
                provider, f"{name} ({kind}, contender)", "contender", "attention", _build(fn, kind),
                needs=("cuda_for_bf16",) if kind == "triton" else (),
                source=source_file))
            if provider not in model.ATTENTION:
                model.register_attention(provider, fn)
    os.environ[ENV] = json.dumps(items)
    providers.load([__name__])  # a process this one starts imports this module: it registers them (below)
    return names


def _build(fn: Callable, kind: str) -> Callable:
    def build(case: dict):
        import contextlib
        if kind == "pytorch":
            refuse_tiled(case)
        causal = case["causal"]
        checked = guarded(fn)
        return (lambda q, k, v: checked(q, k, v, causal)), contextlib.nullcontext
    return build


def register_or_exit(value) -> list[str]:
    """`register`, for a benchmark's main: a contender that does not import ends the process with
    its error (its file named)."""
    try:
        return register(value)
    except ContenderError as exc:
        raise SystemExit(f"error: {exc}") from None


def ladder_rungs(value) -> list[tuple[str, str, dict, bool]]:
    """The ladder's rungs of a user's attention in place of ours (bench/ladder.py), one a
    provider, on the last carried rung's settings and not carried up: (name, change, the case
    keys it sets, whether it needs CUDA)."""
    return [(f"contender_{p}", f"contender (on the last carried rung's settings; not carried up): {p}'s "
             f"attention in place of ours", {"attention": p}, p.endswith("_triton")) for p in provider_names(value)]


def register_from_environment() -> None:
    """In a process a job started: register the contenders the job registered (ENV)."""
    import json
    raw = os.environ.get(ENV)
    if raw:
        from lmperf import providers
        if not all(providers.find(n) for n in provider_names(json.loads(raw))):
            register(json.loads(raw))


DISTRIBUTED = ("ddp", "ddp_individual_parameters", "ddp_bucketed", "fsdp", "sharded_optimizer")


def distributed_variants(value) -> dict[str, tuple]:
    """{variant: (name, source, contract)}: the distributed section's variants a user's contenders
    add, `<name>-ddp`, `<name>-fsdp`, `<name>-sharded_optimizer` (one not implemented gives
    `skipped` rows saying so)."""
    return {f"{name}-{contract}": (name, source, contract)
            for name, source in normalise(value).items() for contract in DISTRIBUTED}


# A process started by a job that registered contenders (a worker, a torchrun rank, an isolated
# case) registers them when it imports this module: lmperf.providers loads it by name (ENV).
register_from_environment()
