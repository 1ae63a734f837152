"""Render the README's results block (between the markers) and its figures from one machine's
CSVs:

    python -m lmperf.report.readme --results results/h100-80gb-hbm3 --readme README.md

The README's figures are drawn into report/readme/, where no run of `make report` writes (it
rewrites report/report.md and report/figures/ for the machine it runs on): what the committed
README shows stays whole on any machine.

The block is one table: each row one of our kernels (or our training stack) against the best
peer measured in the same setting (the same shape, precision and context, timed the same way),
one number a cell and the ratio beside it. The block is never edited by hand;
tests/test_report.py checks it is a fresh render and recomputes every number it prints.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import jinja2
import pandas as pd

from lmperf import providers
from lmperf.report import freshness
from lmperf.report.e2e import BF16_MFU, peaks, size_order, with_bf16_mfu
from lmperf.report.env import run_minutes
from lmperf.report.format import HOST_BOUND, fmt, host_bound, table
from lmperf.report.ladder import is_contender, is_peer
from lmperf.report.render import CONFIG, bars_from_config, load_section
from lmperf.report.sections import SECTIONS

# The README's figures (section figures by name), drawn into FIGURES_DIR
FIGURES = ("lrpe_bandwidth",)
FIGURES_DIR = Path("report/readme")
BEGIN = "<!-- results:begin (rendered by python -m lmperf.report.readme; do not edit) -->"
END = "<!-- results:end -->"

# The peers of each kernel as the table names them. torch.compile of PyTorch's attention is left
# out of the FlashAttention-2 peers: on a static non-causal graph Inductor replaces it by SDPA
# (the block's note says so with its numbers), so it is not an implementation of its own.
FA_COMPILED_PLAIN = "plain_compiled"
# ours as the peers run (no harness of its own), and the peers with their labels: the registry's
# (lmperf.providers), but for torch.compile'd PyTorch attention and our own tiled PyTorch twin
FA_OURS = next(p.name for p in providers.providers("attention", "ours") if p.harness is None)
def fa_peers() -> dict[str, str]:
    """{name: label} of the peers the README's FlashAttention-2 rows weigh (asked at each render:
    a provider module may add one)."""
    return {p.name: p.label for p in providers.providers("attention", "peer")
            if p.name != FA_COMPILED_PLAIN and not p.label.startswith("ours")}
LRPE_OURS = "triton"
LRPE_PEERS = {"torch_compile": "torch.compile", "torch": "PyTorch"}
# The ladder's peer rungs (bench/ladder.py's PEERS: their change starts with "peer")
LADDER_PEERS = {"liger": "Liger-Kernel", "float8_tensorwise": "torchao float8, tensorwise",
                "float8_rowwise": "torchao float8, rowwise"}


def _ok(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    return df[(df["metric"] == metric) & (df["status"] == "ok")]


def _row(what: str, unit: str, timing: str, ours: float, ours_hb: bool, peer: str | None,
         peer_value: float | None, peer_hb: bool, higher_is_better: bool, no_peer: str = "none measured") -> dict:
    """One line of the table as numbers: ours, the best peer, and ours / peer as a speed-up
    (peer time / our time, or our rate / peer rate: above 1 where ours is faster)."""
    ratio = None
    if peer_value is not None and math.isfinite(peer_value) and peer_value > 0 and ours > 0:
        ratio = ours / peer_value if higher_is_better else peer_value / ours
    return {"what": what, "unit": unit, "timing": timing, "ours": ours, "ours_host_bound": ours_hb,
            "peer": peer or no_peer, "peer_value": peer_value, "peer_host_bound": peer_hb, "speedup": ratio}


def _best(values: dict[str, tuple[float, bool]], higher_is_better: bool) -> tuple[str | None, float | None, bool]:
    """The best of {name: (value, host-bound)}: (name, value, host-bound), or Nones."""
    values = {k: v for k, v in values.items() if v[0] is not None and math.isfinite(v[0])}
    if not values:
        return None, None, False
    name = (max if higher_is_better else min)(values, key=lambda k: values[k][0])
    return name, *values[name]


def _value(rows: pd.DataFrame, metric: str, threshold: float) -> tuple[float | None, bool]:
    """(median, host-bound) of the one ok row of `metric` in `rows`, or (None, False)."""
    r = _ok(rows, metric)
    if r.empty:
        return None, False
    return float(r["median"].iloc[0]), bool(host_bound(r.iloc[[0]], threshold).iloc[0])


def flash_attention_rows(fa: pd.DataFrame, threshold: float) -> list[dict]:
    """The FlashAttention-2 headline (forward+backward time, causal) and throughput (forward
    TFLOP/s, non-causal) configurations: ours under the harness the peers ran under."""
    out = []
    if fa.empty:
        return out
    groups = (("headline", True, "fwd_bwd_ms", "forward+backward", "ms", False),
              ("throughput", False, "forward_tflops", "forward", "TFLOP/s", True))
    for group, causal, metric, what, unit, higher in groups:
        sel = fa[(fa["group"] == group) & (fa["causal"].astype(str).str.lower() == str(causal).lower())]
        harness = sel[sel["provider"].isin(list(fa_peers()))]["harness"].dropna().unique() if "harness" in sel else []
        if len(harness) == 1:
            sel = sel[sel["harness"] == harness[0]]
        ours, ours_hb = _value(sel[sel["provider"] == FA_OURS], metric, threshold)
        if ours is None:
            continue
        first = _ok(sel[sel["provider"] == FA_OURS], metric).iloc[0]
        peer, peer_value, peer_hb = _best({label: _value(sel[sel["provider"] == p], metric, threshold)
                                           for p, label in fa_peers().items()}, higher)
        timing = "GPU time" if str(first.get("gpu_time")).lower() == "true" else "do_bench (host included)"
        shape = (f"{int(first['batch'])} x {int(first['heads'])} heads x {int(first['seq_len']):,} x "
                 f"{int(first['head_dim'])}, {'causal' if causal else 'non-causal'}, {first['dtype']}")
        out.append(_row(f"FlashAttention-2 {what}, {shape}", unit, timing, ours, ours_hb, peer, peer_value,
                        peer_hb, higher))
    return out


def compiled_plain_note(fa: pd.DataFrame) -> dict | None:
    """torch.compile of PyTorch's attention beside SDPA-cuDNN at the throughput configuration
    (forward TFLOP/s), the numbers behind leaving it out of the peers; None without its rows."""
    sel = fa[(fa["group"] == "throughput") & (fa["causal"].astype(str).str.lower() == "false")] if not fa.empty else fa
    if sel.empty:
        return None
    compiled, _ = _value(sel[sel["provider"] == FA_COMPILED_PLAIN], "forward_tflops", math.inf)
    cudnn, _ = _value(sel[sel["provider"] == "sdpa_cudnn"], "forward_tflops", math.inf)
    return None if compiled is None or cudnn is None else {"compiled": compiled, "cudnn": cudnn,
                                                           "cudnn_label": fa_peers().get("sdpa_cudnn", "sdpa_cudnn")}


def lrpe_rows(lrpe: pd.DataFrame, threshold: float) -> list[dict]:
    """The LRPE-cosine 1-D bench at its largest size, forward and backward, on the kernel
    (profiler) time where the run measured it."""
    ok = lrpe[(lrpe["status"] == "ok") & (lrpe["dims"] == 1) & (lrpe["l"] == 0)] if not lrpe.empty else lrpe
    if ok.empty:
        return []
    big = ok[ok["side"] == ok["side"].max()]
    kernel = (big["metric"] == "forward_kernel_ms").any()
    suffix, timing = ("_kernel_ms", "kernel time (profiler)") if kernel else ("_ms", "do_bench (host included)")
    first = big.iloc[0]
    shape = (f"{int(first['batch'])} x {int(first['heads'])} heads x {int(first['tokens']):,} tokens x "
             f"{int(first['d'])}, {first['dtype']}")
    out = []
    for direction in ("forward", "backward"):
        metric = direction + suffix
        ours, ours_hb = _value(big[big["provider"] == LRPE_OURS], metric, threshold)
        if ours is None:
            continue
        peer, peer_value, peer_hb = _best({label: _value(big[big["provider"] == p], metric, threshold)
                                           for p, label in LRPE_PEERS.items()}, False)
        out.append(_row(f"LRPE-cosine 1-D {direction}, {shape}", "ms", timing, ours, ours_hb, peer,
                        peer_value, peer_hb, False))
    return out


def rung_kind(rungs: pd.DataFrame) -> pd.Series:
    """Per ladder row: "peer" (another library's kernels or recipe, bench/ladder.py's PEERS),
    "contender" (a user's attention in place of ours, lmperf.contenders.ladder_rungs: neither
    ours nor a peer, even where it wraps our kernels), "pytorch" (none of our kernels: PyTorch's
    own settings) or "ours" (at least one of ours)."""
    none = lambda col: rungs[col].fillna("none").astype(str).eq("none") if col in rungs else True
    peer, contender = is_peer(rungs), is_contender(rungs)
    pytorch = ~peer & (rungs["attention"] != "flash-triton") & (rungs["optimizer"] != "master") \
        & none("fused") & none("float8")
    return (pd.Series("ours", index=rungs.index).mask(pytorch, "pytorch").mask(peer, "peer")
            .mask(contender, "contender"))


def rung_label(r: pd.Series) -> str:
    """A peer rung as the table names it: the library, or PyTorch's settings."""
    if str(r["change"]).startswith("peer"):
        return f"{LADDER_PEERS.get(r['name'], r['name'])} (rung {int(r['rung'])})"
    parts = [p for p, on in (("torch.compile", str(r["compile"]).lower() == "true"),
                             ("fused AdamW", r["optimizer"] == "fused"), ("SDPA", r["attention"] == "sdpa")) if on]
    return f"PyTorch: {', '.join(parts) or 'eager'} (rung {int(r['rung'])})"


