import math

import pandas as pd
import pytest
import torch

from lmperf.bench import attention, precision, timing
from lmperf.model import plain_attention
from lmperf.report import attention as attention_report
from lmperf.report.sections import Inputs


def test_accumulation_values_are_the_ieee_results():
    rows = {r["variant"]: float(r["exact"]) for r in precision.accumulation()}
    assert rows["fp32 accumulator, fp32 addends"] == pytest.approx(10.000133514404297, abs=0)
    assert rows["fp16 accumulator, fp16 addends"] == 9.953125
    assert rows["fp32 accumulator, fp16 addends"] == 10.00213623046875
    assert rows["fp32 accumulator, fp16 addends up-cast explicitly"] == 10.00213623046875


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_autocast_table_is_read_from_the_tensors(dtype):
    found = {r["tensor"]: r["dtype"] for r in precision.autocast_dtypes("cpu", dtype)}
    low = {"fp16": "float16", "bf16": "bfloat16"}[dtype]
    assert found["parameters"] == found["gradients"] == found["loss"] == "float32"
    assert found["fc1 output"] == found["logits"] == low


@pytest.mark.parametrize("b, n, d", [(2, 17, 16), (8, 64, 32)])
def test_memory_prediction_equals_what_autograd_saves(b, n, d):
    """Held between forward and backward: every storage autograd saves, plus q, k, v and the
    output (distinct storages counted once)."""
    q, k, v = (torch.randn(b, n, d, requires_grad=True) for _ in range(3))
    held = {}

    def keep(t):
        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = plain_attention(q, k, v, False)
    for t in (q, k, v, out):
        keep(t)
    assert sum(held.values()) == attention.predicted_saved_bytes(b, n, d)


def test_attention_view_names_the_first_oom_and_the_growth():
    """Synthetic rows (not measurements): memory x4 per doubling of N, an OOM at N=8192."""
    rows = []
    for n, status in ((1024, "ok"), (2048, "ok"), (4096, "ok"), (8192, "oom")):
        base = {"impl": "eager", "head_dim": 64, "seq_len": n, "batch": 8, "iters": 100,
                "case_id": f"eager-d64-n{n}", "status": status, "message": "" if status == "ok" else "OOM"}
        if status != "ok":
            rows.append({**base, "metric": "", "mean": math.nan, "std": math.nan})
            continue
        for metric, value in (("forward_ms", 1.0), ("backward_ms", 2.0),
                              ("allocated_before_backward_mib", (n / 1024) ** 2 * 32),
                              ("predicted_saved_mib", (n / 1024) ** 2 * 32)):
            rows.append({**base, "metric": metric, "mean": value, "std": 0.1})
    view = attention_report.view(Inputs(results=None, frames={"attention": pd.DataFrame(rows)}, bars={}, out_dir=None))
    assert view["first_oom"] == {"impl": "eager", "d": 64, "N": 8192}
    assert view["growth"]["n0"] == 2048 and view["growth"]["n1"] == 4096
    assert view["growth"]["exponent"] == pytest.approx(2.0)
    assert view["table"].set_index("N").loc[8192, "forward ms"] == "oom"


def test_attention_times_all_passes_unless_they_fill_the_window():
    case = attention.cases({"impls": ["eager"], "batch": 1, "head_dims": [8], "seq_lens": [16], "iters": 100,
                            "min_iters": 20, "window_s": 2.0})[0]
    n = lambda step_s: len(timing.sample_until(lambda: step_s, attention.stop_rule(case))[0])
    assert n(0.001) == 100  # short passes: all of them
    assert n(0.05) == 40    # the window fills at 40 passes of 50 ms
    assert n(1.0) == 20     # never under min_iters
    assert n(1.0) == attention.cases({"impls": ["eager"], "batch": 1, "head_dims": [8], "seq_lens": [16],
                                      "iters": 20})[0]["iters"]  # no window: all iters
