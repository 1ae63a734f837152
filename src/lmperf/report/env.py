"""Environment: the machine and libraries of `results/<hw>/env/env.csv`, and per section the
commits its rows were measured at, whether its code has changed since (report/freshness.py) and
the GPU minutes they took."""
from __future__ import annotations

import pandas as pd

from lmperf.report import freshness
from lmperf.report.format import unavailable
from lmperf.report.sections import DEEP

LABELS = {"gpu": "GPU", "gpu_memory_gib": "GPU memory (GiB)", "gpu_multiprocessors": "GPU SMs",
          "driver": "NVIDIA driver", "cuda": "CUDA (torch build)", "cudnn": "cuDNN",
          "clocks": "GPU clocks", "torch": "torch",
          "triton": "triton", "python": "Python", "cpu": "CPU", "cpu_model": "CPU model",
          "cpu_cores": "CPU cores (logical)", "cpu_cores_usable": "CPU cores the run had",
          "cpu_threads": "CPU threads (torch)",
          "os": "OS", "commit": "git commit (at measurement)", "measured_at": "measured at",
          "scale": "scale", "hw": "results folder"}


# What the table names on every machine, each a row even where an environment file written
# before it was recorded lacks it (its value then says so): the host CPU (many rows are
# host-bound), the driver, cuDNN and the clocks policy.
REQUIRED = ("gpu", "driver", "cuda", "cudnn", "clocks", "cpu_model", "cpu_cores", "cpu_cores_usable")
NOT_RECORDED = "not recorded (the environment file predates it)"


def table(facts: dict) -> pd.DataFrame:
    """The environment table: one row a recorded fact, in the file's order, then a row for each
    REQUIRED fact the file lacks, saying it was not recorded."""
    rows = [*facts.items(), *((k, NOT_RECORDED) for k in REQUIRED if k not in facts)]
    return pd.DataFrame([{"": LABELS.get(k, k), "value": v} for k, v in rows])


def host(facts: dict) -> str | None:
    """The host CPU in a phrase ('AMD EPYC 7763 64-Core Processor, 16 of 128 cores'), or None
    where the environment file does not name its model."""
    model = facts.get("cpu_model")
    if not model:
        return None
    usable, cores = facts.get("cpu_cores_usable"), facts.get("cpu_cores")
    known = lambda v: v not in (None, "?", "")
    if known(usable) and known(cores) and usable != cores:
        return f"{model}, {usable} of {cores} cores"
    count = usable if known(usable) else cores
    return f"{model}, {count} cores" if known(count) else model


def device(facts: dict) -> str:
    """What the rows were measured on, as the section's first line names it: the GPU and its
    memory ('NVIDIA H200 (139.8 GiB)'), or on a machine without one (a CPU run: `gpu` none) the
    CPU's model and logical cores ('AMD EPYC (2 cores, no GPU)'; the architecture where an older
    environment file has no model)."""
    gpu = facts.get("gpu")
    if gpu == "none" or (gpu is None and facts.get("hw") == "cpu"):
        cpu = facts.get("cpu_model") or facts.get("cpu") or "a CPU"
        cores = facts.get("cpu_cores")
        return f"{cpu} ({f'{cores} cores, ' if cores not in (None, '?') else ''}no GPU)"
    memory = facts.get("gpu_memory_gib")
    return f"{gpu or '?'}{f' ({memory} GiB)' if memory is not None else ''}"


def measured_seconds(frames: dict[str, pd.DataFrame]) -> dict[str, float]:
    """Per section, the sum of the per-case wall times in its CSVs (process start-up excluded)."""
    return {section: float(df.drop_duplicates(["study", "case_id"])["wall_s"].sum())
            for section, df in frames.items() if not df.empty and "wall_s" in df}


