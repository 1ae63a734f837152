"""The eager path's kernel launches (flash_attention_triton.CachedLaunch): Triton's JIT once per
specialisation, then the compiled kernel's own launcher with the same arguments; on the CPU with a
stand-in kernel (what is launched, with which arguments, and when the JIT is asked again), on a
GPU with the real kernels (the same bits as launching through the JIT every time)."""
import functools
import gc
import inspect
import os
import subprocess
import sys

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
    assert run[:7] == (5, 1, 1, 1234, "function", "packed", None)  # no launch hook: no metadata for it
    assert run[7] is None and run[8] is None  # idle hooks: none for the launcher to call
    assert run[9] is x and run[10:] == (7, 16)  # parameter order, the default filled in
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)  # a hook (a profiler's): the launch's metadata for it
    try:
        launch[(5,)](x, 7, num_warps=4)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert kernel.made[0].runs[1][6] == ("meta", (5,), 1234)
    assert kernel.made[0].runs[1][7] is knobs.runtime.launch_enter_hook and kernel.made[0].runs[1][8] is None


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
    monkeypatch.setenv(kl.LAUNCH_ENV, "")  # unset: the JIT on a Triton whose launcher was not checked
    monkeypatch.setattr(kl, "DEFAULT_MODE", "plan")
    monkeypatch.setattr(kl, "VERIFIED_TRITON", ("0.0.",))
    kl.default_mode.cache_clear()
    launch[(1,)](x, 3)
    assert len(kernel.jit_calls) == 5
    kl.default_mode.cache_clear()
    kernel.pre_run_hooks.append(lambda *a, **k: None)
    monkeypatch.setenv(kl.LAUNCH_ENV, "cache")
    launch[(1,)](x, 3)
    launch[(1,)](x, 3)
    assert len(kernel.jit_calls) == 7
    assert all(not c.runs for c in kernel.made)


def test_the_default_mode_holds_on_a_checked_triton_only(monkeypatch):
    import triton
    monkeypatch.delenv(kl.LAUNCH_ENV, raising=False)
    kl.default_mode.cache_clear()
    try:
        want = kl.DEFAULT_MODE if triton.__version__.startswith(kl.VERIFIED_TRITON) else "jit"
        assert kl.launch_mode() == want
        monkeypatch.setattr(kl, "DEFAULT_MODE", "plan")
        monkeypatch.setattr(kl, "VERIFIED_TRITON", (triton.__version__,))
        kl.default_mode.cache_clear()
        assert kl.launch_mode() == "plan"
        monkeypatch.setattr(kl, "VERIFIED_TRITON", ("0.0.",))
        kl.default_mode.cache_clear()
        assert kl.launch_mode() == "jit"
        monkeypatch.setenv(kl.LAUNCH_ENV, "cache")  # the variable wins
        assert kl.launch_mode() == "cache"
    finally:
        kl.default_mode.cache_clear()


@pytest.mark.parametrize("missing", kl.LAUNCHER_ATTRS)
def test_a_compiled_kernel_without_the_launcher_is_launched_through_the_jit(kernel, missing):
    """A compiled kernel lacking what the cache calls (Triton's launcher is no public interface):
    every launch through the JIT, with the call's arguments."""
    class Partial:
        pass
    for name in set(kl.LAUNCHER_ATTRS) - {missing}:
        setattr(Partial, name, staticmethod(lambda *a: None) if name in ("run", "launch_metadata") else name)
    jit_calls = []

    class Kernel(_Kernel):
        def __getitem__(self, grid):
            return lambda *args, **kwargs: jit_calls.append((grid, args, kwargs)) or Partial()
    launch = kl.CachedLaunch(Kernel())
    x = torch.zeros(64)
    for n in range(3):
        launch[(n + 1,)](x, 7, BLOCK=32)
    assert jit_calls == [((n + 1,), (x, 7), {"BLOCK": 32}) for n in range(3)]
    assert not launch.compiled


@pytest.mark.parametrize("error", [TypeError, AttributeError])
def test_a_launcher_that_refuses_its_first_call_turns_the_cache_off_for_its_kernel(kernel, error):
    """The launcher raising TypeError or AttributeError at its first call (an argument list it does
    not take): that launch and every later one of the kernel through the JIT."""
    tried = []

    def refuse(*args):
        tried.append(args)
        raise error("launcher")
    launch = kl.CachedLaunch(kernel)
    x = torch.zeros(64)
    launch[(1,)](x, 7)  # the JIT: compiles
    kernel.made[0].run = refuse
    launch[(2,)](x, 7)  # the launcher refuses: the JIT again
    launch[(3,)](x, 7)
    assert len(tried) == 1 and launch.jit_only
    assert [c[0] for c in kernel.jit_calls] == [(1,), (2,), (3,)]
    assert all(c[1] == (x, 7) for c in kernel.jit_calls)


def test_a_launcher_error_after_its_first_call_is_raised(kernel):
    """Once the launcher has taken a call, its errors are the launch's (not hidden by the JIT)."""
    launch = kl.CachedLaunch(kernel)
    x = torch.zeros(64)
    launch[(1,)](x, 7)
    launch[(1,)](x, 7)  # the launcher: taken
    kernel.made[0].run = lambda *a: (_ for _ in ()).throw(TypeError("launcher"))
    with pytest.raises(TypeError, match="launcher"):
        launch[(1,)](x, 7)


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


# ---------------------------------------------------------------------------------------------
# Plans (LMPERF_FA_LAUNCH=plan): a call's launches recorded once per call signature, then replayed


def _seen(a):
    """A launch argument as the log keeps it: a tensor or a descriptor by the address and dtype of
    its data (no reference to it: autograd reuses a gradient only nothing else holds)."""
    if isinstance(a, torch.Tensor):
        return ("tensor", a.data_ptr(), a.dtype)
    if type(a).__name__ == "TensorDescriptor":
        return ("desc", a.base.data_ptr(), a.base.dtype, list(a.shape), list(a.strides), list(a.block_shape))
    return a


class _Launches:
    """Stands in for CachedLaunch: records every launch (kernel name, grid, arguments) and runs
    nothing."""

    def __init__(self):
        self.log = []

    def __call__(self, kernel):
        log = self.log

        class One:
            def __getitem__(self, grid):
                return lambda *args, **kwargs: log.append((getattr(kernel, "__name__", str(kernel)), grid,
                                                          [_seen(a) for a in args],
                                                          {k: _seen(v) for k, v in kwargs.items()}))
        return One()


