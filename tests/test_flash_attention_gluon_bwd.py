"""The Gluon backward kernels (lmperf.kernels.flash_attention_gluon_bwd: dQ, and dK/dV) behind
LMPERF_FA_BWD_BACKEND: on any machine, the switch ("auto", the default: both Gluon kernels where
they were measured faster, else the tile-language backward, bit for bit; "gluon": both Gluon
kernels; "gluon-dkdv": the Gluon dK/dV after the tile dQ), its errors,
the contract (which calls they take) and a compile of each kernel for sm_90 (the H100) whose
cubin is read for spills; on a Hopper GPU the kernels themselves against float64 (head dims 64
and 128, causal or not, grouped-query, the model's layout), bitwise determinism, and
torch.compile against eager mode bit for bit."""
import zlib

import pytest
import torch

from lmperf.kernels import flash_attention_gluon as fg
from lmperf.kernels import flash_attention_gluon_bwd as gb
from lmperf.kernels import flash_attention_triton as ft
from lmperf.kernels.attention_contract import compare
from tests.compiled_eager import assert_compiled_matches_eager
from tests.sm90 import compile_specs, expect_spills

GLUON = fg.available() is None
NEEDS_HOPPER = pytest.mark.skipif(not GLUON, reason=f"needs a Hopper GPU ({fg.available()})")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ENV = gb.BWD_BACKEND_ENV


def qkv(shape, dtype=torch.bfloat16, kv_heads=None, device=DEVICE, seed=0):
    torch.manual_seed(zlib.crc32(repr((shape, str(dtype), kv_heads, seed)).encode()))
    kv_shape = (*shape[:-3], kv_heads, *shape[-2:]) if kv_heads else shape
    return (torch.randn(shape, dtype=dtype, device=device), torch.randn(kv_shape, dtype=dtype, device=device),
            torch.randn(kv_shape, dtype=dtype, device=device))


def grads(q, k, v, causal, grad_out=None):
    xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = ft.FlashAttention2Triton.apply(*xs, causal)
    out.backward(torch.ones_like(out) if grad_out is None else grad_out)
    return [t.grad for t in xs]


# ---------------------------------------------------------------------------------------------
# The switch (any machine)


