"""lmperf.sources: the static import walk that makes the benchmark rules' code inputs, and the
digest the harness records in its journal."""
import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lmperf import sources

REPO = Path(__file__).resolve().parents[1]

# A package shaped like lmperf: top-level, lazy, relative and `from package import module` imports.
FAKE = {
    "__init__.py": "",
    "cli.py": """
        import json
        from lmperf import helpers
        from lmperf.sub import (
            leaf_function,
        )
        def main():
            from .sub import lazy
            if True:
                import lmperf.sub.deep, \\
                    os
        """,
    "helpers.py": "from . import shared\n",
    "shared.py": "import torch\n",
    "sub/__init__.py": "from lmperf.sub.leaf import leaf_function\n",
    "sub/leaf.py": "from ..shared import *\n",
    "sub/lazy.py": "",
    "sub/deep.py": "from lmperf import elsewhere  # not a module: a name\n",
    "unused.py": "",
}


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    for name, text in FAKE.items():
        path = tmp_path / "lmperf" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.setattr(sources, "SRC", tmp_path)
    for cached in (sources.modules, sources.imported_names, sources.module_file):
        cached.cache_clear()
    yield tmp_path / "lmperf"
    for cached in (sources.modules, sources.imported_names, sources.module_file):
        cached.cache_clear()


def test_the_walk_follows_every_kind_of_import(fake_package):
    assert sources.modules("lmperf.cli") == (
        "lmperf", "lmperf.cli", "lmperf.helpers", "lmperf.shared", "lmperf.sub", "lmperf.sub.deep",
        "lmperf.sub.lazy", "lmperf.sub.leaf")
    assert fake_package / "sub" / "__init__.py" in sources.files("lmperf.cli")


def test_the_digest_changes_with_any_file_of_the_walk_and_no_other(fake_package):
    before = sources.digest("lmperf.cli")
    (fake_package / "unused.py").write_text("x = 1\n")
    assert sources.digest("lmperf.cli") == before
    (fake_package / "sub" / "lazy.py").write_text("x = 1\n")
    assert sources.digest("lmperf.cli") != before


def test_an_unknown_module_is_named(fake_package):
    with pytest.raises(ValueError, match="'lmperf.nope' is not a module of the lmperf package"):
        sources.modules("lmperf.nope")


def test_the_issues_lazy_imports_are_found():
    """Both once missing from the hand-kept input lists: the ladder imports bench/profile.py, the
    FlashAttention kernels kernels/attention_contract.py."""
    assert {"lmperf.bench.profile", "lmperf.kernels.attention_contract"} <= set(sources.modules("lmperf.bench.ladder"))
    assert "lmperf.kernels.lrpe" not in sources.modules("lmperf.bench.ladder")


@pytest.mark.parametrize("path", sorted((REPO / "src" / "lmperf").rglob("*.py")), ids=lambda p: p.name)
def test_the_line_scan_finds_every_import_a_full_parse_finds(path):
    text = path.read_text()
    full = {ast.dump(node) for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.Import, ast.ImportFrom))}
    assert full <= {ast.dump(node) for node in sources.import_statements(text)}


def test_planning_imports_neither_torch_nor_triton():
    code = ("import sys; from lmperf import workflow; workflow.code_inputs('lmperf.bench.e2e'); "
            "print(sorted(m for m in ('torch', 'triton', 'numpy') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(REPO / "src")}, timeout=120)
    assert proc.stdout.strip() == "[]"
