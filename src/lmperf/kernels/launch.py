"""How the FlashAttention kernels are launched in eager mode, without their ops' dispatch
(flash_attention_triton.py's and the Gluon kernels'): `plain_launch(kernel)[grid](*args)`, through
Triton's JIT, or with LMPERF_FA_LAUNCH=cache through a cache of the compiled kernels' launchers
(CachedLaunch), which skips the JIT's per-call work. LMPERF_FA_LAUNCH=plan adds plans (Plan): a
call's launches recorded once per call signature and replayed, which skips the dispatch's checks,
rules and descriptor building as well; a plan calls each compiled kernel's launcher itself (its C
launch function where the launcher would add nothing: `_raw`, `_Mapped`), and is the default
(DEFAULT_MODE) on a Triton release in VERIFIED_TRITON. The launcher is not a public interface of
Triton's: a compiled kernel that lacks what is called (LAUNCHER_ATTRS), or whose launcher refuses
its first call (TypeError, AttributeError), is launched through the JIT from then on."""
from __future__ import annotations

import contextlib
import functools
import operator
import os
import weakref

import torch

LAUNCH_ENV = "LMPERF_FA_LAUNCH"  # "jit": every eager launch through Triton's JIT; "cache": through CachedLaunch;
# "plan": plans too (Plan). Unset: launch_mode's default
# Triton releases whose compiled-kernel launcher the launch cache and plans were checked against on a GPU (the
# launcher is not a public interface of Triton's; tuning/flash_attention/NOTES.md, steps 47-48): where plans
# may become the default (DEFAULT_MODE); the JIT elsewhere whatever DEFAULT_MODE says
VERIFIED_TRITON = ("3.6.",)
# The default where the Triton release is verified: plans (right bit for bit, about half the JIT path's host
# time outside the noise, and the whole FlashAttention GPU test suite passed with them on: NOTES.md step 49)
DEFAULT_MODE = "plan"


@functools.cache
def default_mode() -> str:
    return DEFAULT_MODE if verified_triton() else "jit"


def verified_triton() -> bool:
    """Whether this Triton's release is one in VERIFIED_TRITON."""
    import triton
    return triton.__version__.startswith(VERIFIED_TRITON)


def launch_mode() -> str:
    """How eager FlashAttention calls launch their kernels: $LMPERF_FA_LAUNCH ("jit", "cache" or
    "plan"), else DEFAULT_MODE on a Triton in VERIFIED_TRITON, else "jit"."""
    return getenv(LAUNCH_ENV) or default_mode()


def getenv(name: str):
    """os.environ.get(name), read from the environment's own dict where CPython's os.environ keeps
    one (`_data`, keys encoded): an unset name costs no KeyError (about 0.03 us against 0.7 us a
    read), and a change made through os.environ (monkeypatch.setenv) is seen at once, as with
    os.environ.get."""
    env = os.environ
    try:
        value = env._data.get(_ENV_KEYS[name])
    except KeyError:
        _ENV_KEYS[name] = env.encodekey(name)
        return getenv(name)
    except AttributeError:  # not CPython's os._Environ
        return env.get(name)
    return None if value is None else env.decodevalue(value)


_ENV_KEYS: dict = {}  # name -> os.environ's key for it (encoded)


def current_stream():
    """(device index, raw stream) where a launch goes now: the current CUDA device's current stream
    (a capture's, under torch.cuda.graph), as Triton's JIT takes it (its CUDA driver calls the same
    two functions of torch's, through Python wrappers: a few us a call on a slow host)."""
    if _DEVICE is None:
        from triton.runtime import driver
        device = driver.active.get_current_device()
        return device, driver.active.get_current_stream(device)
    device = _DEVICE()
    return device, _STREAM(device)


try:
    from torch._C import _cuda_getCurrentRawStream as _STREAM, _cuda_getDevice as _DEVICE
except ImportError:  # a build without CUDA: Triton's driver says
    _STREAM = _DEVICE = None


