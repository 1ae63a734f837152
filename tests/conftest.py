import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter; this must be set before triton loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A test run started in the background (`nohup make test &`) ignores SIGINT, and every process it
# starts inherits the ignore: the tests of what Ctrl-C does (a job stopped, journalled, named)
# would see no interrupt. A handler here is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
# What a copy of the repository leaves out: environments, caches, and the workflow's outputs.
TOP_LEVEL_IGNORE = {".git", ".venv", ".whl", ".snakemake", "logs", "results", "report", ".pytest_cache",
                    ".cache"}
ANYWHERE_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info")


def _ignore(folder: str, names: list[str]) -> set[str]:
    # .venv* too: make test's second venv (.venv-triton-newest, ~2 GB) is no part of a copy
    top = TOP_LEVEL_IGNORE | {n for n in names if n.startswith(".venv")} if Path(folder) == REPO else set()
    return top | set(ANYWHERE_IGNORE(folder, names))


def git_head(root: Path, *args: str) -> str:
    """`git <args>` in `root`, which must be a git checkout of its own; outside one (a tarball,
    a copy without .git, git missing or refusing the folder) the calling test is skipped, saying
    why, never passed on the working tree's files."""
    why = None
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
        if top.returncode != 0:
            why = top.stderr.strip() or "git rev-parse failed"
        elif Path(top.stdout.strip()).resolve() != root.resolve():
            why = f"its git checkout is {top.stdout.strip()}, a folder above it"
    except FileNotFoundError:
        why = "git is not installed"
    if why:
        pytest.skip(f"reads the committed files from git (`make report` rewrites report/report.md and "
                    f"report/figures/ for this machine), and {root} is not a git checkout: {why}")
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"git {' '.join(args)} in {root}: {proc.stderr.strip()}", pytrace=False)
    return proc.stdout


@pytest.fixture(autouse=True)
def _fresh_flash_attention_plans():
    """FlashAttention's plans (LMPERF_FA_LAUNCH=plan) and memoised configs replay what the dispatch's
    rules chose when they were made: forgotten after every test, so that none made under a rule a
    test patched (monkeypatch) outlives it, and no test finds another's."""
    yield
    ft = sys.modules.get("lmperf.kernels.flash_attention_triton")
    if ft is not None:
        ft.clear_plans()


@pytest.fixture
def a_gpu_never_asked(monkeypatch):
    """This process as on a machine with a visible CUDA GPU (outside Triton's interpreter), where asking
    torch for a CUDA device fails the test: for checks that a call on CPU tensors asks for none."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("current_device", "get_device_properties", "get_device_capability"):
        monkeypatch.setattr(torch.cuda, name, lambda *a: pytest.fail("asked torch for a CUDA device"))


def committed(path: str, root: Path = REPO) -> str:
    """The text of `path` (from the repository root) as committed at HEAD, whatever the working
    tree holds: `make report` rewrites report/report.md and its figures for the machine it runs
    on, and the tests of the committed report must pass after it as before."""
    if not git_head(root, "ls-tree", "--name-only", "HEAD", "--", path).strip():
        pytest.fail(f"{path} is not committed at HEAD", pytrace=False)
    return git_head(root, "show", f"HEAD:{path}")


def committed_files(folder: str, root: Path = REPO) -> list[str]:
    """The paths (from the repository root) of the files committed at HEAD under `folder`."""
    return git_head(root, "ls-tree", "-r", "--name-only", "HEAD", "--", folder).splitlines()


# The tests run the workflow at smoke scale whatever the machine (a GPU would otherwise pick full).
# The deep target too (config `depth`): the tests run every job of the smoke workflow in one go
# (tests/test_scales.py plans the standard depth).
SMOKE = ("--config", "scale=smoke", "depth=deep")


def config_yaml(repo: Path = REPO) -> dict:
    """A repository's config/config.yaml set on its sections' defaults (lmperf.catalog.read_config)."""
    from lmperf import catalog
    return catalog.read_config(repo / "config" / "config.yaml")


def copy_repo(dest: Path) -> Path:
    shutil.copytree(REPO, dest, ignore=_ignore)
    (dest / "report").mkdir()
    return dest


def workflow_env(repo: Path, env: dict | None = None) -> dict:
    """The environment the workflow runs in: this interpreter first on PATH (rules run `python`,
    the GPU scripts `python3`, as `make` arranges with .venv/bin) and the repo's own src/."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "PYTHONPATH": str(repo / "src"), **(env or {})}


