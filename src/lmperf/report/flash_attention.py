"""FlashAttention-2 (Triton) against PyTorch's attention: the bars, one table per headline
configuration, the model group (forward+backward and backward alone by GPU time), grouped-query
attention against SDPA's backends, where ours is still slower than cuDNN, the grid
(forward+backward ms per sequence length) and its TFLOP/s figure."""
from __future__ import annotations

import pandas as pd

import math

from lmperf import providers
from lmperf.report import claims
from lmperf.report.format import HOST_BOUND, bar, cell, fmt, host_bound, host_bound_legend, unavailable
from lmperf.report.flash_attention_figures import ratio_figure, same_kernel, tflops_figure

def peers() -> list[str]:
    """The providers ours is compared with, in the registry's order (lmperf.providers): the peers,
    then any contender."""
    return providers.names("attention", role="peer") + providers.names("attention", role="contender")


# Ours: under the leaderboard's harness (torch.compile around apply) where the group has it.
OURS = providers.names("attention", role="ours")
DIRECTIONS = {"forward": "forward", "backward": "backward", "fwd_bwd": "forward+backward"}
# do_bench gives medians (and, in newer rows, the 20% and 80% quantiles), not means.
CENTER = "median"


def config_table(df: pd.DataFrame, threshold: float = math.inf) -> tuple[pd.DataFrame, dict, set, str]:
    """Providers x directions (ms and TFLOP/s) for one configuration, a host-bound time (GPU idle
    above `threshold` %) marked; ours/peer time ratios; the keys of those with a host-bound side;
    the provider that is ours in the ratios (`OURS`)."""
    rows = []
    bound = df[host_bound(df, threshold)]
    bound = set(zip(bound["provider"], bound["metric"]))
    for provider, g in df.groupby("provider", sort=False):
        row = {"provider": provider}
        for d, label in DIRECTIONS.items():
            row[f"{label} ms"] = cell(g, f"{d}_ms", spread=True, column=CENTER)
            if (provider, f"{d}_ms") in bound:
                row[f"{label} ms"] = f"{row[f'{label} ms']} {HOST_BOUND}"
            row[f"{label} TFLOP/s"] = cell(g, f"{d}_tflops", column=CENTER)
        rows.append(row)
    ms = df[df["metric"].str.endswith("_ms") & (df["status"] == "ok")].set_index(["provider", "metric"])[CENTER]
    ours = next((p for p in OURS if (p, "fwd_bwd_ms") in ms.index), providers.ours())
    ratios = {(peer, d): ms[(ours, f"{d}_ms")] / ms[(peer, f"{d}_ms")]
              for peer in peers() for d in DIRECTIONS
              if (ours, f"{d}_ms") in ms.index and (peer, f"{d}_ms") in ms.index}
    host = {(peer, d) for peer, d in ratios if {(ours, f"{d}_ms"), (peer, f"{d}_ms")} & bound}
    if (ours, "fwd_bwd_ms") in ms.index:
        ratios[("ms", "fwd_bwd")] = ms[(ours, "fwd_bwd_ms")]
    order = {p: i for i, p in enumerate(OURS + peers())}
    rows.sort(key=lambda r: order.get(r["provider"], 99))
    return pd.DataFrame(rows), ratios, host, ours


