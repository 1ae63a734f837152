"""The table of claims (lmperf.report.claims) on the committed H100 results and on a small fixture:
each claim recomputed from the CSVs, the README and the summary rendering claims and nothing of
their own, and, for each way a claim went wrong before, a test that fails where it does."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, golden
from lmperf import providers
from lmperf.report import claims, readme, render, summary
from lmperf.report.render import Inputs, bars_from_config, load_section

H100 = REPO / "results" / "h100-80gb-hbm3"
GOLDEN = REPO / "tests" / "fixtures" / "claims"


@pytest.fixture(scope="module")
def inputs():
    frames = {s: load_section(H100, s) for s in ("flash_attention", "lrpe", "ladder", "env")}
    return Inputs(results=H100, frames=frames, bars=bars_from_config(REPO / "config" / "config.yaml"),
                  out_dir=REPO / "report")


@pytest.fixture(scope="module")
def table(inputs):
    return claims.of(inputs)


def read(path) -> pd.DataFrame:
    """A results CSV as the report's readers read it: ids written under an older scheme in
    today's (providers.read_renamed)."""
    return providers.read_renamed(pd.read_csv(path))


def csv_value(side: claims.Side) -> float:
    """A side's median read from its job's CSV file alone (its ids as every reader reads them)."""
    rows = read(H100 / f"{side.job}.csv")
    r = rows[(rows["case_id"] == side.case_id) & (rows["metric"] == side.metric) & (rows["status"] == "ok")]
    assert len(r) == 1, (side.job, side.case_id, side.metric)
    return float(r["median"].iloc[0])


def test_each_claim_is_recomputed_from_the_csvs(table):
    assert table.claims
    for c in table.claims:
        ours = csv_value(c.ours)
        assert ours == pytest.approx(c.ours.value)
        if c.peer is None:
            assert c.speedup is None and c.verdict == claims.NO_PEER
            continue
        peer = csv_value(c.peer)
        expected = ours / peer if c.higher_is_better else peer / ours
        assert c.speedup == pytest.approx(expected), c.id


def test_each_band_is_the_range_of_the_paired_processes(table):
    """The band: the lowest and highest speed-up over the job's process and each repeat's run file."""
    banded = [c for c in table.claims if c.band is not None]
    assert banded  # LRPE's 1-D case and the model group's repeated shape
    for c in banded:
        ratios = [c.peer.value / c.ours.value if not c.higher_is_better else c.ours.value / c.peer.value]
        for run in sorted((H100 / "repeats" / c.ours.job).glob("run*.csv")):
            rows = read(run)
            v = lambda s: rows[(rows["case_id"] == s.case_id) & (rows["metric"] == s.metric)]["median"]
            o, p = v(c.ours), v(c.peer)
            if len(o) and len(p):
                ratios.append(float(p.iloc[0]) / float(o.iloc[0]) if not c.higher_is_better
                              else float(o.iloc[0]) / float(p.iloc[0]))
        assert len(ratios) == c.processes >= claims.MIN_PROCESSES
        assert c.band == pytest.approx((min(ratios), max(ratios)))


# ---------------------------------------------------------------------------------------------
# What was wrong before, one test each


def test_one_ours_per_configuration_and_the_headline_is_the_leaderboard_call(table):
    ours = {}
    for c in table.claims:
        ours.setdefault(c.key, set()).add(c.ours.provider)
    assert all(len(v) == 1 for v in ours.values()), {k: v for k, v in ours.items() if len(v) > 1}
    head = readme.rows_of(table)[0]
    assert head.ours.provider == "triton_compiled" and head.ours.harness == "leaderboard"
    s = summary.flash_attention({"available": True}, {}, table)
    assert s["leaderboard"]["claim"] is head


def test_no_ratio_spans_two_harnesses_or_two_timings(table):
    for c in table.claims:
        if c.peer is not None:
            assert (c.ours.harness, c.ours.timing) == (c.peer.harness, c.peer.timing), c.id


