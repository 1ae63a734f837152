"""What a full run costs, predicted from a results folder's CSVs: each job's cases (the rows'
`wall_s`, once a case) plus its overhead (a process start, the collection after every case, the
compile warm-up of its workers), and what each lever would take off, before it is measured.

    python tools/run_cost.py                                   # results/h100-80gb-hbm3, the levers
    python tools/run_cost.py results/h200 --jobs               # and every job's line

The stop rule (bench/timing.py's sample_until, config `median_within`) is simulated on the
per-step samples the step-timed rows keep (e2e, the ladder, PyTorch attention): the steps each
case would have taken, the seconds of the steps it would not, and how far its median moves.
Rows timed by do_bench keep no samples: for them only the time inside do_bench's windows is
known (an upper bound of what shorter windows save); their medians cannot be checked here.
The overhead constants are the measured ones of tools/README.md ("What a full run costs"); pass
others to see what they change. Repeats and the FP8 rung's convergence are listed apart: they
are not part of the default run.

    python tools/run_cost.py --plan --depth deep               # the deep target, before it is measured

With --plan, a job's cases are looked up in the measured results (MEASURED). The deep target's
grids have cases no run measured yet, estimated from those that were (DEEP_ESTIMATORS):
PyTorch attention's from the standard grid's per-pass medians, N x N work scaled to each N and
its stop rule applied, a line ending at the first N the memory model puts over the GPU's memory
(GPU_MEMORY_GIB) and none after it; FlashAttention's from the standard grid's case at the nearest
shape, less the do_bench windows its shorter windows leave out; an end-to-end model size no run
has measured, from the same case at the measured sizes (log-log in their parameters). Each such
job's line counts its estimated cases apart (`estimated`).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from lmperf import catalog, providers  # noqa: E402
from lmperf.bench import timing  # noqa: E402

APART = tuple(f"{s.name}/" for s in catalog.SECTIONS if s.deep)   # the deep target's: not in the default full run
STEP_TIMED = {"e2e": "step_ms", "ladder": "step_ms"}   # section -> the metric whose samples are the steps
MODEL_SECTIONS = tuple(s.name for s in catalog.SECTIONS if s.model)  # whose cases run the whole model


@dataclass
class Costs:
    start_s: float = 12.0        # Snakemake, a new process importing torch, CUDA's start
    collect_s: float = 0.25      # loop.clean_device after a kernel case (its full collection)
    model_collect_s: float = 0.9  # ... after a whole-model case (e2e: 7.2 s over 8 cases)
    freeze_model_s: float = 0.35  # ... of which the full collection, which frozen imports leave out
    warm_s: float = 20.0         # a FlashAttention bench job's compile warm-up in its workers
    warm_model_s: float = 40.0   # ... the model group's (FlexAttention and ours, 40 shapes)
    warm_shape_s: float = 1.0    # ... a compiled shape of a deep grid's job, in its workers (the model group's per shape)
    oom_case_s: float = 1.0      # a case that runs out of memory: its inputs allocated, its failure a row
    render_s: float = 60.0       # the report rule: an allowance, not measured


def jobs(results: Path) -> pd.DataFrame:
    """One line a CSV: its section, cases, the sum of their wall_s."""
    out = []
    for path in sorted(results.rglob("*.csv")):
        rel = path.relative_to(results).as_posix()
        df = pd.read_csv(path, low_memory=False)
        if "wall_s" in df:
            cases = df.drop_duplicates(["study", "case_id"])
            n, wall = len(cases), float(cases["wall_s"].fillna(0).sum())
        else:  # env: one row, no cases
            n, wall = 0, 0.0
        out.append({"job": rel.removesuffix(".csv"), "section": rel.split("/")[0], "cases": n, "cases_s": wall,
                    "apart": rel.startswith(APART)})
    return pd.DataFrame(out)


def overhead(job: pd.Series, costs: Costs) -> float:
    """A job's seconds outside its cases (Costs' comments)."""
    per_case = costs.model_collect_s if job["section"] in MODEL_SECTIONS else costs.collect_s
    if job["job"] == "flash_attention/check" or job["job"].endswith("/check"):
        per_case = 0.0  # the parent of a check in workers has frozen its imports: milliseconds
    warm = 0.0
    if job["job"].startswith("flash_attention/bench/grid_deep"):
        warm = costs.warm_shape_s * job.get("compiled", 0)
    elif job["job"].startswith("flash_attention/bench/grid"):
        warm = costs.warm_s
    elif job["job"] == "flash_attention/bench/model":
        warm = costs.warm_model_s
    return costs.start_s + per_case * job["cases"] + warm


def samples(row: pd.Series) -> list[float]:
    return [float(x) for x in str(row["samples"]).split(";")] if isinstance(row["samples"], str) else []


def stopped_at(values: list[float], rule: timing.StopRule) -> int:
    """How many of `values` (seconds, in the order taken) the rule would have taken."""
    for n in range(1, len(values) + 1):
        if timing.stop_reason(values[:n], rule) is not None:
            return n
    return len(values)


def stop_rule_cases(results: Path, median_within: float) -> pd.DataFrame:
    """Every step-timed case under the stop rule: steps taken then and now, seconds saved, the
    median's move (%) and the case's 20%-80% spread (% of the median)."""
    out = []
    for path in sorted(results.rglob("*.csv")):
        rel = path.relative_to(results).as_posix()
        section = rel.split("/")[0]
        if rel.startswith(APART) or section not in (*STEP_TIMED, "attention"):
            continue
        df = pd.read_csv(path, low_memory=False)
        ok = df[df["status"] == "ok"]
        if section in STEP_TIMED:
            steps = ok[ok["metric"] == STEP_TIMED[section]].drop_duplicates(["study", "case_id"])
            for _, row in steps.iterrows():
                ms = samples(row)
                rule = timing.StopRule.from_case({**row.to_dict(), "median_within": median_within})
                rule = timing.StopRule(rule.ceiling, int(row["min_timed_steps"]) if pd.notna(row.get("min_timed_steps"))
                                       else rule.floor, rule.window if pd.notna(rule.window) else None, median_within)
                n = stopped_at([x / 1e3 for x in ms], rule)
                out.append(_case(rel, row["case_id"], "step", ms, n, sum(ms[n:]) / 1e3))
        else:  # PyTorch attention: forward passes, then backward passes (each after an untimed forward)
            for case_id, rows in ok.groupby("case_id", sort=False):
                by = rows.set_index("metric")
                if not {"forward_ms", "backward_ms"} <= set(by.index):
                    continue
                fwd_median = float(by.loc["forward_ms", "median"])
                for metric in ("forward_ms", "backward_ms"):
                    r = by.loc[metric]
                    ms = samples(r)
                    window = r["window_s"] if pd.notna(r.get("window_s")) else None
                    rule = timing.StopRule(int(r["iters"]), int(r.get("min_iters", r["iters"])), window, median_within)
                    n = stopped_at([x / 1e3 for x in ms], rule)
                    extra = fwd_median * (len(ms) - n) if metric == "backward_ms" else 0.0
                    out.append(_case(rel, case_id, metric, ms, n, (sum(ms[n:]) + extra) / 1e3))
    return pd.DataFrame(out)


def _case(job: str, case_id: str, what: str, ms: list[float], n: int, saved_s: float) -> dict:
    m0, m1 = statistics.median(ms), statistics.median(ms[:n])
    q = statistics.quantiles(ms, n=5, method="inclusive") if len(ms) > 1 else [m0] * 4
    return {"job": job.removesuffix(".csv"), "case_id": case_id, "what": what, "steps_then": len(ms),
            "steps_now": n, "steps_s": sum(ms) / 1e3, "saved_s": saved_s, "median_move_pct": 100 * (m1 / m0 - 1),
            "spread_pct": 100 * (q[3] - q[0]) / m0}


def do_bench_window_s(results: Path) -> pd.DataFrame:
    """Per do_bench-timed job: the seconds its cases spend inside do_bench's windows (warm-up +
    measuring, per timed call): what shorter windows could take off at most."""
    out = []
    for path in sorted(results.rglob("*.csv")):
        rel = path.relative_to(results).as_posix()
        if rel.startswith(APART) or "timing_ms" not in pd.read_csv(path, nrows=0).columns:
            continue
        df = pd.read_csv(path, low_memory=False)
        cases = df[df["status"] == "ok"].drop_duplicates(["study", "case_id"])
        seconds = 0.0
        for _, c in cases.iterrows():
            warmup, rep = (float(x) for x in str(c["timing_ms"]).split("/"))
            if rel.startswith("flash_attention"):  # forward, fwd_bwd, backward; and two CUDA-graph replays
                calls = 3 * (warmup + rep) + (2 * rep if bool(c.get("gpu_time")) else 0)
            else:  # LRPE: forward and backward
                calls = 2 * (warmup + rep)
            seconds += calls / 1e3
        out.append({"job": rel.removesuffix(".csv"), "cases": len(cases), "window_s": seconds})
    return pd.DataFrame(out)


COMPILED_TWINS = {"plain_compiled": "plain", "torch_compile": "torch", "compiled": "eager"}  # compiled -> eager


def compile_share(results: Path) -> pd.DataFrame:
    """Per job, what its torch.compile'd providers cost beyond their eager twins at the same
    shapes (PyTorch attention, the FlashAttention grid, LRPE): mostly compiling, each shape anew."""
    out = []
    for path in sorted(results.rglob("*.csv")):
        rel = path.relative_to(results).as_posix()
        if rel.startswith(APART):
            continue
        df = pd.read_csv(path, low_memory=False)
        key = next((c for c in ("provider", "impl") if c in df), None)
        if key is None or "wall_s" not in df or "case_id" not in df:
            continue
        cases = df.drop_duplicates(["study", "case_id"])
        for compiled, eager in COMPILED_TWINS.items():
            c, e = cases[cases[key] == compiled], cases[cases[key] == eager]
            if len(c) and len(e):
                out.append({"job": rel.removesuffix(".csv"), "compiled": compiled, "cases": len(c),
                            "compiled_s": float(c["wall_s"].sum()), "eager_s": float(e["wall_s"].sum()),
                            "beyond_s": float(c["wall_s"].sum() - e["wall_s"].sum())})
    return pd.DataFrame(out)


def duplicate_cases(results: Path) -> pd.DataFrame:
    """Cases that measure what another table's case measures: the variants study's eager fp32
    training step of a size the ladder runs is the ladder's first rung but for its warm-up steps."""
    out = []
    for ladder in sorted((results / "ladder").glob("*.csv")):
        size = ladder.stem
        variants = results / "e2e" / "variants" / f"{size}.csv"
        lad, var = pd.read_csv(ladder, low_memory=False), pd.read_csv(variants, low_memory=False) if variants.exists() else None
        if var is None:
            continue
        first = lad.drop_duplicates("case_id").iloc[0]
        twin = var[(var["dtype"] == "fp32") & (~var["compile"].astype(bool)) & (var["mode"] == "train")
                   & (var["context"] == first["context"])].drop_duplicates("case_id")
        for _, t in twin.iterrows():
            out.append({"job": f"e2e/variants/{size}", "case_id": t["case_id"], "twin": f"ladder/{size} {first['case_id']}",
                        "saved_s": float(t["wall_s"])})
    return pd.DataFrame(out)