@pytest.fixture
def launches(monkeypatch):
    """Eager launches go through plain_launch's compiled path (not the interpreter's kernels) into a
    _Launches; plans on; every plan forgotten."""
    rec = _Launches()
    monkeypatch.setattr(kl, "CachedLaunch", rec)
    monkeypatch.setattr(kl, "LAUNCHES", {})
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # plain_launch's choice, read at each call
    monkeypatch.setenv(kl.LAUNCH_ENV, "plan")
    monkeypatch.setattr(kl, "PLANS", kl.Plans())
    monkeypatch.setattr(ft, "check_device", lambda q: None)  # CPU tensors, on any machine: nothing runs
    return rec


def _roles(log, tensors):
    """Each launch as (kernel, grid, its arguments with every tensor or descriptor named by the
    index of the call's tensor whose data it is, descriptors with their shape, strides and block)."""
    where = {(t.data_ptr(), t.dtype): i for i, t in reversed(list(enumerate(tensors)))}

    def name(a):
        if isinstance(a, tuple) and a[0] in ("tensor", "desc"):
            return (a[0], where.get(a[1:3], "other"), *a[3:])
        return a
    return [(k, g, [name(a) for a in args], {x: name(y) for x, y in kw.items()}) for k, g, args, kw in log]


def _step(shape, causal, layout, seed, dtype=torch.float32):
    torch.manual_seed(seed)
    make = (lambda: torch.randn(shape[0], shape[2], shape[1], shape[3], dtype=dtype).transpose(1, 2)) \
        if layout == "model" else (lambda: torch.randn(shape, dtype=dtype))
    q, k, v = (make().requires_grad_() for _ in range(3))
    out = ft.FlashAttention2Triton.apply(q, k, v, causal)
    g = torch.randn_like(out)
    out.backward(g)
    return q, k, v, out, g


@pytest.mark.parametrize("shape, causal, layout, gluon", [
    ((2, 4, 256, 64), True, "heads", False), ((1, 3, 384, 80), False, "model", False),
    ((2, 4, 64, 32), True, "heads", False),
    ((2, 4, 256, 64), True, "heads", True), ((1, 4, 384, 80), False, "model", True)],
    ids=["tile-64", "tile-80-model", "tile-32", "gluon-64", "gluon-80-model"])
def test_a_plan_replays_the_launches_of_the_full_path(launches, shape, causal, layout, gluon, monkeypatch, request):
    """The second call of a signature is replayed from its plan: the same kernels, grids and
    constants as the full path's launches, each tensor argument (and each TMA descriptor's data,
    shape, strides and block) the same role of the call (q, k, v, the outputs, dO), without the full
    path's dispatch (counted here). Gluon: its forward and backward forced, made to run here (its
    kernels are never launched)."""
    dtype = torch.float32
    if gluon:
        if not _force_gluon(monkeypatch, request):
            return
        dtype = torch.bfloat16
    else:  # unsplit (a split's scratch is the next test's): every tensor a launch reads is one of the call's
        real_fwd, real_bwd = ft.launch_fwd_config, ft.launch_bwd_config
        monkeypatch.setattr(ft, "launch_fwd_config", lambda *a: {**real_fwd(*a), "SPLIT": 1})
        monkeypatch.setattr(ft, "launch_bwd_config", lambda *a: {
            **real_bwd(*a), "dq": {**real_bwd(*a)["dq"], "SPLIT": 1}, "dkdv": {**real_bwd(*a)["dkdv"], "SPLIT": 1}})
    calls = []
    real = ft.eager_forward
    monkeypatch.setattr(ft, "eager_forward", lambda *a: calls.append(1) or real(*a))
    first = _step(shape, causal, layout, 0, dtype)
    n_first = len(launches.log)
    second = _step(shape, causal, layout, 1, dtype)
    if gluon:
        assert [launch[0] for launch in launches.log[:n_first]] == ["_fwd_pp_kernel", "_dq_kernel", "_dkdv_kernel"]
        assert sum(isinstance(a, tuple) and a[0] == "desc" for launch in launches.log for a in launch[2]) > 10
    assert calls == [1], "the second call ran the full forward"
    assert n_first > 0 and len(launches.log) == 2 * n_first
    plans = [p for p in kl.PLANS.plans.values()]
    assert len(plans) == 2 and all(plans), "a forward and a backward plan"

    def named(log, step):
        q, k, v, out, g = step
        return _roles(log, (q, k, v, out, g, q.grad, k.grad, v.grad))
    a, b = named(launches.log[:n_first], first), named(launches.log[n_first:], second)
    assert a == b


def test_a_new_signature_gets_its_own_plan_and_a_call_that_copies_its_data_none(launches, monkeypatch):
    """Another shape, stride or flag is another signature (its own recording); a call whose
    launches read a copy it made of its data has no plan and runs its full path every time."""
    _step((2, 4, 256, 64), True, "heads", 0)
    _step((2, 4, 256, 64), False, "heads", 0)
    _step((2, 4, 384, 64), True, "heads", 0)
    assert len(kl.PLANS.plans) == 6 and all(kl.PLANS.plans.values())
    real_launch = ft.launch_forward
    monkeypatch.setattr(ft, "launch_forward", lambda q3, *a, **kw: real_launch(q3.clone(), *a, **kw))
    calls = []
    real = ft.eager_forward
    monkeypatch.setattr(ft, "eager_forward", lambda *a: calls.append(1) or real(*a))
    for seed in range(3):
        _step((1, 2, 512, 64), True, "heads", seed)
    assert calls == [1, 1, 1]
    assert kl.PLANS.get(kl.plan_key(("forward", True), _qkv_like((1, 2, 512, 64)))) is kl.Plans.NO_PLAN


def _split_everywhere(monkeypatch) -> None:
    """Every call's forward and dQ kernel split in two (partial sums in fp32 scratch, then summed);
    plans keep their scratch (KeptScratch)."""
    monkeypatch.setenv(kl.KEEP_SCRATCH_ENV, "1")
    real_fwd, real_bwd = ft.launch_fwd_config, ft.launch_bwd_config
    monkeypatch.setattr(ft, "launch_fwd_config", lambda *a: {**real_fwd(*a), "SPLIT": 2})
    monkeypatch.setattr(ft, "launch_bwd_config", lambda *a: {
        **real_bwd(*a), "fused": False, "dq": {**real_bwd(*a)["dq"], "SPLIT": 2}})


def _backward_scratch(shape=(1, 2, 512, 64)) -> int:
    """The scratch buffers of a _split_everywhere backward of that (B, H, N, D) fp32 causal call: Delta, dQ's
    partials, and dK's and dV's where its config splits the dK/dV kernel too."""
    b, h, n, d = shape
    return 2 + 2 * (ft.launch_bwd_config(n, d, torch.float32, True, b * h, 1)["dkdv"]["SPLIT"] > 1)