class CachedLaunch:
    """`kernel[grid](*args, **kwargs)` for the eager path: the first call of a specialisation goes
    through Triton's JIT (which compiles or finds the kernel), later calls straight to the compiled
    kernel's launcher with the same arguments in the kernel's parameter order, skipping the JIT's
    per-call work (argument binding, cache key, its settings read from the environment: about 25
    us a launch on an H200's host; tuning/flash_attention/NOTES.md, step 44).
    A specialisation is keyed by what the JIT specialises on, read from the arguments: each
    tensor's dtype and 16-byte alignment (not its address), every other argument's value (ints
    exactly: a shape or stride that changes is a new key, never a wrong kernel), the options
    (num_warps, num_stages) and the device. Kernels with pre-run hooks, and arguments of any other
    type, always take the JIT. Gluon's TMA descriptors are keyed by their dtype, alignment, shape,
    strides, block and layout; the launcher fills each one afresh at every launch, as the JIT's does.
    Fail-safe: a compiled kernel without LAUNCHER_ATTRS is never cached, and a launcher whose first
    call raises TypeError or AttributeError (before it launches: the arguments it was given) turns
    the cache off for this kernel (`jit_only`), that launch and every later one going through the JIT."""

    MAX_ENTRIES = 512

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = tuple(kernel.arg_names)
        self.defaults = {p.name: p.default for p in kernel.params}
        self.compiled: dict = {}
        self.picks: dict = {}
        self.jit_only = False  # the launcher refused its first call: the JIT from then on
        self.checked = False  # the launcher took a call

    def refused(self) -> None:
        """The launcher refused its first call: every launch of this kernel through the JIT."""
        self.jit_only = True
        self.compiled.clear()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(grid, args, kwargs)

    @staticmethod
    def _spec(a):
        if isinstance(a, torch.Tensor):
            return a.dtype, a.data_ptr() % 16 == 0
        if a is None or isinstance(a, (int, float, str, torch.dtype)):
            return a
        if type(a).__name__ == "TensorDescriptor":  # Gluon's host-side TMA descriptor, rebuilt each launch
            return (a.base.dtype, a.base.data_ptr() % 16 == 0, tuple(a.shape), tuple(a.strides),
                    tuple(a.block_shape), a.layout, a.padding)
        raise TypeError  # not keyed here: the JIT

    def _key(self, device, args, kwargs) -> tuple:
        """The specialisation's key. The arguments' types pick (once per tuple of types) which
        positions are tensors (dtype, alignment), plain values (the value itself) and others
        (_spec), so that a call reads each position without a Python call per argument."""
        types = tuple(map(type, args))
        pick = self.picks.get(types)
        if pick is None:
            groups = ([i for i, t in enumerate(types) if issubclass(t, torch.Tensor)],
                      [i for i, t in enumerate(types) if t in _PLAIN],
                      [i for i, t in enumerate(types) if not issubclass(t, torch.Tensor) and t not in _PLAIN])
            pick = self.picks[types] = tuple(_picker(g) for g in groups)
        tensors, plain, other = (p(args) for p in pick)
        kw = tuple(kwargs.items()) if _PLAIN.issuperset(map(type, kwargs.values())) else \
            tuple((k, self._spec(v)) for k, v in kwargs.items())
        return (device, types, tuple([(t.dtype, t.data_ptr() % 16 == 0) for t in tensors]), plain,
                tuple(map(self._spec, other)), kw)

    def bound(self, args, kwargs) -> list:
        """The kernel's arguments in its parameter order (defaults filled in), as the JIT passes them
        to the compiled kernel's launcher."""
        bound = list(args)
        for name in self.names[len(args):]:
            bound.append(kwargs[name] if name in kwargs else self.defaults[name])
        return bound

    def run(self, grid, args, kwargs):
        if self.jit_only or self.kernel.pre_run_hooks or callable(grid) or \
                launch_mode() not in ("cache", "plan"):
            return self.kernel[grid](*args, **kwargs)
        device, stream = current_stream()
        try:
            key = self._key(device, args, kwargs)
        except TypeError:
            return self.kernel[grid](*args, **kwargs)
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if launchable(compiled):
                if len(self.compiled) >= self.MAX_ENTRIES:
                    self.compiled.clear()
                self.compiled[key] = compiled
            return compiled
        bound = self.bound(args, kwargs)
        g0, g1, g2 = (*grid, 1, 1)[:3]
        if self.checked:
            _launch(compiled, grid, g0, g1, g2, stream, bound)
            return compiled
        try:
            _launch(compiled, grid, g0, g1, g2, stream, bound)
        except (TypeError, AttributeError):
            self.refused()
            return self.kernel[grid](*args, **kwargs)
        self.checked = True
        return compiled


