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
