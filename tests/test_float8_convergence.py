"""The FP8 rung of our stack (bench/float8.py, the ladder's `float8_ours`) and its convergence check
(bench/convergence.py, report/convergence.py): where the rung sits and what it carries, the
config's errors, the text and its batches, the job on a CPU, and the report's verdict against the
tolerance (held-out losses, and the training losses of rows measured before them)."""
import json
import re
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lmperf import planning, workflow as wf
from lmperf.bench import convergence, float8, ladder
from lmperf.report import convergence as report_convergence, render
from tests.test_ladder import SPEC, changed, ladder_frame
from conftest import config_yaml

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
    assert [c["case_id"] for c in runs] == ["tiny-bf16", "tiny-bf16_init1", "tiny-float8_delayed"]
    assert [c["init_seed"] for c in runs] == [0, 1, 0]
    assert all(changed(fp8[0], c) == {"float8": "none"} for c in runs[:2]) and changed(fp8[0], runs[2]) == {}
    assert {c["case_id"] for c in runs} == {c["case_id"] for c in convergence.cases(spec, cuda=False)}
    # each run is labelled with the ladder rung it runs: the FP8 rung, and the rung it follows (the
    # last carried one before it: a peer's rung, torchao's float8 here, is carried nowhere)
    before = next(c for c in reversed(cases[:cases.index(fp8[0])])
                  if c["float8"] == "none" and changed(c, fp8[0]) == {"float8": "delayed"})
    assert before["name"] == "fused_rope"  # the peers' rungs between them (Liger, torchao) are carried nowhere
    assert [c["rung"] for c in runs] == [before["case_id"], before["case_id"], fp8[0]["case_id"]]
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
        c = config_yaml()
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


def test_a_users_contenders_renumber_the_runs_rungs_as_the_ladder_jobs():
    """With contenders the ladder job has more rungs before the FP8 one: the labels follow it."""
    config = {**CONFIG, "contenders": str(REPO / "examples" / "contenders" / "lmperf_kernels.py")}
    spec = json.loads(wf.convergence_spec(config, "full"))
    size = spec["size"]
    ladder_ids = [c["case_id"] for c in ladder.cases(json.loads(wf.ladder_spec(config, config["ladder"]["full"], size)),
                                                       size, cuda=True)]
    runs = convergence.cases(spec, cuda=True)
    fp8 = next(i for i in ladder_ids if "ours_float8" in i)
    assert runs[2]["rung"] == fp8 and runs[0]["rung"] == ladder_ids[ladder_ids.index(fp8) - 1]
    assert any("contender" in i for i in ladder_ids[:ladder_ids.index(fp8)])  # the numbers moved


def test_the_text_is_checked_split_and_batched_alike_for_every_run():
    spec = json.loads(wf.convergence_spec(CONFIG, "smoke"))
    bf16, init1, fp8 = ({**c, "steps": 3} for c in convergence.cases(spec))
    train_tokens, held = convergence.splits(bf16)
    text = (REPO / spec["text"]["path"]).read_bytes()
    assert len(train_tokens) + len(held) == len(text) and len(held) == len(text) - int(len(text) * 0.9)
    assert bytes(held[:100].tolist()) == text[len(train_tokens):len(train_tokens) + 100]  # the end, held out
    draw = lambda case: list(convergence.batches(case, train_tokens))  # noqa: E731
    a, b, c = draw(bf16), draw(fp8), draw(init1)
    assert all((x[0] == y[0]).all() and (x[1] == y[1]).all() for x, y in zip(a, b))  # the same batches ...
    assert all((x[0] == y[0]).all() for x, y in zip(a, c))  # ... for the run from other initial weights too
    inputs, targets = a[0]
    assert inputs.shape == (bf16["batch_size"] * bf16["micro_batches"], bf16["context"])
    assert (inputs[:, 1:] == targets[:, :-1]).all() and int(inputs.max()) < 256
    assert not (a[0][0] == a[1][0]).all()  # each step its own windows
    windows = convergence.heldout_batches(bf16, held)
    assert len(windows) == bf16["eval_batches"] and windows[0][0].shape == (bf16["batch_size"], bf16["context"])
    assert convergence.eval_steps({"eval_every": 10, "steps": 25}) == [10, 20, 25]


