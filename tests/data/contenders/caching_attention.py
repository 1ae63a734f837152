"""A contender that returns the result it cached for the same input storage (tests/test_contenders.py):
right on the first call of every tensor, stale once the tensor's contents change in place."""
from lmperf.kernels.flash_attention_torch import FlashAttention2PyTorch, forward_with_lse

_cache = {}


class Caching(FlashAttention2PyTorch):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), is_causal, tuple(q.shape), q.dtype)
        if key not in _cache:
            _cache[key] = forward_with_lse(q, k, v, is_causal)
        out, lse = _cache[key]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out.clone()


def get_flashattention_autograd_function_pytorch():
    return Caching