LAUNCHER_ATTRS = ("run", "function", "packed_metadata", "launch_metadata")  # what a direct launch calls


def launchable(compiled) -> bool:
    """Whether a compiled kernel has what a direct launch calls (LAUNCHER_ATTRS)."""
    return compiled is not None and all(hasattr(compiled, a) for a in LAUNCHER_ATTRS)


def _launch(compiled, grid, g0, g1, g2, stream, bound) -> None:
    """The compiled kernel's launcher with the JIT's arguments (triton.runtime.jit's JITFunction.run)."""
    enter, leave = _hooks()
    meta = None if enter is None and leave is None else compiled.launch_metadata(grid, stream, *bound)
    compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *bound)


def _hooks() -> tuple:
    """Triton's launch enter and exit hooks as a launcher takes them, an idle one as None (the
    launcher calls a hook that is not None at every launch: an empty HookChain is a Python call
    that does nothing, twice a launch)."""
    hooks = _knobs().runtime
    enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
    return (None if _idle(enter) else enter), (None if _idle(leave) else leave)


def _idle(hook) -> bool:
    """A launch hook that calls nothing (None, or Triton's HookChain with no calls): the launch's
    metadata, built for the hooks only, is not needed."""
    return hook is None or (type(hook).__name__ == "HookChain" and not getattr(hook, "calls", True))


def _raw(compiled) -> tuple | None:
    """(the C launch function, the arguments it takes between the kernel's function and its packed
    metadata) of a compiled kernel whose launcher (Triton's CudaLauncher) would add nothing to the
    call: no global or profile scratch to allocate. A plan then calls the launch function itself and
    skips the launcher's Python frame. Only on a Triton release in VERIFIED_TRITON (the launch
    function's arguments are no public interface); else None: the launcher."""
    run = compiled.run
    if type(run).__name__ != "CudaLauncher" or not verified_triton():
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    launch = getattr(run, "launch", None)
    coop, pdl = getattr(run, "launch_cooperative_grid", None), getattr(run, "launch_pdl", None)
    if launch is None or coop is None or pdl is None:
        return None
    return launch, (coop, pdl, None, None)


def _knobs():
    """triton.knobs (imported at the first launch: this module imports without Triton)."""
    global _KNOBS
    if _KNOBS is None:
        from triton import knobs
        _KNOBS = knobs
    return _KNOBS


_KNOBS = None


def _picker(idx: list):
    """args -> the tuple of args at positions idx (operator.itemgetter, always a tuple)."""
    if not idx:
        return lambda args: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda args: (args[i],)
    return operator.itemgetter(*idx)


LAUNCHES: dict = {}  # kernel -> its CachedLaunch (plain_launch's)
_PLAIN = frozenset((int, bool, float, str, type(None)))  # argument types keyed by value


def plain_launch(kernel):
    """How the eager path launches a kernel, without the op's dispatch: a CachedLaunch of it (the
    interpreter's kernels as they are); while a plan is recorded, one that also records the launch."""
    if getenv("TRITON_INTERPRET") == "1":
        return kernel
    launch = LAUNCHES.get(kernel)
    if launch is None:
        launch = LAUNCHES[kernel] = CachedLaunch(kernel)
    if _RECORDING:
        return _Recorded(launch, _RECORDING[-1].launches)
    return launch


# ---------------------------------------------------------------------------------------------
# Plans: a call's launches recorded once per call signature, then replayed

_RECORDING: list = []  # the Recordings of the calls being recorded (innermost last)


class Recording:
    """What plain_launch saw during a call: its launches (launch, grid, args, kwargs, what the launch
    returned: the compiled kernel), and the scratch buffers the call made (`scratch`)."""

    def __init__(self):
        self.launches: list = []
        self.scratch: list = []


