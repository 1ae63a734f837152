"""A peer added by one declaration (lmperf.providers.register) reaches the bench's CSV, the
FlashAttention-2 section's tables, the report's summary and the README's table; made the fastest,
it is the best peer everywhere a best peer is named. The bench's own row code runs (case
planning, measure_bench, the job's loop writing the CSV); only the device is faked: the calls are
timed by a fake clock, since this machine has no GPU. Also: the report's peers of record, ours
and the grid's reference come from the registry, and rows under an old name read as the
provider that now has it."""
import contextlib
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from lmperf import contenders, providers
from lmperf.bench import flash_attention as bench, jobs, timing
from lmperf.report import claims, flash_attention, readme, summary
from lmperf.report.render import load_section

# fwd+bwd ms by provider (the forward a quarter of it, the backward the rest): the new peer
# fastest of all, ours second
MS = {"triton": 4.0, "triton_compiled": 4.2, "sdpa_flash": 5.0, "sdpa_cudnn": 4.4, "mine_fast": 3.0}
SHARE = {"forward": 0.25, "fwd_bwd": 1.0, "backward": 0.75}


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.delenv(providers.ENV, raising=False)
    monkeypatch.delenv(contenders.ENV, raising=False)
    with providers.kept():
        yield providers


def declare(record: bool = False, aliases: tuple[str, ...] = ()) -> None:
    """The one declaration: PyTorch's plain attention under a name and label of its own."""
    def build(case):
        from lmperf.model import plain_attention
        return (lambda q, k, v: plain_attention(q, k, v, case["causal"])), contextlib.nullcontext
    providers.register(providers.Provider("mine_fast", "Mine, fast", "peer", "attention", build, record=record,
                                          aliases=aliases))


def spec() -> dict:
    group = {"batch": 1, "dtypes": ["bf16"], "causal": [True], "seq_lens": [64], "head_dims": [16], "heads": [2],
             "timing_ms": [1, 1], "tiled_max_seq_len": 64,
             "providers": ["triton", "triton_compiled", "sdpa_flash", "sdpa_cudnn", "mine_fast"]}
    return {"groups": [{**group, "name": "headline"}, {**group, "name": "throughput", "causal": [False],
                                                       "providers": ["triton", "sdpa_flash", "sdpa_cudnn", "mine_fast"]}]}


