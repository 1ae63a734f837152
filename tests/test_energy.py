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
    nvml.NVMLError, nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM, nvml.NVML_TEMPERATURE_GPU = NVMLError, 1, 2, 0
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)

    def total_energy(handle):
        if fail_energy:
            raise NVMLError("Not Supported")
        return energy_mj[0]
    nvml.nvmlDeviceGetTotalEnergyConsumption = total_energy
    nvml.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nvml.nvmlDeviceGetPowerUsage = lambda h: 650_000
    nvml.nvmlDeviceGetClockInfo = lambda h, clock: {1: 1_700, 2: 2_619}[clock]
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 57 if sensor == 0 else -1
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
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails, and then ...
    monkeypatch.setattr(energy, "libnvml", lambda: energy.LibNVML("libnvidia-ml-not-here.so"))  # ... no driver
    with energy.meter() as m:
        ran.append(True)
    assert len(ran) == 2 and math.isnan(m.joules) and "OSError" in m.why_not


def test_without_cuda_nothing_is_measured_and_nothing_is_said():
    if torch.cuda.is_available():
        pytest.skip("a CPU-only check")
    with energy.meter() as m:
        pass
    assert math.isnan(m.joules) and math.isnan(m.mean_power_w) and m.why_not == ""


def test_a_reading_is_the_clocks_power_and_temperature_now(gpu, monkeypatch):
    nvml = fake_nvml([0])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert energy.reading() == {"sm_clock_mhz": 1_700, "mem_clock_mhz": 2_619, "power_w": 650, "temp_c": 57}

    def not_supported(handle, sensor):
        raise NVMLError("Not Supported")
    nvml.nvmlDeviceGetTemperature = not_supported  # one value this GPU does not report: NaN, the rest stand
    got = energy.reading()
    assert math.isnan(got["temp_c"]) and got["sm_clock_mhz"] == 1_700 and got["power_w"] == 650


def test_a_reading_without_nvml_is_nan_and_without_cuda_empty(gpu, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(energy, "libnvml", lambda: energy.LibNVML("libnvidia-ml-not-here.so"))
    got = energy.reading()
    assert set(got) == set(energy.READINGS) and all(math.isnan(v) for v in got.values())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert energy.reading() == {}


class FakeLib:
    """libnvidia-ml.so.1 as ctypes sees it: functions that write through their pointer arguments
    and return an NVML status."""

    def __init__(self, values):
        self.values, self.calls = values, []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            value = self.values[name]
            if isinstance(value, Exception):
                return 3  # NVML_ERROR_NOT_SUPPORTED
            if args:
                args[-1]._obj.value = value  # the last argument: byref(out)
            return 0
        return call


def test_ctypes_nvml_reads_what_pynvml_would(gpu, monkeypatch):
    lib = FakeLib({"nvmlInit_v2": None, "nvmlDeviceGetHandleByIndex_v2": 1234,
                   "nvmlDeviceGetClockInfo": 1_980, "nvmlDeviceGetPowerUsage": 512_000,
                   "nvmlDeviceGetTemperature": NotImplementedError()})
    nvml = energy.LibNVML.__new__(energy.LibNVML)
    nvml._lib = lib
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(energy, "libnvml", lambda: nvml)
    got = energy.reading()
    assert got["sm_clock_mhz"] == got["mem_clock_mhz"] == 1_980 and got["power_w"] == 512
    assert math.isnan(got["temp_c"])  # a status other than success is an NVMLError: NaN
    assert lib.calls[:2] == ["nvmlInit_v2", "nvmlDeviceGetHandleByIndex_v2"]
    with pytest.raises(energy.LibNVML.NVMLError, match="status 3"):
        nvml.nvmlDeviceGetTemperature(None, nvml.NVML_TEMPERATURE_GPU)