def test_a_split_calls_partial_sums_are_the_plans_scratch(launches, monkeypatch):
    """A split forward and backward (partial results in fp32 buffers, then summed): planned, its
    buffers and the backward's Delta are scratch (outputs of the plan: O and L, dQ, dK and dV), the
    same launches at each replay."""
    _split_everywhere(monkeypatch)
    first = _step((1, 2, 512, 64), True, "heads", 0)
    n_first = len(launches.log)
    second = _step((1, 2, 512, 64), True, "heads", 1)
    plans = list(kl.PLANS.plans.values())
    assert len(plans) == 2 and all(plans)
    assert [p.n_outputs for p in plans] == [2, 3]
    assert [len(p.scratch) for p in plans] == [2, _backward_scratch()]
    kernels = [launch[0] for launch in launches.log]
    assert kernels[:n_first] == kernels[n_first:] and "_fwd_combine_kernel" in kernels and "_sum_parts_kernel" in kernels

    def constants(log):
        return [(k, g, [a for a in args if not isinstance(a, tuple)], kw) for k, g, args, kw in log]
    assert constants(launches.log[:n_first]) == constants(launches.log[n_first:])
    assert first[3].shape == second[3].shape


def _scratch_of(log, step) -> list:
    """The addresses of the tensors a call's launches read that are none of its own (q, k, v, O, dO,
    dQ, dK, dV): its scratch buffers, in the order the launches read them."""
    q, k, v, out, g = step
    mine = {t.data_ptr() for t in (q, k, v, out, g, q.grad, k.grad, v.grad)}
    seen = []
    for _, _, args, kwargs in log:
        for a in [*args, *kwargs.values()]:
            if isinstance(a, tuple) and a[0] == "tensor" and a[1] not in mine and a[1] not in seen:
                seen.append(a[1])
    return seen


def _by_kind() -> dict:
    """The plans of one signature's calls: {"forward": its forward's, "backward": its backward's}."""
    return {"backward" if key[1:2] == ("backward",) else "forward": plan for key, plan in kl.PLANS.plans.items()}


def _as_cuda(plans: dict, monkeypatch) -> None:
    """The plans' scratch taken as CUDA memory (kept by stream, KeptScratch), no graph captured."""
    for plan in plans.values():
        plan.scratch_cuda = True
    monkeypatch.setattr(kl, "capturing_graph", lambda: False)


def _replays(launches, n, shape=(1, 2, 512, 64)) -> list:
    """n forward + backward calls of one signature: each one's scratch addresses (_scratch_of)."""
    out = []
    for seed in range(n):
        start = len(launches.log)
        step = _step(shape, True, "heads", seed)
        out.append(_scratch_of(launches.log[start:], step))
    return out


def test_a_plans_scratch_is_kept_for_its_next_replay_on_the_same_stream(launches, monkeypatch):
    """From a plan's first replay its scratch buffers are kept (KeptScratch) and every later replay on
    the same stream reads those; another stream gets buffers of its own; the kept bytes count until
    the plans are gone."""
    _split_everywhere(monkeypatch)
    monkeypatch.setattr(kl, "KEPT_SCRATCH", kl.KeptScratch())
    calls = _replays(launches, 2)  # the recording, then the first replay
    plans = _by_kind()

    def kept(where):
        return {name: [t.data_ptr() for t in plan.kept[where]] for name, plan in plans.items()}
    on_none = kept(None)
    assert [len(on_none[name]) for name in ("forward", "backward")] == [2, _backward_scratch()]
    for call in [calls[1], *_replays(launches, 3)]:
        assert set(on_none["forward"] + on_none["backward"]) <= set(call)
    assert kept(None) == on_none
    assert kl.KEPT_SCRATCH.bytes == sum(p.scratch_bytes for p in plans.values()) > 0
    _as_cuda(plans, monkeypatch)
    for stream in (7, 8, 7):
        monkeypatch.setattr(kl, "current_stream", lambda stream=stream: (0, stream))
        for call in _replays(launches, 2):
            mine = kept((0, stream))
            assert set(mine["forward"] + mine["backward"]) <= set(call)
    on_7, on_8 = kept((0, 7)), kept((0, 8))
    assert not {*on_7["forward"], *on_7["backward"]} & {*on_8["forward"], *on_8["backward"], *on_none["forward"]}
    assert kl.KEPT_SCRATCH.bytes == 3 * sum(p.scratch_bytes for p in plans.values())
    del plans
    kl.PLANS.clear()
    gc.collect()
    assert kl.KEPT_SCRATCH.bytes == 0


def test_a_plans_scratch_is_fresh_at_each_replay_unless_keeping_is_on(launches, monkeypatch):
    """LMPERF_FA_KEEP_SCRATCH unset or "0" (the default): no plan keeps a buffer; "1": they do."""
    _split_everywhere(monkeypatch)
    monkeypatch.setattr(kl, "KEPT_SCRATCH", kl.KeptScratch())
    for value in (None, "0", "1"):
        if value is None:
            monkeypatch.delenv(kl.KEEP_SCRATCH_ENV)
        else:
            monkeypatch.setenv(kl.KEEP_SCRATCH_ENV, value)
        _replays(launches, 3)
        kept = [bool(plan.kept) for plan in _by_kind().values()]
        assert kept == [value == "1"] * 2 and (kl.KEPT_SCRATCH.bytes > 0) == (value == "1")


def test_a_plans_scratch_is_fresh_under_a_graphs_capture_and_past_the_budget(launches, monkeypatch):
    """While a CUDA graph is captured a replay's scratch is fresh and none is kept (the graph's pool
    holds it); past KeptScratch's bytes a plan's replays allocate their own."""
    _split_everywhere(monkeypatch)
    monkeypatch.setattr(kl, "KEPT_SCRATCH", kl.KeptScratch())
    _replays(launches, 1)  # the recording
    plans = _by_kind()
    _as_cuda(plans, monkeypatch)
    monkeypatch.setattr(kl, "capturing_graph", lambda: True)
    monkeypatch.setattr(kl, "current_stream", lambda: (0, 7))
    _replays(launches, 2)
    assert set(plans) == {"forward", "backward"}
    assert kl.KEPT_SCRATCH.bytes == 0 and not any(plan.kept for plan in plans.values())
    monkeypatch.setattr(kl, "capturing_graph", lambda: False)
    monkeypatch.setattr(kl, "KEPT_SCRATCH", kl.KeptScratch(max_bytes=plans["forward"].scratch_bytes))
    calls = _replays(launches, 3)
    assert list(map(bool, (plans["forward"].kept, plans["backward"].kept))) == [True, False]
    assert kl.KEPT_SCRATCH.bytes == plans["forward"].scratch_bytes
    assert {t.data_ptr() for t in plans["forward"].kept[(0, 7)]} <= set(calls[1]) & set(calls[2])