def test_below_the_rule_the_default_is_the_tile_backward_bit_for_bit(monkeypatch):
    """Unset ("auto") at a shape outside the rule (128 rows), or "triton": the tile-language
    kernels run (never a Gluon op), with the same bits either way."""
    calls = []
    monkeypatch.setattr(gb, "flash_attention_dkdv_gluon", lambda *a: calls.append(a))
    monkeypatch.setattr(gb, "flash_attention_dq_gluon", lambda *a: calls.append(a))
    monkeypatch.delenv(ENV, raising=False)
    assert gb.backend() == "auto"
    dtype = torch.bfloat16 if GLUON else torch.float32
    q, k, v = qkv((1, 4, 128, 64), dtype, kv_heads=2)
    assert gb.use_gluon_dkdv(q, k, v, True) is False
    unset = grads(q, k, v, True)
    monkeypatch.setenv(ENV, "triton")
    assert gb.use_gluon_dkdv(q, k, v, True) is False
    forced_tile = grads(q, k, v, True)
    assert calls == []
    for a, b in zip(unset, forced_tile):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n, d, causal, kv_heads, dtype, want", [
    (4096, 64, True, None, torch.bfloat16, True),
    (16384, 64, True, None, torch.bfloat16, True),   # the leaderboard's shape
    (8192, 64, False, None, torch.bfloat16, True),
    (4096, 128, True, 2, torch.bfloat16, True),      # grouped-query
    (8192, 128, False, None, torch.bfloat16, False),  # measured faster, not outside the noise (4 sequences: not
                                                      # the fused kernel's class, which takes 64 or more)
    (2048, 128, True, 2, torch.bfloat16, True),      # causal at 128 and 80 from 2,048 rows (with plans)
    (2048, 128, True, None, torch.bfloat16, True),
    (1024, 128, True, 2, torch.bfloat16, False),     # not measured faster
    (2048, 64, True, None, torch.bfloat16, False),   # the same within the noise at 2,048 rows
    (1024, 64, True, 2, torch.bfloat16, True),       # grouped-query causal at 64 from 1,024 rows
    (512, 64, True, 2, torch.bfloat16, False),
    (1024, 64, False, 2, torch.bfloat16, False),     # not timed
    (1024, 64, True, None, torch.bfloat16, False),   # the same on the GPU, slower with the host
    (4096, 64, True, None, torch.float16, False),    # not timed
    (8192, 80, True, None, torch.bfloat16, True),     # head dim 80 (the 2.7B model's), causal or not
    (8192, 80, False, None, torch.bfloat16, True),
    (2048, 80, True, None, torch.bfloat16, True),
    (2048, 80, False, None, torch.bfloat16, False),   # non-causal from 4,096 rows only (not timed below)
])
def test_auto_picks_the_gluon_backward_where_it_was_measured_faster(monkeypatch, n, d, causal, kv_heads, dtype,
                                                                   want):
    """"auto" (the default): both Gluon kernels exactly in the measured class, wherever they can
    run the call (made runnable here off a GPU); the tile-language backward elsewhere."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)
    q, k, v = qkv((8, 4, n, d), dtype, kv_heads, device="meta")  # 32 sequences: from 256 query tiles at 1,024 rows
    assert gb.use_gluon_dkdv(q, k, v, causal) is want
    assert gb.use_gluon_dq() is True  # where it picks dK/dV, dQ too


@pytest.mark.parametrize("shape, want", [
    ((1, 1, 4096, 128), False),    # the assignment's grid: one sequence, 32 query tiles
    ((1, 1, 16384, 128), False),   # 128 tiles
    ((1, 1, 32768, 128), True),    # 256 tiles (AUTO_MIN_TILES)
    ((1, 2, 16384, 64), True),
    ((1, 1, 16384, 64), False),
    ((16, 1, 1024, 64), False),    # the assignment's (16, 1,024, D): below the rows' rule anyway
])
def test_with_few_query_tiles_auto_keeps_the_tile_backward(monkeypatch, shape, want):
    """Below AUTO_MIN_TILES query tiles of 128 rows in the call, "auto" keeps the tile backward, whose
    split spreads a short call over the SMs, whatever the rows' rule says; from it the rows' rule
    decides (causal bf16 at head dims 64 and 128 from 4,096 rows: the Gluon kernels)."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)
    q, k, v = qkv(shape, torch.bfloat16, None, device="meta")
    assert gb.use_gluon_dkdv(q, k, v, True) is want


