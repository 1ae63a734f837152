"""The FP8 rung of our stack (bench/float8.py, the ladder's `float8_ours`) and its convergence check
(bench/convergence.py, report/convergence.py): where the rung sits and what it carries, the
config's errors, the job on a CPU, and the report's verdict against the tolerance."""
import json
import re
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lmperf import planning, workflow as wf
from lmperf.bench import convergence, float8, ladder
from lmperf.report import convergence as report_convergence, render
from tests.test_ladder import SPEC, changed, ladder_frame

REPO = Path(__file__).resolve().parents[1]
CONFIG = render.load_config(REPO / "config" / "config.yaml")  # validated: the defaults filled
BARS = render.bars_from_config(REPO / "config" / "config.yaml")
FP8 = {**SPEC, "fused": ["rmsnorm", "swiglu"], "float8": ["tensorwise"],
       "float8_ours": {"context": 64, "recipe": "tensorwise"}, "accumulate": {"context": 64, "micro_batches": 2}}


def test_the_fp8_rung_follows_the_rung_at_its_context_and_is_carried_nowhere():
    cases = ladder.cases(FP8, "tiny", cuda=True)
    names = [c["name"] for c in cases]
    i = names.index("ours_float8_tensorwise")
    assert names[i - 1] == "ctx64" and names[i + 1] == "accumulate2"
    fp8, ctx = cases[i], cases[i - 1]
    assert changed(ctx, fp8) == {"float8": "tensorwise"}
    assert (fp8["context"], fp8["optimizer"], fp8["attention"], fp8["fused"]) == (64, "master", "flash-triton",
                                                                                 "rmsnorm+swiglu")
    assert fp8["needs_cuda"] and not fp8["change"].startswith("peer") and fp8["name"] not in ladder.PEERS
    assert changed(ctx, cases[i + 1]) == {"micro_batches": 2}  # the rung after builds on ctx64, in bf16
    assert [c["name"] for c in cases if c["float8"] != "none"] == ["float8_tensorwise", "ours_float8_tensorwise"]
    assert names == [c["name"] for c in ladder.cases(FP8, "tiny", cuda=False)]  # the same ids without CUDA
    at_base = [c["name"] for c in ladder.cases({**FP8, "float8_ours": {"context": 32, "recipe": "rowwise"}},
                                               "tiny", cuda=True)]
    assert at_base[at_base.index("float8_tensorwise") + 1] == "ours_float8_rowwise"  # after the base context's rungs
    assert not any(float8.is_ours(n) for n in (c["name"] for c in ladder.cases(SPEC, "tiny", cuda=True)))


def test_the_configs_fp8_rung_and_convergence_job_at_smoke_scale():
    smoke = CONFIG["ladder"]["smoke"]
    cases = ladder.cases(smoke, "tiny", cuda=True)
    fp8 = [c for c in cases if float8.is_ours(c["name"])]
    assert len(fp8) == 1 and fp8[0]["context"] == smoke["float8_ours"]["context"]
    spec = json.loads(wf.convergence_spec(CONFIG, "smoke"))
    runs = convergence.cases(spec, cuda=True)
    assert [c["case_id"] for c in runs] == ["tiny-bf16", "tiny-bf16_seed1", "tiny-float8_delayed"]
    settings = [*ladder.BASE, "context", "batch_size"]
    assert all(changed(fp8[0], c) == {"float8": "none"} for c in runs[:2]) and changed(fp8[0], runs[2]) == {}
    assert {c["case_id"] for c in runs} == {c["case_id"] for c in convergence.cases(spec, cuda=False)}
    assert [c["rung"] for c in runs] == [fp8[0]["case_id"]] * 3 and settings
    full = [f.section for f in wf.result_files(CONFIG, "results/x", "full", [])]
    assert "convergence" in full
    assert "convergence" in [f.section for f in wf.result_files(CONFIG, "results/cpu", "smoke", ["results/cpu"])]


@pytest.mark.parametrize("fp8, match", [({"context": 100, "recipe": "tensorwise"}, r"float8_ours.context 100"),
                                        ({"context": 64, "recipe": "nope"}, r"float8_ours.recipe 'nope'")])
def test_a_bad_fp8_rung_is_a_clear_error(fp8, match):
    with pytest.raises(ValueError, match=match):
        ladder.cases({**FP8, "float8_ours": fp8}, "tiny", cuda=True)