def test_a_call_under_a_graphs_capture_gets_the_split_under_a_plan_key_of_its_own(launches, monkeypatch):
    """The grid's one sequence of 1,024 rows at head dim 128 (bf16, causal), the GPU's configs: launched by
    the host, unsplit (no merge, no sums: one forward and one fused backward launch); while a CUDA graph
    is captured, the rule's split, recorded under plan keys of its own, and each replayed as recorded."""
    monkeypatch.setattr(ft, "INTERPRET", False)
    monkeypatch.setattr(ft, "fwd_config_memo", functools.lru_cache(maxsize=64)(ft.fwd_config))
    monkeypatch.setattr(ft, "bwd_config_memo", functools.lru_cache(maxsize=64)(ft.bwd_config))
    captured = [False]
    monkeypatch.setattr(ft, "host_launched", lambda q: not captured[0])
    monkeypatch.setattr(kl, "captured", lambda t: captured[0])
    kernels = {}
    for capture in (False, True, False, True):
        captured[0] = capture
        start = len(launches.log)
        _step((1, 1, 1024, 128), True, "heads", 0, torch.bfloat16)
        kernels.setdefault(capture, []).append([launch[0] for launch in launches.log[start:]])
    assert kernels[False][0] == kernels[False][1] == ["_fwd_kernel", "_bwd_fused_kernel"]
    assert kernels[True][0] == kernels[True][1]
    assert "_fwd_combine_kernel" in kernels[True][0] and "_sum_parts_kernel" in kernels[True][0]
    assert len(kl.PLANS.plans) == 4 and all(kl.PLANS.plans.values())


def test_a_backward_whose_do_is_the_output_gets_its_own_plan(launches):
    """The backward's plan key is its forward's and dO's (kernel_launch.then_key): a dO that is the
    output's own memory is another signature than a fresh dO of the same layout, in either order, and
    each replay's launches read this call's dO where the recording read its own."""
    def step(seed, alias: bool):
        torch.manual_seed(seed)
        q, k, v = (torch.randn(2, 4, 256, 64).requires_grad_() for _ in range(3))
        out = ft.FlashAttention2Triton.apply(q, k, v, True)
        g = out.detach() if alias else torch.randn_like(out)
        start = len(launches.log)
        out.backward(g)
        return _roles(launches.log[start:], (q, k, v, out, g, q.grad, k.grad, v.grad))
    fresh, aliased = step(0, False), step(1, True)
    assert fresh != aliased  # the aliased call's dO is read as O (role 3), the fresh one's as dO (role 4)
    assert step(2, False) == fresh and step(3, True) == aliased and step(4, False) == fresh
    backward_plans = [key for key, plan in kl.PLANS.plans.items() if plan and key[1:2] == ("backward",)]
    assert len(backward_plans) == 2


def test_a_plan_key_holds_the_dispatchs_variables(monkeypatch):
    """The variables the dispatch reads are the backends' own, and each value is another key (a plan
    recorded under one backend is never replayed under another)."""
    from lmperf.kernels import flash_attention_gluon as fg
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    assert kl.DISPATCH_ENV == (fg.BACKEND_ENV, gb.BWD_BACKEND_ENV)
    qkv = _qkv_like((1, 2, 128, 64))
    keys = set()
    for fwd, bwd in (("auto", "auto"), ("triton", "auto"), ("auto", "triton")):
        monkeypatch.setenv(fg.BACKEND_ENV, fwd)
        monkeypatch.setenv(gb.BWD_BACKEND_ENV, bwd)
        keys.add(kl.plan_key(("forward", True), qkv))
    assert len(keys) == 3


def _qkv_like(shape):
    return tuple(torch.empty(shape) for _ in range(3))


def test_a_plan_holds_no_tensor(launches):
    _step((2, 4, 256, 64), True, "heads", 0)

    def leaves(x):
        if isinstance(x, (tuple, list)):
            for y in x:
                yield from leaves(y)
        elif isinstance(x, dict):
            for y in x.values():
                yield from leaves(y)
        else:
            yield x
    for plan in kl.PLANS.plans.values():
        assert not any(isinstance(x, torch.Tensor) for x in leaves([list(l[1:]) for l in plan.launches]))


class _StandInCompiled:
    """A compiled kernel's stand-in: its launcher records each launch's arguments."""
    function = "function"
    packed_metadata = "packed"

    def __init__(self, log, name):
        self.log, self.name = log, name

    def launch_metadata(self, grid, stream, *args):
        return ("meta", grid)

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, leave, *bound):
        assert (stream, function, packed) == (1234, "function", "packed")
        self.log.append(("launcher", self.name, (g0, g1, g2), [_seen(a) for a in bound]))


class _StandInKernel:
    """A Triton kernel's stand-in with its parameters: kernel[grid](...) (the JIT) records the launch
    with its arguments bound in the kernel's parameter order, as the JIT passes them to the
    launcher, and returns the kernel's _StandInCompiled (or what `compiled` makes)."""

    def __init__(self, kernel, log, compiled=_StandInCompiled):
        params = inspect.signature(kernel.fn).parameters.values()  # (a JITFunction's or the interpreter's)
        self.params = [_Param(p.name, None if p.default is p.empty else p.default) for p in params]
        self.arg_names, self.pre_run_hooks = [p.name for p in self.params], []
        self.name, self.log = kernel.fn.__name__, log
        self.compiled = compiled(log, self.name)

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            bound = [*args, *[kwargs.get(p.name, p.default) for p in self.params[len(args):]]]
            self.log.append(("jit", self.name, (*grid, 1, 1)[:3], [_seen(a) for a in bound]))
            return self.compiled
        return jit


