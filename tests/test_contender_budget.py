"""A contender's timed FlashAttention case whose one warm forward+backward call is over its budget
is a `skipped` row saying so, and so are its larger N at the same settings (bench/flash_attention.py's
within_budget): a Python tile loop takes minutes a case from 1,024 tokens."""
import contextlib
import time

import pytest

from lmperf import failures
from lmperf.bench import flash_attention


def case(n: int, budget: float | None = 0.05, provider: str = "someone_pytorch") -> dict:
    c = {"provider": provider, "group": "grid", "dtype": "bf16", "causal": True, "head_dim": 64, "batch": 1,
         "heads": 1, "kv_heads": 1, "harness": "eager", "seq_len": n}
    if budget is not None:
        c["call_budget_s"] = budget
    return c


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(flash_attention, "OVER_BUDGET", {})


def calls(seconds: list[float]):
    """A forward+backward that takes each of `seconds` in turn (the last one after that)."""
    left = list(seconds)

    def fwd_bwd():
        time.sleep(left.pop(0) if len(left) > 1 else left[0])
    return fwd_bwd


def test_a_call_within_budget_is_timed():
    flash_attention.within_budget(case(256), calls([0.0]), contextlib.nullcontext)


def test_a_slow_first_call_that_compiled_is_forgiven():
    flash_attention.within_budget(case(256), calls([0.2, 0.0]), contextlib.nullcontext)


def test_over_budget_is_not_timed_and_neither_are_larger_n():
    with pytest.raises(failures.NotRun, match="over the budget"):
        flash_attention.within_budget(case(1024), calls([0.1]), contextlib.nullcontext)
    ran = []
    with pytest.raises(failures.NotRun, match="N = 1024"):
        flash_attention.within_budget(case(4096), lambda: ran.append(1), contextlib.nullcontext)
    assert not ran  # not even one call
    # a smaller N, and other settings, are measured as before
    flash_attention.within_budget(case(256), calls([0.0]), contextlib.nullcontext)
    flash_attention.within_budget({**case(4096), "head_dim": 128}, calls([0.0]), contextlib.nullcontext)
    status, message = failures.classify_failure(failures.NotRun("x"))
    assert status == "skipped"


def test_a_case_without_budget_makes_no_call():
    ran = []
    flash_attention.within_budget(case(65536, budget=None, provider="triton"), lambda: ran.append(1),
                                  contextlib.nullcontext)
    assert not ran


def test_contender_cases_carry_the_configured_budget(tmp_path):
    from lmperf import contenders
    adapters = tmp_path / "adapters.py"
    adapters.write_text("def get_flashattention_autograd_function_pytorch():\n    raise NotImplementedError\n")
    spec = {"contenders": {"someone": str(adapters)}, "contender_call_budget_s": 0.25,
            "groups": [{"name": "grid", "batch": 1, "heads": 1, "causal": [True], "dtypes": ["bf16"],
                        "seq_lens": [256], "head_dims": [64], "providers": ["triton"], "timing_ms": [10, 40],
                        "tiled_max_seq_len": 1024}]}
    cases = flash_attention.bench_cases(spec)
    budgets = {c["provider"]: c.get("call_budget_s") for c in cases}
    assert budgets["triton"] is None
    assert {p: b for p, b in budgets.items() if p != "triton"} == {p: 0.25 for p in contenders.provider_names(
        spec["contenders"])}
