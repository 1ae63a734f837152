"""Which source files a command runs: a static walk over the `lmperf` modules that a module
imports, transitively, and one digest of those files.

The workflow makes each benchmark rule's code inputs from the walk (lmperf.workflow.code_inputs),
so an edit to any module a benchmark can run reruns it; the benchmark harness records the digest
of the same files in its journal, so a resume never mixes rows of two versions of the code.

    modules("lmperf.bench.e2e")   # ('lmperf', 'lmperf.bench', 'lmperf.bench.cli', ...)
    files("lmperf.bench.e2e")     # their source files
    digest("lmperf.bench.e2e")    # sha256 of their paths and contents

Every import statement counts wherever it is written (inside functions too: the benchmarks
import torch-side modules lazily), as does every package on the way (importing lmperf.bench.e2e
runs lmperf/__init__.py and lmperf/bench/__init__.py), and a package's __main__.py, which
`python -m <package>` runs. Nothing is imported: the lines that start
an import statement are found by a pattern and parsed with `ast` one statement at a time (parsing
whole files costs planning half a second), so an import line in a docstring counts too, which
can only add an input; an import that shares its line with other code (`if x: import y`) is missed.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import re
import sys
from pathlib import Path

PACKAGE = "lmperf"
SRC = Path(__file__).resolve().parents[1]  # the folder that holds the package
IMPORT_LINE = re.compile(r"^[ \t]*(?:import|from[ \t]+[\w.]+[ \t]+import)\b", re.M)


@functools.cache
def module_file(name: str) -> Path | None:
    """The source file of lmperf module `name` (a package's __init__.py); None for a name that
    is not an lmperf module (a function, or another package's module)."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    base = SRC.joinpath(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def import_statements(text: str) -> list[ast.stmt]:
    """The import statements of a module's source, each parsed from the line that starts it (and
    the lines it continues on: parentheses, backslashes)."""
    statements = []
    for match in IMPORT_LINE.finditer(text):
        lines = text[match.start():match.start() + 4000].splitlines()[:40]
        for n in range(1, len(lines) + 1):
            try:
                statements += ast.parse("\n".join(lines[:n]).lstrip()).body
                break
            except SyntaxError:
                continue
    return statements


@functools.cache
def imported_names(name: str) -> frozenset[str]:
    """Every dotted name that module `name` imports anywhere in its code: `import a.b` gives a.b;
    `from a import b` gives a and a.b (a module, when b is one); relative imports resolved."""
    path = module_file(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in import_statements(path.read_text()):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..y import z
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(names)


def outside_file(name: str) -> Path | None:
    """The source file of a module outside the package (a report section's, config `sections`;
    `__main__`: the one `python -m` runs), found without running it; None where there is none."""
    import importlib.util
    if name == "__main__":
        file = getattr(sys.modules.get("__main__"), "__file__", None)
        return Path(file) if file and file.endswith(".py") else None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def outside_imports(path: Path) -> list[str]:
    """The lmperf modules a file outside the package imports."""
    names = set()
    for node in import_statements(path.read_text()):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return sorted(n for n in names if module_file(n) is not None)


@functools.cache
def modules(root: str) -> tuple[str, ...]:
    """`root` and every lmperf module it imports, transitively, with their packages; sorted. A
    root outside the package (a section's benchmark, config `sections`) comes first, then the
    lmperf modules its imports reach."""
    if module_file(root) is None:
        if (outside := outside_file(root)) is None:
            raise ValueError(f"{root!r} is not a module of the {PACKAGE} package under {SRC}, nor one on the path")
        return (root, *sorted({m for name in outside_imports(outside) for m in modules(name)}))
    seen: set[str] = set()
    todo = [root]
    if module_file(root).name == "__init__.py" and module_file(f"{root}.__main__"):
        todo.append(f"{root}.__main__")  # what `python -m <package>` runs
    while todo:
        name = todo.pop()
        if name in seen or module_file(name) is None:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # its packages
        todo.extend(imported_names(name))
    return tuple(sorted(seen))


def files(root: str) -> list[Path]:
    """The source files of modules(root), in the same order."""
    return [module_file(m) or outside_file(m) for m in modules(root)]


def digest(root: str) -> str:
    """sha256 (hex) of the files of modules(root): each one's path in the package and contents."""
    h = hashlib.sha256()
    for path in files(root):
        name = path.relative_to(SRC) if path.is_relative_to(SRC) else path.name
        h.update(str(name).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()
