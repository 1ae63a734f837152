"""The device lock (lmperf.bench.device): a timing job has the device to itself, checks share it,
a command run through the module holds it for its whole run, and without the variable nothing
waits."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")

HOLD = """
import sys, time
from lmperf.bench import device
say = lambda text: print(text, flush=True)
device.take(shared=sys.argv[1] == "shared", say=say, warming=sys.argv[1] == "warming")
print("held", time.monotonic(), flush=True)
if float(sys.argv[2]) < 0:  # until told (a line on stdin), a minute at most
    import select
    select.select([sys.stdin], [], [], 60.0)
else:
    time.sleep(float(sys.argv[2]))
if sys.argv[1] == "warming":  # warmed: now the timed cases, the device to itself
    device.alone(say=say)
    print("alone", time.monotonic(), flush=True)
    time.sleep(float(sys.argv[2]))
print("released", time.monotonic(), flush=True)
"""


def _start(tmp_path: Path, mode: str, hold_s: float, lock: Path | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC, "TRITON_INTERPRET": "1"}
    env.pop("LMPERF_DEVICE_LOCK", None)
    if lock is not None:
        env["LMPERF_DEVICE_LOCK"] = str(lock)
    return subprocess.Popen([sys.executable, "-c", HOLD, mode, str(hold_s)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _until(proc: subprocess.Popen, text: str) -> list[str]:
    """Wait until `proc` prints a line that starts with `text`; the lines it printed until then."""
    lines = []
    while not lines or not lines[-1].startswith(text):
        line = proc.stdout.readline()
        assert line, f"exited before printing {text!r}: {proc.stderr.read()}"
        lines.append(line.strip())
    return lines


def _holding(proc: subprocess.Popen) -> list[str]:
    """Wait until `proc` holds the device; the lines it printed until then."""
    return _until(proc, "held")


def _release(proc: subprocess.Popen) -> None:
    """Tell a process that holds the device until told (hold_s < 0) to let it go."""
    proc.stdin.write("done\n")
    proc.stdin.flush()


def _times(proc: subprocess.Popen, before: list[str] = ()) -> tuple[float, float, str]:
    out, err = proc.communicate(timeout=120)
    out = "\n".join([*before, out])
    assert proc.returncode == 0, err
    held = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("held"))
    released = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("released"))
    return held, released, out




@pytest.mark.parametrize("second", ["exclusive", "shared"])
def test_a_timing_job_has_the_device_to_itself(tmp_path, second):
    lock = tmp_path / ".cache" / "device.lock"
    first = _start(tmp_path, "exclusive", -1, lock)  # holds it until told
    before = _holding(first)
    other = _start(tmp_path, second, 0.1, lock)
    waited = _until(other, "waiting for the device")
    _release(first)
    held1, released1, _ = _times(first, before)
    held2, _, _ = _times(other, waited)
    assert held2 >= released1 - 0.05, (held1, released1, held2)


def test_checks_share_the_device_and_a_timing_job_waits_for_them(tmp_path):
    lock = tmp_path / "device.lock"
    a = _start(tmp_path, "shared", -1, lock)
    b = _start(tmp_path, "shared", -1, lock)
    before_a, before_b = _holding(a), _holding(b)  # both at once: b holds it while a does
    timing = _start(tmp_path, "exclusive", 0.1, lock)
    waited = _until(timing, "waiting for the device")
    _release(a)
    _release(b)
    (ha, ra, _), (hb, rb, _), (ht, _, _) = _times(a, before_a), _times(b, before_b), _times(timing, waited)
    assert hb < ra and ha < rb, "two checks held the device at once"
    assert ht >= max(ra, rb) - 0.05


def test_a_timing_job_warms_beside_the_checks_and_times_alone(tmp_path):
    """Its warm-up (compiling: nothing timed) holds the device with a check; its timed cases wait
    until the check is done, and a second warmed job's wait for the device alone does not hold up
    the first's (each gives up its shared hold while it waits)."""
    lock = tmp_path / "device.lock"
    check = _start(tmp_path, "shared", -1, lock)  # holds it until both warm-ups do
    before_c = _holding(check)
    a = _start(tmp_path, "warming", 1.0, lock)
    b = _start(tmp_path, "warming", 1.0, lock)
    before_a, before_b = _holding(a), _holding(b)
    check.stdin.write("done\n")
    check.stdin.flush()
    (hc, rc, _), (ha, ra, out_a), (hb, rb, out_b) = _times(check, before_c), _times(a, before_a), _times(b, before_b)
    assert ha < rc and hb < rc, "a warm-up waited for a check"
    alone = lambda out: float(next(line.split()[1] for line in out.splitlines() if line.startswith("alone")))
    aa, ab = alone(out_a), alone(out_b)
    assert aa >= rc - 0.05 and ab >= rc - 0.05, "timed beside a check"
    assert ab >= ra - 0.05 or aa >= rb - 0.05, "two timing jobs alone at once"
    assert "waiting for the device to itself" in out_a + out_b


