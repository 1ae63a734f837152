"""The Snakemake workflow end to end: config validation, the DAG, a real CPU run, and which
jobs an edit makes stale. The tests marked slow (`make test-slow`) run jobs again in a copy of
the built repository or run the GPU scripts; the rest read the one smoke run (built_repo) or plan."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SMOKE, config_yaml, copy_repo, snakemake, workflow_env
from lmperf import failures

def planned(repo: Path, *args: str, env: dict | None = None) -> dict[str, int]:
    """{rule: job count} that a dry run of report/report.md would execute."""
    proc = snakemake(repo, "report/report.md", "-n", *args, "--quiet", "rules", *SMOKE, env=env)
    out = proc.stdout + proc.stderr
    return {} if "Nothing to be done" in out else job_counts(out.split("Job stats:")[1])


def job_counts(stats: str) -> dict[str, int]:
    """{rule: count} from a Snakemake "Job stats" table."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\S+)\s+(\d+)$", stats, re.M) if m[1] != "total"}


def results_hw(repo: Path) -> str:
    """The results folder the repo's rendered report was built from."""
    return re.search(r"from the CSVs under\s+`results/([^/]+)/`", (repo / "report" / "report.md").read_text())[1]


@pytest.fixture
def fresh_copy(tmp_path) -> Path:
    return copy_repo(tmp_path / "lmperf")


@pytest.fixture(scope="module")
def fresh_plan(tmp_path_factory) -> dict[str, int]:
    """{rule: job count} of a fresh copy's dry run of the report: planned once, read by every test
    that compares an edit's plan with the whole DAG."""
    return planned(copy_repo(tmp_path_factory.mktemp("fresh") / "lmperf"))


@pytest.fixture(scope="module")
def fresh_dry_run(tmp_path_factory) -> str:
    """A fresh copy's dry run of the report with its shell commands (-p), run once."""
    return dry_run_commands(copy_repo(tmp_path_factory.mktemp("fresh") / "lmperf"))


@pytest.fixture
def built_copy(built_repo, tmp_path) -> Path:
    """A private copy of the built repository (mtimes and Snakemake metadata kept)."""
    dest = tmp_path / "built"
    shutil.copytree(built_repo, dest, symlinks=True)
    return dest


def edit(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)
    future = time.time() + 2
    os.utime(path, (future, future))


def test_dry_run_plans_the_whole_dag(fresh_plan):
    jobs = fresh_plan
    assert jobs["report"] == 1 and jobs["env"] == 1
    config = config_yaml()
    studies = config["e2e"]["smoke"]["studies"]
    assert jobs["e2e_study"] == sum(len(s["sizes"]) + len(s.get("deep_sizes", [])) for s in studies.values())  # depth=deep
    assert jobs["ladder_size"] == len(config["ladder"]["smoke"]["sizes"])


def test_lint_is_clean(fresh_copy):
    proc = snakemake(fresh_copy, "--lint")
    assert "Congratulations, your workflow is in a good condition" in proc.stdout + proc.stderr


