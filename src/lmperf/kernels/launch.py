"""How the FlashAttention kernels are launched in eager mode, without their ops' dispatch
(flash_attention_triton.py's and the Gluon kernels'): `plain_launch(kernel)[grid](*args)`, through
Triton's JIT, or with LMPERF_FA_LAUNCH=cache through a cache of the compiled kernels' launchers
(CachedLaunch), which skips the JIT's per-call work."""
from __future__ import annotations

import operator
import os

import torch

LAUNCH_ENV = "LMPERF_FA_LAUNCH"  # "cache": eager launches through CachedLaunch; else (the default) Triton's JIT
# (off by default: its saving, 0.1-0.25 ms a forward+backward, is inside the host's noise across processes so
# far, and it calls the compiled kernel's launcher, an interface of Triton's that is not public)


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
        if self.kernel.pre_run_hooks or callable(grid) or os.environ.get(LAUNCH_ENV) != "cache":
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


_CACHED_LAUNCHES: dict = {}
_PLAIN = frozenset((int, bool, float, str, type(None)))  # argument types keyed by value


def plain_launch(kernel):
    """How the eager path launches a kernel, without the op's dispatch: a CachedLaunch of it (the
    interpreter's kernels as they are)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return kernel
    launch = _CACHED_LAUNCHES.get(kernel)
    if launch is None:
        launch = _CACHED_LAUNCHES[kernel] = CachedLaunch(kernel)
    return launch