def test_another_text_or_a_missing_one_is_refused_by_name(tmp_path):
    spec = json.loads(wf.convergence_spec(CONFIG, "smoke"))
    case = convergence.cases(spec)[0]
    other = tmp_path / "other.txt"
    other.write_text("not the text the spec names\n" * 100)
    with pytest.raises(ValueError, match="other.txt: sha256"):
        convergence.splits({**case, "text": str(other)})
    with pytest.raises(ValueError, match="no such file"):
        convergence.splits({**case, "text": "data/text/none.txt"})


def test_the_runs_start_from_the_weights_of_their_own_seed():
    import torch
    from lmperf import train

    spec = json.loads(wf.convergence_spec(CONFIG, "smoke"))
    bf16, init1, fp8 = convergence.cases(spec)
    dims = spec["models"][spec["size"]]
    weights = lambda case: train.setup({**case, "compile": False}, dims, "cpu").model.lm_head.weight  # noqa: E731
    assert torch.equal(weights(bf16), weights(fp8)) and not torch.equal(weights(bf16), weights(init1))


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
    assert set(ok["run"]) == {"bf16", "bf16_init1"} and set(ok["metric"]) == {"loss", "heldout_loss"}
    bf16 = ok[ok["run"] == "bf16"]
    assert sorted(bf16[bf16["metric"] == "loss"]["step"]) == [1, 2, 3, 4] and ok["mean"].map(math.isfinite).all()
    assert list(bf16[bf16["metric"] == "heldout_loss"]["step"]) == [4]  # after the last step
    assert ok["mean"].between(3, 12).all()  # about log(10,000) at the start
    fp8 = df[df["run"] == "float8_delayed"]
    assert list(fp8["status"]) == ["skipped"] and list(fp8["message"]) == ["needs CUDA"]
    assert {"commit", "torch", "measured_at", "hw", "rung", "text_sha256"} <= set(df.columns)


def convergence_frame(fp8_offset: float, noise_offset: float = 0.01, fp8_status: str = "ok",
                      noise_at: dict | None = None) -> pd.DataFrame:
    """The job's rows with synthetic losses over 200 steps, a held-out loss every 25: bf16's
    falling from 9 to 2, the other runs offset from it by a constant (the run from other weights
    by `noise_at[step]` where given)."""
    spec = {**json.loads(wf.convergence_spec(CONFIG, "smoke")), "steps": 200, "eval_every": 25}
    rows = []
    curve = lambda s: 2 + 7 * math.exp(-s / 40)  # noqa: E731
    for case in convergence.cases(spec):
        base = {**case, "section": "convergence", "study": "convergence", "status": "ok", "message": ""}
        if case["float8"] != "none" and fp8_status != "ok":
            rows.append({**base, "metric": "", "mean": math.nan, "status": fp8_status, "message": "needs CUDA"})
            continue
        offset = lambda s: {"bf16": 0.0, "bf16_init1": (noise_at or {}).get(s, noise_offset)}.get(case["run"], fp8_offset)  # noqa: E731
        rows += [{**base, "step": s, "metric": "loss", "mean": curve(s) + 0.3 + offset(s)} for s in range(1, 201)]
        rows += [{**base, "step": s, "metric": "heldout_loss", "mean": curve(s) + offset(s)}
                 for s in convergence.eval_steps(case)]
    return pd.DataFrame(rows)


LIMITS = {**report_convergence.DEFAULTS, **BARS["convergence"]}


@pytest.mark.parametrize("fp8_offset, noise_offset, passed", [
    (0.015, 0.01, True),    # within 2 x the noise (0.02)
    (-0.03, 0.01, False),   # beyond it, and beyond 1% of bf16's last held-out loss (about 0.0201)
    (0.03, 0.02, True),     # a wider noise widens the bar
    (0.02, 0.0, True),      # bf16's runs agree exactly: 1% of the loss is the bar
    (0.025, 0.0, False),
    (math.nan, 0.01, False)])  # diverged
def test_the_report_judges_the_fp8_runs_heldout_loss_against_the_tolerance(fp8_offset, noise_offset, passed):
    view = report_convergence.judge_heldout(convergence_frame(fp8_offset, noise_offset), LIMITS)
    assert view["passed"] is passed
    assert view["compared"] == [100, 125, 150, 175, 200]  # from half the run on
    assert view["ref"] == pytest.approx(2 + 7 * math.exp(-200 / 40))
    assert view["tolerance"] == pytest.approx(max(2 * noise_offset, 0.01 * view["ref"]))


