"""lmperf: a reproducible systems report for a GPT-style Transformer LM and Triton kernels."""
__version__ = "0.1.0"
