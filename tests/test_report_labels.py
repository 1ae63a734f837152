"""The report says what its CSVs hold: the summary and its six terms on the first screen, every
ratio the summary prints recomputed from the CSV medians, every host-bound legend counting the
rows of its own table, each section's answer before its first table, no process talk, and a
compare page that opens with a short summary and a chart of its headline ratios.

The checks read a report rendered from the committed H100 results (and the H100-vs-H200 compare
page rendered from results/); `check_*` take the text, so that they can be run on any report."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lmperf import compare
from lmperf.report import render

REPO = Path(__file__).resolve().parents[1]
H100 = REPO / "results" / "h100-80gb-hbm3"
H200 = REPO / "results" / "h200"
MARK = "‡"
TERMS = ("rung", "host-bound", "GPU time", "MFU", "copy share", "J/token")
# this brief's sections, by their headings
SECTIONS = ("## Correctness", "## The ladder", "## FlashAttention-2 (Triton)", "## Scaling across GPUs")
PROCESS_TALK = re.compile(r"\blease\b|\bsession\b|NOTES step|NOTES\.md`?, step|\bsteps? \d+-?\d*\b.*NOTES|was cut|"
                          r"\bstretch\b|\bbars?\b|on a lent GPU", re.IGNORECASE)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("report")
    render.main(["--results", str(H100), "--scale", "full", "--templates", str(REPO / "templates"),
                 "--config", str(REPO / "config" / "config.yaml"), "--out", str(out / "report.md"),
                 "--figures", str(out / "figures"), "--references", str(REPO / "config" / "references.yaml"),
                 "--distributed", str(REPO / "results" / "h200-x4")])
    return (out / "report.md").read_text()


@pytest.fixture(scope="module")
def compare_page(tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("compare") / "h100-80gb-hbm3_vs_h200.md"
    compare.main([str(H100), str(H200), "--out", str(out), "--exit-zero"])
    return out.read_text(), out


# --- the checks, on a report's text ---------------------------------------------------------------

def summary_rows(text: str) -> dict[str, dict]:
    """{answer: {column: cell}} of the summary's table."""
    body = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    lines = [l for l in body.splitlines() if l.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def number(cell: str) -> float:
    """The (last) number of a cell: '4.81 ms' -> 4.81, 'SDPA-flash: 6.80 ms' -> 6.80."""
    found = re.findall(r"(\d[\d,]*\.?\d*)", cell.split(":")[-1])
    return float(found[-1].replace(",", ""))


def close(printed: float, exact: float) -> bool:
    """Equal at the 3 significant digits the report prints."""
    return abs(printed - exact) <= 0.0051 * abs(exact) + 1e-12


def references() -> list[dict]:
    data = yaml.safe_load((REPO / "config" / "references.yaml").read_text())
    return data if isinstance(data, list) else data["references"]


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


def check_one_number_a_cell(text: str) -> None:
    for answer, row in summary_rows(text).items():
        for column in ("ours", "speed-up"):
            assert len(re.findall(r"\d[\d,]*\.?\d*", row[column])) <= 1, (answer, row[column])
        against = row["against"].split(":")[-1]  # what it is, then its number
        assert len(re.findall(r"\d[\d,]*\.?\d*", re.sub(r"\[.*?\]\(.*?\)", "", against))) <= 1, (answer, row["against"])


def check_ratios(text: str) -> None:
    """Every speed-up the summary prints whose sides are both printed is theirs over ours (or ours
    over theirs, for a rate); and those of FlashAttention and the ladder recomputed from the CSV
    medians: ours against the best peer of the same harness, and never a published number."""
    rows = summary_rows(text)
    printed = {a: number(r["speed-up"]) for a, r in rows.items() if re.search(r"\dx", r["speed-up"])}
    assert printed, "the summary prints no speed-up"
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
    expected = {
        "... called as it is, against the best peer": best("headline", "fwd_bwd_ms", True)
        / med("headline", "triton", "fwd_bwd_ms", True),
        "FlashAttention-2 forward, ": best("throughput", "forward_ms", False) / med("throughput", "triton", "forward_ms", False),
        "... its forward+backward": best("throughput", "fwd_bwd_ms", False) / med("throughput", "triton", "fwd_bwd_ms", False),
        "2.7B training step, bf16, batch 4 x context 256, against the assignment's setting":
            at_assignment["median"].max() / tokens("compiled"),
        "2.7B training step, batch 4 x context 2,048: our FP8 rung": tokens("ours_float8_delayed") / tokens(top),
    }
    seen = set()
    for answer, x in printed.items():
        for key, exact in expected.items():
            if answer.startswith(key):
                assert close(x, exact), (answer, x, exact)
                seen.add(key)
        assert "published" not in rows[answer]["against"], answer  # a published number gets no ratio
        ours, theirs = rows[answer]["ours"], rows[answer]["against"]
        same_unit = next((u for u in (" ms", " TFLOP/s", " tokens/s", " MiB") if u in ours and u in theirs), None)
        if same_unit and "at least" not in ours:  # both sides printed: theirs over ours or ours over theirs
            a, b = number(ours), number(theirs)
            assert close(x, a / b) or close(x, b / a), (answer, x, a, b)
    assert seen == set(expected), f"speed-ups not found in the summary: {set(expected) - seen}"


def tables_and_legends(text: str):
    """(rows marked in the nearest table above, count the legend prints) for every host-bound legend."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(rf"{MARK} host-bound \((\d+|none)(?: here| in the table above)\)", line)
        if not m:
            continue
        j = i - 1
        while j >= 0 and not lines[j].startswith("|"):
            j -= 1
        end = j
        while j >= 0 and lines[j].startswith("|"):
            j -= 1
        table = lines[j + 3:end + 1]  # below the header and its rule
        yield sum(MARK in row for row in table), 0 if m[1] == "none" else int(m[1])


def check_host_bound_counts(text: str) -> None:
    pairs = list(tables_and_legends(text))
    assert pairs, "no host-bound legend"
    for marked, printed in pairs:
        assert marked == printed, f"a legend says {printed} host-bound rows under a table that marks {marked}"


def section(text: str, heading: str) -> str:
    return heading + text.split("\n" + heading, 1)[1].split("\n## ", 1)[0]


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


def check_multi_gpu_row(text: str) -> None:
    row = next(r for a, r in summary_rows(text).items() if "Data-parallel training on" in a)
    assert "not measured on this GPU" in row["ours"] and "another machine" in row["against"], row


# --- the tests ------------------------------------------------------------------------------------

def test_summary_and_glossary_on_the_first_screen(report):
    check_first_screen(report)


def test_summary_one_number_and_one_ratio_a_cell(report):
    check_one_number_a_cell(report)


def test_summary_ratios_are_the_csv_medians(report):
    check_ratios(report)


def test_host_bound_legends_count_their_own_table(report):
    check_host_bound_counts(report)


def test_sections_answer_before_their_first_table(report):
    check_answers_first(report)


def test_no_process_talk(report):
    check_no_process_talk(report)


def test_multi_gpu_row_is_not_another_machines_number(report):
    check_multi_gpu_row(report)


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


def test_fa_figure_is_one_timing_method(report):
    fa = section(report, "## FlashAttention-2 (Triton)")
    alt = re.search(r"!\[([^\]]*)\]\([^)]*fa_tflops", fa)[1]
    assert "GPU time" in alt and "do_bench" not in alt, alt


def check_grid_passes_apart(text: str) -> None:
    fa = section(text, "## FlashAttention-2 (Triton)")
    for column in ("forward: speed-up", "backward: speed-up", "forward+backward: speed-up"):
        assert column in fa, f"the grid has no {column!r} column"
    grid = pd.concat([pd.read_csv(p) for p in sorted((H100 / "flash_attention" / "bench").glob("grid_*.csv"))])
    dims = sorted(int(d) for d in grid["head_dim"].unique())
    unmeasured = [d for d in (16, 32, 64, 128) if d not in dims]
    if unmeasured:
        assert f"the assignment's {' and '.join(map(str, unmeasured))} " in fa and "not in the grid" in fa


def check_peers_labelled(text: str) -> None:
    ladder = section(text, "## The ladder")
    peers = ladder.split("<summary>Peers", 1)[1].split("</details>", 1)[0]
    rows = [l for l in peers.splitlines() if l.startswith("| 2.7B")]
    liger = next(r for r in rows if "liger" in r)
    assert "outside the compiled graph" in liger and "no:" in liger
    for r in rows:
        if "float8" in r:
            assert "not a peer of our FP8 rung" in r and MARK in r, r


def test_grid_forward_and_backward_apart_with_speed_ups(report):
    check_grid_passes_apart(report)


def test_peers_not_in_the_same_setting_say_so(report):
    check_peers_labelled(report)


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
