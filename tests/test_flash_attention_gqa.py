"""Grouped-query and multi-query attention (k and v with H_kv heads, H_kv dividing q's H) in
the FlashAttention-2 implementations, against float64, compiled, and in the benchmark's rows and
the report's view of them."""
from pathlib import Path

import pytest
import torch

from lmperf.kernels import flash_attention_triton
from lmperf.kernels.attention_contract import compare
from test_flash_attention import COMPILE_BACKEND, DEVICE, DTYPES, IMPLS, check, force_fused, force_split

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_grouped_query_attention_matches_float64(impl, dtype, causal, group):
    """H / H_kv in {1, 4, 8} (8 over 1 K/V head: multi-query), a ragged N, against float64 (the
    reference repeats K and V, so its dK and dV are summed over each group)."""
    check(impl, (2, 8, 37, 32), dtype, causal, kv_heads=8 // group)


@pytest.mark.parametrize("fused", [False, True], ids=["two_kernels", "fused"])
@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_grouped_query_backward_paths_match_float64(monkeypatch, fused, split, dtype):
    """Both backward paths, split or not: the dK/dV programs walk every query head of their
    group in turn; in the one-launch backward they are dealt out to the group's query heads."""
    force_split(monkeypatch, split)
    force_fused(monkeypatch, fused)
    check("triton", (1, 4, 70, 40), dtype, True, kv_heads=1)
    check("triton", (2, 6, 33, 16), dtype, False, kv_heads=3)


def test_grouped_query_attention_reads_k_and_v_in_place():
    """K and V are neither repeated nor copied: the kernels read the (B, N, H_kv, D) projections'
    transposed views through their strides, and dK, dV come back in that layout; the result is
    the multi-head one with K and V repeated, bit for bit in the forward."""
    apply = flash_attention_triton.FlashAttention2Triton.apply
    q = torch.randn(2, 29, 6, 16, device=DEVICE).transpose(1, 2)
    k, v = (torch.randn(2, 29, 2, 16, device=DEVICE).transpose(1, 2).requires_grad_() for _ in range(2))
    out = apply(q, k, v, True)
    out.backward(torch.ones_like(out))
    assert k.grad.stride() == k.stride() and v.grad.stride() == v.stride()
    k_rep, v_rep = (t.detach().repeat_interleave(3, dim=1).requires_grad_() for t in (k, v))
    ref = apply(q, k_rep, v_rep, True)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    ref.backward(torch.ones_like(ref))
    for grad, rep in ((k.grad, k_rep.grad), (v.grad, v_rep.grad)):
        torch.testing.assert_close(grad, rep.view(2, 2, 3, 29, 16).sum(2), rtol=1e-5, atol=1e-5)


def test_grouped_query_backward_is_the_same_every_run(monkeypatch):
    """dK and dV are summed over the group in a fixed order (no atomics): bit for bit."""
    force_split(monkeypatch, 2)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 8, 90, 32, generator=gen).to(DEVICE)
    k, v = (torch.randn(1, 2, 90, 32, generator=gen).to(DEVICE) for _ in range(2))
    grad = torch.randn(1, 8, 90, 32, generator=gen).to(DEVICE)
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flash_attention_triton.FlashAttention2Triton.apply(*leaves, True)
        out.backward(grad)
        runs.append([out.detach(), *(t.grad for t in leaves)])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_compiled_grouped_query_attention_matches_eager_and_float64(causal):
    """Grouped-query and multi-query attention under torch.compile (fullgraph): no graph break,
    the eager results bit for bit, float64's within tolerance, through a recompile for a second
    group size."""
    import torch._dynamo
    torch._dynamo.reset()
    apply = flash_attention_triton.FlashAttention2Triton.apply
    compiled = torch.compile(apply, backend=COMPILE_BACKEND, fullgraph=True)
    for q_shape, kv_heads in [((2, 4, 45, 32), 1), ((1, 8, 33, 64), 2)]:
        q = torch.randn(q_shape, device=DEVICE, requires_grad=True)
        k, v = (torch.randn(q_shape[0], kv_heads, *q_shape[2:], device=DEVICE, requires_grad=True) for _ in range(2))
        out = compiled(q, k, v, causal)
        out.sum().backward()
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        ref = apply(*leaves, causal)
        ref.sum().backward()
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        for a, b in zip((q, k, v), leaves):
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
        rows = compare(compiled, q.detach(), k.detach(), v.detach(), causal)
        assert all(r["passed"] for r in rows), rows


