"""The registry of providers (lmperf.providers): each name declared once, the config checked
against it, and a provider added in a module of its own reaching the CSVs and the report with no
other file touched."""
import ast
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from lmperf import contenders, planning, providers, workflow as wf
from conftest import config_yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = config_yaml()


@pytest.fixture
def registry(monkeypatch):
    """The registry as it was, back after the test (a test that loads a module adds to it); no
    modules or contenders passed to the test's jobs. What an earlier test in this process
    registered is still in the registry: a test reads what it adds against `sources()` before."""
    monkeypatch.delenv(providers.ENV, raising=False)
    monkeypatch.delenv(contenders.ENV, raising=False)
    with providers.kept():
        yield providers


def provider_lists(tree: ast.AST, names: set[str]) -> list[tuple[int, list[str]]]:
    """(line, names) of every list, tuple, set or dict literal in `tree` that holds two or more
    provider names as strings: a list of providers kept somewhere else than the registry."""
    found = []
    for node in ast.walk(tree):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)) and items:
            spelled = [i.value for i in items if isinstance(i, ast.Constant) and i.value in names]
            if len(set(spelled)) >= 2:
                found.append((node.lineno, spelled))
    return found


def test_each_provider_is_declared_once_and_listed_nowhere_else():
    """Each provider's name is declared in one place, src/lmperf/providers.py (the attention's,
    LRPE-cosine's and the model's attention's, each under its contract): no other module, of the
    bench, the workflow, planning or the report, keeps a list of the attention's, and neither the
    schema nor a rule spells them. (config/config.yaml names the providers each grid runs: that is
    the grid, as data. The report reads ours, the peers of record and their short names from the
    registry.)"""
    names = set(providers.names("attention", "ours")) | set(providers.names("attention", "peer"))
    declared = {}
    for path in sorted((REPO / "src").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Provider" and len(node.args) > 3:
                first, contract = node.args[0], node.args[3]
                if isinstance(first, ast.Constant) and isinstance(contract, ast.Constant):
                    declared.setdefault((contract.value, first.value), []).append(str(path.relative_to(REPO)))
        if path.name != "providers.py":
            assert not provider_lists(tree, names), f"{path.relative_to(REPO)} keeps a list of providers"
    every = {(c, n) for c in providers.CONTRACTS for n in providers.names(c) if providers.get(n, c).source is None}
    assert {key: where for key, where in declared.items() if key in every} == \
        {key: ["src/lmperf/providers.py"] for key in every}
    assert {"lrpe", "model_attention"} <= {c for c, _ in every}  # LRPE's and the model's attention's too
    for path in [REPO / "config" / "schema.yaml", REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]:
        for i, line in enumerate(path.read_text().splitlines()):
            for items in re.findall(r"\[([^\[\]]*)\]", line.split("#")[0]):
                spelled = {x.strip(" '\"") for x in items.split(",")} & names
                assert len(spelled) < 2, f"{path.relative_to(REPO)}:{i + 1} lists providers {sorted(spelled)}"


def test_the_report_and_readme_take_peers_and_labels_from_the_registry(registry):
    from lmperf.report import flash_attention, readme
    assert flash_attention.peers() == registry.names("attention", role="peer") + \
        registry.names("attention", role="contender")
    assert flash_attention.OURS == registry.names("attention", role="ours")
    assert readme.FA_OURS in registry.names("attention", role="ours")
    peers = readme.fa_peers()
    assert peers and peers == {p: registry.labels("attention")[p] for p in peers}
    assert set(peers) <= set(registry.names("attention", role="peer"))


def test_an_unknown_provider_stops_planning_naming_it_and_the_known_ones():
    config = copy.deepcopy(CONFIG)
    config["flash_attention"]["smoke"]["bench"]["groups"][0]["providers"].append("sdpa_flashh")
    with pytest.raises(ValueError, match=r"flash_attention\.smoke\.bench group 'headline' providers names "
                                         r"\['sdpa_flashh'\].*known: triton_compiled, triton, sdpa_flash"):
        planning.check_config(config)
    config = copy.deepcopy(CONFIG)
    config["flash_attention"]["full"]["check"]["impls"] = ["torch"]
    with pytest.raises(ValueError, match=r"flash_attention\.full\.check\.impls names \['torch'\]"):
        planning.check_config(config)


def test_a_module_that_does_not_import_is_named(registry, tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import no_such_package_here\n")
    with pytest.raises(ValueError, match=r"provider module '.*broken\.py' does not import: ModuleNotFoundError"):
        planning.check_config({**copy.deepcopy(CONFIG), "provider_modules": [str(bad)]})
    with pytest.raises(ValueError, match="no file"):
        registry.load([str(tmp_path / "missing.py")])


def test_needs_become_rows_that_name_them(registry):
    from lmperf.failures import NotRun, Unsupported
    case = {"provider": "sdpa_flash", "dtype": "fp32", "causal": True, "heads": 2, "kv_heads": 2, "seq_len": 8,
            "head_dim": 8}
    with pytest.raises(Unsupported, match="sdpa_flash: fp16/bf16 only"):
        registry.get("sdpa_flash").make(case)
    registry.register(registry.Provider("no_gqa", "no GQA", "peer", "attention", registry.get("plain").build,
                                        gqa=False, needs=("cuda",) if not _cuda() else ()))
    with pytest.raises(NotRun if not _cuda() else Unsupported):
        registry.get("no_gqa").make({**case, "kv_heads": 1})
    with pytest.raises(ValueError, match="declared twice"):
        registry.register(registry.Provider("plain", "again", "peer", "attention", registry.get("plain").build))
    with pytest.raises(KeyError, match="unknown attention provider 'nope'; known: triton_compiled"):
        registry.get("nope")


def test_a_results_row_gets_one_id_whether_or_not_its_provider_is_registered_here(registry):
    """A contender's row read back from its results, in the id scheme before the harness a
    provider is timed under was named, keeps its id both in a process that never saw the
    contender and in one that registered it (a render of its report): a comparison page does not
    depend on what ran before it in the process. Ours is renamed in both."""
    rows = pd.DataFrame([{"case_id": "model-theirs_pytorch-bf16-causal-b4h12n2048d64", "group": "model",
                          "provider": "theirs_pytorch", "harness": "leaderboard", "dtype": "bf16", "causal": True,
                          "batch": 4, "heads": 12, "kv_heads": 12, "seq_len": 2048, "head_dim": 64},
                         {"case_id": "model-sdpa_cudnn-bf16-causal-b4h12n2048d64", "group": "model",
                          "provider": "sdpa_cudnn", "harness": "leaderboard", "dtype": "bf16", "causal": True,
                          "batch": 4, "heads": 12, "kv_heads": 12, "seq_len": 2048, "head_dim": 64}])
    unseen = list(registry.attention_case_ids(rows)["case_id"])
    registry.register(registry.Provider("theirs_pytorch", "theirs", "contender", "attention",
                                        registry.get("plain").build))
    assert list(registry.attention_case_ids(rows)["case_id"]) == unseen == [
        "model-theirs_pytorch-bf16-causal-b4h12n2048d64", "model-sdpa_cudnn-leaderboard-bf16-causal-b4h12n2048d64"]


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


# A provider declared in a module of its own: our tiled PyTorch FlashAttention under another name.
MODULE = '''
import contextlib

from lmperf.providers import Provider, register


def build(case):
    from lmperf.kernels.flash_attention_torch import FlashAttention2PyTorch
    causal = case["causal"]
    return (lambda q, k, v: FlashAttention2PyTorch.apply(q, k, v, causal)), contextlib.nullcontext


register(Provider("mine_tiled", "Mine, tiled", "peer", "attention", build))
'''


def run_job(repo_src: Path, study: str, spec: str, out: Path, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(repo_src), "TRITON_INTERPRET": "1"}
    env.pop(providers.ENV, None)
    env.pop(contenders.ENV, None)
    proc = subprocess.run([sys.executable, "-m", "lmperf.bench.flash_attention", study, "--spec", spec,
                           "--out", str(out), "--hw", "cpu"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def gpu_like(bench: pd.DataFrame) -> pd.DataFrame:
    """The job's rows as a GPU run writes them (a CPU cannot time them): each case's forward,
    backward and forward+backward ms, status ok. The numbers are made up; the cases, providers
    and every other column are the job's own."""
    rows = []
    for i, (_, row) in enumerate(bench.drop_duplicates("case_id").iterrows()):
        for k, direction in enumerate(("forward", "backward", "fwd_bwd")):
            rows.append({**row.to_dict(), "metric": f"{direction}_ms", "unit": "ms", "median": 1.0 + i + k,
                         "status": "ok", "message": ""})
    return pd.DataFrame(rows)


def test_a_provider_in_a_module_of_its_own_reaches_the_csvs_and_the_report(registry, tmp_path):
    """The module is named in the config (`provider_modules`) and its provider in the grids, as a
    user's --configfile would: planning accepts it, the check job (CPU, Triton's interpreter)
    checks it against float64, the bench job writes its rows (needs CUDA here), and the rendered
    report shows it in the correctness section and, from rows as a GPU writes them, in the
    FlashAttention-2 tables and the README's columns."""
    from lmperf.report import readme, render

    module = tmp_path / "mine.py"
    module.write_text(MODULE)
    config = render.load_config(REPO / "config" / "config.yaml")  # validated, defaults filled
    config["provider_modules"] = [str(module)]
    fa = config["flash_attention"]["smoke"]
    fa["check"].update(impls=["mine_tiled"], dtypes=["fp32"], shapes=[[1, 2, 17, 16]], grouped_shapes=[[1, 4, 2, 9, 16]])
    fa["check"].pop("compiled_shapes")
    for group in fa["bench"]["groups"]:
        group["providers"].append("mine_tiled")
    before = set(registry.sources())  # what an earlier test in this process registered
    planning.check_config(config)
    assert registry.get("mine_tiled").source == str(module)
    assert set(wf.provider_inputs(config)) - before == {str(module)}

    results = tmp_path / "results" / "cpu"
    files = {(f.study, Path(f.path).stem): f for f in wf.result_files(config, str(results), "smoke", [str(results)])
             if f.section == "flash_attention"}
    check, bench = files["check", "check"], files["bench", "headline_d64"]
    assert json.loads(check.spec)["provider_modules"] == [str(module)]
    run_job(REPO / "src", "check", check.spec, Path(check.path), tmp_path)
    run_job(REPO / "src", "bench", bench.spec, Path(bench.path), tmp_path)

    rows = pd.read_csv(check.path)
    assert set(rows["impl"]) == {"mine_tiled"} and rows["passed"].all() and (rows["status"] == "ok").all()
    assert sorted(rows["case_id"].unique()) == sorted(check.case_ids())
    timed = pd.read_csv(bench.path)
    mine = timed[timed["provider"] == "mine_tiled"]
    assert len(mine) == 1 and mine["status"].iloc[0] == "skipped" and mine["message"].iloc[0] == "needs CUDA"

    bars = render.bars_from_config(REPO / "config" / "config.yaml")
    promised = render.promised_files(config, results, "smoke", [str(results)])
    text = render.render(results, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "smoke", bars, promised)
    correctness = text.split("## Correctness")[1].split("\n## ")[0]
    assert "flash_attention / mine_tiled" in correctness

    gpu_like(timed).to_csv(bench.path, index=False)
    text = render.render(results, REPO / "templates", tmp_path / "r.md", tmp_path / "fig", "smoke", bars, promised)
    section = text.split("## FlashAttention-2")[1].split("\n## ")[0]
    assert "| mine_tiled " in section and "over mine_tiled" in section  # our speed-up over it
    rows = readme.flash_attention_rows(gpu_like(pd.read_csv(bench.path)).assign(harness="eager"), 10.0)
    assert any(r["claim"].peer is not None for r in rows)
    assert rows and readme.fa_peers().get("mine_tiled") == "Mine, tiled"  # a peer the README's table weighs


def test_the_workflow_plans_a_provider_module_as_an_input_of_the_jobs_that_run_it(tmp_path):
    """`--config provider_modules=<file>` and a --configfile that names its provider: the
    FlashAttention-2 jobs get the file as an input (an edit to it reruns them) and the module in
    their spec; a grid naming a provider no module declares stops planning, naming it."""
    from conftest import SMOKE, copy_repo, snakemake
    repo = copy_repo(tmp_path / "lmperf")
    (repo / "mine.py").write_text(MODULE)
    (repo / "mine.yaml").write_text(yaml.safe_dump({"flash_attention": {"smoke": {"check": {
        "impls": ["triton", "mine_tiled"]}}}}))
    args = ("-n", "--cores", "1", f"results/cpu/{wf.LAYOUT['flash_attention_check']}", *SMOKE,
            "provider_modules=mine.py", "--configfile", "mine.yaml")
    out = repo / "results" / "cpu" / wf.LAYOUT["flash_attention_check"]
    out.parent.mkdir(parents=True)
    out.write_text("section\n")  # a result older than the module, newer than the rest
    later = out.stat().st_mtime + 60
    os.utime(repo / "mine.py", (later, later))
    assert "reason: Updated input files: mine.py" in snakemake(repo, *args).stdout
    out.unlink()
    plan = snakemake(repo, *args, "--printshellcmds").stdout
    assert '"provider_modules": ["mine.py"]' in plan and '"impls": ["triton", "mine_tiled"]' in plan
    failed = snakemake(repo, *args[:-3], "--configfile", "mine.yaml", check=False)
    assert failed.returncode != 0
    assert "check.impls names ['mine_tiled'], which are not attention providers" in failed.stdout + failed.stderr


def test_a_compiled_provider_builds_first_thing_in_a_fresh_process():
    """plain_compiled's build turns off donated buffers through torch._functorch.config, which
    `import torch` alone does not import: a process whose first act is that build gets the provider,
    not an AttributeError."""
    code = "from lmperf import providers; providers.get('plain_compiled').build({'causal': True}); print('built')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "built" in proc.stdout, proc.stderr[-2000:]