def fake_device(monkeypatch) -> None:
    """The bench on this CPU: the new peer's own build runs (its declaration's), the others a
    stand-in call (they need CUDA); every call is timed by the fake clock `MS`, in the order
    measure_bench times them (forward, forward+backward, backward)."""
    import torch
    state = {}

    def setup(case):
        b, h, n, d = case["batch"], case["heads"], case["seq_len"], case["head_dim"]
        q, k, v = (torch.randn(b, h, n, d, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        fn, context = (bench.provider_fn(case) if case["provider"] == "mine_fast"
                       else ((lambda q, k, v: q * 1.0), contextlib.nullcontext))
        state.update(provider=case["provider"], calls=0)
        return fn, context, lambda: fn(q, k, v).sum().backward(), (q, k, v, torch.randn(b, h, n, d, dtype=torch.bfloat16))

    def clock(fn, **kw):
        fn()  # the call runs once
        direction = ("forward", "fwd_bwd", "backward")[state["calls"]]
        state["calls"] += 1
        ms = MS[state["provider"]] * SHARE[direction]
        return timing.Quantiles(ms, ms * 0.99, ms * 1.01, n=10, stop="fake clock")

    monkeypatch.setattr(bench, "setup_bench", setup)
    monkeypatch.setattr(timing, "bench_calls", clock)
    monkeypatch.setattr(timing, "gpu_idle", lambda fn, wall_ms, **kw: (1.0, ""))


def measured(tmp_path: Path, monkeypatch) -> Path:
    """A results folder with one FlashAttention-2 bench job, written by the bench's row code."""
    fake_device(monkeypatch)
    results = tmp_path / "results" / "cpu"
    out = results / "flash_attention" / "bench" / "headline.csv"
    out.parent.mkdir(parents=True)
    cases = bench.bench_cases(spec())
    assert [c["case_id"] for c in cases if c["provider"] == "mine_fast"] == \
        ["headline-mine_fast-bf16-causal-b1h2n64d16", "throughput-mine_fast-bf16-full-b1h2n64d16"]
    args = SimpleNamespace(workers=1, cases=None, out=out, hw="cpu", log=None)  # the job's command line
    jobs.run(section="flash_attention", study="bench", cases=cases, measure=bench.measure_bench, args=args,
             fingerprint={})
    return results


def test_a_declared_peer_made_the_fastest_reaches_the_csv_the_tables_the_summary_and_the_readme(
        registry, tmp_path, monkeypatch):
    declare()
    results = measured(tmp_path, monkeypatch)

    # the bench's CSV: its rows, timed, beside ours
    rows = pd.read_csv(results / "flash_attention" / "bench" / "headline.csv")
    mine = rows[rows["provider"] == "mine_fast"]
    assert set(mine["status"]) == {"ok"}
    assert mine.set_index(["group", "metric"])["median"][("headline", "fwd_bwd_ms")] == pytest.approx(3.0)
    assert set(rows["provider"]) == set(MS)

    # the claims: the best peer of every configuration and pass
    table = claims.compute({"flash_attention": load_section(results, "flash_attention")}, results, 10.0)
    heads = [c for c in table.claims if c.id.startswith("flash_attention/headline/bf16/causal/fwd_bwd/eager/")]
    best = table.best(heads)
    assert best.peer.provider == "mine_fast" and best.peer.label == "Mine, fast"
    assert best.speedup == pytest.approx(3.0 / 4.0)  # its time over ours: ours is slower

    # the section's tables
    inputs = readme.inputs_of(results)
    view = flash_attention.view(inputs)
    headline = next(c for c in view["configs"] if c["group"] == "headline")
    assert "mine_fast" in list(headline["table"]["provider"])
    assert headline["ratios"][("mine_fast", "fwd_bwd")] == pytest.approx(MS[headline["ours"]] / 3.0)  # ours: time over its
    assert "over mine_fast" in view["ratios"].columns
    lines = view["claims"]["lines"]  # the section's answer: the leaderboard harness's has no peer here
    assert [c.peer.provider for c in lines if c.peer] == ["mine_fast"] * 3
    assert list(view["answer"]["best peer"]) == [claims.NO_PEER, "Mine, fast", "Mine, fast", "Mine, fast"]
    assert set(view["losses"]["table"]["best peer"]) == {"Mine, fast"} and view["losses"]["slower"] == view["losses"]["n"]
    assert {p["provider"]: p["role"] for p in flash_attention.provider_rows(inputs.rows("flash_attention", "bench"))} \
        ["mine_fast"] == "peer"

    # the summary
    s = summary.view({"flash_attention": view}, [], "cpu", claims.of(inputs))
    assert s["flash_attention"]["best"]["claim"].peer.provider == "mine_fast"
    assert s["throughput"]["best"]["claim"].peer.provider == "mine_fast"
    assert s["throughput"]["fwd_bwd"]["claim"].peer.provider == "mine_fast"

    # the README's table
    r = readme.view(results)
    fa_rows = [x for x in r["rows"] if x["claim"].section == "flash_attention"]
    assert [x["peer"] for x in fa_rows] == [claims.NO_PEER, "Mine, fast", "Mine, fast", "Mine, fast"]
    assert [x["claim"].peer.provider for x in fa_rows if x["claim"].peer] == ["mine_fast"] * 3


def test_a_peer_of_record_is_named_by_the_summary_and_the_model_group(registry, tmp_path, monkeypatch):
    """Declared a peer of record, the new peer gets the summary's row against it and a speed-up
    column in the model group; its bars wait for thresholds named after it in the config."""
    declare(record=True)
    assert [p.name for p in providers.of_record()] == ["sdpa_flash", "sdpa_cudnn", "mine_fast"]
    results = measured(tmp_path, monkeypatch)
    inputs = readme.inputs_of(results)
    table = claims.of(inputs)
    s = summary.view({"flash_attention": {"available": True}}, [], "cpu", table)
    assert s["flash_attention"]["vs"]["mine_fast"]["claim"].peer.provider == "mine_fast"
    assert s["throughput"]["vs"]["mine_fast"]["claim"].peer.provider == "mine_fast"
    rows = pd.read_csv(results / "flash_attention" / "bench" / "headline.csv")
    model = rows[rows["group"] == "headline"].assign(group="model")
    wide = flash_attention.model_table(model.assign(median=model["median"]), "fwd_bwd_ms")
    assert wide["speed-up over mine_fast"].iloc[0] == pytest.approx(3.0 / 4.0)  # its time over ours
    limits = {**inputs.bars["flash_attention"], "throughput_vs_mine_fast": 1.0}
    bars = flash_attention.bars(table, pd.DataFrame(), limits)
    mine = [b for b in bars if "Mine, fast" in b["bar"]]  # the throughput shape's forward against it
    assert len(mine) == 1 and mine[0]["_value"] == pytest.approx(0.75) and not mine[0]["met"]  # below its 1.0
    assert not any("mine_fast" in b["bar"] or "Mine, fast" in b["bar"] for b in
                   flash_attention.bars(table, pd.DataFrame(), inputs.bars["flash_attention"]))  # no threshold: no bar


def test_ours_the_peers_of_record_and_the_reference_come_from_the_registry():
    assert providers.ours() == "triton" and providers.ours(harness="leaderboard") == "triton_compiled"
    assert [p.name for p in providers.of_record()] == ["sdpa_flash", "sdpa_cudnn"]
    assert [p.says for p in providers.of_record()] == ["SDPA-flash", "cuDNN"]
    assert providers.reference() == "plain_compiled"
    assert providers.ours("lrpe") == "triton" and [p.name for p in providers.of_record("lrpe")] == ["torch_compile"]
    assert providers.names("model_attention", "ours") == ["flash-triton"]
    # LRPE's "triton" and the attention's are two providers of two contracts
    assert providers.get("triton", "lrpe") is not providers.get("triton")


def test_an_alias_reads_old_rows_as_the_provider_that_now_has_the_name(registry):
    old = providers.get("plain")
    providers.register(providers.Provider("plain_renamed", "PyTorch", "peer", "attention", old.build,
                                          aliases=("plain_old",)))
    assert providers.canonical("attention")["plain_old"] == "plain_renamed"
    with pytest.raises(ValueError, match="plain_old"):
        providers.register(providers.Provider("again", "x", "peer", "attention", old.build, aliases=("plain_old",)))


def test_rows_under_an_old_name_read_as_the_renamed_provider(registry, tmp_path, monkeypatch):
    """A rename keeps the old name as an alias: the committed rows written under it reach the
    claims, the section's tables and the README as the provider's, with no new measurement."""
    declare(aliases=("mine_before",))
    results = measured(tmp_path, monkeypatch)
    csv = results / "flash_attention" / "bench" / "headline.csv"
    rows = pd.read_csv(csv)
    rows.assign(provider=rows["provider"].replace({"mine_fast": "mine_before"})).to_csv(csv, index=False)
    assert "mine_fast" not in set(pd.read_csv(csv)["provider"])
    table = claims.compute({"flash_attention": load_section(results, "flash_attention")}, results, 10.0)
    best = table.best([c for c in table.claims if c.id.startswith("flash_attention/headline/bf16/causal/fwd_bwd/eager/")])
    assert best.peer.provider == "mine_fast" and best.peer.label == "Mine, fast"
    view = flash_attention.view(readme.inputs_of(results))
    headline = next(c for c in view["configs"] if c["group"] == "headline")
    assert "mine_fast" in list(headline["table"]["provider"]) and "mine_before" not in list(headline["table"]["provider"])
    assert [x["claim"].peer.provider for x in readme.view(results)["rows"] if x["claim"].peer] == ["mine_fast"] * 3


def test_lrpe_builds_from_the_registry_and_its_config_names_are_checked_against_it():
    """LRPE-cosine's providers are declared in the registry: its torch build computes PyTorch's
    LRPE-cosine, the needs say which need CUDA, and a config naming one it does not hold stops
    planning."""
    import torch

    from lmperf import planning
    from lmperf.kernels.lrpe import lrpe_torch
    from lmperf.report.render import CONFIG, load_config
    case = {"dims": 1, "side": 8, "l": 0}
    x, theta = torch.randn(1, 2, 8, 4), torch.rand(2, 4)
    fn, _ = providers.get("torch", "lrpe").build(case)
    assert torch.equal(fn(x, theta), lrpe_torch(x, theta, (8,), 0))
    assert not providers.get("torch", "lrpe").needs_cuda("bf16") and providers.get("triton", "lrpe").needs_cuda("bf16")
    config = load_config(CONFIG)
    config["lrpe"]["smoke"]["bench"]["providers"] = ["triton", "nope"]
    with pytest.raises(ValueError, match="lrpe.smoke.bench providers names \\['nope'\\]"):
        planning.check_config(config)


def test_the_fused_kernels_are_the_registrys_and_the_ladder_names_its_peer_by_its_label():
    """The ladder's `fused` kernels (ours, one a rung) and their peer (Liger-Kernel) are declared
    under the contract "fused": planning checks the config's names against them, and the claims
    name a peer rung by the registry's label."""
    from lmperf import planning
    from lmperf.report.render import CONFIG, load_config
    assert providers.names("fused", "ours") == ["rmsnorm", "swiglu", "rope"]
    assert providers.names("fused", "peer") == ["liger"]
    rung = pd.Series({"change": "peer (on the last carried rung's settings; not carried up): ...", "name": "liger",
                      "rung": 12})
    assert claims.rung_label(rung) == f"{providers.get('liger', 'fused').label} (rung 12)"
    config = load_config(CONFIG)
    config["ladder"]["smoke"]["fused"] = ["rmsnorm", "mine"]
    with pytest.raises(ValueError, match="ladder.smoke.fused names \\['mine'\\]"):
        planning.check_config(config)


def test_the_ladder_rung_of_our_attention_reads_under_its_old_spelling(tmp_path):
    """The model's attention, its ladder rung and the rung's case ids are spelled flash-triton;
    rows written as flash_triton read in that spelling (the report's, the claims' and the
    comparison's readers), check as the cases the ladder's job promises, and a case pattern of
    the config in the old spelling still selects the rung."""
    from lmperf import compare
    from lmperf.bench import ladder
    from lmperf.report import validate
    assert "flash-triton" in [name for name, *_ in ladder.RUNGS]
    assert providers.canonical("model_attention") == {"flash_triton": "flash-triton"}
    old = {"section": "ladder", "study": "ladder", "case_id": "2.7B-rung07-flash_triton", "name": "flash_triton",
           "attention": "flash-triton", "metric": "step_ms", "unit": "ms", "median": 1.0, "status": "ok"}
    other = {**old, "case_id": "2.7B-rung06-sdpa", "name": "sdpa", "attention": "sdpa"}
    csv = tmp_path / "ladder" / "2.7B.csv"
    csv.parent.mkdir()
    pd.DataFrame([old, other]).to_csv(csv, index=False)
    promised = ["2.7B-rung06-sdpa", "2.7B-rung07-flash-triton"]
    assert validate.problem(csv, promised) is None
    assert validate.problem(csv, ["2.7B-rung06-sdpa"]) is not None  # a case it does not promise still counts
    for rows in (load_section(tmp_path, "ladder"), claims.load(tmp_path, "ladder")):
        assert list(rows["case_id"]) == ["2.7B-rung07-flash-triton", "2.7B-rung06-sdpa"]
        assert list(rows["name"]) == ["flash-triton", "sdpa"]
    # a config's case patterns in the old spelling are accepted, read in the new one
    from lmperf import planning
    config = {"ladder": {"quick": {"cases": ["2.7B-rung*-flash_triton", "2.7B-rung*-sdpa"]}},
              "repeats": {"full": {"jobs": [{"job": "ladder/2.7B", "cases": ["2.7B-rung*-flash_triton"]}]}}}
    planning.in_todays_names(config)
    assert config["ladder"]["quick"]["cases"] == ["2.7B-rung*-flash-triton", "2.7B-rung*-sdpa"]
    assert config["repeats"]["full"]["jobs"][0]["cases"] == ["2.7B-rung*-flash-triton"]
    cases = [{"case_id": c} for c in promised]
    assert jobs.select(cases, config["repeats"]["full"]["jobs"][0]["cases"]) == [cases[1]]
    # two runs: both before the rename compare as written; one on each side pair up in the new name
    before = pd.DataFrame([old, other])
    after = pd.DataFrame([{**old, "case_id": "2.7B-rung07-flash-triton", "name": "flash-triton"}, other])
    a, b = compare.in_one_spelling(before, before)
    assert a is before and b is before
    a, b = compare.in_one_spelling(before, after)
    assert set(a["case_id"]) == set(b["case_id"]) == set(promised)