# --- the run a config plans, projected from measured cases -------------------------------------

MEASURED = (  # where a planned case's wall_s is looked up: the newest measurement of it wins
    ROOT / "results/h100-80gb-hbm3",
    ROOT / "tools/data/side_by_side_h100/at_28cbca2/hold_b/results/h100-80gb-hbm3",
    ROOT / "tools/data/side_by_side_h100/at_28cbca2/hold_a/results/h100-80gb-hbm3",
    ROOT / "tools/data/side_by_side_h100/one_commit/second_hold/results/h100-80gb-hbm3",
    ROOT / "tools/data/side_by_side_h100/one_commit/first_hold/results/h100-80gb-hbm3",
    ROOT / "tools/data/side_by_side_h100/cost_map/results/h100-80gb-hbm3",
    ROOT / "tools/data/side_by_side_h100/run/results/h100-80gb-hbm3",
    ROOT / "tools/data/side_by_side_h100/cost_probe/results/h100-80gb-hbm3",
)


def planned_files(overrides: list[str], scale: str, depth: str):
    """The result files a Snakemake run with `--config overrides` plans (lmperf.workflow), the
    config loaded as the workflow loads it (lmperf.report.render.load_config)."""
    import yaml
    from lmperf import workflow
    from lmperf.report import render
    config = render.load_config(ROOT / "config/config.yaml",
                                {key: yaml.safe_load(value) for key, _, value in (o.partition("=") for o in overrides)})
    files = workflow.result_files(config, "results/plan", scale, ["results/plan-x2"])
    return [f for f in workflow.run_files(files, depth) if f.section != "distributed"]


