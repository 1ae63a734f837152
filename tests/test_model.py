import pytest
import torch

from lmperf.flops import flops_per_token, matmul_parameters
from lmperf.kernels.rope_contract import apply_rope
from lmperf.model import (ModelConfig, TransformerLM, count_parameters, plain_attention, rope_tables,
                          sdpa_attention)

TINY = ModelConfig(d_model=32, d_ff=64, n_layers=2, n_heads=4, vocab_size=97, context_length=16)
# The five sizes of the report, as in config/config.yaml.
SIZES = {"small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16), "large": (1280, 5120, 36, 20),
         "xl": (1600, 6400, 48, 25), "2.7B": (2560, 10240, 32, 32)}


def test_logits_shape_and_dtype():
    model = TransformerLM(TINY)
    tokens = torch.randint(TINY.vocab_size, (3, 11))
    logits = model(tokens)
    assert logits.shape == (3, 11, TINY.vocab_size)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_changing_a_later_token_never_changes_an_earlier_logit():
    torch.manual_seed(1)
    model = TransformerLM(TINY).double()
    tokens = torch.randint(TINY.vocab_size, (2, 16))
    base = model(tokens)
    for pos in (1, 7, 15):
        changed = tokens.clone()
        changed[:, pos] = (changed[:, pos] + 1) % TINY.vocab_size
        out = model(changed)
        torch.testing.assert_close(out[:, :pos], base[:, :pos], rtol=0, atol=1e-12)
        assert not torch.allclose(out[:, pos], base[:, pos]), "the changed token must matter"


@pytest.mark.parametrize("name", SIZES)
def test_parameter_count_matches_closed_form(name):
    d, f, n_layers, n_heads = SIZES[name]
    cfg = ModelConfig(d_model=d, d_ff=f, n_layers=n_layers, n_heads=n_heads)
    with torch.device("meta"):  # shapes only: no memory for the 2.7B model
        model = TransformerLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(cfg)


def test_closed_form_count_by_hand():
    # small: embedding + head 2*10000*768, per block 4*768^2 + 3*768*3072 + 2*768, final norm 768.
    expected = 2 * 10_000 * 768 + 12 * (4 * 768**2 + 3 * 768 * 3072 + 2 * 768) + 768
    assert count_parameters(ModelConfig(768, 3072, 12, 12)) == expected == 128_625_408


def test_sequence_longer_than_context_is_refused():
    with pytest.raises(ValueError, match="exceeds context_length"):
        TransformerLM(TINY)(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=30, d_ff=8, n_layers=1, n_heads=4), "not divisible"),
    (dict(d_model=12, d_ff=8, n_layers=1, n_heads=4), "must be even"),
    (dict(d_model=32, d_ff=8, n_layers=1, n_heads=4, attention="nope"), "attention='nope'"),
    (dict(d_model=32, d_ff=8, n_layers=1, n_heads=4, n_kv_heads=3), "n_kv_heads=3 does not divide n_heads=4"),
    (dict(d_model=32, d_ff=8, n_layers=1, n_heads=4, n_kv_heads=0), "n_kv_heads=0 does not divide"),
])
def test_bad_model_config_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


def test_rope_is_a_rotation_and_depends_on_relative_position():
    cos, sin = rope_tables(8, 32, 10_000.0)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    rot = lambda x, p: apply_rope(x[None], cos[p:p + 1].double(), sin[p:p + 1].double())[0]
    assert torch.allclose(rot(q, 5).norm(), q.norm())
    assert torch.allclose(rot(q, 3) @ rot(k, 1), rot(q, 12) @ rot(k, 10), atol=1e-6)


@pytest.mark.parametrize("attention", ["sdpa", "flash-triton"])
def test_model_with_each_attention_matches_plain(attention):
    torch.manual_seed(3)
    cfg = ModelConfig(d_model=32, d_ff=64, n_layers=2, n_heads=2, vocab_size=97, context_length=16)
    plain = TransformerLM(cfg)
    other = TransformerLM(ModelConfig(**{**cfg.__dict__, "attention": attention}))
    other.load_state_dict(plain.state_dict())
    tokens = torch.randint(cfg.vocab_size, (2, 13))
    torch.testing.assert_close(other(tokens), plain(tokens), rtol=1e-4, atol=1e-4)
    other(tokens).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in other.parameters())


@pytest.mark.parametrize("attention", ["sdpa", "flash-triton"])
@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_grouped_query_model_with_each_attention_matches_plain(attention, n_kv_heads):
    """n_kv_heads: k_proj and v_proj make n_kv_heads heads; plain attention repeats them per
    group, SDPA takes them with enable_gqa, ours reads them as they are."""
    torch.manual_seed(4)
    cfg = ModelConfig(d_model=32, d_ff=64, n_layers=2, n_heads=4, vocab_size=97, context_length=16,
                      n_kv_heads=n_kv_heads)
    plain = TransformerLM(cfg)
    assert plain.blocks[0].attn.k_proj.weight.shape == (n_kv_heads * 8, 32)
    assert sum(p.numel() for p in plain.parameters()) == count_parameters(cfg)
    other = TransformerLM(ModelConfig(**{**cfg.__dict__, "attention": attention}))
    other.load_state_dict(plain.state_dict())
    tokens = torch.randint(cfg.vocab_size, (2, 13))
    torch.testing.assert_close(other(tokens), plain(tokens), rtol=1e-4, atol=1e-4)
    plain(tokens).sum().backward()
    other(tokens).sum().backward()
    for (name, a), b in zip(plain.named_parameters(), other.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.parametrize("causal", [False, True])
def test_plain_attention_matches_sdpa(causal):
    q, k, v = (torch.randn(2, 3, 9, 8, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(plain_attention(q, k, v, causal), sdpa_attention(q, k, v, causal))


def test_flops_convention():
    cfg = ModelConfig(768, 3072, 12, 12)
    n = matmul_parameters(cfg)
    assert n == count_parameters(cfg) - 10_000 * 768 - (2 * 12 + 1) * 768
    assert flops_per_token(cfg, 256, "train") == 6 * n + 12 * 12 * 256 * 768
    assert flops_per_token(cfg, 256, "forward") == 2 * n + 4 * 12 * 256 * 768
    with pytest.raises(ValueError):
        flops_per_token(cfg, 256, "backward")
