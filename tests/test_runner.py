"""make report's front to Snakemake (lmperf.runner): a failed job is named with its log file and
the log's last lines, and its command line, which carries the job's whole spec, is not printed."""
import subprocess
import sys
import textwrap
from pathlib import Path

from lmperf import runner

SPEC = '{"grid": "' + "x" * 400 + '"}'


def test_a_failed_job_is_named_with_its_log_and_never_its_spec(tmp_path):
    (tmp_path / "Snakefile").write_text(textwrap.dedent(f"""
        rule ok:
            output: "ok.txt"
            shell: "touch {{output}}"

        rule bench:
            input: "ok.txt"
            output: "out.csv"
            log: "logs/bench.log"
            params: spec={SPEC!r}
            shell: "mkdir -p logs; echo measuring > {{log}}; python3 -c 'import sys; sys.exit(\\"error: the case broke\\")' --spec {{params.spec:q}} 2>> {{log}}"
        """))
    snakemake = Path(sys.executable).with_name("snakemake")
    proc = subprocess.run([sys.executable, "-m", "lmperf.runner", str(snakemake), "--cores", "1", "out.csv"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "x" * 100 not in proc.stdout + proc.stderr
    summary = proc.stdout[proc.stdout.index("lmperf: job bench failed"):]
    assert "log: logs/bench.log" in summary and "error: the case broke" in summary and "measuring" in summary


def test_lines_outside_a_failed_jobs_command_pass_unchanged():
    shown = runner.Filter()
    lines = ["Building DAG of jobs...\n", "Error in rule x:\n", "    jobid: 3\n", "    log: a.log, b.log (check log file(s) for error details)\n",
             "    shell:\n", "        python -m lmperf.bench.x --spec '{...}'\n",
             "        (command exited with non-zero exit code)\n", "Shutting down\n"]
    out = [o for line in lines for o in shown.feed(line)]
    assert out[0] == lines[0] and out[-1] == lines[-1] and not any("--spec" in o for o in out)
    assert [f.logs() for f in shown.failures] == [["a.log", "b.log"]]


PROFILED = """
import torch
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]) as prof:
    torch.ones(8).sum()
print("operators recorded:", len(prof.key_averages()))
"""


def test_jobs_on_a_machine_without_a_gpu_profile_without_the_profilers_own_lines(monkeypatch, capsys):
    """kineto's `USDT: ... profiler_start` lines stay out of what make report prints on a CPU (the
    profile itself is still recorded); a GPU machine's jobs keep kineto's default, and a
    KINETO_LOG_LEVEL set by hand wins."""
    from lmperf import hardware

    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    monkeypatch.setattr(hardware, "gpu_count", lambda: 0)
    assert runner.main([sys.executable, "-c", PROFILED]) == 0
    out = capsys.readouterr().out
    assert "profiler_start" not in out and "USDT" not in out, out
    assert int(out.split("operators recorded:")[1].split()[0]) > 0
    assert "KINETO_LOG_LEVEL" not in runner.job_environment({"PATH": "/bin"}, gpus=2)
    assert runner.job_environment({"KINETO_LOG_LEVEL": "2"}, gpus=0) == {"KINETO_LOG_LEVEL": "2"}

