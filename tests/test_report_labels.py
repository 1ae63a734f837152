"""The report's summary and labels hold what its CSVs hold, asserted on the values the report's
template receives (tests/conftest.py's h100_report: the committed H100 results rendered once, with
the context its template got): each speed-up the summary states recomputed from the CSV medians,
ours against the best peer of the same harness and never against a published number; the grid's
speed-ups by pass; the peers not in the same setting saying so; the multi-GPU answer naming the
machine it was measured on. What the reader reads of them is compared whole by the golden renders
(tests/test_report_golden.py); the layout rules (summary first, answers before tables, no process
talk) are checked on the rendered text, and the compare page's on its own."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from lmperf.report import claims, render
from lmperf.report.format import HOST_BOUND

REPO = Path(__file__).resolve().parents[1]
H100 = REPO / "results" / "h100-80gb-hbm3"
H200 = REPO / "results" / "h200"
MARK = HOST_BOUND
TERMS = ("rung", "host-bound", "GPU time", "MFU", "copy share", "J/token")
# this brief's sections, by their headings
SECTIONS = ("## Correctness", "## The ladder", "## FlashAttention-2 (Triton)", "## Scaling across GPUs")
PROCESS_TALK = re.compile(r"\blease\b|\bsession\b|NOTES step|NOTES\.md`?, step|\bsteps? \d+-?\d*\b.*NOTES|was cut|"
                          r"\bstretch\b|\bbars?\b|on a lent GPU", re.IGNORECASE)


@pytest.fixture
def report(h100_report) -> str:
    return h100_report.text


@pytest.fixture
def summary(h100_report) -> dict:
    return h100_report["summary"]


@pytest.fixture
def compare_page() -> tuple[str, Path]:
    """The H100-vs-H200 compare page as committed (tests/test_compare.py checks that the command
    writes it byte for byte from the committed results)."""
    path = REPO / "report" / "compare" / "h100-80gb-hbm3_vs_h200.md"
    return path.read_text(), path


# --- the summary's comparisons, from the CSVs ---------------------------------------------------

def expected_speedups() -> dict[tuple[str, str], float]:
    """{(summary answer, row): the speed-up recomputed from the committed CSVs alone}."""
    fa = pd.concat([pd.read_csv(p) for p in sorted((H100 / "flash_attention" / "bench").glob("*.csv"))])
    ok = fa[fa["status"] == "ok"]
    med = lambda g, p, m, causal: float(ok[(ok["group"] == g) & (ok["provider"] == p) & (ok["metric"] == m)
                                           & (ok["causal"] == causal)]["median"].iloc[0])
    peers = ("sdpa_flash", "sdpa_cudnn", "flex", "plain", "plain_compiled", "torch_tiled")
    best = lambda g, m, causal: float(ok[(ok["group"] == g) & ok["provider"].isin(peers) & (ok["metric"] == m)
                                         & (ok["harness"] == "eager") & (ok["causal"] == causal)]["median"].min())
    ladder = pd.read_csv(H100 / "ladder" / "2.7B.csv")
    tokens = lambda name: float(ladder[(ladder["name"] == name) & (ladder["metric"] == "tokens_per_s")]["median"].iloc[0])
    # the best bf16 rung: the fastest of our own (not a peer's, a contender's or FP8), whichever change it is
    own = ladder[(ladder["metric"] == "tokens_per_s") & (ladder["status"] == "ok") & (ladder["name"] != "floors")
                 & ~ladder["change"].astype(str).str.startswith("peer") & ~ladder["name"].str.startswith("contender_")
                 & ladder["float8"].fillna("none").astype(str).eq("none")]
    top = own.loc[own["median"].idxmax(), "name"]
    at_assignment = own[own["context"] == int(ladder[ladder["name"] == "compiled"]["context"].iloc[0])]
    at_assignment = at_assignment[at_assignment["attention"] == "flash-triton"]  # ours: at least one of our kernels
    return {
        ("flash_attention", "best"): best("headline", "fwd_bwd_ms", True) / med("headline", "triton", "fwd_bwd_ms", True),
        ("throughput", "best"): best("throughput", "forward_ms", False) / med("throughput", "triton", "forward_ms", False),
        ("throughput", "fwd_bwd"): best("throughput", "fwd_bwd_ms", False) / med("throughput", "triton", "fwd_bwd_ms", False),
        ("training", "assignment"): at_assignment["median"].max() / tokens("compiled"),
        ("training", "fp8"): tokens("ours_float8_delayed") / tokens(top),
    }


def stated(summary: dict) -> dict[tuple[str, str], claims.Claim]:
    """{(answer, row): claim} of every comparison the summary states."""
    out = {}
    for answer in ("flash_attention", "throughput", "training"):
        for key, row in summary[answer].items():
            claim = row if isinstance(row, claims.Claim) else (row or {}).get("claim") if isinstance(row, dict) else None
            if isinstance(claim, claims.Claim):
                out[(answer, key)] = claim
    return out


def test_summary_speed_ups_are_the_csv_medians(summary):
    """Ours against the best peer of the same harness (or the assignment's setting, or our best
    bf16 rung), recomputed from the CSV medians; a 2% error fails (the values are compared whole,
    not at the 3 digits the report prints)."""
    made = stated(summary)
    for key, exact in expected_speedups().items():
        assert key in made, f"the summary states no {key}"
        assert made[key].speedup == pytest.approx(exact, rel=1e-9), (key, made[key].speedup, exact)


def test_every_summary_speed_up_is_its_two_sides_over_each_other(summary):
    """Theirs over ours for a time, ours over theirs for a rate; a side-less claim has no ratio."""
    made = stated(summary)
    assert len(made) >= 5
    for key, c in made.items():
        if c.peer is None:
            assert c.speedup is None, key
            continue
        expected = c.ours.value / c.peer.value if c.higher_is_better else c.peer.value / c.ours.value
        assert c.speedup == pytest.approx(expected), key


def test_a_published_number_gets_no_ratio(summary):
    rows = [*summary["flash_attention"]["record"], *summary["throughput"]["published"]]
    assert rows, "the committed H100 summary quotes no published number"
    assert all(r["ratio"] is None for r in rows)


def test_multi_gpu_answer_is_another_machines_and_says_so(summary):
    scaling = summary["scaling"]
    assert scaling["available"] and scaling["machine"] == "h200-x4", scaling
    assert scaling["link"]


# --- host-bound legends count their own table ---------------------------------------------------

def test_each_host_bound_legend_counts_the_rows_of_the_table_above_it():
    """The `table` filter remembers the marked rows of the table it wrote last; the legend
    (templates/host_bound.md.j2) counts those, whatever the section's other tables hold."""
    env = render.environment(REPO / "templates")
    page = env.from_string("{{ a | table }}\n{% include 'host_bound.md.j2' %}\n{{ b | table }}\n"
                           "{% include 'host_bound.md.j2' %}\n{{ c | table }}\n{% include 'host_bound.md.j2' %}")
    a = pd.DataFrame({"x": ["1.0 " + MARK, "2.0", "3.0 " + MARK]})
    b = pd.DataFrame({"x": ["1.0", "2.0 " + MARK]})
    c = pd.DataFrame({"x": ["1.0"]})
    text = page.render(a=a, b=b, c=c, hb={"mark": MARK, "threshold": 10, "n": 99})
    counts = re.findall(rf"{MARK} host-bound \((\w+) in the table above\)", text)
    assert counts == ["2", "1", "none"]