def measured_walls(folders) -> dict[str, dict[str, float]]:
    """job (path under a results folder, no .csv) -> case_id -> wall_s of the case's newest row
    (its `measured_at`) in any of the folders; without `measured_at`, the first folder's wins."""
    out: dict[str, dict[str, tuple[str, float]]] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.csv")):
            job = path.relative_to(folder).as_posix().removesuffix(".csv")
            df = providers.read_renamed(pd.read_csv(path, low_memory=False))  # rows written before a rename
            if "wall_s" not in df or "case_id" not in df:
                continue
            when = df["measured_at"].astype(str) if "measured_at" in df else pd.Series("", index=df.index)
            known = out.setdefault(job, {})
            for case_id, at, wall in zip(df["case_id"], when, df["wall_s"].fillna(0.0)):
                if case_id not in known or at > known[case_id][0]:
                    known[case_id] = (at, float(wall))
    return {job: {c: wall for c, (_, wall) in cases.items()} for job, cases in out.items()}


def _head_dim_group(job: str) -> str | None:
    """'gqa' of a job named by its group and head dim ('.../gqa_d128'), else None."""
    return job.rsplit("_d", 1)[0] if re.fullmatch(r".*_d\d+", job) else None


def repeat_of(job: str) -> str | None:
    """The timing job a repeat's file repeats ('repeats/<job>/run<k>' -> '<job>'), else None."""
    if not job.startswith("repeats/"):
        return None
    return job.removeprefix("repeats/").rsplit("/", 1)[0]


