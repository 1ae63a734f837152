"""The attention section's deep grid (report/attention.py's deep_view): the out-of-memory edge a
line per implementation, dtype and head dim, checked against the memory model over the GPU's
memory; the standard run's rows kept apart. On made-up deep rows beside the committed H100
standard rows."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lmperf.bench import attention as bench
from lmperf.report import attention, render
from lmperf.report.sections import Inputs
from conftest import config_yaml

REPO = Path(__file__).resolve().parents[1]
H100 = REPO / "results" / "h100-80gb-hbm3"
GIB = 79.2  # an H100's memory as env.csv records it


def deep_rows(first_oom: dict) -> pd.DataFrame:
    """Rows as the deep job writes them: a line per (impl, dtype, d) over N 8,192 to 131,072, ok
    up to its first out-of-memory N (first_oom; None: none), `skipped` after it."""
    rows = []
    for (impl, dtype, d), at in first_oom.items():
        for n in (8192, 16384, 32768, 65536, 131072):
            case = {"study": "attention_deep", "case_id": f"{impl}-{dtype}-d{d}-n{n}", "impl": impl, "dtype": dtype,
                    "head_dim": d, "seq_len": n, "batch": 8, "iters": 100, "message": ""}
            if at is None or n < at:
                predicted = bench.predicted_peak_bytes(impl, 8, n, d, bench.ELEMENT_BYTES[dtype]) / 2**20
                for metric, value in (("forward_ms", n / 1e3), ("backward_ms", n / 5e2), ("peak_mib", 1.1 * predicted),
                                      ("predicted_peak_mib", predicted)):
                    rows.append({**case, "metric": metric, "mean": value, "median": value, "status": "ok"})
            elif n == at:
                rows.append({**case, "metric": "", "mean": float("nan"), "median": float("nan"), "status": "oom",
                             "message": "CUDA out of memory"})
            else:
                rows.append({**case, "metric": "", "mean": float("nan"), "median": float("nan"), "status": "skipped",
                             "message": f"not run: N = {at} ran out of memory on this line"})
    return pd.DataFrame(rows)


LINES = {("eager", "fp32", 16): 32768,      # the model's first N over 79.2 GiB too
         ("compiled", "fp32", 16): 32768,   # the model's: 65,536 (two N x N tensors: 64 GiB at 32,768)
         ("eager", "bf16", 16): 65536,
         ("compiled", "bf16", 16): None}    # ran to 131,072 (a made-up line: the model says 65,536)


def inputs(deep: pd.DataFrame, standard: bool = True, memory: float | None = GIB) -> Inputs:
    frames = {"attention": pd.concat([render.load_section(H100, "attention"), deep]) if standard else deep,
              "env": pd.DataFrame({"key": ["gpu_memory_gib"] if memory else [], "value": [str(memory)] if memory else []})}
    return Inputs(results=H100, frames=frames, bars={"host_bound_idle_pct": 10}, out_dir=Path("."))


@pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 results")
def test_the_edge_is_the_smallest_failing_n_of_each_line_against_the_models():
    view = attention.view(inputs(deep_rows(LINES)))
    edges = {(e["impl"], e["dtype"], e["d"]): e for e in view["deep"]["edges"]}
    assert {k: e["first N out of memory"] for k, e in edges.items()} == LINES
    model = {k: e["model's first N over memory"] for k, e in edges.items()}
    assert model == {("eager", "fp32", 16): 32768, ("compiled", "fp32", 16): 65536,
                     ("eager", "bf16", 16): 65536, ("compiled", "bf16", 16): 65536}
    assert {(e["impl"], e["dtype"], e["d"]) for e in view["deep"]["disagree"]} == {("compiled", "fp32", 16),
                                                                                  ("compiled", "bf16", 16)}
    assert edges[("compiled", "bf16", 16)]["largest N that ran"] == 131072
    assert [(e["impl"], e["dtype"]) for e in view["deep"]["no_oom"]] == [("compiled", "bf16")]
    assert view["deep"]["peak_ratio"]["min"] == pytest.approx(1.1) and view["deep"]["peak_ratio"]["max"] == pytest.approx(1.1)


@pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 results")
def test_the_standard_runs_rows_stay_apart_from_the_deep_grids():
    alone = attention.view(inputs(deep_rows({}).iloc[0:0]))
    both = attention.view(inputs(deep_rows(LINES)))
    assert not alone["deep"]["measured"] and both["deep"]["measured"]
    pd.testing.assert_frame_equal(alone["table"], both["table"])
    assert alone["first_oom"] == both["first_oom"] and both["max_n"] == 8192
    assert both["dtypes"] == ["bf16", "fp32"]


def test_without_the_gpus_memory_the_model_places_no_edge_and_nothing_disagrees():
    view = attention.view(inputs(deep_rows(LINES), standard=False, memory=None))
    assert view["available"] and not view["standard"]
    assert all(e["model's first N over memory"] is None and e["agree"] is None for e in view["deep"]["edges"])
    assert view["deep"]["disagree"] == []


@pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 results")
def test_the_section_renders_the_edge_table_under_the_deep_targets_name():
    view = attention.view(inputs(deep_rows(LINES)))
    text = render.environment(REPO / "templates").get_template("attention.md.j2").render(
        attention=view, env={"code": None}, figures={}, no_figure={"attention": "not drawn here"})
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.split("out-of-memory edge", 1)[1].splitlines()
             if line.startswith("|")]
    head, rows = cells[0], [dict(zip(cells[0], r)) for r in cells[2:]]
    assert head == ["impl", "dtype", "d", "largest N that ran", "first N out of memory", "model's first N over memory", "agree"]
    assert rows[1] == {"impl": "compiled", "dtype": "fp32", "d": "16", "largest N that ran": "16384",
                       "first N out of memory": "32768", "model's first N over memory": "65536", "agree": "no"}
    assert rows[3]["first N out of memory"] == "none"


@pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 results")
def test_the_flashattention_deep_grid_is_a_table_of_its_own_and_makes_no_claims():
    """The committed grid's rows again as the deep grid's (group grid_deep): tables per dtype and
    head dim of their own; the configurations and the claims stay the standard run's."""

    from lmperf.report import claims, flash_attention
    from lmperf.report.sections import SECTIONS, frame_names
    bars = config_yaml()["report"]
    frames = {name: render.load_section(H100, name) for name in frame_names(SECTIONS)}
    fa = frames["flash_attention"]
    grid = fa[fa["group"] == "grid"]
    deep = grid.assign(group="grid_deep", case_id=grid["case_id"].str.replace("grid-", "grid_deep-", n=1))
    standard_inputs = Inputs(results=H100, frames=frames, bars=bars, out_dir=Path("."))
    deep_inputs = Inputs(results=H100, frames={**frames, "flash_attention": pd.concat([fa, deep])}, bars=bars,
                         out_dir=Path("."))
    before, after = flash_attention.view(standard_inputs), flash_attention.view(deep_inputs)
    assert "grid_deep" not in before
    assert [(g["dtype"], g["head_dim"]) for g in after["grid_deep"]] == [(g["dtype"], g["head_dim"]) for g in before["grid"]]
    for mine, theirs in zip(after["grid_deep"], before["grid"]):
        pd.testing.assert_frame_equal(mine["table"], theirs["table"])
    assert [c["name"] for c in after["configs"]] == [c["name"] for c in before["configs"]]
    assert len(claims.of(deep_inputs).claims) == len(claims.of(standard_inputs).claims)