def _stand_in_kernels(monkeypatch, compiled=_StandInCompiled) -> list:
    """Every kernel of ft (and the Gluon modules where importable) launched by plain_launch through a
    CachedLaunch of a _StandInKernel; plans on; returns the log of launches ("jit" or "launcher",
    kernel, grid, bound arguments)."""
    from lmperf.kernels import flash_attention_gluon as fg
    log = []
    monkeypatch.setattr(kl, "LAUNCHES", {})
    modules = [ft]
    if fg.IMPORT_ERROR is None:
        from lmperf.kernels import flash_attention_gluon_bwd as gb
        from lmperf.kernels import flash_attention_gluon_fused as gf
        modules += [fg, gb, gf]
    for module in modules:
        for value in vars(module).values():
            if hasattr(value, "fn") and hasattr(value, "arg_names") and value.fn.__name__.endswith("kernel"):
                kl.LAUNCHES[value] = kl.CachedLaunch(_StandInKernel(value, log, compiled))
    monkeypatch.setattr(kl, "current_stream", lambda: (0, 1234))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv(kl.LAUNCH_ENV, "plan")
    monkeypatch.setattr(kl, "PLANS", kl.Plans())
    monkeypatch.setattr(ft, "check_device", lambda q: None)
    return log


def _force_gluon(monkeypatch, request) -> bool:
    """Both Gluon kernels forced and made to run on the CPU (never launched); False where this
    process has no Gluon (Triton's interpreter): the test then ran in a process without it."""
    from lmperf.kernels import flash_attention_gluon as fg
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    if fg.IMPORT_ERROR is not None:
        pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                               request.node.nodeid],
                              env={**os.environ, "TRITON_INTERPRET": "0"}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
        return False
    monkeypatch.setattr(fg, "available", lambda: None)
    monkeypatch.setattr(fg, "sm_count", lambda device: 132)
    monkeypatch.setattr(fg, "unsupported", lambda *a: None)
    monkeypatch.setattr(gb, "unsupported", gb.shape_unsupported)
    monkeypatch.setenv("LMPERF_FA_BACKEND", "gluon")
    monkeypatch.setenv("LMPERF_FA_BWD_BACKEND", "gluon")
    return True


def _named(log, step, roles=8):
    """The log's launches with each tensor (or descriptor's data) named by the role it is in the
    call (q, k, v, O, dO, dQ, dK, dV: the first `roles` of them; "other" for the rest and the call's
    own buffers)."""
    q, k, v, out, g = step
    return _by_role(log, (q, k, v, out, g, q.grad, k.grad, v.grad)[:roles])


def _by_role(log, tensors):
    """The log's launches with each tensor (or descriptor's data) named by its index in `tensors`."""
    where = {(t.data_ptr(), t.dtype): i for i, t in reversed(list(enumerate(tensors)))}

    def name(a):
        if isinstance(a, tuple) and a[0] in ("tensor", "desc"):
            return (a[0], where.get(a[1:3], "other"), *a[3:])
        return a
    return [(kernel, grid, [name(a) for a in args]) for _, kernel, grid, args in log]


def _logged_steps(log, shape=(2, 4, 256, 64), dtype=torch.float32, n=3) -> list:
    """n forward + backward calls of one signature in the model's layout (seeds 0 to n - 1), each
    as (its _step, the launches it added to `log`)."""
    calls = []
    for seed in range(n):
        start = len(log)
        calls.append((_step(shape, True, "model", seed, dtype), log[start:]))
    return calls


@pytest.mark.parametrize("case", ["tile", "tile-split", "gluon"])
def test_a_plan_replays_to_the_compiled_launchers_with_the_jits_arguments(case, monkeypatch, request):
    """A replayed call goes straight to each compiled kernel's launcher (no JIT, no CachedLaunch key),
    with the arguments the JIT passed at the full path's call: the same kernels, grids, constants,
    and every tensor and TMA descriptor the same role of the call; at the plan's first replay (each
    launcher tried) and at later ones."""
    dtype = torch.float32
    if case == "gluon":
        if not _force_gluon(monkeypatch, request):
            return
        dtype = torch.bfloat16
    log = _stand_in_kernels(monkeypatch)
    split = 2 if case == "tile-split" else 1  # pinned: the GPU's rules split these CPU shapes
    real_fwd, real_bwd = ft.launch_fwd_config, ft.launch_bwd_config
    monkeypatch.setattr(ft, "launch_fwd_config", lambda *a: {**real_fwd(*a), "SPLIT": split})
    monkeypatch.setattr(ft, "launch_bwd_config", lambda *a: {
        **real_bwd(*a), "fused": False, "dq": {**real_bwd(*a)["dq"], "SPLIT": split},
        "dkdv": {**real_bwd(*a)["dkdv"], "SPLIT": 1}})
    calls = _logged_steps(log, dtype=dtype)
    (first, full), (_, second), (third_step, third) = calls
    assert full and full[0][0] == "jit"  # (a kernel launched twice a call takes the cache at its second)
    assert all(kind == "launcher" for kind, *_ in second + third)
    # split: the partial sums are freed within the call and their memory reused by the next tensor
    # made (dO, the gradients): only the inputs are named there
    roles = 3 if case == "tile-split" else 8
    assert _named(second, calls[1][0], roles) == _named(full, first, roles) == _named(third, third_step, roles)
    assert any(a[1] != "other" for _, _, args in _named(full, first) for a in args if isinstance(a, tuple))


class CudaLauncher:
    """Stands in for Triton's CudaLauncher (its class name is what the plans check): calling it is the
    launcher ("launcher" in the log); `launch` its C launch function ("raw")."""
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, log, name, scratch):
        self.log, self.name = log, name
        self.global_scratch_size = self.profile_scratch_size = scratch

    def __call__(self, g0, g1, g2, stream, function, packed, meta, enter, leave, *bound):
        assert (stream, function, packed) == (1234, "function", "packed")
        self.log.append(("launcher", self.name, (g0, g1, g2), [_seen(a) for a in bound]))

    def launch(self, g0, g1, g2, stream, function, coop, pdl, global_scratch, profile_scratch, packed, meta,
               enter, leave, *bound):
        assert (stream, function, coop, pdl, global_scratch, profile_scratch, packed, meta, enter, leave) == \
            (1234, "function", False, True, None, None, "packed", None, None, None)
        self.log.append(("raw", self.name, (g0, g1, g2), [_seen(a) for a in bound]))


@pytest.mark.parametrize("scratch, verified, want", [(0, True, "raw"), (256, True, "launcher"),
                                                     (0, False, "launcher")])
def test_a_plan_calls_the_c_launch_function_where_the_launcher_adds_nothing(scratch, verified, want, monkeypatch):
    """Where Triton's launcher would only pass the call on (no scratch to allocate) on a checked Triton
    release, replays call its C launch function with the arguments the launcher would give it
    (cooperative grid and PDL flags, no scratch, idle hooks as None), each tensor the same role as the
    full path's; else the launcher itself."""
    import triton

    class Compiled(_StandInCompiled):
        def __init__(self, log, name):
            super().__init__(log, name)
            self.run = CudaLauncher(log, name, scratch)
    monkeypatch.setattr(kl, "VERIFIED_TRITON", (triton.__version__,) if verified else ("0.0.",))
    log = _stand_in_kernels(monkeypatch, Compiled)
    (first, full), *replays = _logged_steps(log)
    for step, launches in replays:
        assert {kind for kind, *_ in launches} == {want}
        assert _named(launches, step, 3) == _named(full, first, 3)