def fresh_process_factors(walls: dict[str, dict[str, float]]) -> dict[str, float]:
    """{section: the median, over the cases measured both ways, of a case's mean wall_s in its
    repeats' fresh processes over its wall_s in its job's own}; '' holds the median over every
    section. A repeat's process runs a few cases from a cold start: it compiles them itself (the
    job's own compiled them in its workers first, or before them), so a case costs it more."""
    ratios: dict[str, list[float]] = {}
    runs: dict[tuple[str, str], list[float]] = {}
    for job, cases in walls.items():
        own = repeat_of(job)
        if own is not None:
            for case_id, wall in cases.items():
                runs.setdefault((own, case_id), []).append(wall)
    for (own, case_id), repeated in runs.items():
        first = walls.get(own, {}).get(case_id)
        if first:
            ratios.setdefault(own.split("/")[0], []).append(statistics.mean(repeated) / first)
    out = {section: statistics.median(xs) for section, xs in ratios.items()}
    out[""] = statistics.median([x for xs in ratios.values() for x in xs]) if ratios else 1.0
    return out


def case_walls(job: str, ids: list[str], walls: dict, factors: dict) -> tuple[list[float], int]:
    """(the seconds of each of `ids` that a measurement gives, how many were measured as they
    will run): a case of a timing job as measured; a case of a repeat as measured in any of its
    job's repeats (a fresh process like it), else its job's own case times the section's
    fresh-process factor (fresh_process_factors). For a job measured nowhere yet, one value: the
    median case of its section's jobs (of its section's repeats, for a repeat), which plan()
    gives to every case."""
    own = repeat_of(job)
    if own is None:
        known = walls.get(job, {})
        found = [known[c] for c in ids if c in known]
        if not found and ids:
            # none of its cases measured: the mean case of the job as measured at other shapes, or of
            # the jobs of its group at other head dims ('gqa_d64' after 'gqa_d128'); else the median
            # case of its section's jobs
            group = _head_dim_group(job)
            like = [wall for j, cases in walls.items() if j == job or group is not None and _head_dim_group(j) == group
                    for wall in cases.values()]
            if like:
                return [statistics.mean(like)], 0
            section = [wall for j, cases in walls.items() if j.split("/")[0] == job.split("/")[0]
                       for wall in cases.values()]
            return ([statistics.median(section)] if section else []), 0
        return found, len(found)
    runs = [cases for j, cases in walls.items() if repeat_of(j) == own]
    factor = factors.get(own.split("/")[0], factors[""])
    found, measured = [], 0
    for c in ids:
        repeated = [cases[c] for cases in runs if c in cases]
        if repeated:
            found.append(statistics.mean(repeated))
            measured += 1
        elif c in walls.get(own, {}):
            found.append(walls[own][c] * factor)
    if not found and ids:  # a job not measured yet: its section's repeated cases, as the typical case
        section = [wall for j, cases in walls.items() if (o := repeat_of(j)) and o.split("/")[0] == own.split("/")[0]
                   for wall in cases.values()]
        found = [statistics.median(section)] if section else []
    return found, measured


# --- the deep target's grids: cases no run has measured yet, estimated from those that were ---

GPU_MEMORY_GIB = 79.2   # an H100's, as env.csv records it: where the attention lines end
SAMPLE_FLOOR = 8        # bench/timing.py's sample_until: the fewest passes its median rule stops at


