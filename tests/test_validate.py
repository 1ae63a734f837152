"""Results are checked where they are read, and what is missing is visible: a damaged CSV
(cut mid-row, header only, empty, garbage, short of its job's cases) stops the render naming
the file and leaves the report and figures as they were; a render by hand lists the files the
configuration promises and does not have, and marks the sections they leave partial."""
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from lmperf import workflow as wf
from lmperf.report import render, validate

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "results" / "h100-80gb-hbm3"   # the committed H100 run: every standard file at scale full
CONFIG = render.load_config(REPO / "config" / "config.yaml")
CSV = "e2e/variants/small.csv"


@pytest.fixture
def results(tmp_path) -> Path:
    """A copy of the committed H100 results under tmp_path/results/h100-80gb-hbm3."""
    dest = tmp_path / "results" / COMMITTED.name
    shutil.copytree(COMMITTED, dest)
    return dest


@pytest.fixture
def rendered(h100_report) -> Path:
    """A report of the committed results and its figures (tests/conftest.py's h100_report,
    rendered once a session): its report/ folder, what a failed render must leave as it is."""
    return h100_report.out.parent


def promised(results: Path) -> dict:
    """The files a full run promises, less a section's deep grid that has not run (its view says so)."""
    files = render.promised_files(CONFIG, results, "full", render.distributed_folders(results))
    not_run = render.deep_grids_not_run(files)
    return {path: f for path, f in files.items() if path not in not_run}


def not_there(results: Path) -> list[str]:
    """The promised files `results` lacks, as results/<hw>/...: the deep target's alone, or none."""
    files = promised(results)
    deep = {f.path for f in wf.deep_files(list(files.values()))}
    lacking = [f.path for p, f in files.items() if not Path(p).exists()]
    assert set(lacking) <= deep, sorted(set(lacking) - deep)
    return sorted(str(Path("results") / results.name / Path(p).relative_to(results)) for p in lacking)


def render_by_hand(results: Path, tmp_path: Path) -> str | None:
    """`python -m lmperf.report` by hand (config/config.yaml, no --config-json): None, or the
    error it exits with."""
    try:
        render.main(["--results", str(results), "--scale", "full", "--templates", str(REPO / "templates"),
                     "--out", str(tmp_path / "report" / "report.md"), "--figures", str(tmp_path / "report" / "figures"),
                     "--config", str(REPO / "config" / "config.yaml")])
    except SystemExit as e:
        return str(e.code)
    return None


