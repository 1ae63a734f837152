"""What a reader reads speaks of the product, and the README keeps its promises.

- No talk of how the work was done in the README, docs/, the templates (what they render: their
  text and the strings their expressions print) or the committed reports (read from git HEAD,
  not from a local render): no "lease", "session", references to tuning-notes steps, "was cut",
  "stretch", "bar" as a threshold, "to-do".
- The README is short (at most 150 lines), shows one figure, and its links (and the docs') lead
  to files that exist; its kernels snippet runs as printed, on a CPU in Triton's interpreter.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# word -> pattern, matched case-insensitively on a reader's text
PROCESS_TALK = {
    "lease": r"\bleas(?:e|es|ed|ing)\b",
    "session": r"\bsessions?\b",
    "step of the tuning notes": r"\bNOTES\b(?:(?!\n\s*\n)[\s\S]){0,200}?\bsteps? \d+"  # NOTES.md, step 27
                                r"|\(steps? \d+(?:\s*[-–]\s*\d+)?\)",                # (steps 32-34)
    "was cut": r"\b(?:was|were) cut\b(?! short)",
    "stretch": r"\bstretch(?:es|ed)?\b",
    "to-do": r"\bto-?do\b",
    "bar": r"(?<![\w-])bars?\b",
}
# "bar" in a figure's sense (a bar chart, error bars, stacked bars, a figure's bar label) is fine
FIGURE_BAR_BEFORE = re.compile(r"\b(?:stacked|error|horizontal|vertical|grouped)\b[^.|\n]{0,40}$", re.I)
FIGURE_BAR_AFTER = re.compile(r"^s?\s+(?:charts?|plots?|graphs?|labels?|heights?)\b", re.I)


def process_talk(text: str) -> list[tuple[int, str]]:
    """(line, word) for each piece of process talk in `text`."""
    hits = []
    for word, pattern in PROCESS_TALK.items():
        for m in re.finditer(pattern, text, re.I):
            if word == "bar" and (FIGURE_BAR_BEFORE.search(text[max(0, m.start() - 60):m.start()])
                                  or FIGURE_BAR_AFTER.match(text[m.start() + 3:])):
                continue
            hits.append((text.count("\n", 0, m.start()) + 1, word))
    return sorted(hits)


def reader_text(template: str) -> str:
    """A Jinja template as a reader meets it: its text, and the string literals its `{{ }}`
    expressions may print; comments and statements (`{% %}`) dropped. Line numbers kept."""
    lines = lambda s: "\n" * s.count("\n")
    template = re.sub(r"\{#.*?#\}|\{%.*?%\}", lambda m: lines(m.group(0)), template, flags=re.S)

    def strings(m):
        found = re.findall(r"\"([^\"\n]*)\"|'([^'\n]*)'", m.group(0))
        return " ".join(a or b for a, b in found) + lines(m.group(0))
    return re.sub(r"\{\{.*?\}\}", strings, template, flags=re.S)


def git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"needs a git checkout: {proc.stderr.strip()}")
    return proc.stdout


def texts(area: str) -> dict[str, str]:
    """{path: reader's text} of one area: README and docs/ (this checkout), the templates, the
    committed reports (git HEAD)."""
    if area == "README and docs":
        return {p.relative_to(REPO).as_posix(): p.read_text()
                for p in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]}
    if area == "templates":
        return {p.relative_to(REPO).as_posix(): reader_text(p.read_text())
                for p in sorted((REPO / "templates").rglob("*")) if p.is_file()}
    paths = [p for p in git("ls-tree", "-r", "--name-only", "HEAD", "report").splitlines() if p.endswith(".md")]
    return {p: git("show", f"HEAD:{p}") for p in paths}


def test_process_talk_is_found_and_ordinary_words_are_not():
    found = lambda text: [w for _, w in process_talk(text)]
    assert found("on a fresh H100 lease") == ["lease"] and found("a session with a time limit") == ["session"]
    assert found("in `tuning/flash_attention/NOTES.md`,\nstep 27, with its data") == ["step of the tuning notes"]
    assert found("some tile settings (steps 32-34).") == ["step of the tuning notes"]
    assert found("head dims 16 and 64 (d32 was cut)") == ["was cut"]
    assert found("The MFU stretch is not met") == ["stretch"]
    assert found("| bar | met |") == ["bar"] and found("setting a bar that no run could meet") == ["bar"]
    assert found("the headline's bars read this row") == ["bar"] and found("TODO: later") == ["to-do"]
    assert found("its counts, figures and bars cover only the rows that exist") == ["bar"]
    for fine in ("please release the lock", "a bar chart of the ratios", "stacked forward / backward bars",
                 "error bars show the 20%-80% range", "Fig. 7 (bar label)", "a cache entry cut short",
                 "the loss of 200 steps, the first step 3x slower", "what to do next", "a barrier", "embargo", "sidebar"):
        assert not process_talk(fine), fine


def test_templates_are_read_as_a_reader_sees_them():
    text = reader_text('{# a session note #}{% set x = "stretch" %}\nthe {{ "lease of" if a else b }} GPU\n')
    assert text == "\nthe lease of GPU\n"


@pytest.mark.parametrize("area", ["README and docs", "templates", "committed reports"])
def test_no_process_talk_in_what_a_reader_reads(area):
    hits = [f"{path}:{line}: {word}" for path, text in texts(area).items() for line, word in process_talk(text)]
    assert not hits, f"process talk in the {area} ({len(hits)}):\n" + "\n".join(hits)


# ---------------------------------------------------------------------------------------------
# The README

README = (REPO / "README.md").read_text()
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_short_and_shows_one_figure_that_exists():
    assert len(README.splitlines()) <= 150, len(README.splitlines())
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert len(figures) == 1, figures
    assert figures[0] in git("ls-files", figures[0]).splitlines(), f"{figures[0]} is not committed"


def test_readme_gives_the_two_commands_of_the_makefile():
    commands = re.search(r"```sh\n(.*?)```", README, re.S)[1]
    assert [line.split("#")[0].strip() for line in commands.splitlines()] == ["make report", "make test"]
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^report:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


@pytest.mark.parametrize("path", ["README.md", *sorted(p.relative_to(REPO).as_posix()
                                                      for p in (REPO / "docs").rglob("*.md"))])
def test_links_lead_to_files_that_exist(path):
    text = (REPO / path).read_text()
    links = [m for m in LINK.findall(text) if not re.match(r"[a-z]+:|#", m)]
    missing = [link for link in links if not ((REPO / path).parent / link.split("#")[0]).exists()]
    assert not missing, f"{path} links to files that do not exist: {missing}"


# A repository path in backticks: `src/lmperf/stats.py`, `kernels/lrpe.py` (under src/lmperf/), `tools/`.
# results/ and report/ paths name a run's outputs, which a checkout may not hold.
REPO_PATH = re.compile(r"`((?:src|config|rules|tools|envs|profiles|tests|templates|tuning|examples|kernels)/[^`\s<{*]*)`")


@pytest.mark.parametrize("path", ["README.md", *sorted(p.relative_to(REPO).as_posix()
                                                      for p in (REPO / "docs").rglob("*.md"))])
def test_named_repository_paths_exist(path):
    named = [m.rstrip(".,:;") for m in REPO_PATH.findall((REPO / path).read_text())]
    missing = [m for m in named if not (REPO / m).exists() and not (REPO / "src" / "lmperf" / m).exists()]
    assert not missing, f"{path} names paths that do not exist: {missing}"


def readme_snippet() -> str:
    section = README.split("## Our kernels in your model", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


def test_the_kernels_snippet_runs_as_printed(tmp_path):
    """The README's snippet, run as a script on this machine (on a CPU in Triton's interpreter),
    trains one step: a finite loss, and weights that moved."""
    script = tmp_path / "snippet.py"
    script.write_text(readme_snippet() + "\nimport math\n"
                      "assert math.isfinite(step_loss.item()), step_loss\n"
                      "assert any(p.grad is None for p in model.parameters())  # zero_grad ran\n"
                      "print('snippet ok', step_loss.item())\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    if not __import__("torch").cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "snippet ok" in proc.stdout, proc.stderr[-3000:]


def test_the_snippet_names_what_exists():
    """Every lmperf name the snippet imports is public and where it says."""
    import importlib.util
    for module, names in re.findall(r"^from (lmperf[\w.]*) import ([\w, ]+)$", readme_snippet(), re.M):
        for name in (n.strip() for n in names.split(",")):
            found = hasattr(importlib.import_module(module), name) or importlib.util.find_spec(f"{module}.{name}")
            assert not name.startswith("_") and found, (module, name)
