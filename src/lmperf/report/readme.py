"""Render the README's results block (between the markers) from one machine's CSVs:

    python -m lmperf.report.readme --results results/h100-80gb-hbm3 --readme README.md

The block is never edited by hand; tests/test_report.py checks it matches a fresh render.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import jinja2
import pandas as pd

from lmperf.report.e2e import BF16_MFU, peaks, precision, size_order, with_bf16_mfu
from lmperf.report.ladder import ladder as ladder_view
from lmperf.report.env import measured_seconds
from lmperf import providers
from lmperf.report import freshness
from lmperf.report.flash_attention import OURS
from lmperf.report.format import HOST_BOUND, fmt, host_bound, host_bound_legend, table
from lmperf.report.render import CONFIG, bars_from_config, load_section

BEGIN = "<!-- results:begin (rendered by python -m lmperf.report.readme; do not edit) -->"
END = "<!-- results:end -->"


def headline(e2e: pd.DataFrame, ladder: pd.DataFrame, threshold: float) -> tuple[str, dict | None]:
    """Per model size: the training step (median) in each variant at the variants study's context,
    and the best rung of the ladder where there is one; (the table, one best rung for the prose or
    None). A host-bound time (GPU idle above `threshold` %) is marked, and a ratio from a host-bound
    rung says so."""
    v = e2e[(e2e["study"] == "variants") & (e2e["mode"] == "train") & (e2e["status"] == "ok")]
    v = with_bf16_mfu(v)
    v = v.assign(variant=v["dtype"] + " " + v["compile"].astype(str).str.lower()
                 .map({"true": "compiled", "false": "eager"}))
    step = v[v["metric"] == "step_ms"].pivot_table(index="size", columns="variant", values="median")
    tflops = v[v["metric"] == "tflops"].pivot_table(index="size", columns="variant", values="median")
    mfu = v[v["metric"] == BF16_MFU].pivot_table(index="size", columns="variant", values="median")
    own = v[(v["metric"] == "mfu_pct") & (precision(v) != "bf16")]
    own = own.assign(peak=precision(own)).pivot_table(index="size", columns=["variant", "peak"], values="median")
    order = [s for s in size_order(e2e) if s in step.index]
    best = ladder_view(ladder, {}, threshold).get("best", {})
    bound = v[(v["metric"] == "step_ms") & host_bound(v, threshold)]
    bound = set(zip(bound["size"], bound["variant"]))
    rows = []
    for size in order:
        row = {"model": size}
        for variant in ("fp32 eager", "fp32 compiled", "bf16 eager", "bf16 compiled"):
            if variant in step.columns:
                cell = f"{fmt(step.loc[size, variant])} ms" + (f" {HOST_BOUND}" if (size, variant) in bound else "")
                if variant in mfu.columns:
                    rate = f"{fmt(tflops.loc[size, variant])} TFLOP/s, " if variant in tflops.columns else ""
                    others = "".join(f"; {fmt(own.loc[size, (variant, p)])}% of {p} peak"
                                     for p in own.columns.get_level_values("peak").unique() if (variant, p) in own.columns)
                    cell += f" ({rate}{fmt(mfu.loc[size, variant])}% MFU{others})"
                row[variant] = cell
        if best:
            b = best.get(size)
            row["best rung of the ladder"] = "" if b is None else (
                f"{fmt(b['step_ms'])} ms ({fmt(b['tflops'])} TFLOP/s, {fmt(b['mfu'])}% MFU; "
                f"{str(b['micro_batches']) + ' micro-batches of ' if b['micro_batches'] > 1 else ''}"
                f"{b['batch_size']} x {b['context']:,}, "
                f"{b['backend'] or b['attention']}, AdamW {b['optimizer']}; {fmt(b['vs_assignment'])}x "
                f"the bf16 compiled tokens/s{'; host-bound (' + ', '.join(b['host_bound']) + '): not a claim' if b['host_bound'] else ''})")
        rows.append(row)
    return table(pd.DataFrame(rows)), next(iter(best.values()), None)


def fa_providers(fa: pd.DataFrame) -> dict[str, str]:
    """The README's FlashAttention-2 columns: ours, and each other provider with rows in `fa`, by
    their labels (lmperf.providers)."""
    others = {p.name: p.label for p in providers.providers("attention") if p.role != "ours"}
    return {"ours": providers.get(OURS[-1]).label,
            **{p: label for p, label in others.items() if (fa["provider"] == p).any()}}


LRPE_PROVIDERS = {"triton": "ours (Triton)", "triton_cache": "ours, angle cache",
                  "torch_compile": "torch.compile", "torch": "PyTorch"}


def _median(df: pd.DataFrame, metric: str) -> float | None:
    """A kernel bench's value: do_bench's median (its rows may have no mean)."""
    m = df[(df["metric"] == metric) & (df["status"] == "ok")]["median"]
    return float(m.iloc[0]) if len(m) else None


def _mark(df: pd.DataFrame, metric: str, threshold: float) -> str:
    """The host-bound mark (with its space) if the metric's row is host-bound, else ""."""
    r = df[(df["metric"] == metric) & (df["status"] == "ok")]
    return f" {HOST_BOUND}" if host_bound(r, threshold).any() else ""


