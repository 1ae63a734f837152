"""Were a section's rows measured with the code now in this tree? Each row names the commit it was
measured at (the `commit` column) and the section that measured it; that section's code is the
files its benchmark rule reruns on (lmperf.workflow.section_code_inputs: every lmperf module its
command can import). git says which of those files differ now from the commit,
edits not yet committed included. A row whose code has changed since may not be what this code
gives: the report says so above its sections and in its environment section, so that it never
presents an older version's number as this code's.

    view(frames)   # {"sections": {folder: {...}}, "changed": [...], "unknown": [...]}
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd

from lmperf import sources, workflow

REPO = sources.SRC.parent
SHOWN = 3  # changed files named in a section's line; the rest are counted


def code_files(section: str) -> list[str] | None:
    """The files of the benchmark of `section` (paths from the repository root), as its rule's
    code inputs; None where no benchmark measures it."""
    return workflow.section_code_inputs(section)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30,
                          check=True).stdout


def changed_since(commit: str, files: list[str], repo: Path = REPO) -> tuple[list[str] | None, str]:
    """(the files of `files` that differ in the tree at `repo` from `commit` (edited, added or
    deleted since, committed or not, or not yet tracked), ""), or (None, why git cannot tell)."""
    if not commit or commit in ("unknown", "nan"):
        return None, "the rows name no commit"
    if commit.endswith("-dirty"):
        return None, f"measured at {commit.removesuffix('-dirty')} with uncommitted changes"
    try:
        _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    except (subprocess.SubprocessError, OSError):
        return None, f"commit {commit} is not in this checkout's history (or there is no git)"
    try:
        diff = _git(repo, "diff", "--name-only", commit, "--", *files)
        untracked = _git(repo, "ls-files", "--others", "--exclude-standard", "--", *files)
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"git diff failed: {exc}"
    return sorted(set(diff.split()) | set(untracked.split())), ""


def changed_between(a: str, b: str, files: list[str], repo: Path = REPO) -> list[str] | None:
    """The files of `files` that differ between commits `a` and `b`, or None where git cannot
    tell (a commit not in this checkout's history, or no git)."""
    try:
        return sorted(set(_git(repo, "diff", "--name-only", a, b, "--", *files).split()))
    except (subprocess.SubprocessError, OSError):
        return None


def _files_text(files: list[str]) -> str:
    short = [f.removeprefix("src/lmperf/") for f in files]
    more = len(short) - SHOWN
    return ", ".join(short[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def section_state(df: pd.DataFrame, repo: Path = REPO) -> dict:
    """Of one report section's rows: {'state': 'same' | 'changed' | 'unknown', 'text': the line
    the environment section shows, 'files': the changed files}. The rows are grouped by the
    section that measured them (their `section` column: a repeat's rows name the job's section)
    and the commit they were measured at."""
    changed, unknown = set(), []
    keys = ["section", "commit"] if "section" in df else ["commit"]
    for key, _ in df.groupby(keys, dropna=False):
        section, commit = key if len(keys) == 2 else (None, key[0] if isinstance(key, tuple) else key)
        files = code_files(str(section)) if section is not None else None
        if files is None:
            unknown.append(f"no benchmark module for section {section!r}")
            continue
        diff, why = changed_since(str(commit), files, repo)
        if diff is None:
            unknown.append(why)
        else:
            changed.update(diff)
    if changed:
        return {"state": "changed", "files": sorted(changed), "text": "changed since: " + _files_text(sorted(changed))}
    if unknown:
        return {"state": "unknown", "files": [], "text": "unknown: " + "; ".join(dict.fromkeys(unknown))}
    return {"state": "same", "files": [], "text": "as measured"}


def view(frames: dict[str, pd.DataFrame], repo: Path = REPO) -> dict:
    """{'sections': {report section: section_state}, 'changed': the sections whose code changed
    since their rows were measured, 'unknown': those git could not check}."""
    states = {name: section_state(df, repo) for name, df in frames.items()
              if not df.empty and "commit" in df}
    return {"sections": states,
            "changed": [s for s, st in states.items() if st["state"] == "changed"],
            "unknown": [s for s, st in states.items() if st["state"] == "unknown"]}
