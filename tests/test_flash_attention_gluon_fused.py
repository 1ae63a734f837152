"""The fused Gluon backward (lmperf.kernels.flash_attention_gluon_fused: dQ, dK and dV in one kernel,
dQ summed in key-tile order), forced by LMPERF_FA_BWD_BACKEND=gluon-fused and taken by "auto" in the
class it was measured faster in: on any machine the switch (what runs, where auto takes it, what
it refuses and why) and a compile of the kernel for sm_90 (the H100) whose cubin is read; on a
Hopper GPU the kernel against float64 (head dims 64 and 128, causal or not, grouped-query, the
model's layout), the same bits every run, auto's bits the forced kernel's, and torch.compile against
eager mode bit for bit."""
import functools

import pytest
import torch

from lmperf.kernels import flash_attention_gluon as fg
from lmperf.kernels import flash_attention_gluon_bwd as gb
from lmperf.kernels import flash_attention_gluon_fused as gf
from lmperf.kernels import flash_attention_triton as ft
from lmperf.kernels import launch as kernel_launch
from lmperf.kernels.attention_contract import compare
from tests.compiled_eager import assert_compiled_matches_eager
from tests.sm90 import compile_specs, expect_spills
from tests.test_flash_attention_gluon_bwd import COMPILE, ENV, GLUON, NEEDS_HOPPER, grads, qkv


