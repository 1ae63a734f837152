"""How the FlashAttention kernels are launched in eager mode, without their ops' dispatch
(flash_attention_triton.py's and the Gluon kernels'): `plain_launch(kernel)[grid](*args)`, through
Triton's JIT, or with LMPERF_FA_LAUNCH=cache through a cache of the compiled kernels' launchers
(CachedLaunch), which skips the JIT's per-call work. LMPERF_FA_LAUNCH=plan adds plans (Plan): a
call's launches recorded once per call signature and replayed, which skips the dispatch's checks,
rules and descriptor building as well."""
from __future__ import annotations

import contextlib
import operator
import os

import torch

LAUNCH_ENV = "LMPERF_FA_LAUNCH"  # "cache": eager launches through CachedLaunch; "plan": plans too (Plan);
# else (the default) Triton's JIT. Off by default: the launch cache's saving, 0.1-0.25 ms a forward+backward,
# was inside the host's noise across processes (tuning/flash_attention/NOTES.md, step 44), and it calls the
# compiled kernel's launcher, an interface of Triton's that is not public


def current_stream():
    """(device index, raw stream) where a launch goes now: the current CUDA device's current stream
    (a capture's, under torch.cuda.graph), as Triton's JIT takes it."""
    from triton.runtime import driver
    device = driver.active.get_current_device()
    return device, driver.active.get_current_stream(device)


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
    strides, block and layout; the launcher fills each one afresh at every launch, as the JIT's does."""

    MAX_ENTRIES = 512

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = tuple(kernel.arg_names)
        self.defaults = {p.name: p.default for p in kernel.params}
        self.compiled: dict = {}
        self.picks: dict = {}

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
        if self.kernel.pre_run_hooks or callable(grid) or os.environ.get(LAUNCH_ENV) not in ("cache", "plan"):
            return self.kernel[grid](*args, **kwargs)
        device, stream = current_stream()
        try:
            key = self._key(device, args, kwargs)
        except TypeError:
            return self.kernel[grid](*args, **kwargs)
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if hasattr(compiled, "packed_metadata"):
                if len(self.compiled) >= self.MAX_ENTRIES:
                    self.compiled.clear()
                self.compiled[key] = compiled
            return compiled
        from triton import knobs
        bound = self.bound(args, kwargs)
        g0, g1, g2 = (*grid, 1, 1)[:3]
        compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *bound), knobs.runtime.launch_enter_hook,
                     knobs.runtime.launch_exit_hook, *bound)
        return compiled


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
    if os.environ.get("TRITON_INTERPRET") == "1":
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
    """What plain_launch saw during a call: its launches (launch, grid, args, kwargs), and the
    scratch buffers the call made (`scratch`)."""

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
            self.into.append((self.launch, grid, args, kwargs))
            return self.launch[grid](*args, **kwargs)
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


def planning() -> bool:
    """Whether eager calls go through plans (LMPERF_FA_LAUNCH=plan; not in Triton's interpreter)."""
    return os.environ.get(LAUNCH_ENV) == "plan" and os.environ.get("TRITON_INTERPRET") != "1"


def signature(tensors, extra=()) -> tuple:
    """What a call's launches depend on in its tensors: each one's shape, strides, dtype, device and
    16-byte alignment, and which of them share their data (the first tensor with the same address);
    then `extra`, the rest the caller's dispatch reads (its flags, its settings)."""
    ptrs = [t.data_ptr() for t in tensors]
    return (tuple((t.shape, t.stride(), t.dtype, t.device, p % 16 == 0) for t, p in zip(tensors, ptrs)),
            tuple(ptrs.index(p) for p in ptrs), tuple(extra))


class Plan:
    """The launches of one call, replayable for any call of the same signature (`signature`): the
    kernels and grids as recorded; each argument a constant, a role (the i-th tensor of the call:
    its inputs, then its outputs), or a TMA descriptor of a role's data (shape, strides, block and
    layout as recorded, built without Triton's checks, which it passed at the recording); and the
    outputs and scratch buffers to allocate (shape, strides, dtype). A call whose launches read a
    tensor that is none of its roles (a copy made inside) gets no plan (`build` returns None)."""

    def __init__(self, launches, outputs, n_outputs):
        self.launches, self.outputs, self.n_outputs = launches, outputs, n_outputs

    @classmethod
    def build(cls, rec: Recording, inputs, outputs):
        launches = rec.launches
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
            for launch, grid, args, kwargs in launches:
                if callable(grid):
                    return None
                args, kwargs = [template(a) for a in args], {k: template(v) for k, v in kwargs.items()}
                # the constants as they are, and where the call's tensors and descriptors go
                recorded.append((launch[grid], [x if kind == _CONST else None for kind, x in args],
                                 [(i, kind, x) for i, (kind, x) in enumerate(args) if kind != _CONST],
                                 {k: x for k, (kind, x) in kwargs.items() if kind == _CONST},
                                 [(k, kind, x) for k, (kind, x) in kwargs.items() if kind != _CONST]))
        except LookupError:
            return None
        return cls(recorded, [None if t is None else (tuple(t.shape), t.stride(), t.dtype) for t in outputs],
                   len(outputs) - len(rec.scratch))

    def allocate(self, device) -> list:
        """The call's outputs, then its scratch buffers: fresh, uninitialised."""
        return [None if o is None else torch.empty_strided(o[0], o[1], dtype=o[2], device=device)
                for o in self.outputs]

    def replay(self, roles) -> None:
        for go, args, fills, kwargs, kw_fills in self.launches:
            args = args.copy()
            for i, kind, x in fills:
                args[i] = roles[x] if kind == _ROLE else _desc(x, roles)
            if kw_fills:
                kwargs = kwargs.copy()
                for k, kind, x in kw_fills:
                    kwargs[k] = roles[x] if kind == _ROLE else _desc(x, roles)
            go(*args, **kwargs)


_CONST, _ROLE, _DESC = 0, 1, 2
_new = object.__new__


def _desc(x, roles):
    i, cls, shape, strides, block, layout = x
    d = _new(cls)  # the recording's descriptor, on this call's data (its checks passed then)
    d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = \
        roles[i], list(shape), list(strides), list(block), layout, "zero"
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

    def put(self, key, plan) -> None:
        if len(self.plans) >= self.MAX_ENTRIES:
            self.plans.clear()
        self.plans[key] = self.NO_PLAN if plan is None else plan