def test_without_the_variable_nothing_waits(tmp_path):
    first = _start(tmp_path, "exclusive", -1, None)  # holds it until told
    before1 = _holding(first)
    second = _start(tmp_path, "exclusive", 0.1, None)
    before2 = _holding(second)  # while the first holds it
    _release(first)
    held1, released1, _ = _times(first, before1)
    held2, _, out2 = _times(second, before2)
    assert held2 < released1 and "waiting" not in out2


def test_a_command_run_through_the_module_holds_the_device_until_it_ends(tmp_path):
    lock = tmp_path / "device.lock"
    env = {**os.environ, "PYTHONPATH": SRC, "LMPERF_DEVICE_LOCK": str(lock)}
    child = ("import os, sys, time; print('inherited', os.environ.get('LMPERF_DEVICE_LOCK'), flush=True); "
             "print('held', time.monotonic(), flush=True); sys.stdin.readline(); "
             "print('released', time.monotonic(), flush=True)")
    wrapped = subprocess.Popen([sys.executable, "-m", "lmperf.bench.device", "--", sys.executable, "-c", child],
                               env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    before = _holding(wrapped)
    timing = _start(tmp_path, "exclusive", 0.1, lock)
    waited = _until(timing, "waiting for the device")  # the command holds it until told
    _release(wrapped)
    held1, released1, out1 = _times(wrapped, before)
    held2, _, _ = _times(timing, waited)
    assert "inherited None" in out1  # its ranks do not wait for the lock their launcher holds
    assert held2 >= released1 - 0.05


def test_the_module_without_a_command_says_how_to_use_it():
    proc = subprocess.run([sys.executable, "-m", "lmperf.bench.device"], env={**os.environ, "PYTHONPATH": SRC},
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "usage" in proc.stderr


def test_the_lock_file_is_on_the_local_temporary_folder_one_per_working_directory(tmp_path):
    import tempfile

    from lmperf.bench import device
    a, b = device.lock_path(tmp_path / "a"), device.lock_path(tmp_path / "b")
    assert a != b and a == device.lock_path(tmp_path / "a" / ".." / "a")
    assert os.path.dirname(a) == tempfile.gettempdir()


def test_an_interrupt_while_waiting_ends_the_job_with_a_line_not_a_traceback(tmp_path, monkeypatch):
    import fcntl

    from lmperf.bench import device
    path = str(tmp_path / "device.lock")
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another job holds the device
    said = []

    def interrupted(seconds):
        raise KeyboardInterrupt
    monkeypatch.setattr(device.time, "sleep", interrupted)
    monkeypatch.setenv(device.ENV, path)
    with pytest.raises(SystemExit) as stop:
        device.take(shared=False, say=said.append)
    assert stop.value.code == 130 and said[-1] == "interrupted while waiting for the device: nothing measured"
    os.close(holder)
