"""torch.compile against eager mode, bit for bit: the FlashAttention kernels' tests share it."""
import torch


def assert_compiled_matches_eager(apply, xs, causal: bool) -> None:
    """torch.compile(apply, fullgraph=True) (no graph break) on xs (leaves requiring grad) gives the
    eager call's output and, after .sum().backward(), its gradients bit for bit."""
    import torch._dynamo
    torch._dynamo.reset()
    compiled = torch.compile(apply, fullgraph=True)
    out = compiled(*xs, causal)
    out.sum().backward()
    ys = [t.detach().clone().requires_grad_() for t in xs]
    ref = apply(*ys, causal)
    ref.sum().backward()
    assert torch.equal(out, ref)
    for a, b in zip(xs, ys):
        assert torch.equal(a.grad, b.grad)
