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
