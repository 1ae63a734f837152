"""The Gluon FlashAttention forward (lmperf.kernels.flash_attention_gluon): which forward
FlashAttention2Triton runs (the dispatch), on any machine; and on a Hopper GPU the Gluon
kernels themselves against float64 (head dims, causal, grouped-query, the model's layout),
bitwise determinism, and torch.compile against eager mode bit for bit."""
import zlib

import pytest
import torch

from lmperf.kernels import flash_attention_gluon as fg
from lmperf.kernels import flash_attention_triton as ft
from lmperf.kernels.attention_contract import compare
from tests.compiled_eager import assert_compiled_matches_eager
from tests.sm90 import compile_specs

GLUON = fg.available() is None
NEEDS_HOPPER = pytest.mark.skipif(not GLUON, reason="needs a Hopper GPU: Gluon does not run in the Triton "
                                  f"interpreter ({fg.available()})")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def qkv(shape, dtype=torch.bfloat16, kv_heads=None, device=DEVICE, seed=0):
    torch.manual_seed(zlib.crc32(repr((shape, str(dtype), kv_heads, seed)).encode()))
    kv_shape = (*shape[:-3], kv_heads, *shape[-2:]) if kv_heads else shape
    return (torch.randn(shape, dtype=dtype, device=device), torch.randn(kv_shape, dtype=dtype, device=device),
            torch.randn(kv_shape, dtype=dtype, device=device))


# ---------------------------------------------------------------------------------------------
# The dispatch (any machine)


def test_the_tile_kernel_is_the_default(monkeypatch):
    """Unset or "auto": the Gluon forward only where it was measured faster (`prefers_gluon`),
    and never where it cannot run."""
    monkeypatch.delenv(fg.BACKEND_ENV, raising=False)
    q, k, v = qkv((1, 2, 64, 64), device="cpu")
    assert fg.use_gluon(q, k, v, True) is False
    monkeypatch.setattr(fg, "prefers_gluon", lambda *a: True)
    assert fg.use_gluon(q, k, v, True) is (fg.unsupported(q, k, v, True) is None)
    assert fg.use_gluon(q, k, v, True) is False  # CPU tensors: never


@pytest.mark.parametrize("shape, causal, expected", [
    ((4, 16, 8192, 128), False, True),  # the throughput shape
    ((4, 16, 8192, 128), True, True),
    ((4, 32, 2048, 128), True, True),   # the model group's grouped-query shapes (q heads)
    ((4, 16, 1024, 128), True, False),  # shorter: not measured faster
    ((4, 16, 2000, 128), False, False),  # ragged: a tile would run past the sequence's end
    ((1, 16, 16384, 64), True, True),   # the headline
    ((16, 16, 16384, 64), True, False),  # 256 sequences: slower than the tile kernel
    ((4, 16, 8192, 64), False, False),
    ((4, 32, 2048, 80), True, True),   # the 2.7B model's attention
    ((4, 16, 8192, 80), False, True),
    ((4, 32, 1024, 80), True, False),   # shorter: not measured
    ((1, 2, 4096, 96), True, False),    # a head dim Gluon does not cover
    # few sequences: the tile kernel splits its loop over the SMs and is faster (AUTO_MIN_SEQS)
    ((1, 1, 4096, 128), True, False),   # the assignment's grid: one sequence
    ((1, 1, 16384, 128), True, False),
    ((1, 4, 16384, 128), True, False),
    ((1, 8, 8192, 128), True, True),
    ((2, 4, 16384, 128), False, True),
    ((2, 16, 2048, 80), True, True),
    ((1, 1, 65536, 128), True, True),   # from AUTO_LONG_N rows, one sequence is enough
    ((1, 2, 32768, 80), True, False),
    ((1, 1, 16384, 64), True, False),   # head dim 64: from 4 sequences
    ((1, 2, 16384, 64), True, False),
    ((1, 4, 16384, 64), True, True),
    ((1, 1, 65536, 64), True, False),
])
def test_where_auto_prefers_gluon(shape, causal, expected):
    """The rule is the measured table (tuning/flash_attention/NOTES.md, steps 37-41, 45 and 69)."""
    q = torch.empty(shape, device="meta")
    assert fg.prefers_gluon(q, q, q, causal) is expected


