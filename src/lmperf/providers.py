"""Every implementation a benchmark runs, declared once: its name (the id in the config and the
CSVs), the label the report and the README print, its role (ours, a peer, a user's contender),
the contract it implements, how to build it for a case, what it needs, and whether it compiles.
The config's provider lists are checked against this registry (lmperf.planning), the
FlashAttention-2 benchmark builds from it (bench/flash_attention.py), and the report reads from it which
provider is ours, the peers and their labels, the peers of record its bars and summary name,
the grid's reference, the figures' colours and the old names of renamed providers (`aliases`,
`renamed`): no module of the report keeps a list of provider names. Each provider belongs to one
contract ("attention", "lrpe", "model_attention", "fused"): one name may be a provider of two.

    providers.names("attention")              # ['triton_compiled', 'triton', 'sdpa_flash', ...]
    providers.names("attention", role="peer") # the report's peer columns, in this order
    providers.get("sdpa_flash").build(case)   # (fn(q, k, v), context factory)

Contract "attention": `build(case)` returns `(fn, context)`: `fn(q, k, v) -> o`, differentiable,
with the case's `causal` (and the grouped-query K/V heads it was given); each call runs inside
`context()`. `case` holds at least `causal`, `dtype` ('fp32' | 'fp16' | 'bf16'), `heads`,
`kv_heads`, `seq_len`, `head_dim` (a bench case has more: `tiled_max_seq_len`, `harness`). A
provider that cannot run a case raises lmperf.failures.Unsupported or NotRun, which become rows.

More providers: the config key `provider_modules` (a list of Python files or importable module
names; the same through `--config provider_modules=path/to/mine.py` for one) names modules whose
top level calls `providers.register(Provider(...))`. Planning (lmperf.planning.check_config), the
result-file listing (lmperf.workflow.result_files, which the renderer calls) and the benchmark
(through its job's spec, key `provider_modules`) each load them with `load_config` / `load`; a
module that does not import stops them with its file named. A provider from such a file has
that file as its `source`: a code input of every job that runs it (`sources`). A user's
contenders (lmperf.contenders) are registered the same way, with role "contender". A process
started by a job (a worker, a torchrun rank) finds the job's modules in the environment
(`share`, LMPERF_PROVIDER_MODULES) and loads them at its first lookup.

Imports neither torch nor triton: the builds import them when called.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

ROLES = ("ours", "peer", "contender")
# "attention": FlashAttention-2 and its peers (q, k, v) -> o; "lrpe": LRPE-cosine (x, theta) -> y;
# "model_attention": the model's attention (lmperf.model.ATTENTION, the config's `attention`);
# "fused": fused kernels patched into the model (lmperf.kernels.fused, the ladder's `fused`).
CONTRACTS = ("attention", "lrpe", "model_attention", "fused")  # later: "ddp", "fsdp", "sharded_optimizer"
# What a provider may need, checked before its build: (exception class name in lmperf.failures,
# message; {name} is the provider's).
NEEDS = {
    "cuda": ("NotRun", "needs CUDA"),
    "half": ("Unsupported", "{name}: fp16/bf16 only"),
    "cuda_for_bf16": ("NotRun", "needs CUDA: Triton's interpreter computes bfloat16 dots wrongly"),
}
HARNESSES = ("eager", "leaderboard")


@dataclass(frozen=True)
class Provider:
    """One implementation of a contract. `harness`: the bench harness it always runs under
    (None: its group's); `cache_compiled`: False where Inductor's graph cache cannot tell its
    compiled graphs apart (they are then compiled anew each case); `config`: what it chose for
    a case (the kernels' tile configs), for the rows' `config` column; `kernel`: which kernels a
    call on (q, k, v, causal) runs, for the rows' `kernel` column."""
    name: str
    label: str
    role: str
    contract: str
    build: Callable[[dict], tuple[Callable, Callable]]
    needs: tuple[str, ...] = ()
    compiles: bool = False
    gqa: bool = True
    source: str | None = None
    harness: str | None = None
    cache_compiled: bool = True
    config: Callable[[dict], str] | None = None
    kernel: Callable[..., str] | None = None
    record: bool = False
    short: str | None = None
    colour: str | None = None
    reference: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def says(self) -> str:
        """The name a sentence gives it: `short`, else its label."""
        return self.short or self.label

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"provider {self.name!r}: role {self.role!r} is not one of {ROLES}")
        if self.contract not in CONTRACTS:
            raise ValueError(f"provider {self.name!r}: contract {self.contract!r} is not one of {CONTRACTS}")
        unknown = [n for n in self.needs if n not in NEEDS]
        if unknown:
            raise ValueError(f"provider {self.name!r}: needs {unknown} are not among {sorted(NEEDS)}")
        if self.harness not in (None, *HARNESSES):
            raise ValueError(f"provider {self.name!r}: harness {self.harness!r} is not one of {HARNESSES}")

    def needs_cuda(self, dtype: str) -> bool:
        """Whether it needs a CUDA device at `dtype` ('fp32' | 'fp16' | 'bf16'): a case of it is
        "needs CUDA" on a machine without one."""
        return "cuda" in self.needs or ("cuda_for_bf16" in self.needs and dtype == "bf16")

    def check_needs(self, case: dict) -> None:
        """Raise the Unsupported / NotRun of the first need the case or this machine does not
        meet."""
        from lmperf import failures
        for need in self.needs:
            if not _MET[need](case):
                kind, message = NEEDS[need]
                raise getattr(failures, kind)(message.format(name=self.name))
        if not self.gqa and case.get("kv_heads", case.get("heads")) != case.get("heads"):
            raise failures.Unsupported(f"{self.name}: K/V with as many heads as Q only (no grouped-query attention)")

    def make(self, case: dict) -> tuple[Callable, Callable]:
        """`build(case)` after its needs are checked."""
        self.check_needs(case)
        return self.build(case)


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


_MET = {"cuda": lambda case: _cuda(),
        "half": lambda case: case["dtype"] != "fp32",
        "cuda_for_bf16": lambda case: case["dtype"] != "bf16" or _cuda()}

_REGISTRY: dict[tuple[str, str], Provider] = {}  # (contract, name) -> provider
_LOADED: dict[str, str] = {}  # module (a resolved path or a module name) -> its file
ENV = "LMPERF_PROVIDER_MODULES"  # JSON list of modules: what `share` passes to child processes


def share() -> None:
    """Pass the modules loaded here to the processes this one starts (workers, torchrun ranks):
    they load them at their first lookup."""
    os.environ[ENV] = json.dumps(list(_LOADED))


def _from_environment() -> None:
    if os.environ.get(ENV):
        load(json.loads(os.environ[ENV]))


def register(p: Provider) -> Provider:
    """Add a provider; ValueError if another one of its contract has its name or one of its
    aliases."""
    old = _REGISTRY.get((p.contract, p.name))
    if old is not None and old != p:
        raise ValueError(f"provider {p.name!r} is declared twice" + (f" (in {old.source} and {p.source})"
                                                                    if old.source or p.source else ""))
    taken = {n: q.name for q in _REGISTRY.values() if q.contract == p.contract and q.name != p.name
             for n in (q.name, *q.aliases)}
    if clash := [n for n in (p.name, *p.aliases) if n in taken]:
        raise ValueError(f"provider {p.name!r}: the name {clash[0]!r} is {taken[clash[0]]!r}'s")
    _REGISTRY[(p.contract, p.name)] = p
    return p


def find(name: str, contract: str = "attention") -> Provider | None:
    """The contract's provider of that name, or None (no lookup in the environment: for
    registering)."""
    return _REGISTRY.get((contract, name))


def get(name: str, contract: str = "attention") -> Provider:
    _from_environment()
    try:
        return _REGISTRY[(contract, name)]
    except KeyError:
        raise KeyError(f"unknown {contract} provider {name!r}; known: {', '.join(names(contract))}") from None


def canonical(contract: str) -> dict[str, str]:
    """{old name: name} of the contract's aliases: what rows written under an old name read as."""
    _from_environment()
    return {a: p.name for p in providers(contract) for a in p.aliases}


def renamed(rows, contract: str, column: str = "provider"):
    """`rows` (a DataFrame) with each alias in `column` read as the name of the provider that has
    it now (`Provider.aliases`): rows written before a rename read on, unmeasured again."""
    aliases = canonical(contract)
    if not aliases or rows.empty or column not in rows or not rows[column].isin(list(aliases)).any():
        return rows
    return rows.assign(**{column: rows[column].replace(aliases)})


def renamed_id(case_id: str, contract: str) -> str:
    """A case id (or a shell-style pattern of one) with each of its '-'-separated parts that is an
    alias read as the name of the provider that has it now: "2.7B-rung07-flash_triton" ->
    "2.7B-rung07-flash-triton"."""
    aliases = canonical(contract)
    if not aliases:
        return case_id
    return re.sub(r"(?<![^-])(" + "|".join(map(re.escape, aliases)) + r")(?![^-])",
                  lambda m: aliases[m.group(1)], case_id)


def renamed_ids(rows, contract: str, column: str = "case_id"):
    """`rows` (a DataFrame) with `renamed_id` applied to `column`, the rows untouched where no id
    holds an alias."""
    if rows.empty or column not in rows or not canonical(contract):
        return rows
    ids = rows[column].map(lambda v: renamed_id(v, contract) if isinstance(v, str) else v)
    return rows if ids.equals(rows[column]) else rows.assign(**{column: ids})


def read_renamed(rows, contract: str = "model_attention"):
    """Rows as written, read in today's names of the contract's providers: `renamed` on the
    columns that hold one (the model's `attention`, a ladder rung's `name`: the rung named after
    the attention it sets), `renamed_ids` on `case_id`, and the attention bench's ids as it names
    them today (`attention_case_ids`). What the readers of committed results (the report's, the
    claims', the comparison's, the run's cost) apply to every row first."""
    for column in ("attention", "name"):
        rows = renamed(rows, contract, column)
    return attention_case_ids(renamed_ids(rows, contract))


ATTENTION_CASE_COLUMNS = ("group", "provider", "harness", "dtype", "causal", "batch", "heads", "kv_heads",
                          "seq_len", "head_dim")


def attention_case_id(case) -> str:
    """An attention bench case's id from its fields (a case's, or a results row's columns:
    ATTENTION_CASE_COLUMNS). A provider timed under a harness not its own (a peer under the
    leaderboard's) says which: one group name may time a provider under both harnesses."""
    provider, harness, heads, kv = case["provider"], case["harness"], int(case["heads"]), int(case["kv_heads"])
    via = "" if harness == (get(provider).harness or "eager") else f"-{harness}"
    return (f"{case['group']}-{provider}{via}-{case['dtype']}-{'causal' if case['causal'] else 'full'}"
            f"-b{int(case['batch'])}h{heads}{f'kv{kv}' if kv != heads else ''}n{int(case['seq_len'])}"
            f"d{int(case['head_dim'])}")


def _declared_here(name) -> bool:
    """Whether lmperf itself declares the attention provider `name` (not a contender, not a
    provider module's: those are registered only in the processes that load them)."""
    p = _REGISTRY.get(("attention", name)) if isinstance(name, str) else None
    return p is not None and p.source is None and p.role != "contender"


def attention_case_ids(rows):
    """Attention bench rows (those with every column of ATTENTION_CASE_COLUMNS) with `case_id` as
    `attention_case_id` names it today: rows written before a change of the scheme (such as the
    harness a peer is timed under) still find their cases. Only the rows of providers lmperf
    declares, which every process registers, are renamed: a contender's row, or one of a provider
    module's, keeps the id it was written with, so a row reads the same whatever the process
    reading it has registered. A row missing a value keeps its own too."""
    if rows.empty or "case_id" not in rows or not set(ATTENTION_CASE_COLUMNS) <= set(rows.columns):
        return rows
    ids = []
    for row in rows[["case_id", *ATTENTION_CASE_COLUMNS]].itertuples(index=False):
        if not _declared_here(row.provider):
            ids.append(row.case_id)
            continue
        try:
            ids.append(attention_case_id(row._asdict()))
        except (KeyError, ValueError, TypeError):
            ids.append(row.case_id)
    return rows if ids == list(rows["case_id"]) else rows.assign(case_id=ids)


def of_record(contract: str = "attention") -> list[Provider]:
    """The contract's peers of record, in declaration order: those the report's bars and the
    summary name."""
    return [p for p in providers(contract, "peer") if p.record]


def ours(contract: str = "attention", harness: str | None = "eager") -> str:
    """The name of our provider of the contract called as it is (`harness` None: the first
    declared, whatever its harness)."""
    mine = providers(contract, "ours")
    return next((p.name for p in mine if harness is None or (p.harness or "eager") == harness), mine[0].name)


def reference(contract: str = "attention") -> str | None:
    """The peer a grid's speed-ups are read against, or None."""
    return next((p.name for p in providers(contract, "peer") if p.reference), None)


def colours(contract: str, present) -> dict[str, str]:
    """{name: colour} of the providers `present`: each its declared colour, else one by its
    place among them (matplotlib's cycle)."""
    present = sorted(present)
    declared = {p.name: p.colour for p in providers(contract) if p.colour}
    return {n: declared.get(n, f"C{i}") for i, n in enumerate(present)}


def providers(contract: str, role: str | None = None) -> list[Provider]:
    """The contract's providers (of one role), in declaration order: ours, then the peers, then
    the providers that modules and contenders added."""
    _from_environment()
    return [p for p in _REGISTRY.values() if p.contract == contract and role in (None, p.role)]


def names(contract: str, role: str | None = None) -> list[str]:
    return [p.name for p in providers(contract, role)]


def labels(contract: str) -> dict[str, str]:
    """{name: label} of the contract's providers."""
    return {p.name: p.label for p in providers(contract)}


def unknown(contract: str, wanted: Iterable[str]) -> list[str]:
    """The names among `wanted` that are no provider of `contract`."""
    known = set(names(contract))
    return [n for n in wanted if n not in known]


def sources(contract: str | None = None) -> list[str]:
    """The files of the providers that modules and contenders added (of one contract): code
    inputs of every job that runs them."""
    return sorted({p.source for p in _REGISTRY.values() if p.source and contract in (None, p.contract)})


# ---------------------------------------------------------------------------------------------
# Loading the modules a config names


@contextlib.contextmanager
def kept():
    """The registry and the loaded modules as they are now, back on the way out: for a caller
    that registers or loads providers for a while (a test)."""
    registry, loaded = dict(_REGISTRY), dict(_LOADED)
    try:
        yield
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(registry)
        _LOADED.clear()
        _LOADED.update(loaded)



def modules_of(config: dict) -> list[str]:
    """The config's `provider_modules`: a list, or one name (`--config provider_modules=x.py`)."""
    mods = config.get("provider_modules") or []
    return [mods] if isinstance(mods, str) else list(mods)


def load_config(config: dict) -> None:
    """Load the modules the config's `provider_modules` names (`load`). (A user's contenders,
    config `contenders`, are registered by lmperf.contenders.register.)"""
    load(modules_of(config))


def load(modules: Iterable[str]) -> None:
    """Import each module (a path to a Python file, or a module name), once a process; the
    providers it registers get its file as their `source`. ValueError naming the module where
    one does not import."""
    for module in modules:
        key = _key(module)
        if key in _LOADED:
            continue
        before = set(_REGISTRY)
        try:
            path = _import(module)
        except Exception as exc:
            raise ValueError(f"provider module {module!r} does not import: {type(exc).__name__}: {exc}") from exc
        for name in set(_REGISTRY) - before:
            if _REGISTRY[name].source is None:
                _REGISTRY[name] = replace(_REGISTRY[name], source=path)
        _LOADED[key] = path


def _is_path(module: str) -> bool:
    return module.endswith(".py") or "/" in module or "\\" in module


def _key(module: str) -> str:
    return str(Path(module).resolve()) if _is_path(module) else module


def _import(module: str) -> str:
    """Import `module` (a file or a module name); its file, relative to the working folder where
    it is under it."""
    if _is_path(module):
        path = Path(module)
        if not path.is_file():
            raise FileNotFoundError(f"no file {path}")
        name = "lmperf_providers_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        file = path
    else:
        file = Path(importlib.import_module(module).__file__)
    with contextlib.suppress(ValueError):
        return str(file.resolve().relative_to(Path.cwd()))
    return str(file.resolve())


def digest(contract: str | None = None) -> dict[str, str]:
    """{file: sha256} of `sources(contract)`: what a job's journal keys on besides lmperf's own
    modules, so that a resume never mixes rows of two versions of a provider's file."""
    return {f: hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in sources(contract)}


# ---------------------------------------------------------------------------------------------
# Attention: ours, and PyTorch's


def _triton(case: dict):
    from lmperf.kernels.flash_attention_triton import FlashAttention2Triton
    causal = case["causal"]
    return (lambda q, k, v: FlashAttention2Triton.apply(q, k, v, causal)), contextlib.nullcontext


def _triton_config(case: dict) -> str:
    """The rule table's tile configs for the case (forward, dQ, dK/dV, fused backward or not)."""
    from lmperf.dtypes import torch_dtype
    from lmperf.kernels import flash_attention_triton as fa
    n, d, h = case["seq_len"], case["head_dim"], case["heads"]
    dtype, bh = torch_dtype(case["dtype"]), case.get("batch", 1) * h
    bwd = fa.bwd_config(n, d, dtype, case["causal"], bh, h // case.get("kv_heads", h))
    return "; ".join(f"{name}: " + " ".join(f"{k}={v}" for k, v in cfg.items()) for name, cfg in
                     (("fwd", fa.fwd_config(n, d, dtype, case["causal"], bh)),
                      ("dq", bwd["dq"]), ("dkdv", bwd["dkdv"]), ("bwd", {"fused": bwd["fused"]})))


def _triton_kernels(q, k, v, causal: bool) -> str:
    """The forward's and the backward's kernels a call runs (Gluon or tile-language)."""
    from lmperf.kernels import flash_attention_triton as fa
    return fa.kernels(q, k, v, causal)


def _torch_tiled(case: dict):
    from lmperf.failures import NotRun
    from lmperf.kernels.flash_attention_torch import FlashAttention2PyTorch
    limit = case.get("tiled_max_seq_len")
    if limit is not None and case["seq_len"] > limit:
        raise NotRun(f"N > {limit} (tiled_max_seq_len): the Python tile loop takes seconds a case above it")
    causal = case["causal"]
    return (lambda q, k, v: FlashAttention2PyTorch.apply(q, k, v, causal)), contextlib.nullcontext


def _plain(case: dict):
    from lmperf.model import plain_attention
    causal = case["causal"]
    return (lambda q, k, v: plain_attention(q, k, v, causal)), contextlib.nullcontext


def no_donated_buffers():
    """The benchmark times backward alone with retain_graph=True, which compiled backwards with
    donated buffers refuse; donation only saves memory, not time. Every compiled provider
    sets this itself: a run resumed from its journal may start with any of them."""
    import torch._functorch.config  # not imported by `import torch` alone
    torch._functorch.config.donated_buffer = False


def _plain_compiled(case: dict):
    """torch.compile'd PyTorch attention for one shape, as users get it for a fixed one: anew each
    case, never with kernels made for an earlier case's lengths (tuning NOTES.md, steps 28-29)."""
    import torch
    from lmperf.model import plain_attention
    no_donated_buffers()
    torch._dynamo.reset()
    compiled, causal = torch.compile(plain_attention, dynamic=False), case["causal"]
    return (lambda q, k, v: compiled(q, k, v, causal)), contextlib.nullcontext


def _sdpa(backend_name: str):
    def build(case: dict):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend, causal = getattr(SDPBackend, backend_name), case["causal"]
        kw = {"enable_gqa": True} if case.get("kv_heads", case["heads"]) != case["heads"] else {}
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)), \
            (lambda: sdpa_kernel(backend))
    return build