def test_only_its_name_forces_it(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert not gb.use_fused()
    monkeypatch.setenv(ENV, "gluon")
    assert not gb.use_fused()
    monkeypatch.setenv(ENV, "gluon-fused")
    assert gb.use_fused()


@pytest.mark.parametrize("shape, kv_heads, causal, want", [
    ((8, 16, 2048, 128), None, True, True),     # the model group's head-dim-128 shape
    ((4, 16, 8192, 128), None, True, True),
    ((1, 64, 16896, 128), None, True, True),    # 132 key tiles: one a streaming multiprocessor
    ((1, 64, 17024, 128), None, True, False),   # 133: more than fit at once
    ((1, 1, 4096, 128), None, True, False),     # the assignment's grid (one sequence): not timed
    ((2, 16, 2048, 128), None, True, False),    # 32 sequences: not timed
    ((8, 16, 2048, 128), None, False, True),    # not causal, head dim 128: from 2,048 to 8,192 rows
    ((4, 16, 8192, 128), None, False, True),    # the throughput shape
    ((4, 16, 16384, 128), None, False, False),  # past 8,192 rows not causal: not timed
    ((2, 16, 2048, 128), None, False, False),   # 32 sequences: not timed
    ((4, 16, 1024, 128), None, False, False),   # below 2,048 rows: not timed
    ((4, 32, 4096, 128), 8, False, False),      # grouped-query: not timed
    ((4, 16, 8192, 64), None, False, False),    # not causal at head dim 64: the two Gluon kernels
    ((4, 32, 2048, 128), 8, True, False),       # grouped-query: slower
    ((8, 16, 1024, 128), None, True, False),    # the Gluon backward not taken (prefers_gluon)
    ((1, 16, 16384, 64), None, True, True),     # the leaderboard's shape
    ((2, 16, 16384, 64), None, True, False),    # 32 sequences: not timed
    ((1, 1, 16384, 64), None, True, False),     # one: not timed
    ((1, 16, 8192, 64), None, True, False),     # 16 sequences below 16,384 rows: not timed
    ((4, 25, 2048, 64), None, True, True),      # the xl model's shape
    ((8, 16, 4096, 64), None, True, True),
    ((4, 16, 8192, 64), None, True, True),
    ((4, 16, 16384, 64), None, True, False),    # 64 sequences of 16,384 rows: not timed
    ((2, 16, 2048, 64), None, True, False),     # 32 sequences: not timed
    ((4, 16, 1024, 64), None, True, False),     # the model's 1,024-row shape: not timed
    ((8, 16, 2048, 64), 4, True, False),        # grouped-query: slower
])
def test_auto_takes_it_where_it_was_measured_faster(monkeypatch, shape, kv_heads, causal, want):
    """"auto" (the default): the fused kernel instead of the two Gluon kernels exactly in the measured
    class (made runnable here off a GPU, on a GPU of 132 streaming multiprocessors); where the fused
    kernel cannot run the call, the two kernels, no error."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)
    monkeypatch.setattr(gf, "TMA_REDUCE_ERROR", None)
    monkeypatch.setattr(fg, "use_gluon", lambda *a, **kw: False)
    monkeypatch.setattr(fg, "sm_count", lambda device: 132)
    q, k, v = qkv(shape, torch.bfloat16, kv_heads, device="meta")
    picked = ft.kernels(q, k, v, causal).split("backward: ")[1]
    assert (picked == "gluon fused") is want, picked
    if want:
        monkeypatch.setattr(gf, "TMA_REDUCE_ERROR", "this Triton's Gluon has no TMA reduce (test)")
        assert ft.kernels(q, k, v, causal).endswith("backward: gluon dq + gluon dkdv")


@pytest.mark.parametrize("shape, kv_heads, causal, sms, want", [
    ((8, 16, 2048, 128), None, True, 132, 1),   # auto's classes: their schedules
    ((4, 25, 2048, 64), None, True, 132, 1),
    ((1, 16, 16384, 64), None, True, 132, 0),
    ((1, 64, 16896, 128), None, True, 132, 1),  # 132 key tiles, outside the class's sequences
    ((1, 64, 17024, 128), None, True, 132, 0),  # 133 key tiles: more than fit at once
    ((4, 16, 8192, 64), None, True, 60, 0),     # 64 key tiles on 60 SMs: the class refused
    ((4, 32, 2048, 128), 8, True, 132, 0),      # grouped-query
    ((8, 16, 2048, 128), None, False, 132, 1),  # not causal: by head dim
    ((8, 16, 2048, 64), None, False, 132, 0),
])
def test_the_launchers_schedule_is_its_class_s(monkeypatch, shape, kv_heads, causal, sms, want):
    """The schedule the launcher takes unasked: that of the class "auto" took the call in, where it
    was measured; elsewhere 1 at head dim 128 without grouped-query while a sequence's key tiles fit
    on the GPU at once, else 0 (schedules 1 and 2 cannot wait for ever only while they fit)."""
    monkeypatch.setattr(fg, "sm_count", lambda device: sms)
    q, k, v = qkv(shape, torch.bfloat16, kv_heads, device="meta")
    assert gf.default_schedule(q, k, causal) == want


def test_forcing_it_where_it_cannot_run_says_why(monkeypatch):
    """Head dim 80 (the two-kernel Gluon backward covers it, the fused kernel does not): a ValueError
    naming the variable and the head dims it covers, on any machine."""
    monkeypatch.setenv(ENV, "gluon-fused")
    q, k, v = qkv((1, 2, 128, 80), device="cpu")
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)  # the rest of the contract as on a Hopper GPU
    with pytest.raises(ValueError, match=r"LMPERF_FA_BWD_BACKEND=gluon-fused .*head dims \(64, 128\); got 80"):
        ft.kernels(q, k, v, True)


def test_pairs_of_key_tiles_are_refused_without_a_causal_mask():
    """Schedule 2's pairs balance the causal mask's unequal key tiles; asked for without it, a
    ValueError naming the schedule, before anything is compiled or launched (any machine)."""
    q, k, v = qkv((1, 2, 256, 64), device="cpu")
    x = torch.empty_like(q)
    with pytest.raises(ValueError, match="schedule 2 .* causal only"):
        gf.launch(q, k, v, x, x, torch.empty(2, 256), x, torch.empty_like(k), torch.empty_like(v), False,
                  schedule=2)


@pytest.mark.parametrize("causal, kw", [(False, {}), (True, dict(schedule=2)),
                                         (True, dict(schedule=0, persistent=True))], ids=["full", "pairs", "persistent"])
def test_deferred_shares_are_refused_where_a_step_cannot_hand_on_the_last(causal, kw):
    """A step stores the last step's dQ share, so a key tile's first steps must be out of its step loop
    (causal, or peeled), one key tile after another (not persistent, not schedule 2's pairs): asked
    for elsewhere, a ValueError naming what it needs, before anything is compiled (any machine)."""
    q, k, v = qkv((1, 2, 256, 64), device="cpu")
    x = torch.empty_like(q)
    with pytest.raises(ValueError, match="defers its dQ shares only where"):
        gf.launch(q, k, v, x, x, torch.empty(2, 256), x, torch.empty_like(k), torch.empty_like(v), causal,
                  defer=True, compile_only=True, **kw)


@pytest.mark.parametrize("d, causal, peel, persistent, schedule, grouped, want", [
    (64, True, False, False, 1, False, True),     # the measured class: causal at head dim 64
    (64, True, False, False, 0, False, True),
    (128, True, False, False, 1, False, False),   # no faster at 128
    (64, True, False, False, 1, True, False),     # grouped-query: not measured
    (64, False, False, False, 1, False, False),   # not causal, not peeled: the first step has no last share
    (64, False, True, False, 1, False, True),     # peeled
    (64, True, False, True, 0, False, False),     # persistent
    (64, True, False, False, 2, False, False),    # pairs of key tiles
])
def test_shares_are_deferred_unasked_where_measured(d, causal, peel, persistent, schedule, grouped, want):
    """Unasked, the kernel stores each step's dQ share in the next step at DEFER_DIMS without
    grouped-query, where a key tile's first steps are out of its loop and its key tiles come one at
    a time; asked, as asked where it can be."""
    assert gf.DEFER_DIMS == (64,)
    assert gf.defers(d, causal, peel, persistent, schedule, grouped) is want
    if want or (causal or peel) and not persistent and schedule != 2:
        assert gf.defers(d, causal, peel, persistent, schedule, grouped, asked=True) is True
    assert gf.defers(d, causal, peel, persistent, schedule, grouped, asked=False) is False


def test_a_triton_without_the_tma_reduce_is_refused_with_the_reason(monkeypatch):
    """The kernel adds dQ's shares by a TMA reduce that Gluon's builder has and its language lacks: a
    Triton without it is refused by name (a ValueError where forced), never a compile error."""
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)
    monkeypatch.setattr(gf, "TMA_REDUCE_ERROR", "this Triton's Gluon has no TMA reduce (test)")
    monkeypatch.setenv(ENV, "gluon-fused")
    q, k, v = qkv((1, 2, 128, 64), device="cpu")
    assert gf.unsupported(q, k, v, True) == "this Triton's Gluon has no TMA reduce (test)"
    with pytest.raises(ValueError, match="no TMA reduce"):
        ft.kernels(q, k, v, True)


def test_forced_it_runs_the_fused_launcher_alone(monkeypatch):
    """gluon-fused (the kernel able to run, stubbed here off a GPU by the tile kernels, so the
    gradients must be the default's): one call of the fused launcher in eager mode, no other
    backward kernel, and the rows' kernel column says so."""
    dtype = torch.bfloat16 if GLUON else torch.float32
    q, k, v = qkv((1, 4, 256, 64), dtype, kv_heads=2)
    monkeypatch.delenv(ENV, raising=False)
    ref = grads(q, k, v, True)
    cfg = ft.launch_bwd_config(256, 64, dtype, True, 4, 2)
    tile_dq, tile_dkdv = ft.launch_backward_dq, ft.launch_backward_dkdv
    calls = []

    def fused_stub(path):
        def stub(q3, k3, v3, o3, do3, lse, dq, dk, dv, is_causal):
            calls.append(path)
            delta = torch.empty(lse.shape, dtype=torch.float32, device=q3.device)
            tile_dq(q3, k3, v3, o3, do3, lse, delta, dq, is_causal, {"dq": {**cfg["dq"], "SPLIT": 1}})
            tile_dkdv(q3, k3, v3, do3, lse, delta, dk, dv, is_causal, {"dkdv": {**cfg["dkdv"], "SPLIT": 1}})
        return stub
    monkeypatch.setattr(gf, "launch", fused_stub("launcher"))
    monkeypatch.setattr(gf, "flash_attention_bwd_gluon_fused", fused_stub("op"))
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)
    monkeypatch.setattr(gf, "TMA_REDUCE_ERROR", None)
    monkeypatch.setattr(gb, "launch_dq", lambda *a, **kw: calls.append("gluon dq"))
    monkeypatch.setattr(gb, "launch_dkdv", lambda *a, **kw: calls.append("gluon dkdv"))
    monkeypatch.setenv(ENV, "gluon-fused")
    assert ft.kernels(q, k, v, True).endswith("backward: gluon fused")
    got = grads(q, k, v, True)
    assert calls == ["launcher"]
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)


def test_auto_runs_the_fused_launcher_alone_in_its_class(monkeypatch):
    """Unset ("auto"), a call in the fused kernel's class (the class shrunk here to this CPU's shape,
    the kernel stubbed by the tile kernels): one call of the fused launcher in eager mode, no other
    backward kernel, the default's gradients."""
    dtype = torch.bfloat16 if GLUON else torch.float32
    q, k, v = qkv((1, 4, 256, 64), dtype)
    monkeypatch.delenv(ENV, raising=False)
    ref = grads(q, k, v, True)
    cfg = ft.launch_bwd_config(256, 64, dtype, True, 4, 1)
    tile_dq, tile_dkdv = ft.launch_backward_dq, ft.launch_backward_dkdv
    calls = []

    def stub(q3, k3, v3, o3, do3, lse, dq, dk, dv, is_causal):
        calls.append("launcher")
        delta = torch.empty(lse.shape, dtype=torch.float32, device=q3.device)
        tile_dq(q3, k3, v3, o3, do3, lse, delta, dq, is_causal, {"dq": {**cfg["dq"], "SPLIT": 1}})
        tile_dkdv(q3, k3, v3, do3, lse, delta, dk, dv, is_causal, {"dkdv": {**cfg["dkdv"], "SPLIT": 1}})
    monkeypatch.setattr(gf, "launch", stub)
    monkeypatch.setattr(gb, "unsupported", lambda *a: None)
    monkeypatch.setattr(gb, "prefers_gluon", lambda *a: True)
    monkeypatch.setattr(gb, "AUTO_FUSED_CAUSAL", {64: ((256, None, 4, 4, 0),)})
    monkeypatch.setattr(gf, "TMA_REDUCE_ERROR", None)
    monkeypatch.setattr(gb, "launch_dq", lambda *a, **kw: calls.append("gluon dq"))
    monkeypatch.setattr(gb, "launch_dkdv", lambda *a, **kw: calls.append("gluon dkdv"))
    ft.clear_plans()  # ref's call (on a GPU, under plans) recorded the unpatched rule's launches
    assert ft.kernels(q, k, v, True).endswith("backward: gluon fused")
    got = grads(q, k, v, True)
    assert calls == ["launcher"]
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)