def test_a_win_lies_wholly_beyond_one(table):
    for c in table.claims:
        if c.verdict == claims.FASTER:
            assert c.band is not None and c.band[0] > 1 and c.processes >= claims.MIN_PROCESSES, c.id
        if c.band is None and c.peer is not None:
            assert c.verdict in (claims.NO_BAND, claims.HOST_BOUND), c.id
    throughput = readme.rows_of(table)[2]  # the throughput forward against cuDNN: one process only
    assert throughput.speedup > 1 and throughput.verdict == claims.NO_BAND


def test_a_host_bound_side_is_never_a_verdict(table):
    for c in table.claims:
        if c.peer is not None and (c.ours.host_bound or c.peer.host_bound):
            assert c.verdict == claims.HOST_BOUND, c.id


def test_a_published_peer_at_other_settings_gets_no_ratio(table):
    refs = {r["id"]: r for r in claims.references(table, {
        "fa3_paper_h100_forward_d128_8k_fa3": {"value": 646, "unit": "TFLOP/s",
                                               "conditions": {"gpu": "clock fixed at 1830 MHz"}}})}
    fa3 = refs["fa3_paper_h100_forward_d128_8k_fa3"]
    assert fa3["ratio"] is None and fa3["their_settings"]["gpu"] and fa3["ours_settings"]["clocks"] == "not recorded"
    rows = summary.throughput({"available": True}, {"fa3_paper_h100_forward_d128_8k_fa3": {
        "value": 646, "unit": "TFLOP/s", "conditions": {}}}, table)
    assert all(p["ratio"] is None for p in rows["published"])


def test_a_grid_verdict_has_its_denominator_and_the_best_peer_at_each_shape(table):
    grids = {g.id: g for g in table.grids}
    do_bench = grids["flash_attention/grid/bf16/do_bench"]
    assert "sdpa_cudnn" in do_bench.peers  # cuDNN is a peer wherever it ran
    for g in table.grids:
        assert g.shapes == g.faster + g.slower + g.level + g.host_bound == len(g.claims)
        for c in g.claims:  # the best peer: no peer of that shape and timing is faster
            rows = read(H100 / f"{c.ours.job}.csv")
            shape = rows[rows["case_id"] == c.peer.case_id].iloc[0]
            same = rows[(rows["metric"] == c.ours.metric) & (rows["status"] == "ok")
                        & (rows["seq_len"] == shape["seq_len"]) & (rows["head_dim"] == shape["head_dim"])
                        & (rows["batch"] == shape["batch"]) & (rows["heads"] == shape["heads"])
                        & (rows["dtype"] == shape["dtype"]) & rows["provider"].isin(list(claims.fa_peers()))]
            assert c.peer.value == pytest.approx(same["median"].min())


def test_the_readme_shows_forward_and_backward_wherever_it_shows_forward_alone(table):
    rows = readme.rows_of(table)
    for c in rows:
        if c.setting("pass") == "forward" and c.section == "flash_attention":
            assert any(o.setting("pass") == "forward+backward" and o.setting("shape") == c.setting("shape")
                       and o.setting("causal") == c.setting("causal") for o in rows), c.id


def test_mfu_is_stated_under_the_flash_attention_sections_convention_with_the_other_beside_it(table):
    m = table.mfu
    assert m["causal_half"]["mfu"] < m["full_square"]["mfu"]
    rows = load_section(H100, "ladder")
    tflops = rows[(rows["case_id"] == m["case_id"]) & (rows["metric"] == "tflops")]["median"].iloc[0]
    assert m["full_square"]["tflops"] == pytest.approx(tflops, rel=1e-6)


def test_fp32_comparisons_name_both_sides_matmul_precision(table):
    fp32 = [g for g in table.grids if "/fp32/" in g.id]
    assert fp32 and all(g.precision for g in fp32)