def scratch(t: torch.Tensor) -> torch.Tensor:
    """t, a buffer the call makes for its kernels, which write it before they read it (a split's
    partial results): a plan allocates a fresh one like it at each replay. Any other tensor a call
    makes (a copy of its data) keeps the call's full path."""
    if _RECORDING:
        _RECORDING[-1].scratch.append(t)
    return t


class _Recorded:
    def __init__(self, launch, into: list):
        self.launch, self.into = launch, into

    def __getitem__(self, grid):
        def go(*args, **kwargs):
            compiled = self.launch[grid](*args, **kwargs)
            self.into.append((self.launch, grid, args, kwargs, compiled))
            return compiled
        return go


@contextlib.contextmanager
def recording():
    """The block's Recording: the launches made through plain_launch inside it, and its scratch."""
    rec = Recording()
    _RECORDING.append(rec)
    try:
        yield rec
    finally:
        _RECORDING.pop()


def recording_now() -> bool:
    """Whether a call is being recorded (inside `recording()`)."""
    return bool(_RECORDING)


def planning() -> bool:
    """Whether eager calls go through plans (launch_mode "plan"; not in Triton's interpreter)."""
    return getenv("TRITON_INTERPRET") != "1" and launch_mode() == "plan"


def signature(tensors, extra: tuple = ()) -> tuple:
    """What a call's launches depend on in its tensors: each one's shape, strides, dtype and device,
    its 16-byte alignment, and which of them share their data (the first tensor with the same
    address); then `extra`, the rest the caller's dispatch reads (its flags, its settings)."""
    ptrs = [t.data_ptr() for t in tensors]
    return (*[(t.shape, t.stride(), t.dtype, t.device, p % 16 == 0, ptrs.index(p)) for t, p in zip(tensors, ptrs)],
            extra)