def test_the_op_is_opaque_to_a_trace():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v, out, do = (torch.empty(1, 2, 128, 64, dtype=torch.bfloat16) for _ in range(5))
        lse = torch.empty(2, 128)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        assert torch.ops.lmperf.flash_attention_bwd_gluon_fused(q, k, v, out, do, lse, dq, dk, dv, True) is None


# ---------------------------------------------------------------------------------------------
# A compile for sm_90 on this machine (no GPU needed)

SPECS = ([f"fused:{c}" for c in ("64,0,1,bfloat16", "64,1,4,bfloat16", "128,0,1,bfloat16", "128,1,2,float16")]
         + [f"fused2:{c}" for c in ("64,1,4,bfloat16", "128,1,4,bfloat16")]  # pairs of key tiles
         + [f"fusedw:{c}" for c in ("64,1,1,bfloat16", "128,1,1,bfloat16")]  # the writer the first partition
         + [f"fusedc:{c}" for c in ("64,1,1,bfloat16", "128,1,1,bfloat16")]  # the first consumer
         + [f"fusedp0:{c}" for c in ("64,1,1,bfloat16", "128,1,1,bfloat16", "128,0,2,float16")]  # persistent
         + ["fusedpeel:128,0,1,bfloat16"]  # non-causal, the first steps out of the step loop
         + [f"fuseddefer:{c}" for c in ("64,1,1,bfloat16", "128,1,1,bfloat16")]  # dQ shares stored a step late
         + ["fusedslices:128,1,1,bfloat16"]  # causal, a head in two column slices, no step trimmed
         + [f"fusedtail:{c}" for c in ("64,1,1,bfloat16", "128,1,1,bfloat16")])  # schedule 1 with a tail
