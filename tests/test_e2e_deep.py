"""The end-to-end tables of the deep target: every model size of the assignment, forward and
training step, and torch.compile against eager across contexts, planned at depth deep and not in
the standard run; the compile table built from the rows; the table of models listing every size
the report names."""
import math
from pathlib import Path

import pandas as pd
import pytest

from lmperf import workflow
from lmperf.report import e2e as view_e2e
from lmperf.report import render
from lmperf.report.format import Spread
from lmperf.report.sections import Inputs

REPO = Path(__file__).parents[1]
H100 = REPO / "results" / "h100-80gb-hbm3"
# The assignment's model sizes (CS336 assignment 2, section 1.1.2), written out here
ASSIGNMENT_SIZES = {"small", "medium", "large", "xl", "2.7B"}


@pytest.fixture(scope="module")
def planned():
    config = render.load_config()
    files = workflow.result_files(config, "results/x", "full", [])
    return config, [f for f in files if f.section == "e2e"], files


def jobs(files) -> set[tuple[str, str]]:
    """(study, size) of each end-to-end file."""
    return {tuple(f.path.split("/")[-2:]) for f in files}


def test_the_deep_target_times_every_size_forward_and_training_step(planned):
    """At depth deep the variants study (forward pass and training step, fp32 and bf16, eager and
    compiled) runs at all five of the assignment's sizes; the standard run keeps two of them and
    plans none of the deep target's files."""
    config, e2e, files = planned
    deep = [f for f in workflow.run_files(files, "deep") if f.section == "e2e"]
    standard = [f for f in workflow.run_files(files, "standard") if f.section == "e2e"]
    sizes = lambda fs, study: {size.removesuffix(".csv") for s, size in jobs(fs) if s == study}
    assert sizes(deep, "variants") == ASSIGNMENT_SIZES
    assert sizes(standard, "variants") == {"small", "2.7B"}
    assert not any(f.deep for f in standard) and {f.path for f in standard} < {f.path for f in deep}
    variants = [f for f in deep if f.study == "variants"]
    for f in variants:
        ids = f.case_ids()
        size = f.arg
        for mode in ("forward", "train"):
            for dtype in ("fp32", "bf16"):
                for compiled in ("eager", "compiled"):
                    assert f"{size}-ctx256-{dtype}-{compiled}-{mode}-warmup5" in ids


def test_the_deep_target_compiles_every_size_across_contexts_beside_eager(planned):
    """torch.compile against eager across contexts: at every size, the compiled training step at
    128, 512 and 1,024 tokens (the compile study) and the eager one (the context study), 256 from
    the variants study; the deep target's alone."""
    config, e2e, files = planned
    deep = workflow.run_files(files, "deep")
    ids = {c for f in deep if f.section == "e2e" for c in f.case_ids()}
    for size in ASSIGNMENT_SIZES:
        for context in (128, 256, 512, 1024):
            for compiled in ("eager", "compiled"):
                assert f"{size}-ctx{context}-bf16-{compiled}-train-warmup5" in ids, (size, context, compiled)
    compile_files = [f for f in e2e if f.study == "compile"]
    assert compile_files and all(f.deep for f in compile_files)
    assert not [f for f in workflow.run_files(files, "standard") if f.study == "compile"]


def test_the_deep_end_to_end_files_are_not_missing_until_the_deep_target_has_run(tmp_path):
    """A standard run's report does not count the deep target's end-to-end files missing while
    none of them is there (render.deep_grids_not_run: the section shows the tables it has); once
    one is, the others are missing like any promised file."""
    config = render.load_config()
    results = tmp_path / "h100"
    promised = render.promised_files(config, results, "full", [])
    deep = {p for p, f in promised.items() if f.section == "e2e" and f.deep}
    assert {Path(p).relative_to(results).parts[1] for p in deep} == {"variants", "context", "compile"}
    assert deep <= render.deep_grids_not_run(promised)
    (results / "e2e" / "compile").mkdir(parents=True)
    (results / "e2e" / "compile" / "xl.csv").write_text("")
    assert not deep & render.deep_grids_not_run(promised)


def h100_rows() -> pd.DataFrame:
    return pd.concat([pd.read_csv(p) for p in sorted((H100 / "e2e").glob("*/*.csv"))], ignore_index=True)


def with_compile_study(rows: pd.DataFrame, speedup: float) -> pd.DataFrame:
    """The committed rows with a compile study made of the context study's bf16 rows, compiled,
    their times divided by `speedup` (a status other than ok kept: the 2.7B at 1,024 ran out of
    memory)."""
    ctx = rows[(rows["study"] == "context") & (rows["dtype"] == "bf16")].copy()
    ctx["study"], ctx["compile"] = "compile", True
    ctx["case_id"] = ctx["case_id"].str.replace("-eager-", "-compiled-")
    for col in ("mean", "median", "q20", "q80", "min", "max"):
        timed = ctx["metric"].str.endswith("_ms")
        ctx.loc[timed, col] = ctx.loc[timed, col] / speedup
    return pd.concat([rows, ctx], ignore_index=True)