def kernels(fa: pd.DataFrame, lrpe: pd.DataFrame, threshold: float) -> str:
    """Our two kernels against their peers, one row per headline configuration, read from the
    FlashAttention-2 headline/throughput jobs and the LRPE 1-D bench at its largest size."""
    rows = []

    def fa_row(what: str, sel, metric: str):
        # ours as the report's bars read it: under the leaderboard's harness where the group has it
        ours = next((p for p in OURS if (sel["provider"] == p).any()), OURS[-1])
        if ours == "triton_compiled":
            what += " (ours under the leaderboard's harness, torch.compile)"
        row = {"kernel, configuration": what}
        for p, label in fa_providers(fa[fa["group"].isin(["headline", "throughput"])]).items():
            p = ours if p == "ours" else p
            v = _median(sel[sel["provider"] == p], metric)
            row[label] = "" if v is None else fmt(v) + _mark(sel[sel["provider"] == p], metric, threshold)
        rows.append(row)
    if not fa.empty:
        head = fa[fa["group"] == "headline"]
        thr = fa[(fa["group"] == "throughput") & (fa["causal"].astype(str).str.lower() == "false")]
        if not head.empty:
            fa_row("FlashAttention-2 fwd+bwd ms, 16 heads x 16,384 x 64, causal, bf16", head, "fwd_bwd_ms")
        if not thr.empty:
            fa_row("FlashAttention-2 forward TFLOP/s, 4 x 16 heads x 8,192 x 128, bf16", thr, "forward_tflops")
    out = table(pd.DataFrame(rows)) if rows else ""
    ok = lrpe[(lrpe["status"] == "ok") & (lrpe["dims"] == 1) & (lrpe["l"] == 0)] if not lrpe.empty else lrpe
    if not ok.empty:
        side = ok["side"].max()
        big = ok[ok["side"] == side]
        # the timing the section's bars use: kernel time (host left out) where the run measured it
        timing, how = ("_kernel", "kernel ms") if (big["metric"] == "forward_kernel_ms").any() else ("", "ms per call")
        lrows = []
        for direction in ("forward", "backward"):
            row = {f"LRPE-cosine 1-D, {int(side):,} tokens, bf16": f"{direction} {how} (share of copy bandwidth)"}
            for p, label in LRPE_PROVIDERS.items():
                g = big[big["provider"] == p]
                ms, frac = _median(g, f"{direction}{timing}_ms"), _median(g, f"{direction}{timing}_copy_fraction")
                row[label] = "" if ms is None else (f"{fmt(ms)} ({fmt(100 * frac)}%)"
                                                    + _mark(g, f"{direction}{timing}_ms", threshold))
            lrows.append(row)
        out += "\n\n" + table(pd.DataFrame(lrows))
    return out


def steps_text(rows: pd.DataFrame) -> str:
    """How many timed steps the rows' medians are over, e.g. "10" or "5-20"."""
    n = rows[(rows["metric"] == "step_ms") & (rows["status"] == "ok")]["n"].dropna().astype(int)
    return "?" if n.empty else f"{n.min()}" if n.min() == n.max() else f"{n.min()}-{n.max()}"


# The block's line on rows measured at code that has changed since (report/freshness.py), and the
# names it gives their sections
OLDER = "**Measured at older code:**"
OLDER_NAMES = {"e2e": "end-to-end", "ladder": "ladder (the last column)", "flash_attention": "FlashAttention-2",
               "lrpe": "LRPE"}


def render_block(results: Path, templates: Path, config: Path = CONFIG) -> str:
    e2e = load_section(results, "e2e")
    ladder = load_section(results, "ladder")
    env = load_section(results, "env")
    facts = dict(zip(env["key"], env["value"].astype(str))) if not env.empty else {}
    fa = load_section(results, "flash_attention")
    fa = fa[fa["study"] == "bench"] if not fa.empty else fa
    lrpe = load_section(results, "lrpe")
    lrpe = lrpe[lrpe["study"] == "bench"] if not lrpe.empty else lrpe
    seconds = measured_seconds({"e2e": e2e, "ladder": ladder})
    threshold = bars_from_config(config)["host_bound_idle_pct"]
    table_text, best = headline(e2e, ladder, threshold)
    mfu = pd.concat([e2e, ladder], ignore_index=True)  # the ladder's TF32 rung has a peak of its own
    variants = e2e[(e2e["study"] == "variants") & (e2e["mode"] == "train")]
    context = {"hw": results.name, "facts": facts, "headline": table_text, "ladder": best,
               "steps": steps_text(variants), "warmup": "/".join(map(str, sorted(set(variants["warmup"].astype(int))))),
               "ladder_steps": steps_text(ladder) if not ladder.empty else "",
               "kernels": kernels(fa, lrpe, threshold),
               "context": int(e2e[e2e["study"] == "variants"]["context"].iloc[0]),
               "batch_size": int(e2e["batch_size"].iloc[0]),
               "minutes": fmt(sum(seconds.values()) / 60),
               "peaks": peaks(mfu[(mfu["metric"] == "mfu_pct") & (mfu["status"] == "ok")])}
    code = freshness.view({"e2e": e2e, "ladder": ladder, "flash_attention": fa, "lrpe": lrpe})
    context["older"] = [OLDER_NAMES[s] for s in code["changed"]]
    marked = (table_text + context["kernels"]).count(HOST_BOUND)
    context["host_bound"] = {**host_bound_legend(e2e, threshold), "n": marked}
    env_j2 = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), trim_blocks=True,
                                lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env_j2.get_template("readme_results.md.j2").render(**context, older_line=OLDER).strip()


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
    print(f"updated the results block of {args.readme}")


if __name__ == "__main__":
    main()
