"""bench/energy.py: the energy counter's difference, the sampled power and SM clock, and a
failing or missing NVML that says why instead of failing the timed work (a fake NVML on the
CPU; the H100's own readings are in the ladder's and e2e's rows)."""
import math
import sys
import time
import types

import pytest
import torch

from lmperf.bench import energy


class NVMLError(Exception):
    pass


def fake_nvml(energy_mj, fail_energy=False):
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError, nvml.NVML_CLOCK_SM = NVMLError, 1
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)

    def total_energy(handle):
        if fail_energy:
            raise NVMLError("Not Supported")
        return energy_mj[0]
    nvml.nvmlDeviceGetTotalEnergyConsumption = total_energy
    nvml.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nvml.nvmlDeviceGetPowerUsage = lambda h: 650_000
    nvml.nvmlDeviceGetClockInfo = lambda h, clock: 1_700 if clock == nvml.NVML_CLOCK_SM else 0
    return nvml


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_energy_is_the_counter_difference_with_power_and_clock_sampled(gpu, monkeypatch):
    counter = [1_000_000]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(counter))
    with energy.meter() as m:
        time.sleep(3 * energy.SAMPLE_S)
        counter[0] += 5_000  # 5 J of work
    assert m.joules == pytest.approx(5.0) and m.why_not == ""
    assert m.mean_power_w == 650 and m.mean_sm_clock_mhz == 1_700 and m.power_limit_w == 700


def test_an_nvml_failure_says_why_and_the_work_still_runs(gpu, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([0], fail_energy=True))
    ran = []
    with energy.meter() as m:
        ran.append(True)
    assert ran and math.isnan(m.joules) and m.why_not.startswith("energy not measured: NVMLError: Not Supported")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    with energy.meter() as m:
        ran.append(True)
    assert len(ran) == 2 and math.isnan(m.joules) and "ModuleNotFoundError" in m.why_not


def test_without_cuda_nothing_is_measured_and_nothing_is_said():
    if torch.cuda.is_available():
        pytest.skip("a CPU-only check")
    with energy.meter() as m:
        pass
    assert math.isnan(m.joules) and math.isnan(m.mean_power_w) and m.why_not == ""
