"""The environment job's facts beyond the GPU's name: cuDNN's version and the clocks policy."""
import os
import stat

from lmperf.bench import env as bench_env


def fake_smi(tmp_path, monkeypatch, script: str):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_the_clocks_policy_names_the_application_default_and_max_clocks(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, 'echo "1755, 1755, 1980"\n')
    assert bench_env.gpu_clocks() == ("not locked by lmperf (GPU boost); application clock 1755 MHz "
                                      "(default 1755), SM clock max 1980 MHz")


def test_no_gpu_or_a_failing_nvidia_smi_is_none(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "exit 9\n")
    assert bench_env.gpu_clocks() == "none"
    fake_smi(tmp_path, monkeypatch, 'echo "[N/A]"\n')  # fewer fields than asked for
    assert bench_env.gpu_clocks() == "none"


def test_a_cpu_run_records_no_cudnn_and_no_clocks(monkeypatch):
    monkeypatch.setattr(bench_env, "gpu_clocks", lambda: "none")
    facts = bench_env.facts("cpu", "smoke")
    assert (facts["cudnn"], facts["clocks"]) == ("none", "none")


def test_the_cores_the_run_had_are_its_affinity(monkeypatch):
    monkeypatch.setattr(bench_env.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert bench_env.usable_cores() == 3
    monkeypatch.setattr(bench_env, "gpu_clocks", lambda: "none")
    assert bench_env.facts("cpu", "smoke")["cpu_cores_usable"] == "3"


def table_values(facts: dict) -> dict:
    """The rendered environment table's rows as {label: value}."""
    from lmperf.report import env as env_view
    table = env_view.table(facts)
    assert table[""].is_unique
    return dict(zip(table[""], table["value"]))


def test_the_table_names_the_cpu_driver_cudnn_and_clocks_from_a_fresh_environment_file(monkeypatch):
    """Each fact the section promises is a row of the table with the value the job recorded:
    the CPU's model, the machine's cores and the run's, the driver, cuDNN and the clocks policy."""
    from lmperf.report import env as env_view
    monkeypatch.setattr(bench_env, "gpu_clocks", lambda: "not locked by lmperf (GPU boost); SM clock max 1980 MHz")
    monkeypatch.setattr(bench_env, "driver_version", lambda: "580.159.04")
    monkeypatch.setattr(bench_env, "cpu_model", lambda cpuinfo=None: "AMD EPYC 9654 96-Core Processor")
    monkeypatch.setattr(bench_env.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(bench_env.os, "cpu_count", lambda: 192)
    facts = bench_env.facts("h100", "full")
    rows = table_values(facts)
    label = env_view.LABELS
    assert rows[label["cpu_model"]] == "AMD EPYC 9654 96-Core Processor"
    assert (rows[label["cpu_cores"]], rows[label["cpu_cores_usable"]]) == ("192", "16")
    assert rows[label["driver"]] == "580.159.04"
    assert rows[label["clocks"]] == "not locked by lmperf (GPU boost); SM clock max 1980 MHz"
    assert rows[label["cudnn"]] == facts["cudnn"]
    assert env_view.host(facts) == "AMD EPYC 9654 96-Core Processor, 16 of 192 cores"
    assert env_view.NOT_RECORDED not in rows.values()


def test_an_older_environment_file_says_which_required_facts_it_lacks():
    """The committed H100 environment file predates cuDNN, the clocks and the CPU's model: each
    is still a row, saying it was not recorded; the facts it has keep their values."""
    import pandas as pd
    from pathlib import Path
    from lmperf.report import env as env_view
    env = pd.read_csv(Path(__file__).parents[1] / "results" / "h100-80gb-hbm3" / "env" / "env.csv", dtype=str)
    facts = dict(zip(env["key"], env["value"]))
    rows = table_values(facts)
    label = env_view.LABELS
    for key in env_view.REQUIRED:
        assert rows[label[key]] == facts.get(key, env_view.NOT_RECORDED)
    assert rows[label["driver"]] == "580.159.04" and rows[label["cudnn"]] == env_view.NOT_RECORDED
    assert env_view.host(facts) is None