def snakemake(repo: Path, *args: str, env: dict | None = None, check: bool = True,
              timeout: int = 900) -> subprocess.CompletedProcess:
    """Run Snakemake in `repo` with this interpreter, the repo's own src/ first on the path."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=repo, env=workflow_env(repo, env),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


GOLDEN_VARIABLE = "LMPERF_REWRITE_GOLDEN"


def golden(path: Path, text: str) -> None:
    """Compare `text` whole with the golden file `path`; with LMPERF_REWRITE_GOLDEN=1 write it
    instead and skip, saying so (review the rewrite with `git diff`, docs/testing.md)."""
    if os.environ.get(GOLDEN_VARIABLE) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.skip(f"{GOLDEN_VARIABLE}=1: rewrote {path.relative_to(REPO)}; review it with git diff")
    assert path.is_file(), f"no golden file {path.relative_to(REPO)}: write it with {GOLDEN_VARIABLE}=1"
    expected = path.read_text()
    if text != expected:
        import difflib
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), "golden", "rendered",
                                            n=1))
        pytest.fail(f"{path.relative_to(REPO)} differs from the render (rewrite it with {GOLDEN_VARIABLE}=1 "
                    f"after review):\n{diff[:6000]}", pytrace=False)


class Rendered:
    """A report rendered once: its text, where it was written, and the context its template
    received ({section: view, "summary": ..., ...}), the structured values tests assert on."""

    def __init__(self, text: str, out: Path, context: dict):
        self.text, self.out, self.context = text, out, context

    def __getitem__(self, name: str):
        return self.context[name]


def render_capturing(argv: list[str], out: Path) -> Rendered:
    """`python -m lmperf.report.render` with `argv` (its --out `out`), keeping the context that
    the report's template received."""
    import jinja2

    from lmperf.report import render
    captured: dict = {}
    original = jinja2.Template.render

    def spy(self, *args, **kwargs):
        if self.name == "report.md.j2":
            captured.update(*args, **kwargs)
        return original(self, *args, **kwargs)

    jinja2.Template.render = spy
    try:
        render.main([*argv, "--out", str(out), "--figures", str(out.parent / "figures")])
    finally:
        jinja2.Template.render = original
    assert captured, "the report's template was not rendered"
    return Rendered(out.read_text(), out, captured)


H100 = REPO / "results" / "h100-80gb-hbm3"


@pytest.fixture(scope="session")
def h100_report(tmp_path_factory) -> Rendered:
    """The committed H100 results rendered once a session as the report rule renders them (the
    configuration, the published references, the committed multi-GPU run it quotes)."""
    if not H100.is_dir():
        pytest.skip(f"no committed H100 results at {H100}")
    # The renderer forgives a file the cases its job promises now only where git says the file was
    # measured at older code: it needs the history of the commits the results name.
    commit = next(line.split(",", 1)[1].strip() for line in (H100 / "env" / "env.csv").read_text().splitlines()
                  if line.startswith("commit,"))
    known = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                           capture_output=True, text=True)
    if known.returncode != 0:
        pytest.skip(f"renders the committed H100 results, measured at commit {commit}, which is not in this "
                    f"checkout's history (or there is no git): the renderer could not tell older code from damage")
    out = tmp_path_factory.mktemp("h100_report") / "report.md"
    with _providers_environment_kept(), contextlib.chdir(REPO):  # the page names the folders as the rule does
        return render_capturing(["--results", "results/h100-80gb-hbm3", "--scale", "full", "--templates", "templates",
                                 "--config", "config/config.yaml", "--references", "config/references.yaml",
                                 "--distributed", "results/h200-x4"], out)


PROVIDER_VARIABLES = ("LMPERF_CONTENDERS", "LMPERF_PROVIDER_MODULES")