SHARED_MAX = 232448  # bytes of shared memory a program may use on an H100
# (spill stores, spill loads) in each spec's step loops (tests/sm90.py, loop_spills) as the pinned Triton
# compiles it: paid at every step, not once a program (tuning/flash_attention/NOTES.md step 70)
# Causal at head dim 128 a head loads whole with its first step trimmed (WHOLE_DIMS, TRIM_DIMS): none in the
# default layout's loops; the consumer-first layout (not the default at 128) 3 stores and 15 loads, where in
# slices it had 1 and 12.
LOOP_SPILLS = {
    "fused:64,0,1,bfloat16": (0, 0), "fused:64,1,4,bfloat16": (4, 14), "fused:128,0,1,bfloat16": (8, 22),
    "fused:128,1,2,float16": (0, 0), "fused2:64,1,4,bfloat16": (40, 98), "fused2:128,1,4,bfloat16": (30, 118),
    "fusedw:64,1,1,bfloat16": (1, 3), "fusedw:128,1,1,bfloat16": (0, 0), "fusedc:64,1,1,bfloat16": (9, 12),
    "fusedc:128,1,1,bfloat16": (3, 15), "fusedp0:64,1,1,bfloat16": (11, 24), "fusedp0:128,1,1,bfloat16": (0, 18),
    "fusedp0:128,0,2,float16": (24, 48), "fusedpeel:128,0,1,bfloat16": (0, 1), "fuseddefer:64,1,1,bfloat16": (9, 12),
    "fuseddefer:128,1,1,bfloat16": (0, 0), "fusedslices:128,1,1,bfloat16": (0, 1), "fusedtail:64,1,1,bfloat16": (4, 6),
    "fusedtail:128,1,1,bfloat16": (0, 0),
}


@pytest.fixture(scope="module")
def sm90():
    pytest.importorskip("triton.experimental.gluon")
    return compile_specs(COMPILE, SPECS)


@pytest.mark.parametrize("spec", SPECS)
def test_compiles_for_sm90_with_its_products_in_flight(sm90, spec, request):
    """wgmma and TMA in the cubin, the shared memory within an H100's, and the products not
    serialised for want of registers (ptxas then waits after every wgmma: as many waits as
    products)."""
    expect_spills(request, spec)
    r = sm90[spec]
    assert r["HGMMA"] > 0 and r["UTMALDG"] > 0, r
    assert r["shared_bytes"] <= SHARED_MAX, r
    assert r["WARPGROUP.DEPBAR"] < r["HGMMA"] // 2, r


