"""The end-to-end, mixed-precision, memory, profile, attention, LRPE, convergence, environment and
across-processes sections, rendered from the committed H100 results and read back as a reader
would: each fixed label recomputed from the CSV medians, each host-bound legend's count against
the rows of the table it sits under, each section's answer before its first table, no process
talk. The same checks fail on a report that shows means, counts every table's marks together or
gives a range of one pair."""
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lmperf.report import lrpe, precision, render
from lmperf.report.format import HOST_BOUND, fmt
from lmperf.report.sections import Inputs

REPO = Path(__file__).resolve().parents[1]
H100 = REPO / "results" / "h100-80gb-hbm3"
CONFIG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
BARS = CONFIG["report"]
THRESHOLD = BARS["host_bound_idle_pct"]
# the sections this file covers, by their headings in the report
HEADINGS = {"env": "## Environment", "e2e": "## End-to-end Transformer timings",
            "convergence": "## The FP8 rung's convergence", "profile": "## Kernel-level profile",
            "memory": "## Memory", "precision": "## Mixed precision", "attention": "## Attention in PyTorch",
            "lrpe": "## Multi-dimensional LRPE-cosine", "repeats": "## Across processes"}
TEMPLATES = ["e2e", "precision", "memory", "profile", "attention", "lrpe", "power", "convergence", "env", "repeats"]
PROCESS_TALK = re.compile(r"\blease\b|\bsession\b|NOTES|was cut|stretch|\bbars?\b|to-do", re.IGNORECASE)
LEGEND = re.compile(r"‡ host-bound \((\d+|none) (?:rows? )?(?:here|in the table above)")

pytestmark = pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 results")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("report") / "report.md"
    return render.render(H100, REPO / "templates", out, out.parent / "figures", "full", BARS,
                         models=CONFIG["models"])