def bars(table: claims.Claims, model: pd.DataFrame, limits: dict) -> list[dict]:
    """The section's bars, read off the claims (lmperf.report.claims) and the model group: ours
    against each peer of record (lmperf.providers.of_record; the first one's bars plain, the
    others' "further"); thresholds from config/sections/flash_attention.yaml's report, named
    after the peer (a time ratio's limit is read as the speed-up 1 / limit; a peer with no
    threshold there has no bar of that kind)."""
    out = []
    record = providers.of_record()
    further = lambda i: "further: " if i else ""

    def claim_bar(prefix: str, peer: str, text: str, limit: float) -> None:
        c = next((c for c in table.claims if c.id == prefix + peer), None) or table.find(prefix + "none")
        if c is None:
            return
        if c.peer is None:
            out.append(bar(text, float("nan"), f"not measured: {c.no_peer}", False))
        elif c.verdict == claims.HOST_BOUND:
            out.append(bar(text, c.speedup, f"{fmt(c.speedup)}x (host-bound {HOST_BOUND}: not claimed)", False))
        else:  # a bar at 1 or below is met by a ratio the noise does not tell from 1, too
            out.append(bar(text, c.speedup, f"{fmt(c.speedup)}x ({c.verdict})",
                           c.speedup >= limit or (limit <= 1 and c.level)))
    # the headline's ours: the leaderboard harness's call where it ran, else the call as it is;
    # its peers in the same harness
    heads = [f"flash_attention/headline/bf16/causal/fwd_bwd/{h}/do_bench/" for h in ("leaderboard", "eager")]
    head = next((h for h in heads if any(c.id.startswith(h) for c in table.claims)), None)
    if head is not None:
        harness = "leaderboard harness" if "/leaderboard/" in head else "called as it is"
        for p in record[:1] + [None] + record[1:]:
            if p is None:  # our time, after the first peer of record's bar
                ours = next(c for c in table.claims if c.id.startswith(head)).ours.value
                out.append(bar(f"headline forward+backward <= {limits['headline_ms']:g} ms ({harness})", ours,
                               f"{fmt(ours)} ms", ours <= limits["headline_ms"]))
            elif f"headline_vs_{p.name}" in limits:
                limit = 1 / limits[f"headline_vs_{p.name}"]
                claim_bar(head, p.name, f"{further(record.index(p))}headline forward+backward speed-up over "
                          f"{p.says} >= {fmt(limit)}x ({harness}, both sides)", limit)
    for causal, d, label in (("full", "forward", "forward (non-causal)"), ("causal", "fwd_bwd", "forward+backward (causal)")):
        prefix = f"flash_attention/throughput/bf16/{causal}/{d}/eager/do_bench/"
        if any(c.id.startswith(prefix) for c in table.claims):
            for i, p in enumerate(record):
                if f"throughput_vs_{p.name}" in limits:
                    limit = limits[f"throughput_vs_{p.name}"]
                    claim_bar(prefix, p.name, f"{further(i)}throughput {label} >= {limit:g}x {p.says} TFLOP/s", limit)
    if not model.empty:
        gpu = model.attrs.get("metric") == "fwd_bwd_gpu_ms"
        how = "GPU time (CUDA graph)" if gpu else "time"
        twins = same_kernels(model)
        for i, p in enumerate(record):
            peer, label = p.name, further(i)
            if peer in twins:
                out.append(bar(f"{label}model group: forward+backward {how} no slower than {peer} at every shape",
                               float("nan"), "not measured: " + same_kernel_note(*twins[peer]), False))
            elif f"speed-up over {peer}" in model:
                ratio = model[f"speed-up over {peer}"]
                below = ratio < 1
                level = below & level_with(table, model, peer)  # below 1, but inside the noise
                slower = int((below & ~level).sum())
                same = f"; {int(level.sum())} below 1 the same within noise" if level.any() else ""
                out.append(bar(f"{label}model group: forward+backward {how} no slower than {peer} at every shape",
                               slower, f"slower at {slower} of {int(ratio.notna().sum())} shapes (lowest speed-up "
                               f"{fmt(ratio.min())}x{same})", slower == 0))
    for g in table.grids:
        if g.id.startswith("flash_attention/grid/"):
            same = f", {g.level} the same within noise" if g.level else ""
            out.append(bar(f"grid ({g.id.split('/')[2]}): nowhere slower than the best peer at each shape (fwd+bwd, {g.timing}; "
                           f"peers: {', '.join(g.peers)})", g.slower,
                           f"slower in {g.slower} of {g.shapes} shapes ({g.host_bound} host-bound{same}, not counted)",
                           g.slower == 0))
    return out


def level_with(table: claims.Claims, model: pd.DataFrame, peer: str) -> pd.Series:
    """Per row of the model table (`model_table`): whether its claim against `peer` at the table's
    timing is the same within noise (claims.Claim.level): a ratio that the band across processes does
    not tell from 1, so not a shape where ours is slower."""
    timing = "gpu" if model.attrs.get("metric") == "fwd_bwd_gpu_ms" else "do_bench"
    same = {c.setting("shape") for g in table.grids if g.id.startswith("flash_attention/model/")
            and g.id.endswith("/" + timing) for c in g.claims if c.peer.provider == peer and c.level}
    if not same:
        return pd.Series(False, index=model.index, dtype=bool)
    shapes = [claims.shape_text(pd.Series({"batch": r["batch"], "heads": r["heads"], "seq_len": r["N"],
                                           "head_dim": r["D"]})) for _, r in model.iterrows()]
    return pd.Series([s in same for s in shapes], index=model.index, dtype=bool)


