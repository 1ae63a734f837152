"""A training step's FLOPs as PyTorch counts them (torch.utils.flop_counter.FlopCounterMode, on
fake tensors: no memory, no time), beside the closed form MFU uses (lmperf.flops): the ladder's
check of that closed form, rung by rung.
"""
from __future__ import annotations

import functools

from lmperf.flops import register_attention_formulas, split_counts
from lmperf.model import ModelConfig


def route_attention_through_op(model) -> None:
    """Eager FlashAttention2Triton launches its kernels directly (no op dispatch, to save tens of
    us a call), which a dispatch mode such as FlopCounterMode cannot see; call the same kernels
    through their op (torch.ops.lmperf.flash_attention_forward, with its autograd) instead."""
    import torch

    def attend(q, k, v, is_causal):
        return torch.ops.lmperf.flash_attention_forward(q, k, v, is_causal)[0]
    for block in model.blocks:
        block.attn.attend = attend


# What a step's FLOP count depends on: the model's dims and these keys of its case (not the rung's
# compile, optimizer, fused kernels or float8, which count_step leaves out).
FLOP_KEYS = ("context", "batch_size", "attention", "checkpoint_every", "dtype")


def count_step(case: dict, dims: dict, device: str) -> dict[str, int]:
    """count_flops once per setting a process: the ladder's rungs that share FLOP_KEYS (most of
    them; about 5 s a count for the 2.7B model) share the count."""
    return _count_flops(tuple(sorted(dims.items())), tuple(case.get(k, 0) for k in FLOP_KEYS), device)


@functools.cache
def _count_flops(dims: tuple, setting: tuple, device: str) -> dict[str, int]:
    return count_flops(dict(zip(FLOP_KEYS, setting)), dict(dims), device)


PYTORCH_ATTENTION = ("plain", "sdpa")   # the model's attentions of PyTorch ops alone: they run on fake tensors


def count_flops(case: dict, dims: dict, device: str) -> dict[str, int]:
    """{'total', 'attention'} FLOPs of one training step (lmperf.train.step: forward with the
    loss, backward, optimizer) as FlopCounterMode counts them, on fake tensors of `device`: the
    ops dispatch as they would there (SDPA picks its kernel), with no memory and no compute.
    An optimizer update has no matmul, so FlopCounterMode counts none of it: plain SGD steps
    here in the case's optimizer's place (MasterWeightAdamW's Triton kernel cannot run on fake
    tensors)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from lmperf import train
    from lmperf.model import TransformerLM

    register_attention_formulas()
    cfg = ModelConfig(**dims, context_length=case["context"], attention=case["attention"])
    with torch.device("meta"):
        model = TransformerLM(cfg)
    if case["attention"] not in PYTORCH_ATTENTION:
        # ours, or a user's contender, whose code may launch a Triton kernel directly: on fake
        # tensors it would read their made-up addresses (an illegal memory access, and the CUDA
        # context lost). Counted through our op instead, whose fake kernel and FLOP formula are
        # the contract's: attention of these shapes does these FLOPs whoever computes it
        route_attention_through_op(model)
    train.checkpoint_blocks(model, case.get("checkpoint_every", 0))
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device=device)
        inputs, targets = train.random_tokens(cfg, case["batch_size"], case["context"], device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        with FlopCounterMode(display=False) as counter:
            train.step(model, optimizer, inputs, targets, train.autocast(case["dtype"], device))
    return split_counts(counter.get_flop_counts()["Global"])
