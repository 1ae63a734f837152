"""The report's figures: drawn from the timing the section's tables and bars use, no empty panel
or tick, and no image without data (the report says in one line why there is no figure)."""
import re
import shutil
from pathlib import Path

import pytest

from conftest import committed, committed_files
from lmperf.report import flash_attention, ladder, lrpe, render
from lmperf.report.sections import Inputs, figure_paths

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "results" / "h100-80gb-hbm3"
H100 = REPO / "results" / "h100-80gb-hbm3"
BARS = render.bars_from_config(REPO / "config" / "config.yaml")


def drawn(monkeypatch, module, section: str, results: Path = H100, frame=None) -> list:
    """The matplotlib figures `module.figures` draws from `results` (or `frame`), kept instead of saved."""
    figs = []
    # the FlashAttention-2 section draws in a module of its own
    from lmperf.report import flash_attention, flash_attention_figures
    where = flash_attention_figures if module is flash_attention else module
    monkeypatch.setattr(where, "save", lambda fig, path: figs.append(fig))
    frame = render.load_section(results, section) if frame is None else frame
    inputs = Inputs(results=results, frames={section: frame}, bars=BARS, out_dir=results)
    assert module.figures(inputs, figure_paths(results)) == {}
    return figs


def lines(ax) -> dict:
    """{legend label: (x, y)} of an axes' plotted lines."""
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_flash_attention_figure_plots_gpu_time_where_measured_and_no_empty_panel(monkeypatch):
    """Where the grid has GPU time, every line is GPU time (one timing method on the figure), one
    panel a dtype and head dim with rows; the ratio figure is drawn beside it."""
    fig, ratio = drawn(monkeypatch, flash_attention, "flash_attention")
    grid = render.load_section(H100, "flash_attention").query("group == 'grid' and status == 'ok'")
    panels = grid[grid["metric"] == "fwd_bwd_tflops"].groupby(["dtype", "head_dim"]).ngroups
    assert len(fig.axes) == panels  # one a dtype and head dim with rows, none left empty
    ax = next(a for a in fig.axes if a.get_title() == "bf16, D=64")
    got = lines(ax)
    gpu = grid[(grid["dtype"] == "bf16") & (grid["head_dim"] == 64) & (grid["provider"] == "triton")
               & (grid["metric"] == "fwd_bwd_gpu_tflops")].sort_values("seq_len")
    assert got["triton"] == (list(gpu["seq_len"]), list(gpu["median"]))
    assert set(got) == {"triton", "plain_compiled"}  # the providers with GPU time, nothing by do_bench
    assert "GPU time (CUDA graph) on every line" in fig._suptitle.get_text()
    assert "GPU time (CUDA graph) on both sides" in ratio._suptitle.get_text()


def test_a_dtype_and_head_dim_without_rows_has_no_panel_and_do_bench_alone_says_so(monkeypatch):
    df = render.load_section(H100, "flash_attention")
    df = df[~((df["dtype"] == "fp32") & (df["head_dim"] == 128)) & ~df["metric"].astype(str).str.contains("gpu")]
    figs = []
    from lmperf.report import flash_attention_figures
    monkeypatch.setattr(flash_attention_figures, "save", lambda fig, path: figs.append(fig))
    inputs = Inputs(results=H100, frames={"flash_attention": df}, bars=BARS, out_dir=H100)
    assert flash_attention.figures(inputs, figure_paths(H100)) == {
        "fa_ratio": "no shape has GPU time (CUDA graph) for ours and a peer here"}
    (fig,) = figs
    grid = df.query("group == 'grid' and status == 'ok'")
    panels = grid[grid["metric"] == "fwd_bwd_tflops"].groupby(["dtype", "head_dim"]).ngroups
    assert len(fig.axes) == panels >= 3 and "fp32, D=128" not in {ax.get_title() for ax in fig.axes}
    assert fig._suptitle.get_text() == "FlashAttention-2 grid, forward+backward, do_bench (host included) on every line"