@pytest.mark.parametrize("shape, kv_heads, causal", [
    ((4, 25, 2048, 64), None, True),     # the fused kernel's class at head dim 64
    ((8, 16, 2048, 128), None, True),
    ((4, 32, 2048, 128), 8, True),       # grouped-query
    ((1, 16, 16384, 64), None, True),    # the leaderboard's shape
    ((1, 2, 33, 80), None, True),        # below every rule
    ((2, 4, 4096, 64), None, False),
    ((4, 16, 2048, 128), None, False),   # the fused kernel's non-causal class
])
def test_the_rules_take_a_traces_symbolic_sizes(monkeypatch, shape, kv_heads, causal):
    """Under torch.compile with dynamic shapes the backward op's dispatch runs on fake tensors whose
    sizes are symbolic (torch.SymInt, which cannot be hashed): the rules answer as they do for the same
    sizes given as ints."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)
    monkeypatch.setattr(fg, "sm_count", lambda device: 132)
    q, k, v = qkv(shape, torch.bfloat16, kv_heads, device="meta")
    want = (gb.prefers_gluon(q, k, v, causal), gb.fused_class(q, k, causal))
    mode = FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 4)
    fq, fk, fv = (mode.from_tensor(torch.empty(t.shape, dtype=t.dtype), symbolic_context=dynamic) for t in (q, k, v))
    assert isinstance(fq.shape[-1], torch.SymInt)
    with mode:
        assert (gb.prefers_gluon(fq, fk, fv, causal), gb.fused_class(fq, fk, causal)) == want


def test_the_rows_kernel_column_names_what_runs(monkeypatch):
    """ft.kernels (the benchmark rows' `kernel` column) follows the dispatch: the Gluon pair in the
    auto rule's class, the Gluon dK/dV after the tile dQ under gluon-dkdv, the tile backward under
    triton; the forward's kernel as _gluon_forward picks it."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)
    q, k, v = qkv((2, 16, 16384, 64), torch.bfloat16, device="meta")  # 32 sequences: not the fused kernel's class
    monkeypatch.setattr(fg, "use_gluon", lambda *a, **kw: True)
    assert ft.kernels(q, k, v, True) == "forward: gluon; backward: gluon dq + gluon dkdv"
    monkeypatch.setenv(ENV, "gluon-dkdv")
    assert ft.kernels(q, k, v, True) == "forward: gluon; backward: tile dq + gluon dkdv"
    monkeypatch.setenv(ENV, "triton")
    monkeypatch.setattr(fg, "use_gluon", lambda *a, **kw: False)
    assert ft.kernels(q, k, v, True) in ("forward: tile; backward: tile dq + tile dkdv",
                                          "forward: tile; backward: tile fused")
    fused = ft.launch_bwd_config(16384, 64, torch.bfloat16, True, 4, 1).get("fused")
    assert ft.kernels(q, k, v, True).endswith("tile fused" if fused else "tile dq + tile dkdv")


def test_auto_never_raises_where_the_gluon_backward_cannot_run(monkeypatch):
    """In the rule's class but refused by `unsupported` (here: no Hopper GPU, or a 200-row tail):
    the tile-language backward, no error."""
    monkeypatch.setenv(ENV, "auto")
    q, k, v = qkv((1, 2, 4096 + 200, 64), torch.bfloat16, device="meta")
    assert gb.use_gluon_dkdv(q, k, v, True) is False
    if not GLUON:
        q, k, v = qkv((1, 2, 4096, 64), torch.bfloat16, device="meta")
        assert gb.use_gluon_dkdv(q, k, v, True) is False


def test_forcing_gluon_where_it_cannot_run_says_why(monkeypatch):
    monkeypatch.setenv(ENV, "gluon")
    q, k, v = qkv((1, 2, 200, 64))  # N not a multiple of 128: outside the contract on any machine
    with pytest.raises(ValueError, match="LMPERF_FA_BWD_BACKEND=gluon.*cannot run this call.*multiple of 128"):
        gb.use_gluon_dkdv(q, k, v, False)
    if not GLUON:  # and on this machine nothing runs it: the reason names the machine, in the backward
        q, k, v = qkv((1, 2, 128, 64), device="cpu")
        with pytest.raises(ValueError, match="cannot run this call: .*(Hopper|interpreter|Gluon)"):
            gb.use_gluon_dkdv(q, k, v, True)
        with pytest.raises(ValueError, match="LMPERF_FA_BWD_BACKEND=gluon"):
            grads(q, k, v, True)


def test_an_unknown_backend_is_an_error(monkeypatch):
    monkeypatch.setenv(ENV, "cudnn")
    q, k, v = qkv((1, 1, 128, 64), device="cpu")
    with pytest.raises(ValueError, match="expected one of auto, triton, gluon, gluon-dkdv"):
        gb.use_gluon_dkdv(q, k, v, False)


def _stubbed_gluon(monkeypatch, cfg, calls):
    """The Gluon kernels' launchers and ops replaced by the tile kernels (so the gradients must be
    the default's), each call recorded: (kernel, "launcher" or "op", Delta it wrote or read)."""
    tile_dq, tile_dkdv = ft.launch_backward_dq, ft.launch_backward_dkdv

    def dq_stub(path):
        def stub(q3, k3, v3, o3, do3, lse, delta, dq, is_causal):
            tile_dq(q3, k3, v3, o3, do3, lse, delta, dq, is_causal, {"dq": {**cfg["dq"], "SPLIT": 1}})
            calls.append(("dq", path, delta.clone()))
        return stub

    def dkdv_stub(path):
        def stub(q3, k3, v3, do3, lse, delta, dk, dv, is_causal):
            calls.append(("dkdv", path, delta.clone()))
            tile_dkdv(q3, k3, v3, do3, lse, delta, dk, dv, is_causal, {"dkdv": {**cfg["dkdv"], "SPLIT": 1}})
        return stub
    monkeypatch.setattr(gb, "launch_dq", dq_stub("launcher"))
    monkeypatch.setattr(gb, "launch_dkdv", dkdv_stub("launcher"))
    monkeypatch.setattr(gb, "flash_attention_dq_gluon", dq_stub("op"))
    monkeypatch.setattr(gb, "flash_attention_dkdv_gluon", dkdv_stub("op"))
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)