def run_span_seconds(frames: dict[str, pd.DataFrame]) -> float | None:
    """The wall time of the run that measured these rows, start-up, compiles and gaps between
    jobs included: from the earliest job's start to the latest job's end. A process stamps every
    row it writes with its start (`measured_at`, bench/common.py's provenance), so a job is the
    rows of one `measured_at` and ends its cases' wall times after it. None when the rows come
    from more than one commit (several runs: their span would count the time between them)."""
    frames = [df for df in frames.values() if not df.empty and {"measured_at", "wall_s", "commit"} <= set(df)]
    if not frames or len(commits(frames)) != 1:
        return None
    rows = pd.concat([df.drop_duplicates(["measured_at", "case_id"] if "case_id" in df else None)
                      [["measured_at", "wall_s"]] for df in frames], ignore_index=True)
    rows["start"] = pd.to_datetime(rows["measured_at"], utc=True, errors="coerce")
    rows["wall_s"] = pd.to_numeric(rows["wall_s"], errors="coerce").fillna(0)
    jobs = rows.dropna(subset=["start"]).groupby("start")["wall_s"].sum()
    if jobs.empty:
        return None
    end = (jobs.index + pd.to_timedelta(jobs.to_numpy(), unit="s")).max()
    return float((end - jobs.index.min()).total_seconds())


def run_minutes(frames: dict[str, pd.DataFrame], deep: bool = False) -> float | None:
    """The standard run's wall time in minutes (`run_span_seconds` over every section's rows but
    the deep target's and env's), or with `deep` the deep target's: the two run apart (`make
    report`, `make report-deep`), so one span across both would count the time between them."""
    span = run_span_seconds({s: df[deep_target(s, df) == deep] for s, df in frames.items() if s != "env"})
    return None if span is None else span / 60


def deep_target(section: str, df: pd.DataFrame) -> pd.Series:
    """Which of a section's rows the deep target measured: all of a deep section's, and those of
    a deep grid's files in another (report/rows.py marks them `deep_target`)."""
    marked = df["deep_target"].eq(True) if "deep_target" in df else pd.Series(False, index=df.index)
    return marked | (section in DEEP)


def commits(frames: list[pd.DataFrame]) -> list[str]:
    return sorted({c for df in frames if "commit" in df for c in df["commit"].dropna().astype(str)})


def provenance(frames: dict[str, pd.DataFrame], seconds: dict[str, float], code: dict) -> pd.DataFrame:
    """Per section: the commits its rows were measured at, when, whether its code is still what
    measured them (`code`: freshness.view's sections) and its GPU minutes, so a report assembled
    from several runs, or from rows older than their code, says so."""
    rows = []
    for section, df in frames.items():
        if df.empty or "commit" not in df:
            continue
        when = pd.to_datetime(df["measured_at"], utc=True, errors="coerce").dropna()
        span = "" if when.empty else (f"{when.min():%Y-%m-%d %H:%M}" if when.min() == when.max()
                                      else f"{when.min():%Y-%m-%d %H:%M} to {when.max():%H:%M} UTC")
        rows.append({"section": section, "commit(s)": ", ".join(commits([df])), "measured": span,
                     "its code now": code.get(section, {}).get("text", ""), "GPU min": seconds.get(section, 0.0) / 60})
    return pd.DataFrame(rows)


def view(inputs) -> dict:
    frames = {s: df for s, df in inputs.frames.items() if s != "env"}
    seconds = measured_seconds(frames)
    code = freshness.view(frames)
    timing = {"per_section": {k: v / 60 for k, v in seconds.items()},
              "total_min": sum(seconds.values()) / 60,
              "run_min": run_minutes(frames), "deep_run_min": run_minutes(frames, deep=True),
              "provenance": provenance(frames, seconds, code["sections"])} if seconds else None
    env = inputs.rows("env")
    if env.empty:
        return unavailable(f"no {inputs.results}/env/env.csv", facts={}, timing=timing, code=code)
    facts = dict(zip(env["key"], env["value"].astype(str)))
    return {"available": True, "facts": facts, "device": device(facts), "host": host(facts),
            "table": table(facts), "timing": timing, "code": code}
