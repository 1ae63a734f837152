"""The energy a GPU spends on timed work, from NVML (the driver's management library, through
`pynvml` of the nvidia-ml-py package, which torch.cuda's power and clock queries use too):
the GPU's energy counter (millijoules since the driver loaded) read before and after, and its
power draw and SM clock sampled every `SAMPLE_S` seconds in a thread in between. Beside the
power limit it says whether a step is power-bound: a step that draws the limit runs at a lower
clock, and every byte or FLOP saved then saves time too.

    with energy.meter() as m:   # this process's CUDA device; does nothing without one
        work()                  # ending with the device synchronized
    m.joules, m.mean_power_w, m.mean_sm_clock_mhz, m.power_limit_w, m.why_not

The counter covers the whole GPU, idle time included: a step that waits on the host pays for
the idle GPU too. Without CUDA every value is NaN and `why_not` is empty; a failure of NVML
(no NVML library, a GPU without an energy counter) leaves NaN and says why in `why_not`, never
failing the work it measures.

`reading()` is the GPU's state at one moment, for the rows of every timed case
(bench/timing.py's `window` reads it as a case's timed work starts and ends, outside the clock):

    energy.reading()   # {"sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c"}; {} without CUDA

Without pynvml, NVML is reached through ctypes on the driver's own libnvidia-ml.so.1
(`LibNVML`: the same calls under the same names).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import statistics
import threading

from lmperf import hardware

SAMPLE_S = 0.05  # power and SM clock sampling period (NVML's power reading is itself averaged)


class Meter:
    """What `meter` measured (NaN where it could not)."""
    joules: float = math.nan
    mean_power_w: float = math.nan
    mean_sm_clock_mhz: float = math.nan
    power_limit_w: float = math.nan
    why_not: str = ""


class LibNVML:
    """The NVML calls lmperf makes, through ctypes on the driver's libnvidia-ml.so.1, named and
    numbered as pynvml names them (NVML's nvml.h): for a machine whose Python has no pynvml."""
    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2

    class NVMLError(Exception):
        pass

    def __init__(self, path: str = "libnvidia-ml.so.1"):
        self._lib = ctypes.CDLL(path)

    def _call(self, name: str, *args) -> None:
        status = getattr(self._lib, name)(*args)
        if status != 0:  # NVML_SUCCESS
            raise self.NVMLError(f"{name} returned NVML status {status}")

    def _value(self, name: str, handle, *args, kind=ctypes.c_uint) -> int:
        out = kind()
        self._call(name, handle, *args, ctypes.byref(out))
        return out.value

    def nvmlInit(self) -> None:
        self._call("nvmlInit_v2")

    def nvmlDeviceGetHandleByIndex(self, index: int):
        handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        return handle

    def nvmlDeviceGetClockInfo(self, handle, clock: int) -> int:  # MHz
        return self._value("nvmlDeviceGetClockInfo", handle, ctypes.c_int(clock))

    def nvmlDeviceGetPowerUsage(self, handle) -> int:  # mW
        return self._value("nvmlDeviceGetPowerUsage", handle)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle) -> int:  # mW
        return self._value("nvmlDeviceGetEnforcedPowerLimit", handle)

    def nvmlDeviceGetTemperature(self, handle, sensor: int) -> int:  # degrees C
        return self._value("nvmlDeviceGetTemperature", handle, ctypes.c_int(sensor))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:  # mJ
        return self._value("nvmlDeviceGetTotalEnergyConsumption", handle, kind=ctypes.c_ulonglong)


@functools.cache
def libnvml() -> LibNVML:
    return LibNVML()


def _nvml():
    """pynvml, or without it NVML through ctypes (`LibNVML`); raises where neither loads."""
    try:
        import pynvml
    except ImportError:
        return libnvml()
    return pynvml


def _device():
    """(NVML, the NVML handle of this process's current CUDA device), or None without CUDA."""
    import torch
    if not torch.cuda.is_available():
        return None
    nvml = _nvml()
    nvml.nvmlInit()
    index = torch.cuda.current_device()
    with contextlib.suppress(Exception):  # CUDA_VISIBLE_DEVICES renumbers CUDA's devices, not NVML's
        index = torch.cuda._get_nvml_device_index(index)
    return nvml, nvml.nvmlDeviceGetHandleByIndex(index)


@contextlib.contextmanager
def meter():
    """Measure the energy, mean power and mean SM clock of the block's work (module docstring)."""
    m = Meter()
    try:
        device = _device()
        if device is not None:
            nvml, handle = device
            start_mj = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            m.power_limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3
    except Exception as exc:  # noqa: BLE001  (the work's timings stand without it)
        m.why_not, device = f"energy not measured: {type(exc).__name__}: {exc}"[:200], None
    if device is None:
        yield m
        return
    samples: list[tuple[float, float]] = []  # (W, MHz)
    stop = threading.Event()

    def sample():
        while True:
            with contextlib.suppress(nvml.NVMLError):
                samples.append((nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                                nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
            if stop.wait(SAMPLE_S):
                return
    thread = threading.Thread(target=sample, name="energy-meter", daemon=True)
    thread.start()
    try:
        yield m
    finally:
        stop.set()
        thread.join()
        try:
            m.joules = (nvml.nvmlDeviceGetTotalEnergyConsumption(handle) - start_mj) / 1e3
        except nvml.NVMLError as exc:
            m.why_not = f"energy not measured: {exc}"[:200]
        if samples:
            m.mean_power_w = statistics.fmean(w for w, _ in samples)
            m.mean_sm_clock_mhz = statistics.fmean(c for _, c in samples)


READINGS = hardware.READINGS


def reading() -> dict[str, float]:
    """The GPU's SM clock and memory clock (MHz), power draw (W, NVML's reading: the driver's own
    short average) and temperature (degrees C) now, of this process's CUDA device: a few NVML
    queries and no synchronisation, so it never waits on the device's queue. {} without CUDA;
    NaN for what NVML could not read (no NVML library, a value this GPU does not report)."""
    try:
        device = _device()
    except Exception:  # noqa: BLE001  (no NVML: the rows say nothing, the timings stand)
        return dict.fromkeys(READINGS, math.nan)
    if device is None:
        return {}
    nvml, handle = device

    def read(query, scale: float = 1.0) -> float:
        try:
            return query() / scale
        except Exception:  # noqa: BLE001  (one value this GPU does not report)
            return math.nan
    return {"sm_clock_mhz": read(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": read(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
            "power_w": read(lambda: nvml.nvmlDeviceGetPowerUsage(handle), 1e3),
            "temp_c": read(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))}