def test_forced_gluon_dkdv_runs_the_gluon_dkdv_after_the_tile_dq(monkeypatch):
    """gluon-dkdv (and the kernel able to run, stubbed here off a GPU): the tile dQ kernel runs
    first and writes Delta, then the Gluon dK/dV kernel fills dK and dV (here with the tile kernel's
    result, so the gradients must equal the default's); the fused one-launch backward is bypassed
    (it has no separate dK/dV launch)."""
    dtype = torch.bfloat16 if GLUON else torch.float32
    q, k, v = qkv((1, 4, 128, 64), dtype, kv_heads=2)
    cfg = ft.launch_bwd_config(128, 64, dtype, True, 4, 2)
    assert cfg["fused"]  # so this shape also shows the bypass
    monkeypatch.delenv(ENV, raising=False)
    ref = grads(q, k, v, True)
    calls = []
    _stubbed_gluon(monkeypatch, cfg, calls)
    monkeypatch.setenv(ENV, "gluon-dkdv")
    assert not gb.use_gluon_dq()
    got = grads(q, k, v, True)
    assert [c[:2] for c in calls] == [("dkdv", "launcher")] and torch.isfinite(calls[0][2]).all()
    for a, b in zip(got, ref):  # the fused kernel's gradients against the two-kernel path's
        torch.testing.assert_close(a, b)


def test_forced_gluon_runs_the_gluon_dq_then_the_gluon_dkdv(monkeypatch):
    """gluon: the Gluon dQ kernel runs (writing dQ and Delta), then the Gluon dK/dV kernel reads
    that Delta; no tile kernel is launched by the backward itself (both stubbed with the tile
    kernels here, so the gradients must equal the default's). In eager mode through their
    launchers, not their ops (whose wrappers cost host time)."""
    dtype = torch.bfloat16 if GLUON else torch.float32
    q, k, v = qkv((1, 4, 256, 64), dtype, kv_heads=2)
    cfg = ft.launch_bwd_config(256, 64, dtype, False, 4, 2)
    monkeypatch.delenv(ENV, raising=False)
    ref = grads(q, k, v, False)
    calls = []
    _stubbed_gluon(monkeypatch, cfg, calls)
    monkeypatch.setenv(ENV, "gluon")
    assert gb.use_gluon_dq()
    launched = []
    monkeypatch.setattr(ft, "launch_backward_dq", lambda *a, **kw: launched.append("dq"))
    monkeypatch.setattr(ft, "launch_backward_fused", lambda *a, **kw: launched.append("fused"))
    got = grads(q, k, v, False)
    assert launched == []
    assert [c[:2] for c in calls] == [("dq", "launcher"), ("dkdv", "launcher")]
    assert torch.isfinite(calls[0][2]).all() and torch.equal(calls[0][2], calls[1][2])
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)


def test_the_backward_op_runs_the_gluon_ops(monkeypatch):
    """Inside the backward's op (what torch.compile traces, launch = wrap_triton) the Gluon kernels
    run through their opaque ops; the eager path (launch = plain_launch) through their launchers: the
    same kernels either way."""
    dtype = torch.bfloat16 if GLUON else torch.float32
    q, k, v = qkv((1, 4, 256, 64), dtype, kv_heads=2)
    cfg = ft.launch_bwd_config(256, 64, dtype, True, 4, 2)
    calls = []
    _stubbed_gluon(monkeypatch, cfg, calls)
    monkeypatch.setenv(ENV, "gluon")
    out, lse = ft.forward_with_lse(q, k, v, True)
    do = torch.randn_like(q)
    lse3 = lse.reshape(4, 256).contiguous()
    for launch, path in ((ft.wrap_triton, "op"), (ft.plain_launch, "launcher")):
        calls.clear()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ft.launch_backward(q, k, v, out, do, lse3, dq, dk, dv, True, cfg, launch)
        assert [c[:2] for c in calls] == [("dq", path), ("dkdv", path)]


# ---------------------------------------------------------------------------------------------
# The contract (any machine)


