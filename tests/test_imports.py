"""The package's imports form no circle and point one way: every `import` and `from ... import` of
an lmperf module, at module level or inside a function, parsed with `ast`, is an edge, and so is
every module a module loads by `importlib` (the renderer loads each report section's module, the
workflow each job's benchmark module, both named by the sections' declarations); a cycle among
them fails, and so does an import from a layer into one above it (basics <- kernels <- model <-
implementations <- bench <- report). Also the rule of one job a module: every module's docstring
opens with what it is for."""
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


def lazy_modules() -> set[str]:
    """The modules lmperf/__init__.py loads on first use of a name: the string values of its
    module-level dict (read with ast)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    return {v.value for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
            for v in node.value.values if isinstance(v, ast.Constant) and str(v.value).startswith("lmperf.")}


def loaded_by_importlib() -> dict[str, set[str]]:
    """{module: the lmperf modules it loads by importlib.import_module}, from what names them: the
    sections' declarations (lmperf.catalog), lmperf/__init__.py's lazy names. A module outside
    the package (a user's contender, provider or section) is no edge."""
    from lmperf import catalog
    from lmperf.report.sections import report_sections
    benches = {s.case_module(study) for s in catalog.SECTIONS if s.jobs
               for study in (catalog.DISTRIBUTED_STUDIES if s.cases_module else ("",))}
    return {"lmperf.report.render": {s.report_module for s in report_sections(catalog.SECTIONS)},
            "lmperf.workflow": benches,
            "lmperf": lazy_modules(),
            # a user's modules only: config `sections`, contenders, provider modules, Liger-Kernel,
            # the course's cs336_basics
            "lmperf.catalog": set(), "lmperf.contenders": set(),
            # the registry: the kernels its LRPE-cosine and fused-kernel builds run, by name
            "lmperf.providers": {"lmperf.kernels.lrpe", "lmperf.kernels.fused"},
            "lmperf.kernels.fused": set(), "lmperf.bench.contender_distributed": set(),
            # a worker process loads the module of the measure function its parent hands it: the
            # parent's own module, which imports it (no edge of its own)
            "lmperf.bench.workers": set(), "lmperf.bench.isolation": set()}


def importlib_callers() -> set[str]:
    """The modules whose code calls importlib.import_module."""
    def calls(path: Path) -> bool:
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "import_module"
                   for n in ast.walk(ast.parse(path.read_text())))
    return {name for name, path in MODULES.items() if calls(path)}


def graph() -> dict[str, set[str]]:
    edges = {name: imported(name, path) for name, path in MODULES.items()}
    for name, loaded in loaded_by_importlib().items():
        edges[name] |= loaded
    return edges


# The layers, bottom first, each a list of module prefixes (a module is in the layer of its longest
# matching prefix). A module imports or loads modules of its own layer and those below, never one
# above: the report reads what the benchmarks wrote, the benchmarks run the model, the model runs the
# kernels, and all of them use the basics.
LAYERS = {
    # what every layer shares: failures as rows, provenance, the CSV schema, dtypes, statistics,
    # someone else's outputs held to their contract, the machine, the source walk, profiler ranges
    "basics": ("lmperf.failures", "lmperf.provenance", "lmperf.csv_schema", "lmperf.dtypes", "lmperf.stats",
               "lmperf.guard", "lmperf.hardware", "lmperf.sources", "lmperf.ranges"),
    # the kernels, and the package's root, which loads some of them on first use of their names
    "kernels": ("lmperf.kernels", "lmperf"),
    # the model and its training step, FLOP counts, and the two modules that rewrite a built model
    # with kernels (the fused sublayers, the float8 linear layers): they patch lmperf.model's classes
    "model": ("lmperf.model", "lmperf.train", "lmperf.flops", "lmperf.attention_memory", "lmperf.kernels.fused",
              "lmperf.kernels.float8_delayed"),
    # the implementations a benchmark runs: ours and the peers (providers), a user's (contenders)
    "implementations": ("lmperf.providers", "lmperf.contenders"),
    # the benchmarks, the sections' declarations and the workflow that plans them
    "bench": ("lmperf.bench", "lmperf.declare", "lmperf.catalog", "lmperf.specs", "lmperf.planning",
              "lmperf.cluster", "lmperf.repeats", "lmperf.workflow"),
    # the report, the pages made from results (lmperf.compare's comparison), `make report`'s front
    "report": ("lmperf.report", "lmperf.compare", "lmperf.compare_page", "lmperf.runner"),
}
ORDER = list(LAYERS)