@pytest.mark.parametrize("spec", SPECS)
def test_its_step_loops_spill_no_more_than_recorded(sm90, spec):
    """With the pinned Triton, no change to the kernel adds a spill store or load to its step loops
    (LOOP_SPILLS: a change that removes some lowers the record). Other releases allocate registers
    their own way (Triton 3.9: 34 spill loads in the head-dim-128 causal kernel's loops against 1)."""
    if not kernel_launch.verified_triton():
        pytest.skip("the record is the pinned Triton's register allocation")
    r = sm90[spec]
    stl, ldl = LOOP_SPILLS[spec]
    assert r["LOOP_STL"] <= stl and r["LOOP_LDL"] <= ldl, (r["LOOP_STL"], r["LOOP_LDL"])


def test_causal_head_dim_128_loads_a_head_whole_and_trims_by_default(sm90):
    """Unasked, the causal kernel at head dim 128 loads a head whole and trims each key tile's first step
    (WHOLE_DIMS, TRIM_DIMS): fewer products than in column slices (dK and dV 128 columns wide), no more
    spill stores, and with the pinned Triton none at all where the sliced kernel has some (Triton 3.9
    allocates its registers its own way: 61 against 64)."""
    whole, slices = sm90["fusedw:128,1,1,bfloat16"], sm90["fusedslices:128,1,1,bfloat16"]
    assert whole["HGMMA"] < slices["HGMMA"], (whole["HGMMA"], slices["HGMMA"])
    assert whole["STL"] <= slices["STL"], (whole["STL"], slices["STL"])
    if kernel_launch.verified_triton():
        assert whole["STL"] == 0 < slices["STL"], (whole["STL"], slices["STL"])


# ---------------------------------------------------------------------------------------------
# On a Hopper GPU


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [128, 1152])
def test_matches_float64(monkeypatch, d, causal, n):
    """dQ, dK, dV against float64 within the contract's tolerance, bf16 with one head a K/V head
    and fp16 with 2 query heads a K/V head."""
    monkeypatch.setenv(ENV, "gluon-fused")
    for dtype, shape, kv in ((torch.bfloat16, (2, 3, n, d), None), (torch.float16, (1, 4, n, d), 2)):
        q, k, v = qkv(shape, dtype, kv, seed=n)
        rows = compare(ft.FlashAttention2Triton.apply, q, k, v, causal)
        assert all(r["passed"] for r in rows), (dtype, rows)


@NEEDS_HOPPER
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_models_layout_and_grouped_query(monkeypatch, causal):
    """(B, H, N, D) views of (B, N, H, D) projections, 8 query heads on 2 K/V heads: right against
    float64, and the same bits as contiguous inputs."""
    monkeypatch.setenv(ENV, "gluon-fused")
    q = torch.randn(2, 512, 8, 128, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    k, v = (torch.randn(2, 512, 2, 128, dtype=torch.bfloat16, device="cuda").transpose(1, 2) for _ in range(2))
    rows = compare(ft.FlashAttention2Triton.apply, q, k, v, causal)
    assert all(r["passed"] for r in rows), rows
    g = torch.randn_like(q)
    for x, y in zip(grads(q, k, v, causal, g), grads(q.contiguous(), k.contiguous(), v.contiguous(), causal, g)):
        assert torch.equal(x, y)


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 128])
def test_bitwise_deterministic(monkeypatch, d):
    """The same bits every run: dQ's shares added in key-tile order whatever order the programs run
    in, many programs waiting on their turns at once (8 heads on 2, 2,048 rows)."""
    monkeypatch.setenv(ENV, "gluon-fused")
    q, k, v = qkv((2, 8, 2048, d), kv_heads=2)
    g = torch.randn_like(q)
    first = grads(q, k, v, True, g)
    for _ in range(4):
        for a, b in zip(first, grads(q, k, v, True, g)):
            assert torch.equal(a, b)


def assert_right_every_run(q, k, v, causal):
    """dQ, dK, dV against float64 within the contract's tolerance, and the same bits in three more runs."""
    rows = compare(ft.FlashAttention2Triton.apply, q, k, v, causal)
    assert all(r["passed"] for r in rows), (q.dtype, rows)
    g = torch.randn_like(q)
    first = grads(q, k, v, causal, g)
    for _ in range(3):
        for a, b in zip(first, grads(q, k, v, causal, g)):
            assert torch.equal(a, b)


