"""The end-to-end, mixed-precision, memory, profile, attention, LRPE, convergence, environment and
across-processes sections of the committed H100 results, asserted on the views their templates
receive (tests/conftest.py's h100_report, rendered once a session): each value recomputed from the
CSV medians, each host-bound row marked and left out of its ratios, what the results lack said as
lacking. The rendered text is checked only for its layout (each section's answer before its first
table, its tables folded, no process talk); the words are the golden renders'
(tests/test_report_golden.py). The same checks fail on a view that shows means, takes a ratio from
a host-bound step or gives a range of one pair."""
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from lmperf.report import lrpe, precision, render
from lmperf.report.format import HOST_BOUND, fmt
from lmperf.report.sections import Inputs
from conftest import config_yaml

REPO = Path(__file__).resolve().parents[1]
H100 = REPO / "results" / "h100-80gb-hbm3"
CONFIG = config_yaml()
BARS = CONFIG["report"]
THRESHOLD = BARS["host_bound_idle_pct"]
# the sections this file covers, by their headings in the report
HEADINGS = {"env": "## Environment", "e2e": "## End-to-end Transformer timings",
            "convergence": "## The FP8 rung's convergence", "profile": "## Kernel-level profile",
            "memory": "## Memory", "precision": "## Mixed precision", "attention": "## Attention in PyTorch",
            "lrpe": "## Multi-dimensional LRPE-cosine", "repeats": "## Across processes"}
TEMPLATES = ["e2e", "precision", "memory", "profile", "attention", "lrpe", "power", "convergence", "env", "repeats"]
PROCESS_TALK = re.compile(r"\blease\b|\bsession\b|NOTES|was cut|stretch|\bbars?\b|to-do", re.IGNORECASE)

pytestmark = pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 results")


@pytest.fixture
def report(h100_report) -> str:
    return h100_report.text


@pytest.fixture
def views(h100_report) -> dict:
    return h100_report.context


def section(text: str, name: str) -> str:
    """One section's text: from its heading to the next `## ` heading."""
    start = text.index(HEADINGS[name])
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


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


# --- fp32 against bf16 autocast --------------------------------------------------------------


def test_fp32_against_bf16_shows_medians_and_takes_no_ratio_from_a_host_bound_step(views):
    view = views["precision"]
    table, answer = view["dtype_speed"], view["dtype_speedup"]
    steps = e2e_steps().set_index(["size", "context", "dtype"])
    assert len(table)
    taken, marked = [], 0
    for r in table.to_dict("records"):
        fp32, bf16 = (steps.loc[(r["model"], r["context"], d)] for d in ("fp32", "bf16"))
        if fp32["status"] != "ok" or bf16["status"] != "ok":
            assert r["speed-up (fp32 / bf16)"] == "" and r["_failed"] and math.isnan(r["_ratio"])
            continue
        assert (r["fp32 step ms"], r["bf16 step ms"]) == (float(fp32["median"]), float(bf16["median"]))
        if bound(fp32["gpu_idle_pct"]) or bound(bf16["gpu_idle_pct"]):
            assert r["speed-up (fp32 / bf16)"] == f"{HOST_BOUND} host-bound" and math.isnan(r["_ratio"])
            marked += 1
        else:
            ratio = float(fp32["median"]) / float(bf16["median"])
            assert r["speed-up (fp32 / bf16)"] == pytest.approx(ratio) and r["_ratio"] == pytest.approx(ratio)
            taken.append(ratio)
    assert answer["n"] == len(taken) and answer["host_bound"] == marked
    if taken:
        assert (answer["min"], answer["max"]) == pytest.approx((min(taken), max(taken)))
        assert len(answer["pairs"]) == len(taken)


# --- the context study ------------------------------------------------------------------------


def test_context_growth_names_its_pairs_the_host_bound_ones_and_those_out_of_memory(views):
    growth = views["e2e"]["context_growth"]
    steps = e2e_steps()
    context = render.load_section(H100, "e2e").query("study == 'context'")
    lo, hi = int(context["context"].min()), int(context["context"].max())
    assert (growth["short"], growth["long"]) == (lo, hi)
    pairs, host, oom = [], [], set()
    for (size, dtype), g in steps.groupby(["size", "dtype"], sort=False):
        ends = {c: g[g["context"] == c] for c in (lo, hi)}
        if any(e.empty for e in ends.values()):
            continue
        if any(e["status"].iloc[0] == "oom" for e in ends.values()):
            oom.add(f"{size}, {dtype}")
        elif any(bound(e["gpu_idle_pct"].iloc[0]) for e in ends.values()):
            host.append(f"{size}, {dtype}")
        else:
            pairs.append((f"{size}, {dtype}", float(ends[hi]["median"].iloc[0] / ends[lo]["median"].iloc[0])))
    assert [(p["pair"], p["ratio"]) for p in growth["pairs"]] == pytest.approx(pairs) if pairs else not growth["pairs"]
    assert growth["host_bound"] == host
    assert {f["pair"] for f in growth["failed"] if f["status"] == "oom"} == oom
    assert growth["n"] == len(pairs)
    if pairs:
        assert (growth["min"], growth["max"]) == pytest.approx((min(r for _, r in pairs), max(r for _, r in pairs)))


# --- LRPE: no host-bound wall time stands alone as a kernel's speed ----------------------------


def lrpe_inputs(frame: pd.DataFrame) -> Inputs:
    return Inputs(results=H100, frames={"lrpe": frame}, bars=BARS, out_dir=H100)