def training_rows(ladder: pd.DataFrame, threshold: float) -> tuple[list[dict], list[dict]]:
    """The ladder's largest model: at the assignment's context and at the context of the best
    bf16 rung of ours, our fastest rung (tokens/s) against the fastest peer rung of the same
    context and precision; then our FP8 rung against the FP8 peers of its context. A context
    change is never a row's speed-up: both sides of a row share it. (rows, our rung of each)."""
    if ladder.empty:
        return [], []
    size = size_order(ladder)[-1]  # the largest model the ladder ran
    g = ladder[(ladder["size"] == size) & (ladder["name"] != "floors")]
    tok = _ok(g, "tokens_per_s")
    tok = tok.assign(kind=rung_kind(tok), fp8=tok["float8"].fillna("none").astype(str).ne("none")
                     if "float8" in tok else False)
    tok = tok[tok["dtype"] == "bf16"]
    if tok.empty:
        return [], []
    ours = tok[(tok["kind"] == "ours") & ~tok["fp8"]]
    contexts = [int(c) for c in tok[tok["name"] == "compiled"]["context"].iloc[:1]]  # the assignment's
    if len(ours):
        contexts.append(int(ours.loc[ours["median"].idxmax(), "context"]))  # our best bf16 rung's
    plan = [(c, False) for c in dict.fromkeys(contexts)]
    fp8_ours = tok[(tok["kind"] == "ours") & tok["fp8"]]
    if len(fp8_ours):
        plan.append((int(fp8_ours.loc[fp8_ours["median"].idxmax(), "context"]), True))
    rows, chosen = [], []
    for context, fp8 in plan:
        same = tok[(tok["context"] == context) & (tok["fp8"] == fp8)]
        mine, peers = same[same["kind"] == "ours"], same[same["kind"].isin(["peer", "pytorch"])]
        if mine.empty:
            continue
        best = mine.loc[mine["median"].idxmax()]
        hb = lambda r: bool(host_bound(r.to_frame().T, threshold).iloc[0])
        peer = peers.loc[peers["median"].idxmax()] if len(peers) else None
        precision = f"FP8 (ours: {best['float8']} scaling)" if fp8 else "bf16"
        rows.append(_row(f"{size} training step, {precision}, batch {int(best['batch_size'])} x context "
                         f"{context:,}", "tokens/s", "median step", float(best["median"]), hb(best),
                         None if peer is None else rung_label(peer),
                         None if peer is None else float(peer["median"]), False if peer is None else hb(peer), True,
                         no_peer=f"none at context {context:,}"))
        chosen.append({"context": context, "fp8": fp8, "rung": int(best["rung"]), "name": best["name"],
                       "case_id": best["case_id"]})
    return rows, chosen


