"""lmperf.stats and lmperf.compare on synthetic results folders (written with the benchmarks' own
row helpers) and on the committed H100 results."""
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmperf import compare, stats
from lmperf.csv_schema import write_csv_atomic
from lmperf.stats import summarize, summarize_quantiles

from conftest import REPO, copy_repo, snakemake

H100 = {"hw": "h100-80gb-hbm3", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
        "triton": "3.6.0", "cuda": "13.0", "python": "3.12.3", "commit": "abc123",
        "measured_at": "2026-11-22T10:00:00+00:00"}
H200 = {**H100, "hw": "h200", "gpu": "NVIDIA H200"}
STEPS = [f"small-ctx{256 * (i + 1)}" for i in range(6)]  # e2e-like: 20 per-step samples a case
KERNELS = ["headline-triton", "headline-sdpa_flash", "headline-cudnn"]  # do_bench-like: quantiles only
PROFILED = ["gemm", "softmax", "layernorm"]  # several rows of one metric a case, told apart by `kernel`
TOKENS = 4 * 256


def write_run(folder: Path, seed: int, shift: dict | None = None, provenance: dict = H100,
              cv: float = 0.05, slow_steps: float = 0.1, drop: tuple = (),
              status: dict | None = None, idle: dict | None = None) -> Path:
    """A synthetic results folder. `shift` multiplies the times of the cases it names, `cv` is
    the per-step noise, `slow_steps` the share of steps that take 3x (as host-bound eager steps
    do now and then), `drop` leaves cases out, `status` turns cases into failure rows, `idle`
    gives kernel cases a gpu_idle_pct on their ms row only (as the benchmarks measure it on
    some rows of a case)."""
    rng = np.random.default_rng(seed)
    shift, status, idle = shift or {}, status or {}, idle or {}
    rows = []

    def add(section, study, case, row, **case_columns):
        if case in status:
            row = {"metric": "", "unit": "", "status": status[case], "message": f"{status[case]} here"}
        rows.append({"section": section, "study": study, "case_id": case, **case_columns, **row, **provenance})

    for i, case in enumerate(STEPS):
        steps = (10 + 5 * i) * shift.get(case, 1) * (1 + cv * rng.standard_normal(20))
        steps = np.where(rng.random(20) < slow_steps, 3 * steps, steps)
        add("e2e", "variants", case, summarize("step_ms", "ms", steps))
        add("e2e", "variants", case, summarize("tokens_per_s", "tokens/s", TOKENS * 1000 / steps))
        add("e2e", "variants", case, summarize("parameters", "count", [124_000_000]))
    for j, case in enumerate(KERNELS):
        repeats = (1 + j) * shift.get(case, 1) * (1 + 0.01 * rng.standard_normal(200))
        median, q20, q80 = np.quantile(repeats, [0.5, 0.2, 0.8])
        add("flash_attention", "bench", case, {**summarize_quantiles("fwd_bwd_ms", "ms", median, q20, q80),
                                               "gpu_idle_pct": idle.get(case, 1.0)})
        add("flash_attention", "bench", case,
            summarize_quantiles("fwd_bwd_tflops", "TFLOP/s", 50 / median, 50 / q80, 50 / q20))
    for kernel in PROFILED[::1 if seed % 2 else -1]:  # file order differs from run to run
        us = 100 * (1 + PROFILED.index(kernel)) * shift.get("small-ctx256-fp32", 1)
        add("profile", "profile", "small-ctx256-fp32", summarize("kernel_us_per_step", "us", [us]),
            kernel=kernel)
    frame = pd.DataFrame([r for r in rows if r["case_id"] not in drop])
    for (section, study), part in frame.groupby(["section", "study"]):
        write_csv_atomic(part.dropna(axis=1, how="all"), folder / section / f"{study}.csv")
    return folder


def verdicts(result, metric=None) -> dict:
    rows = result["rows"]
    rows = rows[rows["metric"] == metric] if metric else rows
    return {(r.case_id, r.metric, r.detail): r.verdict for r in rows.itertuples()}


def run_compare(a: Path, b: Path, **kw) -> dict:
    return compare.compare(compare.load(a), compare.load(b), **kw)


# --- lmperf.stats ----------------------------------------------------------------------------


def test_quantiles_interpolate_linearly():
    assert stats.quantiles([4, 1, 3, 2]) == (2.5, pytest.approx(1.6), pytest.approx(3.4))
    assert all(math.isnan(v) for v in stats.quantiles([]))
    # a row's recorded values are kept; what it lacks comes from its samples
    q = stats.complete(stats.Quantiles(2.0, math.nan, math.nan), [1, 2, 3, 4])
    assert q == (2.0, pytest.approx(1.6), pytest.approx(3.4))
    assert math.isnan(stats.complete(stats.Quantiles(math.nan, math.nan, math.nan), [5.0]).q20)