@pytest.mark.parametrize("override, message", [
    (["scale=huge"], "huge"),
    (["bogus_key=1"], "bogus_key"),
    (["hw=Bad Name"], "Bad Name"),
])
def test_bad_config_stops_at_once_naming_it(fresh_copy, override, message):
    proc = snakemake(fresh_copy, "-n", "--config", *override, check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


def test_unknown_model_size_in_a_study_is_named(fresh_copy):
    path = fresh_copy / "config" / "config.yaml"
    config = config_yaml(fresh_copy)
    config["e2e"]["smoke"]["studies"]["warmup"]["sizes"] = ["tiny", "gigantic"]
    path.write_text(yaml.safe_dump(config))
    proc = snakemake(fresh_copy, "-n", check=False)
    assert proc.returncode != 0
    assert "e2e.smoke.studies.warmup.sizes names ['gigantic']" in proc.stdout + proc.stderr


def test_unknown_model_size_in_the_ladder_is_named(fresh_copy):
    path = fresh_copy / "config" / "config.yaml"
    config = config_yaml(fresh_copy)
    config["ladder"]["full"]["sizes"] = ["xl", "colossal"]
    path.write_text(yaml.safe_dump(config))
    proc = snakemake(fresh_copy, "-n", check=False)
    assert proc.returncode != 0
    assert "ladder.full.sizes names ['colossal']" in proc.stdout + proc.stderr


def test_wrong_type_in_the_grid_is_named(fresh_copy):
    path = fresh_copy / "config" / "config.yaml"
    config = config_yaml(fresh_copy)
    config["e2e"]["smoke"]["studies"]["context"]["grid"]["dtypes"] = ["fp8"]
    path.write_text(yaml.safe_dump(config))
    proc = snakemake(fresh_copy, "-n", check=False)
    assert proc.returncode != 0
    assert "fp8" in proc.stdout + proc.stderr


def test_cpu_run_produces_the_report(built_repo):
    report = (built_repo / "report" / "report.md").read_text()
    assert "## End-to-end Transformer timings" in report
    assert "## Environment" in report and "| scale                       | smoke" in report
    assert "Not available: no end-to-end" not in report
    assert "## Correctness" in report and re.search(r"flash_attention / triton\s*\| fp16 .* pass", report)
    assert "needs CUDA" in report  # the FA benchmark and Triton bf16 checks say why they did not run
    assert re.search(r"lrpe / triton_cache\s*\| fp32 .* pass", report)
    assert "| fp16 accumulator, fp16 addends                    | 9.953125" in report
    assert re.search(r"\| eager\s+\| 16\s+\| 64\s+\| [0-9.]+ \[[0-9.]+, [0-9.]+\]", report), "attention timings"
    assert re.search(r"\| forward\s+\| [0-9.,]+\s+\| [0-9.]+\s", report), "profile shares"
    assert "## Memory" in report and "![Active memory over one step]" in report
    # the distributed section from the CPU's Gloo smoke run (results/cpu/distributed/), in processes
    assert "\n## Scaling across processes\n" in report and "Measured on the CPU (Gloo)" in report
    assert re.search(r"\| gloo\s+\| 2\s+\| 1\.00\s+\| [0-9.]+", report), "Gloo all-reduce rows"
    assert "(allreduce): skipped, needs 2 GPUs" in report  # NCCL without GPUs
    assert re.search(r"\| tiny\s+\| 64\s+\| fp32\s+\| eager\s+\| \d", report), "CPU numbers in the tables"
    for png in ("e2e_step_vs_size.png", "e2e_step_vs_context.png", "e2e_ladder.png"):
        assert (built_repo / "report" / "figures" / png).stat().st_size > 10_000
    # the ladder, its own section from results/<hw>/ladder/: the rungs that need CUDA say so
    ladder = report.split("## The ladder")[1].split("\n## ")[0]
    assert "Not available" not in ladder and re.search(r"\| tiny\s+\| 2\s+\| TF32 .*\| skipped", ladder)
    csvs = list((built_repo / "results" / results_hw(built_repo) / "e2e").rglob("*.csv"))
    assert csvs and not list((built_repo / "results").rglob(".journal"))


@pytest.mark.slow
def test_second_run_has_nothing_to_do_within_5_seconds(built_copy):
    """A rerun does nothing, and quickly: the faster of two no-op runs (the first after a fresh
    copy also compiles the copy's bytecode; on a busy 2-core CI machine it took 5.0 s once,
    about 2 s warm) stays under 5 s."""
    times = []
    for _ in range(2):
        t0 = time.monotonic()
        proc = snakemake(built_copy, "--cores", "1", "report/report.md", *SMOKE)
        times.append(time.monotonic() - t0)
        assert "Nothing to be done" in proc.stdout + proc.stderr
    assert min(times) < 5, f"no-op reruns took {times[0]:.1f} and {times[1]:.1f} s"


def test_editing_a_template_reruns_only_the_report(built_copy):
    edit(built_copy / "templates" / "e2e.md.j2", "\n")
    assert planned(built_copy) == {"report": 1}


@pytest.mark.parametrize("module", ["model.py", "kernels/flash_attention_triton.py"])
def test_editing_the_model_or_its_attention_kernel_reruns_their_rules_and_the_report_only(built_copy, fresh_plan,
                                                                                         module):
    """The rules whose benchmark can import the model (which runs our FlashAttention kernel for
    attention: flash-triton): every end-to-end job, the attention, profile and memory benchmarks,
    both FlashAttention rules (PyTorch attention is the model's), the distributed jobs and the
    checks of the kernels that train it (master-weight AdamW, the fused kernels' patched model,
    float8 training's layers, among them the model's SwiGLU), the FP8 rung's convergence job (it trains the model on the ladder's settings), and the repeats
    of their jobs (smoke: a FlashAttention headline case, a ladder rung, DDP)."""
    edit(built_copy / "src" / "lmperf" / module, "\n# edited\n")
    jobs, fresh = planned(built_copy), fresh_plan
    assert jobs == {"e2e_study": fresh["e2e_study"], "ladder_size": fresh["ladder_size"], "convergence_run": 1,
                    "attention": 1,
                    "profile": 1, "memory": 1, "flash_attention_check": 1, "adamw_master_check": 1, "fused_check": 1,
                    "float8_delayed_check": 1, "flash_attention_bench": fresh["flash_attention_bench"],
                    "distributed_study": fresh["distributed_study"], "repeat": fresh["repeat"],
                    "distributed_repeat": fresh["distributed_repeat"], "report": 1}


def test_editing_the_training_step_reruns_every_rule_that_trains_and_the_report(built_copy, fresh_plan):
    """lmperf.train is the one training step: the end-to-end, ladder, convergence, profile, memory
    and data-parallel jobs run it, and so do the master-weight AdamW's and the fused kernels' checks
    (they train the LM through it), and the repeats of the ladder's and DDP's jobs (smoke: two
    processes each); the other kernels' and attention's benchmarks do not."""
    edit(built_copy / "src" / "lmperf" / "train.py", "\n# edited\n")
    fresh = fresh_plan
    assert planned(built_copy) == {"e2e_study": fresh["e2e_study"], "ladder_size": fresh["ladder_size"],
                                   "convergence_run": 1, "profile": 1, "memory": 1, "distributed_study": fresh["distributed_study"],
                                   "adamw_master_check": 1, "fused_check": 1, "repeat": 2,
                                   "distributed_repeat": fresh["distributed_repeat"], "report": 1}


def test_editing_the_ladder_reruns_only_its_jobs_and_the_report(built_copy, fresh_plan):
    """Its jobs: the ladder's, and the convergence job, which trains the ladder's FP8 rung."""
    edit(built_copy / "src" / "lmperf" / "bench" / "ladder.py", "\n# edited\n")
    fresh = fresh_plan
    # and the repeats of its rung (smoke: two processes)
    assert planned(built_copy) == {"ladder_size": fresh["ladder_size"], "convergence_run": 1, "repeat": 2,
                                   "report": 1}


def test_editing_the_lrpe_kernel_reruns_only_its_rules_and_the_report(built_copy, fresh_plan):
    edit(built_copy / "src" / "lmperf" / "kernels" / "lrpe.py", "\n# edited\n")
    fresh = fresh_plan
    assert planned(built_copy) == {"lrpe_check": 1, "lrpe_bench": fresh["lrpe_bench"], "report": 1}


# The ladder study's job at smoke scale, under results/<hw>/ (imports bench/profile.py lazily)
LADDER_CSV = "ladder/tiny.csv"


@pytest.mark.parametrize("module, job", [("bench/profile.py", LADDER_CSV),
                                         ("kernels/attention_contract.py", "flash_attention/check.csv")])
def test_an_edit_to_a_lazily_imported_module_schedules_its_jobs(built_copy, module, job):
    """Once missing from hand-kept input lists: the ladder imports bench/profile.py inside a
    function, the FlashAttention kernels import kernels/attention_contract.py."""
    output = f"results/{results_hw(built_copy)}/{job}"
    assert planned(built_copy) == {}
    edit(built_copy / "src" / "lmperf" / module, "\n# edited\n")
    dry = snakemake(built_copy, "report/report.md", "-n", *SMOKE)
    assert f"output: {output}\n" in dry.stdout + dry.stderr


def dry_run_commands(repo: Path) -> str:
    """The output of a dry run of the report with its shell commands (-p)."""
    dry = snakemake(repo, "report/report.md", "-n", "-p", *SMOKE)
    return dry.stdout + dry.stderr


def benchmark_jobs(dry: str) -> list[tuple[str, str, set[str]]]:
    """(rule, module its command runs, its inputs) of every job of a dry run (dry_run_commands)
    whose shell command runs `python -m lmperf.<...>`."""
    jobs = []
    for block in dry.split("\nrule ")[1:]:
        rule = block.split(":")[0]
        module = re.search(r"^Shell command:.* -m (lmperf\.[\w.]+)", block, re.M)
        inputs = re.search(r"^    input: (.*)$", block, re.M)
        if module and rule != "report":
            jobs.append((rule, module[1], set(inputs[1].split(", ")) if inputs else set()))
    return jobs


def imported_at_top(repo: Path, module: str) -> set[str]:
    """The files of the lmperf modules that importing `module` loads, read from sys.modules of a
    fresh interpreter, as paths from the repository root."""
    code = (f"import importlib, json, sys; importlib.import_module({module!r}); print(json.dumps("
            "[m.__file__ for n, m in sys.modules.items() if n.split('.')[0] == 'lmperf']))")
    proc = subprocess.run([sys.executable, "-c", code], env=workflow_env(repo), capture_output=True,
                          text=True, check=True, timeout=300)
    return {str(Path(f).relative_to(repo)) for f in json.loads(proc.stdout)}


@pytest.mark.slow
def test_every_benchmark_job_has_the_modules_its_command_imports_as_inputs(fresh_copy, fresh_dry_run):
    """(make test's test_every_module_a_benchmark_imported_while_running_is_among_its_inputs
    checks the same of every module a smoke job had imported when it exited.)"""
    jobs = benchmark_jobs(fresh_dry_run)
    rules = {rule for rule, _, _ in jobs}
    assert rules == {"env", "e2e_study", "ladder_size", "convergence_run", "adamw_master_check", "flash_attention_check", "flash_attention_bench", "lrpe_check",
                     "adamw_master_check", "fused_check", "float8_delayed_check",
                     "lrpe_bench", "attention", "precision", "profile", "memory", "distributed_study", "repeat",
                     "distributed_repeat"}
    for module in {m for _, m, _ in jobs}:
        imported = imported_at_top(fresh_copy, module)
        path = f"src/{module.replace('.', '/')}"
        assert f"{path}.py" in imported or f"{path}/__init__.py" in imported  # a module or a package
        for rule, _, inputs in (j for j in jobs if j[1] == module):
            assert imported <= inputs, f"{rule}: {sorted(imported - inputs)} missing from its inputs"


def test_the_result_file_layout_has_one_source():
    """Every benchmark rule is made from a declared job (rules/jobs.smk, one generic rule a job
    kind): its output is wf.output(<folder>, JOB.rule, SECTIONS), the declared layout that
    result_files formats, and no rule writes a CSV path by hand; every job's benchmark lists its
    cases by the one signature, job_cases(study, spec, arg)."""
    import importlib
    import inspect
    from lmperf import catalog, declare, workflow as wf
    jobs_rules = (REPO / "rules" / "jobs.smk").read_text()
    kinds = re.findall(r"^for SECTION, JOB in wf\.jobs\(SECTIONS, \"(\w+)\"\):\n\n    rule:\n(.*?)(?=^\S|\Z)",
                       jobs_rules, re.S | re.M)
    assert sorted(k for k, _ in kinds) == sorted(declare.KINDS)
    for kind, body in kinds:
        assert re.search(r"name:\s+JOB\.rule\n", body) and re.search(r"csv=report\(wf\.output\([^,]+, JOB\.rule, SECTIONS\)", body), kind
    assert wf.LAYOUT == {j.rule: j.layout for s in catalog.SECTIONS for j in s.jobs}
    text = "\n".join(p.read_text() for p in sorted((REPO / "rules").glob("*.smk")))
    # (a repeat's run<k>.csv is its job's path with repeats/ before it: lmperf.repeats)
    assert not re.findall(r"/[\w{}]+\.csv\b", text.replace("run{{k}}.csv", "")), "a rule writes a CSV path by hand"
    from lmperf.report import render
    config = render.load_config(REPO / "config" / "config.yaml")
    files = [f for scale in ("smoke", "full") for f in wf.result_files(config, "results/x", scale, ["results/x"])]
    sections = {s.name: s for s in catalog.SECTIONS}
    modules = {sections[f.section].case_module(f.study) for f in files if f.section not in ("env", "repeats")}
    for name in sorted(modules):
        params = list(inspect.signature(importlib.import_module(name).job_cases).parameters)
        assert params == ["study", "spec", "arg"], name


def shell_commands(dry: str) -> dict[str, str]:
    """{output: shell command} of every job of a dry run (dry_run_commands)."""
    blocks = dry.split("\nrule ")[1:]
    return {re.search(r"^    output: (\S+)", b, re.M)[1]: re.search(r"^Shell command: (.*)$", b, re.M)[1]
            for b in blocks if "Shell command:" in b}


def test_a_repeat_is_its_jobs_command_with_its_cases_into_its_own_file(fresh_dry_run):
    """Each smoke repeat runs the command of the job it repeats (the same module, spec and
    library checks), only with --cases and its own output and log."""
    commands = shell_commands(fresh_dry_run)
    repeats = {out: cmd for out, cmd in commands.items() if "/repeats/" in out}
    config = config_yaml()["repeats"]["smoke"]
    assert len(repeats) == config["processes"] * len(config["jobs"])
    for out, cmd in repeats.items():
        job = re.fullmatch(r"results/([^/]+)/repeats/(.+)/run\d+\.csv", out)
        main = commands[f"results/{job[1]}/{job[2]}.csv"]
        cases = next(j["cases"] for j in config["jobs"] if j["job"] == job[2])
        assert f" --cases {' '.join(cases)} --out " in cmd.replace("'", "")
        without_cases = cmd[:cmd.index(" --cases ")] + cmd[cmd.index(" --out "):]
        strip = lambda c: re.sub(r" --(out|log|progress-log|workers) \S+", "", c)
        assert strip(without_cases) == strip(main)


def test_every_module_a_benchmark_imported_while_running_is_among_its_inputs(built_repo, fresh_dry_run):
    """The lazy imports too: built_repo's run recorded the lmperf modules each benchmark process
    had imported when it exited (conftest.BENCH_RECORDER)."""
    inputs = {}
    for _, module, files in benchmark_jobs(fresh_dry_run):
        inputs.setdefault(module, set()).update(files)
    records = [json.loads(p.read_text()) for p in (built_repo / ".records").glob("*.json")]
    ran = {r["module"] for r in records}
    assert set(inputs) <= ran, f"no record of {sorted(set(inputs) - ran)}"
    for record in records:
        if record["module"] in inputs:
            imported = {str(Path(f).relative_to(built_repo)) for f in record["files"]}
            missing = imported - inputs[record["module"]]
            assert not missing, f"{record['module']} imported {sorted(missing)}, not among its inputs"


def test_benchmarks_compile_into_the_results_folders_cache(built_repo):
    """Every benchmark process of built_repo's run had the compile caches under .cache/<hw>/ of
    its checkout, not the machine-wide /tmp/torchinductor_<user>; the folder is ignored by git."""
    hw = results_hw(built_repo)
    records = [json.loads(p.read_text()) for p in (built_repo / ".records").glob("*.json")]
    benchmarks = [r for r in records if r["module"].startswith("lmperf.bench.")]
    assert benchmarks
    for record in benchmarks:
        assert record["caches"] == {"TORCHINDUCTOR_CACHE_DIR": f"{built_repo}/.cache/{hw}/inductor",
                                    "TRITON_CACHE_DIR": f"{built_repo}/.cache/{hw}/triton"}, record["module"]
    assert any((built_repo / ".cache" / hw / "inductor").rglob("*.so")), "the compiled cases cached nothing"
    ignored = subprocess.run(["git", "check-ignore", "-q", f".cache/{hw}/inductor/x.so"], cwd=REPO)
    assert ignored.returncode == 0, ".cache/ is not ignored by git"


@pytest.mark.slow
def test_an_error_fails_its_job_and_a_rerun_measures_only_it(fresh_copy):
    """An error row (injected) fails the job after its CSV is written: Snakemake reports it and
    deletes the CSV, the journal keeps the other cases, and the rerun measures only the failed
    one. With accept_errors the same error ends the job normally."""
    target, config = "results/cpu/precision/precision.csv", ("--config", "scale=smoke", "hw=cpu")
    fault = {"LMPERF_INJECT_FAULT": "error@autocast-fp16"}
    failed = snakemake(fresh_copy, "--cores", "1", target, *config, env=fault, check=False)
    assert failed.returncode != 0
    assert "Error in rule precision" in failed.stdout + failed.stderr
    assert not (fresh_copy / target).exists()
    log = fresh_copy / "logs" / "cpu" / "precision.log"
    assert "1 of 3 cases ended in error (autocast-fp16)" in log.read_text()
    snakemake(fresh_copy, "--cores", "1", target, *config)
    assert "resuming: 2 of 3 cases" in log.read_text()
    (fresh_copy / target).unlink()
    accepted = snakemake(fresh_copy, "--cores", "1", target, *config, "accept_errors=True", env=fault,
                         check=False)
    assert accepted.returncode == 0, accepted.stdout[-2000:] + accepted.stderr[-2000:]
    assert "error,RuntimeError: injected error" in (fresh_copy / target).read_text()


@pytest.mark.parametrize("lib", ["torch", "triton"])
def test_another_library_version_reruns_the_benchmarks(built_copy, tmp_path, lib):
    fake = tmp_path / "fake-site"
    dist = fake / f"{lib}-99.0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {lib}\nVersion: 99.0.0\n")
    env = {"PYTHONPATH": f"{fake}{os.pathsep}{built_copy / 'src'}"}
    jobs = planned(built_copy, env=env)
    assert jobs.get("e2e_study", 0) > 0 and jobs.get("env") == 1 and jobs.get("report") == 1
    assert planned(built_copy) == {}, "with the real versions nothing is stale"


