"""A contender whose attention is wrong: it forgets the 1/sqrt(D) scale (tests/test_contenders.py)."""
import torch


class NoScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        s = q.float() @ k.float().transpose(-2, -1)
        if is_causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.softmax(s, -1)
        out = (p @ v.float()).to(q.dtype)
        ctx.save_for_backward(q, k, v, p, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, p, lse = ctx.saved_tensors
        dv = p.transpose(-2, -1) @ g.float()
        dp = g.float() @ v.float().transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True))
        return (ds @ k.float()).to(q.dtype), (ds.transpose(-2, -1) @ q.float()).to(k.dtype), dv.to(v.dtype), None


def get_flashattention_autograd_function_pytorch():
    return NoScale