def test_parse_samples_reads_joined_cells_and_numbers():
    assert list(stats.parse_samples("1.5;2;nan;3")) == [1.5, 2.0, 3.0]
    assert stats.parse_samples("").size == 0 and stats.parse_samples(float("nan")).size == 0
    assert list(stats.parse_samples(0.0856)) == [0.0856]  # a one-sample cell pandas read as a number


def test_bootstrap_interval_is_reproducible_and_holds_the_true_ratio():
    rng = np.random.default_rng(3)
    a, b = 100 + rng.standard_normal(30), 110 + rng.standard_normal(30)
    r = stats.ratio_of_medians(a, b)
    assert r == stats.ratio_of_medians(a, b)  # fixed seed: the same interval on every run
    assert r.low < 1.1 < r.high and r.high - r.low < 0.05
    with pytest.raises(ValueError, match="at least 5 samples"):
        stats.ratio_of_medians(a[:3], b)


def test_quantile_interval_excludes_one_only_when_the_ranges_do_not_overlap():
    a = stats.Quantiles(1.0, 0.98, 1.02)
    assert stats.quantile_ratio(a, stats.Quantiles(1.1, 1.08, 1.12)).low > 1
    overlapping = stats.quantile_ratio(a, stats.Quantiles(1.1, 1.01, 1.2))
    assert overlapping.low < 1 < overlapping.high
    assert not stats.quantile_ratio(a, stats.Quantiles(1.1, math.nan, math.nan)).has_interval


def test_verdict_needs_both_the_threshold_and_the_interval():
    assert stats.verdict(stats.Ratio(1.10, 1.05, 1.15), 0.08) == stats.SLOWER
    assert stats.verdict(stats.Ratio(1.10, 0.95, 1.25), 0.08) == stats.SAME  # within noise
    assert stats.verdict(stats.Ratio(1.05, 1.04, 1.06), 0.08) == stats.SAME  # below the threshold
    assert stats.verdict(stats.Ratio(0.90, 0.85, 0.95), 0.08) == stats.FASTER
    assert stats.verdict(stats.Ratio(1.10), 0.08) == stats.SLOWER  # no interval: threshold alone
    with pytest.raises(ValueError, match="threshold"):
        stats.verdict(stats.Ratio(1.0), 0)


def test_a_shift_beyond_the_threshold_on_noisy_samples_is_within_noise():
    noisy = np.array([70, 80, 90, 95, 100, 100, 105, 110, 120, 130], dtype=float)
    tight = np.linspace(99, 101, 10)
    def judge(a):
        q = stats.quantiles(a)
        return stats.judge(q, a, stats.quantiles(1.1 * a), 1.1 * a, 0.08)
    assert judge(noisy).verdict == stats.SAME and judge(noisy).basis == "samples"
    assert judge(tight).verdict == stats.SLOWER


# --- lmperf.compare on synthetic runs ---------------------------------------------------------


def test_identical_runs_agree_everywhere(tmp_path):
    a = write_run(tmp_path / "a", seed=0)
    result = run_compare(a, a)
    rows = result["rows"]
    assert len(rows) == 6 * 3 + 3 * 2 + 3 and result["only"].empty and result["not_ok"].empty
    timing = rows[rows["kind"].isin(["time", "rate"])]
    assert (timing["verdict"] == stats.SAME).all() and (timing["ratio"] == 1).all()
    assert set(timing["basis"]) == {"samples", "quantiles", "one value"}
    assert (rows.loc[rows["kind"] == "exact", "verdict"] == compare.EQUAL).all()
    assert not result["hardware"] and compare.main([str(a), str(a)]) == 0