def attention_pass_ms(folders) -> dict[tuple[str, int, int], tuple[float, float]]:
    """(impl, head dim, N) -> (forward, backward) median ms of the standard grid's fp32 rows in
    the first of `folders` that has them (results/<hw>/attention/attention.csv)."""
    for folder in folders:
        path = folder / "attention" / "attention.csv"
        if not path.exists():
            continue
        df = pd.read_csv(path, low_memory=False)
        ok = df[(df["status"] == "ok") & df["metric"].isin(["forward_ms", "backward_ms"])]
        out = {}
        for (impl, d, n), g in ok.groupby(["impl", "head_dim", "seq_len"]):
            m = g.set_index("metric")["median"]
            if {"forward_ms", "backward_ms"} <= set(m.index):
                out[(impl, int(d), int(n))] = (float(m["forward_ms"]), float(m["backward_ms"]))
        if out:
            return out
    return {}


def nearest(options, value: int) -> int:
    """The option nearest `value` on a log scale (the smaller of two as near)."""
    import math
    return min(sorted(options), key=lambda o: abs(math.log2(o) - math.log2(value)))


def attention_deep_walls(spec: dict, passes: dict, costs: Costs) -> list[float]:
    """Seconds of each case of PyTorch attention's deep grid (bench/attention.py's cases), in
    order: per direction, the standard grid's median pass at the nearest head dim and N (a bf16
    case as its fp32 twin), scaled by (N / N')^2, timed until the stop rule's window (`window_s`,
    at least `min_iters`, at most `iters` passes; at least SAMPLE_FLOOR), after 4 untimed passes
    (warm-up, the idle and peak measurements); a case the memory model puts over GPU_MEMORY_GIB
    `oom_case_s`, and the longer N of its line none."""
    from lmperf import attention_memory
    from lmperf.bench import attention
    cases = attention.cases(spec)
    ended: set = set()
    out = []
    for c in cases:
        key = attention.line(c)
        element = attention_memory.ELEMENT_BYTES[c["dtype"]]
        if key in ended:
            out.append(0.0)
            continue
        if attention_memory.predicted_peak_bytes(c["impl"], c["batch"], c["seq_len"], c["head_dim"], element) > GPU_MEMORY_GIB * 2**30:
            ended.add(key)
            out.append(costs.oom_case_s)
            continue
        mine = {(d, n): v for (impl, d, n), v in passes.items() if impl == c["impl"]}
        if not mine:
            out.append(float("nan"))
            continue
        d = nearest({d for d, _ in mine}, c["head_dim"])
        n = nearest({n for dd, n in mine if dd == d}, c["seq_len"])
        scale = (c["seq_len"] / n) ** 2
        seconds = 0.0
        for ms in mine[(d, n)]:
            t = ms * scale / 1e3
            window = c["window_s"] or float("inf")
            timed = min(c["iters"], max(c["min_iters"], SAMPLE_FLOOR, int(window / t) + 1)) if t > 0 else c["iters"]
            seconds += (4 + timed) * t
        out.append(seconds)
    return out


def fa_deep_walls(job: str, spec: dict, ids: list[str], walls: dict, folders) -> tuple[list[float], int]:
    """Seconds of each case of a FlashAttention deep grid job, in order of `ids`: the standard
    grid's case of the same provider and dtype at the nearest N and head dim (of any grid job
    measured; a provider the grid does not time, such as FlexAttention, the median of its cases
    in the other groups), less what its shorter do_bench windows leave out of each timed metric;
    (the seconds, how many are the same shape measured)."""
    import re
    deep_ms = sum(spec["groups"][0].get("timing_ms", [25, 100]))
    grid = {}
    metrics = {}
    for folder in folders:
        for path in sorted((folder / "flash_attention" / "bench").glob("grid_d*.csv")):
            df = pd.read_csv(path, low_memory=False)
            std_ms = sum(int(x) for x in str(df["timing_ms"].dropna().iloc[0]).split("/")) if "timing_ms" in df else 125
            for case_id, g in df.groupby("case_id"):
                m = re.match(r"grid-(\w+?)-(\w+)-causal-b1h1n(\d+)d(\d+)$", case_id)
                if m and g["status"].iloc[0] == "ok":
                    key = (m[1], m[2], int(m[3]), int(m[4]))
                    grid.setdefault(key, float(g["wall_s"].iloc[0]))
                    timed = int((g["metric"].astype(str).str.endswith("_ms") & (g["status"] == "ok")).sum())
                    metrics.setdefault(key, timed * max(0, std_ms - deep_ms) / 1e3)
    elsewhere: dict[str, list[float]] = {}
    for j, cases in walls.items():
        if j.startswith("flash_attention/bench/") and repeat_of(j) is None:
            for case_id, wall in cases.items():
                elsewhere.setdefault(case_id.split("-")[1], []).append(wall) if wall > 0 else None
    out, same = [], 0
    group = spec["groups"][0]
    for case_id in ids:
        m = re.match(r"\w+?-(\w+?)-(\w+)-causal-b1h1n(\d+)d(\d+)$", case_id)
        provider, dtype, n, d = m[1], m[2], int(m[3]), int(m[4])
        skipped = ((provider == "torch_tiled" and n > group.get("tiled_max_seq_len", 1024))
                   or (provider.startswith("sdpa_") and dtype == "fp32"))
        if skipped:
            out.append(0.0)
            continue
        mine = {(dd, nn): v for (p, dt, nn, dd), v in grid.items() if p == provider and dt == dtype} or \
               {(dd, nn): v for (p, dt, nn, dd), v in grid.items() if p == provider}
        if not mine:
            found = elsewhere.get(provider)
            out.append(statistics.median(found) if found else float("nan"))
            continue
        dd = nearest({k[0] for k in mine}, d)
        nn = nearest({k[1] for k in mine if k[0] == dd}, n)
        same += (dd, nn) == (d, n)
        key = next(k for k in grid if k[0] == provider and k[2] == nn and k[3] == dd and (k[1] == dtype or
                   not any(kk[1] == dtype for kk in grid if kk[0] == provider)))
        out.append(max(0.0, mine[(dd, nn)] - metrics.get(key, 0.0)))
    return out, same