@contextlib.contextmanager
def _providers_environment_kept():
    before = {n: os.environ.get(n) for n in PROVIDER_VARIABLES}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _own_providers_environment():
    """What registering contenders or provider modules passes to child processes
    (LMPERF_CONTENDERS, LMPERF_PROVIDER_MODULES) is a test's own: set back after it, so that
    no later test's job starts with another test's contenders."""
    with _providers_environment_kept():
        yield


@pytest.fixture(scope="module", autouse=True)
def _module_owns_providers_environment():
    """The same for a module's fixtures: rendering the committed H100 results registers their
    contender, which a module-scoped fixture does before any test's own fixture starts; the module
    sets it back when its last test is done (a later module's children never see it)."""
    with _providers_environment_kept():
        yield


# A sitecustomize that records, as each benchmark process exits, the lmperf modules it imported
# (lazy ones included) and its compile cache folders into $LMPERF_RECORD/<pid>.json: built_repo's
# run leaves them in <repo>/.records/ (tests/test_workflow.py checks them against the rules).
BENCH_RECORDER = """import atexit, json, os, sys
def _record():
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec and spec.name.startswith("lmperf."):
        files = sorted(m.__file__ for n, m in list(sys.modules.items())
                       if n.split(".")[0] == "lmperf" and getattr(m, "__file__", None))
        caches = {v: os.environ.get(v) for v in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
        with open(os.path.join(os.environ["LMPERF_RECORD"], f"{os.getpid()}.json"), "w") as f:
            json.dump({"module": spec.name.removesuffix(".__main__"), "files": files, "caches": caches}, f)
atexit.register(_record)
"""


