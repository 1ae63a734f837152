"""Render the README's results block (between the markers) and its figures from one machine's
CSVs:

    python -m lmperf.report.readme --results results/h100-80gb-hbm3 --readme README.md

The README's figures are drawn into report/readme/, where no run of `make report` writes (it
rewrites report/report.md and report/figures/ for the machine it runs on): what the committed
README shows stays whole on any machine.

The block is one table of claims (lmperf.report.claims, computed once from the CSVs): each row
one of our kernels (or our training stack) against the best peer measured at the same settings
(the same shape, precision, context and harness, timed the same way), its speed-up, the noise
band of that speed-up across fresh processes and the verdict the band allows. The block is
never edited by hand; tests/test_report.py checks it is a fresh render and tests/test_claims.py
that every number it prints is a claim's.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import jinja2
import pandas as pd

from lmperf.report import claims, references as published
from lmperf.report.env import run_minutes
from lmperf.report.format import HOST_BOUND, fmt, table
from lmperf.report.render import CONFIG, Inputs, bars_from_config, load_section
from lmperf.report.sections import SECTIONS

# The README's figures (section figures by name), drawn into FIGURES_DIR
FIGURES = ("lrpe_bandwidth",)
FIGURES_DIR = Path("report/readme")
BEGIN = "<!-- results:begin (rendered by python -m lmperf.report.readme; do not edit) -->"
END = "<!-- results:end -->"

# Ours and the peers of FlashAttention-2 as the claims name them (lmperf.report.claims)
FA_OURS = claims.fa_ours()["eager"]
fa_peers = claims.fa_peers

# The README's rows: (claim id prefix, best peer of its configuration, unit): the headline shape
# under the leaderboard's harness (the CS336 leaderboard's call) and as the peers are called,
# the throughput shape's forward and forward+backward, LRPE-cosine's forward and backward, and
# the ladder's training steps. A prefix's claims are ours against each peer; the row shows the
# best peer's.
ROWS = (("flash_attention/headline/bf16/causal/fwd_bwd/leaderboard/do_bench/", "ms"),
        ("flash_attention/headline/bf16/causal/fwd_bwd/eager/do_bench/", "ms"),
        ("flash_attention/throughput/bf16/full/forward/eager/do_bench/", "TFLOP/s"),
        ("flash_attention/throughput/bf16/full/fwd_bwd/eager/do_bench/", "TFLOP/s"),
        ("lrpe/1d/forward/", "ms"), ("lrpe/1d/backward/", "ms"))
HARNESS = {"leaderboard": "leaderboard (`torch.compile` of `apply`)", "eager": "called as it is",
           "training step": "training step"}


def rows_of(table: claims.Claims) -> list[claims.Claim]:
    """The README's claims, in its order: each configuration's claim against its best peer."""
    out = []
    for prefix, _ in ROWS:
        best = table.best([c for c in table.claims if c.id.startswith(prefix)])
        if best is not None:
            out.append(best)
    out += [c for c in table.claims if c.section == "ladder" and dict(c.settings).get("peer") == "best peer rung"]
    return out


def flash_attention_rows(fa: pd.DataFrame, threshold: float) -> list[dict]:
    """The README's FlashAttention-2 rows of a benchmark's rows alone (no repeats: no band)."""
    table = claims.Claims(claims.fa_config_claims(fa[fa["study"] == "bench"] if "study" in fa else fa,
                                                  threshold, {}, False))
    return [row(c) for c in rows_of(table)]


def unit_of(c: claims.Claim) -> str:
    return next((u for prefix, u in ROWS if c.id.startswith(prefix)), c.ours.unit)


def shown(s: claims.Side | None, unit: str) -> float | None:
    """A side's value in the row's unit: its rate where the row is in TFLOP/s."""
    if s is None:
        return None
    return s.rate if unit == "TFLOP/s" else s.value


def row(c: claims.Claim) -> dict:
    """One line of the table as data: the claim, and its values in the row's unit."""
    unit = unit_of(c)
    return {"claim": c, "what": c.what, "unit": unit, "harness": HARNESS.get(c.ours.harness, c.ours.harness),
            "timing": c.ours.timing, "ours": shown(c.ours, unit), "ours_host_bound": c.ours.host_bound,
            "peer": c.peer.label if c.peer else (c.no_peer or claims.NO_PEER), "peer_value": shown(c.peer, unit),
            "peer_host_bound": bool(c.peer and c.peer.host_bound), "speedup": c.speedup, "band": c.band,
            "processes": c.processes, "verdict": c.verdict}


def table_text(rows: list[dict]) -> str:
    """The rows as the README's markdown table: one number a cell, host-bound ones marked."""
    mark = lambda hb: f" {HOST_BOUND}" if hb else ""
    band = lambda r: "" if r["band"] is None else f"{fmt(r['band'][0], 4)}-{fmt(r['band'][1], 4)}x ({r['processes']} processes)"
    shown_rows = [{"configuration": r["what"], "harness": r["harness"], "kernel": r["claim"].ours.kernel or "",
                   "unit": r["unit"], "timed by": r["timing"],
                   "ours": fmt(r["ours"]) + mark(r["ours_host_bound"]),
                   "best peer": r["peer"],
                   "peer": "" if r["peer_value"] is None else fmt(r["peer_value"]) + mark(r["peer_host_bound"]),
                   "speed-up": "" if r["speedup"] is None else f"{fmt(r['speedup'])}x",
                   "noise band": band(r), "verdict": r["verdict"] if r["speedup"] is not None else ""}
                  for r in rows]
    return table(pd.DataFrame(shown_rows))