def test_a_plan_makes_a_descriptors_tensor_map_only_for_an_address_not_seen_lately(monkeypatch, request):
    """The Gluon kernels' TMA descriptors through Triton's own wrapper (wrap_handle_tensordesc) of a
    stand-in C launch function, the tensor maps stood in for by the address they encode: each replay
    launches maps of this call's data, role for role as the first replay (every map made afresh);
    a map is made only for data at an address its descriptor has not seen lately (here: the
    outputs, and the inputs when they change, not when they come back), and with a launch hook
    active Triton's wrapper makes them all (Delta, the backward's own buffer, is "other")."""
    if not _force_gluon(monkeypatch, request):
        return
    import triton
    import triton.backends.nvidia.driver as nvidia
    from triton import knobs
    made, launched = [], []

    def make(arg, meta):  # stands in for the CUDA driver's tensor map: the address it encodes
        made.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), arg.base.dtype), *arg.shape, *arg.strides]
    monkeypatch.setattr(nvidia, "make_tensordesc_arg", make)
    monkeypatch.setattr(kl, "VERIFIED_TRITON", (triton.__version__,))

    hooks = []

    def c_launch(*args):
        hooks.append(args[nvidia._BASE_ARGS_FORMAT_LEN - 2])  # the enter hook the launch function would call
        launched.append([a for a in args[nvidia._BASE_ARGS_FORMAT_LEN:]
                         if isinstance(a, tuple) and a[0] == "map" or isinstance(a, torch.Tensor)])

    class Kernel(_StandInKernel):
        def __getitem__(self, grid):
            jit = super().__getitem__(grid)

            def go(*args, **kwargs):
                bound = [*args, *[kwargs.get(p.name, p.default) for p in self.params[len(args):]]]
                signature = {i: "tensordesc" if type(a).__name__ == "TensorDescriptor" else "i32"
                             for i, a in enumerate(bound)}
                launcher = CudaLauncher(self.log, self.name, 0)
                launcher.launch = nvidia.wrap_handle_tensordesc(c_launch, signature,
                                                                [{}] * sum(v == "tensordesc" for v in signature.values()))
                self.compiled.run = launcher
                return jit(*args, **kwargs)
            return go
    log = _stand_in_kernels(monkeypatch)
    for key, launch in list(kl.LAUNCHES.items()):
        kl.LAUNCHES[key] = kl.CachedLaunch(Kernel(key, log))

    def step(leaves):
        q, k, v = leaves
        q.grad = k.grad = v.grad = None
        out = ft.FlashAttention2Triton.apply(q, k, v, True)
        g = torch.randn_like(out)
        lse = out.grad_fn.saved_tensors[4]
        start, n_made = len(launched), len(made)
        out.backward(g)
        where = {(t.data_ptr(), t.dtype): i for i, t in enumerate((q, k, v, out, g, q.grad, k.grad, v.grad, lse))}
        return [[("map", where.get(a[1:], "other")) if isinstance(a, tuple) else ("tensor", where.get(
            (a.data_ptr(), a.dtype), "other")) for a in one] for one in launched[start:]], len(made) - n_made

    def leaves(seed):
        torch.manual_seed(seed)
        return [torch.randn(1, 2, 256, 64, dtype=torch.bfloat16).requires_grad_() for _ in range(3)]
    first, second = leaves(0), leaves(1)
    step(first)  # recorded (the JIT)
    fresh, n_fresh = step(first)  # the plan's first replay: every map made
    again, n_again = step(first)  # q, k, v where they were: their maps reused
    moved, n_moved = step(second)  # other inputs: their maps made again
    back, n_back = step(first)  # the first inputs again: their maps kept (addresses that alternate)
    assert fresh and all(("map", role) in sum(fresh, []) for role in (0, 1, 2, 4))  # q, k, v and dO by their maps
    assert again == fresh and moved == fresh and back == fresh
    assert n_again < n_fresh and n_again < n_moved <= n_fresh and n_back == n_again
    assert not any(hooks)
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        hooked, n_hooked = step(second)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert hooked == fresh and n_hooked == n_fresh
    assert hooks[-1] is knobs.runtime.launch_enter_hook


@pytest.mark.parametrize("missing", [None, "launch_metadata"])
def test_a_plan_whose_launcher_is_refused_or_missing_replays_through_the_jit(missing, monkeypatch):
    """A compiled kernel without the launcher's attributes, or whose launcher refuses the plan's first
    replay (TypeError): the plan's launches of it through the JIT, with the full path's arguments."""
    class Compiled(_StandInCompiled):
        def run(self, *args):
            raise TypeError("launcher")
    if missing:
        Compiled = type("Compiled", (), {k: v for k, v in vars(_StandInCompiled).items() if k != missing})
    log = _stand_in_kernels(monkeypatch, Compiled)
    calls = _logged_steps(log)
    (first, full), *replays = calls
    assert all(kind == "jit" for _, log_ in calls for kind, *_ in log_)
    # the forward splits at this shape: its partial sums are freed within the call and their memory
    # reused by the gradients, so only the inputs are named (as in the split case above)
    for step, launches in replays:
        assert _named(launches, step, 3) == _named(full, first, 3)
    assert all(launch.jit_only or not launch.compiled for launch in kl.LAUNCHES.values())


