"""The eager path's kernel launches (flash_attention_triton.CachedLaunch): Triton's JIT once per
specialisation, then the compiled kernel's own launcher with the same arguments; on the CPU with a
stand-in kernel (what is launched, with which arguments, and when the JIT is asked again), on a
GPU with the real kernels (the same bits as launching through the JIT every time)."""
import pytest
import torch

from lmperf.kernels import flash_attention_triton as ft
from lmperf.kernels import launch as kl

CUDA = torch.cuda.is_available()


class _Param:
    def __init__(self, name, default=None):
        self.name, self.default = name, default


class _Compiled:
    packed_metadata = "packed"
    function = "function"

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *args):
        return ("meta", grid, stream)

    def run(self, *args):
        self.runs.append(args)


class _Kernel:
    """Stands in for a triton.JITFunction: kernel[grid](*args, **kwargs) "compiles" (a fresh
    _Compiled) and launches; it records each JIT call."""
    arg_names = ["X", "n", "BLOCK"]
    params = [_Param("X"), _Param("n"), _Param("BLOCK", 16)]

    def __init__(self):
        self.pre_run_hooks = []
        self.jit_calls = []
        self.made = []

    def __getitem__(self, grid):
        def go(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            self.made.append(_Compiled())
            return self.made[-1]
        return go


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.setattr(kl, "current_stream", lambda: (0, 1234))
    monkeypatch.setenv(kl.LAUNCH_ENV, "cache")
    return _Kernel()


def test_second_call_goes_to_the_compiled_launcher_with_the_kernels_arguments(kernel):
    from triton import knobs
    x = torch.zeros(64)
    launch = kl.CachedLaunch(kernel)
    launch[(3, 2)](x, 7, num_warps=4)
    assert len(kernel.jit_calls) == 1
    launch[(5,)](x, 7, num_warps=4)
    assert len(kernel.jit_calls) == 1, "the same specialisation went through the JIT again"
    (run,) = kernel.made[0].runs
    assert run[:7] == (5, 1, 1, 1234, "function", "packed", ("meta", (5,), 1234))
    assert run[7] is knobs.runtime.launch_enter_hook and run[8] is knobs.runtime.launch_exit_hook
    assert run[9] is x and run[10:] == (7, 16)  # parameter order, the default filled in


def test_a_new_specialisation_takes_the_jit(kernel):
    x = torch.zeros(64, dtype=torch.float16)
    launch = kl.CachedLaunch(kernel)
    launch[(1,)](x, 7)
    launch[(1,)](x, 8)  # another int value
    launch[(1,)](x[1:], 8)  # 2 bytes past x: not 16-byte aligned
    launch[(1,)](x.float(), 8)  # another dtype
    launch[(1,)](x, 8, BLOCK=32)  # another constexpr
    launch[(1,)](x, 8, num_warps=8)  # another option
    assert len(kernel.jit_calls) == 6
    assert all(not c.runs for c in kernel.made)
    launch[(1,)](torch.zeros(64, dtype=torch.float16), 8)  # another aligned tensor: the key of call 2
    assert len(kernel.jit_calls) == 6 and len(kernel.made[1].runs) == 1
    launch[(1,)](8, x)  # a tensor where an int was: another key
    assert len(kernel.jit_calls) == 7


def test_the_cache_holds_no_tensor(kernel):
    launch = kl.CachedLaunch(kernel)
    for n in range(5):
        launch[(1,)](torch.zeros(64), n, BLOCK=torch.float32)

    def leaves(x):
        if isinstance(x, tuple):
            for y in x:
                yield from leaves(y)
        else:
            yield x
    assert len(launch.compiled) == 5
    assert not any(isinstance(x, torch.Tensor) for key in launch.compiled for x in leaves(key))


def test_the_jit_every_time_where_asked_or_not_keyed(kernel, monkeypatch):
    launch = kl.CachedLaunch(kernel)
    x = torch.zeros(64)
    launch[(1,)](x, [1, 2])  # an argument type the key does not read
    launch[(1,)](x, [1, 2])
    assert len(kernel.jit_calls) == 2
    monkeypatch.setenv(kl.LAUNCH_ENV, "jit")
    launch[(1,)](x, 3)
    launch[(1,)](x, 3)
    assert len(kernel.jit_calls) == 4
    monkeypatch.delenv(kl.LAUNCH_ENV)  # the default: the JIT
    launch[(1,)](x, 3)
    assert len(kernel.jit_calls) == 5
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    monkeypatch.setenv(kl.LAUNCH_ENV, "cache")
    launch[(1,)](x, 3)
    launch[(1,)](x, 3)
    assert len(kernel.jit_calls) == 7
    assert all(not c.runs for c in kernel.made)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the compiled kernels' launchers")
@pytest.mark.parametrize("shape,causal", [((2, 4, 384, 64), True), ((3, 256, 128), False), ((1, 2, 200, 80), True)])
def test_cached_launches_give_the_jits_bits(shape, causal, monkeypatch):
    torch.manual_seed(0)

    def run():
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        out = ft.FlashAttention2Triton.apply(q, k, v, causal)
        out.backward(torch.randn_like(out))
        return [out.detach(), q.grad, k.grad, v.grad]

    monkeypatch.setenv(kl.LAUNCH_ENV, "jit")
    torch.manual_seed(1)
    want = run()
    monkeypatch.setenv(kl.LAUNCH_ENV, "cache")
    for _ in range(3):  # the first call through the JIT, the others through the cache
        torch.manual_seed(1)
        got = run()
        for a, b in zip(got, want):
            assert torch.equal(a, b)