class Plan:
    """The launches of one call, replayable for any call of the same signature (`signature`): the
    kernels and grids as recorded; each argument a constant, a role (the i-th tensor of the call:
    its inputs, then its outputs), or a TMA descriptor of a role's data (shape, strides, block and
    layout as recorded, built without Triton's checks, which it passed at the recording); and the
    outputs and scratch buffers to allocate (shape, strides, dtype, device). A call whose launches
    read a tensor that is none of its roles (a copy made inside) gets no plan (`build` returns None).
    A launch the cache made (CachedLaunch, compiled kernel with LAUNCHER_ATTRS, no pre-run hooks)
    replays straight to its compiled kernel's launcher: its arguments in the kernel's parameter
    order (defaults filled in) as the JIT passes them, the stream read once a replay. The first
    replay tries each launcher (a TypeError or AttributeError: that kernel through the JIT from
    then on, CachedLaunch.refused); a replay on another device than the recording's goes through
    the cache's keyed path (CachedLaunch.run)."""

    def __init__(self, launches, outputs, n_outputs, device=None, scratch_bytes=0, scratch_cuda=False):
        self.launches, self.outputs, self.n_outputs, self.device = launches, outputs, n_outputs, device
        self.fresh, self.scratch = outputs[:n_outputs], outputs[n_outputs:]
        # what one set of its scratch buffers takes, and whether they are CUDA memory (kept by stream)
        self.scratch_bytes, self.scratch_cuda = scratch_bytes, scratch_cuda
        self.kept: dict = {}  # (device, stream) -> the scratch buffers its replays there reuse (KeptScratch)
        self.direct = any(entry[0] is not None for entry in launches)
        self.checked = False  # every direct launch has taken a call (the first replay's tries)

    @classmethod
    def build(cls, rec: Recording, inputs, outputs):
        outputs = [*outputs, *rec.scratch]
        roles = [*inputs, *outputs]
        where = {}
        for i, t in enumerate(roles):
            if t is not None:  # an output the call did not make (None)
                where.setdefault((t.data_ptr(), t.dtype), i)

        def template(a):
            if isinstance(a, torch.Tensor):
                i = where.get((a.data_ptr(), a.dtype))
                if i is None:
                    raise LookupError
                return (_ROLE, i)
            if type(a).__name__ == "TensorDescriptor":
                i = where.get((a.base.data_ptr(), a.base.dtype))
                if i is None or a.padding != "zero":
                    raise LookupError
                return (_DESC, (i, type(a), tuple(a.shape), tuple(a.strides), tuple(a.block_shape), a.layout))
            if a is None or isinstance(a, (bool, int, float, str, torch.dtype)):
                return (_CONST, a)
            raise LookupError

        recorded = []
        try:
            for launch, grid, args, kwargs, compiled in rec.launches:
                if callable(grid):
                    return None
                args, kwargs = [template(a) for a in args], {k: template(v) for k, v in kwargs.items()}
                # the constants as they are, and where the call's tensors and descriptors go
                jit = (launch[grid], *_fill_template(args),
                       {k: x for k, (kind, x) in kwargs.items() if kind == _CONST},
                       [(k, kind, x) for k, (kind, x) in kwargs.items() if kind != _CONST])
                recorded.append((*_direct(launch, grid, compiled, args, kwargs), jit, launch))
        except LookupError:
            return None
        device = current_stream()[0] if any(entry[0] is not None for entry in recorded) else None
        return cls(recorded, [None if t is None else functools.partial(
                       torch.empty_strided, tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device)
                       for t in outputs],
                   len(outputs) - len(rec.scratch), device,
                   sum(t.untyped_storage().nbytes() for t in rec.scratch), any(t.is_cuda for t in rec.scratch))

    def allocate(self) -> list:
        """The call's outputs, fresh and uninitialised, then its scratch buffers (KEPT_SCRATCH)."""
        outs = [None if new is None else new() for new in self.fresh]
        if self.scratch:
            outs += KEPT_SCRATCH.buffers(self)
        return outs

    def replay(self, roles) -> None:
        if self.direct:
            device, stream = current_stream()
            if device != self.device or not self.checked:
                return self._replay_checked(roles, device == self.device, stream)
            enter, leave = _hooks()
            meta = enter is not None or leave is not None
        for run, mid, compiled, grid, g0, g1, g2, args, fills, jit, _ in self.launches:
            if run is None:
                _replay_jit(jit, roles)
                continue
            args = _filled(args, fills, roles)
            run(g0, g1, g2, stream, *mid, _launch_metadata(run, compiled, grid, stream, args) if meta else None,
                enter, leave, *args)

    def _replay_checked(self, roles, same_device: bool, stream) -> None:
        """A replay that tries each direct launch as later replays make it (the plan's first), or one
        on another device than the recording's (every launch through the cache's keyed path)."""
        enter, leave = _hooks()
        for n, (run, mid, compiled, grid, g0, g1, g2, args, fills, jit, launch) in enumerate(self.launches):
            if run is None or not same_device:
                _replay_jit(jit, roles)
                continue
            args = _filled(args, fills, roles)
            meta = None if enter is None and leave is None else _launch_metadata(run, compiled, grid, stream, args)
            try:
                run(g0, g1, g2, stream, *mid, meta, enter, leave, *args)
            except (TypeError, AttributeError):
                launch.refused()
                self.launches[n] = (None,) * 9 + (jit, launch)
                _replay_jit(jit, roles)
                continue
            launch.checked = True
        self.direct = any(entry[0] is not None for entry in self.launches)
        self.checked = same_device


def _launch_metadata(run, compiled, grid, stream, args):
    """What a launch hook gets (the compiled kernel's launch metadata), from the arguments as the JIT
    passes them."""
    return compiled.launch_metadata(grid, stream, *(run.described(args) if type(run) is _Mapped else args))


def _fill_template(args: list) -> tuple:
    """(the argument list with the constants in place and None where a role goes, [(position, kind,
    what) of each role or descriptor])."""
    return ([x if kind == _CONST else None for kind, x in args],
            [(i, kind, x) for i, (kind, x) in enumerate(args) if kind != _CONST])


