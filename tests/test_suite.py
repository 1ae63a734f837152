"""The suite itself: the tests of the committed report read it from git, so `make report` (which
rewrites report/report.md and report/figures/ for this machine) and `make test` pass in either
order; and the Makefile's two targets run every test between them."""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, committed, committed_files
from lmperf.report import render

# The tests that check the committed report (marked `committed`); each must be among them.
COMMITTED_TESTS = {"tests/test_report.py::test_the_committed_report_is_checked_like_a_fresh_render",
                   "tests/test_report.py::test_the_committed_reports_have_no_raw_html_glitches",
                   "tests/test_report_figures.py::test_no_placeholder_image_is_committed"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=lmperf", "-c", "user.email=lmperf@localhost", *args], cwd=repo,
                          capture_output=True, text=True, check=True).stdout


def checkout(dest: Path) -> Path:
    """A clone of this checkout (its history, HEAD's report/ and results/ as committed) whose
    other files are the working tree's, committed on top: a fresh clone of the code under test."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, text=True)
    if files.returncode != 0:
        pytest.skip(f"clones the repository, and {REPO} is not a git checkout: {files.stderr.strip()}")
    git(REPO, "clone", "-q", str(REPO), str(dest))
    for name in filter(None, files.stdout.split("\0")):
        source, target = REPO / name, dest / name
        if source.is_file() and not name.startswith(("report/", "results/")) and not (
                target.is_file() and target.read_bytes() == source.read_bytes()):   # an edit: newer than the rest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--allow-empty", "-m", "the working tree")
    return dest


def rendered_here(repo: Path, results: Path) -> None:
    """What `make report` leaves on this machine: report/report.md and report/figures/ rewritten
    from `results` at smoke scale (figures of sections without rows removed)."""
    bars = render.bars_from_config(repo / "config" / "config.yaml")
    render.render(results, repo / "templates", repo / "report" / "report.md", repo / "report" / "figures",
                  "smoke", bars)


def pytest_in(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-rA",
                           *args], cwd=repo, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(repo / "src")})


def outcomes(proc: subprocess.CompletedProcess) -> dict[str, set[str]]:
    """{PASSED/SKIPPED/FAILED/ERROR: test ids} from pytest's -rA summary."""
    out = {}
    for kind, test in re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED) (?:\[\d+\] )?(\S+)", proc.stdout, re.M):
        out.setdefault(kind, set()).add(test.rstrip(":"))
    return out