def cut_mid_row(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[:len(text) // 2])


def header_only(path: Path) -> None:
    path.write_text(path.read_text().splitlines(keepends=True)[0])


def emptied(path: Path) -> None:
    path.write_text("")


def garbage(path: Path) -> None:  # what `head -c 3000 /dev/urandom | base64 > file` leaves
    path.write_text("cnf7DWVgXVsAF0wIQuR1hg56n3uBVTgLLVtwb7aaTd5WDYE016PlknsUBLlSiTV\nymR8HfmFw1nAU+==\n")


def garbage_numbers(path: Path) -> None:  # a table whose numbers are text (pandas then compares float and str)
    df = pd.read_csv(path, dtype={"mean": object})
    df.loc[3, "mean"] = "fast"
    df.to_csv(path, index=False)


def at_this_code(path: Path) -> None:
    """The file's rows named as measured at HEAD, so that it is at its section's code whatever the
    committed run's commit (one of older code that lacks promised cases is shown as measured)."""
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df.assign(commit=head).to_csv(path, index=False)


def short_at_a_row_boundary(path: Path) -> None:  # 47 cases becoming 43: whole rows gone
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:len(lines) // 2]))


@pytest.mark.parametrize("damage, says", [
    (cut_mid_row, "ends mid-row"),
    (header_only, "has a header but no rows"),
    (emptied, "is empty"),
    (garbage, "is not a results table"),
    (garbage_numbers, "has non-numbers in column mean (line 5: 'fast')"),
    (short_at_a_row_boundary, "holds 4 of the 8 cases its job promises (missing: "),
])
def test_a_damaged_csv_stops_the_render_naming_it_and_leaves_the_report(results, rendered, tmp_path, damage,
                                                                          says):
    shutil.copytree(rendered, tmp_path / "report")
    report, figure = tmp_path / "report" / "report.md", tmp_path / "report" / "figures" / "e2e_step_vs_size.png"
    before = report.read_bytes(), figure.read_bytes()
    at_this_code(results / CSV)
    damage(results / CSV)
    err = render_by_hand(results, tmp_path)
    assert f"{results / CSV} " in err and says in err
    assert "snakemake --cores 1 report/report.md" in err and "git checkout -- <file>" in err
    assert (report.read_bytes(), figure.read_bytes()) == before  # a failed render changes neither
    assert not list(report.parent.glob(".render-*"))              # nor leaves its staging folder


def test_every_damaged_file_is_named_at_once(results):
    cut_mid_row(results / CSV)
    emptied(results / "precision" / "precision.csv")
    with pytest.raises(validate.DamagedResults) as e:
        render.render(results, REPO / "templates", results / "r.md", results / "fig", "full", CONFIG["report"],
                      promised(results))
    assert sorted(e.value.problems) == [str(results / CSV), str(results / "precision" / "precision.csv")]


def test_a_csv_with_cases_its_job_does_not_promise_is_refused(results):
    df = pd.read_csv(results / CSV)
    other = df[df.case_id == df.case_id[0]].assign(case_id="small-ctx4096-fp32-eager-train-warmup5")
    pd.concat([df, other]).to_csv(results / CSV, index=False)
    problem = validate.problem(results / CSV, promised(results)[str(results / CSV)].case_ids())
    assert "1 case(s) its job does not promise (small-ctx4096-fp32-eager-train-warmup5)" in problem


def test_a_csv_of_a_larger_grid_shows_what_it_measured_then_or_the_promised_cases_at_this_code(results,
                                                                                             monkeypatch):
    """Every promised case and more: in a file whose rows all name a commit whose code for the
    section has changed since, an earlier configuration's grid, read as measured (the report's
    line on older code names the section); at this code a grid that has shrunk since, read as the
    cases the job now promises (the workflow's own check still refuses it, so Snakemake reruns
    the job). A file short of a promised case is damaged at this code; of older code it is a
    grid of then that lacked a case the job has promised since (a job cut short writes no CSV),
    read as measured."""
    df = pd.read_csv(results / CSV)
    extra = df[df.case_id == df.case_id[0]].assign(case_id="small-ctx4096-fp32-eager-train-warmup5")
    pd.concat([df, extra]).to_csv(results / CSV, index=False)
    files = promised(results)
    from lmperf.report import freshness
    monkeypatch.setattr(freshness, "changed_since", lambda commit, files: (["src/lmperf/bench/e2e.py"], ""))
    assert render.measured_at_older_code(results / CSV, "e2e")
    assert "small-ctx4096-fp32-eager-train-warmup5" in set(render.load_section(results, "e2e", files)["case_id"])
    monkeypatch.setattr(freshness, "changed_since", lambda commit, files: ([], ""))
    shown = render.load_section(results, "e2e", files)
    of_file = shown[shown["case_id"].str.startswith("small-") & (shown["study"] == "variants")]
    assert set(of_file["case_id"]) == set(files[str(results / CSV)].case_ids())
    assert "small-ctx4096-fp32-eager-train-warmup5" not in set(shown["case_id"])
    assert len(shown[shown["case_id"] == df.case_id[0]]) == len(df[df.case_id == df.case_id[0]])
    assert validate.damaged([files[str(results / CSV)]])  # Snakemake reruns the job
    short = df[df.case_id != df.case_id[0]]  # short of a promised case: damaged at this code
    short.to_csv(results / CSV, index=False)
    with pytest.raises(validate.DamagedResults, match="cases its job promises"):
        render.load_section(results, "e2e", files)
    monkeypatch.setattr(freshness, "changed_since", lambda commit, files: (["src/lmperf/bench/e2e.py"], ""))
    assert set(render.load_section(results, "e2e", files)["case_id"]) >= set(short["case_id"])
    assert validate.damaged([files[str(results / CSV)]])  # Snakemake measures the job again


def test_env_csv_must_hold_the_keys_the_report_reads(results):
    env = results / "env" / "env.csv"
    assert validate.problem(env, env=True) is None
    env.write_text("key,value\ngpu,x\n")
    assert validate.problem(env, env=True) == "has no hw, scale row"


def test_the_committed_results_hold_every_case_the_config_promises():
    """The committed H100 run (with the contenders it was measured with) holds every file
    config/config.yaml's full scale promises; a file at its section's code now holds every case its
    job promises, and what else it holds is a larger grid of the same job (measured before the
    grids were cut for the 30-minute run), which the report does not show."""
    files = promised(COMMITTED)
    # every file of a standard run; the deep target's (repeats, convergence) are measured apart
    # (`make report-deep`): those the folder lacks are named by the report (tests below)
    assert all(Path(f.path).exists() for f in wf.run_files(list(files.values()), "standard"))
    there = {p: f for p, f in files.items() if Path(p).exists()}
    # a file measured at older code may lack cases its job has promised since: the report shows it
    # under its line on older code (render.load_section), and a run on the GPU measures it again
    older = {p: f.section != "env" and render.measured_at_older_code(Path(p), render.code_section(f)) for p, f in there.items()}
    assert {p: problem for p, f in there.items()
            if (problem := validate.problem(p, f.case_ids(), env=f.section == "env", earlier_grid=True,
                                            older_code=older[p]))} == {}
    for p, f in there.items():
        if f.section == "env" or older[p]:
            continue
        shown = render.load_section(COMMITTED, f.section, files)
        assert set(f.case_ids()) <= set(shown["case_id"]), p


def test_a_render_by_hand_lists_the_missing_files_and_marks_partial_sections(results, tmp_path):
    already = not_there(results)  # the deep target's files the committed folder lacks, if any
    (results / "e2e" / "warmup" / "2.7B.csv").unlink()
    (results / "lrpe" / "check.csv").unlink()
    assert render_by_hand(results, tmp_path) is None
    text = (tmp_path / "report" / "report.md").read_text()
    listed = sorted(["results/h100-80gb-hbm3/e2e/warmup/2.7B.csv", "results/h100-80gb-hbm3/lrpe/check.csv", *already])
    line = next(l for l in text.splitlines() if l.startswith("**Not measured yet:**"))
    assert line.startswith(f"**Not measured yet:** {len(listed)} of the {len(promised(results))} result files a "
                           "full run writes at this scale are missing (")
    assert sorted(re.findall(r"`(results/[^`]+)`", line)) == listed
    sections = dict(s.split("\n", 1) for s in text.split("\n## ")[1:])
    partial = {name for name, body in sections.items() if body.lstrip().startswith("**Partial:**")}
    assert partial == {"End-to-end Transformer timings", "Correctness", "Multi-dimensional LRPE-cosine (Triton)"}
    assert "`results/h100-80gb-hbm3/e2e/warmup/2.7B.csv`, a result file this section reads, is missing:\n" \
           "its counts, ranges, figures and targets cover only the rows that exist" in sections["End-to-end Transformer timings"]


def test_a_complete_render_says_every_promised_file_is_there(h100_report, monkeypatch):
    """The files the configuration promises (the multi-GPU run's among them) that the committed
    results lack are the deep target's alone, and the render counts and names exactly those."""
    monkeypatch.chdir(REPO)  # h100_report names the folders as the report rule does
    files = render.promised_files(CONFIG, Path("results") / COMMITTED.name, "full", ["results/h200-x4"])
    deep = {f.path for f in wf.deep_files(list(files.values()))}
    lacking = sorted(p for p in files if not Path(p).exists())
    assert set(lacking) <= deep, sorted(set(lacking) - deep)
    # the deep grids of sections the standard run measures too (attention's, FlashAttention's, the
    # end-to-end sizes'): none of their files is here, so the deep target has not run them, and
    # the render neither promises nor misses them
    grids = {p for p, f in files.items() if f.deep and f.section not in render.DEEP}
    assert grids and not any(Path(p).exists() for p in grids)
    assert render.deep_grids_not_run(files) == grids
    assert h100_report["expected"] == len(files) - len(grids)
    assert h100_report["missing"] == [p for p in lacking if p not in grids]
    promised = {p: f for p, f in files.items() if p not in grids}
    assert sorted(m for ms in h100_report["partial"].values() for m in ms) == sorted(
        m for section, ms in render.missing(Path("results") / COMMITTED.name, promised).items() for m in ms)


def test_by_hand_the_multi_gpu_folders_are_the_ones_there_are(tmp_path):
    (tmp_path / "h200").mkdir()
    assert render.distributed_folders(tmp_path / "h200") == []
    (tmp_path / "h200-x2").mkdir()
    assert render.distributed_folders(tmp_path / "h200") == [str(tmp_path / "h200-x2")]
    (tmp_path / "cpu").mkdir()
    assert render.distributed_folders(tmp_path / "cpu") == [str(tmp_path / "cpu")]


def test_a_render_that_fails_midway_leaves_the_report_and_figures(results, rendered, tmp_path, monkeypatch):
    """The figures are drawn and the text rendered into a staging folder; an exception after
    the first figures (here in the last section's view) moves nothing into place."""
    from lmperf.report import distributed
    shutil.copytree(rendered, tmp_path / "report")
    before = {p: p.read_bytes() for p in (tmp_path / "report").rglob("*") if p.is_file()}

    def broken(inputs):
        raise RuntimeError("a bug in a view")
    monkeypatch.setattr(distributed, "view", broken)
    with pytest.raises(RuntimeError, match="a bug in a view"):
        render_by_hand(results, tmp_path)
    assert {p: p.read_bytes() for p in (tmp_path / "report").rglob("*") if p.is_file()} == before


def test_clock_columns_are_numbers_where_a_csv_has_them_and_a_csv_without_them_is_whole(results):
    path = results / CSV
    assert validate.problem(path) is None  # measured before rows carried clocks: read as it is
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    clocks = dict.fromkeys(validate.CLOCK_COLUMNS, "1980.0")
    df.assign(**{**clocks, "power_w_end": ""}).to_csv(path, index=False)  # a reading NVML could not take: empty
    assert validate.problem(path) is None
    df.assign(**{**clocks, "sm_clock_mhz_start": "boost"}).to_csv(path, index=False)
    assert "sm_clock_mhz_start" in validate.problem(path)