@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA: bf16 tl.dot is wrong in Triton's CPU interpreter, and "
                    "on the CPU torch.compile sees the op as opaque (Inductor never traces into it)")
def test_compiled_split_grouped_query_backward_is_eager_bit_for_bit():
    """bf16 grouped-query attention at a shape whose dK/dV kernel splits its loop (fp32 partial
    sums): compiled (Inductor traces into the op) and eager give the same bits for O, dQ, dK and
    dV, so the sum of the partials cannot be left to a torch reduction that Inductor reorders."""
    import torch._dynamo
    torch._dynamo.reset()
    nb, nh, nkv, n, d = 2, 4, 2, 700, 64
    cfg = flash_attention_triton.bwd_config(n, d, torch.bfloat16, True, nb * nh, nh // nkv)
    assert cfg["dkdv"]["SPLIT"] > 1, cfg  # the shape the test is for
    apply = flash_attention_triton.FlashAttention2Triton.apply
    compiled = torch.compile(apply, backend=COMPILE_BACKEND, fullgraph=True)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(nb, nh, n, d, generator=gen).to(DEVICE, torch.bfloat16)
    k, v = (torch.randn(nb, nkv, n, d, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(2))
    grad = torch.randn(nb, nh, n, d, generator=gen).to(DEVICE, torch.bfloat16)
    runs = []
    for fn in (compiled, apply):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, True)
        out.backward(grad)
        runs.append([out.detach(), *(t.grad for t in leaves)])
    for name, a, b in zip(("O", "dQ", "dK", "dV"), *runs):
        assert torch.equal(a, b), f"{name}: compiled differs from eager by {(a.float() - b.float()).abs().max()}"


# The benchmark's grouped-query rows and the report's view of them


def test_grouped_query_bench_cases_and_their_check():
    from lmperf.bench.flash_attention import bench_cases
    group = {"name": "gqa", "batch": 2, "heads": 32, "kv_heads": 8, "causal": [True], "dtypes": ["bf16"],
             "seq_lens": [2048], "head_dims": [128], "providers": ["triton", "sdpa_cudnn"], "timing_ms": [25, 100],
             "tiled_max_seq_len": 4096}
    cases = bench_cases({"groups": [group]})
    assert {c["case_id"] for c in cases} == {"gqa-triton-bf16-causal-b2h32kv8n2048d128",
                                             "gqa-sdpa_cudnn-bf16-causal-b2h32kv8n2048d128"}
    assert all(c["kv_heads"] == 8 for c in cases)
    with pytest.raises(ValueError, match="kv_heads=6 does not divide heads=32"):
        bench_cases({"groups": [{**group, "kv_heads": 6}]})


def test_report_shows_grouped_query_rows_and_the_models_backward(tmp_path):
    """The GQA group's table (ours and each SDPA backend by GPU time, our speed-up over each), and the
    model group's backward alone; a model-group shape of no model size keeps its row."""
    import pandas as pd
    from lmperf.report import flash_attention as view_fa, render
    from lmperf.report.sections import SECTIONS, Inputs
    bench = tmp_path / "flash_attention" / "bench"
    bench.mkdir(parents=True)
    base = {"section": "flash_attention", "study": "bench", "dtype": "bf16", "causal": True, "status": "ok",
            "unit": "ms", "harness": "eager"}
    rows = []
    for provider, fwd, fb in (("triton", 1.0, 3.0), ("sdpa_flash", 1.5, 4.5), ("sdpa_cudnn", 0.8, 2.5)):
        for metric, value in (("forward_gpu_ms", fwd), ("fwd_bwd_gpu_ms", fb), ("fwd_bwd_ms", fb)):
            rows.append({**base, "group": "gqa", "provider": provider, "batch": 2, "heads": 32, "kv_heads": 8,
                         "seq_len": 2048, "head_dim": 128, "model": "", "metric": metric, "median": value,
                         "case_id": f"gqa-{provider}"})
    pd.DataFrame(rows).to_csv(bench / "gqa_d128.csv", index=False)
    rows = []
    for model, batch, heads, d in (("small", 4, 12, 64), ("", 8, 16, 128)):
        for provider, fb, bwd in (("triton", 1.0, 0.7), ("sdpa_cudnn", 2.0, 1.4)):
            for metric, value in (("fwd_bwd_gpu_ms", fb), ("backward_gpu_ms", bwd), ("fwd_bwd_ms", fb)):
                rows.append({**base, "group": "model", "provider": provider, "batch": batch, "heads": heads,
                             "kv_heads": heads, "seq_len": 2048, "head_dim": d, "model": model, "metric": metric,
                             "median": value, "harness": "leaderboard", "case_id": f"model-{provider}-d{d}"})
    pd.DataFrame(rows).to_csv(bench / "model.csv", index=False)
    bars = render.bars_from_config(REPO / "config" / "config.yaml")
    view = view_fa.view(Inputs(results=tmp_path, bars=bars, out_dir=tmp_path,
                               frames={s.name: render.load_section(tmp_path, s.name) for s in SECTIONS}))
    gqa = view["gqa"].iloc[0]
    assert (gqa["H"], gqa["H_kv"]) == (32, 8) and view["gqa"].attrs["metric"] == "GPU time (CUDA graph)"
    assert gqa["fwd+bwd: speed-up over sdpa_cudnn"] == pytest.approx(2.5 / 3.0) and gqa["forward ms, ours"] == 1.0
    assert any("32 heads over 8 K/V heads" in c["name"] for c in view["configs"])
    assert view["model"]["model"].tolist() == ["small", "(no model)"]
    assert view["model_backward"]["speed-up over sdpa_cudnn"].tolist() == [2.0, 2.0]
    # where ours is still slower than cuDNN: the GQA shape's forward+backward, not the model group
    losses = view["losses"]["table"]
    assert view["losses"]["slower"] == len(losses) and all("32 heads over 8" in c for c in losses["configuration"])
    # by verdict: no repeats here, so none has a noise band (and none is host-bound: no idle share recorded)
    assert view["losses"]["verdicts"] == {"no noise band measured": len(losses)}
    assert any("forward+backward" in c and s == pytest.approx(2.5 / 3.0)
               for c, s in zip(losses["configuration"], losses["speed-up"]))


def test_the_check_rule_runs_grouped_shapes_against_float64():
    """`grouped_shapes` [B, H, H_kv, N, D] become check cases of every impl (the report's
    correctness section), measured like the others."""
    from lmperf.bench.flash_attention import check_cases, measure_check
    spec = {"impls": ["torch_tiled", "triton"], "dtypes": ["fp32"], "causal": [True], "shapes": [[1, 9, 16]],
            "grouped_shapes": [[1, 4, 1, 19, 16]]}
    cases = {c["case_id"]: c for c in check_cases(spec)}
    assert set(cases) == {"torch_tiled-fp32-causal-1x9x16", "triton-fp32-causal-1x9x16",
                          "torch_tiled-fp32-causal-1x4x19x16-kv1", "triton-fp32-causal-1x4x19x16-kv1"}
    rows = measure_check(cases["triton-fp32-causal-1x4x19x16-kv1"])
    assert len(rows) == 5 and all(r["passed"] for r in rows)
    with pytest.raises(ValueError, match="H_kv=3 does not divide H=4"):
        check_cases({**spec, "grouped_shapes": [[1, 4, 3, 19, 16]]})