def _direct(launch, grid, compiled, args: list, kwargs: dict) -> tuple:
    """(run, mid, compiled, grid, g0, g1, g2, bound template, its fills) of a launch that can go
    straight to its compiled kernel's launcher, else nine Nones: `run(g0, g1, g2, stream, *mid,
    launch metadata, enter hook, exit hook, *arguments)` launches it, run being the launcher
    (mid: the kernel's function and packed metadata) or its C launch function (`_raw`)."""
    names, defaults = getattr(launch, "names", None), getattr(launch, "defaults", None)
    if names is None or getattr(launch, "jit_only", True) or launch.kernel.pre_run_hooks or not launchable(compiled):
        return (None,) * 9
    bound = [*args, *[kwargs[name] if name in kwargs else (_CONST, defaults[name]) for name in names[len(args):]]]
    g0, g1, g2 = (*grid, 1, 1)[:3]
    raw = _raw(compiled)
    run, mid = (compiled.run, (compiled.function, compiled.packed_metadata)) if raw is None else \
        (_Mapped.of(raw[0]) or raw[0], (compiled.function, *raw[1], compiled.packed_metadata))
    template, fills = _fill_template(bound)
    if type(run) is _Mapped:
        fills = run.take(fills)
    return (run, mid, compiled, grid, g0, g1, g2, template, fills)


class _Mapped:
    """A kernel's C launch function behind Triton's wrapper for TMA descriptor arguments
    (triton.backends.nvidia.driver's wrap_handle_tensordesc), which turns each descriptor into a
    tensor map (`make_tensordesc_arg`: the CUDA driver's encoding of the data's address, shape,
    strides, block and swizzle) at every launch. Within a plan each descriptor argument has one
    shape, strides, block and layout (`take` keeps them), so a replay passes the descriptor's data
    alone (no descriptor built) and its map is made only for an address it has not seen among the
    last few (a training loop's tensors mostly come back at the same addresses, or alternate
    between two); the launch copies the map into the kernel's parameters. With a launch hook
    active (a profiler's) Triton's wrapper itself, on descriptors built as the recording's.
    `of(wrapper)`: None where the wrapper is not one this reads (the descriptors' positions, their
    metadata, the launch function: a verified Triton's)."""

    ADDRESSES = 8  # maps kept a descriptor: the addresses its data came at most recently (then forgotten)

    def __init__(self, wrapper, launch, head: int, where: dict, make):
        self.wrapper, self.launch, self.head, self.where, self.make = wrapper, launch, head, where, make
        self.specs: dict = {}  # kernel argument position -> the recorded descriptor (_desc's spec)
        self.order: list = []  # [(position, metadata, its maps)] of the descriptors a replay passes as data
        self.maps: dict = {}  # kernel argument position -> {data address: the map's arguments}

    @classmethod
    def of(cls, wrapper):
        code, cells = getattr(wrapper, "__code__", None), getattr(wrapper, "__closure__", None)
        if code is None or not cells or code.co_name != "inner":
            return None
        free = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
        launch, positions, metas = free.get("launcher"), free.get("tensordesc_indices"), free.get("tensordesc_meta")
        head, make = wrapper.__globals__.get("_BASE_ARGS_FORMAT_LEN"), wrapper.__globals__.get("make_tensordesc_arg")
        if launch is None or not positions or not metas or None in metas or head is None or make is None:
            return None  # no metadata: the wrapper passes the tensor itself (nothing to reuse)
        return cls(wrapper, launch, head, dict(zip(sorted(positions), metas)), make)

    def take(self, fills: list) -> list:
        """A plan's fills (_fill_template's) with each descriptor this maps filled by its data alone,
        the descriptor's spec kept here."""
        taken = []
        for i, kind, x in fills:
            if kind == _DESC and i in self.where:
                self.specs[i] = x
                kind, x = _ROLE, x[0]
            taken.append((i, kind, x))
        self.order = sorted((i, self.where[i], self.maps.setdefault(i, {})) for i in self.specs)
        return taken

    def described(self, args: list) -> list:
        """Kernel arguments as the JIT passes them: each descriptor's data as its descriptor."""
        return [_desc_on(a, self.specs[i]) if i in self.specs else a for i, a in enumerate(args)]

    def __call__(self, *args):
        head = self.head
        if args[head - 2] is not None or args[head - 1] is not None:  # an enter or exit hook
            return self.wrapper(*args[:head], *self.described(args[head:]))
        final = list(args[:head])
        start = head
        for i, meta, maps in self.order:
            at = head + i
            final.extend(args[start:at])
            data = args[at]
            ptr = data.data_ptr()
            made = maps.get(ptr)
            if made is None:
                if len(maps) >= self.ADDRESSES:
                    maps.clear()
                made = maps[ptr] = self.make(_desc_on(data, self.specs[i]), meta)
            final.extend(made)
            start = at + 1
        final.extend(args[start:])
        return self.launch(*final)


