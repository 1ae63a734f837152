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
(no pynvml, a GPU without an energy counter) leaves NaN and says why in `why_not`, never failing
the work it measures.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import threading

SAMPLE_S = 0.05  # power and SM clock sampling period (NVML's power reading is itself averaged)


class Meter:
    """What `meter` measured (NaN where it could not)."""
    joules: float = math.nan
    mean_power_w: float = math.nan
    mean_sm_clock_mhz: float = math.nan
    power_limit_w: float = math.nan
    why_not: str = ""


def _device():
    """(pynvml, the NVML handle of this process's current CUDA device), or None without CUDA."""
    import torch
    if not torch.cuda.is_available():
        return None
    import pynvml
    pynvml.nvmlInit()
    index = torch.cuda.current_device()
    with contextlib.suppress(Exception):  # CUDA_VISIBLE_DEVICES renumbers CUDA's devices, not NVML's
        index = torch.cuda._get_nvml_device_index(index)
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)


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
