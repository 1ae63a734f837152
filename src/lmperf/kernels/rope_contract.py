"""What rotary position embedding computes, in PyTorch: the rotation the model applies to its
queries and keys, and the one the RoPE kernel (kernels/rope.py) is checked against."""
from __future__ import annotations

import torch


def apply_rope(x, cos, sin):
    """Rotate consecutive pairs (x[2i], x[2i+1]) of the last dim by the position's angle."""
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)