def against_assignment(ladder: pd.DataFrame, chosen: list[dict], threshold: float) -> dict | None:
    """Our best bf16 rung at the assignment's context against the assignment's setting (bf16,
    torch.compile: the ladder's rung "compiled") of the same job: the speed-up of tokens/s, and
    whether either side is host-bound; None without that rung."""
    tok = _ok(ladder, "tokens_per_s")
    ours = next((c for c in chosen if not c["fp8"]), None)  # the first: at the assignment's context
    if ours is None:
        return None
    mine = tok[tok["case_id"] == ours["case_id"]].iloc[0]
    base = tok[(tok["name"] == "compiled") & (tok["size"] == mine["size"]) & (tok["context"] == ours["context"])]
    if base.empty:
        return None
    base = base.iloc[0]
    bound = bool(host_bound(pd.DataFrame([mine, base]), threshold).any())
    return {"rung": int(base["rung"]), "context": int(base["context"]), "ours_rung": ours["rung"],
            "speedup": float(mine["median"]) / float(base["median"]), "host_bound": bound}


def table_text(rows: list[dict]) -> str:
    """The rows as the README's markdown table: one number a cell, host-bound ones marked."""
    mark = lambda hb: f" {HOST_BOUND}" if hb else ""
    shown = [{"configuration": r["what"],
              "unit": r["unit"], "timed by": r["timing"],
              "ours": fmt(r["ours"]) + mark(r["ours_host_bound"]),
              "best peer": r["peer"],
              "peer": "" if r["peer_value"] is None else fmt(r["peer_value"]) + mark(r["peer_host_bound"]),
              "ours vs peer": "" if r["speedup"] is None else
              f"{fmt(r['speedup'])}x" + mark(r["ours_host_bound"] or r["peer_host_bound"])}
             for r in rows]
    return table(pd.DataFrame(shown))