def _replay_jit(jit, roles) -> None:
    """One recorded launch through its CachedLaunch (`launch[grid]`), the call's roles filled in."""
    go, args, fills, kwargs, kw_fills = jit
    go(*_filled(args, fills, roles), **(_filled(kwargs, kw_fills, roles) if kw_fills else kwargs))


def _filled(template, fills, roles):
    """A copy of an argument list's (or keyword dict's) template with this call's tensors and
    descriptors put where the recording had its roles ([(position or name, kind, what)])."""
    args = template.copy()
    for i, kind, x in fills:
        args[i] = roles[x] if kind == _ROLE else _desc(x, roles)
    return args


_CONST, _ROLE, _DESC = 0, 1, 2
_new = object.__new__


def _desc(x, roles):
    return _desc_on(roles[x[0]], x)


def _desc_on(data, x):
    _, cls, shape, strides, block, layout = x
    d = _new(cls)  # the recording's descriptor, on this call's data (its checks passed then)
    d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = \
        data, list(shape), list(strides), list(block), layout, "zero"
    return d


class Plans:
    """Plans by call signature, at most MAX_ENTRIES (then cleared); a signature that got no plan is
    remembered as such (NO_PLAN) and runs its full path every call."""

    MAX_ENTRIES = 256
    NO_PLAN = False

    def __init__(self):
        self.plans: dict = {}

    def get(self, key):
        return self.plans.get(key)

    def clear(self) -> None:
        """Forget every plan: the next call of each signature runs its full path (recorded)."""
        self.plans.clear()

    def put(self, key, plan) -> None:
        if len(self.plans) >= self.MAX_ENTRIES:
            self.plans.clear()
        self.plans[key] = self.NO_PLAN if plan is None else plan


class KeptScratch:
    """With LMPERF_FA_KEEP_SCRATCH=1 (keep_scratch; off by default, the host's time a call the same within
    the noise), the scratch buffers of plans' replays (a split's partial sums, the backward's Delta), kept
    for the next replay of the same plan on the same stream rather than allocated afresh: a call's kernels
    write its scratch before they read it, and calls on one stream run in order, so a replay reuses what
    the last one there used as the caching allocator would hand back a freed block; an allocation is
    several us of host time a buffer on a slow host, which calls of small shapes, their GPU time below the
    host's, pay in full (tuning/flash_attention/NOTES.md step 81). Fresh buffers instead while a CUDA graph is being
    captured (the graph's own memory pool; a captured graph must not share a buffer that calls outside
    it write), for a plan's replays past the first `MAX_STREAMS` streams, and past `max_bytes` kept in
    all (a plan's buffers count from its first keeping until it is gone: Plans.clear)."""

    MAX_STREAMS = 4

    def __init__(self, max_bytes: int = 64 << 20):
        self.max_bytes, self.bytes = max_bytes, 0

    def buffers(self, plan: Plan) -> list:
        """The scratch buffers of a replay of `plan` (a list its caller does not change): fresh ones
        unless keeping is on (keep_scratch)."""
        if not keep_scratch():
            return [new() for new in plan.scratch]
        where, capturing = (current_stream(), capturing_graph()) if plan.scratch_cuda else (None, False)
        kept = plan.kept.get(where)
        if kept is not None and not capturing:
            return kept
        made = [new() for new in plan.scratch]
        if not capturing and len(plan.kept) < self.MAX_STREAMS and self.bytes + plan.scratch_bytes <= self.max_bytes:
            plan.kept[where] = made
            self.bytes += plan.scratch_bytes
            weakref.finalize(plan, self._release, plan.scratch_bytes)
        return made

    def _release(self, nbytes: int) -> None:
        self.bytes -= nbytes


