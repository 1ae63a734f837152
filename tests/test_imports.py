"""The package's imports form no circle: every `import` and `from ... import` of an lmperf module,
at module level or inside a function, parsed with `ast`, is an edge; a cycle among them fails.
Also the rule of one job a module: every module's docstring opens with what it is for."""
import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "lmperf"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(name: str, path: Path) -> set[str]:
    """The lmperf modules that `name` (at `path`) imports anywhere in its body: `import a.b`
    names a.b; `from a import b` names a.b where that is a module, else a (b is a name in a)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


def graph() -> dict[str, set[str]]:
    return {name: imported(name, path) for name, path in MODULES.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_walk_sees_imports_at_module_level_and_inside_functions():
    edges = graph()
    assert "lmperf.train" in edges["lmperf.bench.e2e"]  # `from lmperf import hardware, train`
    assert "lmperf.kernels.adamw_master" in edges["lmperf.train"]  # inside make_optimizer
    assert "lmperf.bench.distributed.ranks" in edges["lmperf.bench.distributed.ddp"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"b"}}) is None


def test_no_import_circle_in_the_package():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_every_module_says_what_it_is_for():
    """Modules are split by job, not by size: each one's docstring opens with a sentence that
    says which job it does."""
    for name, path in MODULES.items():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = doc.strip().split("\n\n")[0]
        assert len(first.split()) >= 4, f"{name}: its docstring does not open with what it is for"
