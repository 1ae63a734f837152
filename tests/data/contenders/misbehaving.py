"""A contender that misbehaves by shape (tests/test_contenders.py): for N == 13 it hangs, for N == 14
it kills its process, for N == 15 it returns the wrong shape; otherwise it is lmperf's own kernel."""
import os
import time

from lmperf.kernels.flash_attention_torch import FlashAttention2PyTorch


class Misbehaving(FlashAttention2PyTorch):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        n = q.shape[-2]
        if n == 13:
            time.sleep(3600)
        if n == 14:
            os._exit(9)
        out = FlashAttention2PyTorch.forward(ctx, q, k, v, is_causal)
        return out[..., :-1, :].clone() if n == 15 else out


def get_flashattention_autograd_function_pytorch():
    return Misbehaving