def test_the_repeats_a_claim_needs_are_listed(table):
    """Each stated claim (the README's rows among them) names both its cases, under its job."""
    stated = claims.stated(table)
    assert all(c in stated for c in readme.rows_of(table) if c.peer is not None)
    needed = claims.repeat_config(table, stated)
    head = table.find("flash_attention/headline/bf16/causal/fwd_bwd/eager/do_bench/sdpa_cudnn")
    job = head.ours.job
    assert head.ours.case_id in needed[job] and head.peer.case_id in needed[job]


def test_a_comparison_between_gpus_judges_only_rows_at_the_same_code(tmp_path):
    from lmperf import compare, compare_page
    a, b = compare.load(H100), compare.load(REPO / "results" / "h200")
    result = compare.compare(a, b)
    assert result["hardware"]
    rows = result["rows"]
    changed = rows[rows["code"] == compare.CODE_CHANGED]
    assert len(changed)  # the H200 rows were measured at other commits
    assert (rows.loc[rows["code"] == compare.SAME_CODE].index.size + len(changed)) == len(rows)
    text = compare_page.render(result, "a", "b", a, b)
    assert "Differences here are the hardware's" not in text
    assert f"{len(changed)} rows" in text.split("## Rows at different code")[1]


# ---------------------------------------------------------------------------------------------
# The README and the summary render claims


def test_every_readme_row_is_one_claim(inputs, table):
    v = readme.view(H100)
    ids = [r["claim"].id for r in v["rows"]]
    assert len(set(ids)) == len(ids)  # each row its own claim, each claim in one row
    for r in v["rows"]:
        c = r["claim"]
        assert c in table.claims
        assert r["speedup"] == c.speedup and r["verdict"] == c.verdict and r["band"] == c.band
        value = c.ours.rate if r["unit"] == "TFLOP/s" else c.ours.value
        assert r["ours"] == value
    block = readme.render_block(H100, REPO / "templates")
    from lmperf.report.format import fmt
    for r in v["rows"]:
        assert fmt(r["ours"]) in block
        if r["speedup"] is not None:
            assert f"{fmt(r['speedup'])}x" in block


def test_every_summary_comparison_is_a_claim(table):
    s = summary.view({"flash_attention": {"available": True}, "ladder": {"available": True}}, [], "h100", table)
    assert s["flash_attention"]["leaderboard"]["claim"] in table.claims
    assert set(s["flash_attention"]["vs"]) == set(s["throughput"]["vs"]) == {"sdpa_flash", "sdpa_cudnn"}
    for row in [*s["flash_attention"]["vs"].values(), *s["throughput"]["vs"].values(), s["throughput"]["fwd_bwd"]]:
        assert row["claim"] in table.claims
    assert s["training"]["assignment"] in table.claims and s["training"]["fp8"]["claim"] in table.claims
    assert s["training"]["assignment"].peer.rung_name == "compiled"  # the assignment's setting, same context


# ---------------------------------------------------------------------------------------------
# One golden render of a small fixture


def fixture_results(root: Path) -> Path:
    """A results folder of one FlashAttention-2 job: ours called as it is and under the
    leaderboard's harness, SDPA-cuDNN called as it is; and two fresh processes of the job."""
    results = root / "results" / "fixture"
    common = {"section": "flash_attention", "study": "bench", "group": "headline", "dtype": "bf16", "causal": True,
              "batch": 1, "heads": 16, "kv_heads": 16, "seq_len": 16384, "head_dim": 64, "status": "ok",
              "gpu_idle_pct": 1.0, "commit": "abc", "unit": "ms", "gpu_time": False}

    def rows(scale: float) -> list[dict]:
        out = []
        for provider, harness, ms in (("triton", "eager", 4.0), ("triton_compiled", "leaderboard", 4.2),
                                      ("sdpa_cudnn", "eager", 4.4)):
            case = f"headline-{provider}-bf16-causal-b1h16n16384d64"
            for d, share in (("forward", 0.25), ("backward", 0.75), ("fwd_bwd", 1.0)):
                out.append({**common, "case_id": case, "provider": provider, "harness": harness,
                            "metric": f"{d}_ms", "median": ms * share * (scale if provider == "triton" else 1)})
        return out
    job = results / "flash_attention" / "bench"
    job.mkdir(parents=True)
    pd.DataFrame(rows(1.0)).to_csv(job / "headline_d64.csv", index=False)
    rep = results / "repeats" / "flash_attention" / "bench" / "headline_d64"
    rep.mkdir(parents=True)
    for k, scale in ((1, 1.05), (2, 0.97)):
        pd.DataFrame(rows(scale)).to_csv(rep / f"run{k}.csv", index=False)
    return results


