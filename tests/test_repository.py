"""Rules about the repository as a whole, which no module's own tests see:

- no file imports or uses a private name (`_x`) of another lmperf module: a name another module
  needs is public;
- what is kept outside the pipeline (`tools/`, `tuning/`) cannot rot: every Python file there is
  run with `--help` (which imports it), every lmperf name it uses exists, every shell script
  parses, and the memory-fixture recorder runs on this machine;
- every `python -m lmperf...` command answers `--help`;
- `scripts/` holds only what rules call, the repository holds no patch files, and every
  repository path that code, config, rules, templates, tools and the README name exists.
"""
from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
CHECKED = ("src", "tests", "tools", "tuning")
KEPT = sorted((ROOT / "tools").glob("*.py")) + sorted((ROOT / "tuning").rglob("*.py"))
SHELL_TOOLS = sorted((ROOT / "tools").glob("*.sh"))
# the modules `python -m` runs: a main guard, or a package's __main__.py (lmperf.report's calls
# render.main)
COMMANDS = sorted({".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__main__")
                   for p in SRC.rglob("*.py")
                   if p.name == "__main__.py" or 'if __name__ == "__main__":' in p.read_text()})



def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_lmperf_module(dotted: str) -> bool:
    if dotted != "lmperf" and not dotted.startswith("lmperf."):
        return False
    path = SRC.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def module_name(path: Path) -> str | None:
    """The dotted name of a file under src/ (None elsewhere)."""
    if SRC not in path.parents:
        return None
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def lmperf_references(source: str, module: str | None = None):
    """(line, module, name) for every name of an lmperf module that `source` imports from it or
    reads as an attribute of it (`m.name`, `getattr(m, "name")`, `monkeypatch.setattr(m, "name",
    ...)`), `module` being the source's own dotted name (for relative imports). Submodules are
    followed (`lmperf.kernels.lrpe.x`) and not reported themselves."""
    tree = ast.parse(source)
    package = module.rsplit(".", 1)[0] if module else ""
    if module and module.count(".") and SRC.joinpath(*module.split("."), "__init__.py").is_file():
        package = module
    bound, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_lmperf_module(alias.name):
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = "lmperf"
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not is_lmperf_module(base):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if is_lmperf_module(full):
                    bound[alias.asname or alias.name] = full
                elif alias.name != "*":
                    found.append((node.lineno, base, alias.name))

    def resolve(node) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = resolve(node.value)
            if owner and is_lmperf_module(f"{owner}.{node.attr}"):
                return f"{owner}.{node.attr}"
        return None

    for node in ast.walk(tree):  # aliases: `fa = flash_attention_triton`
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if resolve(node.value):
                bound[node.targets[0].id] = resolve(node.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = resolve(node.value)
            if owner and not is_lmperf_module(f"{owner}.{node.attr}"):
                found.append((node.lineno, owner, node.attr))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            target, attr = node.args[0], node.args[1]
            if (name in ("getattr", "setattr", "hasattr", "delattr") and isinstance(attr, ast.Constant)
                    and isinstance(attr.value, str) and resolve(target)):
                found.append((node.lineno, resolve(target), attr.value))
    return found


def private_uses(source: str, module: str | None = None) -> list[tuple[int, str, str]]:
    """(line, module, name) for each private name of another lmperf module that `source` uses."""
    return [(line, owner, name) for line, owner, name in lmperf_references(source, module)
            if is_private(name) and owner != module]


def checked_files() -> list[Path]:
    return [p for top in (*CHECKED, "scripts") for p in sorted((ROOT / top).rglob("*.py"))]


@pytest.mark.parametrize("source, module, want", [
    ("from lmperf.kernels.lrpe import _x, lrpe_torch", None, [(1, "lmperf.kernels.lrpe", "_x")]),
    ("from lmperf.kernels import lrpe\nlrpe._x(lrpe.sincos)", None, [(2, "lmperf.kernels.lrpe", "_x")]),
    ("import lmperf.kernels.lrpe as k\nk._x", None, [(2, "lmperf.kernels.lrpe", "_x")]),
    ("import lmperf.kernels.lrpe\nlmperf.kernels.lrpe._x", None, [(2, "lmperf.kernels.lrpe", "_x")]),
    ("from lmperf.kernels import lrpe\ndef f(monkeypatch):\n    monkeypatch.setattr(lrpe, '_x', 1)",
     None, [(3, "lmperf.kernels.lrpe", "_x")]),
    ("from lmperf.kernels import lrpe\ngetattr(lrpe, '_x')", None, [(2, "lmperf.kernels.lrpe", "_x")]),
    ("from lmperf.kernels import lrpe\ndef f():\n    k = lrpe\n    k._x", None, [(4, "lmperf.kernels.lrpe", "_x")]),
    ("from .loop import _x", "lmperf.bench.e2e", [(1, "lmperf.bench.loop", "_x")]),
    ("from .. import hardware\nhardware._x", "lmperf.bench.e2e", [(2, "lmperf.hardware", "_x")]),
    ("from . import loop\nloop._x", "lmperf.bench", [(2, "lmperf.bench.loop", "_x")]),
    # allowed: a module's own names, public and dunder names, other libraries' private names,
    # private attributes of objects
    ("import lmperf.bench.loop as me\nme._x", "lmperf.bench.loop", []),
    ("from lmperf.kernels import lrpe\nlrpe.sincos, lrpe.__name__\nimport torch\ntorch._dynamo.reset()\n"
     "def f(self):\n    self._x = 1", None, []),
])
def test_private_name_finder(source, module, want):
    assert private_uses(source, module) == want


def test_no_file_uses_a_private_name_of_another_lmperf_module():
    uses = {(str(path.relative_to(ROOT)), owner, name, line)
            for path in checked_files()
            for line, owner, name in private_uses(path.read_text(), module_name(path))}
    assert not uses, "private names of other modules (make them public, or stop needing them):\n" + "\n".join(
        f"{file}:{line}: {owner}.{name}" for file, owner, name, line in sorted(uses))


@pytest.mark.parametrize("path", KEPT, ids=lambda p: str(p.relative_to(ROOT)))
def test_kept_python_files_import_and_answer_help(path):
    proc = subprocess.run([sys.executable, str(path), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_help(command, capsys):
    """In this process (one torch import for all): a help text argparse cannot format (a bare
    `%` in it) fails only when a user asks for help."""
    module = importlib.import_module(command if command != "lmperf.report" else "lmperf.report.render")
    if command == "lmperf.bench.distributed":
        module = importlib.import_module("lmperf.bench.distributed.__main__")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("path", KEPT, ids=lambda p: str(p.relative_to(ROOT)))
def test_kept_python_files_use_only_lmperf_names_that_exist(path):
    missing = [f"{line}: {owner}.{name}" for line, owner, name in lmperf_references(path.read_text())
               if not hasattr(importlib.import_module(owner), name)]
    assert not missing, f"{path.relative_to(ROOT)} uses lmperf names that no longer exist: {missing}"


@pytest.mark.parametrize("path", SHELL_TOOLS, ids=lambda p: p.name)
def test_shell_tools_parse(path):
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_memory_fixture_recorder_runs_here(tmp_path):
    import gzip
    import json
    out = tmp_path / "snapshot.json.gz"
    proc = subprocess.run([sys.executable, "tools/record_memory_fixture.py", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    traces = json.load(gzip.open(out, "rt"))["device_traces"]
    assert len(traces) == 1 and len(traces[0]) > 0


def test_scripts_holds_only_what_rules_call():
    rules = "\n".join(p.read_text() for p in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))])
    stray = [p.name for p in sorted((ROOT / "scripts").glob("*"))
             if p.name not in rules]
    assert not stray, f"scripts/ holds files no rule calls (tools for people go to tools/): {stray}"


def repository_files() -> list[str]:
    proc = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"needs a git checkout: {proc.stderr.strip()}")
    return [f for f in proc.stdout.splitlines() if (ROOT / f).exists()]


def test_no_patch_files():
    patches = [f for f in repository_files() if f.endswith((".patch", ".diff"))]
    assert not patches, f"patch files (keep unmerged work on a branch): {patches}"


# A repository path in prose or code: `tools/...`, `tuning/...`, `notes/...` or `scripts/...`.
NAMED_PATH = re.compile(r"(?<![\w./-])((?:tools|tuning|notes|scripts)/[\w.*{},/<-]*)")
GIT_OBJECT = re.compile(r"[0-9a-f]{7,40}:$")  # `git show <commit>:<path>` names a file git keeps


def named_paths(text: str) -> list[str]:
    """The repository paths `text` names, braces expanded ({1,2,3}), placeholders (<hw>,
    {name}) cut off; those written as `<commit>:<path>` left out."""
    paths = []
    for match in NAMED_PATH.finditer(text):
        if GIT_OBJECT.search(text[max(0, match.start() - 41):match.start()]):
            continue
        path = re.split(r"<|\{(?![^}]*,)", match.group(1))[0].rstrip(".,:;-")
        braces = re.search(r"\{([^}]*)\}", path)
        paths += ([path[:braces.start()] + choice + path[braces.end():] for choice in braces.group(1).split(",")]
                  if braces else [path])
    return paths


def test_named_paths_are_found():
    assert named_paths("see tools/README.md, `tuning/lrpe/data/lrpe_graph_h100_bench_{1,2}d.csv` and "
                       "tuning/<kernel>/; `git show b31f779:scripts/lrpe_ptx.py`; f\"tools/{name}\"") == [
        "tools/README.md", "tuning/lrpe/data/lrpe_graph_h100_bench_1d.csv",
        "tuning/lrpe/data/lrpe_graph_h100_bench_2d.csv", "tuning/", "tools/"]


def test_every_named_repository_path_exists():
    """README, Makefile, config, rules, templates, code and tools name only paths that exist. The
    tuning logs are not read: they also cite what was there when they were written."""
    files = [f for f in repository_files() if f != "tests/test_repository.py"  # it names the patterns
             and (f in ("README.md", "Makefile", "Snakefile") or f.endswith(".py") and f.startswith(CHECKED)
             or f.startswith(("config/", "rules/", "templates/", "tools/")))]
    missing = sorted({f"{f}: {path}" for f in files for path in named_paths((ROOT / f).read_text(errors="replace"))
                      if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists())})
    assert not missing, "named paths that do not exist:\n" + "\n".join(missing)