@functools.cache
def _compiled_flex():
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    no_donated_buffers()
    return torch.compile(flex_attention, dynamic=False)


def _flex(case: dict):
    from torch.nn.attention.flex_attention import create_block_mask
    n, mask = case["seq_len"], None
    if case["causal"]:
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device="cuda")
    kw = {"enable_gqa": True} if case.get("kv_heads", case["heads"]) != case["heads"] else {}
    return (lambda q, k, v: _compiled_flex()(q, k, v, block_mask=mask, **kw)), contextlib.nullcontext


# In the report's order: ours under the leaderboard's harness first, then ours, then the peers.
for _p in (
    Provider("triton_compiled", "ours (Triton), torch.compile'd", "ours", "attention", _triton,
             needs=("cuda_for_bf16",), compiles=True, harness="leaderboard", config=_triton_config,
             kernel=_triton_kernels),
    Provider("triton", "ours (Triton)", "ours", "attention", _triton, needs=("cuda_for_bf16",), compiles=True,
             config=_triton_config, kernel=_triton_kernels),
    Provider("sdpa_flash", "SDPA-flash", "peer", "attention", _sdpa("FLASH_ATTENTION"), needs=("half",),
             cache_compiled=False, record=True),
    Provider("sdpa_cudnn", "SDPA-cuDNN", "peer", "attention", _sdpa("CUDNN_ATTENTION"), needs=("half",),
             cache_compiled=False, record=True, short="cuDNN"),
    Provider("flex", "FlexAttention", "peer", "attention", _flex, needs=("cuda",), compiles=True),
    Provider("plain_compiled", "torch.compile", "peer", "attention", _plain_compiled, compiles=True,
             reference=True),
    Provider("plain", "PyTorch", "peer", "attention", _plain),
    Provider("torch_tiled", "ours in PyTorch (tiled)", "peer", "attention", _torch_tiled),
):
    register(_p)