def test_the_headlines_peers_are_timed_in_ours_harness(tmp_path):
    """The full configuration's headline job times ours under the leaderboard's harness and SDPA's
    backends under that harness too (their own case ids), so the README's headline claim sets
    ours against a peer of the same harness, not against an eager row."""
    import json
    from lmperf import specs
    from lmperf.bench import flash_attention as fa_bench
    config = render.load_config(REPO / "config" / "config.yaml")
    spec = json.loads(specs.fa_bench_spec(config["flash_attention"]["full"], config["models"], "headline_d64", config))
    cases = fa_bench.bench_cases(spec)
    assert len({c["case_id"] for c in cases}) == len(cases)
    timed = {(c["provider"], c["harness"]) for c in cases}
    assert {("triton_compiled", "leaderboard"), ("sdpa_flash", "leaderboard"), ("sdpa_cudnn", "leaderboard"),
            ("triton", "eager"), ("sdpa_cudnn", "eager")} <= timed
    results = tmp_path / "results" / "fixture"
    job = results / "flash_attention" / "bench"
    job.mkdir(parents=True)
    ms = {"triton_compiled": 4.2, "sdpa_flash": 6.0, "sdpa_cudnn": 4.4, "triton": 4.0, "plain": 30.0, "flex": 7.0}
    rows = [{"section": "flash_attention", "study": "bench", "group": c["group"], "dtype": c["dtype"],
             "causal": c["causal"], "batch": c["batch"], "heads": c["heads"], "kv_heads": c["kv_heads"],
             "seq_len": c["seq_len"], "head_dim": c["head_dim"], "status": "ok", "commit": "abc", "unit": "ms",
             "gpu_time": False, "gpu_idle_pct": 1.0, "case_id": c["case_id"], "provider": c["provider"],
             "harness": c["harness"], "metric": "fwd_bwd_ms",
             "median": ms[c["provider"]] * (1.1 if c["harness"] == "leaderboard" and c["provider"] != "triton_compiled" else 1)}
            for c in cases]
    pd.DataFrame(rows).to_csv(job / "headline_d64.csv", index=False)
    table = claims.compute({"flash_attention": load_section(results, "flash_attention")}, results, 10.0)
    head = table.find("flash_attention/headline/bf16/causal/fwd_bwd/leaderboard/do_bench/sdpa_cudnn")
    assert head.ours.value == pytest.approx(4.2) and head.peer.value == pytest.approx(4.4 * 1.1)
    assert head.ours.harness == head.peer.harness == "leaderboard"


def test_golden_render_of_a_small_fixture(tmp_path):
    results = fixture_results(tmp_path)
    frames = {"flash_attention": load_section(results, "flash_attention")}
    table = claims.compute(frames, results, 10.0)
    text = readme.table_text([readme.row(c) for c in readme.rows_of(table)])
    golden(GOLDEN / "readme_table.md", text + "\n")
    head = table.find("flash_attention/headline/bf16/causal/fwd_bwd/eager/do_bench/sdpa_cudnn")
    assert head.processes == 3 and head.band == pytest.approx((4.4 / (4.0 * 1.05), 4.4 / (4.0 * 0.97)))
    assert head.verdict == claims.FASTER  # 1.048 to 1.134: wholly beyond 1