@pytest.mark.parametrize("factor,expected", [(1.10, stats.SLOWER), (0.90, stats.FASTER)])
def test_a_ten_percent_shift_is_flagged_at_exactly_the_shifted_rows(tmp_path, factor, expected):
    # well outside the noise: 1% per step, no slow steps (the do_bench rows' repeats are 1% too)
    shifted = {"small-ctx512": factor, "small-ctx1280": factor, "headline-cudnn": factor}
    result = run_compare(write_run(tmp_path / "a", seed=0, cv=0.01, slow_steps=0),
                         write_run(tmp_path / "b", seed=1, shift=shifted, cv=0.01, slow_steps=0))
    flagged = {key: v for key, v in verdicts(result).items() if v not in (stats.SAME, compare.EQUAL, "")}
    # a time and a rate for each shifted case, in the same direction: slower means more ms and
    # fewer tokens/s (TFLOP/s)
    assert flagged == {("small-ctx512", "step_ms", ""): expected, ("small-ctx512", "tokens_per_s", ""): expected,
                       ("small-ctx1280", "step_ms", ""): expected, ("small-ctx1280", "tokens_per_s", ""): expected,
                       ("headline-cudnn", "fwd_bwd_ms", ""): expected, ("headline-cudnn", "fwd_bwd_tflops", ""): expected}
    rows = result["rows"].set_index(["case_id", "metric"])
    assert rows.loc[("small-ctx512", "step_ms"), "ratio"] == pytest.approx(factor, rel=0.03)
    assert rows.loc[("small-ctx512", "tokens_per_s"), "ratio"] == pytest.approx(1 / factor, rel=0.03)
    assert rows.loc[("headline-cudnn", "fwd_bwd_ms"), "basis"] == "quantiles"


@pytest.mark.parametrize("seed", range(5))
def test_pure_noise_is_not_flagged(tmp_path, seed):
    result = run_compare(write_run(tmp_path / "a", seed=2 * seed),
                         write_run(tmp_path / "b", seed=2 * seed + 1))
    timing = result["rows"][result["rows"]["kind"].isin(["time", "rate"])]
    assert (timing["verdict"] == stats.SAME).all(), timing[timing["verdict"] != stats.SAME]
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0


def test_rows_in_one_run_only_are_listed_not_dropped(tmp_path):
    a = write_run(tmp_path / "a", seed=0, drop=("small-ctx768",))
    b = write_run(tmp_path / "b", seed=1, drop=("headline-triton",))
    result = run_compare(a, b)
    only = result["only"].set_index(["case_id", "metric"])["run"]
    assert only.to_dict() == {("headline-triton", "fwd_bwd_ms"): "A", ("headline-triton", "fwd_bwd_tflops"): "A",
                              ("small-ctx768", "step_ms"): "B", ("small-ctx768", "tokens_per_s"): "B",
                              ("small-ctx768", "parameters"): "B"}
    page = compare.render(result, "a", "b", compare.load(a), compare.load(b))
    assert "- 2 rows are in A only and 3 in B only." in page and "small-ctx768" in page
    # a study the other run lacks altogether is one line: its cases and rows
    shutil.rmtree(b / "profile")
    page = compare.render(run_compare(a, b), "a", "b", compare.load(a), compare.load(b))
    assert "| profile | profile | A | 1 | 3 |" in page and "small-ctx768" in page


def test_several_rows_of_one_metric_are_joined_by_the_columns_that_tell_them_apart(tmp_path):
    a = write_run(tmp_path / "a", seed=0)
    b = write_run(tmp_path / "b", seed=5, shift={"small-ctx256-fp32": 1.5})  # other file order
    order = lambda run: pd.read_csv(run / "profile" / "profile.csv")["kernel"].tolist()
    assert order(a) != order(b)
    result = run_compare(a, b)
    profiled = result["rows"][result["rows"]["section"] == "profile"]
    assert sorted(profiled["detail"]) == [f"kernel={k}" for k in sorted(PROFILED)]
    assert profiled["ratio"].tolist() == pytest.approx([1.5] * 3)
    assert (profiled["basis"] == "one value").all()  # judged on the threshold alone ...
    assert (profiled["verdict"] == stats.SLOWER).all()
    assert result["failing"]["slower"].empty  # ... and never failing the check
    assert compare.main([str(a), str(b)]) == 0


def test_regression_exit_status(tmp_path, capsys):
    a = write_run(tmp_path / "a", seed=0)
    slower = write_run(tmp_path / "slower", seed=1, shift={"headline-triton": 1.10})
    assert compare.main([str(a), str(slower), "--out", str(tmp_path / "page.md")]) == 1
    page = (tmp_path / "page.md").read_text()
    assert "**Result: fail** (exit status 1): 2 rows slower" in page
    assert page.index("## Rows that disagree") < page.index("<summary>flash_attention (6 rows)</summary>")
    assert compare.main([str(a), str(slower), "--exit-zero"]) == 0
    # a 10% slowdown passes a 15% threshold
    assert compare.main([str(a), str(slower), "--threshold", "0.15"]) == 0
    # a case that ran ok in the baseline and fails now fails the check; skipped does not
    broke = write_run(tmp_path / "broke", seed=1, status={"small-ctx512": "oom"})
    assert compare.main([str(a), str(broke)]) == 1
    skipped = write_run(tmp_path / "skipped", seed=1, status={"small-ctx512": "skipped"})
    assert compare.main([str(a), str(skipped)]) == 0
    result = run_compare(a, skipped)
    assert result["not_ok"][["case_id", "status_a", "status_b"]].values.tolist() == [
        ["small-ctx512", "ok", "skipped"]]