def test_the_noise_is_the_largest_gap_of_the_bf16_runs_at_the_steps_compared():
    # the runs from other weights lie 0.05 apart at step 25 (not compared) and 0.03 at step 175
    frame = convergence_frame(0.05, 0.001, noise_at={25: 0.05, 175: 0.03})
    view = report_convergence.judge_heldout(frame, LIMITS)
    assert view["noise_delta"] == pytest.approx(0.03) and view["tolerance"] == pytest.approx(0.06)
    assert view["passed"] is True and view["worst_step"] in view["compared"]
    assert list(view["at_steps"]["step"]) == [25, 50, 75, 100, 125, 150, 175, 200]
    late = convergence_frame(0.05, 0.001)  # the same FP8 gap, quiet bf16 runs: beyond the bar
    assert report_convergence.judge_heldout(late, LIMITS)["passed"] is False


def last_steps_frame(fp8_offset: float, noise_offset: float = 0.01, fp8_status: str = "ok") -> pd.DataFrame:
    """Rows as the check wrote them before held-out losses: a synthetic token stream, training
    losses alone, bf16 on another draw of it (data seed 1) as the noise floor."""
    rows = []
    for run, recipe, seed in (("bf16", "none", 0), ("bf16_seed1", "none", 1), ("float8_delayed", "delayed", 0)):
        base = {"section": "convergence", "study": "convergence", "case_id": f"tiny-{run}", "size": "tiny",
                "run": run, "float8": recipe, "data_seed": seed, "steps": 200, "context": 32, "batch_size": 2,
                "rung": "tiny-rung15-ours_float8_delayed", "stream_entropy": 0.65, "status": "ok", "message": ""}
        if recipe != "none" and fp8_status != "ok":
            rows.append({**base, "metric": "", "mean": math.nan, "status": fp8_status, "message": "needs CUDA"})
            continue
        offset = {"bf16": 0.0, "bf16_seed1": noise_offset}.get(run, fp8_offset)
        rows += [{**base, "step": s, "metric": "loss", "mean": 2 + 7 * math.exp(-s / 40) + offset} for s in range(1, 201)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("fp8_offset, noise_offset, passed", [
    (0.015, 0.01, True), (-0.03, 0.01, False), (0.02, 0.0, True), (0.025, 0.0, False), (math.nan, 0.01, False)])
def test_rows_without_heldout_losses_are_judged_as_before(fp8_offset, noise_offset, passed):
    view = report_convergence.judge_last_steps(last_steps_frame(fp8_offset, noise_offset), LIMITS)
    assert view["passed"] is passed
    ref = 2 + 7 * sum(math.exp(-s / 40) for s in range(151, 201)) / 50
    assert view["ref"] == pytest.approx(ref) and view["last_steps"] == 50
    assert view["tolerance"] == pytest.approx(max(2 * noise_offset, 0.01 * ref))


def render_convergence(tmp_path: Path, name: str, frame: pd.DataFrame) -> str:
    results = tmp_path / name / "results" / "cpu"
    (results / "convergence").mkdir(parents=True)
    frame.to_csv(results / "convergence" / "convergence.csv", index=False)
    return render.render(results, REPO / "templates", tmp_path / name / "r.md", tmp_path / name / "fig", "smoke",
                         BARS, sections=[s for s in render.SECTIONS if s.name == "convergence"],
                         template="convergence.md.j2")


def test_the_report_renders_the_section_from_the_csv(tmp_path):
    for name, frame, view in (
            ("pass", convergence_frame(0.015), True), ("fail", convergence_frame(0.2), False),
            ("skipped", convergence_frame(0.0, fp8_status="skipped"), None),
            ("old_pass", last_steps_frame(0.015), True), ("old_skipped", last_steps_frame(0.0, fp8_status="skipped"), None)):
        text = render_convergence(tmp_path, name, frame)
        judged = (report_convergence.judge_heldout if "heldout_loss" in set(frame["metric"]) else
                  report_convergence.judge_last_steps)(frame, LIMITS)
        assert judged["passed"] is view and judged["verdict"] in text
        assert (tmp_path / name / "fig" / "convergence_loss.png").exists()
    text = render_convergence(tmp_path, "rungs", convergence_frame(0.015))
    rungs = convergence.cases(json.loads(wf.convergence_spec(CONFIG, "smoke")))
    assert f"`{rungs[0]['rung']}`" in text and f"`{rungs[2]['rung']}`" in text  # each run's rung, named


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
