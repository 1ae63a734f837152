"""A contender whose attention kills its process whenever it runs (tests/test_contenders.py: the
ladder's contender rung is a `crashed` row, and the rungs after it run)."""
import os

from lmperf.kernels.flash_attention_torch import FlashAttention2PyTorch


class Crashing(FlashAttention2PyTorch):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        os._exit(9)


def get_flashattention_autograd_function_pytorch():
    return Crashing
