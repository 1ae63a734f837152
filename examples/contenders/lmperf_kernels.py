"""lmperf's own kernels behind the CS336 assignment-2 adapter functions: a contender that should
agree with ours everywhere (the report shows it beside ours; its rows must match within noise).

    make report CONTENDERS=examples/contenders/lmperf_kernels.py
"""
from lmperf.kernels.flash_attention_torch import FlashAttention2PyTorch
from lmperf.kernels.flash_attention_triton import FlashAttention2Triton


def get_flashattention_autograd_function_pytorch() -> type:
    return FlashAttention2PyTorch


def get_flashattention_autograd_function_triton() -> type:
    return FlashAttention2Triton