def test_host_bound_rows_are_marked_and_never_fail(tmp_path, capsys):
    """A kernel whose GPU sat idle 40% of its call in B (beyond the 10% default) and 50% slower
    there: judged slower, marked host-bound, counted apart, and the check passes; the same shift
    on a GPU-bound kernel fails it. The rate row, which has no idle % of its own, takes its case's."""
    a = write_run(tmp_path / "a", seed=0, cv=0.01, slow_steps=0)
    host = write_run(tmp_path / "host", seed=1, cv=0.01, slow_steps=0, shift={"headline-sdpa_flash": 1.5},
                     idle={"headline-sdpa_flash": 40.0})
    result = run_compare(a, host)
    rows = result["rows"].set_index(["case_id", "metric"])
    for metric in ("fwd_bwd_ms", "fwd_bwd_tflops"):
        assert rows.loc[("headline-sdpa_flash", metric), "verdict"] == stats.SLOWER
        assert rows.loc[("headline-sdpa_flash", metric), "host_bound"]
    assert rows["host_bound"].sum() == 2 and result["failing"]["slower"].empty
    assert compare.main([str(a), str(host), "--out", str(tmp_path / "page.md")]) == 0
    page = (tmp_path / "page.md").read_text()
    assert "A further 2 rows are host-bound" in page and "| slower ‡ |" in page
    assert "**Result: pass**" in page
    # with the mark's threshold above the idle share, the rows count as GPU-bound and fail
    assert compare.main([str(a), str(host), "--host-bound-pct", "50"]) == 1
    gpu_bound = write_run(tmp_path / "gpu", seed=1, cv=0.01, slow_steps=0, shift={"headline-sdpa_flash": 1.5})
    assert compare.main([str(a), str(gpu_bound)]) == 1


def test_across_gpus_it_is_a_hardware_comparison_and_does_not_fail(tmp_path, capsys):
    a = write_run(tmp_path / "h100", seed=0, cv=0.01, slow_steps=0)
    b = write_run(tmp_path / "h200", seed=1, provenance=H200, shift={c: 1.3 for c in STEPS},
                  cv=0.01, slow_steps=0)
    result = run_compare(a, b)
    assert result["hardware"] and result["gpus"] == (["NVIDIA H100 80GB HBM3"], ["NVIDIA H200"])
    assert compare.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# `") and "**Hardware comparison**: NVIDIA H200 (B," in out
    assert "not a regression check" in out and "Result:" not in out
    assert "Of 21 timing rows, B is faster in 0, slower in 12" in out


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    a = write_run(tmp_path / "a", seed=0)
    with pytest.raises(SystemExit) as e:
        compare.main([str(a), str(tmp_path / "nowhere")])
    assert e.value.code == 2 and "nowhere: no such results folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        compare.main([str(a), str(tmp_path / "empty")])
    assert "empty: no results CSVs under it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.main([str(a), str(a), "--threshold", "8"])
    assert "a fraction between 0 and 1" in capsys.readouterr().err


def test_journals_and_key_value_files_are_not_rows(tmp_path):
    a = write_run(tmp_path / "a", seed=0)
    shutil.copytree(a, tmp_path / "b")
    journal = tmp_path / "b" / "e2e" / ".journal"
    journal.mkdir()
    (journal / "variants.csv").write_text("section,study,case_id,metric,status\ne2e,variants,x,step_ms,ok\n")
    (tmp_path / "b" / "env").mkdir()
    (tmp_path / "b" / "env" / "env.csv").write_text("key,value\nhw,h100-80gb-hbm3\n")
    assert run_compare(a, tmp_path / "b")["only"].empty


# --- the committed results, and the workflow rule ---------------------------------------------


def test_the_committed_h100_results_agree_with_themselves(tmp_path):
    results = REPO / "results" / "h100-80gb-hbm3"
    for part in ("ladder", "e2e/variants", "flash_attention/bench", "profile", "memory", "precision"):
        shutil.copytree(results / part, tmp_path / "h100" / part)
    result = run_compare(tmp_path / "h100", tmp_path / "h100")
    rows = result["rows"]
    assert len(rows) > 1000 and result["only"].empty
    assert set(rows["verdict"]) <= {stats.SAME, compare.EQUAL, "n/a", ""}
    assert not rows["detail"].str.contains(r" #\d+$").any()  # repeated keys told apart by their columns
    page = compare.render(result, "h100", "h100", compare.load(tmp_path / "h100"), compare.load(tmp_path / "h100"))
    assert "timing rows agree within noise**; B is slower in 0 and faster in 0" in page
    assert "**Result: pass**" in page