def test_the_gluon_ops_replay_their_first_calls_launches(monkeypatch, request):
    """The Gluon kernels' ops (what torch.compile's graphs call), every one that opaque_op defined,
    with plans on: a later call of a signature replays the first call's launches to the launchers,
    each tensor and descriptor the same role of the call, and builds no descriptor."""
    if not _force_gluon(monkeypatch, request):
        return
    from lmperf.kernels import flash_attention_gluon as fg
    log = _stand_in_kernels(monkeypatch)
    ops = torch.ops.lmperf
    built = []  # the descriptors each call builds: none where it is replayed
    monkeypatch.setattr(fg, "head_desc", lambda *a, real=fg.head_desc: built.append(a) or real(*a))

    def call(seed):
        torch.manual_seed(seed)
        q, k, v, out, do = (torch.randn(1, 2, 256, 64, dtype=torch.bfloat16) for _ in range(5))
        lse, delta = torch.randn(2, 256), torch.empty(2, 256)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        start = len(log)
        o, l = ops.flash_attention_forward_gluon(q, k, v, True)
        ops.flash_attention_dq_gluon(q, k, v, out, do, lse, delta, dq, True)
        ops.flash_attention_dkdv_gluon(q, k, v, do, lse, delta, dk, dv, True)
        ops.flash_attention_bwd_gluon_fused(q, k, v, out, do, lse, dq, dk, dv, True)  # Delta, fused, dQ's cast
        return [kind for kind, *_ in log[start:]], _by_role(log[start:], (q, k, v, out, do, lse, delta, dq, dk, dv, o, l))
    (kinds0, first), made = call(0), len(built)
    (kinds1, second), (kinds2, third) = call(1), call(2)
    assert made and len(built) == made
    assert kinds0 == ["jit"] * 6 and kinds1 == kinds2 == ["launcher"] * 6
    assert [kernel for kernel, *_ in first][3:] == ["_delta_kernel", "_fused_kernel", "_cast_kernel"]
    assert first == second == third
    assert len(kl.PLANS.plans) == 4 and all(kl.PLANS.plans.values())
    from lmperf.kernels.triton_op import OPAQUE_OPS
    assert sorted(OPAQUE_OPS) == sorted(f"lmperf::{op}" for op in (
        "flash_attention_forward_gluon", "flash_attention_dq_gluon", "flash_attention_dkdv_gluon",
        "flash_attention_bwd_gluon_fused"))  # a new op is called above, and planned, before this passes


def _reference_grads(q, k, v, do, is_causal):
    """(O, L, dQ, dK, dV) in float64, by the formulas (an op's kernel runs below autograd): K/V heads
    repeated over their query heads, their gradients summed."""
    group = q.shape[-3] // k.shape[-3]
    scale = q.shape[-1] ** -0.5
    q, k, v, do = (t.double() for t in (q, k, v, do))
    kk, vv = (t.repeat_interleave(group, dim=-3) for t in (k, v))
    s = q @ kk.transpose(-1, -2) * scale
    if is_causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, -1)
    out = p @ vv
    dp = do @ vv.transpose(-1, -2)
    ds = p * (dp - (do * out).sum(-1, keepdim=True))
    dk = (ds.transpose(-1, -2) @ q * scale).unflatten(-3, (k.shape[-3], group)).sum(-3)
    dv = (p.transpose(-1, -2) @ do).unflatten(-3, (k.shape[-3], group)).sum(-3)
    return out, torch.logsumexp(s, -1), ds @ kk * scale, dk, dv


def _reference_gluon_launchers(monkeypatch):
    """The Gluon kernels' launchers replaced by the float64 reference writing their outputs; returns
    the list of their calls' names."""
    from lmperf.kernels import flash_attention_gluon as fg
    from lmperf.kernels import flash_attention_gluon_bwd as gb
    from lmperf.kernels import flash_attention_gluon_fused as gf
    calls = []

    def forward(q, k, v, is_causal, *rest):
        calls.append("forward")
        out, lse = _reference_grads(q, k, v, torch.zeros_like(q), is_causal)[:2]
        b, h, n, d = q.shape
        return q.new_empty(b, n, h, d).transpose(1, 2).copy_(out), lse.float()  # O (B, N, H, D) in memory

    def launch_dq(q, k, v, out, do, lse, delta, dq, is_causal, *rest, **kw):
        calls.append("dq")
        delta.copy_((out.double() * do.double()).sum(-1).view(delta.shape))
        dq.copy_(_reference_grads(q, k, v, do, is_causal)[2])

    def launch_dkdv(q, k, v, do, lse, delta, dk, dv, is_causal, *rest, **kw):
        calls.append("dkdv")
        grads = _reference_grads(q, k, v, do, is_causal)
        dk.copy_(grads[3])
        dv.copy_(grads[4])
    def launch_fused(q, k, v, out, do, lse, dq, dk, dv, is_causal, *rest, **kw):
        calls.append("fused")
        for grad, ref in zip((dq, dk, dv), _reference_grads(q, k, v, do, is_causal)[2:]):
            grad.copy_(ref)
    monkeypatch.setattr(fg, "forward", forward)
    monkeypatch.setattr(gb, "launch_dq", launch_dq)
    monkeypatch.setattr(gb, "launch_dkdv", launch_dkdv)
    monkeypatch.setattr(gf, "launch", launch_fused)
    return calls


def test_the_gluon_ops_under_torch_compile(monkeypatch, request):
    """torch.compile (fullgraph) with both Gluon kernels forced: its graphs call the Gluon ops
    (defined on the dispatcher, opaque to the trace) with no graph break, their in-place writes of
    dQ, Delta, dK and dV kept, and give eager mode's values; here the kernels' launchers are a
    float64 reference, so that the values say what each op wrote (no GPU)."""
    if not _force_gluon(monkeypatch, request):
        return
    import torch._dynamo
    monkeypatch.setenv(kl.LAUNCH_ENV, "jit")  # a plan records kernel launches: the reference has none
    calls = _reference_gluon_launchers(monkeypatch)
    torch._dynamo.reset()
    torch.manual_seed(0)
    q = torch.randn(1, 4, 128, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 128, 64, dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)

    def step(fn):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*xs, True)
        out.backward(do)
        return out.detach(), *(x.grad for x in xs)
    eager = step(ft.FlashAttention2Triton.apply)
    assert calls == ["forward", "dq", "dkdv"]
    compiled = step(torch.compile(ft.FlashAttention2Triton.apply, backend="aot_eager", fullgraph=True))
    assert calls[3:] == ["forward", "dq", "dkdv"]
    reference = _reference_grads(q, k, v, do, True)
    for got, want, expected in zip(compiled, eager, (reference[0], *reference[2:])):
        assert torch.equal(got, want)
        torch.testing.assert_close(got.double(), expected, atol=2e-2, rtol=2e-2)
    torch._dynamo.reset()
    # each op's schema says what it writes, its fake what it returns (torch.library.opcheck)
    out, lse = ft.FlashAttention2Triton.apply(q, k, v, True), torch.randn(1, 4, 128)
    delta, dq, dk, dv = torch.empty(4, 128), *(torch.empty_like(t) for t in (q, k, v))
    ops = torch.ops.lmperf
    for op, args in ((ops.flash_attention_forward_gluon, (q, k, v, True)),
                     (ops.flash_attention_dq_gluon, (q, k, v, out, do, lse, delta, dq, True)),
                     (ops.flash_attention_dkdv_gluon, (q, k, v, do, lse, delta, dk, dv, True)),
                     (ops.flash_attention_bwd_gluon_fused, (q, k, v, out, do, lse, dq, dk, dv, True))):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_clear_plans_forgets_them(launches, monkeypatch):
    """clear_plans(): every plan forgotten; the next call of a signature runs its full path again,
    recorded under the rules of now (a rule patched, as tests do), and its replays follow them."""
    calls = []
    real = ft.eager_forward
    monkeypatch.setattr(ft, "eager_forward", lambda *a: calls.append(1) or real(*a))
    _step((2, 4, 256, 64), True, "heads", 0)
    _step((2, 4, 256, 64), True, "heads", 1)
    assert calls == [1] and len(kl.PLANS.plans) == 2
    real_fwd = ft.launch_fwd_config
    monkeypatch.setattr(ft, "launch_fwd_config", lambda *a: {**real_fwd(*a), "BLOCK_Q": 16})
    ft.clear_plans()
    assert not kl.PLANS.plans
    start = len(launches.log)
    for seed in (2, 3):
        _step((2, 4, 256, 64), True, "heads", seed)
    assert calls == [1, 1] and len(kl.PLANS.plans) == 2
    forwards = [kw["BLOCK_Q"] for name, _, _, kw in launches.log if name == "_fwd_kernel"]
    assert forwards[0] != 16 and forwards[-2:] == [16, 16]
    assert len(launches.log) - start == start