def assert_same_bits_either_way(monkeypatch, knob, d, causal, seed):
    """With gf.<knob> (a tuple of head dims) holding d and empty: right against float64 each way, with
    8 query heads on 2 (bf16, 1,152 rows) and with 3 on 3 (fp16, 384 rows), every run, and the same
    bits both ways."""
    for dtype, shape, kv in ((torch.bfloat16, (2, 8, 1152, d), 2), (torch.float16, (1, 3, 384, d), None)):
        q, k, v = qkv(shape, dtype, kv, seed=seed)
        g = torch.randn_like(q)
        runs = []
        for on in (True, False):
            monkeypatch.setattr(gf, knob, (d,) if on else ())
            ft.clear_plans()  # plans replay the launches they were made with
            try:
                assert_right_every_run(q, k, v, causal)
                runs.append(grads(q, k, v, causal, g))
            finally:
                ft.clear_plans()
        for a, b in zip(*runs):
            assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cpu_tensors_in_a_class_take_the_tile_backward_without_asking_for_a_gpu(monkeypatch, a_gpu_never_asked,
                                                                                   causal):
    """The classes read the GPU's streaming multiprocessors; CPU tensors (which the fused kernel never
    runs) are in none, and the dispatch asks torch for no CUDA device to say so (on a machine without
    one, that fails; one with a GPU stood in for here)."""
    monkeypatch.delenv(ENV, raising=False)
    q, k, v = qkv((4, 16, 2048, 128), torch.bfloat16, device="cpu")
    assert gb.fused_class(q, k, causal) is None
    assert gb.prefers_gluon(q, k, v, causal) is False


@NEEDS_HOPPER
def test_auto_takes_it_not_causal_at_head_dim_128_right_every_run(monkeypatch):
    """"auto" at a non-causal class of head dim 128 (64 sequences of 2,048 rows) runs the fused kernel:
    right against float64 and the same bits every run."""
    monkeypatch.delenv(ENV, raising=False)
    ft.clear_plans()
    q, k, v = qkv((4, 16, 2048, 128), seed=67)
    assert ft.kernels(q, k, v, False).endswith("backward: gluon fused")
    assert_right_every_run(q, k, v, False)


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n", [384, 2048])
def test_pairs_of_key_tiles_match_float64_every_run(monkeypatch, d, n):
    """Schedule 2 (a program a pair of key tiles, the group's heads inner): right against float64 with
    8 query heads on 2 and with 3 on 3, an odd count of key tiles (384 rows: 3) and an even one, the
    same bits every run."""
    monkeypatch.setenv(ENV, "gluon-fused")
    monkeypatch.setattr(gf, "default_schedule", lambda *a: 2)
    for dtype, shape, kv in ((torch.bfloat16, (2, 8, n, d), 2), (torch.float16, (1, 3, n, d), None)):
        assert_right_every_run(*qkv(shape, dtype, kv, seed=n + d), True)


@NEEDS_HOPPER
@pytest.mark.parametrize("layout", ["writer_first", "consumer_first"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_both_layouts_match_float64_every_run(monkeypatch, layout, d, causal):
    """The writer as the partition the kernel starts in (both consumers workers) and the first consumer
    as that partition, whichever CONFIGS picks at d: right against float64 with 8 query heads on 2 and
    with 3 on 3, the same bits every run."""
    monkeypatch.setenv(ENV, "gluon-fused")
    chosen = gf.WRITER_FIRST if layout == "writer_first" else gf.CONSUMER_FIRST
    monkeypatch.setitem(gf.CONFIGS, d, gf.config(chosen, block_m=gf.CONFIGS[d][2]))
    ft.clear_plans()  # plans replay the launches of the configs they were made at
    try:
        for dtype, shape, kv in ((torch.bfloat16, (2, 8, 1152, d), 2), (torch.float16, (1, 3, 384, d), None)):
            assert_right_every_run(*qkv(shape, dtype, kv, seed=d), causal)
    finally:
        ft.clear_plans()


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 128])
def test_the_first_steps_peeled_or_not_give_the_same_bits(monkeypatch, d):
    """Non-causal, the first steps of a key tile out of the step loop (PEEL_DIMS) or in it
    are the same steps in the same order: right against float64 either way with 8 query heads on 2
    and with 3 on 3, the same bits peeled and not."""
    monkeypatch.setenv(ENV, "gluon-fused")
    assert_same_bits_either_way(monkeypatch, "PEEL_DIMS", d, False, seed=d + 71)


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deferred_shares_give_the_same_bits(monkeypatch, d, causal):
    """Each step's dQ share stored by the next step (DEFER_DIMS; not causal, with the first steps
    peeled) or by its own: the same products and sums, so right against float64 either way with 8
    query heads on 2 and with 3 on 3, and the same bits deferred and not."""
    monkeypatch.setenv(ENV, "gluon-fused")
    monkeypatch.setattr(gf, "PEEL_DIMS", () if causal else (d,))
    assert_same_bits_either_way(monkeypatch, "DEFER_DIMS", d, causal, seed=d + 72)


@NEEDS_HOPPER
@pytest.mark.parametrize("defer", [False, True], ids=["own", "deferred"])
def test_the_head_whole_or_in_slices_gives_the_same_bits(monkeypatch, defer):
    """Causal at head dim 128, Q, dO, K and V loaded whole (WHOLE_DIMS: dK and dV one accumulator each)
    or in two column slices: the same products over the same columns in the same order, so right
    against float64 either way with 8 query heads on 2 and with 3 on 3, and the same bits."""
    monkeypatch.setenv(ENV, "gluon-fused")
    monkeypatch.setattr(gf, "DEFER_DIMS", (128,) if defer else ())
    assert_same_bits_either_way(monkeypatch, "WHOLE_DIMS", 128, True, seed=175 + defer)