def test_config_errors_name_the_key():
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    def config(**edits):
        c = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
        for scale, ladder_edit in edits.items():
            c["ladder"][scale].update(ladder_edit)
        return c
    with pytest.raises(ValueError, match=r"ladder.smoke.float8_ours.context = 48: the FP8 rung follows"):
        planning.check_config(config(smoke={"float8_ours": {"context": 48, "recipe": "tensorwise"}}))
    no_rung = config()
    del no_rung["ladder"]["smoke"]["float8_ours"]
    with pytest.raises(ValueError, match=r"convergence.smoke trains the ladder's FP8 rung, but ladder.smoke has no"):
        planning.check_config(no_rung)
    with pytest.raises(WorkflowError, match="recipe"):
        validate(config(smoke={"float8_ours": {"context": 32, "recipe": "blockwise"}}), str(REPO / "config" / "schema.yaml"))
    bad_size = config()
    bad_size["convergence"]["smoke"]["size"] = "huge"
    with pytest.raises(ValueError, match=r"convergence.smoke.size names \['huge'\]"):
        planning.check_config(bad_size)


def test_the_stream_is_learnable_and_the_same_for_the_runs_of_one_data_seed():
    spec = json.loads(wf.convergence_spec(CONFIG, "smoke"))
    bf16, seed1, fp8 = ({**c, "steps": 3} for c in convergence.cases(spec))
    draw = lambda case: list(convergence.batches(case, "cpu"))
    a, b, c = draw(bf16), draw(fp8), draw(seed1)
    assert all((x[0] == y[0]).all() and (x[1] == y[1]).all() for x, y in zip(a, b))
    assert not all((x[0] == y[0]).all() for x, y in zip(a, c))
    inputs, targets = a[0]
    assert inputs.shape == (bf16["batch_size"], bf16["context"]) and (inputs[:, 1:] == targets[:, :-1]).all()
    assert bf16["stream_entropy"] < math.log(convergence.VOCAB) / 4  # far below uniform tokens' loss