def script(repo: Path, name: str, *args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run tools/<name> in `repo` with this interpreter first on PATH as `python3` (and `env`)."""
    return subprocess.run(["bash", f"tools/{name}", *args], cwd=repo, env=workflow_env(repo, env),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_refresh_demo_lists_only_the_lrpe_jobs_and_the_report(built_copy, fresh_plan):
    kernel = built_copy / "src" / "lmperf" / "kernels" / "lrpe.py"
    before = kernel.read_bytes()
    proc = script(built_copy, "refresh_demo.sh", *SMOKE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, after = proc.stdout.split("== after")
    assert "(nothing to be done)" in first
    fresh = fresh_plan
    assert job_counts(after) == {"lrpe_check": 1, "lrpe_bench": fresh["lrpe_bench"], "report": 1}
    assert kernel.read_bytes() == before, "the demo must put the kernel back"


def stop_while_running(repo: Path, target: str) -> None:
    """Start `target`, interrupt Snakemake once the job is measuring, then leave the job's output
    in place, as when a time limit stops a job right after it wrote its CSV."""
    written = (repo / target).read_bytes()  # what the job writes (the built copy has it)
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1", "--force", target, *SMOKE],
                            cwd=repo, env=workflow_env(repo), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    marks = repo / ".snakemake" / "incomplete"
    log = repo / ("logs" + target.removeprefix("results").removesuffix(".csv") + ".log")  # the rule's log
    text = lambda: log.read_text(errors="replace") if log.exists() else ""
    before = text()  # Snakemake may remove a job's old log before the job starts

    def measuring() -> bool:  # Snakemake marked the output incomplete and the job logged its first case
        # (a SIGINT before the job's process runs lets Snakemake clean up and leave no mark)
        now = text()
        return marks.is_dir() and any(marks.iterdir()) and now != before and "] case 1/" in now.removeprefix(before)
    deadline = time.monotonic() + 120
    while not measuring():
        assert proc.poll() is None and time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    (repo / target).parent.mkdir(parents=True, exist_ok=True)
    (repo / target).write_bytes(written)


@pytest.mark.slow
def test_a_job_stopped_after_writing_is_named_and_gpu_run_redoes_it(built_copy):
    target = f"results/{results_hw(built_copy)}/flash_attention/check.csv"
    stop_while_running(built_copy, target)
    stopped = (built_copy / target).stat().st_mtime_ns
    demo = script(built_copy, "refresh_demo.sh", *SMOKE)
    assert demo.returncode != 0 and "incomplete" in demo.stdout + demo.stderr
    run = script(built_copy, "gpu_run.sh", target, "--", *SMOKE)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = (built_copy / target).read_text().splitlines()   # the job's output was written anew
    assert len(rows) > 1 and "status" in rows[0] and (built_copy / target).stat().st_mtime_ns > stopped
    assert script(built_copy, "refresh_demo.sh", *SMOKE).returncode == 0


@pytest.mark.slow
def test_gpu_run_goes_on_past_a_failed_job(fresh_copy):
    """A job that fails (a case ended in an error) does not stop gpu_run.sh's other jobs: the
    budget of a GPU session was planned for all of them. The failing job is scheduled first."""
    failing, other = (f"results/cpu/{path}" for path in ("precision/precision.csv", "adamw_master/check.csv"))
    run = script(fresh_copy, "gpu_run.sh", failing, other, "--", *SMOKE, "hw=cpu", "--prioritize", failing,
                 env={failures.FAULT_ENV: "error@accumulation"})  # a precision case
    assert run.returncode != 0 and "Error in rule precision" in run.stdout + run.stderr
    assert not (fresh_copy / failing).exists() and (fresh_copy / other).exists(), run.stderr[-3000:]


def test_gpu_detached_follow_on_a_machine_without_the_run_says_so_at_once(fresh_copy, tmp_path):
    """A lent machine that went back between two calls comes back bare: `follow` says the run is
    not there and exits 3 at once, rather than waiting out its seconds on nothing; a run that
    `start` launched is found by the next `follow` from its first second."""
    t0 = time.monotonic()
    gone = script(fresh_copy, "gpu_detached.sh", "follow", str(tmp_path / "run"), "300", str(tmp_path / "pack.tgz"))
    assert gone.returncode == 3 and "no run in" in gone.stderr and time.monotonic() - t0 < 60
    started = script(fresh_copy, "gpu_detached.sh", "start", str(tmp_path / "run"), "1", str(tmp_path / "pack.tgz"),
                     "no-such-target", env={"FOLLOW_S": "0"})
    assert started.returncode == 0 and "gpu_detached: started" in started.stdout, started.stderr
    assert (tmp_path / "run" / ".gpu_detached.log").exists()


def test_gpu_detached_start_returns_while_its_run_goes_on(fresh_copy, tmp_path):
    """`start` hands the run to its own session and returns after its follow, with the call's
    output (a pipe here, as under `| tail`) closed: a start whose detached list kept that pipe
    open waited out the whole run and printed nothing."""
    (fresh_copy / "tools" / "gpu_targets.sh").write_text("sleep 30\n")   # a run that takes 30 s
    t0 = time.monotonic()
    started = script(fresh_copy, "gpu_detached.sh", "start", str(tmp_path / "run"), "60", str(tmp_path / "pack.tgz"),
                     "a-target", env={"FOLLOW_S": "0"})
    assert started.returncode == 0 and "gpu_detached: running" in started.stdout, started.stdout + started.stderr
    assert time.monotonic() - t0 < 20


FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for `python -m lmperf.<...> --out PATH ...`: records when it ran, writes its outputs.
prev=""; out=""
for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
echo "start $(date +%s.%N)" >> "$JOBS_LOG"
[ -n "${ORDER_LOG:-}" ] && echo "$out" >> "$ORDER_LOG"
sleep 1
mkdir -p "$(dirname "$out")" && echo "fake" > "$out"
case "$out" in */memory/memory.csv) mkdir -p "$(dirname "$out")/html" "$(dirname "$out")/snapshots";; esac
echo "end $(date +%s.%N)" >> "$JOBS_LOG"
"""
GPU_TARGETS = ("env", "e2e", "ladder", "precision", "attention", "profile", "memory", "flash_attention", "lrpe")


def most_at_once(log: Path) -> int:
    """The largest number of jobs running at the same time, from start/end lines."""
    events = sorted((float(t), kind == "start") for kind, t in (line.split() for line in log.read_text().splitlines()))
    running = peak = 0
    for _, start in events:  # at equal times an end sorts first
        running += 1 if start else -1
        peak = max(peak, running)
    return peak


@pytest.mark.slow
@pytest.mark.parametrize("profile, most", [([], 6), (["--workflow-profile", "none"], 8)])
def test_cores_8_keeps_at_most_6_gpu_jobs_in_flight(fresh_copy, tmp_path, profile, most):
    """Every GPU rule asks for gpu=1 and profiles/default lets 6 be in flight: with --cores 8 they
    run side by side, 6 at most (the device lock, not Snakemake, keeps their timings apart:
    tests/test_device.py). Without the profile (the control) --cores alone caps them."""
    proc = snakemake(fresh_copy, *GPU_TARGETS, "-n", "--cores", "8", *SMOKE)
    dry = proc.stdout + proc.stderr
    assert "Using workflow specific profile profiles/default" in dry
    blocks = [b for b in dry.split("\n\n") if re.search(r"^(local)?rule (?!e2e:|ladder:|lrpe:|flash_attention:)", b, re.M)]
    assert blocks and all("gpu=1" in b for b in blocks), "a GPU rule without resources: gpu=1"
    bin_dir, log = tmp_path / "bin", tmp_path / "jobs.log"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "JOBS_LOG": str(log)}
    snakemake(fresh_copy, *GPU_TARGETS, "--cores", "8", *profile, *SMOKE, env=env)
    peak = most_at_once(log)
    assert 1 < peak <= most and (most == 6 or peak > 6), f"{peak} GPU jobs ran at once"