def test_every_host_bound_lrpe_call_is_marked_beside_its_gpu_time(views):
    bench = render.load_section(H100, "lrpe").query("study == 'bench'")
    wall = bench[bench["metric"].isin(["forward_ms", "backward_ms"]) & (bench["status"] == "ok")]
    tables = {int(t["dims"]): t["table"] for t in views["lrpe"]["tables"]}
    checked = 0
    for dims, g in wall.groupby("dims"):
        t = tables[int(dims)]
        shown = {(int(r["l"]), int(r["n"]), r["provider"]): r for r in t.to_dict("records")}
        for _, w in g.iterrows():
            r = shown[(int(w["l"]), int(w["side"]), w["provider"])]
            short = "fwd" if w["metric"] == "forward_ms" else "bwd"
            cell = str(r[f"{short} ms / call"])
            assert (HOST_BOUND in cell) == bound(w["gpu_idle_pct"]), (w["case_id"], cell)
            if HOST_BOUND in cell:  # its GPU time stands beside it
                assert pd.notna(r.get(f"{short} kernel ms")) or pd.notna(r.get(f"{short} GPU ms (CUDA graph)")) \
                    or "host" in cell
            checked += 1
    assert checked


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


def test_the_published_a800_table_is_set_beside_ours(views):
    published = pd.read_csv(REPO / lrpe.PUBLISHED, comment="#")
    view = views["lrpe"]["published"]
    table = view["table"]
    assert len(table) == len(published)
    for r in published.itertuples(index=False):
        row = table[(table["dims"] == r.dims) & (table["l"] == r.l) & (table["n"] == r.n)
                    & (table["direction"] == r.direction)]
        assert len(row) == 1
        assert row["A800 (published): triton / torch.compile, per call"].iloc[0] == pytest.approx(r.triton / r.torch_compile)
    # counted over the published configurations this run measured too (a row with our ratio)
    for direction in ("forward", "backward"):
        rows = table[(table["direction"] == direction) & table["ours: triton / torch.compile, kernel time"].notna()]
        s = view["summary"][direction]
        assert s["published"] == int((published["direction"] == direction).sum()) and s["n"] == len(rows)
        assert s["theirs_slower"] == int((rows["A800 (published): triton / torch.compile, per call"] >= 1).sum())
        assert s["ours_slower"] == int((rows["ours: triton / torch.compile, kernel time"] >= 1).sum())


def test_profile_softmax_against_the_matmuls_is_read_from_the_profile(views):
    df = render.load_section(H100, "profile")
    parts = df[df["metric"] == "attention_part_us_per_step"]
    table = views["profile"]["softmax"]
    assert len(table) == parts["case_id"].nunique()
    expected = []
    for _, g in parts.groupby("case_id", sort=False):
        us = dict(zip(g["kernel"], g["mean"]))
        gflop = dict(zip(g["kernel"], g["flops"]))
        expected.append((us["attention.softmax"], us["attention.softmax"] / max(us["attention.scores"], us["attention.values"]),
                         min(gflop["attention.scores"], gflop["attention.values"]) / gflop["attention.softmax"]))
    got = list(zip(table["softmax us"], table["softmax / slower matmul (time)"], table["matmul / softmax (FLOPs)"]))
    flat = lambda rows: [x for row in sorted(rows) for x in row]
    assert flat(got) == pytest.approx(flat(expected))


def test_attention_compiled_against_eager_uses_medians_and_marks_host_bound(views):
    df = render.load_section(H100, "attention")
    table = views["attention"]["compiled"]["table"]
    ok = df[df["status"] == "ok"].set_index(["impl", "head_dim", "seq_len", "metric"])
    assert len(table)
    for r in table.to_dict("records"):
        for direction in ("forward", "backward"):
            e, c = (ok.loc[(impl, r["d"], r["N"], f"{direction}_ms")] for impl in ("eager", "compiled"))
            ratio = float(e["median"] / c["median"])
            cell = r[f"{direction}: eager / compiled"]
            if bound(e["gpu_idle_pct"]) or bound(c["gpu_idle_pct"]):
                assert cell == f"{fmt(ratio)} {HOST_BOUND}" and math.isnan(r[f"_{direction}"])
            else:
                assert cell == pytest.approx(ratio) and r[f"_{direction}"] == pytest.approx(ratio)


def test_memory_bf16_forward_gap_is_read_from_the_peaks(views):
    df = render.load_section(H100, "memory")
    peak = df[(df["metric"] == "peak_allocated_mib") & (df["mode"] == "forward")]
    gap = peak.pivot_table(index="context", columns="dtype", values="mean")
    gap = gap["bf16"] - gap["fp32"]
    extra = views["memory"]["bf16_forward"]["extra"]
    assert (extra["n"], extra["min"], extra["max"]) == (len(gap), pytest.approx(gap.min()), pytest.approx(gap.max()))


def test_what_the_committed_results_lack_is_said_not_guessed(views):
    """The committed results have fp32 attention alone, forward and training memory alone, and no
    compiled case in the context study: the views say what was measured, and the templates say
    what was not (the golden renders show the words)."""
    assert "bf16" not in views["attention"]["dtypes"]
    assert "fwd_bwd" not in views["memory"]["modes"] and views["memory"]["modes"]
    context = render.load_section(H100, "e2e").query("study == 'context'")
    assert not context["compile"].astype(str).str.lower().eq("true").any()


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
