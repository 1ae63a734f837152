"""What the fused kernels (rmsnorm.py, swiglu.py, rope.py) share to become PyTorch ops: the
registration FlashAttention uses (a `torch.library.triton_op` that torch.compile traces into and
Inductor launches; under Triton's interpreter an opaque `custom_op` with a fake, since the
interpreter would run the kernels on a trace's data-less tensors), the check that a CPU tensor
only reaches a Triton kernel under the interpreter, and the launch sizes that depend on the GPU.
"""
from __future__ import annotations

import functools
import os

import torch
from torch.library import custom_op, triton_op

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


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