# ---------------------------------------------------------------------------------------------
# LRPE-cosine: ours (the bars' kernel and its cached-cosine variant), and PyTorch's


def _kernels(module: str):
    """A kernels module that a build of a contract other than the attention's runs, imported when
    the build is called. By name, not by an import statement: lmperf.sources makes a job's code
    inputs from the import statements of what it imports, and every job that reads this registry
    (the FlashAttention-2 benchmark's, for one) would otherwise rerun on an edit to these kernels.
    The benchmark that runs them imports them itself (bench/lrpe.py, bench/ladder.py)."""
    return importlib.import_module(module)


@functools.cache
def compiled_lrpe():
    """PyTorch's LRPE-cosine under torch.compile (static shapes), made once: the torch.compile peer."""
    import torch
    return torch.compile(_kernels("lmperf.kernels.lrpe").lrpe_torch, dynamic=False)


def _lrpe(name: str):
    """Contract "lrpe": `build(case)` returns `(fn(x, theta) -> y, context)` for the case's grid
    (`side` tokens along each of `dims` axes, `l` extra tokens)."""
    def build(case: dict):
        lrpe = _kernels("lmperf.kernels.lrpe")
        shape, l = (case["side"],) * case["dims"], case["l"]
        if name == "torch_compile":
            fn = lambda x, theta: (lrpe.check_inputs(x, theta, shape, l, "torch"), compiled_lrpe()(x, theta, shape, l))[1]
        else:
            fn = lambda x, theta: lrpe.lrpe_cosine_md(x, theta, shape, l, name)
        return fn, contextlib.nullcontext
    return build


