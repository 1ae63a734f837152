"""The cheats that tools taking users' kernels have met, each caught by the contenders' attention
check (bench/contenders.py, bench/contender_attention.py): the contender's process builds its
inputs from a seed and sends back only what the contender returned; the job's process, which
never imports the contender, rebuilds the inputs, computes float64 and decides.

The fixtures (tests/fixtures/contenders_check/) are the project's own: one writes into its inputs,
one looks for the reference among live objects or in freed memory, one tampers with lmperf's
check in its process and prints a fake row, one poisons the result channel, one returns a single
NaN. (The side-stream and roofline cheats need a GPU: tests/test_contenders.py.)"""
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from lmperf.bench import contender_attention

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "contenders_check"
CHEATS = ("writes_inputs", "finds_reference", "tampers", "nan_attention", "poisons_reply")
SPEC = {"contenders": {name: str(FIXTURES / f"{name}.py") for name in CHEATS},
        "kinds": ["pytorch"], "course": {"dtypes": ["fp32"], "shapes": [[2, 128, 16]]},
        "dtypes": ["fp32"], "causal": [True], "shapes": [[2, 40, 16], [2, 48, 16], [2, 56, 16]],
        "properties": ["gqa"], "gqa_shape": [1, 2, 1, 32, 16], "property_shape": [2, 2, 32, 16],
        "property_dtype": "fp32", "time_limit_s": 120, "workers": 1}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """The check over every cheat, the processes that imported `tampers` recorded (MARKERS), and
    the job's own process id."""
    tmp = tmp_path_factory.mktemp("cheats")
    markers = tmp / "markers"
    markers.mkdir()
    out = tmp / "attention.csv"
    proc = subprocess.Popen([sys.executable, "-m", "lmperf.bench.contenders", "attention", "--spec", json.dumps(SPEC),
                             "--out", str(out), "--hw", "cpu"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "MARKERS": str(markers)})
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    return {"rows": pd.read_csv(out), "markers": markers, "pid": proc.pid, "log": stdout + stderr}


def _case(rows: pd.DataFrame, case_id: str) -> pd.DataFrame:
    case = rows[rows["case_id"] == case_id]
    assert len(case), case_id
    return case.set_index("metric", drop=False) if case["status"].iloc[0] == "ok" else case


def _course_passed(case: pd.DataFrame) -> pd.Series:
    return case["course_passed"].astype(str).str.lower().eq("true")


def test_a_contender_that_writes_into_its_inputs_is_judged_on_the_inputs_it_was_given(checked):
    """Zeroed inputs and zeros returned: right for the inputs it left, wrong for those it got,
    in the values check and in the grouped-query property (whose reference came after the call)."""
    values = _case(checked["rows"], "writes_inputs_pytorch-fp32-causal-2x128x16")
    assert (values["status"] == "ok").all() and not _course_passed(values)["out_max_abs_err"]
    gqa = _case(checked["rows"], "writes_inputs_pytorch-gqa-1x2x1x32x16")
    assert gqa["status"].iloc[0] == "ok" and str(gqa["passed"].iloc[0]).lower() == "false"


def test_a_contender_that_looks_for_the_reference_finds_none(checked):
    """Its process never computes a reference: neither a live one nor freed memory holds it."""
    values = _case(checked["rows"], "finds_reference_pytorch-fp32-causal-2x128x16")
    wrong = values["status"].iloc[0] == "wrong"  # garbage memory holding a NaN, or its L found nowhere
    assert wrong or not _course_passed(values)["out_max_abs_err"], values[["metric", "status", "course_ratio"]]


def test_tampering_with_the_check_in_its_process_changes_no_verdict(checked):
    """Its patches of lmperf's error, tolerance, output-check and row functions, and its fake row
    printed to the log, leave it wrong: the verdict is computed in the job's process, which never
    imported it."""
    rows = checked["rows"]
    values = _case(rows, "tampers_pytorch-fp32-causal-2x128x16")
    assert (values["status"] == "ok").all() and not _course_passed(values)["out_max_abs_err"]
    assert float(values.loc["out_max_abs_err", "course_ratio"]) > 1
    assert len(rows[rows["case_id"] == "tampers_pytorch-fp32-causal-2x128x16"]) == 5  # its own rows, none added
    imported = {int(m.name.split("-")[1]) for m in checked["markers"].glob("tampers-*")}
    assert imported and checked["pid"] not in imported


def test_a_poisoned_reply_is_never_unpickled(checked):
    """Its process sends a pickle that would run code on loading and claim `ok`: the job's process
    reads it as data only, so the case is `failed` and the marker file is never touched."""
    rows = checked["rows"].drop_duplicates("case_id")
    poisoned = rows[rows["contender"] == "poisons_reply"]
    assert len(poisoned) == 5 and (poisoned["status"] == "failed").all(), poisoned[["case_id", "status", "message"]]
    assert not (checked["markers"] / "poisoned").exists()


def test_a_nan_is_wrong_wherever_it_is(checked):
    """One NaN in the output is a `wrong` row; one in L or in dK fails that quantity (the
    reference holds none); the same contender is right where it returns none."""
    rows = checked["rows"]
    out = _case(rows, "nan_attention_pytorch-fp32-causal-2x40x16")
    assert out["status"].iloc[0] == "wrong" and "NaN" in out["message"].iloc[0]
    for n, quantity in ((48, "lse"), (56, "dk")):
        case = _case(rows, f"nan_attention_pytorch-fp32-causal-2x{n}x16")
        passed = case["passed"].astype(str).str.lower().eq("true")
        failing = {m.removesuffix("_max_abs_err") for m in case.index[~(passed | _course_passed(case))]}
        assert failing == {quantity}, case[["metric", "median", "passed", "course_passed"]]
    right = _case(rows, "nan_attention_pytorch-fp32-causal-2x128x16")
    assert _course_passed(right).all()


def test_the_judge_reads_a_reply_as_data_alone(tmp_path):
    """decode refuses any object but plain data: an object whose unpickling runs code is refused
    before it runs; a reply of another form is refused; an empty one is named."""
    class Evil:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))
    buffer = io.BytesIO()
    torch.save({"device": "cpu", "stage": "forward", "raised": None, "tensors": {}, "described": {},
                "notes": {"x": Evil()}}, buffer)
    for payload in (buffer.getvalue(), pickle.dumps([{"status": "ok", "x": Evil()}])):
        with pytest.raises(contender_attention.Unreadable, match="not plain data"):
            contender_attention.decode(payload)
    assert not (tmp_path / "ran").exists()
    plain = io.BytesIO()
    torch.save([{"status": "ok", "passed": True}], plain)
    with pytest.raises(contender_attention.Unreadable, match="another form"):
        contender_attention.decode(plain.getvalue())
    with pytest.raises(contender_attention.Unreadable, match="no reply"):
        contender_attention.decode(b"")


def test_both_processes_build_the_same_inputs_from_a_seed():
    """What lets the judge compute the reference from inputs the contender never held."""
    case = {"check": "fresh", "shape": "2x2x33x16", "dtype": "bf16"}
    script = ("import sys, json, torch; from lmperf.bench.contender_attention import inputs; "
              "t = inputs(json.loads(sys.argv[1]), 1234); "
              "print(json.dumps({k: float(v.double().sum()) for k, v in t.items()}))")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(case)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    here = {k: float(v.double().sum()) for k, v in contender_attention.inputs(case, 1234).items()}
    assert json.loads(proc.stdout) == here and set(here) == {"q", "k", "v", "grad_out", "q2", "k2", "v2"}
    assert contender_attention.inputs(case, 1235)["q"].double().sum() != here["q"]
