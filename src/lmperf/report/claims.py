"""Every comparison that the README, the report's summary and the sections' answer lines state,
computed once from a results folder's CSVs: one table of claims that they render and never
recompute.

A claim sets one of ours (its case, provider, harness, timing method and settings: shape,
dtype, causal or not, pass, the clocks where the rows record them) against one peer measured at
the same harness, method and settings, or says that there is no peer at these settings. Its
ratio is a speed-up everywhere (`DIRECTION`), its noise band the lowest and highest speed-up of
the processes in which both sides ran (the job's own and each fresh process of the repeats,
results/<hw>/repeats/), and its verdict follows the band: faster or slower only where the whole
band lies beyond 1.0, "same within noise" where it straddles 1.0, and never a win where no band
was measured or a side is host-bound. `repeat_cases` lists the cases whose repeats the claims
need, so that the repeats' configuration can be derived from the claims.

Beside the claims:
- `GridVerdict`: ours against the best peer at each shape of a grid, with its denominator;
- `references`: a published peer at other settings (config/references.yaml), both settings side
  by side and no ratio;
- `mfu`: the ladder's best bf16 rung under one convention (causal attention's computed half, as
  the FlashAttention section counts it) with the other (the full square) beside it.

    table = claims.of(inputs)        # cached on the report's Inputs: computed once a render
    table.find("flash_attention/headline/...")
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lmperf import providers
from lmperf.report.format import host_bound

DIRECTION = ("speed-up: the peer's time over ours (for a rate, our rate over the peer's): "
             "above 1 ours is faster")
MIN_PROCESSES = 3  # a band needs both sides timed in at least this many processes
FASTER, SLOWER, SAME = "faster", "slower", "same within noise"
NO_BAND, HOST_BOUND, NO_PEER = "no noise band measured", "host-bound", "no peer at these settings"
WINS = (FASTER,)
# The rows record no kernel name: the forward may run the Gluon kernel or the tile-language one
# (kernels/flash_attention_triton.py chooses per call), and `config` lists the tile kernel's
# settings either way.
KERNEL_COLUMN = "kernel"
PRECISION_COLUMN = "matmul_precision"
TIMINGS = {"gpu": "GPU time (CUDA graph)", "do_bench": "do_bench (host included)",
           "kernel": "kernel time (profiler)", "step": "median step"}
PASSES = {"forward": "forward", "backward": "backward", "fwd_bwd": "forward+backward"}


@dataclass(frozen=True)
class Side:
    """One side of a claim: a measured row (the job's process)."""
    provider: str
    label: str
    harness: str
    timing: str
    metric: str
    value: float
    unit: str
    case_id: str
    section: str
    job: str            # the job's results file, under the results folder, without .csv
    host_bound: bool
    commit: str
    rate: float | None = None      # TFLOP/s of the same call, where the rows have it
    kernel: str | None = None      # the kernel that ran, where the rows record it
    config: str | None = None      # the rows' `config` column
    clocks: str | None = None      # the SM clock the rows record, where they do
    matmul_precision: str | None = None
    rung: int | None = None        # a ladder rung's number and name
    rung_name: str | None = None


@dataclass(frozen=True)
class Claim:
    id: str
    section: str
    what: str                      # the configuration in words (shape, dtype, causal, pass)
    settings: tuple                # ((name, value), ...): what both sides share
    higher_is_better: bool
    ours: Side
    peer: Side | None
    no_peer: str = ""
    speedup: float | None = None
    band: tuple[float, float] | None = None
    processes: int = 0             # processes with both sides ok (the band's)
    verdict: str = NO_PEER
    older: bool = False            # its section's code changed since it was measured

    def setting(self, name: str):
        return dict(self.settings).get(name)

    @property
    def key(self) -> tuple:
        """The configuration: one "ours" a key."""
        return (self.section, self.settings)

    @property
    def repeat_cases(self) -> list[tuple[str, str]]:
        """(job, case_id) of both sides: the cases whose repeats its band needs."""
        sides = [s for s in (self.ours, self.peer) if s is not None]
        return [(s.job, s.case_id) for s in sides]

    @property
    def win(self) -> bool:
        return self.verdict in WINS

    @property
    def level(self) -> bool:
        """Ours the same as the peer within the noise: the band across processes holds 1, whichever
        side of 1 this process's ratio fell."""
        return self.verdict == SAME


@dataclass(frozen=True)
class GridVerdict:
    """Ours against the best peer at each shape of a grid, by one timing."""
    id: str
    section: str
    what: str
    timing: str
    peers: tuple[str, ...]         # the peers measured by this timing in the grid
    shapes: int                    # the denominator: shapes where ours and a peer ran
    faster: int                    # ours above 1 against the best peer (not host-bound, not level)
    slower: int                    # ours at or below 1 (not host-bound, not level)
    host_bound: int
    banded: int                    # shapes whose claim has a noise band
    wins: int                      # shapes won outside the band
    claims: tuple = ()
    precision: str | None = None   # fp32 grids: both sides' matmul precision
    level: int = 0                 # the same within the noise (Claim.level): neither faster nor slower


@dataclass
class Claims:
    claims: list[Claim] = field(default_factory=list)
    grids: list[GridVerdict] = field(default_factory=list)
    mfu: dict | None = None
    direction: str = DIRECTION

    def find(self, claim_id: str) -> Claim | None:
        return next((c for c in self.claims if c.id == claim_id), None)

    def where(self, **match) -> list[Claim]:
        """The claims whose settings hold every `match` (name=value; `peer` the peer's provider,
        `ours` ours', `section` the section)."""
        out = []
        for c in self.claims:
            s = dict(c.settings) | {"section": c.section, "ours": c.ours.provider,
                                    "peer": c.peer.provider if c.peer else None}
            if all(s.get(k) == v for k, v in match.items()):
                out.append(c)
        return out

    def best(self, claims: list[Claim]) -> Claim | None:
        """Of claims at one configuration, the one against the best peer (the lowest peer time,
        the highest peer rate): our speed-up over it is the smallest. None where none has a peer."""
        with_peer = [c for c in claims if c.peer is not None and c.speedup is not None]
        if not with_peer:
            return claims[0] if claims else None
        return min(with_peer, key=lambda c: c.speedup)

    def grid(self, grid_id: str) -> GridVerdict | None:
        return next((g for g in self.grids if g.id == grid_id), None)


# ---------------------------------------------------------------------------------------------
# The noise band


def repeat_processes(results: Path) -> dict[str, pd.DataFrame]:
    """{job: its repeats' rows, with `_process` the run file}: results/<hw>/repeats/<job>/run<k>.csv,
    read as the jobs' rows are (providers.read_renamed: their case ids the same)."""
    root = Path(results) / "repeats"
    out: dict[str, list[pd.DataFrame]] = {}
    for p in sorted(root.rglob("run*.csv")) if root.is_dir() else []:
        job = str(p.parent.relative_to(root))
        rows = providers.read_renamed(pd.read_csv(p, keep_default_na=False, na_values=[""]))
        out.setdefault(job, []).append(rows.assign(_process=p.name))
    return {job: pd.concat(frames, ignore_index=True) for job, frames in out.items()}


def _value(rows: pd.DataFrame, case_id: str, metric: str) -> float | None:
    r = rows[(rows["case_id"] == case_id) & (rows["metric"] == metric) & (rows["status"] == "ok")]
    return float(r["median"].iloc[0]) if len(r) and math.isfinite(float(r["median"].iloc[0])) else None


def speedup(ours: float | None, peer: float | None, higher_is_better: bool) -> float | None:
    """The claim's ratio (`DIRECTION`), None where a side is missing or not positive."""
    if ours is None or peer is None or not (ours > 0 and peer > 0):
        return None
    return ours / peer if higher_is_better else peer / ours


def band(ours: Side, peer: Side, job_rows: pd.DataFrame, repeats: dict, higher: bool) -> tuple[tuple | None, int]:
    """((lowest, highest) speed-up over the processes where both sides ran ok, or None under
    `MIN_PROCESSES`), the number of those processes. Both sides must come from one job (one
    process timed them both)."""
    if ours.job != peer.job:
        return None, 0
    ratios = []
    first = speedup(_value(job_rows, ours.case_id, ours.metric), _value(job_rows, peer.case_id, peer.metric), higher)
    if first is not None:
        ratios.append(first)
    rep = repeats.get(ours.job)
    if rep is not None:
        for _, run in rep.groupby("_process", sort=True):
            r = speedup(_value(run, ours.case_id, ours.metric), _value(run, peer.case_id, peer.metric), higher)
            if r is not None:
                ratios.append(r)
    if len(ratios) < MIN_PROCESSES:
        return None, len(ratios)
    return (min(ratios), max(ratios)), len(ratios)


def verdict(peer: Side | None, ratio: float | None, rng: tuple | None, ours: Side) -> str:
    if peer is None or ratio is None:
        return NO_PEER
    if ours.host_bound or peer.host_bound:
        return HOST_BOUND
    if rng is None:
        return NO_BAND
    if rng[0] > 1:
        return FASTER
    if rng[1] < 1:
        return SLOWER
    return SAME


def make(claim_id: str, section: str, what: str, settings: dict, higher: bool, ours: Side, peer: Side | None,
         job_rows: pd.DataFrame, repeats: dict, no_peer: str = NO_PEER, older: bool = False) -> Claim:
    ratio = speedup(ours.value, peer.value, higher) if peer is not None else None
    rng, n = band(ours, peer, job_rows, repeats, higher) if peer is not None else (None, 0)
    return Claim(id=claim_id, section=section, what=what, settings=tuple(settings.items()), higher_is_better=higher,
                 ours=ours, peer=peer, no_peer="" if peer is not None else no_peer, speedup=ratio, band=rng,
                 processes=n, verdict=verdict(peer, ratio, rng, ours), older=older)


# ---------------------------------------------------------------------------------------------
# Sides from rows


def _job(row: pd.Series) -> str:
    """The job's results file of a row, without .csv (the repeats' folder name)."""
    return str(row.get("_job", ""))


def _clocks(rows: pd.DataFrame, case_id: str) -> str | None:
    """The SM clock the case's rows record: columns `sm_clock_mhz_start`/`_end` where the bench
    writes them, else the ladder's mean SM clock over the timed steps; None where not recorded."""
    case = rows[rows["case_id"] == case_id]
    cols = [c for c in ("sm_clock_mhz_start", "sm_clock_mhz_end") if c in case]
    if cols and case[cols].notna().any().any():
        values = [float(case[c].dropna().iloc[0]) for c in cols if case[c].notna().any()]
        return " to ".join(f"{v:,.0f}" for v in values) + " MHz SM clock"
    mean = case[case["metric"] == "mean_sm_clock_mhz"]["median"].dropna()
    return f"{float(mean.iloc[0]):,.0f} MHz mean SM clock" if len(mean) else None


def side(rows: pd.DataFrame, row: pd.Series, section: str, label: str, harness: str, timing: str,
         threshold: float, rate_metric: str | None = None) -> Side:
    text = lambda c: str(row[c]) if c in row and pd.notna(row[c]) and str(row[c]) else None
    rate = _value(rows, row["case_id"], rate_metric) if rate_metric else None
    return Side(provider=str(row.get("provider", row.get("name", ""))), label=label, harness=harness, timing=timing,
                metric=str(row["metric"]), value=float(row["median"]), unit=str(row.get("unit", "")),
                case_id=str(row["case_id"]), section=section, job=_job(row),
                host_bound=bool(host_bound(row.to_frame().T, threshold).iloc[0]), commit=str(row.get("commit", "")),
                rate=rate, kernel=text(KERNEL_COLUMN), config=text("config"), clocks=_clocks(rows, row["case_id"]),
                matmul_precision=text(PRECISION_COLUMN))


def with_jobs(frame: pd.DataFrame, results: Path, section: str) -> pd.DataFrame:
    """A section's rows with `_job`: the results file each case came from (read from the files
    under results/<section>/), the key its repeats are filed under."""
    if frame.empty:
        return frame
    jobs = {}
    root = Path(results)
    for p in sorted((root / section).rglob("*.csv")) if (root / section).is_dir() else []:
        if ".journal" in p.parts:
            continue
        try:  # the ids as the frame's rows were read (providers.read_renamed)
            ids = providers.read_renamed(pd.read_csv(p, keep_default_na=False, na_values=[""]))["case_id"].astype(str)
        except (ValueError, KeyError, pd.errors.EmptyDataError):
            continue
        job = str(p.relative_to(root).with_suffix(""))
        jobs.update({i: job for i in ids})
    return frame.assign(_job=frame["case_id"].astype(str).map(jobs).fillna(""))


# ---------------------------------------------------------------------------------------------
# FlashAttention-2


def fa_ours() -> dict[str, str]:
    """{harness: our provider timed under it}: the leaderboard harness's call (torch.compile of
    apply) and the call as it is."""
    out = {}
    for p in providers.providers("attention", "ours"):
        out.setdefault(p.harness or "eager", p.name)
    return out


def fa_peers() -> dict[str, str]:
    """{name: label} of the attention peers (the registry's; a contender is no peer)."""
    return {p.name: p.label for p in providers.providers("attention", "peer")}


def shape_text(r: pd.Series) -> str:
    kv = r.get("kv_heads")
    heads = f"{int(r['heads'])} heads" + (f" over {int(kv)} K/V heads" if pd.notna(kv) and int(kv) != int(r["heads"]) else "")
    return f"{int(r['batch'])} x {heads} x {int(r['seq_len']):,} x {int(r['head_dim'])}"


def _causal(v) -> bool:
    return str(v).lower() == "true"


def fa_config_claims(fa: pd.DataFrame, threshold: float, repeats: dict, older: bool) -> list[Claim]:
    """The headline and throughput configurations: per pass, per harness and per timing, ours
    against every peer timed at the same harness and timing (or no peer)."""
    out = []
    bench = fa[~fa["group"].isin(["grid", "grid_deep", "model"]) & (fa["status"] == "ok")]
    labels = fa_peers()
    ours_by = fa_ours()
    keys = ["group", "dtype", "causal", "batch", "heads", "seq_len", "head_dim"]
    if "kv_heads" in bench:
        keys.append("kv_heads")
        bench = bench.assign(kv_heads=bench["kv_heads"].fillna(bench["heads"]))
    for key, g in bench.groupby(keys, sort=False):
        group, dtype, causal = key[0], key[1], _causal(key[2])
        first = g.iloc[0]
        for harness, ours_name in ours_by.items():
            mine = g[(g["provider"] == ours_name) & (g["harness"] == harness)]
            if mine.empty:
                continue
            peers = g[g["provider"].isin(list(labels)) & (g["harness"] == harness)]
            for d, pass_name in PASSES.items():
                for timing, metric in (("do_bench", f"{d}_ms"), ("gpu", f"{d}_gpu_ms")):
                    o = mine[mine["metric"] == metric]
                    if o.empty:
                        continue
                    rate = metric.replace("_ms", "_tflops")
                    ours = side(g, o.iloc[0], "flash_attention", "ours", harness, TIMINGS[timing], threshold, rate)
                    settings = {"group": group, "shape": shape_text(first), "dtype": dtype, "causal": causal,
                                "pass": pass_name, "harness": harness, "timing": timing}
                    what = (f"FlashAttention-2 {pass_name}, {shape_text(first)}, "
                            f"{'causal' if causal else 'non-causal'}, {dtype}")
                    shape = "" if group in ("headline", "throughput") else "/" + shape_text(first)
                    base = f"flash_attention/{group}{shape}/{dtype}/{'causal' if causal else 'full'}/{d}/{harness}/{timing}"
                    theirs = peers[peers["metric"] == metric]
                    if theirs.empty:
                        out.append(make(f"{base}/none", "flash_attention", what, settings, False, ours, None,
                                        g, repeats, older=older))
                    for _, p in theirs.iterrows():
                        peer = side(g, p, "flash_attention", labels[p["provider"]], harness, TIMINGS[timing],
                                    threshold, rate)
                        out.append(make(f"{base}/{p['provider']}", "flash_attention", what, settings, False, ours,
                                        peer, g, repeats, older=older))
    return out


def fa_grid_verdicts(fa: pd.DataFrame, threshold: float, repeats: dict, older: bool) -> tuple[list[GridVerdict], list[Claim]]:
    """The grid (eager calls, batch 1, one head) and the model group (the leaderboard harness):
    per group, dtype and timing, ours against the best peer at each shape, with the denominator."""
    verdicts, all_claims = [], []
    labels = fa_peers()
    ours_by = fa_ours()
    for group, title in (("grid", "the grid"), ("model", "the model group")):
        g = fa[(fa["group"] == group) & (fa["status"] == "ok")]
        if g.empty:
            continue
        for dtype, gd in g.groupby("dtype", sort=False):
            for timing, metric in (("gpu", "fwd_bwd_gpu_ms"), ("do_bench", "fwd_bwd_ms")):
                rows = gd[gd["metric"] == metric]
                harnesses = set(rows["harness"].dropna())
                claims = []
                peers_seen = set()
                for harness in sorted(harnesses):
                    ours_name = providers.ours()  # the provider every grid and model row of ours is
                    for shape, s in rows[rows["harness"] == harness].groupby(["batch", "heads", "seq_len", "head_dim"],
                                                                             sort=False):
                        mine = s[s["provider"] == ours_name]
                        theirs = s[s["provider"].isin(list(labels))]
                        if mine.empty or theirs.empty:
                            continue
                        peers_seen |= set(theirs["provider"])
                        best = theirs.loc[theirs["median"].idxmin()]
                        ours = side(s, mine.iloc[0], "flash_attention", "ours", harness, TIMINGS[timing], threshold)
                        peer = side(s, best, "flash_attention", labels[best["provider"]], harness, TIMINGS[timing],
                                    threshold)
                        first = mine.iloc[0]
                        settings = {"group": group, "shape": shape_text(first), "dtype": dtype, "causal": True,
                                    "pass": "forward+backward", "harness": harness, "timing": timing}
                        model = f"{first['model']}, " if "model" in first and pd.notna(first["model"]) and first["model"] else ""
                        claims.append(make(f"flash_attention/{group}/{dtype}/{timing}/{shape_text(first)}", "flash_attention",
                                           f"{model}{shape_text(first)}, causal, {dtype}, forward+backward", settings,
                                           False, ours, peer, gd, repeats, older=older))
                if not claims:
                    continue
                # host-bound shapes are not counted; level ones (the band holds 1) are neither side's
                counted = [c for c in claims if c.verdict != HOST_BOUND and not c.level]
                precision = None
                if dtype == "fp32":
                    p = {c.ours.matmul_precision for c in claims} | {c.peer.matmul_precision for c in claims}
                    precision = ("; ".join(sorted(str(x) for x in p)) if p - {None}
                                 else f"not recorded on either side (no `{PRECISION_COLUMN}` column)")
                verdicts.append(GridVerdict(
                    id=f"flash_attention/{group}/{dtype}/{timing}", section="flash_attention",
                    what=f"{title}, {dtype}, forward+backward", timing=TIMINGS[timing],
                    peers=tuple(sorted(peers_seen)), shapes=len(claims),
                    faster=sum(c.speedup > 1 for c in counted), slower=sum(c.speedup <= 1 for c in counted),
                    host_bound=sum(c.verdict == HOST_BOUND for c in claims),
                    banded=sum(c.band is not None for c in claims),
                    wins=sum(c.win for c in claims), claims=tuple(claims), precision=precision,
                    level=sum(c.level for c in claims)))
                all_claims += claims
    return verdicts, all_claims


# ---------------------------------------------------------------------------------------------
# LRPE-cosine

def lrpe_peers() -> dict[str, str]:
    """{name: label} of LRPE-cosine's peers (the registry's), the peer of record first."""
    peers = providers.providers("lrpe", "peer")
    return {p.name: p.label for p in sorted(peers, key=lambda p: not p.record)}


def lrpe_claims(lrpe: pd.DataFrame, threshold: float, repeats: dict, older: bool) -> list[Claim]:
    """The 1-D bench at its largest size, forward and backward, by kernel time (profiler) where
    measured, else do_bench: ours against each peer."""
    ok = lrpe[(lrpe["status"] == "ok") & (lrpe["dims"] == 1) & (lrpe["l"] == 0)] if not lrpe.empty else lrpe
    if ok.empty:
        return []
    big = ok[ok["side"] == ok["side"].max()]
    kernel = (big["metric"] == "forward_kernel_ms").any()
    suffix, timing = ("_kernel_ms", "kernel") if kernel else ("_ms", "do_bench")
    first = big.iloc[0]
    shape = f"{int(first['batch'])} x {int(first['heads'])} heads x {int(first['tokens']):,} tokens x {int(first['d'])}"
    out = []
    for direction in ("forward", "backward"):
        metric = direction + suffix
        mine = big[(big["provider"] == providers.ours("lrpe")) & (big["metric"] == metric)]
        if mine.empty:
            continue
        ours = side(big, mine.iloc[0], "lrpe", "ours", "eager", TIMINGS[timing], threshold)
        settings = {"shape": shape, "dtype": first["dtype"], "dims": 1, "pass": direction, "timing": timing}
        what = f"LRPE-cosine 1-D {direction}, {shape}, {first['dtype']}"
        for name, label in lrpe_peers().items():
            p = big[(big["provider"] == name) & (big["metric"] == metric)]
            peer = side(big, p.iloc[0], "lrpe", label, "eager", TIMINGS[timing], threshold) if len(p) else None
            out.append(make(f"lrpe/1d/{direction}/{name}", "lrpe", what, settings, False, ours, peer, big, repeats,
                            older=older))
    return out


# ---------------------------------------------------------------------------------------------
# Training: the ladder

# The ladder's peer rungs by name: the fused kernels' peers by the registry's labels (contract
# "fused"), torchao's float8 recipes
LADDER_PEERS = {"float8_tensorwise": "torchao float8, tensorwise",
                "float8_rowwise": "torchao float8, rowwise"}


def rung_kind(rungs: pd.DataFrame) -> pd.Series:
    """Per ladder row: "peer" (another library's kernels or recipe), "contender" (a user's
    attention in place of ours: neither ours nor a peer), "pytorch" (none of our kernels) or
    "ours" (at least one of ours)."""
    from lmperf.report.ladder import is_contender, is_peer
    none = lambda col: rungs[col].fillna("none").astype(str).eq("none") if col in rungs else True
    peer, contender = is_peer(rungs), is_contender(rungs)
    ours = providers.names("model_attention", "ours")
    pytorch = ~peer & ~rungs["attention"].isin(ours) & (rungs["optimizer"] != "master") \
        & none("fused") & none("float8")
    return (pd.Series("ours", index=rungs.index).mask(pytorch, "pytorch").mask(peer, "peer")
            .mask(contender, "contender"))


def rung_label(r: pd.Series) -> str:
    """A rung as a claim names it: the library, or PyTorch's settings, with its rung number."""
    if str(r["change"]).startswith("peer"):
        labels = {**{p.name: p.label for p in providers.providers("fused", "peer")}, **LADDER_PEERS}
        return f"{labels.get(r['name'], r['name'])} (rung {int(r['rung'])})"
    if r.get("kind") == "ours":
        return f"ours: rung {int(r['rung'])}, `{r['name']}`"
    parts = [p for p, on in (("torch.compile", str(r["compile"]).lower() == "true"),
                             ("fused AdamW", r["optimizer"] == "fused"), ("SDPA", r["attention"] == "sdpa")) if on]
    return f"PyTorch: {', '.join(parts) or 'eager'} (rung {int(r['rung'])})"


def ladder_claims(ladder: pd.DataFrame, threshold: float, repeats: dict, older: bool) -> list[Claim]:
    """The ladder's largest model, tokens/s (median step): at the assignment's context and at
    the context of our best bf16 rung, our fastest rung against the fastest peer rung of the same
    context and precision; our FP8 rung against the FP8 peers of its context; our best rung at
    the assignment's context against the assignment's setting; our FP8 rung against our best bf16
    rung of its context."""
    from lmperf.report.e2e import size_order
    if ladder.empty:
        return []
    size = size_order(ladder)[-1]
    g = ladder[(ladder["size"] == size) & (ladder["name"] != "floors")]
    tok = g[(g["metric"] == "tokens_per_s") & (g["status"] == "ok") & (g["dtype"] == "bf16")]
    if tok.empty:
        return []
    tok = tok.assign(kind=rung_kind(tok), fp8=tok["float8"].fillna("none").astype(str).ne("none")
                     if "float8" in tok else False)
    ours_all = tok[(tok["kind"] == "ours") & ~tok["fp8"]]
    assignment = tok[tok["name"] == "compiled"]
    contexts = [int(c) for c in assignment["context"].iloc[:1]]
    if len(ours_all):
        contexts.append(int(ours_all.loc[ours_all["median"].idxmax(), "context"]))
    plan = [(c, False) for c in dict.fromkeys(contexts)]
    fp8_ours = tok[(tok["kind"] == "ours") & tok["fp8"]]
    if len(fp8_ours):
        plan.append((int(fp8_ours.loc[fp8_ours["median"].idxmax(), "context"]), True))
    sd = lambda r: dataclasses.replace(side(g, r, "ladder", rung_label(r), "training step", TIMINGS["step"], threshold),
                                       provider=str(r["name"]), rung=int(r["rung"]), rung_name=str(r["name"]))
    out = []
    for context, fp8 in plan:
        same = tok[(tok["context"] == context) & (tok["fp8"] == fp8)]
        mine, peers = same[same["kind"] == "ours"], same[same["kind"].isin(["peer", "pytorch"])]
        if mine.empty:
            continue
        best = mine.loc[mine["median"].idxmax()]
        precision = f"FP8 (ours: {best['float8']} scaling)" if fp8 else "bf16"
        settings = {"size": size, "precision": "fp8" if fp8 else "bf16", "batch": int(best["batch_size"]),
                    "context": context, "timing": "step", "peer": "best peer rung"}
        what = f"{size} training step, {precision}, batch {int(best['batch_size'])} x context {context:,}"
        peer = sd(peers.loc[peers["median"].idxmax()]) if len(peers) else None
        out.append(make(f"ladder/{size}/ctx{context}/{'fp8' if fp8 else 'bf16'}", "ladder", what, settings, True,
                        sd(best), peer, g, repeats, no_peer=f"none at context {context:,}", older=older))
        if not fp8 and len(assignment) and context == int(assignment["context"].iloc[0]):
            base = assignment.iloc[0]
            out.append(make(f"ladder/{size}/ctx{context}/vs_assignment", "ladder",
                            f"{size} training step, bf16, batch {int(best['batch_size'])} x context {context:,}, "
                            "against the assignment's setting",
                            {**settings, "peer": "the assignment's setting"}, True, sd(best), sd(base), g, repeats,
                            older=older))
        if fp8:
            bf16 = ours_all[ours_all["context"] == context]
            if len(bf16):
                out.append(make(f"ladder/{size}/ctx{context}/fp8_vs_bf16", "ladder",
                                f"{size} training step, batch {int(best['batch_size'])} x context {context:,}: "
                                "our FP8 rung against our best bf16 rung",
                                {**settings, "peer": "our best bf16 rung"}, True, sd(best),
                                sd(bf16.loc[bf16["median"].idxmax()]), g, repeats, older=older))
    return out


def mfu(ladder: pd.DataFrame, table: list[Claim]) -> dict | None:
    """Our best bf16 rung's MFU against the dense bf16 peak under the FlashAttention section's
    convention (causal attention: the computed half of the context x context square) and, beside
    it, the full square's (PaLM's, llm.c's and most published MFU's)."""
    bf16 = [c for c in table if c.section == "ladder" and dict(c.settings).get("precision") == "bf16"
            and dict(c.settings).get("peer") == "best peer rung"]
    if not bf16:
        return None
    best = max(bf16, key=lambda c: c.ours.value)
    rows = ladder[(ladder["case_id"] == best.ours.case_id) & (ladder["status"] == "ok")]
    value = lambda m: float(rows[rows["metric"] == m]["median"].iloc[0]) if (rows["metric"] == m).any() else None
    # the ladder's TFLOP/s (the full square, over every micro-batch of the step), and the share of
    # its FLOPs that half of causal attention's are
    full, flops, attn = value("tflops"), value("closed_form_flops"), value("closed_form_attention_flops")
    peak = float(rows["peak_tflops"].dropna().iloc[0]) if "peak_tflops" in rows and rows["peak_tflops"].notna().any() else None
    if not (full and flops and peak):
        return None
    half = full * (1 - (attn or 0.0) / 2 / flops)
    return {"case_id": best.ours.case_id, "rung": int(rows["rung"].iloc[0]), "name": rows["name"].iloc[0],
            "context": dict(best.settings)["context"], "peak": peak,
            "causal_half": {"tflops": half, "mfu": 100 * half / peak},
            "full_square": {"tflops": full, "mfu": 100 * full / peak}, "older": best.older}


# ---------------------------------------------------------------------------------------------
# Published peers: references, never ratios

# Which claim a published number stands beside (config/references.yaml ids)
REFERENCE_OF = {"cs336_leaderboard_record": "flash_attention/headline/bf16/causal/fwd_bwd/leaderboard/do_bench",
                "fa3_paper_h100_forward_d128_8k_fa3": "flash_attention/throughput/bf16/full/forward/eager/do_bench",
                "fa3_paper_h100_forward_d128_8k_cudnn": "flash_attention/throughput/bf16/full/forward/eager/do_bench"}


def references(table: Claims, refs: dict) -> list[dict]:
    """Each matching published number beside our side of its claim: both settings side by side,
    no ratio (lmperf does not lock clocks, and a published figure's batch, clocks and software
    are its own)."""
    out = []
    for ref_id, prefix in REFERENCE_OF.items():
        ref = refs.get(ref_id)
        mine = table.best([c for c in table.claims if c.id.startswith(prefix + "/")])
        if ref is None or mine is None:
            continue
        out.append({"id": ref_id, "reference": ref, "claim": mine, "ours": mine.ours,
                    "ours_settings": {**dict(mine.settings), "clocks": mine.ours.clocks or "not recorded"},
                    "their_settings": ref.get("conditions", {}), "ratio": None})
    return out


# ---------------------------------------------------------------------------------------------
# The table


def compute(frames: dict, results: Path, threshold: float, older: set | frozenset = frozenset()) -> Claims:
    """Every claim from the sections' rows (`frames`, {section: DataFrame}) and the repeats under
    `results`; `older`: the sections whose code changed since their rows were measured."""
    repeats = repeat_processes(results)
    fa = frames.get("flash_attention", pd.DataFrame())
    fa = with_jobs(fa[fa["study"] == "bench"], results, "flash_attention") if not fa.empty else fa
    lrpe = frames.get("lrpe", pd.DataFrame())
    lrpe = with_jobs(lrpe[lrpe["study"] == "bench"], results, "lrpe") if not lrpe.empty else lrpe
    ladder = frames.get("ladder", pd.DataFrame())
    ladder = with_jobs(ladder, results, "ladder") if not ladder.empty else ladder
    fa, lrpe = providers.renamed(fa, "attention"), providers.renamed(lrpe, "lrpe")
    if not fa.empty and "median" not in fa:
        fa = fa.assign(median=fa["mean"])
    if not fa.empty and "harness" not in fa:  # rows from before the bench recorded it: the provider's own
        known = {p.name: p.harness or "eager" for p in providers.providers("attention")}
        fa = fa.assign(harness=fa["provider"].map(known).fillna("eager"))
    table = Claims()
    if not fa.empty:
        table.claims += fa_config_claims(fa, threshold, repeats, "flash_attention" in older)
        grids, grid_claims = fa_grid_verdicts(fa, threshold, repeats, "flash_attention" in older)
        table.grids += grids
        table.claims += grid_claims
    table.claims += lrpe_claims(lrpe, threshold, repeats, "lrpe" in older)
    table.claims += ladder_claims(ladder, threshold, repeats, "ladder" in older)
    table.mfu = mfu(ladder, table.claims) if not ladder.empty else None
    return table


def of(inputs) -> Claims:
    """The claims of a report's inputs (report/render.py's Inputs), computed once a render and
    kept on the inputs: every view that states a claim reads this one table."""
    cached = inputs.__dict__.get("_claims")
    if cached is None:
        from lmperf.report import freshness
        frames = {k: v for k, v in inputs.frames.items() if k in ("flash_attention", "lrpe", "ladder")}
        older = set(freshness.view(frames)["changed"])
        cached = compute(inputs.frames, inputs.results, inputs.bars.get("host_bound_idle_pct", math.inf), older)
        inputs.__dict__["_claims"] = cached
    return cached


def stated(table: Claims) -> list[Claim]:
    """The claims a verdict is drawn from: per configuration (section, settings), ours against its
    best peer (the README's, the summary's and the answers' rows and the grids' shapes), and
    every claim of the ladder (each names its own peer)."""
    groups: dict = {}
    for c in table.claims:
        groups.setdefault((c.id if c.section == "ladder" else c.key), []).append(c)
    return [table.best(g) for g in groups.values()]


def repeat_config(table: Claims, only: list[Claim] | None = None) -> dict[str, list[str]]:
    """{job: [case ids]}: the cases the claims (`only`, else every claim with a peer) need timed
    in fresh processes, the repeats' configuration (config `repeats`, as `{job: ..., cases:
    [...]}` entries) derived from the claims."""
    out: dict[str, list[str]] = {}
    for c in (table.claims if only is None else only):
        if c.peer is None:
            continue
        for job, case in c.repeat_cases:
            if job and case not in out.setdefault(job, []):
                out[job].append(case)
    return out


def load(results: Path, section: str) -> pd.DataFrame:
    """A section's CSVs under `results` as they are (journals of unfinished runs left out): what
    the command line reads; the report's renderer checks them first (report/render.py)."""
    paths = [p for p in sorted((Path(results) / section).rglob("*.csv")) if ".journal" not in p.parts]
    frames = [providers.read_renamed(pd.read_csv(p, keep_default_na=False, na_values=[""])) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def main(argv=None) -> None:
    """Print a results folder's claims (or, with --repeats, the repeats' configuration the claims
    need: config `repeats` entries, one a job)."""
    import argparse

    import yaml
    p = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--config", type=Path, default=Path("config/config.yaml"), help="for the host-bound threshold")
    p.add_argument("--repeats", action="store_true", help="print the repeats' jobs and cases the claims need")
    p.add_argument("--all", action="store_true", help="with --repeats: every claim's, not only each configuration's "
                                                      "claim against its best peer")
    args = p.parse_args(argv)
    threshold = yaml.safe_load(args.config.read_text())["report"]["host_bound_idle_pct"]
    table = compute({s: load(args.results, s) for s in ("flash_attention", "lrpe", "ladder")}, args.results, threshold)
    if args.repeats:
        needed = repeat_config(table, None if args.all else stated(table))
        print(yaml.safe_dump({"jobs": [{"job": job, "cases": cases} for job, cases in needed.items()]}, sort_keys=False))
        return
    for c in table.claims:
        band = f"{c.band[0]:.4g}-{c.band[1]:.4g} ({c.processes})" if c.band else "-"
        ratio = f"{c.speedup:.3g}x" if c.speedup is not None else "-"
        peer = f"{c.peer.value:.4g}" if c.peer else "-"
        print(f"{c.id}\t{c.ours.value:.4g}\t{peer}\t{ratio}\t{band}\t{c.verdict}")


if __name__ == "__main__":
    main()