@pytest.mark.slow
def test_the_checks_start_first_then_the_jobs_that_warm_compiles(fresh_copy, tmp_path):
    """rules/common.smk's priorities: with one GPU job in flight at a time, every check starts
    before any timing job, and the ladder, FlashAttention's bench and PyTorch attention (whose
    compiles come before their timed loops) before the other timing jobs (an H100 run whose in-flight slots were all timing jobs asleep on the device lock ran
    no check for 26 minutes)."""
    bin_dir, order = tmp_path / "bin", tmp_path / "order.log"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "JOBS_LOG": str(tmp_path / "jobs.log"),
           "ORDER_LOG": str(order)}
    snakemake(fresh_copy, *GPU_TARGETS, "fused", "float8_delayed", "adamw_master", "--cores", "8",
              "--resources", "gpu=1", *SMOKE, env=env)
    started = [line.split("/", 2)[2] for line in order.read_text().split()]  # results/<hw>/<file>
    checks = [i for i, f in enumerate(started) if f.endswith("check.csv")]
    warms = [i for i, f in enumerate(started) if f.startswith(("ladder/", "flash_attention/bench/", "attention/"))]
    rest = [i for i in range(len(started)) if i not in checks + warms]
    assert len(checks) >= 5 and warms and rest, started
    assert max(checks) < min(warms) and max(warms) < min(rest), started


def test_editing_one_report_section_reruns_only_the_report(built_copy):
    edit(built_copy / "src" / "lmperf" / "report" / "lrpe.py", "\n# edited\n")
    assert planned(built_copy) == {"report": 1}