def same_kernels(model: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """{peer of record: (it, the earlier peer of record)} where its times in the model group
    equal the earlier one's at every shape (`same_kernel`): its column is not its own
    measurement."""
    record = [p.name for p in providers.of_record()]
    out = {}
    for i, b in enumerate(record):
        a = next((a for a in record[:i] if same_kernel(model, a, b)), None)
        if a is not None:
            out[b] = (b, a)
    return out


def same_kernel_note(b: str, a: str) -> str:
    """Why provider b's times equal a's (b declared after a), where neither caches its compiled
    graphs apart (lmperf.providers: `cache_compiled`)."""
    return (f"{b}'s times equal {a}'s at every shape: under torch.compile, Inductor's graph "
            "cache does not key on the SDPA backend (pytorch/pytorch#185449), so one ran the graph compiled "
            f"for the other (most likely {b} ran {a}'s: they run in that order)")


def view(inputs) -> dict:
    bench = providers.renamed(inputs.rows("flash_attention", "bench"), "attention")
    if bench.empty:
        return unavailable("no benchmark results (rule flash_attention_bench has not run)")
    if (bench["status"] != "ok").all():
        return unavailable("the benchmark did not run here: " + "; ".join(sorted(set(bench["message"].dropna()))),
                           providers=provider_rows(bench))
    if CENTER not in bench:  # rows with a mean only (one sample: the same number)
        bench = bench.assign(**{CENTER: bench["mean"]})
    # K/V heads (grouped-query attention); rows from before GQA have as many as query heads
    bench = bench.assign(kv_heads=bench["kv_heads"].fillna(bench["heads"]) if "kv_heads" in bench else bench["heads"])
    claimed = claims.of(inputs)
    configs = []
    for (group, dtype, causal, b, h, kv, n, d), g in bench.groupby(
            ["group", "dtype", "causal", "batch", "heads", "kv_heads", "seq_len", "head_dim"], sort=False):
        if group in ("grid", "grid_deep", "model"):  # grids: tables of their own
            continue
        table, ratios, host, ours = config_table(g, inputs.bars.get("host_bound_idle_pct", math.inf))
        mode = "causal" if str(causal).lower() == "true" else "non-causal"
        notes = sorted({f"{r.provider}: {r.message}" for r in g[g["metric"] == "backward_ms"].itertuples()
                        if isinstance(r.message, str) and r.message})
        heads = f"{int(h)} heads" + (f" over {int(kv)} K/V heads" if kv != h else "")
        configs.append({"name": f"{group}: {int(b)} x {heads} x {int(n)} tokens x D {int(d)}, {dtype}, {mode}",
                        "group": group, "causal": mode, "table": table, "notes": notes, "ratios": ratios,
                        "host_bound": host, "ours": ours,
                        "forward_tflops": {p: v for p, v in g[(g["metric"] == "forward_tflops") & (g["status"] == "ok")]
                                           .set_index("provider")[CENTER].items()}})
    grid = bench[bench["group"] == "grid"]
    model = model_table(bench[bench["group"] == "model"])
    threshold = inputs.bars.get("host_bound_idle_pct", math.inf)
    model_host = marked(model_table(bench[bench["group"] == "model"], "fwd_bwd_ms"), bench[bench["group"] == "model"],
                        "fwd_bwd_ms", threshold)
    model_backward = model_table(bench[bench["group"] == "model"], "backward_gpu_ms")
    timed = bench[bench["group"].isin([c["group"] for c in configs]) & bench["metric"].str.endswith("_ms")]
    view = {"available": True, "configs": configs,
            "host_bound": host_bound_legend(timed, inputs.bars.get("host_bound_idle_pct", math.inf)), "model": model, "model_host": model_host,
            "model_backward": model_backward, "gqa": gqa_table(bench[bench["group"] == "gqa"]),
            "model_same_kernel": [{"provider": b, "says": providers.get(b).says, "note": same_kernel_note(b, a)}
                                  for b, a in same_kernels(model).values()],
            "bars": pd.DataFrame(bars(claimed, model, inputs.bars["flash_attention"]))}
    view["ratios"] = ratio_table(claimed, view["host_bound"]["mark"])
    view["losses"] = losses(claimed)
    view["claims"] = answer(claimed)
    view["answer"] = answer_table(view["claims"]["lines"], view["host_bound"]["mark"])
    view["grid_verdicts"] = grid_verdict_table(view["claims"]["grids"])
    if not grid.empty:
        view["grid"] = grid_tables(grid, threshold)
        view["grid_speedups"] = grid_speedups(grid)
        view["grid_head_dims"] = sorted(int(d) for d in grid["head_dim"].unique())
        left_out = grid[grid["status"].isin(["skipped", "unsupported"])].drop_duplicates(["provider", "message"])
        view["grid_left_out"] = [f"{r.provider} ({r.status}): {r.message}" for r in left_out.itertuples()]
    deep = bench[bench["group"] == "grid_deep"]
    if not deep.empty:  # the deep target's grid: the assignment's, whole
        view["grid_deep"] = grid_tables(deep, threshold)
        left_out = deep[deep["status"].isin(["skipped", "unsupported"])].drop_duplicates(["provider", "message"])
        view["grid_deep_left_out"] = [f"{r.provider} ({r.status}): {r.message}" for r in left_out.itertuples()]
    return view


def answer(table: claims.Claims) -> dict:
    """The section's answer lines as claims: the headline shape under the leaderboard's harness
    and called as it is (each against the best peer of its harness), the throughput shape's
    forward and forward+backward (non-causal), the grids' verdicts, and what the rows record of
    the kernels that ran."""
    def best(prefix):
        return table.best([c for c in table.claims if c.id.startswith(prefix)])
    fa = "flash_attention/{}/bf16/{}/{}/{}/do_bench/"
    lines = [best(fa.format(*k)) for k in (("headline", "causal", "fwd_bwd", "leaderboard"),
                                           ("headline", "causal", "fwd_bwd", "eager"),
                                           ("throughput", "full", "forward", "eager"),
                                           ("throughput", "full", "fwd_bwd", "eager"))]
    lines = [c for c in lines if c is not None]
    kernels = sorted({c.ours.kernel for c in lines if c.ours.kernel})
    configs = sorted({c.ours.config for c in lines if c.ours.config})
    return {"lines": lines, "grids": [g for g in table.grids if g.section == "flash_attention"],
            "kernels": kernels, "configs": configs, "kernel_column": claims.KERNEL_COLUMN,
            "direction": table.direction}


def band_text(c: claims.Claim) -> str:
    return f"{fmt(c.band[0], 4)} to {fmt(c.band[1], 4)} ({c.processes} processes)" if c.band else ""


def kernel_of_pass(c: claims.Claim) -> str:
    """Our kernels that ran in the pass the claim times: the rows' `kernel` ("forward: ...; backward:
    ...") narrowed to its forward's or backward's part for a forward or a backward row, whole for
    forward+backward; "" where the rows record none."""
    kernel, timed = c.ours.kernel or "", c.setting("pass")
    if timed not in ("forward", "backward"):
        return kernel
    parts = [p.strip() for p in kernel.split(";")]
    return "; ".join(p for p in parts if p.startswith(f"{timed}:")) or kernel


def answer_table(lines: list[claims.Claim], mark: str) -> pd.DataFrame:
    """The section's answer as a table: one claim a row."""
    return pd.DataFrame([{
        "configuration": c.what, "harness": HARNESS.get(c.ours.harness, c.ours.harness), "timed by": c.ours.timing,
        "kernel (ours)": kernel_of_pass(c),  # where the rows record it (column `kernel`)
        "ours ms": f"{fmt(c.ours.value)} {mark}" if c.ours.host_bound else c.ours.value,
        "best peer": c.peer.label if c.peer else c.no_peer,
        "peer ms": "" if c.peer is None else (f"{fmt(c.peer.value)} {mark}" if c.peer.host_bound else c.peer.value),
        "speed-up": c.speedup, "noise band": band_text(c), "verdict": c.verdict if c.peer else ""}
        for c in lines])


def grid_verdict_table(grids: list[claims.GridVerdict]) -> pd.DataFrame:
    """Each grid's verdict against the best peer at each shape, with its denominator."""
    return pd.DataFrame([{
        "grid": g.what, "timed by": g.timing, "peers": ", ".join(g.peers), "shapes": g.shapes,
        "ours faster": g.faster, "ours slower": g.slower, "same within noise": g.level,
        "host-bound (not counted)": g.host_bound,
        "with a noise band": g.banded, "won outside the band": g.wins,
        "matmul precision (fp32)": g.precision or ""} for g in grids])


def provider_rows(bench: pd.DataFrame) -> list[dict]:
    """Every provider of the benchmark's rows, in their order, with its role (ours, peer,
    contender: lmperf.providers), its number of cases and their statuses: what a run that timed
    nothing (no GPU) still shows, so that a contender or a new peer is seen to reach the job."""
    out = []
    for name, g in bench.drop_duplicates("case_id").groupby("provider", sort=False):
        known = providers.find(name)
        out.append({"provider": name, "role": known.role if known else "unregistered", "cases": len(g),
                    "statuses": ", ".join(f"{n} {status}" for status, n in g["status"].value_counts().items())})
    return out


def marked(table: pd.DataFrame, rows: pd.DataFrame, metric: str, threshold: float) -> pd.DataFrame:
    """`table` (a `model_table` by do_bench's `metric`) with each host-bound time, and each ratio
    with a host-bound side, marked: a host-bound wall time is the host's, not the kernel's."""
    if table.empty or not math.isfinite(threshold):
        return table
    fb = rows[(rows["metric"] == metric) & (rows["status"] == "ok")]
    fb = fb.assign(model=fb["model"].astype(object).fillna("").astype(str).replace("", "(no model)") if "model" in fb else "(no model)")
    bound = fb[host_bound(fb, threshold)]
    keys = set(zip(bound["model"], bound["batch"].astype(int), bound["heads"].astype(int),
                   bound["head_dim"].astype(int), bound["seq_len"].astype(int), bound["provider"]))
    out = table.astype(object)
    ours = providers.ours()
    names = {f"ours ({ours})": ours}
    for i, r in table.iterrows():
        key = (r["model"], int(r["batch"]), int(r["heads"]), int(r["D"]), int(r["N"]))
        for column in table.columns:
            provider = names.get(column, column)
            if (*key, provider) in keys:
                out.at[i, column] = f"{fmt(r[column])} {HOST_BOUND}"
            if str(column).startswith("speed-up over ") and ({(*key, ours), (*key, column[len("speed-up over "):])} & keys) \
                    and pd.notna(r[column]):
                out.at[i, column] = f"{fmt(r[column])} {HOST_BOUND}"
    out.attrs.update(table.attrs)
    return out


def model_table(model: pd.DataFrame, metric: str | None = None) -> pd.DataFrame:
    """The model group: one row per model size and context, forward+backward ms of every
    provider (the leaderboard's harness), and our speed-up over each peer of record (its time over ours). By `metric`, else the
    GPU time (CUDA graph) where it was measured, else do_bench's; `.attrs["metric"]` says which."""
    if metric is None:
        metric = "fwd_bwd_gpu_ms" if not model.empty and (model["metric"] == "fwd_bwd_gpu_ms").any() else "fwd_bwd_ms"
    fb = model[(model["metric"] == metric) & (model["status"] == "ok")] if not model.empty else model
    if fb.empty:
        return pd.DataFrame()
    # shapes of no model size (the group's head-dim-128 case) are named by their shape
    fb = fb.assign(model=fb["model"].astype(object).fillna("").astype(str) if "model" in fb else "")
    fb = fb.assign(model=fb["model"].where(fb["model"] != "", "(no model)"))
    keys = ["model", "batch", "heads", "head_dim", "seq_len"]
    wide_ms = fb.pivot_table(index=keys, columns="provider", values=CENTER, sort=False)
    out = wide_ms.reset_index()
    for key in keys[1:]:  # batch, heads, head dim, N: integers
        out[key] = out[key].astype(int)
    ours = providers.ours()
    for peer in (p.name for p in providers.of_record()):
        if {ours, peer} <= set(wide_ms.columns):
            out[f"speed-up over {peer}"] = (wide_ms[peer] / wide_ms[ours]).to_numpy()
    out = out.rename(columns={"seq_len": "N", "head_dim": "D", ours: f"ours ({ours})"})
    out.attrs["metric"] = metric
    return out


HARNESS = {"leaderboard": "leaderboard", "eager": "called as it is"}


def ratio_table(table: claims.Claims, mark: str) -> pd.DataFrame:
    """Our speed-up over each peer (its time over ours: above 1 ours is faster), one row per
    configuration, pass and harness (do_bench, both sides in the same harness), from the claims;
    a speed-up with a host-bound side marked."""
    rows = {}
    for c in table.claims:
        if c.section != "flash_attention" or c.setting("group") in ("grid", "grid_deep", "model") \
                or c.setting("timing") != "do_bench" or c.peer is None:
            continue
        key = (c.what, HARNESS.get(c.setting("harness"), c.setting("harness")))
        row = rows.setdefault(key, {"configuration": c.what, "harness": key[1]})
        row[f"over {c.peer.provider}"] = f"{fmt(c.speedup)} {mark}" if c.verdict == claims.HOST_BOUND else c.speedup
    return pd.DataFrame(list(rows.values()))


def best_peer_claims(table: claims.Claims) -> list[claims.Claim]:
    """Ours against the best peer (cuDNN included) of each configuration, pass, harness and
    timing, and of each shape of the grid and the model group."""
    groups: dict = {}
    for c in table.claims:
        if c.section == "flash_attention" and c.peer is not None:
            groups.setdefault((c.what, c.settings), []).append(c)
    return [table.best(g) for g in groups.values()]


def losses(table: claims.Claims) -> dict:
    """Where the best peer is faster than ours (speed-up below 1), out of every configuration,
    pass, harness and shape with a peer: {"n": the denominator, "slower": how many, "verdicts":
    those by their verdict (claims.verdict: slower outside the noise, the same within it, host-bound,
    no band measured), "table": the losing claims}."""
    best = [c for c in best_peer_claims(table) if c.speedup is not None]
    lost = [c for c in best if c.speedup < 1]
    rows = [{"configuration": c.what, "harness": HARNESS.get(c.setting("harness"), c.setting("harness")),
             "timed by": c.ours.timing, "kernel (ours)": kernel_of_pass(c), "best peer": c.peer.label,
             "speed-up": c.speedup, "verdict": c.verdict} for c in lost]
    verdicts = {v: sum(c.verdict == v for c in lost) for v in (claims.SLOWER, claims.SAME, claims.HOST_BOUND,
                                                                claims.NO_BAND)}
    return {"n": len(best), "slower": len(lost), "verdicts": {v: k for v, k in verdicts.items() if k},
            "table": pd.DataFrame(rows)}


def gqa_table(gqa: pd.DataFrame) -> pd.DataFrame:
    """Grouped-query attention: one row per shape, ours and each peer of record (enable_gqa) by
    GPU time (CUDA graph) where measured, else do_bench: forward and forward+backward ms, and
    our speed-up over each (its time over ours)."""
    if gqa.empty:
        return pd.DataFrame()
    gpu = (gqa["metric"] == "fwd_bwd_gpu_ms").any()
    metrics = {"forward": "forward_gpu_ms" if gpu else "forward_ms", "fwd+bwd": "fwd_bwd_gpu_ms" if gpu else "fwd_bwd_ms"}
    keys = ["batch", "heads", "kv_heads", "head_dim", "seq_len"]
    rows = []
    ours, record = providers.ours(), [p.name for p in providers.of_record()]
    for shape, g in gqa[gqa["status"] == "ok"].groupby(keys, sort=False):
        row = dict(zip(["B", "H", "H_kv", "D", "N"], (int(x) for x in shape)))
        ms = g.set_index(["provider", "metric"])[CENTER]
        for label, metric in metrics.items():
            for provider in (ours, *record):
                if (provider, metric) in ms.index:
                    row[f"{label} ms, {'ours' if provider == ours else provider}"] = ms[(provider, metric)]
            for peer in record:
                if (ours, metric) in ms.index and (peer, metric) in ms.index:
                    row[f"{label}: speed-up over {peer}"] = ms[(peer, metric)] / ms[(ours, metric)]
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["metric"] = "GPU time (CUDA graph)" if gpu else "do_bench"
    return out


# The grid's reference for speed-ups (lmperf.providers.reference): PyTorch attention under
# torch.compile, the one peer whose grid rows have GPU time beside ours (the others are timed by
# do_bench alone).
PASSES = {"forward": "forward_gpu_ms", "backward": "backward_gpu_ms", "forward+backward": "fwd_bwd_gpu_ms"}


def grid_speedups(grid: pd.DataFrame) -> list[dict]:
    """Per dtype: one row per head dim and sequence length, forward, backward and
    forward+backward, ours and torch.compile'd PyTorch attention by GPU time (CUDA graph), and the
    speed-up (its time / ours); the head dims the grid has, for the template to name those it lacks."""
    ok = grid[(grid["status"] == "ok") & grid["metric"].isin(PASSES.values())] if not grid.empty else grid
    if ok.empty:
        return []
    wide = ok.pivot_table(index=["dtype", "head_dim", "seq_len"], columns=["metric", "provider"], values=CENTER)
    out = []
    mine, reference = providers.ours(), providers.reference()
    for dtype, g in wide.groupby(level="dtype", sort=False):
        rows = []
        for (_, d, n), r in g.iterrows():
            row = {"D": int(d), "N": int(n)}
            for label, metric in PASSES.items():
                ours, ref = r.get((metric, mine)), r.get((metric, reference))
                row[f"{label}: ours ms"], row[f"{label}: compiled ms"] = ours, ref
                row[f"{label}: speed-up"] = ref / ours if pd.notna(ours) and pd.notna(ref) else None
            rows.append(row)
        out.append({"dtype": dtype, "table": pd.DataFrame(rows)})
    return out


def grid_tables(grid: pd.DataFrame, threshold: float = math.inf) -> list[dict]:
    """Per dtype and head dim: forward+backward ms, one row per sequence length, one column per
    provider (do_bench, a host-bound time marked), and the GPU time beside it where measured."""
    out = []
    for (dtype, d), g in grid.groupby(["dtype", "head_dim"], sort=False):
        cells = {}
        gpu = {}
        for (n, provider), c in g.groupby(["seq_len", "provider"], sort=False):
            value = cell(c, "fwd_bwd_ms", spread=True, column=CENTER)
            if host_bound(c[c["metric"] == "fwd_bwd_ms"], threshold).any():
                value = f"{value} {HOST_BOUND}"
            cells.setdefault(n, {"N": int(n)})[provider] = value
            if (c["metric"] == "fwd_bwd_gpu_ms").any():
                gpu.setdefault(n, {})[f"{provider}, GPU"] = cell(c, "fwd_bwd_gpu_ms", spread=True, column=CENTER)
        for n, extra in gpu.items():
            cells[n].update(extra)
        out.append({"dtype": dtype, "head_dim": int(d), "table": pd.DataFrame(list(cells.values()))})
    return out


def figures(inputs, paths: dict) -> dict[str, str]:
    """The grid's forward+backward TFLOP/s against sequence length by GPU time (CUDA graph) alone,
    for the providers whose rows have it (ours and torch.compile'd PyTorch attention), one panel
    per dtype and head dim; and ours over each peer's time across shapes, GPU time on both sides
    (`ratio_figure`). {name: why} of a figure not drawn."""
    bench = providers.renamed(inputs.rows("flash_attention", "bench"), "attention")
    if not bench.empty and CENTER not in bench:  # rows with a mean only (one sample: the same number)
        bench = bench.assign(**{CENTER: bench["mean"]})
    model = model_table(bench[bench["group"] == "model"], "fwd_bwd_gpu_ms") if not bench.empty else pd.DataFrame()
    return {**tflops_figure(bench, paths["fa_tflops"]), **ratio_figure(bench, model, providers.reference(), paths["fa_ratio"])}