@NEEDS_HOPPER
@pytest.mark.parametrize("whole", [False, True], ids=["slices", "whole"])
@pytest.mark.parametrize("defer", [False, True], ids=["own", "deferred"])
def test_the_first_steps_masked_half_skipped_gives_the_same_bits(monkeypatch, whole, defer):
    """Causal at head dim 128, a key tile's first step without its second warpgroup's products (TRIM_DIMS:
    its keys all after the step's rows, so its P and dS are zeros) or with them: right against float64
    either way with 8 query heads on 2 and with 3 on 3, and the same bits."""
    monkeypatch.setenv(ENV, "gluon-fused")
    monkeypatch.setattr(gf, "WHOLE_DIMS", (128,) if whole else ())
    monkeypatch.setattr(gf, "DEFER_DIMS", (128,) if defer else ())
    assert_same_bits_either_way(monkeypatch, "TRIM_DIMS", 128, True, seed=177 + 2 * whole + defer)


@NEEDS_HOPPER
@pytest.mark.parametrize("programs", [5, 132])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_matches_float64_every_run(monkeypatch, programs, d, causal):
    """Persistent with 5 programs (a program takes several key tiles: 36 and 27 here, 9 a sequence)
    and with more than there are tiles: right against float64 with 8 query heads on 2 and with 3 on 3,
    the same bits every run."""
    monkeypatch.setenv(ENV, "gluon-fused")
    monkeypatch.setattr(gf, "launch", functools.partial(gf.launch, schedule=0, persistent=True, programs=programs))
    ft.clear_plans()  # plans replay the launches they were made with
    try:
        for dtype, shape, kv in ((torch.bfloat16, (2, 8, 1152, d), 2), (torch.float16, (1, 3, 1152, d), None)):
            assert_right_every_run(*qkv(shape, dtype, kv, seed=d + programs), causal)
    finally:
        ft.clear_plans()


@pytest.mark.parametrize("schedule", [1, 2])
def test_persistent_refuses_what_could_wait_for_ever(schedule):
    """Persistent, a program may hold its next tile's ticket while it works: only schedule 0, where a
    tile waits only for tiles of earlier tickets, is safe then; the others are refused by name before
    anything is launched."""
    q = torch.empty(1, 2, 1152, 64)
    k, v = torch.empty_like(q), torch.empty_like(q)
    lse = torch.empty(2, 1152)
    args = (q, k, v, q, q, lse, q, k, v, True)
    with pytest.raises(ValueError, match=f"persistent.*schedule 0 only.*not {schedule}"):
        gf.launch(*args, schedule=schedule, persistent=True, compile_only=True)


@pytest.mark.parametrize("kw", [dict(is_causal=False), dict(schedule=0), dict(schedule=2), dict(persistent=True),
                                dict(asked=9), dict(asked=-1)],
                         ids=["full", "schedule0", "schedule2", "persistent", "too_many", "negative"])
def test_a_tail_is_refused_where_it_cannot_be(kw):
    """A tail of sequences only causal at schedule 1, not persistent, and of 1 to all the sequences: asked
    elsewhere, refused by name."""
    args = dict(d=128, is_causal=True, schedule=1, persistent=False, n_bkv=8, n_kt=16, sms=132, asked=4) | kw
    with pytest.raises(ValueError, match="only causal at schedule 1|a tail of -?[0-9]+ sequences of 8"):
        gf.tails(**args)


@pytest.mark.parametrize("d, causal, schedule, persistent, n_bkv, n_kt, want", [
    (128, True, 1, False, 128, 16, 24), (64, True, 1, False, 100, 16, 24), (128, True, 1, False, 64, 64, 6),
    (128, True, 1, False, 20, 16, 5), (128, True, 1, False, 3, 16, 0), (80, True, 1, False, 128, 16, 0),
    (128, False, 1, False, 128, 16, 0), (128, True, 0, False, 128, 16, 0), (128, True, 0, True, 128, 16, 0),
    (128, True, 2, False, 128, 16, 0)])
