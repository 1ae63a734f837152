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


def closed_form_attention(cfg: ModelConfig, context: int, mode: str) -> float:
    """The attention term of flops_per_token alone (per token)."""
    attention = 4 * cfg.n_layers * context * cfg.d_model
    return attention if mode == "forward" else 3 * attention


# ---------------------------------------------------------------------------------------------
# Counting what runs: torch.utils.flop_counter.FlopCounterMode counts the matmul-like ops it has
# formulas for (mm, bmm, SDPA's CUDA kernels, ...) as they are dispatched. It has none for our
# FlashAttention-2 op, nor for SDPA's CPU flash kernel; register_attention_formulas() adds them.


def _flash_triton_forward_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    """Our forward kernel: two matmuls (S = QK^T, O = PV) over the full N x N square. Causal
    programs skip the key tiles past the diagonal, but the convention (PaLM's, and
    FlopCounterMode's for SDPA) counts the full square."""
    from torch.utils.flop_counter import sdpa_flop_count
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def _flash_triton_backward_flops(q_shape, k_shape, v_shape, out_shape_, lse_shape, grad_out_shape,
                                 *args, out_shape=None, **kwargs) -> int:
    """Our backward: two kernels, seven matmuls of the forward's size: the dQ
    kernel recomputes S and computes dP = dO V^T and dQ = dS K; the dK/dV kernel recomputes S
    (and P) and dP, and computes dV = P^T dO and dK = dS^T Q."""
    from torch.utils.flop_counter import sdpa_flop_count
    return 7 * sdpa_flop_count(q_shape, k_shape, v_shape) // 2


def register_attention_formulas() -> None:
    """Teach FlopCounterMode our FlashAttention-2 ops (torch.ops.lmperf.flash_attention_forward,
    ..._backward) and SDPA's CPU flash kernel (the same formulas torch uses for its CUDA flash
    kernel). Idempotent; imports the Triton kernel module (it registers the ops)."""
    import torch
    from torch.utils import flop_counter
    import lmperf.kernels.flash_attention_triton  # noqa: F401  (registers torch.ops.lmperf.*)

    aten = torch.ops.aten
    formulas = {torch.ops.lmperf.flash_attention_forward: (_flash_triton_forward_flops, False),
                torch.ops.lmperf.flash_attention_backward: (_flash_triton_backward_flops, False),
                # torch's own formulas, already wrapped to take shapes: registered raw
                aten._scaled_dot_product_flash_attention_for_cpu: (flop_counter.sdpa_flop, True),
                aten._scaled_dot_product_flash_attention_for_cpu_backward:
                    (flop_counter.sdpa_backward_flop, True)}
    for op, (formula, raw) in formulas.items():
        if op not in flop_counter.flop_registry:
            flop_counter.register_flop_formula(op, get_raw=raw)(formula)


# The ops whose FLOPs are attention's (score and value matmuls); every other counted op is a
# projection, MLP or LM-head matmul.
ATTENTION_OPS = ("bmm", "scaled_dot_product", "flash_attention", "efficient_attention",
                 "cudnn_attention")


def split_counts(counts: dict) -> dict[str, int]:
    """{'total', 'attention'} FLOPs of FlopCounterMode.get_flop_counts()['Global'] ({op: flops}).
    The model's only batched matmuls are attention's (the projections are 2-D mm)."""
    total = sum(counts.values())
    attention = sum(v for op, v in counts.items() if any(a in str(op) for a in ATTENTION_OPS))
    return {"total": total, "attention": attention}