def deep_estimate(f, job: str, ids: list[str], walls: dict, costs: Costs, folders) -> tuple[list[float], int] | None:
    """(seconds of each case, how many were measured as they will run) of a deep grid's job no
    run has measured whole, or None for a job of another kind (the lookup of case_walls). The
    hook of each deep grid: DEEP_ESTIMATORS, by the job's path prefix."""
    for prefix, estimate in DEEP_ESTIMATORS.items():
        if job.startswith(prefix) and not all(c in walls.get(job, {}) for c in ids):
            found, measured = estimate(f, job, ids, walls, costs, folders)
            # an estimator with nothing to go on leaves the job to the section's median case
            return (found, measured) if any(x == x for x in found) else None
    return None


def model_parameters(model: dict, vocab: int = 10_000) -> float:
    """A model size's parameters, about: its blocks' attention and SwiGLU weights and the
    embedding and head."""
    d, f, layers = model["d_model"], model["d_ff"], model["n_layers"]
    return layers * (4 * d * d + 3 * d * f) + 2 * vocab * d


def e2e_size_walls(f, job: str, ids: list[str], walls: dict, costs: Costs, folders) -> tuple[list[float], int]:
    """Seconds of each case of an end-to-end job at a model size no run has measured: the same
    case (its id less the size) of the same study at the measured sizes, log-log in the sizes'
    parameters between the two nearest (beyond them, the nearest); NaN where no size has it."""
    import math

    import yaml
    models = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["models"]
    _, study, size = job.split("/")
    measured = {j.split("/")[2]: cases for j, cases in walls.items()
                if j.startswith(f"e2e/{study}/") and j.count("/") == 2 and j.split("/")[2] in models}
    out, same = [], 0
    for case_id in ids:
        rest = case_id.removeprefix(f"{size}-")
        points = sorted((math.log(model_parameters(models[s])), math.log(cases[f"{s}-{rest}"]))
                        for s, cases in measured.items() if cases.get(f"{s}-{rest}", 0) > 0)
        if case_id in walls.get(job, {}):
            out.append(walls[job][case_id])
            same += 1
        elif not points:
            out.append(float("nan"))
        elif len(points) == 1:
            out.append(math.exp(points[0][1]))
        else:
            x = math.log(model_parameters(models[size]))
            below = [p for p in points if p[0] <= x] or points[:1]
            above = [p for p in points if p[0] >= x] or points[-1:]
            (x0, y0), (x1, y1) = below[-1], above[0]
            out.append(math.exp(y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)))
    return out, same


DEEP_ESTIMATORS = {  # job path prefix -> estimate(file, job, ids, walls, costs, folders); a deep grid adds its own
    "attention/deep": lambda f, job, ids, walls, costs, folders: (
        attention_deep_walls(json.loads(f.spec), attention_pass_ms(folders), costs), 0),
    "flash_attention/bench/grid_deep": lambda f, job, ids, walls, costs, folders: fa_deep_walls(
        job, json.loads(f.spec), ids, walls, folders),
    "e2e/": e2e_size_walls,   # the deep target's model sizes (and any size not measured yet)
}