def test_committed_reads_head_whatever_the_working_tree_holds(tmp_path):
    repo = tmp_path / "repo"
    (repo / "report").mkdir(parents=True)
    (repo / "report" / "report.md").write_text("committed\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "report")
    (repo / "report" / "report.md").write_text("rendered on this machine\n")
    (repo / "report" / "new.md").write_text("never committed\n")
    assert committed("report/report.md", repo) == "committed\n"
    assert committed_files("report", repo) == ["report/report.md"]
    with pytest.raises(pytest.fail.Exception, match="report/new.md is not committed at HEAD"):
        committed("report/new.md", repo)


def test_outside_a_git_checkout_a_committed_test_is_skipped_saying_why(tmp_path):
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.md").write_text("a copy's report\n")
    with pytest.raises(pytest.skip.Exception, match=r"reads the committed files from git .* is not a git checkout"):
        committed("report/report.md", tmp_path)


@pytest.mark.committed
def test_the_committed_report_is_the_one_at_head():
    assert "report/report.md" in committed_files("report")
    assert committed("report/report.md").startswith("# ")


@pytest.mark.slow
def test_the_committed_report_tests_pass_after_a_report_run_and_skip_without_git(tmp_path):
    """In a checkout whose report/report.md and figures were rewritten as `make report` does on
    a machine with no results (every answer "not measured here", every figure gone), the tests
    marked `committed` still pass: they read HEAD. Without .git they are skipped, saying why."""
    repo = checkout(tmp_path / "lmperf")
    empty = tmp_path / "results" / "cpu"
    empty.mkdir(parents=True)
    rendered_here(repo, empty)
    status = git(repo, "status", "--porcelain", "report")
    assert " M report/report.md" in status and " D report/figures/" in status, status
    assert "4.81 ms" not in (repo / "report" / "report.md").read_text()   # the committed numbers are gone

    ran = pytest_in(repo, "-m", "committed", "tests")
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    got = outcomes(ran)
    assert COMMITTED_TESTS <= got.get("PASSED", set()), got
    assert set(got) == {"PASSED"}, got

    shutil.rmtree(repo / ".git")
    ran = pytest_in(repo, "-m", "committed", *sorted({t.split("::")[0] for t in COMMITTED_TESTS}))
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    got = outcomes(ran)
    assert set(got) == {"SKIPPED"} and "is not a git checkout" in ran.stdout, ran.stdout[-3000:]


# The test files that read the checkout's report/ or results/ folders (what `make report` writes).
READ_THE_REPORT_FOLDER = ["tests/test_report.py", "tests/test_report_labels.py", "tests/test_report_figures.py",
                          "tests/test_hw_reports.py", "tests/test_planning.py", "tests/test_compare.py", "tests/test_validate.py", "tests/test_suite.py"]


@pytest.mark.slow
def test_after_a_real_report_run_the_tests_of_the_report_folder_pass(built_repo, tmp_path):
    """`make report`, then `make test`'s tests of what it rewrote: in a checkout holding what the
    smoke run (built_repo: make report's command on a machine without a GPU) left in report/ and
    results/cpu/, the files that read those folders pass, the committed report's tests included."""
    repo = checkout(tmp_path / "lmperf")
    shutil.rmtree(repo / "report" / "figures")   # written now, as make report writes them: newer than the rest
    shutil.copytree(built_repo / "results" / "cpu", repo / "results" / "cpu", copy_function=shutil.copyfile)
    shutil.copytree(built_repo / "report" / "figures", repo / "report" / "figures", copy_function=shutil.copyfile)
    shutil.copyfile(built_repo / "report" / "report.md", repo / "report" / "report.md")
    assert " M report/report.md" in git(repo, "status", "--porcelain", "report")
    ran = pytest_in(repo, "-m", "not slow", *READ_THE_REPORT_FOLDER)
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
    got = outcomes(ran)
    assert COMMITTED_TESTS <= got.get("PASSED", set()) and not got.keys() & {"FAILED", "ERROR"}, got.keys()


def make_passes(*targets: str) -> list[list[str]]:
    """The pytest arguments (after `python -m pytest`) of each pass the Makefile's targets run
    under the pinned environment, as `make -n` prints them."""
    proc = subprocess.run(["make", "-n", "--no-print-directory", *targets, f"VENV={Path(sys.prefix)}", "PYTEST_WORKERS=0",
                           "PYTEST_ARGS="], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"make -n {' '.join(targets)}: {proc.stderr.strip()}")
    passes = []
    for line in proc.stdout.splitlines():
        words = shlex.split(line.split(";")[0])
        if words[:3] == ["python", "-m", "pytest"]:
            passes.append(words[3:])
    return passes


def test_make_test_says_why_each_skipped_test_was_skipped(tmp_path):
    """make test's pytest pass ends with the reason of every skip, so that a skipped test is never
    a silent one, and still names every failed test."""
    (fast,) = make_passes("test")
    (tmp_path / "test_one.py").write_text("import pytest\n\n\ndef test_on_a_gpu():\n    pytest.skip('needs a GPU')\n"
                                          "\n\ndef test_broken():\n    assert False\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", *fast, "-p", "no:cacheprovider", "test_one.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "SKIPPED [1] test_one.py:5: needs a GPU" in proc.stdout, proc.stdout
    assert "FAILED test_one.py::test_broken" in proc.stdout, proc.stdout


def collected(*args: str) -> tuple[set[str], int]:
    """(ids of the tests selected, number collected) of `pytest --collect-only` with `args`."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    m = re.match(r"(\d+)/(\d+) tests collected", last) or re.match(r"((\d+)) tests? collected", last)
    assert m, last
    ids = {line for line in proc.stdout.splitlines() if "::" in line}
    assert len(ids) == int(m[1]), last
    return ids, int(m[2])


@pytest.mark.slow  # two collections of the whole suite
def test_make_test_and_make_test_slow_run_every_test_between_them():
    """`make test` and `make test-slow` each run one pass of the suite in the pinned environment
    (then test-slow the kernel tests under the newest Triton): what the one leaves out, the other
    runs; and each kernel grid's cases named for make test (conftest.FAST_CASES) are among its."""
    from conftest import FAST_CASES
    fast, slow = make_passes("test"), make_passes("test-slow")
    assert len(fast) == len(slow) == 1, (fast, slow)
    (in_fast, total), (in_slow, total_slow) = collected(*fast[0]), collected(*slow[0])
    assert total == total_slow and len(in_fast | in_slow) == total and in_slow and not in_fast & in_slow, \
        (len(in_fast), len(in_slow), total)
    kept = {f"{test}[{case}]" for test, cases in FAST_CASES.items() for case in cases}
    assert kept <= in_fast, f"conftest.FAST_CASES names cases make test does not collect: {sorted(kept - in_fast)}"