@pytest.mark.parametrize("shape, kv_heads, dtype, why", [
    ((2, 3, 128, 64), None, torch.bfloat16, None),
    ((1, 8, 1152, 128), 2, torch.float16, None),    # grouped-query, N = 9 x 128
    ((1, 2, 16384, 64), None, torch.bfloat16, None),
    ((1, 2, 200, 64), None, torch.bfloat16, "multiple of 128"),
    ((1, 2, 1, 64), None, torch.bfloat16, "multiple of 128"),
    ((1, 2, 256, 80), None, torch.bfloat16, None),   # two column slices, 64 + 16
    ((1, 2, 256, 96), None, torch.bfloat16, "head dims"),
    ((1, 2, 256, 32), None, torch.bfloat16, "head dims"),
    ((1, 2, 256, 64), None, torch.float32, "bf16 and fp16"),
    ((1, 6, 256, 64), 4, torch.bfloat16, "shapes do not match"),
])
def test_which_calls_the_kernel_takes(shape, kv_heads, dtype, why):
    q, k, v = qkv(shape, dtype, kv_heads, device="meta")
    got = gb.shape_unsupported(q, k, v, True)
    assert (got is None) if why is None else (why in got), got


def test_layouts_it_reads_in_place():
    """(B, H, N, D) contiguous and (B, H, N, D) views of (B, N, H, D) memory, as the Gluon forward;
    a stride along D is refused."""
    x = torch.empty(2, 256, 4, 64, dtype=torch.bfloat16, device="meta").transpose(1, 2)
    assert gb.shape_unsupported(x, x, x, False) is None
    y = torch.empty(2, 4, 256, 128, dtype=torch.bfloat16, device="meta")[..., ::2]
    assert "neither" in gb.shape_unsupported(y, y, y, False)