for _p in (
    Provider("triton", "ours (Triton)", "ours", "lrpe", _lrpe("triton"), needs=("cuda_for_bf16",), compiles=True),
    Provider("triton_cache", "ours (Triton), cached cosines", "ours", "lrpe", _lrpe("triton_cache"),
             needs=("cuda_for_bf16",), compiles=True),
    Provider("torch", "PyTorch", "peer", "lrpe", _lrpe("torch")),
    Provider("torch_compile", "torch.compile", "peer", "lrpe", _lrpe("torch_compile"), compiles=True, record=True),
):
    register(_p)


# ---------------------------------------------------------------------------------------------
# The model's attention (config `attention`, lmperf.model.ATTENTION: fn(q, k, v, is_causal))


def _model_attention(name: str):
    def build(case: dict):
        from lmperf.model import ATTENTION
        return ATTENTION[name], contextlib.nullcontext
    return build


for _p in (
    # its ladder rung and that rung's case ids were spelled flash_triton
    Provider("flash-triton", "ours (Triton)", "ours", "model_attention", _model_attention("flash-triton"),
             needs=("cuda_for_bf16",), compiles=True, aliases=("flash_triton",)),
    Provider("sdpa", "SDPA", "peer", "model_attention", _model_attention("sdpa")),
    Provider("plain", "PyTorch", "peer", "model_attention", _model_attention("plain")),
):
    register(_p)


# ---------------------------------------------------------------------------------------------
# Fused kernels patched into the model (the ladder's `fused` rungs): ours one a part, Liger-Kernel's
# all in one. Contract "fused": `build(case)` returns `(fn(model), context)`, fn patching the model
# in place (lmperf.kernels.fused.apply).


def _fused(impl: str, part: str | None = None):
    def build(case: dict):
        fused = _kernels("lmperf.kernels.fused")
        parts = [part] if part else list(fused.PARTS)
        return (lambda model: fused.apply(model, impl, parts)), contextlib.nullcontext
    return build


for _p in (
    Provider("rmsnorm", "our fused RMSNorm (Triton)", "ours", "fused", _fused("ours", "rmsnorm"),
             needs=("cuda_for_bf16",)),
    Provider("swiglu", "our fused SwiGLU (Triton)", "ours", "fused", _fused("ours", "swiglu"),
             needs=("cuda_for_bf16",)),
    Provider("rope", "our RoPE (Triton)", "ours", "fused", _fused("ours", "rope"), needs=("cuda_for_bf16",)),
    Provider("liger", "Liger-Kernel", "peer", "fused", _fused("liger"), needs=("cuda",)),
):
    register(_p)
