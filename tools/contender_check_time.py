"""Time the contenders' attention check job, one contender at a time: the wall time of
`python -m lmperf.bench.contenders attention` for each contender path given, at a scale of the
config's `contenders_check`, with its cases, their statuses and the processes the job started.

    python tools/contender_check_time.py path/to/their-repo [path/to/other/adapters.py ...] \
        [--scale full] [--kinds triton pytorch] [--limit 60] [--cold]

Each contender runs alone in a job of its own, with the spec the workflow would give it
(lmperf.contenders.study_spec), its CSV and log in a temporary folder (or `--keep DIR`). The
processes are those seen below the job's process while it ran (polled every 0.1 s: a process
that lives shorter may be missed). Exits 1 when a job fails or, with `--limit`, when a contender's
check takes longer than that many seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def descendants(pid: int) -> set[int]:
    """The processes below `pid` now (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def time_check(name: str, source: str, scale: str, kinds: list[str] | None, folder: Path, cold: bool = False) -> dict:
    """One contender's check job: its wall time, cases, statuses and processes seen. `cold`: with
    empty compile caches of its own (a contender checked for the first time)."""
    from lmperf import contenders
    from lmperf.report.render import load_config
    config = load_config(overrides={"contenders": {name: source}})
    spec = json.loads(contenders.study_spec(config, scale, "attention"))
    if kinds:
        spec["kinds"] = kinds
    out, log = folder / f"{name}.csv", folder / f"{name}.log"
    import torch
    hw = "timing" if torch.cuda.is_available() else "cpu"  # a results folder's name: a GPU's wants CUDA
    cmd = [sys.executable, "-m", "lmperf.bench.contenders", "attention", "--spec", json.dumps(spec),
           "--out", str(out), "--hw", hw, "--log", str(log)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    if cold:
        from lmperf.failures import COMPILE_CACHE_VARS
        env.update({var: str(folder / f"{name}-cache" / sub) for var, sub in COMPILE_CACHE_VARS.items()})
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    stderr: list[str] = []
    import threading
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)
    reader.start()
    while proc.poll() is None:
        seen |= descendants(proc.pid)
        time.sleep(0.1)
    wall = time.monotonic() - t0
    reader.join(10)
    result = {"contender": name, "wall_s": wall, "returncode": proc.returncode, "processes": len(seen),
              "cases": 0, "statuses": {}, "log": str(log)}
    if out.is_file():
        import pandas as pd
        cases = pd.read_csv(out).drop_duplicates("case_id")
        result.update(cases=len(cases), statuses=dict(Counter(cases["status"])))
    if proc.returncode != 0:
        result["error"] = "".join(stderr)[-2000:]
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", help="contender paths: a repository, an adapters file or a module")
    p.add_argument("--scale", default="full", help="the config's contenders_check scale (default %(default)s)")
    p.add_argument("--kinds", nargs="+", choices=["triton", "pytorch"], help="only these attention adapters")
    p.add_argument("--limit", type=float, help="exit 1 when a contender's check takes longer (seconds)")
    p.add_argument("--keep", type=Path, help="write the CSVs and logs here instead of a temporary folder")
    p.add_argument("--cold", action="store_true",
                   help="each job with empty compile caches of its own (Triton's, Inductor's), as a contender's first "
                        "check; without it, the caches the environment names")
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    from lmperf import contenders
    named = contenders.normalise(",".join(args.sources))
    bad = False
    with tempfile.TemporaryDirectory(prefix="contender-check-time-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"{'contender':<36} {'wall s':>8} {'cases':>6} {'processes':>9}  statuses")
        for name, source in named.items():
            r = time_check(name, source, args.scale, args.kinds, folder, args.cold)
            statuses = ", ".join(f"{s} {n}" for s, n in sorted(r["statuses"].items()))
            print(f"{name:<36} {r['wall_s']:>8.1f} {r['cases']:>6} {r['processes']:>9}  {statuses}", flush=True)
            if r["returncode"] != 0:
                print(f"  the job failed (exit {r['returncode']}; log {r['log']}):\n{r['error']}", flush=True)
                bad = True
            elif args.limit is not None and r["wall_s"] > args.limit:
                print(f"  over the limit of {args.limit:g} s", flush=True)
                bad = True
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