def test_the_op_is_opaque_to_a_trace():
    """The ops' fakes (what torch.compile traces): they write dk and dv (dq and delta) in place,
    and return nothing."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v, do = (torch.empty(1, 2, 128, 64, dtype=torch.bfloat16) for _ in range(4))
        lse, delta = torch.empty(2, 128), torch.empty(2, 128)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        assert torch.ops.lmperf.flash_attention_dkdv_gluon(q, k, v, do, lse, delta, dk, dv, True) is None
        dq = torch.empty_like(q)
        assert torch.ops.lmperf.flash_attention_dq_gluon(q, k, v, q, do, lse, delta, dq, True) is None


# ---------------------------------------------------------------------------------------------
# A compile for sm_90 on this machine (no GPU needed): frontend, layouts, ptxas, and spills

COMPILE = r'''
from lmperf.kernels import flash_attention_gluon_bwd as gb


def compile_spec(kind, rest):
    d, causal, group, dt = rest.split(",")
    d, causal, group = int(d), causal == "1", int(group)
    dtype = getattr(torch, dt)
    q = torch.empty(1, 2 * group, 256, d, dtype=dtype)
    k, v = torch.empty(1, 2, 256, d, dtype=dtype), torch.empty(1, 2, 256, d, dtype=dtype)
    lse = torch.empty(2 * group, 256)
    if kind == "dkdv":
        return gb.launch_dkdv(q, k, v, torch.empty_like(q), lse, lse, torch.empty_like(k), torch.empty_like(v),
                              causal, compile_only=True)
    if kind.startswith("fused"):  # flash_attention_gluon_fused's kernel (tests/test_flash_attention_gluon_fused.py),
        # "fusedN" at its schedule N, "fusedpN" persistent at it; "fusedw" with the writer the kernel's
        # first partition, "fusedc" the first consumer; "fusedpeel" a non-causal call's first steps peeled,
        # "fuseddefer" the dQ shares deferred, "fusedslices" a head in two column slices and no step trimmed,
        # "fusedtail" schedule 1 with a tail
        from lmperf.kernels import flash_attention_gluon_fused as gf
        layouts = {"fusedw": gf.WRITER_FIRST, "fusedc": gf.CONSUMER_FIRST, "fusedpeel": dict(peel=True),
                   "fuseddefer": dict(defer=True), "fusedslices": dict(whole=False, trim=False),
                   "fusedtail": dict(schedule=1, tail=1)}
        rest = kind[5:].removeprefix("p")
        kw = layouts[kind] if kind in layouts else dict(schedule=int(rest) if rest else None,
                                                        persistent=kind.startswith("fusedp"))
        return gf.launch(q, k, v, torch.empty_like(q), torch.empty_like(q), lse, torch.empty_like(q),
                         torch.empty_like(k), torch.empty_like(v), causal, compile_only=True, **kw)
    return gb.launch_dq(q, k, v, torch.empty_like(q), torch.empty_like(q), lse, torch.empty_like(lse),
                        torch.empty_like(q), causal, compile_only=True)
'''

CONFIGS = ["64,0,1,bfloat16", "64,1,1,bfloat16", "128,0,1,bfloat16", "128,1,1,bfloat16", "128,1,1,float16",
           "64,1,4,bfloat16", "128,0,2,bfloat16", "128,1,4,bfloat16", "80,1,1,bfloat16", "80,0,4,float16"]
SPECS = [f"{kind}:{c}" for kind in ("dkdv", "dq") for c in CONFIGS]


@pytest.fixture(scope="module")
def sm90():
    pytest.importorskip("triton.experimental.gluon")
    return compile_specs(COMPILE, SPECS)


@pytest.mark.parametrize("spec", SPECS)
def test_compiles_for_sm90_with_wgmma_and_no_local_memory(sm90, spec):
    """Every configuration of both kernels compiles for the H100: its matrix products are wgmma (HGMMA in SASS),
    the partitions set their register counts (setmaxnreg), no array is put in local memory, and
    the shared memory fits the 227 KB a block may have."""
    r = sm90[spec]
    assert r["HGMMA"] > 0 and r["USETMAXREG"] > 0, r
    assert r["LOCAL"] == 0, r
    assert r["shared_bytes"] <= 232448, r


@pytest.mark.parametrize("spec", [s for s in SPECS if s != "dkdv:128,1,4,bfloat16"])
def test_no_register_spills(sm90, spec, request):
    """No spill store or load anywhere in the kernel: at head dim 128 each dK/dV consumer thread
    holds dK and dV, 128 fp32 registers, beside S^T and dP^T; each dQ consumer thread dQ (64) beside
    S and dP. Not yet the dK/dV kernel at head dim 128, causal, grouped-query (128,1,4: 20 spill
    stores with Triton 3.6, in the masked steps and before the loop over heads;
    tuning/flash_attention/NOTES.md step 42)."""
    expect_spills(request, spec)
    r = sm90[spec]
    assert r["STL"] == 0 and r["LDL"] == 0 and r["STACK"] == 0, r


@pytest.mark.parametrize("spec", [s for s in SPECS if s.startswith("dq:")])
def test_the_dq_products_overlap(sm90, spec):
    """The dQ kernel's S and dP products are in flight together and each step waits three times
    (S, dP, dQ): three wgmma waits per key-tile step and warpgroup, not one after every wgmma
    (what ptxas emits when a register operand's product is still in flight across the loop)."""
    r = sm90[spec]
    assert r["WARPGROUP.DEPBAR"] < r["HGMMA"] / 2, r


# ---------------------------------------------------------------------------------------------
# The kernel (Hopper)


def gluon_grads(monkeypatch):
    monkeypatch.setenv(ENV, "gluon")
    return ft.FlashAttention2Triton.apply


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [128, 384, 1152])
def test_matches_float64(monkeypatch, d, causal, n):
    """dQ, dK, dV (and O, L) against float64 within the contract's tolerance (twice plain
    PyTorch's error in the same dtype), bf16 with one head a K/V head and fp16 with 2."""
    apply = gluon_grads(monkeypatch)
    for dtype, shape, kv in ((torch.bfloat16, (2, 3, n, d), None), (torch.float16, (1, 4, n, d), 2)):
        q, k, v = qkv(shape, dtype, kv, seed=n)
        rows = compare(apply, q, k, v, causal)
        assert all(r["passed"] for r in rows), (dtype, rows)