def run_folder(tmp_path_factory) -> Path:
    """The run's temporary folder: every pytest-xdist worker of the run has its own folder in it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock on `path` (created), held by one process of the run at a time."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def once_a_run(tmp_path_factory, name: str, build) -> Path:
    """The folder <the run's folder>/<name>, which build(folder) fills once a run whatever the
    workers: the first to ask builds it while the others wait (a lock in the run's folder). A
    build that failed fails every later ask too, naming the error, rather than running again."""
    root = run_folder(tmp_path_factory) / name
    with locked(root.with_suffix(".lock")):
        if (root / "failed").exists():
            pytest.fail(f"{name}: its build failed in another worker: {(root / 'failed').read_text()}")
        if not (root / "done").exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            try:
                build(root)
            except BaseException as exc:
                (root / "failed").write_text(f"{type(exc).__name__}: {str(exc)[-2000:]}")
                raise
            (root / "done").touch()
    return root


@pytest.fixture(scope="session")
def built_repo(tmp_path_factory) -> Path:
    """A copy of the repository in which the default CPU workflow has run to report/report.md
    (the tests that use it are marked slow, `make test-slow`), each benchmark process's imports
    and caches recorded in <repo>/.records/. Its .cache/ (the jobs' compile caches) is this
    checkout's, so that compiled code is reused from run to run.

    Built once a run (once_a_run): the tests that read it go to one worker (their xdist_group),
    and a test on another worker that asks for it (the Slurm run, which compares its results
    with it once its own run is over) waits for that build rather than running the workflow
    again."""
    return once_a_run(tmp_path_factory, "built", _build) / "lmperf"


def _build(root: Path) -> None:
    repo = copy_repo(root / "lmperf")
    (REPO / ".cache").mkdir(exist_ok=True)
    (repo / ".cache").symlink_to(REPO / ".cache")
    recorder = root / "recorder"
    recorder.mkdir()
    (recorder / "sitecustomize.py").write_text(BENCH_RECORDER)
    (repo / ".records").mkdir()
    env = {"PYTHONPATH": f"{repo / 'src'}{os.pathsep}{recorder}", "LMPERF_RECORD": str(repo / ".records")}
    snakemake(repo, "--cores", "1", "report/report.md", *SMOKE, env=env, timeout=1800)


def _ours(fixturedef, root: Path) -> bool:
    """A fixture defined in the suite (under its root folder), not one of pytest's or a plugin's
    (such as tmp_path_factory), whose files may be under the root too, in a venv there."""
    code = getattr(fixturedef.func, "__code__", None)
    if code is None:
        return False
    where = Path(code.co_filename)
    return where.is_relative_to(root) and not any(where.is_relative_to(p) for p in {sys.prefix, sys.base_prefix})


# The kernel grids whose cases take seconds each (torch.compile, opcheck, the split kernel's long
# sequences): `make test` runs the cases named here, one of each code path; the others are marked
# slow and run in `make test-slow` (tests/test_suite.py checks that each name is a collected case).
FAST_CASES = {
    "tests/test_flash_attention.py::test_compiled_fullgraph_matches_eager": {"rule-causal-torch.float16",
                                                                           "split2-full-torch.float32"},
    "tests/test_flash_attention.py::test_ops_pass_torch_library_opcheck": {"3d", "5d"},
    "tests/test_flash_attention.py::test_the_models_layout_is_read_and_written_in_place": {"1"},
    "tests/test_flash_attention.py::test_split_matches_float64": {"fp16-1-2-full", "fp32-33-2-causal",
                                                                 "fp16-70-4-full", "bf16-130-2-causal"},
    "tests/test_fused.py::test_patched_model_computes_the_models_function": {"0-compiled", "2-eager"},
    "tests/test_flash_attention_gqa.py::test_compiled_grouped_query_attention_matches_eager_and_float64": {"causal"},
    "tests/test_flash_attention_gqa.py::test_grouped_query_backward_paths_match_float64": {
        "fp32-1-two_kernels", "fp16-1-fused", "fp16-4-two_kernels", "bf16-4-fused"},
}


def grid_case(item) -> tuple[str, str] | None:
    """(test function's id from the suite's root, case id) of a parametrized test, else None."""
    callspec = getattr(item, "callspec", None)
    return (item.nodeid.split("[")[0], callspec.id) if callspec else None


# Module fixtures that cost nothing to set up again on every worker: no reason to keep a module's
# tests on one (every module has the autouse one).
UNGROUPED = {"_module_owns_providers_environment"}


class _Order:
    """The order pytest-xdist hands the groups out in (`--dist loadgroup`; its reordering by size
    is off): the groups of a session fixture first, the largest first (built_repo's goes to the
    first worker, the Slurm run's to the second, which starts it while the first builds), then
    the other groups and the tests of none, the largest first. A worker takes the next group when
    it is almost out of tests, so the longest shares start first instead of last."""

    @pytest.hookimpl(trylast=True)  # after the selection (-m, -k): the sizes of what runs
    def pytest_collection_modifyitems(self, config, items):
        groups = {item: mark.args[0] for item in items if (mark := item.get_closest_marker("xdist_group"))}
        size = {}
        for item in items:
            size[groups.get(item, item)] = size.get(groups.get(item, item), 0) + 1
        items.sort(key=lambda item: (groups.get(item) not in SESSION_GROUPS, -size[groups.get(item, item)]))  # stable


SESSION_GROUPS: set[str] = set()  # the xdist_groups named after a session fixture


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    config.pluginmanager.register(_Order(), "lmperf-order")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `-n auto --dist loadgroup`), the tests that share a
    fixture wider than one test (built_repo: the smoke workflow, minutes; a module's rendered
    report) go to one worker, so that the fixture is built once, not once a worker (_Order says
    in which order the groups go out)."""
    for item in items:
        case = grid_case(item)
        if case and case[0] in FAST_CASES and case[1] not in FAST_CASES[case[0]]:
            item.add_marker(pytest.mark.slow)
        if "built_repo" in getattr(item, "fixturenames", ()):  # the smoke run: minutes of CPU before its first test
            item.add_marker(pytest.mark.slow)
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        shared = sorted(name for name, chain in defs.items() if name not in UNGROUPED
                        and chain and chain[-1].scope in ("module", "session") and _ours(chain[-1], config.rootpath))
        if shared:
            name = shared[0]
            session = defs[name][-1].scope == "session"
            group = name if session else f"{item.module.__name__}::{name}"
            if session:
                SESSION_GROUPS.add(group)
            item.add_marker(pytest.mark.xdist_group(group))