# The block's line on rows measured at code that has changed since (report/freshness.py), and the
# names it gives their sections
OLDER = "**Measured at older code:**"
OLDER_NAMES = {"ladder": "training", "flash_attention": "FlashAttention-2", "lrpe": "LRPE"}


def inputs_of(results: Path, config: Path = CONFIG) -> Inputs:
    frames = {s.name: load_section(results, s.name) for s in SECTIONS}  # every section: the run's wall time
    return Inputs(results=results, frames=frames, bars=bars_from_config(config), out_dir=Path("report"))


def view(results: Path, config: Path = CONFIG, refs: list[dict] | None = None) -> dict:
    """Everything the block shows, as data: the claims it renders (lmperf.report.claims), the
    run's facts, the published references beside their claims and the MFU."""
    inputs = inputs_of(results, config)
    table = claims.of(inputs)
    frames, env = inputs.frames, inputs.frames["env"]
    threshold = inputs.bars["host_bound_idle_pct"]
    rows = [row(c) for c in rows_of(table)]
    matching = published.matching(refs if refs is not None else published.load(published.REFERENCES), results.name)
    ladder = [c for c in table.claims if c.section == "ladder"]
    chosen = [{"context": dict(c.settings)["context"], "fp8": dict(c.settings)["precision"] == "fp8",
               "rung": c.ours.rung, "name": c.ours.rung_name}
              for c in ladder if dict(c.settings).get("peer") == "best peer rung"]
    return {"hw": results.name, "threshold": threshold, "rows": rows, "chosen": chosen,
            "run_min": run_minutes(frames), "direction": claims.DIRECTION,
            "facts": dict(zip(env["key"], env["value"].astype(str))) if not env.empty else {},
            "mfu": table.mfu,
            "assignment": next((c for c in ladder if dict(c.settings).get("peer") == "the assignment's setting"), None),
            "fp8_vs_bf16": next((c for c in ladder if dict(c.settings).get("peer") == "our best bf16 rung"), None),
            "references": [r for r in claims.references(table, matching) if r["claim"] in [x["claim"] for x in rows]],
            "kernel_recorded": any(r["claim"].ours.kernel for r in rows if r["claim"].section == "flash_attention"),
            "host_bound": sum(r["ours_host_bound"] + r["peer_host_bound"] for r in rows),
            "older": [OLDER_NAMES[s] for s in OLDER_NAMES if any(r["claim"].older and r["claim"].section == s
                                                                 for r in rows)]}


def render_block(results: Path, templates: Path, config: Path = CONFIG) -> str:
    v = view(results, config)
    context = {**v, "table": table_text(v["rows"]) if v["rows"] else "", "older_line": OLDER, "mark": HOST_BOUND}
    env_j2 = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), trim_blocks=True,
                                lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env_j2.filters["fmt"] = fmt
    return env_j2.get_template("readme_results.md.j2").render(**context).strip()


def draw_figures(results: Path, figures_dir: Path = FIGURES_DIR, config: Path = CONFIG) -> dict[str, str]:
    """The README's figures drawn from `results` into `figures_dir`: {name: why} of those that
    could not be (no rows); one not drawn leaves no older image behind."""
    import dataclasses

    from lmperf.report import contenders
    from lmperf.report.render import draw
    from lmperf.report.sections import Inputs, frame_names
    sections = [dataclasses.replace(s, figures={k: v for k, v in s.figures.items() if k in FIGURES})
                for s in SECTIONS if set(s.figures) & set(FIGURES)]
    frames = contenders.wrong_everywhere({name: load_section(results, name) for name in frame_names(sections)})
    inputs = Inputs(results=results, frames=frames, bars=bars_from_config(config), out_dir=figures_dir.parent,
                    scale="", models={})
    drawn, not_drawn = draw(inputs, figures_dir, sections)
    for name in not_drawn:
        (figures_dir / dict(f for s in sections for f in s.figures.items())[name]).unlink(missing_ok=True)
    return not_drawn


def replace_block(text: str, block: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"README has no results block ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--readme", type=Path, default=Path("README.md"))
    p.add_argument("--templates", type=Path, default=Path("templates"))
    args = p.parse_args(argv)
    args.readme.write_text(replace_block(args.readme.read_text(), render_block(args.results, args.templates)))
    not_drawn = draw_figures(args.results, args.readme.parent / FIGURES_DIR)
    print(f"updated the results block of {args.readme} and its figures in {FIGURES_DIR}/"
          + "".join(f"\n  {name} not drawn: {why}" for name, why in not_drawn.items()))


if __name__ == "__main__":
    main()