def test_a_tail_unasked_only_at_its_head_dims_causal_at_schedule_1(monkeypatch, d, causal, schedule, persistent,
                                                                    n_bkv, n_kt, want):
    """Unasked, at TAIL_DIMS causal at schedule 1 a tail of TAIL_FILL x SMs / key tiles sequences (3 x 132 /
    16: 24), at most a quarter of them; none elsewhere."""
    monkeypatch.setattr(gf, "TAIL_DIMS", (64, 128))
    monkeypatch.setattr(gf, "TAIL_FILL", 3)
    assert gf.tails(d, causal, schedule, persistent, n_bkv, n_kt, 132) == want


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 128])
def test_a_tail_gives_its_sequences_schedule_0s_bits_and_the_rest_schedule_1s(monkeypatch, d):
    """Causal at schedule 1 with its last `tail` sequences key tile by key tile (turns ascending): right
    against float64 every run, the tail's sequences (batch-major, K/V head fastest) the same bits as
    schedule 0 gives them, the others schedule 1's; a tail of all the sequences is schedule 0. 8 query
    heads on 2 (4 sequences, 9 key tiles: tails of 1 and 4) and 3 on 3 in 5 batches (15 sequences, 3 key
    tiles: a tail of 7)."""
    monkeypatch.setenv(ENV, "gluon-fused")
    launch = gf.launch
    for dtype, shape, kv, tails in ((torch.bfloat16, (2, 8, 1152, d), 2, (1, 4)),
                                    (torch.float16, (5, 3, 384, d), None, (7,))):
        q, k, v = qkv(shape, dtype, kv, seed=d + 80)
        g = torch.randn_like(q)
        n_bkv = shape[0] * (kv or shape[1])
        by = {}
        for name, kw in [("s0", dict(schedule=0)), ("s1", dict(schedule=1))] + [(t, dict(schedule=1, tail=t))
                                                                                 for t in tails]:
            monkeypatch.setattr(gf, "launch", functools.partial(launch, **kw))
            ft.clear_plans()  # plans replay the launches they were made with
            try:
                if name not in ("s0", "s1"):
                    assert_right_every_run(q, k, v, True)
                by[name] = grads(q, k, v, True, g)
            finally:
                ft.clear_plans()
        for t in tails:
            for x, s0, s1 in zip(by[t], by["s0"], by["s1"]):
                # (B, H, N, D) as one row a sequence (a K/V head and its query heads, batch-major)
                x, s0, s1 = (y.contiguous().reshape(n_bkv, -1) for y in (x, s0, s1))
                assert torch.equal(x[n_bkv - t:], s0[n_bkv - t:])
                assert torch.equal(x[:n_bkv - t], s1[:n_bkv - t])


@NEEDS_HOPPER
@pytest.mark.parametrize("d", [64, 128])
def test_auto_runs_it_with_the_forced_kernels_bits(monkeypatch, d):
    """Where "auto" takes it (causal, 64 sequences of 2,048 rows, a sequence's key tiles all on the GPU
    at once: the kernel's schedule by sequence): right against float64, the same bits as forced,
    every run."""
    q, k, v = qkv((1, 64, 2048, d))
    g = torch.randn_like(q)
    monkeypatch.delenv(ENV, raising=False)
    assert ft.kernels(q, k, v, True).endswith("backward: gluon fused")
    rows = compare(ft.FlashAttention2Triton.apply, q, k, v, True)
    assert all(r["passed"] for r in rows), rows
    auto = grads(q, k, v, True, g)
    monkeypatch.setenv(ENV, "gluon-fused")
    for _ in range(3):
        for a, b in zip(auto, grads(q, k, v, True, g)):
            assert torch.equal(a, b)


@NEEDS_HOPPER
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_compiled_matches_eager_bitwise(monkeypatch, causal):
    """torch.compile (fullgraph, Inductor): no graph break, and the eager output and gradients bit
    for bit (the backward an opaque op launching the same kernels)."""
    monkeypatch.setenv(ENV, "gluon-fused")
    apply = ft.FlashAttention2Triton.apply
    xs = [t.requires_grad_() for t in qkv((4, 8, 2048, 64), kv_heads=4)]
    cfg = ft.bwd_config(2048, 64, torch.bfloat16, causal, 32, 2)
    assert cfg["dq"]["SPLIT"] == 1
    assert_compiled_matches_eager(apply, xs, causal)


@NEEDS_HOPPER
@pytest.mark.parametrize("d,kv_heads", [(64, None), (128, 2)])
def test_the_planned_op_gives_the_launchers_bits(monkeypatch, d, kv_heads):
    """The op that compiled graphs call, with plans on: its first call of a signature (recorded)
    and two replays write the bits the launcher writes called straight (the JIT), in buffers that
    hold garbage before each call."""
    q, k, v = qkv((2, 4, 1152, d), kv_heads=kv_heads)
    out, lse = fg.forward(q, k, v, True)
    do = torch.randn_like(q)

    def grads_of(call):
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        call(q, k, v, out, do, lse, dq, dk, dv, True)
        return dq, dk, dv
    monkeypatch.setenv(kernel_launch.LAUNCH_ENV, "jit")
    want = grads_of(gf.launch)
    monkeypatch.setenv(kernel_launch.LAUNCH_ENV, "plan")
    monkeypatch.setattr(kernel_launch, "PLANS", kernel_launch.Plans())
    for _ in range(3):
        for a, b in zip(grads_of(torch.ops.lmperf.flash_attention_bwd_gluon_fused), want):
            assert torch.equal(a, b)
    assert len(kernel_launch.PLANS.plans) == 1 and all(kernel_launch.PLANS.plans.values())