def test_forcing_the_tile_kernel(monkeypatch):
    monkeypatch.setattr(fg, "prefers_gluon", lambda *a: True)
    q, k, v = qkv((1, 2, 64, 64), device=DEVICE)
    monkeypatch.setenv(fg.BACKEND_ENV, "triton")
    assert fg.use_gluon(q, k, v, False) is False
    assert fg.use_gluon(q, k, v, False, backend="triton") is False


def test_forcing_gluon_where_it_cannot_run_says_why(monkeypatch):
    monkeypatch.setenv(fg.BACKEND_ENV, "gluon")
    q, k, v = qkv((1, 2, 40, 96), dtype=torch.float16, device=DEVICE)  # head dim 96: not covered
    with pytest.raises(ValueError, match="LMPERF_FA_BACKEND=gluon.*cannot run this call"):
        fg.use_gluon(q, k, v, True)
    if not GLUON:  # and on this machine nothing runs it: the reason names the machine
        q, k, v = qkv((1, 2, 40, 64), device="cpu")
        with pytest.raises(ValueError, match="Hopper|interpreter|Gluon"):
            fg.use_gluon(q, k, v, True)
        with pytest.raises(ValueError, match="cannot run this call"):
            ft.FlashAttention2Triton.apply(q, k, v, True)


def test_cpu_tensors_are_refused_without_asking_for_a_gpu(monkeypatch, a_gpu_never_asked):
    """On a machine with a GPU (stood in for here), a call on CPU tensors is refused for its device,
    and the dispatch asks torch for no CUDA device to say so."""
    monkeypatch.delenv(fg.BACKEND_ENV, raising=False)
    q, k, v = qkv((8, 16, 2048, 128), device="cpu")
    if fg.IMPORT_ERROR is None:
        assert fg.unsupported(q, k, v, True) == "needs CUDA tensors; got cpu"
    assert fg.use_gluon(q, k, v, True) is False


def test_head_dim_80_is_two_column_slices_in_the_ping_pong_variant_only():
    """Gluon's tiles are powers of two: head dim 80 is computed as columns [0, 64) and [64, 80);
    the other variants refuse it by name rather than fail to compile."""
    assert fg.split_head_dim(80) == (64, 16)
    assert fg.split_head_dim(64) == (64, 0) and fg.split_head_dim(128) == (128, 0)
    assert 80 in fg.HEAD_DIMS and fg.config(80, True, "pp")
    q, k, v = qkv((1, 2, 256, 80), device="cpu")
    for variant in ("plain", "ws"):
        with pytest.raises(ValueError, match="covers head dims"):
            fg.launch_forward(q, k, v, torch.empty_like(q), torch.empty(2, 256), True, variant)
        with pytest.raises(ValueError, match="ping-pong"):
            fg.launch_forward(q, k, v, torch.empty_like(q), torch.empty(2, 256), True, variant, (128, 128, 8, 2))


def test_an_unknown_backend_is_an_error(monkeypatch):
    monkeypatch.setenv(fg.BACKEND_ENV, "cudnn")
    q, k, v = qkv((1, 1, 8, 64), device="cpu")
    with pytest.raises(ValueError, match="expected one of auto, gluon, triton"):
        fg.use_gluon(q, k, v, False)


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_the_dispatch_compiles_without_a_graph_break(monkeypatch, backend):
    """torch.compile (fullgraph) traces the choice ($LMPERF_FA_BACKEND read at trace time, the
    rule, the coverage checks) and gives eager mode's bits; here with the rule saying yes, so
    that "auto" asks whether Gluon can run (on a Hopper GPU it can, and the Gluon op runs)."""
    import torch._dynamo
    torch._dynamo.reset()
    monkeypatch.setenv(fg.BACKEND_ENV, backend)
    monkeypatch.setattr(fg, "prefers_gluon", lambda *a: True)
    apply = ft.FlashAttention2Triton.apply
    compiled = torch.compile(apply, backend="inductor" if GLUON else "aot_eager", fullgraph=True)
    dtype = torch.bfloat16 if GLUON else torch.float32
    q, k, v = qkv((1, 2, 40, 64), dtype=dtype)
    assert torch.equal(compiled(q, k, v, True), apply(q, k, v, True))