@pytest.mark.parametrize("hw", ["h100-80gb-hbm3", "h200"])
def test_the_full_square_mfu_is_the_ladders_own(hw):
    """The MFU over the full square is the ladder's `mfu_pct` of the same case, a rung of several
    micro-batches a step included (the H200's best bf16 rung accumulates 4)."""
    results = REPO / "results" / hw
    ladder = load_section(results, "ladder")
    m = claims.compute({"ladder": ladder}, results, 10.0).mfu
    own = ladder[(ladder["case_id"] == m["case_id"]) & (ladder["metric"] == "mfu_pct")]["median"].iloc[0]
    assert m["full_square"]["mfu"] == pytest.approx(own, rel=1e-6)
    assert m["causal_half"]["mfu"] < m["full_square"]["mfu"]


def test_the_kernel_a_row_records_is_named_beside_ours(tmp_path):
    """Where the bench records the kernel that ran (column `kernel`), the claim carries it and the
    README's table shows it; where it does not, no column claims one."""
    results = fixture_results(tmp_path)
    csv = results / "flash_attention" / "bench" / "headline_d64.csv"
    frames = {"flash_attention": load_section(results, "flash_attention")}
    bare = readme.table_text([readme.row(c) for c in readme.rows_of(claims.compute(frames, results, 10.0))])
    assert "kernel" not in bare.splitlines()[0]
    pd.read_csv(csv).assign(kernel="forward: Gluon; dK/dV: tile").to_csv(csv, index=False)
    frames = {"flash_attention": load_section(results, "flash_attention")}
    table = claims.compute(frames, results, 10.0)
    assert all(c.ours.kernel == "forward: Gluon; dK/dV: tile" for c in table.claims)
    assert "forward: Gluon; dK/dV: tile" in readme.table_text([readme.row(c) for c in readme.rows_of(table)])


def _model_claim(shape: str, speedup: float, verdict: str, peer: str = "sdpa_cudnn") -> claims.Claim:
    """A model-group claim at `shape` (GPU time) against `peer`, with its verdict as given."""
    side = claims.Side(provider="triton_compiled", label="ours", harness="leaderboard", timing=claims.TIMINGS["gpu"],
                       metric="fwd_bwd_gpu_ms", value=1.0, unit="ms", case_id="c", section="flash_attention",
                       job="flash_attention/bench/model", host_bound=False, commit="0" * 12)
    band = {claims.SAME: (speedup - 0.02, speedup + 0.02), claims.SLOWER: (speedup - 0.01, speedup + 0.01)}
    return claims.Claim(id=f"flash_attention/model/bf16/gpu/{shape}", section="flash_attention", what=shape,
                        settings=(("group", "model"), ("shape", shape)), higher_is_better=False, ours=side,
                        peer=dataclasses.replace(side, provider=peer, value=speedup),
                        speedup=speedup, band=band.get(verdict), processes=3 if verdict in band else 1,
                        verdict=verdict)


@pytest.mark.parametrize("verdicts, slower", [((claims.SAME, claims.NO_BAND), 1), ((claims.SAME, claims.SAME), 0),
                                              ((claims.NO_BAND, claims.SLOWER), 2)])
