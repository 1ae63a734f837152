"""What the fused kernels (rmsnorm.py, swiglu.py, rope.py) share to become PyTorch ops: the
registration FlashAttention uses (a `torch.library.triton_op` that torch.compile traces into and
Inductor launches; under Triton's interpreter an opaque `custom_op` with a fake, since the
interpreter would run the kernels on a trace's data-less tensors), the check that a CPU tensor
only reaches a Triton kernel under the interpreter, and the launch sizes that depend on the GPU.
`opaque_op` registers the Gluon kernels' ops, which torch.compile calls as they are.
"""
from __future__ import annotations

import functools
import os

import torch
from torch.library import custom_op, triton_op

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_LIBRARIES: dict[str, torch.library.Library] = {}  # namespace: the fragment opaque_op defines its ops in
OPAQUE_OPS: list[str] = []  # every op opaque_op has defined, by qualified name (the tests' inventory)


def register(name: str, fake):
    """Decorator: `fn` as the op `name` (see the module docstring); `fake(*args)` gives its
    outputs' shapes, dtypes and strides under the interpreter. Schema, autograd (register it on
    the returned op) and results are the same either way."""
    def wrap(fn):
        if not INTERPRET:
            return triton_op(name, mutates_args=())(fn)
        op = custom_op(name, mutates_args=())(fn)
        op.register_fake(fake)
        return op
    return wrap


def opaque_op(qualname: str, mutates_args: tuple[str, ...], fake):
    """Decorator: `fn` as the PyTorch op `qualname` ("namespace::name"), its schema from fn's type
    hints (written in place: the arguments named in mutates_args), opaque to torch.compile (a
    compiled graph calls it, so it launches what eager mode launches), `fake(*args)` giving a
    trace its outputs. Returns the op. Defined on the dispatcher itself (Library.define and impl),
    not through custom_op, whose autograd and in-place wrappers cost more host time a call than
    the op's own launch (tuning/flash_attention/NOTES.md, step 51); the op has no autograd
    formula: its callers differentiate it (an autograd.Function)."""
    namespace, name = qualname.split("::")

    def wrap(fn):
        if namespace not in _LIBRARIES:
            _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
        lib = _LIBRARIES[namespace]
        lib.define(name + torch.library.infer_schema(fn, mutates_args=mutates_args))
        lib.impl(name, fn, "CompositeExplicitAutograd")
        torch.library.register_fake(qualname, fake, lib=lib)
        OPAQUE_OPS.append(qualname)
        return getattr(getattr(torch.ops, namespace), name)
    return wrap


def check_device(t: torch.Tensor, who: str) -> None:
    """Triton kernels run on CUDA tensors, or on CPU tensors in Triton's interpreter."""
    if t.device.type != "cuda" and not INTERPRET:
        raise RuntimeError(f"{who} got {t.device.type} tensors: its Triton kernels run on CUDA tensors, or on "
                           "the CPU in Triton's interpreter: set TRITON_INTERPRET=1 in the environment before "
                           "triton and lmperf are imported")


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 2 in the interpreter (small grids that still
    split work over several programs)."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a, b):
    """ceil(a / b) in plain Python (also on a trace's symbolic sizes)."""
    return (a + b - 1) // b


def num_warps(tile_elements: int) -> int:
    """Warps for an elementwise or row tile of this many elements: 4 up to 2K, 8 up to 8K, 16
    above (16 elements or fewer a thread)."""
    return 4 if tile_elements <= 2048 else 8 if tile_elements <= 8192 else 16