def test_the_workflow_rule_writes_the_page(tmp_path):
    repo = copy_repo(tmp_path / "lmperf")
    write_run(repo / "results" / "base", seed=0)
    write_run(repo / "results" / "new", seed=1, shift={"headline-triton": 1.2})
    snakemake(repo, "--cores", "1", "report/compare/base_vs_new.md")
    page = (repo / "report" / "compare" / "base_vs_new.md").read_text()
    assert page.startswith("# `results/new` against `results/base` (regression check)")
    assert "**Result: fail**" in page  # the job itself succeeds: the page is its product


@pytest.mark.parametrize("page", sorted((REPO / "report" / "compare").glob("*_vs_*.md")), ids=lambda p: p.name)
def test_every_committed_page_is_what_the_command_writes_from_the_committed_results(page, tmp_path, monkeypatch):
    """report/compare/<a>_vs_<b>.md, which the report links, is current: the command run on the
    committed results/<a> and results/<b> writes it byte for byte."""
    a, b = page.stem.split("_vs_")
    monkeypatch.chdir(REPO)  # the page names the folders as the command was given them
    out = tmp_path / page.name
    assert compare.main([f"results/{a}", f"results/{b}", "--out", str(out), "--exit-zero"]) == 0
    assert out.read_text() == page.read_text(), f"rewrite it: python -m lmperf.compare results/{a} results/{b} --out {page.relative_to(REPO)}"


def test_rows_that_disagree_are_ordered_the_same_whatever_their_order_and_last_bits():
    """A time and the rate computed from it have the same ratio up to the last bits (which differ
    between NumPy builds): they tie, and ties go in the order of the row's key, so a page written
    on another machine from the same results is the same page."""
    from lmperf.compare_page import farthest_first
    rows = pd.DataFrame({
        "section": ["lrpe"] * 4, "study": ["bench"] * 4,
        "case_id": ["b", "b", "a", "c"], "metric": ["ms", "gbs", "ms", "ms"], "detail": [""] * 4,
        "kind": ["time", "rate", "time", "time"],
        "ratio": [5.589, 1 / 5.589 * (1 + 1e-15), 5.589 * (1 - 1e-15), 2.0]})
    want = [("a", "ms"), ("b", "gbs"), ("b", "ms"), ("c", "ms")]
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2]):
        got = farthest_first(rows.iloc[order])
        assert list(zip(got["case_id"], got["metric"])) == want


def test_across_gpus_rows_at_other_code_are_listed_apart_and_not_judged(tmp_path, capsys):
    """Between two GPUs, rows measured at commits whose section code differs (here: a commit git
    does not know, so not known to be the same code) are "code changed": left out of the counts
    and the headline numbers, listed apart, and no hardware verdict is drawn from them."""
    a = write_run(tmp_path / "h100", seed=0, cv=0.01, slow_steps=0)
    b = write_run(tmp_path / "h200", seed=1, provenance={**H200, "commit": "def456"},
                  shift={c: 1.3 for c in STEPS}, cv=0.01, slow_steps=0)
    result = run_compare(a, b)
    assert result["hardware"] and (result["rows"]["code"] == compare.CODE_CHANGED).all()
    assert compare.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "no timing row in common measured at the same code" in out
    assert f"{len(result['rows'])} rows measured at code that differs" in out
    page = out.split("## Rows at different code", 1)[1]
    assert f"{len(result['rows'])} rows" in page.split("## Rows in one run only")[0]
    same = run_compare(a, write_run(tmp_path / "h200same", seed=1, provenance=H200, shift={c: 1.3 for c in STEPS},
                                    cv=0.01, slow_steps=0))
    assert (same["rows"]["code"] == compare.SAME_CODE).all()  # one commit: the same code


def test_a_page_without_a_chart_leaves_no_earlier_chart_beside_it(tmp_path):
    a = write_run(tmp_path / "h100", seed=0, cv=0.01, slow_steps=0)
    b = write_run(tmp_path / "h200", seed=1, provenance={**H200, "commit": "def456"}, cv=0.01, slow_steps=0)
    out = tmp_path / "page.md"
    out.with_suffix(".png").write_bytes(b"an earlier chart")
    assert compare.main([str(a), str(b), "--out", str(out)]) == 0  # every row at other code: no chart
    assert not out.with_suffix(".png").exists() and ".png" not in out.read_text()
