"""Rows measured at code that has changed since are said to be (lmperf.report.freshness): in a git
repository of its own, a benchmark's file edited after the commit its rows name, committed or
not, or a new file beside it; and where git cannot tell, the reason."""
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from lmperf.report import freshness

REPO = Path(__file__).resolve().parents[1]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> tuple[Path, str]:
    """A repository with a benchmark's two files committed: (its folder, the commit)."""
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "bench.py").write_text("x = 1\n")
    (tmp_path / "common.py").write_text("y = 1\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "one")
    return tmp_path, git(tmp_path, "rev-parse", "--short=12", "HEAD")


FILES = ["bench.py", "common.py"]


def test_code_as_measured_has_no_changed_files(repo):
    folder, commit = repo
    assert freshness.changed_since(commit, FILES, folder) == ([], "")


def test_an_edit_committed_or_not_and_a_new_file_are_changes(repo):
    folder, commit = repo
    (folder / "common.py").write_text("y = 2\n")  # not committed
    assert freshness.changed_since(commit, FILES, folder) == (["common.py"], "")
    git(folder, "commit", "-qam", "two")
    (folder / "new.py").write_text("z = 1\n")  # not tracked yet
    assert freshness.changed_since(commit, [*FILES, "new.py"], folder) == (["common.py", "new.py"], "")
    assert freshness.changed_since(git(folder, "rev-parse", "HEAD"), FILES, folder) == ([], "")


def test_where_git_cannot_tell_it_says_why(repo, tmp_path_factory):
    folder, commit = repo
    for given, why in [(commit + "-dirty", "uncommitted changes"), ("0123456789ab", "not in this checkout"),
                       ("unknown", "no commit"), ("", "no commit")]:
        changed, reason = freshness.changed_since(given, FILES, folder)
        assert changed is None and why in reason, (given, reason)
    elsewhere = tmp_path_factory.mktemp("no_git")
    assert freshness.changed_since(commit, FILES, elsewhere)[0] is None


def rows(commit: str, section: str = "e2e") -> pd.DataFrame:
    return pd.DataFrame({"section": [section, section], "commit": [commit, commit], "metric": ["a", "b"]})


def test_a_report_section_is_changed_if_any_of_its_commits_is(repo, monkeypatch):
    folder, first = repo
    monkeypatch.setattr(freshness, "code_files", lambda section: FILES if section == "e2e" else None)
    (folder / "bench.py").write_text("x = 2\n")
    git(folder, "commit", "-qam", "two")
    second = git(folder, "rev-parse", "--short=12", "HEAD")
    both = pd.concat([rows(first), rows(second)])
    assert freshness.section_state(rows(second), folder)["state"] == "same"
    state = freshness.section_state(both, folder)
    assert state["state"] == "changed" and state["files"] == ["bench.py"] and "bench.py" in state["text"]
    unknown = freshness.section_state(rows(second, "no_such_section"), folder)
    assert unknown["state"] == "unknown" and "no benchmark module" in unknown["text"]
    view = freshness.view({"e2e": both, "memory": pd.DataFrame(), "other": rows("0123456789ab")}, folder)
    assert view["changed"] == ["e2e"] and view["unknown"] == ["other"] and "memory" not in view["sections"]


def test_a_section_s_code_is_what_its_rule_reruns_on():
    from lmperf import workflow
    assert freshness.code_files("ladder") == workflow.code_inputs("lmperf.bench.ladder")
    assert "src/lmperf/kernels/flash_attention_triton.py" in freshness.code_files("flash_attention")
    assert freshness.code_files("repeats") is None  # a folder, not a benchmark: its rows name their job's section
