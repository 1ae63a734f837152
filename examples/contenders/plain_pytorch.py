"""A small plain-PyTorch contender: FlashAttention-2's tiled forward and its recomputing backward
in PyTorch operations, a data-parallel wrapper that all-reduces each gradient after the backward,
and a sharded optimizer that keeps each parameter's optimizer state on one rank. No FSDP: its
adapters raise NotImplementedError, and lmperf reports those studies as not implemented.

    make report CONTENDERS=examples/contenders/plain_pytorch.py
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

TILE = 64


def _scores(q, k, causal, q0, k0):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        rows = torch.arange(q0, q0 + q.shape[-2], device=q.device)[:, None]
        cols = torch.arange(k0, k0 + k.shape[-2], device=q.device)[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
    return s


class TiledAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(D)) v for (batch, N, D) inputs, one key tile at a time (the online
    softmax: m is the running row maximum, l the running sum of exp(s - m)). Saves L = m + log l."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        qf, kf, vf = q.float(), k.float(), v.float()
        n = q.shape[-2]
        m = torch.full(q.shape[:-1], float("-inf"), device=q.device)
        l = torch.zeros(q.shape[:-1], device=q.device)
        acc = torch.zeros(qf.shape, device=q.device)
        for k0 in range(0, n, TILE):
            s = _scores(qf, kf[..., k0:k0 + TILE, :], is_causal, 0, k0)
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.exp(m - m_new).nan_to_num(0.0)
            p = torch.exp(s - m_new[..., None]).nan_to_num(0.0)
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ vf[..., k0:k0 + TILE, :]
            m = m_new
        out = (acc / l[..., None]).to(q.dtype)
        lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        qf, kf, vf, of, go = (t.float() for t in (q, k, v, out, grad_out))
        p = torch.exp(_scores(qf, kf, ctx.is_causal, 0, 0) - lse[..., None])
        dv = p.transpose(-2, -1) @ go
        dp = go @ vf.transpose(-2, -1)
        delta = (go * of).sum(-1, keepdim=True)
        ds = p * (dp - delta) / math.sqrt(q.shape[-1])
        dq, dk = ds @ kf, ds.transpose(-2, -1) @ qf
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def get_flashattention_autograd_function_pytorch() -> type:
    return TiledAttention


def get_flashattention_autograd_function_triton() -> type:
    raise NotImplementedError("this example has no Triton kernel")


class AllReduceAfterBackward(torch.nn.Module):
    """Data parallel at its plainest: rank 0's weights broadcast at the start, each gradient
    all-reduced (averaged) once the backward is done."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        world = dist.get_world_size()
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world


def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    return AllReduceAfterBackward(module)


def ddp_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    ddp_model.finish_gradient_synchronization()


def get_fsdp(module, compute_dtype=None):
    raise NotImplementedError("this example has no FSDP")


def fsdp_on_after_backward(fsdp_model, optimizer):
    raise NotImplementedError("this example has no FSDP")


def fsdp_gather_full_params(fsdp_model):
    raise NotImplementedError("this example has no FSDP")


class ShardedOptimizer(torch.optim.Optimizer):
    """Each parameter's optimizer step (and state) on one rank, parameters dealt round-robin;
    after the step each parameter is broadcast from its owner."""

    def __init__(self, params, optimizer_cls, **kwargs):
        params = list(params)
        self.owner = {}
        rank, world = dist.get_rank(), dist.get_world_size()
        for i, p in enumerate(params):
            self.owner[p] = i % world
        self.local = optimizer_cls([p for p in params if self.owner[p] == rank] or [torch.nn.Parameter(torch.zeros(1))],
                                   **kwargs)
        super().__init__(params, kwargs)

    def step(self, closure=None, **kwargs):
        loss = self.local.step(closure, **kwargs)
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self.owner[p])
        return loss

    def zero_grad(self, set_to_none: bool = True):
        super().zero_grad(set_to_none=set_to_none)


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    return ShardedOptimizer(params, optimizer_cls, **kwargs)