@NEEDS_HOPPER
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [128, 80])
def test_the_models_layout_and_grouped_query(monkeypatch, causal, d):
    """(B, H, N, D) views of (B, N, H, D) projections, 8 query heads on 2 K/V heads: right against
    float64, and the same bits as contiguous inputs."""
    apply = gluon_grads(monkeypatch)
    q = torch.randn(2, 512, 8, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    k, v = (torch.randn(2, 512, 2, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2) for _ in range(2))
    rows = compare(apply, q, k, v, causal)
    assert all(r["passed"] for r in rows), rows
    g = torch.randn_like(q)
    a = grads(q, k, v, causal, g)
    b = grads(q.contiguous(), k.contiguous(), v.contiguous(), causal, g)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@NEEDS_HOPPER
def test_forced_gluon_runs_the_gluon_kernels(monkeypatch):
    """gluon: the Gluon dQ and dK/dV kernels; gluon-dkdv: the Gluon dK/dV only; triton: neither."""
    calls = []
    real_dq, real_dkdv = gb.launch_dq, gb.launch_dkdv
    monkeypatch.setattr(gb, "launch_dq", lambda *a, **kw: calls.append("dq") or real_dq(*a, **kw))
    monkeypatch.setattr(gb, "launch_dkdv", lambda *a, **kw: calls.append("dkdv") or real_dkdv(*a, **kw))
    q, k, v = qkv((1, 2, 256, 64))
    for backend, want in (("gluon", ["dq", "dkdv"]), ("gluon-dkdv", ["dkdv"]), ("triton", [])):
        calls.clear()
        monkeypatch.setenv(ENV, backend)
        grads(q, k, v, True)
        assert calls == want, backend


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_dq_kernel_alone_matches_float64(d, causal):
    """dQ and Delta of the Gluon dQ kernel alone, NaN-poisoned first (an unwritten element fails),
    against float64 within the contract's tolerance; grouped-query (8 query heads on 2), the
    model's layout for q, k, v and O; two runs the same bits."""
    from lmperf.kernels.attention_contract import reference, tolerance
    n = 640
    q = torch.randn(2, n, 8, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    k, v = (torch.randn(2, n, 2, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2) for _ in range(2))
    out, lse = ft.forward_with_lse(q, k, v, causal)
    do = torch.randn_like(q)
    runs = []
    for _ in range(2):
        dq = torch.full((2, 8, n, d), float("nan"), dtype=q.dtype, device="cuda")
        delta = torch.full((16, n), float("nan"), device="cuda")
        gb.launch_dq(q, k, v, out, do, lse.reshape(16, n), delta, dq, causal)
        runs.append((dq, delta))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    dq, delta = runs[0]
    want_delta = (out.double() * do.double()).sum(-1).reshape(16, n)
    assert float((delta.double() - want_delta).abs().max()) <= 1e-3 * float(want_delta.abs().max())
    errs = {}
    for name, dt in (("ref", torch.float64), ("torch", torch.bfloat16)):
        xs = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        o, _ = reference(*xs, causal, dtype=dt)
        o.backward(do.to(dt))
        errs[name] = xs[0].grad
    err = float((dq.double() - errs["ref"]).abs().max())
    assert err <= tolerance(float((errs["torch"].double() - errs["ref"]).abs().max()), torch.bfloat16), err


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_dkdv_after_the_tile_dq_matches_float64(monkeypatch, d):
    """gluon-dkdv (the Gluon dK/dV after the tile dQ): right against float64, causal grouped-query."""
    monkeypatch.setenv(ENV, "gluon-dkdv")
    q, k, v = qkv((1, 4, 384, d), kv_heads=2)
    rows = compare(ft.FlashAttention2Triton.apply, q, k, v, True)
    assert all(r["passed"] for r in rows), rows


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 80, 128])
def test_bitwise_deterministic(monkeypatch, d):
    """The same bits every run: no atomics, the query heads of a group added in a fixed order."""
    gluon_grads(monkeypatch)
    q, k, v = qkv((2, 8, 2048, d), kv_heads=2)
    g = torch.randn_like(q)
    first = grads(q, k, v, True, g)
    for _ in range(2):
        again = grads(q, k, v, True, g)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


@NEEDS_HOPPER
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_compiled_matches_eager_bitwise(monkeypatch, causal):
    """torch.compile (fullgraph, Inductor) with the Gluon dK/dV forced: no graph break, and the
    eager output and gradients bit for bit. The shape fills the H100 so that the tile dQ kernel
    does not split (tuning/flash_attention/NOTES.md step 40)."""
    apply = gluon_grads(monkeypatch)
    xs = [t.requires_grad_() for t in qkv((4, 8, 2048, 64), kv_heads=4)]
    cfg = ft.bwd_config(2048, 64, torch.bfloat16, causal, 32, 2)
    assert cfg["dq"]["SPLIT"] == 1
    assert_compiled_matches_eager(apply, xs, causal)