def test_lrpe_figure_uses_the_kernel_time_its_bars_use(monkeypatch):
    (fig,) = drawn(monkeypatch, lrpe, "lrpe")
    bench = render.load_section(H100, "lrpe")
    assert lrpe.view(Inputs(results=H100, frames={"lrpe": bench}, bars=BARS, out_dir=H100))["kernel"]
    forward = fig.axes[0]
    assert forward.get_title() == "LRPE-cosine forward, by kernel time"
    rows = bench[(bench["provider"] == "triton") & (bench["dims"] == 1) & (bench["l"] == 0)
                 & (bench["metric"] == "forward_kernel_gbs")].sort_values("tokens")
    assert lines(forward)["triton 1-D"] == (list(rows["tokens"]), list(rows["median"]))


def test_ladder_figure_has_a_tick_per_rung_and_none_for_the_floors(monkeypatch):
    (fig,) = drawn(monkeypatch, ladder, "ladder")
    ticks = [t.get_text() for t in fig.axes[-1].get_xticklabels()]
    rungs = render.load_section(H100, "ladder").query("name != 'floors'").drop_duplicates("rung")
    assert "floors" not in ticks and ticks == list(rungs.sort_values("rung")["name"])


def test_only_figures_with_rows_are_drawn_and_a_stale_one_is_removed(tmp_path):
    """The fixture has end-to-end rows only: its two figures are the only images; a figure that
    has no rows in a later render leaves no image of the earlier one behind."""
    out, figures = tmp_path / "report" / "report.md", tmp_path / "report" / "figures"
    render.render(FIXTURE, REPO / "templates", out, figures, "full", BARS)
    assert sorted(p.name for p in figures.iterdir()) == ["e2e_step_vs_context.png", "e2e_step_vs_size.png"]
    results = tmp_path / "results" / "h100-80gb-hbm3"
    shutil.copytree(FIXTURE, results)
    shutil.rmtree(results / "e2e" / "context")
    text = render.render(results, REPO / "templates", out, figures, "full", BARS)
    assert sorted(p.name for p in figures.iterdir()) == ["e2e_step_vs_size.png"]
    assert "e2e_step_vs_context.png" not in text


@pytest.mark.parametrize("context, line", [
    ({"figures": {"x": "figures/x.png"}, "no_figure": {}}, "![An x](figures/x.png)\n"),
    ({"figures": {}, "no_figure": {"x": "no case of x ran ok here"}}, "No figure: no case of x ran ok here.\n"),
])
def test_a_figure_line_is_the_image_or_why_there_is_none(context, line):
    template = '{% with name = "x", alt = "An x" %}{% include "figure.md.j2" %}{% endwith %}\nnext\n'
    text = render.environment(REPO / "templates").from_string(template).render(**context)
    assert text == line + "next\n"


def test_a_figure_neither_written_nor_explained_stops_the_render(tmp_path, monkeypatch):
    from lmperf.report import e2e
    monkeypatch.setattr(e2e, "figures", lambda inputs, paths: {})
    with pytest.raises(RuntimeError, match="neither wrote"):
        render.render(FIXTURE, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "full", BARS)
    assert not (tmp_path / "r.md").exists()


@pytest.mark.committed
def test_no_placeholder_image_is_committed():
    """Every committed figure is one the committed page beside its folder links (both read from
    git: `make report` rewrites report/report.md and report/figures/ for this machine)."""
    files = committed_files("report")
    figures = [f for f in files if re.fullmatch(r"(.+/)?figures/[^/]+\.png", f)]
    pages = {f.rsplit("/", 1)[0]: f for f in files if re.fullmatch(r"report/(\w[\w.-]*/)*(report|distributed)\.md", f)}
    assert figures and "report/report.md" in pages.values()
    for png in figures:
        folder, name = png.rsplit("/figures/", 1)
        assert folder in pages, f"{png}: no report.md or distributed.md committed beside its figures/"
        assert f"](figures/{name})" in committed(pages[folder]), f"{png} is not in {pages[folder]}"
