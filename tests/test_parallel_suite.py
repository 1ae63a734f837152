"""`make test` runs this suite in pytest-xdist workers (-n auto --dist loadgroup); the tests that
share a fixture wider than one test carry an xdist_group (tests/conftest.py) so that the fixture,
built_repo above all (the smoke workflow, minutes), is built on one worker, not on each."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="pytest-xdist is not installed (envs/requirements.txt has it)")

SUITE = textwrap.dedent("""
    import os
    import pytest

    @pytest.fixture(scope="session")
    def shared(tmp_path_factory):
        return None

    @pytest.mark.parametrize("i", range(6))
    def test_shared(shared, i):
        with open(os.path.join(os.environ["OUT"], f"{i}.txt"), "w") as f:
            f.write(os.environ["PYTEST_XDIST_WORKER"])

    @pytest.mark.parametrize("i", range(6))
    def test_alone(i):
        pass
""")


def run_suite(tmp_path, files: dict[str, str], *args: str, env: dict | None = None):
    """pytest in a subprocess on a suite of `files` ({name: text}) beside a copy of our
    conftest.py, in two pytest-xdist workers grouped as `make test` groups (`args` replace those);
    OUT in its environment names a folder its tests may write into (tmp_path/out)."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in {**files, "conftest.py": (Path(__file__).parent / "conftest.py").read_text()}.items():
        (suite / name).write_text(text)
    (tmp_path / "out").mkdir()
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *(args or ("-n", "2", "--dist", "loadgroup")), str(suite)], cwd=suite,
                          capture_output=True, text=True, timeout=300,
                          env={**(os.environ if env is None else env), "OUT": str(tmp_path / "out")})


def test_tests_sharing_a_session_fixture_run_on_one_worker(tmp_path):
    """Our grouping through this pytest and pytest-xdist, end to end: six tests of a session
    fixture in two workers all run on one (pytest 9.2 with pytest-xdist 3.8 spread them: their
    ids lose the group, pytest-xdist#1386; envs/requirements.txt pins a pytest that keeps it)."""
    proc = run_suite(tmp_path, {"test_grouped.py": SUITE})
    out = tmp_path / "out"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers = {p.read_text() for p in out.glob("*.txt")}
    assert len(list(out.glob("*.txt"))) == 6 and len(workers) == 1, workers


ONCE = textwrap.dedent("""
    import os
    import time

    import pytest

    from conftest import once_a_run


    def build(root):
        with open(os.path.join(os.environ["OUT"], "builds"), "a") as f:
            f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
        time.sleep(3)  # the other worker asks meanwhile
        (root / "value").write_text("built")


    @pytest.fixture(scope="session")
    def thing(tmp_path_factory):
        return once_a_run(tmp_path_factory, "thing", build)


    @pytest.fixture(scope="session")
    def cluster():
        return None


    def test_grouped(thing):
        assert (thing / "value").read_text() == "built"
        with open(os.path.join(os.environ["OUT"], "grouped"), "w") as f:
            f.write(os.environ["PYTEST_XDIST_WORKER"])


    def test_elsewhere(cluster, request):  # in a group of its own, asks for it at its end
        assert (request.getfixturevalue("thing") / "value").read_text() == "built"
        with open(os.path.join(os.environ["OUT"], "elsewhere"), "w") as f:
            f.write(os.environ["PYTEST_XDIST_WORKER"])
""")


def test_a_session_fixture_built_once_a_run_is_shared_by_two_workers(tmp_path):
    """once_a_run (built_repo's): two tests in groups of their own, which go to the two workers
    at once, both get the folder, built by one of them once."""
    proc = run_suite(tmp_path, {"test_once.py": ONCE})
    out = tmp_path / "out"
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len((out / "builds").read_text().split()) == 1
    assert (out / "grouped").read_text() != (out / "elsewhere").read_text()  # one on each worker


SETS = textwrap.dedent("""
    import os
    import pytest

    @pytest.fixture(scope="module")
    def registered():
        os.environ["LMPERF_CONTENDERS"] = '{"mine": "mine.py"}'  # as rendering a contender's results does

    def test_sets(registered):
        assert os.environ["LMPERF_CONTENDERS"]
""")
LATER = textwrap.dedent("""
    import os

    def test_later():
        assert "LMPERF_CONTENDERS" not in os.environ
""")


def test_a_modules_fixture_leaves_no_contenders_to_a_later_module(tmp_path):
    """A module-scoped fixture that registers contenders (rendering the committed H100 results
    does) sets LMPERF_CONTENDERS before any test's own fixture starts; a later module on the same
    worker, whose child processes inherit the environment, starts without it."""
    env = {k: v for k, v in os.environ.items() if k not in ("LMPERF_CONTENDERS", "LMPERF_PROVIDER_MODULES")}
    proc = run_suite(tmp_path, {"test_a_sets.py": SETS, "test_b_later.py": LATER}, "-p", "no:xdist", env=env)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
