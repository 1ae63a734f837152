"""`make report`'s front to Snakemake: its output as it comes, less each failed job's command
line (a benchmark's command carries its whole spec, thousands of characters of configuration
JSON), and at the end one paragraph per failed job: the job, its log file and the log's last lines.

    python -m lmperf.runner snakemake --cores all report/report.md ...

Exits with Snakemake's status. Everything else Snakemake prints passes through unchanged. On a
machine without a GPU, the jobs run with torch.profiler's own log off (`job_environment`).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

TAIL_LINES = 12
# libkineto's log levels (its LoggerOutputType): VERBOSE 0, INFO 1, WARNING 2, STAGE 3, ERROR 4,
# USDT 5; above 5 it prints nothing
KINETO_QUIET = "6"
# Snakemake's error block of a failed job: "Error in rule NAME:", indented fields, `shell:` and
# the command's lines, then "(command exited with non-zero exit code)"
ERROR = re.compile(r"^Error in rule (?P<rule>\S+):")
FIELD = re.compile(r"^    (?P<key>\w+): (?P<value>.*)$")
COMMAND = re.compile(r"^(?P<head>Command ').*(?P<tail>' returned non-zero exit status \d+\.)$")


@dataclass
class Failure:
    rule: str
    fields: dict = field(default_factory=dict)

    def logs(self) -> list[str]:
        value = self.fields.get("log", "")
        value = value.split(" (check log", 1)[0]
        return [p.strip() for p in value.split(",") if p.strip()]

    def describe(self) -> str:
        wildcards = self.fields.get("wildcards", "")
        lines = [f"lmperf: job {self.rule}" + (f" ({wildcards})" if wildcards else "") + " failed"]
        for log in self.logs():
            path = Path(log)
            lines.append(f"  log: {log}")
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
                lines += [f"  | {line}" for line in tail]
        if not self.logs():
            lines.append("  (no log file: Snakemake's messages above say why)")
        return "\n".join(lines)


class Filter:
    """Snakemake's lines in, the lines to show out; the failed jobs collected."""

    def __init__(self):
        self.failures: list[Failure] = []
        self.current: Failure | None = None
        self.in_shell = False

    def feed(self, line: str) -> list[str]:
        text = line.rstrip("\n")
        match = COMMAND.match(text)
        if match:  # the RuleException's copy of the command line
            return [f"{match.group('head')}...{match.group('tail')} (the command left out: it carries the "
                    f"job's whole spec)\n"]
        match = ERROR.match(text)
        if match:
            self.current = Failure(match.group("rule"))
            self.failures.append(self.current)
            self.in_shell = False
            return [line]
        if self.current is not None:
            if self.in_shell:
                if text.strip() == "(command exited with non-zero exit code)":
                    self.in_shell = False
                    self.current = None
                    return ["    shell: (left out: the benchmark's command and its spec)\n", line]
                if text.startswith("        ") or not text.strip():
                    return []
                self.in_shell = False
                self.current = None
            elif text.startswith("    shell:"):
                self.in_shell = True
                return []
            else:
                field_match = FIELD.match(text)
                if field_match:
                    self.current.fields[field_match.group("key")] = field_match.group("value")
                elif not text.startswith("    "):
                    self.current = None
        return [line]

    def summary(self) -> str:
        return "\n\n".join(f.describe() for f in self.failures)


USAGE = "usage: python -m lmperf.runner snakemake [ARGS...]"


def job_environment(environ: dict, gpus: int) -> dict:
    """The jobs' environment: `environ`, and on a machine without a GPU (`gpus` 0) torch.profiler's
    kineto quiet. It prints `USDT: ... profiler_start` and `profiler_stop` on stderr around every
    profiled block; the only setting that hides them hides its errors too, so a GPU, where a
    failing CUPTI says why a profile came back empty, keeps its default. A KINETO_LOG_LEVEL set by
    hand wins."""
    return environ if gpus else {"KINETO_LOG_LEVEL": KINETO_QUIET, **environ}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__.strip()}")
        raise SystemExit(0)
    if not argv:
        raise SystemExit(USAGE)
    from lmperf import hardware
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env=job_environment(dict(os.environ), hardware.gpu_count()))
    shown = Filter()
    try:
        for line in proc.stdout:
            for out in shown.feed(line):
                sys.stdout.write(out)
            sys.stdout.flush()
    except KeyboardInterrupt:  # Snakemake got the same signal: wait for it to stop its jobs
        pass
    code = proc.wait()
    if shown.failures:
        print("\n" + shown.summary(), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