def test_getenv_reads_what_os_environ_holds(monkeypatch):
    monkeypatch.setenv("LMPERF_TEST_GETENV", "a")
    assert kl.getenv("LMPERF_TEST_GETENV") == "a"
    monkeypatch.setenv("LMPERF_TEST_GETENV", "b")
    assert kl.getenv("LMPERF_TEST_GETENV") == "b"
    monkeypatch.delenv("LMPERF_TEST_GETENV")
    assert kl.getenv("LMPERF_TEST_GETENV") is None


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the kernels")
@pytest.mark.parametrize("shape,causal,layout", [((2, 4, 384, 64), True, "heads"), ((3, 256, 128), False, "assign"),
                                                 ((2, 8, 4096, 80), True, "model"), ((1, 16, 2048, 128), True, "model"),
                                                 ((1, 2, 200, 80), True, "heads"), ((16, 1024, 64), True, "assign")])
def test_planned_calls_give_the_full_paths_bits(shape, causal, layout, monkeypatch):
    """LMPERF_FA_LAUNCH=plan against =jit: the same output and gradients bit for bit, at the first
    call of a signature (recorded) and at the next two (replayed), on the tile and the Gluon paths."""
    def run():
        torch.manual_seed(1)
        if layout == "model":
            b, h, n, d = shape
            q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                       for _ in range(3))
        else:
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        out = ft.FlashAttention2Triton.apply(q, k, v, causal)
        out.sum().backward()
        return [out.detach(), q.grad, k.grad, v.grad]

    monkeypatch.setenv(kl.LAUNCH_ENV, "jit")
    want = run()
    monkeypatch.setenv(kl.LAUNCH_ENV, "plan")
    monkeypatch.setattr(kl, "PLANS", kl.Plans())
    for _ in range(3):
        got = run()
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    assert any(kl.PLANS.plans.values()) or shape[-2] == 200


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the kernels")
@pytest.mark.parametrize("shape,causal,split", [((1, 1, 1024, 128), True, True), ((1, 1, 4096, 128), True, True),
                                                ((1, 1, 2048, 64), False, None), ((2, 1, 1000, 80), True, None),
                                                ((1, 3, 4096, 64), True, None)])
def test_a_replay_on_kept_scratch_holding_nan_gives_the_full_paths_bits(shape, causal, split, monkeypatch):
    """A plan's kept scratch (KeptScratch: a split's partial sums, Delta) filled with NaN before a replay of
    another call's data: the output and gradients the full path's bit for bit, so the kernels write every
    element of it they read (`split`: the call has scratch to keep). The configs a CUDA graph's capture
    gets (host_launched False), which split these calls."""
    monkeypatch.setattr(ft, "host_launched", lambda q: False)
    ft.clear_plans()
    def run(seed):
        torch.manual_seed(seed)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        out = ft.FlashAttention2Triton.apply(q, k, v, causal)
        out.backward(torch.randn_like(out))
        return [out.detach(), q.grad, k.grad, v.grad]

    monkeypatch.setenv(kl.LAUNCH_ENV, "jit")
    want = run(2)
    monkeypatch.setenv(kl.LAUNCH_ENV, "plan")
    monkeypatch.setenv(kl.KEEP_SCRATCH_ENV, "1")
    monkeypatch.setattr(kl, "PLANS", kl.Plans())
    monkeypatch.setattr(kl, "KEPT_SCRATCH", kl.KeptScratch())
    run(0)  # recorded
    run(1)  # replayed: its scratch kept
    kept = [t for plan in kl.PLANS.plans.values() if plan for ts in plan.kept.values() for t in ts]
    assert bool(kept) or not split
    for t in kept:
        t.fill_(float("nan") if t.is_floating_point() else -1)
    got = run(2)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the kernels and a CUDA graph")
@pytest.mark.parametrize("n,d", [(1024, 128), (4096, 64)])
def test_a_graphs_capture_splits_as_the_rule_and_its_replay_gives_that_paths_bits(n, d, monkeypatch):
    """The grid's one sequence, bf16 causal: an eager call unsplit (HOST_BOUND_ROWS); a forward + backward
    captured in a CUDA graph runs the rule's split, its replay on new data giving bit for bit what an eager
    call with the split's configs gives, and an eager call after it is unsplit again (plans apart)."""
    monkeypatch.setattr(kl, "PLANS", kl.Plans())
    ft.clear_plans()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)

    def step():
        for t in (q, k, v):
            t.grad = None
        out = ft.FlashAttention2Triton.apply(q, k, v, True)
        out.backward(g)
        return [out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()]
    step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm on the capture's stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for t in (q, k, v):
            t.grad = None
        out = ft.FlashAttention2Triton.apply(q, k, v, True)
        out.backward(g)
    with torch.no_grad():
        for t in (q, k, v, g):
            t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    replayed = [out.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()]
    monkeypatch.setattr(ft, "host_launched", lambda t: False)  # the capture's configs, eagerly
    ft.clear_plans()
    split = step()
    monkeypatch.undo()
    for a, b in zip(replayed, split):
        assert torch.equal(a, b)
    monkeypatch.setattr(kl, "PLANS", kl.Plans())
    unsplit = step()
    assert not all(torch.equal(a, b) for a, b in zip(unsplit, split))  # another sum order: other bits somewhere
    assert all(torch.equal(a, b) for a, b in zip(step(), unsplit))
