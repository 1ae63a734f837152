"""FLOP counts for model FLOPs utilisation (MFU).

Convention (PaLM, appendix B): a token costs 6N + 12*L*T*d FLOPs in a training step and
2N + 4*L*T*d in a forward pass, where N counts the parameters that take part in matrix
multiplies (every parameter except the token embedding, whose lookup is free, and the RMSNorm
gains), L is the number of layers, T the context length and d = d_model. The attention term
counts both attention matmuls (QK^T and PV) over the full T x T square, causal or not.
"""
from __future__ import annotations

from lmperf.model import ModelConfig


def matmul_parameters(cfg: ModelConfig) -> int:
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    return cfg.n_layers * (4 * d * d + 3 * d * f) + d * v


def flops_per_token(cfg: ModelConfig, context: int, mode: str) -> float:
    n = matmul_parameters(cfg)
    attention = 4 * cfg.n_layers * context * cfg.d_model  # forward: QK^T and PV, 2 FLOPs per MAC
    if mode == "forward":
        return 2 * n + attention
    if mode == "train":
        return 6 * n + 3 * attention
    raise ValueError(f"mode={mode!r}; expected 'forward' or 'train'")