def layer(module: str) -> str | None:
    """The layer of `module`: that of the longest prefix in LAYERS that names it or a package
    above it; None where none does."""
    found = [(len(p), name) for name, prefixes in LAYERS.items() for p in prefixes
             if module == p or (p != "lmperf" and module.startswith(p + "."))]
    return max(found)[1] if found else None


def imports_up(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, the module of a higher layer that it imports or loads), every such edge."""
    return sorted((a, b) for a, deps in edges.items() for b in deps
                  if ORDER.index(layer(b)) > ORDER.index(layer(a)))


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


def test_the_graph_has_every_module_loaded_by_importlib():
    """Every module that calls importlib.import_module says what it loads (loaded_by_importlib),
    every lmperf module it names exists, and the walk's graph holds those edges: a circle
    through importlib (render -> a section's module -> render) is one the test finds."""
    loaded = loaded_by_importlib()
    assert importlib_callers() <= set(loaded), f"importlib callers not accounted for: {importlib_callers() - set(loaded)}"
    assert all(m in MODULES for targets in loaded.values() for m in targets)
    edges = graph()
    assert "lmperf.report.e2e" in edges["lmperf.report.render"] and "lmperf.bench.lrpe" in edges["lmperf.workflow"]
    assert "lmperf.bench.distributed.ddp" in edges["lmperf.workflow"]
    # a section's module importing render back would be a circle the test sees
    edges["lmperf.report.distributed"] = edges["lmperf.report.distributed"] | {"lmperf.report.render"}
    assert find_cycle(edges) is not None


def test_every_module_has_a_layer():
    assert not [m for m in MODULES if layer(m) is None], "modules in no layer (tests/test_imports.py LAYERS)"
    assert layer("lmperf.kernels.rope") == "kernels" and layer("lmperf.kernels.fused") == "model"
    assert layer("lmperf.bench.distributed.ddp") == "bench" and layer("lmperf") == "kernels"
    assert layer("lmperf.providers") == "implementations"


def test_no_import_from_a_layer_into_one_above():
    up = imports_up(graph())
    assert not up, "imports into a higher layer: " + ", ".join(
        f"{a} ({layer(a)}) -> {b} ({layer(b)})" for a, b in up)


def test_the_layer_check_finds_an_import_up():
    """The check itself, on edges the package does not have: the workflow importing the report,
    a kernel importing the model, the model importing a benchmark, a basic module importing a
    kernel, a provider importing a benchmark, and one loaded by importlib (the workflow loading a
    report module)."""
    edges = {"lmperf.workflow": {"lmperf.report.validate", "lmperf.catalog"},
             "lmperf.kernels.rope": {"lmperf.model", "lmperf.kernels.triton_op"},
             "lmperf.model": {"lmperf.bench.loop", "lmperf.kernels.attention_contract"},
             "lmperf.failures": {"lmperf.kernels.lrpe"}, "lmperf.report.render": {"lmperf.workflow"},
             "lmperf.providers": {"lmperf.bench.honest", "lmperf.failures"}}
    assert imports_up(edges) == [("lmperf.failures", "lmperf.kernels.lrpe"), ("lmperf.kernels.rope", "lmperf.model"),
                                 ("lmperf.model", "lmperf.bench.loop"), ("lmperf.providers", "lmperf.bench.honest"),
                                 ("lmperf.workflow", "lmperf.report.validate")]
    loaded = graph()
    loaded["lmperf.workflow"] = loaded["lmperf.workflow"] | {"lmperf.report.e2e"}
    assert ("lmperf.workflow", "lmperf.report.e2e") in imports_up(loaded)


def test_every_module_says_what_it_is_for():
    """Modules are split by job, not by size: each one's docstring opens with a sentence that
    says which job it does."""
    for name, path in MODULES.items():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = doc.strip().split("\n\n")[0]
        assert len(first.split()) >= 4, f"{name}: its docstring does not open with what it is for"