def capturing_graph() -> bool:
    """Whether the current CUDA stream is capturing a graph (CUDA scratch only: a CPU-only build of
    torch has no such call)."""
    return torch.cuda.is_current_stream_capturing()


KEPT_SCRATCH = KeptScratch()  # every plan's, in this process
KEEP_SCRATCH_ENV = "LMPERF_FA_KEEP_SCRATCH"  # "1": plans keep their scratch (KeptScratch); "0" or unset: fresh
# buffers at every replay (off by default until its host time is measured faster outside the noise)


def keep_scratch() -> bool:
    """Whether plans' replays keep their scratch buffers (KEEP_SCRATCH_ENV)."""
    return getenv(KEEP_SCRATCH_ENV) == "1"


# ---------------------------------------------------------------------------------------------
# FlashAttention's plans: the eager calls' (flash_attention_triton) and the Gluon ops'

PLANS = Plans()  # the eager calls' plans (launch mode "plan"), by plan_key
# the variables the dispatch reads: the forward's backend (flash_attention_gluon.BACKEND_ENV) and the backward's
DISPATCH_ENV = ("LMPERF_FA_BACKEND", "LMPERF_FA_BWD_BACKEND")


def plan_key(kind: tuple, inputs: tuple) -> tuple:
    """A call's plan key: its tensors' `signature`, its kind and flags, the dispatch's variables, and
    whether a CUDA graph is being captured (the tile kernels' configs differ: flash_attention_triton.host_launched)."""
    return signature(inputs, (*kind, *map(getenv, DISPATCH_ENV), captured(inputs[0])))


def captured(t: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream, for a call on `t`'s device."""
    return t.is_cuda and capturing_graph()


def then_key(first: tuple, kind: tuple, known: tuple, new: torch.Tensor) -> tuple:
    """The plan key of a call whose tensors are `known`, then `new`, where `known` are the tensors of
    the call whose key is `first` and what that call made (the backward's q, k, v, O and L after its
    forward): only the new tensor is read (its `signature`, its aliasing with the known ones); the
    dispatch's variables and a graph's capture as plan_key reads them."""
    p = new.data_ptr()
    alias = next((i for i, t in enumerate(known) if t.data_ptr() == p), len(known))
    return (first, *kind, (new.shape, new.stride(), new.dtype, new.device, p % 16 == 0, alias),
            *map(getenv, DISPATCH_ENV), captured(new))


def launch_in_place(kind: tuple, inputs: tuple, launch) -> None:
    """launch(), which writes its results into tensors among `inputs` (what it returns is dropped):
    with plans on (planning), replayed from the plan of the call's signature (planned), else called.
    What a Gluon kernel's op that writes in place runs (torch.compile's graphs call the ops)."""
    if planning():
        planned(kind, inputs, lambda: (launch(), ())[1])
    else:
        launch()


def planned(kind: tuple, inputs: tuple, run, key: tuple | None = None) -> tuple:
    """run()'s outputs, the kernels it launches for these inputs replayed from the plan of their call
    signature (signature) where there is one: the dispatch, its checks and descriptors
    were done at the signature's first call, which run() made and recorded. A signature whose call
    makes a copy of its own has no plan and runs run() every time; its scratch buffers (a split's
    partial sums: scratch) are allocated afresh at each replay. Tensors the call
    writes in place are inputs (a role like any other); inside another call's recording, run()
    itself (a replay would not be recorded). `key`: the plan key where the caller has it (then_key),
    else plan_key(kind, inputs). Callers: FlashAttention2Triton's eager forward and backward, and
    the Gluon kernels' ops (what torch.compile's graphs call)."""
    if recording_now():
        return run()
    key = plan_key(kind, inputs) if key is None else key
    plan = PLANS.get(key)
    if plan:
        outs = plan.allocate()
        plan.replay((*inputs, *outs))
        return tuple(outs[:plan.n_outputs])
    if plan is None:  # the signature's first call: the full path, recorded
        with recording() as launches:
            outs = run()
        PLANS.put(key, Plan.build(launches, inputs, outs))
        return outs
    return run()