def test_which_layouts_are_read_in_place():
    """(B, H, N, D) contiguous, and (B, H, N, D) views of (B, N, H, D) memory, are read by TMA
    as they are; anything else (a stride along D, a head that is not a dense run of rows) is
    refused, and the tile kernel runs it."""
    x = torch.empty(2, 3, 5, 64)
    assert fg.head_rows(x) == (64, 15, 5, 0)
    assert fg.head_rows(torch.empty(2, 5, 3, 64).transpose(1, 2)) == (192, 5, 0, 64)
    assert fg.head_rows(torch.empty(2, 3, 5, 128)[..., ::2]) is None
    assert fg.head_rows(torch.empty(2, 3, 8, 64)[:, :, :5]) is None  # rows of a head not contiguous with the next


def test_the_gluon_op_has_the_tile_kernels_output_layout():
    """The op's fake (what torch.compile traces): O (B, N, H, D) in memory, L fp32 q.shape[:-1]."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v = (torch.empty(2, 3, 40, 64, dtype=torch.bfloat16) for _ in range(3))
        out, lse = torch.ops.lmperf.flash_attention_forward_gluon(q, k, v, True)
    assert out.shape == q.shape and out.stride() == (40 * 3 * 64, 64, 3 * 64, 1)
    assert lse.shape == (2, 3, 40) and lse.dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# A compile of the ping-pong kernel for sm_90 on this machine (no GPU needed)

COMPILE = r'''
from lmperf.kernels import flash_attention_gluon as fg


def compile_spec(spec):
    d, causal, group, dt, layout = spec.split(",")
    d, causal, group, dtype = int(d), causal == "1", int(group), getattr(torch, dt)
    if layout == "model":  # (B, H, N, D) views of (B, N, H, D) memory
        q, k, v = (torch.empty(1, 256, heads, d, dtype=dtype).transpose(1, 2) for heads in (2 * group, 2, 2))
    else:
        q, k, v = (torch.empty(1, heads, 256, d, dtype=dtype) for heads in (2 * group, 2, 2))
    return fg.launch_forward(q, k, v, torch.empty_like(q), torch.empty(2 * group, 256), causal, "pp",
                             compile_only=True)
'''
SPECS = ["64,1,1,bfloat16,heads", "80,1,1,bfloat16,heads", "80,0,4,float16,model"]


@pytest.fixture(scope="module")
def sm90():
    pytest.importorskip("triton.experimental.gluon")
    return compile_specs(COMPILE, SPECS)


def test_head_dim_80_compiles_for_sm90_as_two_slices_without_spills(sm90):
    """The ping-pong forward at head dim 80 compiles for the H100: wgmma products (more of them
    than at 64: the 16-column slice's), twice the TMA loads of the single-slice kernel (each tile
    in two slices), no spill, no local memory, no more wgmma waits a step than at head dim 64 (the
    slices' products are in flight together), and shared memory within the 227 KB a block may have."""
    base = sm90[SPECS[0]]
    for spec in SPECS[1:]:
        r = sm90[spec]
        assert r["STL"] == r["LDL"] == r["STACK"] == r["LOCAL"] == 0, (spec, r)
        assert r["HGMMA"] > base["HGMMA"] and r["UTMALDG"] == 2 * base["UTMALDG"], (spec, r, base)
        assert r["WARPGROUP.DEPBAR"] == base["WARPGROUP.DEPBAR"], (spec, r, base)
        assert r["shared_bytes"] <= 232448, (spec, r)


# ---------------------------------------------------------------------------------------------
# The kernels (Hopper)


def gluon_apply(monkeypatch):
    monkeypatch.setenv(fg.BACKEND_ENV, "gluon")
    return ft.FlashAttention2Triton.apply


# (variant, head dim) pairs each variant covers: head dim 80 only in the ping-pong variant (the
# others refuse it: test_head_dim_80_is_two_column_slices_in_the_ping_pong_variant_only)
VARIANT_DIMS = [(variant, d) for variant in ("plain", "ws", "pp") for d in (64, 80, 128) if d != 80 or variant == "pp"]


@NEEDS_HOPPER
@pytest.mark.parametrize("variant, d", VARIANT_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n", [1, 17, 1000, 4099])
def test_every_variant_matches_float64(monkeypatch, variant, d, causal, n):
    """O and L of each kernel (its table config) against float64, within the contract's tolerance
    (twice plain PyTorch's error in the same dtype); dQ, dK, dV through the tile backward."""
    monkeypatch.setattr(fg, "DEFAULT_VARIANT", variant)
    apply = gluon_apply(monkeypatch)
    for dtype, shape, kv in ((torch.bfloat16, (2, 3, n, d), None), (torch.float16, (1, 4, n, d), 2)):
        q, k, v = qkv(shape, dtype, kv, seed=n)
        rows = compare(apply, q, k, v, causal)
        assert all(r["passed"] for r in rows), (variant, dtype, rows)


@NEEDS_HOPPER
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [128, 80])
def test_the_models_layout_and_grouped_query(monkeypatch, causal, d):
    """(B, H, N, D) views of (B, N, H, D) projections, 8 query heads on 2 K/V heads: right
    against float64, O written (B, N, H, D) in memory, and the same bits as contiguous inputs."""
    apply = gluon_apply(monkeypatch)
    q = torch.randn(2, 300, 8, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
    k, v = (torch.randn(2, 300, 2, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2) for _ in range(2))
    rows = compare(apply, q, k, v, causal)
    assert all(r["passed"] for r in rows), rows
    out, lse = fg.forward(q, k, v, causal)
    assert out.transpose(1, 2).is_contiguous()
    out_c, lse_c = fg.forward(q.contiguous(), k.contiguous(), v.contiguous(), causal)
    assert torch.equal(out, out_c) and torch.equal(lse, lse_c)


@NEEDS_HOPPER
@pytest.mark.parametrize("variant, d", [(variant, d) for variant, d in VARIANT_DIMS if d != 64])
def test_bitwise_deterministic(variant, d):
    q, k, v = qkv((2, 8, 3000, d))
    first = fg.forward(q, k, v, True, variant)
    for _ in range(3):
        again = fg.forward(q, k, v, True, variant)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@NEEDS_HOPPER
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_compiled_matches_eager_bitwise(monkeypatch, causal):
    """torch.compile (fullgraph, Inductor) around apply with the Gluon forward forced: no graph
    break, and bit for bit the eager output and gradients. The shape fills the H100 so that the
    tile backward does not split (its split's fp32 partial sums are added by Inductor in another
    order than eager mode's, so a split backward's bf16 dK can differ in the last bit, whichever
    forward ran: tuning/flash_attention/NOTES.md step 40)."""
    apply = gluon_apply(monkeypatch)
    xs = [t.requires_grad_() for t in qkv((4, 8, 2048, 64), kv_heads=4)]
    cfg = ft.bwd_config(2048, 64, torch.bfloat16, causal, 32, 2)
    assert cfg["dq"]["SPLIT"] == 1 and cfg["dkdv"]["SPLIT"] == 1 and not cfg["fused"]
    assert_compiled_matches_eager(apply, xs, causal)


@NEEDS_HOPPER
def test_forced_gluon_runs_the_gluon_kernel(monkeypatch):
    calls = []
    real = fg.forward
    monkeypatch.setattr(fg, "forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = qkv((1, 2, 256, 64))
    gluon_apply(monkeypatch)(q, k, v, True)
    assert calls == [1]
    monkeypatch.setenv(fg.BACKEND_ENV, "triton")
    ft.FlashAttention2Triton.apply(q, k, v, True)
    assert calls == [1]