def inputs(frames: dict) -> Inputs:
    config = render.load_config()
    return Inputs(results=H100, frames=frames, bars={"host_bound_idle_pct": math.inf}, out_dir=REPO / "report",
                  models=config["models"])


def test_the_compile_table_sets_each_compiled_step_beside_its_eager_one():
    rows = with_compile_study(h100_rows(), speedup=1.25)
    v = view_e2e.view(inputs({"e2e": rows}))
    table = v["compile"]
    assert set(table["size"]) == {"small", "2.7B"} and set(table["dtype"]) == {"bf16"}
    assert set(table["context"]) == {128, 256, 512, 1024}  # 256: the variants study's pair
    ok = table[table["eager / compiled"].notna()]
    made = ok[ok["context"] != 256]
    assert made["eager / compiled"].tolist() == pytest.approx([1.25] * len(made)) and len(made) == 5
    assert all(isinstance(x, Spread) for x in ok["eager step ms"])
    oom = table[(table["size"] == "2.7B") & (table["context"] == 1024)].iloc[0]
    assert (oom["eager step ms"], oom["compiled step ms"]) == ("oom", "oom") and pd.isna(oom["eager / compiled"])
    assert v["compile_failed"][["size", "context", "status"]].values.tolist() == [["2.7B", 1024, "oom"]]
    assert v["compile_speedup_all"]["n"] == len(ok) == 7
    assert set(v["compile_speedup_by_context"]) == {128, 256, 512, 1024}


def test_a_compiled_case_at_the_variants_context_takes_its_eager_step_from_the_variants_study():
    rows = h100_rows()
    variants = rows[(rows["study"] == "variants") & (rows["mode"] == "train") & (rows["dtype"] == "bf16")
                    & (rows["compile"] == True)].assign(study="compile")  # noqa: E712
    v = view_e2e.view(inputs({"e2e": pd.concat([rows, variants], ignore_index=True)}))
    at = v["compile"].set_index(["size", "context"])
    step = rows[(rows["metric"] == "step_ms") & (rows["study"] == "variants")].set_index("case_id")["median"]
    assert at.loc[("small", 256), "eager / compiled"] == pytest.approx(
        step["small-ctx256-bf16-eager-train-warmup5"] / step["small-ctx256-bf16-compiled-train-warmup5"])


def test_without_the_compile_study_there_is_no_compile_table():
    assert "compile" not in view_e2e.view(inputs({"e2e": h100_rows()}))


def test_the_table_of_models_lists_every_size_the_report_names():
    """The committed profile names xl, which no end-to-end row times: the table of models lists it
    (its dimensions, its parameters counted from them and the vocabulary the measured sizes share),
    and the measured sizes keep the benchmark's counts."""
    profile = pd.read_csv(H100 / "profile" / "profile.csv")
    assert "xl" in set(profile["size"])
    frames = {"e2e": h100_rows(), "profile": profile}
    table = view_e2e.view(inputs(frames))["models"].set_index("model")
    assert list(table.index) == ["small", "xl", "2.7B"]
    assert table.loc["small", "counted"] == table.loc["2.7B", "counted"] == "by the benchmark"
    assert table.loc["xl", "counted"] == "from its dimensions"
    xl = render.load_config()["models"]["xl"]
    vocab = table.loc["small", "vocabulary"]
    assert table.loc["xl", "vocabulary"] == vocab
    assert table.loc["xl", "_parameters"] == view_e2e.body_parameters(xl) + 2 * vocab * xl["d_model"]
    # the model code's own count of xl agrees
    from lmperf.model import ModelConfig, count_parameters
    assert count_parameters(ModelConfig(**xl, context_length=256, vocab_size=int(vocab))) == table.loc["xl", "_parameters"]


def test_the_section_names_the_rows_the_deep_target_measured():
    """Rows marked `deep_target` (report/rows.py marks those of the files a plan marks deep) are
    named per study and size; without the mark, none are."""
    rows = with_compile_study(h100_rows(), speedup=1.25)
    assert view_e2e.view(inputs({"e2e": rows}))["deep_target"] == {}
    marked = rows.assign(deep_target=(rows["study"] == "compile") | ((rows["study"] == "variants") & (rows["size"] == "2.7B")))
    assert view_e2e.view(inputs({"e2e": marked}))["deep_target"] == {"compile": ["small", "2.7B"], "variants": ["2.7B"]}