def test_a_shape_the_same_within_noise_is_not_counted_slower(verdicts, slower):
    """The targets judge "no slower than the peer" by the claims' noise rule: a ratio below 1 whose band
    holds 1 is the same within noise (the model group's bar; the grids' counts: the partition test above)."""
    from lmperf.report import flash_attention
    shapes = [(4, 32, 1024, 80, 0.994), (8, 16, 2048, 128, 0.959)]
    made = [_model_claim(claims.shape_text(pd.Series({"batch": b, "heads": h, "seq_len": n, "head_dim": d})), r, v)
            for (b, h, n, d, r), v in zip(shapes, verdicts)]
    counted = [c for c in made if not c.level]
    grid = claims.GridVerdict(id="flash_attention/model/bf16/gpu", section="flash_attention", what="the model group",
                              timing=claims.TIMINGS["gpu"], peers=("sdpa_cudnn",), shapes=2, faster=0,
                              slower=len(counted), host_bound=0, banded=0, wins=0, claims=tuple(made),
                              level=sum(c.level for c in made))
    model = pd.DataFrame([{"model": "m", "batch": b, "heads": h, "D": d, "N": n, "speed-up over sdpa_cudnn": r}
                          for b, h, n, d, r in shapes])
    model.attrs["metric"] = "fwd_bwd_gpu_ms"
    bar = next(b for b in flash_attention.bars(claims.Claims(claims=made, grids=[grid]), model, {})
               if "sdpa_cudnn at every shape" in b["bar"])
    assert bar["_value"] == slower and bar["met"] == (slower == 0)


@pytest.mark.parametrize("verdict, met", [(claims.SAME, True), (claims.NO_BAND, False), (claims.SLOWER, False)])
def test_a_bar_at_the_peers_time_is_met_within_the_noise_and_only_there(verdict, met):
    """The headline "at or under cuDNN's time": a speed-up of 0.99 is met where the band holds 1."""
    from lmperf.report import flash_attention
    c = _model_claim("1 x 16 heads x 16,384 x 64", 0.99, verdict)
    c = dataclasses.replace(c, id="flash_attention/headline/bf16/causal/fwd_bwd/leaderboard/do_bench/sdpa_cudnn")
    bars = flash_attention.bars(claims.Claims(claims=[c]), pd.DataFrame(),
                                {"headline_vs_sdpa_cudnn": 1.0, "headline_ms": 5.2})
    bar = next(b for b in bars if "over cuDNN" in b["bar"])
    assert bar["_value"] == pytest.approx(0.99) and bar["met"] == met


def test_the_losses_to_the_best_peer_are_counted_by_their_verdicts():
    """The FlashAttention section's count of shapes where the best peer's median beats ours, split by the
    noise rule: slower outside the noise, the same within it, host-bound, no band; wins not counted."""
    from lmperf.report import flash_attention
    made = [_model_claim(f"shape {i}", r, v) for i, (r, v) in enumerate(
        [(0.95, claims.SLOWER), (0.96, claims.SLOWER), (0.99, claims.SAME), (0.9, claims.NO_BAND), (1.1, claims.NO_BAND)])]
    made.append(dataclasses.replace(_model_claim("shape 5", 0.5, claims.HOST_BOUND), verdict=claims.HOST_BOUND))
    got = flash_attention.losses(claims.Claims(claims=made))
    assert (got["n"], got["slower"]) == (6, 5)
    assert got["verdicts"] == {claims.SLOWER: 2, claims.SAME: 1, claims.HOST_BOUND: 1, claims.NO_BAND: 1}
    assert got["table"]["verdict"].tolist() == [claims.SLOWER, claims.SLOWER, claims.SAME, claims.NO_BAND,
                                                claims.HOST_BOUND]


@pytest.mark.parametrize("timed, kernel, shown", [
    ("forward", "forward: gluon; backward: gluon fused", "forward: gluon"),
    ("backward", "forward: tile; backward: gluon dq + gluon dkdv", "backward: gluon dq + gluon dkdv"),
    ("forward+backward", "forward: gluon; backward: gluon fused", "forward: gluon; backward: gluon fused"),
    ("forward", "tile", "tile"),  # a kernel column not split by pass: shown whole
    ("forward", None, ""),
])
def test_a_rows_kernel_column_names_the_kernels_of_the_pass_it_times(timed, kernel, shown):
    from lmperf.report import flash_attention
    c = _model_claim("1 x 16 heads x 16,384 x 64", 0.99, claims.NO_BAND)
    c = dataclasses.replace(c, settings=(("pass", timed),), ours=dataclasses.replace(c.ours, kernel=kernel))
    assert flash_attention.kernel_of_pass(c) == shown
