"""A contender that cheats a timer (tests/test_contenders.py, on a GPU): its attention runs
PyTorch's SDPA on a CUDA stream of its own and returns without making the caller's stream wait, so
events on the caller's stream see only the launch; the output is right once the device has
synchronised. Backward likewise."""
import torch
import torch.nn.functional as F

_SIDE = {}


def _side_stream(device):
    if device not in _SIDE:
        _SIDE[device] = torch.cuda.Stream(device=device)
    return _SIDE[device]


class SideStreamAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        side = _side_stream(q.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = F.scaled_dot_product_attention(*[t.unsqueeze(0) for t in leaves], is_causal=is_causal)[0]
        ctx.side = (leaves, out)
        lse = torch.zeros(q.shape[:-1], device=q.device, dtype=torch.float32)
        ctx.save_for_backward(lse)
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        leaves, out = ctx.side
        side = _side_stream(grad.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            grads = torch.autograd.grad(out, leaves, grad, retain_graph=True)
        return (*grads, None)


def get_flashattention_autograd_function_triton():
    return SideStreamAttention