def best_mfu(ladder: pd.DataFrame, chosen: list[dict]) -> dict | None:
    """MFU (against the bf16 peak) and TFLOP/s of our best bf16 rung (the table's last bf16
    row), for the line under the table."""
    bf16 = [c for c in chosen if not c["fp8"]]
    if not bf16:
        return None
    case_id = bf16[-1]["case_id"]
    rows = with_bf16_mfu(ladder[(ladder["case_id"] == case_id) & (ladder["status"] == "ok")])
    value = lambda m: float(rows[rows["metric"] == m]["median"].iloc[0]) if (rows["metric"] == m).any() else None
    mfu, tflops = value(BF16_MFU), value("tflops")
    return None if mfu is None else {"mfu": mfu, "tflops": tflops, **bf16[-1]}


# The block's line on rows measured at code that has changed since (report/freshness.py), and the
# names it gives their sections
OLDER = "**Measured at older code:**"
OLDER_NAMES = {"ladder": "training", "flash_attention": "FlashAttention-2", "lrpe": "LRPE"}


def view(results: Path, config: Path = CONFIG) -> dict:
    """Everything the block shows, as numbers (the tests recompute them from the CSVs)."""
    threshold = bars_from_config(config)["host_bound_idle_pct"]
    frames = {s.name: load_section(results, s.name) for s in SECTIONS}  # every section: the run's wall time
    ladder, env, fa, lrpe = frames["ladder"], frames["env"], frames["flash_attention"], frames["lrpe"]
    fa = fa[fa["study"] == "bench"] if not fa.empty else fa
    lrpe = lrpe[lrpe["study"] == "bench"] if not lrpe.empty else lrpe
    train, chosen = training_rows(ladder, threshold)
    rows = flash_attention_rows(fa, threshold) + lrpe_rows(lrpe, threshold) + train
    mfu = ladder[(ladder["metric"] == "mfu_pct") & (ladder["status"] == "ok")] if not ladder.empty else ladder
    return {"hw": results.name, "threshold": threshold, "rows": rows, "chosen": chosen, "run_min": run_minutes(frames),
            "facts": dict(zip(env["key"], env["value"].astype(str))) if not env.empty else {},
            "best": best_mfu(ladder, chosen) if not ladder.empty else None,
            "assignment": against_assignment(ladder, chosen, threshold) if not ladder.empty else None,
            "peaks": peaks(mfu) if not mfu.empty else {},
            "compiled_plain": compiled_plain_note(fa),
            "host_bound": sum(r["ours_host_bound"] + r["peer_host_bound"] for r in rows),
            "frames": {"ladder": ladder, "flash_attention": fa, "lrpe": lrpe}}


def render_block(results: Path, templates: Path, config: Path = CONFIG) -> str:
    v = view(results, config)
    code = freshness.view(v.pop("frames"))
    context = {**v, "table": table_text(v["rows"]) if v["rows"] else "",
               "older": [OLDER_NAMES[s] for s in code["changed"]], "older_line": OLDER, "mark": HOST_BOUND}
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