def plan(overrides: list[str], scale: str, depth: str, costs: Costs, folders=MEASURED) -> pd.DataFrame:
    """One line a planned job: its cases, how many were measured as they will run (a repeat's in
    a fresh process; case_walls), their seconds (the cases no measurement gives take the mean of
    those that one does), its overhead (`overhead`) and its total."""
    walls = measured_walls(folders)
    factors = fresh_process_factors(walls)
    out = []
    for f in planned_files(overrides, scale, depth):
        job = f.path.removeprefix("results/plan/").removesuffix(".csv")
        ids = f.case_ids() or []
        estimated = deep_estimate(f, job, ids, walls, costs, folders)
        found, measured = estimated if estimated is not None else case_walls(job, ids, walls, factors)
        found = [x for x in found if x == x]  # NaN: no measurement to estimate from
        mean = statistics.mean(found) if found else float("nan")
        cases_s = sum(found) + mean * (len(ids) - len(found)) if found else (0.0 if not ids else float("nan"))
        compiled = sum(1 for c in ids if any(f"-{p}-" in c for p in ("triton", "plain_compiled", "flex")))
        out.append({"job": job, "section": f.section, "cases": len(ids), "measured": measured,
                    "estimated": (len(ids) - measured) if estimated is not None else 0,
                    "cases_s": cases_s, "apart": job.startswith(APART) or getattr(f, "deep", False),
                    "compiled": compiled if job.startswith("flash_attention/bench/grid_deep") else 0})
    js = pd.DataFrame(out)
    js["overhead_s"] = js.apply(lambda j: overhead(j, costs), axis=1)
    js["total_s"] = js["cases_s"] + js["overhead_s"]
    js.attrs["fresh_process_factors"] = factors
    return js