@pytest.mark.slow  # the smoke run (built_repo) runs the convergence job too
def test_the_convergence_job_writes_bf16_losses_and_a_skipped_fp8_row_on_a_cpu(tmp_path):
    """The job in a fresh process, as the rule runs it, at the smoke spec cut to 4 steps."""
    spec = {**json.loads(wf.convergence_spec(CONFIG, "smoke")), "steps": 4}
    out = tmp_path / "convergence.csv"
    proc = subprocess.run([sys.executable, "-m", "lmperf.bench.convergence", "--spec", json.dumps(spec),
                           "--out", str(out), "--hw", "cpu"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = pd.read_csv(out)
    ok = df[df["status"] == "ok"]
    assert set(ok["run"]) == {"bf16", "bf16_seed1"} and (ok["metric"] == "loss").all()
    assert sorted(ok[ok["run"] == "bf16"]["step"]) == [1, 2, 3, 4] and ok["mean"].map(math.isfinite).all()
    assert ok["mean"].between(5, 12).all()  # about log(10,000) at the start
    fp8 = df[df["run"] == "float8_delayed"]
    assert list(fp8["status"]) == ["skipped"] and list(fp8["message"]) == ["needs CUDA"]
    assert {"commit", "torch", "measured_at", "hw"} <= set(df.columns)


def convergence_frame(fp8_offset: float, noise_offset: float = 0.01, fp8_status: str = "ok") -> pd.DataFrame:
    """The job's rows with synthetic losses: bf16 falling from 9 to 2 over 200 steps, the other
    runs offset from it by a constant."""
    spec = {**json.loads(wf.convergence_spec(CONFIG, "smoke")), "steps": 200}
    rows = []
    for case in convergence.cases(spec):
        offset = {"bf16": 0.0, "bf16_seed1": noise_offset}.get(case["run"], fp8_offset)
        if case["float8"] != "none" and fp8_status != "ok":
            rows.append({**case, "section": "convergence", "study": "convergence", "metric": "", "mean": math.nan,
                         "status": fp8_status, "message": "needs CUDA"})
            continue
        rows += [{**case, "section": "convergence", "study": "convergence", "step": s, "metric": "loss",
                  "mean": 2 + 7 * math.exp(-s / 40) + offset, "status": "ok", "message": ""} for s in range(1, 201)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("fp8_offset, noise_offset, passed", [
    (0.015, 0.01, True),    # within 2 x the noise floor (0.02)
    (-0.03, 0.01, False),   # beyond it, and beyond 1% of bf16's loss (about 0.0204)
    (0.03, 0.02, True),     # a wider noise floor widens the bar
    (0.02, 0.0, True),      # bf16's runs agree exactly: 1% of the loss is the bar
    (0.025, 0.0, False),
    (math.nan, 0.01, False)])  # diverged
def test_the_report_judges_the_fp8_run_against_the_tolerance(fp8_offset, noise_offset, passed):
    view = report_convergence.judge(convergence_frame(fp8_offset, noise_offset), {**report_convergence.DEFAULTS,
                                                                                 **BARS["convergence"]})
    assert view["passed"] is passed
    ref = 2 + 7 * sum(math.exp(-s / 40) for s in range(151, 201)) / 50
    assert view["ref"] == pytest.approx(ref) and view["last_steps"] == 50
    assert view["tolerance"] == pytest.approx(max(2 * noise_offset, 0.01 * ref))


def test_the_report_renders_the_section_from_the_csv(tmp_path):
    results = tmp_path / "results" / "cpu"
    for name, frame in (("pass", convergence_frame(0.015)), ("fail", convergence_frame(0.2)),
                        ("skipped", convergence_frame(0.0, fp8_status="skipped"))):
        (results / "convergence").mkdir(parents=True, exist_ok=True)
        frame.to_csv(results / "convergence" / "convergence.csv", index=False)
        text = render.render(results, REPO / "templates", tmp_path / name / "r.md", tmp_path / name / "fig", "smoke",
                             BARS, sections=[s for s in render.SECTIONS if s.name == "convergence"],
                             template="convergence.md.j2")
        verdict = {"pass": "**pass**: |0.015", "fail": "**FAIL**: |0.2",
                   "skipped": "not judged: the FP8 run is `skipped` (needs CUDA)"}[name]
        assert verdict in text, text[:600]
        assert (tmp_path / name / "fig" / "convergence_loss.png").exists()


def test_the_committed_h100_report_renders_the_convergence_and_sets_the_fp8_rung_beside_the_best_bf16(tmp_path):
    """The committed H100 results against the full config: the convergence section judges the FP8
    run from its CSV, and the ladder's best rung is a bf16 one with the FP8 rung beside it."""
    committed = REPO / "results" / "h100-80gb-hbm3"
    promised = render.promised_files(CONFIG, committed, "full", [str(REPO / "results" / "h200-x4")])
    text = render.render(committed, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "full", BARS, promised,
                         models=CONFIG["models"])
    section = text.split("\n## The FP8 rung's convergence", 1)[1].split("\n## ", 1)[0]
    assert "Not available" not in section and re.search(r"\*\*(pass|FAIL)\*\*: \|", section), section[:600]
    assert (tmp_path / "fig" / "convergence_loss.png").exists()
    ladder_section = text.split("\n## The ladder", 1)[1].split("\n## ", 1)[0]
    assert "Our stack in fp8" in ladder_section
    fp8 = ladder_section.split("Our stack in fp8", 1)[1]
    assert re.search(r"\| 2\.7B +\| \d+ +\| delayed +\| 2048 +\| ok", fp8), fp8[:1500]


def test_the_ladder_report_keeps_the_best_bf16_rung_and_sets_the_fp8_rung_beside_it():
    from lmperf.report import ladder as report

    limits = BARS["ladder"]
    spec = {**FP8, "contexts": [64]}
    names = {c["rung"]: c["name"] for c in ladder.cases(spec, limits["size"], cuda=True)}

    def metrics(case, fp8_tokens):
        if case["name"] == "floors":
            return {}
        tokens = fp8_tokens if float8.is_ours(case["name"]) else 1000.0 * case["rung"]
        return {"step_ms": 100.0, "tokens_per_s": tokens, "tflops": tokens / 100, "mfu_bf16_pct": tokens / 1000}
    for fp8_tokens, met in ((10**6, True), (1.0, False)):
        view = report.ladder(ladder_frame(limits["size"], lambda c: metrics(c, fp8_tokens), spec), limits)
        best = view["best"][limits["size"]]
        assert not float8.is_ours(names[best["rung"]]) and names[best["rung"]] not in ladder.PEERS
        row = view["fp8"].iloc[0]
        assert row["tokens/s / best bf16 rung's"] == pytest.approx(fp8_tokens / best["tokens_per_s"])
        bar = view["bars"][view["bars"]["bar"].str.contains("FP8")].iloc[0]
        assert bool(bar["met"]) is met and "1.30x the best bf16 rung's" in bar["bar"]