def section(text: str, name: str) -> str:
    """One section's text: from its heading to the next `## ` heading."""
    start = text.index(HEADINGS[name])
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def tables(text: str) -> list[tuple[int, list[str], list[list[str]]]]:
    """Every markdown table: (the index of its last line, header cells, rows of cells)."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|:"):
            cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
            head, j = cells(lines[i]), i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(cells(lines[j]))
                j += 1
            out.append((j - 1, head, rows))
            i = j
        else:
            i += 1
    return out


def table_after(text: str, title: str) -> tuple[list[str], list[dict]]:
    """The first table after the line holding `title`: its header and rows as dicts."""
    after = text[text.index(title):]
    _, head, rows = tables(after)[0]
    return head, [dict(zip(head, r)) for r in rows]


def legend_counts(text: str) -> list[tuple[int, int]]:
    """Per host-bound legend: (the count it states, the rows marked ‡ in the table above it)."""
    lines = text.splitlines()
    found = tables(text)
    out = []
    for i, line in enumerate(lines):
        m = LEGEND.search(line)
        if m:
            above = [t for t in found if t[0] < i]
            assert above, f"a host-bound legend with no table above it: {line[:80]}"
            _, _, rows = above[-1]
            out.append((0 if m[1] == "none" else int(m[1]), sum(any(HOST_BOUND in c for c in r) for r in rows)))
    return out


def e2e_steps() -> pd.DataFrame:
    """The eager training steps of the end-to-end rows, one per case: size, context, dtype,
    status, median, GPU idle %."""
    df = render.load_section(H100, "e2e")
    train = df[(df["mode"] == "train") & (df["compile"].astype(str).str.lower() == "false")]
    steps = pd.concat([train[(train["metric"] == "step_ms") & (train["status"] == "ok")],
                       train[train["status"] != "ok"]]).drop_duplicates("case_id")
    return steps.drop_duplicates(["size", "context", "dtype"])


def bound(idle) -> bool:
    return pd.notna(idle) and float(idle) > THRESHOLD


# --- host-bound legends -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["e2e", "precision", "profile", "attention", "lrpe", "repeats"])
def test_each_host_bound_legend_counts_the_rows_of_its_own_table(report, name):
    counts = legend_counts(section(report, name))
    assert all(stated == marked for stated, marked in counts), counts


def test_the_end_to_end_tables_each_have_their_legend(report):
    counts = legend_counts(section(report, "e2e"))
    assert len(counts) == 4 and len({c for c, _ in counts}) > 1  # four tables, not one count for all


# --- fp32 against bf16 autocast --------------------------------------------------------------


def test_fp32_against_bf16_shows_medians_and_takes_no_ratio_from_a_host_bound_step(report):
    text = section(report, "precision")
    head, rows = table_after(text, "fp32 against bf16 autocast, training step")
    steps = e2e_steps().set_index(["size", "context", "dtype"])
    assert {"fp32 step ms", "bf16 step ms", "speed-up (fp32 / bf16)"} <= set(head)
    taken = []
    for r in rows:
        fp32, bf16 = (steps.loc[(r["model"], int(r["context"]), d)] for d in ("fp32", "bf16"))
        if fp32["status"] != "ok" or bf16["status"] != "ok":
            assert r["speed-up (fp32 / bf16)"] == ""
            continue
        assert r["fp32 step ms"] == fmt(float(fp32["median"])) and r["bf16 step ms"] == fmt(float(bf16["median"]))
        if bound(fp32["gpu_idle_pct"]) or bound(bf16["gpu_idle_pct"]):
            assert r["speed-up (fp32 / bf16)"] == f"{HOST_BOUND} host-bound"
        else:
            ratio = float(fp32["median"]) / float(bf16["median"])
            assert r["speed-up (fp32 / bf16)"] == fmt(ratio)
            taken.append(ratio)
    answer = next(line for line in text.splitlines() if line.startswith("fp32 against bf16 autocast"))
    if taken:
        span = fmt(min(taken)) if fmt(min(taken)) == fmt(max(taken)) else f"{fmt(min(taken))}–{fmt(max(taken))}"
        assert f"bf16 is {span}x faster" in answer
    else:  # every pair with a host-bound step: no ratio, and the answer says so
        assert "no pair with neither step host-bound" in answer and "no ratio taken" in answer
    marked = sum(r["speed-up (fp32 / bf16)"] == f"{HOST_BOUND} host-bound" for r in rows)
    if marked > 1:
        assert f"{marked} pairs have a host-bound step" in answer


# --- the context study ------------------------------------------------------------------------


def test_context_growth_names_its_pairs_the_host_bound_ones_and_those_out_of_memory(report):
    answer = next(line for line in section(report, "e2e").splitlines() if line.startswith("Context "))
    steps = e2e_steps()
    context = render.load_section(H100, "e2e").query("study == 'context'")
    lo, hi = int(context["context"].min()), int(context["context"].max())
    pairs, host, oom = [], [], []
    for (size, dtype), g in steps.groupby(["size", "dtype"], sort=False):
        ends = {c: g[g["context"] == c] for c in (lo, hi)}
        if any(e.empty for e in ends.values()):
            continue
        if any(e["status"].iloc[0] == "oom" for e in ends.values()):
            oom.append((size, dtype))
        elif any(bound(e["gpu_idle_pct"].iloc[0]) for e in ends.values()):
            host.append((size, dtype))
        else:
            pairs.append((f"{size}, {dtype}", float(ends[hi]["median"].iloc[0] / ends[lo]["median"].iloc[0])))
    ratios = [r for _, r in pairs]
    assert answer.startswith(f"Context {lo:,} -> {hi:,}")
    if ratios:
        shown = fmt(ratios[0]) if len(ratios) == 1 else f"{fmt(min(ratios))}–{fmt(max(ratios))}"
        assert f"takes {shown}x as long" in answer
    else:
        assert "no pair with neither step host-bound" in answer and "takes" not in answer
    assert all(name in answer for name, _ in pairs)
    assert f"{len(host)} pairs have a host-bound step" in answer or (len(host) == 1 and "1 pair has" in answer)
    assert all(size in answer for size, _ in oom) and ("ran out of memory" in answer) == bool(oom)
    assert not re.search(r"(\d[\d.,]*)–\1\b", answer)  # never a range of one value


# --- LRPE: no host-bound wall time stands alone as a kernel's speed ----------------------------


def lrpe_inputs(frame: pd.DataFrame) -> Inputs:
    return Inputs(results=H100, frames={"lrpe": frame}, bars=BARS, out_dir=H100)


def test_every_host_bound_lrpe_call_is_marked_beside_its_gpu_time(report):
    bench = render.load_section(H100, "lrpe").query("study == 'bench'")
    wall = bench[bench["metric"].isin(["forward_ms", "backward_ms"]) & (bench["status"] == "ok")]
    text = section(report, "lrpe")
    for dims, g in wall.groupby("dims"):
        _, rows = table_after(text, f"{int(dims)}-D grid: forward and backward")
        shown = {(r["l"], r["n"], r["provider"]): r for r in rows}
        for _, w in g.iterrows():
            r = shown[(str(int(w["l"])), str(int(w["side"])), w["provider"])]
            short = "fwd" if w["metric"] == "forward_ms" else "bwd"
            cell = r[f"{short} ms / call"]
            assert (HOST_BOUND in cell) == bound(w["gpu_idle_pct"]), (w["case_id"], cell)
            if HOST_BOUND in cell:  # its GPU time stands beside it
                assert r[f"{short} kernel ms"] or r.get(f"{short} GPU ms (CUDA graph)") or "host" in cell


def test_lrpe_rows_without_a_gpu_time_say_the_wall_time_is_the_hosts():
    bench = render.load_section(H100, "lrpe")
    old = bench[~bench["metric"].str.contains("kernel|_gpu_ms")]  # rows as before the kernel and CUDA-graph times
    view = lrpe.view(lrpe_inputs(old))
    t = next(t for t in view["tables"] if t["dims"] == 1)["table"]
    small = t[(t["n"] == 256) & (t["l"] == 0) & (t["provider"] == "triton")].iloc[0]
    assert str(small["fwd ms / call"]).startswith(f"{HOST_BOUND} host (")
    assert "fwd kernel ms" not in t and "fwd GPU ms (CUDA graph)" not in t
    big = t[(t["n"] == 32768) & (t["l"] == 0) & (t["provider"] == "triton")].iloc[0]
    assert HOST_BOUND not in str(big["fwd ms / call"])


def test_lrpe_cuda_graph_rows_get_their_column():
    bench = render.load_section(H100, "lrpe")
    bench = bench[~bench["metric"].str.endswith("_gpu_ms")]  # as measured before the CUDA-graph times
    kernel = bench[bench["metric"] == "forward_kernel_ms"]
    graph = kernel.assign(metric="forward_gpu_ms", q20=kernel["median"] * 0.99, q80=kernel["median"] * 1.01)
    view = lrpe.view(lrpe_inputs(pd.concat([bench, graph], ignore_index=True)))
    t = view["tables"][0]["table"]
    assert view["gpu_timed"] and t["fwd GPU ms (CUDA graph)"].notna().all()
    assert not lrpe.view(lrpe_inputs(bench))["gpu_timed"]


def test_the_published_a800_table_is_set_beside_ours(report):
    published = pd.read_csv(lrpe.PUBLISHED, comment="#")
    head, rows = table_after(section(report, "lrpe"), "<summary>Against the published A800 table")
    assert len(rows) == len(published)
    first = published.iloc[0]
    r = rows[0] if rows[0]["direction"] == first["direction"] else next(
        x for x in rows if (x["dims"], x["l"], x["n"], x["direction"]) ==
        (str(first["dims"]), str(first["l"]), str(first["n"]), first["direction"]))
    assert r["A800 (published): triton / torch.compile, per call"] == fmt(first["triton"] / first["torch_compile"])
    # counted over the published configurations this run measured too (a row with our ratio)
    backward = [x for x in rows if x["direction"] == "backward" and x["ours: triton / torch.compile, kernel time"]]
    theirs = sum(float(x["A800 (published): triton / torch.compile, per call"]) >= 1 for x in backward)
    n_published = int((published["direction"] == "backward").sum())
    assert "their `triton` is not faster than torch.compile in" in report
    assert f"{theirs} of {len(backward)} backward configurations" in section(report, "lrpe")
    assert f"of its {int((published['direction'] == 'forward').sum())} forward, {n_published} backward configurations" \
        in section(report, "lrpe")


# --- the write-ups' tables --------------------------------------------------------------------


def test_profile_softmax_against_the_matmuls_is_read_from_the_profile(report):
    df = render.load_section(H100, "profile")
    parts = df[df["metric"] == "attention_part_us_per_step"]
    _, rows = table_after(section(report, "profile"), "Attention's parts")
    assert len(rows) == parts["case_id"].nunique()
    for case_id, g in parts.groupby("case_id"):
        us = dict(zip(g["kernel"], g["mean"]))
        gflop = dict(zip(g["kernel"], g["flops"]))
        first = g.iloc[0]
        r = next(x for x in rows if x["case"] == f"{first['size']}, context {int(first['context'])}, {first['dtype']}")
        assert r["softmax us"] == fmt(us["attention.softmax"])
        slower = max(us["attention.scores"], us["attention.values"])
        assert r["softmax / slower matmul (time)"] == fmt(us["attention.softmax"] / slower)
        assert r["matmul / softmax (FLOPs)"] == fmt(min(gflop["attention.scores"], gflop["attention.values"])
                                                     / gflop["attention.softmax"])


def test_attention_compiled_against_eager_uses_medians_and_marks_host_bound(report):
    df = render.load_section(H100, "attention")
    _, rows = table_after(section(report, "attention"), "torch.compile against eager, per head dimension")
    ok = df[df["status"] == "ok"].set_index(["impl", "head_dim", "seq_len", "metric"])
    for r in rows:
        for direction in ("forward", "backward"):
            e, c = (ok.loc[(impl, int(r["d"]), int(r["N"]), f"{direction}_ms")] for impl in ("eager", "compiled"))
            cell = r[f"{direction}: eager / compiled"]
            assert cell.split()[0] == fmt(float(e["median"] / c["median"]))
            assert (HOST_BOUND in cell) == (bound(e["gpu_idle_pct"]) or bound(c["gpu_idle_pct"]))


def test_memory_bf16_forward_gap_is_read_from_the_peaks(report):
    df = render.load_section(H100, "memory")
    peak = df[(df["metric"] == "peak_allocated_mib") & (df["mode"] == "forward")]
    gap = peak.pivot_table(index="context", columns="dtype", values="mean")
    gap = gap["bf16"] - gap["fp32"]
    line = next(x for x in section(report, "memory").splitlines() if x.startswith("A bf16 forward pass"))
    assert f"peaks {fmt(gap.min())}–{fmt(gap.max())} MiB above fp32's" in line


def test_what_the_committed_results_lack_is_said_not_guessed(report):
    assert "bf16 attention in PyTorch: not measured yet" in section(report, "attention")
    assert "Forward + backward without the optimizer step: not measured yet" in section(report, "memory")
    assert "torch.compile against eager across context lengths is\nnot measured yet" in section(report, "e2e")


# --- the first screen and the words ------------------------------------------------------------


@pytest.mark.parametrize("name", list(HEADINGS))
def test_each_section_answers_in_at_most_five_lines_before_its_first_table(report, name):
    lines = section(report, name).splitlines()[1:]
    before = []
    for line in lines:
        if line.startswith("|") or line.startswith("<details>"):
            break
        if line.strip() and not line.startswith(("![", "No figure:", "**Partial:**", "its counts, ranges")):
            before.append(line)
    assert 0 < len(before) <= 5, before


@pytest.mark.parametrize("name", list(HEADINGS))
def test_each_sections_tables_are_folded(report, name):
    depth = 0
    for line in section(report, name).splitlines():
        depth += line.count("<details>") - line.count("</details>")
        if line.startswith("|"):
            assert depth > 0, line[:80]


@pytest.mark.parametrize("name", list(HEADINGS))
def test_no_process_talk_in_the_sections(report, name):
    assert not PROCESS_TALK.search(section(report, name))


@pytest.mark.parametrize("name", TEMPLATES)
def test_no_process_talk_in_the_templates(name):
    text = (REPO / "templates" / f"{name}.md.j2").read_text()
    assert not PROCESS_TALK.search(text), PROCESS_TALK.search(text)[0]


def test_dtype_speed_leaves_out_host_bound_and_failed_pairs():
    e2e = pd.DataFrame([
        {"case_id": f"{s}-{c}-{d}", "size": s, "context": c, "dtype": d, "mode": "train", "compile": False,
         "metric": "step_ms" if st == "ok" else "", "median": m, "mean": m + 1, "gpu_idle_pct": idle,
         "status": st, "study": "context"}
        for s, c, d, m, idle, st in [("a", 1, "fp32", 10.0, 1.0, "ok"), ("a", 1, "bf16", 5.0, 50.0, "ok"),
                                     ("a", 2, "fp32", 20.0, 1.0, "ok"), ("a", 2, "bf16", 8.0, 2.0, "ok"),
                                     ("a", 3, "fp32", math.nan, math.nan, "oom"),
                                     ("a", 3, "bf16", math.nan, math.nan, "oom")]])
    t = precision.dtype_speed(e2e, THRESHOLD)
    assert t["_host_bound"].tolist() == [True, False, False] and t["_failed"].tolist() == [False, False, True]
    assert t["_ratio"].iloc[1] == 2.5 and math.isnan(t["_ratio"].iloc[0]) and math.isnan(t["_ratio"].iloc[2])


def test_a_flashattention_job_that_timed_nothing_lists_its_providers():
    """Without a GPU every timing row is `skipped`: the section says why and lists each
    provider the job ran with its role, so a contender (or a new peer) is seen to reach it."""
    from lmperf import providers
    from lmperf.report import flash_attention
    rows = [{"section": "flash_attention", "study": "bench", "case_id": f"headline-{p}-bf16", "provider": p,
             "metric": "fwd_bwd_ms", "status": "skipped", "message": "needs CUDA"}
            for p in ("triton", "sdpa_flash", "mine_triton", "mine_triton")]
    rows[-1] = {**rows[-1], "case_id": "model-mine_triton-bf16"}
    with providers.kept():  # the registry as it was after the test
        providers.register(providers.Provider("mine_triton", "mine (triton, contender)", "contender", "attention",
                                              lambda case: None))
        v = flash_attention.view(Inputs(results=Path("."), frames={"flash_attention": pd.DataFrame(rows)},
                                        bars=BARS, out_dir=Path(".")))
    assert not v["available"] and v["why"] == "the benchmark did not run here: needs CUDA"
    assert v["providers"] == [{"provider": "triton", "role": "ours", "cases": 1, "statuses": "1 skipped"},
                              {"provider": "sdpa_flash", "role": "peer", "cases": 1, "statuses": "1 skipped"},
                              {"provider": "mine_triton", "role": "contender", "cases": 2, "statuses": "2 skipped"}]