def deep_part(job: str) -> str:
    """The part of the deep target a job is: its deep grid's prefix (DEEP_ESTIMATORS), else its
    section (repeats, convergence, a section's sizes)."""
    return next((prefix for prefix in DEEP_ESTIMATORS if job.startswith(prefix)), job.split("/")[0])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="?", type=Path, default=ROOT / "results" / "h100-80gb-hbm3")
    p.add_argument("--median-within", type=float, default=0.01, help="the stop rule's share (config median_within)")
    p.add_argument("--jobs", action="store_true", help="also every job's line")
    p.add_argument("--cases", action="store_true", help="also every step-timed case under the stop rule")
    p.add_argument("--plan", nargs="*", metavar="KEY=VALUE",
                   help="project the jobs config/config.yaml plans (with these --config overrides) from the "
                        "measured cases instead (MEASURED: each case's newest wall_s)")
    p.add_argument("--scale", default="full", help="with --plan: the scale planned")
    p.add_argument("--depth", default="standard", help="with --plan: the depth planned")
    for name, value in vars(Costs()).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=value, help=f"(default {value})")
    args = p.parse_args(argv)
    costs = Costs(**{k: getattr(args, k) for k in vars(Costs())})

    if args.plan is not None:
        js = plan(args.plan, args.scale, args.depth, costs)
        print(js.round(1).to_markdown(index=False), end="\n\n")
        sections = js.groupby("section")[["cases", "measured", "cases_s", "overhead_s", "total_s"]].sum()
        sections.loc["(report)"] = [0, 0, 0.0, costs.render_s, costs.render_s]
        print(sections.sort_values("total_s", ascending=False).round(0).astype(int).to_markdown(), end="\n\n")
        total = float(sections["total_s"].sum())
        print(f"{len(js)} jobs, {int(js['cases'].sum())} cases ({int(js['measured'].sum())} measured, "
              f"{int(js['estimated'].sum())} estimated from other shapes): "
              f"{total:.0f} s, {total / 60:.1f} min one job after another")
        apart = js[js["apart"]]
        if len(apart):
            parts = apart.groupby(apart["job"].map(deep_part))["total_s"].sum().sort_values(ascending=False)
            print(f"of which the deep target's alone: {parts.sum():.0f} s ({parts.sum() / 60:.1f} min): "
                  + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in parts.items()))
        factors = js.attrs["fresh_process_factors"]
        print("a repeat's case not yet measured in a fresh process: its job's own wall_s x "
              + ", ".join(f"{factor:.2f} ({section or 'other sections'})" for section, factor in factors.items()))
        return
    js = jobs(args.results)
    js["overhead_s"] = js.apply(lambda j: overhead(j, costs), axis=1)
    js["total_s"] = js["cases_s"] + js["overhead_s"]
    run = js[~js["apart"]]
    if args.jobs:
        print(js.round(1).to_markdown(index=False), end="\n\n")
    sections = run.groupby("section")[["cases", "cases_s", "overhead_s", "total_s"]].sum()
    sections.loc["(report)"] = [0, 0.0, costs.render_s, costs.render_s]
    print(f"{args.results}: {len(run)} jobs of the default full run ({len(js) - len(run)} apart: "
          f"{js[js['apart']]['total_s'].sum():.0f} s)\n")
    print(sections.sort_values("total_s", ascending=False).round(0).astype(int).to_markdown(), end="\n\n")
    base = float(sections["total_s"].sum())

    stop = stop_rule_cases(args.results, args.median_within)
    if args.cases:
        print(stop.round(2).to_markdown(index=False), end="\n\n")
    by_stop = stop.groupby(stop["job"].str.split("/").str[0]).agg(
        cases=("case_id", "nunique"), saved_s=("saved_s", "sum"), steps_then=("steps_then", "sum"),
        steps_now=("steps_now", "sum"), worst_move_pct=("median_move_pct", lambda s: s.abs().max()))
    moved = stop[stop["median_move_pct"].abs() > stop["spread_pct"]]
    print(f"stop rule (median ±{100 * args.median_within:g}% at 99%), simulated on the kept samples:")
    print(by_stop.round(2).to_markdown(), end="\n")
    early = stop[stop["steps_now"] < stop["steps_then"]]
    timed_jobs = run[run["job"].isin(stop["job"])]
    print(f"their timed samples: {stop['steps_s'].sum():.0f} s of those jobs' {timed_jobs['cases_s'].sum():.0f} s of cases "
          f"(e2e and ladder: {stop[~stop['job'].str.startswith('attention')]['steps_s'].sum():.0f} s of "
          f"{timed_jobs[timed_jobs['section'] != 'attention']['cases_s'].sum():.0f} s)")
    print(f"{len(early)} of {len(stop)} stop early; {len(moved)} medians move by more than their 20%-80% spread; "
          f"the largest move {stop['median_move_pct'].abs().max():.2f}% "
          f"({early.loc[early['median_move_pct'].abs().idxmax(), 'case_id'] if len(early) else '-'})\n")

    bench = do_bench_window_s(args.results)
    print(f"do_bench's windows: {bench['window_s'].sum():.0f} s of {run[run['job'].isin(bench['job'])]['cases_s'].sum():.0f} s "
          f"of those jobs' cases ({', '.join(f'{j} {s:.0f}' for j, s in zip(bench['job'], bench['window_s']))})\n")

    comp = compile_share(args.results)
    print("torch.compile'd providers beyond their eager twins (each shape compiled anew):")
    print(comp.round(1).to_markdown(index=False), end="\n\n")

    dups = duplicate_cases(args.results)
    e2e_jobs = run[run["section"] == "e2e"]
    sizes = e2e_jobs["job"].str.split("/").str[-1].nunique()
    lrpe_bench = int(run["job"].str.startswith("lrpe/bench").sum())
    levers = [
        ("stop rule on step-timed cases (e2e, ladder, attention)", float(by_stop["saved_s"].sum())),
        ("duplicates: the variants' eager fp32 training step of a ladder size, measured in the ladder",
         float(dups["saved_s"].sum()) + costs.model_collect_s * len(dups)),
        (f"fewer processes: e2e one job a size ({len(e2e_jobs)} -> {sizes})",
         costs.start_s * (len(e2e_jobs) - sizes)),
        (f"fewer processes: LRPE's benches one job ({lrpe_bench} -> 1)", costs.start_s * max(0, lrpe_bench - 1)),
        ("do_bench windows halved (FlashAttention, LRPE; medians unchecked: no samples kept)",
         float(bench["window_s"].sum()) / 2),
        ("imports frozen in the timing jobs (the collection after a case: milliseconds; changes when the "
         "collector runs inside timed loops)", float(sum(
             (costs.freeze_model_s if j["section"] in MODEL_SECTIONS else costs.collect_s) * j["cases"]
             for _, j in run.iterrows() if not j["job"].endswith("check")))),
    ]
    rows, total = [], base
    rows.append({"lever": "today (cases + overhead)", "saves_s": 0, "run_s": round(total), "run_min": round(total / 60, 1)})
    for name, saved in levers:
        total -= saved
        rows.append({"lever": name, "saves_s": round(saved), "run_s": round(total), "run_min": round(total / 60, 1)})
    print(pd.DataFrame(rows).to_markdown(index=False))


if __name__ == "__main__":
    main()
