"""How the contenders' attention check runs (bench/contenders.py, bench/isolation.py): each
contender's cases in a few long-lived processes of its own, a shape class whole in one of them
(so that what its first case compiles serves the rest), the properties after the values and
compiles last, at one small shape a kind."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

from lmperf.bench import contenders as bench

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "contenders_check"


def test_each_shape_class_runs_in_one_process_of_its_contenders_own(tmp_path):
    """Two processes for 18 cases of 12 shape classes: every class in one of them, neither the
    job's own; the job says how many cases ran in how many processes."""
    markers = tmp_path / "markers"
    markers.mkdir()
    spec = {"contenders": {"rec": str(FIXTURES / "records_classes.py")}, "kinds": ["pytorch"],
            "course": {"dtypes": ["fp32"], "shapes": [[1, 128, 16], [2, 128, 16], [1, 256, 32]]},
            "dtypes": ["fp32", "fp16"], "causal": [False, True], "shapes": [[1, 17, 16], [2, 17, 16], [1, 33, 32]],
            "properties": [], "time_limit_s": 120, "workers": 2}
    out = tmp_path / "attention.csv"
    proc = subprocess.Popen([sys.executable, "-m", "lmperf.bench.contenders", "attention", "--spec", json.dumps(spec),
                             "--out", str(out), "--hw", "cpu"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "MARKERS": str(markers)})
    _, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    rows = pd.read_csv(out).drop_duplicates("case_id")
    assert len(rows) == 18 and (rows["status"] == "ok").all(), rows[["case_id", "status", "message"]]
    seen: dict[tuple, set] = {}
    for line in (markers / "classes").read_text().splitlines():
        pid, *cls = line.split()
        seen.setdefault(tuple(cls), set()).add(int(pid))
    assert len(seen) == 12 and all(len(pids) == 1 for pids in seen.values()), seen
    pids = set().union(*seen.values())
    assert len(pids) == 2 and proc.pid not in pids
    # and when each process sent its last reply: where the contender's time went
    done = re.search(r"\[rec\] 18 cases in 2 processes of its own, ([\d.]+) s; their last replies at ([\d.]+), ([\d.]+) s",
                     stderr)
    assert done, stderr[-3000:]
    assert float(done[2]) <= float(done[3]) <= float(done[1])


def test_a_contenders_cases_run_by_shape_class_values_first_compiles_last():
    from lmperf.report.render import load_config
    spec = json.loads(__import__("lmperf.contenders", fromlist=["x"]).study_spec(
        {**load_config(), "contenders": {"c": str(FIXTURES / "records_classes.py")}}, "full", "attention"))
    cases = sorted(bench.attention_cases(spec), key=bench.shape_class)
    for kind in ("triton", "pytorch"):
        mine = [c for c in cases if c["kind"] == kind]
        checks = [c["check"] for c in mine]
        assert checks[-1] == "compiles" and set(checks[:-4]) == {"values"}
        classes = [bench.shape_class(c) for c in mine if c["check"] == "values"]
        assert classes == sorted(classes)  # a class's cases follow one another
    compiles = next(c for c in cases if c["check"] == "compiles")
    assert compiles["shape"] == f"1x1x128x{spec['property_shape'][-1]}"  # one small shape a kind
    assert bench.compile_shape({**spec, "compile_shape": [1, 2, 256, 64]}) == [1, 2, 256, 64]
