"""lmperf: a reproducible systems report for a GPT-style Transformer LM and Triton kernels.

The kernels are imported on first use (torch and triton are heavy, and the Snakefile imports
this package to plan the workflow):

    from lmperf import FlashAttention2Triton, FlashAttention2PyTorch, lrpe_cosine_md
"""
__version__ = "0.1.0"

_LAZY = {
    "FlashAttention2PyTorch": "lmperf.kernels.flash_attention_torch",
    "FlashAttention2Triton": "lmperf.kernels.flash_attention_triton",
    "lrpe_cosine_md": "lmperf.kernels.lrpe",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lmperf' has no attribute {name!r}")