# --- the grid and the peers' labels --------------------------------------------------------------

def test_grid_forward_and_backward_apart_with_speed_ups(h100_report):
    fa = h100_report["flash_attention"]
    grid = pd.concat([pd.read_csv(p) for p in sorted((H100 / "flash_attention" / "bench").glob("grid_*.csv"))])
    ok = grid[grid["status"] == "ok"]
    assert fa["grid_head_dims"] == sorted(int(d) for d in grid["head_dim"].unique())
    assert fa["grid_speedups"]
    for part in fa["grid_speedups"]:
        t = part["table"]
        for label, metric in (("forward", "forward_gpu_ms"), ("backward", "backward_gpu_ms"),
                              ("forward+backward", "fwd_bwd_gpu_ms")):
            assert f"{label}: speed-up" in t, (part["dtype"], label)
            at = ok[(ok["dtype"] == part["dtype"]) & (ok["metric"] == metric)]
            ms = at.set_index(["head_dim", "seq_len", "provider"])["median"]
            checked = 0
            for _, row in t.iterrows():
                key = lambda p: (row["D"], row["N"], p)
                if key("triton") in ms and key("plain_compiled") in ms:
                    assert row[f"{label}: speed-up"] == pytest.approx(ms[key("plain_compiled")] / ms[key("triton")])
                    checked += 1
                else:
                    assert pd.isna(row[f"{label}: speed-up"])
            assert checked, (part["dtype"], label)


def test_peers_not_in_the_same_setting_say_so(h100_report):
    peers = h100_report["ladder"]["peers"]
    liger = peers[peers["peer"].str.contains("liger")]
    assert len(liger) and liger["same setting?"].str.startswith("no:").all()
    assert liger["same setting?"].str.contains("outside the compiled graph").all()
    for r in peers[peers["peer"].str.contains("float8")].itertuples():
        assert "not a peer of our FP8 rung" in r[peers.columns.get_loc("same setting?") + 1], r


# --- the layout a reader meets -------------------------------------------------------------------

def section(text: str, heading: str) -> str:
    return heading + text.split("\n" + heading, 1)[1].split("\n## ", 1)[0]


def check_first_screen(text: str) -> None:
    first = text.splitlines()[:40]
    assert "## Summary" in first, "the summary does not start within the first 40 lines"
    start = first.index("## Summary")
    assert any(l.startswith("| ") for l in first[start:]), "the summary's table is not within the first 40 lines"
    terms = [l for l in first if l.startswith("- *")]
    assert "**Terms.**" in first and 1 <= len(terms) <= 6, "no glossary of at most six terms within 40 lines"
    for term in TERMS:
        assert any(term in l.split(":")[0] for l in terms), f"the glossary lacks {term!r}"
    mfu = next(l for l in terms if "MFU" in l.split(":")[0])
    assert "causal" in mfu and "half" in mfu, "the glossary does not say how each MFU counts causal attention"


