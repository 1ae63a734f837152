"""A student's repository as a contender (lmperf.contenders): found and named without importing
it, its package importable in its own processes as the student's pytest sees it (lazy imports, a
workspace member, its installed metadata), two students with packages of one name kept apart, the
packages its code imports checked before any job, its Python files its code inputs.

The repositories here are written by the tests: they behave like CS336 assignment-2 repositories
(a `cs336_systems` package at the root, a `cs336-basics/` path source, `tests/adapters.py` importing
inside its functions), with code of lmperf's own."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from lmperf import contenders

REPO = Path(__file__).resolve().parents[1]

# A plain attention that saves its logsumexp, as the course's autograd.Function does.
ATTENTION = '''
import math
import torch


class Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if is_causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lse = torch.logsumexp(s.float(), dim=-1)
        p = torch.exp(s.float() - lse[..., None]).to(q.dtype)
        ctx.save_for_backward(lse, q, k, v, p)
        return p @ v

    @staticmethod
    def backward(ctx, grad):
        lse, q, k, v, p = ctx.saved_tensors
        dv = p.transpose(-1, -2) @ grad
        dp = grad @ v.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) / math.sqrt(q.shape[-1])
        return ds @ k, ds.transpose(-1, -2) @ q, dv, None
'''


def student_repo(root: Path, owner: str, *, implemented: bool = True, imports: str = "",
                 dependencies: tuple[str, ...] = ()) -> Path:
    """A repository laid out as the handout's: cs336_systems at the root (reading its installed
    version, recording each process that imports it), cs336-basics as a path source,
    tests/adapters.py importing lazily; a git repository with an `origin` on GitHub."""
    files = {
        "pyproject.toml": f'''
            [project]
            name = "cs336-systems"
            version = "1.0.5"
            dependencies = {json.dumps(["cs336-basics", "wandb>=0.19.7", "torch~=2.6.0", *dependencies])}

            [tool.uv.sources]
            cs336-basics = {{ path = "./cs336-basics", editable = true }}
            ''',
        "cs336_systems/__init__.py": f'''
            import importlib.metadata
            import os
            from pathlib import Path

            __version__ = importlib.metadata.version("cs336-systems")
            if os.environ.get("MARKERS"):
                Path(os.environ["MARKERS"], "{owner}-" + str(os.getpid())).touch()
            ''',
        "cs336_systems/attention.py": ("from cs336_basics.nn_utils import scale_of\n" + imports + "\n"
                                       + (ATTENTION if implemented else "Attention = None\n")),
        "cs336-basics/pyproject.toml": '[project]\nname = "cs336-basics"\nversion = "1.0.0"\n',
        "cs336-basics/cs336_basics/__init__.py": "",
        "cs336-basics/cs336_basics/nn_utils.py": "import math\n\n\ndef scale_of(d):\n    return 1 / math.sqrt(d)\n",
        "tests/__init__.py": "",
        "tests/adapters.py": '''
            def get_flashattention_autograd_function_pytorch():
                from cs336_systems.attention import Attention
                if Attention is None:
                    raise NotImplementedError
                return Attention


            def get_flashattention_autograd_function_triton():
                raise NotImplementedError
            ''',
        ".venv/lib/site.py": "raise SystemExit('never read')\n",
        ".hidden/notes.py": "",
        "scratch/ignored.py": "",
        ".gitignore": "scratch/\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    git = lambda *args: subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    git("init", "-q")
    git("remote", "add", "origin", f"https://github.com/{owner}/assignment2-systems.git")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    return root


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env={**os.environ, **env})


def test_a_repository_is_named_by_its_remote_and_found_without_importing_it(tmp_path):
    alice = student_repo(tmp_path / "a" / "assignment2-systems", "alice")
    assert contenders.normalise(str(alice)) == {"alice_assignment2_systems": str(alice)}
    # its adapters file at the handout's place names the same repository
    assert list(contenders.normalise(str(alice / "tests" / "adapters.py"))) == ["alice_assignment2_systems"]
    location, = contenders.check(str(alice))
    assert location.root == alice.resolve() and location.adapters.endswith("tests/adapters.py")
    assert str(alice.resolve()) in location.paths and str((alice / "cs336-basics").resolve()) in location.paths
    assert "cs336_systems" not in sys.modules  # planning imported nothing of theirs


def test_two_clones_of_one_name_are_a_clear_error_asking_for_a_key(tmp_path):
    first = student_repo(tmp_path / "a" / "assignment2-systems", "alice")
    second = student_repo(tmp_path / "b" / "assignment2-systems", "alice")  # a second clone of hers
    with pytest.raises(contenders.ContenderError, match=r"both be named 'alice_assignment2_systems'.*mapping"):
        contenders.normalise(f"{first},{second}")
    assert set(contenders.normalise({"mine": str(first), "hers": str(second)})) == {"mine", "hers"}


def test_its_python_files_are_code_inputs_and_an_edit_changes_its_digest(tmp_path):
    alice = student_repo(tmp_path / "assignment2-systems", "alice")
    files = {Path(f).resolve() for f in contenders.code_inputs(str(alice))}
    assert alice / "cs336_systems" / "attention.py" in files
    assert alice / "cs336-basics" / "cs336_basics" / "nn_utils.py" in files
    assert alice / "tests" / "adapters.py" in files
    for left_out in (".venv/lib/site.py", ".hidden/notes.py", "scratch/ignored.py"):
        assert alice / left_out not in files
    before = contenders.digest(str(alice))
    kernel = alice / "cs336_systems" / "attention.py"
    kernel.write_text(kernel.read_text() + "\n# tuned\n")
    assert contenders.digest(str(alice)) != before


def test_a_package_its_code_imports_and_lmperf_lacks_stops_planning_naming_it(tmp_path):
    """Named by its pyproject.toml's distribution name; a dependency it lists but never imports
    (the handout's wandb) is not asked for, nor are version pins (torch~=2.6.0)."""
    alice = student_repo(tmp_path / "assignment2-systems", "alice", imports="import not_a_real_pkg_q7",
                         dependencies=("not-a-real-pkg-q7>=1",))
    with pytest.raises(contenders.ContenderError) as error:
        contenders.check(str(alice))
    message = str(error.value)
    assert "not-a-real-pkg-q7" in message and "pip install not-a-real-pkg-q7" in message
    assert "wandb" not in message and "torch" not in message


def test_a_path_source_that_holds_no_package_is_named_as_such(tmp_path):
    alice = student_repo(tmp_path / "assignment2-systems", "alice")
    for f in sorted((alice / "cs336-basics").rglob("*"), reverse=True):  # a submodule never checked out
        f.unlink() if f.is_file() else f.rmdir()
    with pytest.raises(contenders.ContenderError, match=r"cs336-basics \(its \[tool.uv.sources\] path "
                                                        r"./cs336-basics holds no package"):
        contenders.check(str(alice))


def test_lazy_imports_a_workspace_member_and_its_metadata_work_in_its_process(tmp_path):
    """What the student's pytest sees: the adapter imports cs336_systems inside the function,
    cs336_systems imports cs336_basics (the path source) and reads its own installed version,
    though nothing is installed; the class is right against float64."""
    alice = student_repo(tmp_path / "assignment2-systems", "alice")
    proc = run_python(f"""
        import torch
        from lmperf import contenders
        from lmperf.kernels.attention_contract import compare
        fn = contenders.attention_fn(contenders.load("alice", {str(alice)!r}), "pytorch")
        q, k, v = (torch.randn(2, 33, 16, dtype=torch.float64) for _ in range(3))
        rows = compare(lambda *a: fn(*a), q.float(), k.float(), v.float(), True)
        import cs336_systems
        print(cs336_systems.__version__, all(r["passed"] for r in rows))
        """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1.0.5", "True"]


def test_an_adapter_that_raises_is_a_failed_row_not_a_traceback(tmp_path):
    broken = tmp_path / "adapters.py"
    broken.write_text("def get_flashattention_autograd_function_triton():\n"
                      "    raise RuntimeError('triton is not set up')\n")
    contender = contenders.load("broken", str(broken))
    with pytest.raises(contenders.Failed, match="triton is not set up"):
        contenders.attention_class(contender, "triton")


@pytest.mark.slow
def test_two_students_with_one_package_name_each_get_their_own_rows_in_their_own_processes(tmp_path):
    """PyTorch attention's job with two contenders whose packages are both `cs336_systems`: bob's
    attention is not implemented (his package holds None), alice's is. Had bob's adapter found
    alice's package, his rows would be hers. Neither's code is imported by the job's process,
    which runs our cases, nor by the other's."""
    alice = student_repo(tmp_path / "alice" / "assignment2-systems", "alice")
    bob = student_repo(tmp_path / "bob" / "assignment2-systems", "bob", implemented=False)
    markers = tmp_path / "markers"
    markers.mkdir()
    spec = {"impls": ["eager"], "batch": 2, "head_dims": [16], "seq_lens": [32], "iters": 3,
            "contenders": {"alice": str(alice), "bob": str(bob)}}
    out = tmp_path / "attention.csv"
    proc = subprocess.Popen([sys.executable, "-m", "lmperf.bench.attention", "--spec", json.dumps(spec),
                             "--out", str(out), "--hw", "cpu"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "MARKERS": str(markers)})
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
    rows = pd.read_csv(out).drop_duplicates("case_id").set_index("impl")
    assert rows.loc["eager", "status"] == "ok"
    assert rows.loc["alice_pytorch", "status"] == "ok"
    assert rows.loc["bob_pytorch", "status"] == "skipped" and "not implemented" in rows.loc["bob_pytorch", "message"]
    pids = {}
    for marker in markers.iterdir():
        owner, pid = marker.name.split("-")
        pids.setdefault(owner, set()).add(int(pid))
    assert set(pids) == {"alice", "bob"}
    assert not pids["alice"] & pids["bob"] and proc.pid not in pids["alice"] | pids["bob"]


def test_an_edit_to_their_code_reruns_their_jobs_and_leaves_our_kernel_checks(tmp_path):
    """A contender's files are code inputs of the jobs that run its code (the FlashAttention
    benchmark, its own check job), never of our kernels' checks, which run none of its code."""
    from lmperf import catalog, workflow

    alice = student_repo(tmp_path / "assignment2-systems", "alice")
    kernel = str((alice / "cs336_systems" / "attention.py").resolve())
    config = {"contenders": str(alice), "provider_modules": []}
    jobs = {job.rule: (section, job) for section in catalog.SECTIONS for job in section.jobs}
    inputs = {rule: {str(Path(f).resolve()) for f in workflow.job_code(config, *jobs[rule])}
              for rule in ("flash_attention_check", "flash_attention_bench")}
    assert kernel in inputs["flash_attention_bench"]
    assert kernel not in inputs["flash_attention_check"]