def check_answers_first(text: str) -> None:
    for heading in SECTIONS:
        body = section(text, heading).splitlines()[1:]
        prose = []
        for line in body:
            if line.startswith(("|", "<details>", "![")):
                break
            if line.strip() and not line.startswith("**Partial:**"):
                prose.append(line)
        assert 1 <= len(prose) <= 5, (heading, prose)


def check_no_process_talk(text: str) -> None:
    mine = "\n".join([text.split("## Contents", 1)[0], *(section(text, h) for h in SECTIONS)])
    # the published numbers' sources are quoted as their authors wrote them
    mine = re.sub(r"<details><summary>Published numbers.*?</details>", "", mine, flags=re.S)
    for line in mine.splitlines():
        assert not PROCESS_TALK.search(line), line


# --- the tests ------------------------------------------------------------------------------------

def test_summary_and_glossary_on_the_first_screen(report):
    check_first_screen(report)


def test_sections_answer_before_their_first_table(report):
    check_answers_first(report)


def test_no_process_talk(report):
    check_no_process_talk(report)


def test_templates_have_no_process_talk():
    for name in ("report", "summary", "ladder", "flash_attention", "distributed", "correctness", "references",
                 "host_bound", "figure", "partial"):
        text = (REPO / "templates" / f"{name}.md.j2").read_text()
        for line in text.splitlines():
            code = re.sub(r"\{[%{#].*?[%}#]\}", "", line)  # template code is not text a reader sees
            assert not re.search(r"\blease\b|\bsession\b|was cut|\bstretch\b|steps? \d+-\d+", code, re.I), (name, line)


def test_compare_page_opens_with_a_short_summary_and_a_chart(compare_page):
    text, path = compare_page
    lines = text.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith(("<details>", "## ")))
    assert head <= 30, f"the summary runs {head} lines"
    # the chart: the headline rows both runs measured at the same code; between these two runs
    # there are none (the H200 rows are of other commits), and the page says so instead
    same_code = "no timing row in common measured at the same code" not in text
    assert any(l.startswith("![") and ".png" in l for l in lines[:head]) == same_code, "chart and rows disagree"
    assert path.with_suffix(".png").exists() == same_code
    largest = next((l for l in lines[:head] if "largest" in l), "") if same_code else ""
    assert "profile/" not in largest and "first_step" not in largest and "warmup" not in largest, largest


def drawn(monkeypatch, module, section_name: str) -> list:
    from lmperf.report.sections import Inputs, figure_paths
    figs = []
    # the FlashAttention-2 section draws in a module of its own
    from lmperf.report import flash_attention, flash_attention_figures
    where = flash_attention_figures if module is flash_attention else module
    monkeypatch.setattr(where, "save", lambda fig, path: figs.append(fig))
    bars = render.bars_from_config(REPO / "config" / "config.yaml")
    inputs = Inputs(results=H100, frames={section_name: render.load_section(H100, section_name)}, bars=bars, out_dir=H100)
    assert module.figures(inputs, figure_paths(H100)) == {}
    return figs


def test_ladder_figure_stacks_phases_marks_peers_apart_and_fp8_on_its_own_axis(monkeypatch):
    from lmperf.report import ladder
    (fig,) = drawn(monkeypatch, ladder, "ladder")
    top = fig.axes[0]
    phases = [c.get_label() for c in top.containers]
    assert phases == ["forward", "backward", "optimizer"]
    for line in top.get_lines():  # peers: markers, never joined by a line
        assert line.get_linestyle() == "None" and len(line.get_xdata()) == 1
    fp8_axes = [ax for ax in fig.axes if "fp8" in ax.get_ylabel()]
    assert fp8_axes and all("bf16" not in ax.get_ylabel() for ax in fp8_axes)
    bf16 = next(ax for ax in fig.axes if "bf16 peak" in ax.get_ylabel())
    for line in bf16.get_lines():
        assert line.get_linestyle() == "None"  # rungs are not a series: no line between them


def test_fa_figures_use_one_timing_method(monkeypatch):
    from lmperf.report import flash_attention
    tflops, ratio = drawn(monkeypatch, flash_attention, "flash_attention")
    grid = render.load_section(H100, "flash_attention").query("group == 'grid' and status == 'ok'")
    gpu = grid[grid["metric"] == "fwd_bwd_gpu_tflops"]
    for ax in tflops.axes:
        for line in ax.get_lines():
            provider = line.get_label()
            assert provider in set(gpu["provider"]), provider  # only providers with GPU time
            dtype, d = ax.get_title().split(", D=")
            rows = gpu[(gpu["provider"] == provider) & (gpu["dtype"] == dtype) & (gpu["head_dim"] == int(d))]
            assert list(line.get_ydata()) == list(rows.sort_values("seq_len")["median"])
    assert "GPU time" in ratio._suptitle.get_text()
