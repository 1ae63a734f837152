"""What can be known before a run stops it at planning, naming the key: head counts, the head
dims our FlashAttention is run at, a machine that cannot measure what the config asks for
(and then no file is touched); misuse of the API and of `--config` gets a message that says
what to do."""
import copy
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, copy_repo, snakemake
from lmperf import hardware, planning, workflow as wf
from lmperf.report import render

CONFIG = render.load_config(REPO / "config" / "config.yaml")


def edited(change) -> dict:
    config = copy.deepcopy(CONFIG)
    change(config)
    return config


def test_the_head_dims_read_from_the_attention_contract_are_its_own():
    from lmperf.kernels import attention_contract
    assert planning.attention_head_dims() == attention_contract.HEAD_DIMS


@pytest.mark.parametrize("change, message", [
    (lambda c: c["models"]["tiny"].update(n_heads=3),
     "models.tiny: n_heads = 3 does not divide d_model = 64"),
    (lambda c: c["models"]["tiny"].update(d_model=60, n_heads=4),
     "models.tiny: head dim d_model / n_heads = 15 is odd; RoPE needs an even one"),
    (lambda c: c["flash_attention"]["smoke"]["check"]["shapes"].append([2, 3, 9, 12]),
     r"flash_attention.smoke.check.shapes has shapes [[2, 3, 9, 12]] whose head dim (last entry) is not one "
     r"our FlashAttention takes head dims 8, 16, ... 256 (attention_contract.py)"),
    (lambda c: c["flash_attention"]["full"]["bench"]["groups"][0]["head_dims"].append(264),
     "flash_attention.full.bench group 'grid': head dims [264] are not ones our FlashAttention takes"),
    (lambda c: c["models"].update(odd={"d_model": 72, "d_ff": 8, "n_layers": 1, "n_heads": 6})
     or c["flash_attention"]["smoke"]["bench"]["groups"][1]["models"].append("odd"),
     "flash_attention.smoke.bench group 'model': head dims ['odd (12)'] are not ones"),
    (lambda c: c["models"].update(odd={"d_model": 72, "d_ff": 8, "n_layers": 1, "n_heads": 6})
     or c["ladder"]["smoke"]["sizes"].append("odd"),
     "ladder.smoke.sizes: the ladder runs our FlashAttention on sizes ['odd (12)']"),
])
def test_config_errors_that_would_fail_at_run_time_stop_at_planning(change, message):
    with pytest.raises(ValueError) as e:
        planning.check_config(edited(change))
    assert message in str(e.value)


def test_a_machine_without_cuda_cannot_measure_a_gpu_folder_or_the_full_grids():
    assert wf.cannot_measure("cpu", "smoke", None) is None
    assert wf.cannot_measure("h100-80gb-hbm3", "full", "NVIDIA H100 80GB HBM3") is None
    assert "names a GPU's results folder" in wf.cannot_measure("h100-80gb-hbm3", "smoke", None)
    assert "scale=full on a machine without a CUDA GPU" in wf.cannot_measure("cpu", "full", None)


def test_a_refused_full_scale_run_on_a_cpu_touches_no_committed_file(tmp_path):
    """The issue's case: `--config hw=h100-80gb-hbm3 scale=full` on a CPU clone used to delete
    results/h100-80gb-hbm3/precision/precision.csv before the benchmark refused. Now a dry run
    plans it with a note, and a run stops before its first job with every file as it was."""
    if hardware.gpu_name():
        pytest.skip("this machine has a CUDA GPU: it can measure at scale full")
    repo = copy_repo(tmp_path / "lmperf")
    shutil.copytree(REPO / "results" / "h100-80gb-hbm3", repo / "results" / "h100-80gb-hbm3")
    shutil.copytree(REPO / "report", repo / "report", dirs_exist_ok=True)
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for d in ("results", "report") for p in (repo / d).rglob("*")
              if p.is_file()}
    override = ("--config", "hw=h100-80gb-hbm3", "scale=full")
    plan = snakemake(repo, "-n", "--quiet", "rules", *override)
    assert "lmperf: note: config hw=h100-80gb-hbm3 names a GPU's results folder" in plan.stderr
    run = snakemake(repo, "--cores", "1", *override, check=False)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "lmperf: not starting: config hw=h100-80gb-hbm3" in out
    assert re.search(r"Jobs that would measure: \w+", out)
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for d in ("results", "report") for p in (repo / d).rglob("*")
             if p.is_file()}
    assert after == before
    run = snakemake(repo, "--cores", "1", "--config", "scale=full", check=False)
    assert run.returncode != 0 and "lmperf: not starting: config scale=full on a machine without a CUDA GPU" \
        in run.stdout + run.stderr
    assert not (repo / "results" / "cpu").exists()


def test_a_missing_result_is_planned_even_when_the_report_is_newer_than_every_file(tmp_path):
    """Snakemake plans no job for a missing input of a target newer than the inputs it has (a
    report rendered after its results, or a copy whose files share one time): the report rule's
    input function forces a missing result's job, as a damaged one's."""
    repo = copy_repo(tmp_path / "lmperf")
    shutil.copytree(REPO / "results" / "h100-80gb-hbm3", repo / "results" / "h100-80gb-hbm3")
    shutil.copytree(REPO / "report", repo / "report", dirs_exist_ok=True)
    (repo / "results" / "h100-80gb-hbm3" / "precision" / "precision.csv").unlink()
    for path in repo.rglob("*"):  # every file of one time, as a tarball's, and the report an hour newer
        os.utime(path, (1.7e9, 1.7e9), follow_symlinks=False)
    for path in (repo / "report" / "report.md", repo / "report" / "figures"):
        os.utime(path, (1.7e9 + 3600, 1.7e9 + 3600))
    plan = snakemake(repo, "report/report.md", "-n", "--quiet", "rules", "--config", "hw=h100-80gb-hbm3", "scale=full")
    out = plan.stdout + plan.stderr
    assert "Nothing to be done" not in out and "precision" in out and "report" in out, out[-2000:]


def test_a_nested_config_override_points_to_configfile(tmp_path):
    repo = copy_repo(tmp_path / "lmperf")
    proc = snakemake(repo, "-n", "--config", 'models={"tiny": {"d_model": 8, "d_ff": 16, "n_layers": 1, "n_heads": 2}}',
                     check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "'8' is not of type 'integer'" in out
    assert "takes a YAML file: --configfile my.yaml" in out
    (repo / "my.yaml").write_text(yaml.safe_dump({"models": {"tiny": {"d_model": 32, "d_ff": 16, "n_layers": 1,
                                                                     "n_heads": 2}}}))
    snakemake(repo, "-n", "--configfile", "my.yaml", "--config", "scale=smoke")


def test_triton_lrpe_on_cpu_tensors_without_the_interpreter_says_what_to_set():
    code = ("import torch\nfrom lmperf.kernels.lrpe import lrpe_cosine_md\n"
            "x, theta = torch.randn(1, 2, 5, 8), torch.rand(2, 8)\n"
            "assert lrpe_cosine_md(x, theta, [5], impl='torch').shape == (1, 2, 5, 16)\n"
            "lrpe_cosine_md(x, theta, [5], impl='triton')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert ("RuntimeError: impl='triton' runs Triton kernels, which need CUDA tensors; x is on cpu. "
            "On a CPU, set TRITON_INTERPRET=1") in proc.stderr


def test_flashattention_groups_of_one_name_at_one_head_dim_are_one_job():
    from lmperf import specs
    grid = {"name": "grid", "dtypes": ["bf16"], "head_dims": [16, 64]}
    fa = {"bench": {"groups": [grid, {**grid, "dtypes": ["fp32"], "head_dims": [64]},
                               {"name": "model", "models": ["small"]}]}}
    jobs = specs.fa_bench_jobs(fa, {"small": {"d_model": 768, "n_heads": 12}})
    assert [(g["dtypes"], g["head_dims"]) for g in jobs["grid_d64"]["groups"]] == [(["bf16"], [64]), (["fp32"], [64])]
    assert [(g["dtypes"], g["head_dims"]) for g in jobs["grid_d16"]["groups"]] == [(["bf16"], [16])]
    assert jobs["model"]["groups"][0]["models"] == {"small": {"d_model": 768, "n_heads": 12}}


def test_flashattention_groups_that_name_their_job_run_in_it_at_every_head_dim():
    from lmperf import specs
    gqa = {"name": "gqa", "job": "gqa", "dtypes": ["bf16"], "heads": 32, "kv_heads": 8, "head_dims": [128]}
    fa = {"bench": {"groups": [gqa, {**gqa, "heads": 16, "kv_heads": 4, "head_dims": [64, 32]},
                               {**gqa, "job": None, "head_dims": [16]}]}}
    jobs = specs.fa_bench_jobs(fa, {})
    assert sorted(jobs) == ["gqa", "gqa_d16"]
    assert [(g["heads"], g["head_dims"]) for g in jobs["gqa"]["groups"]] == [(32, [128]), (16, [64]), (16, [32])]
    # where a group runs is not part of what it measures: the job's spec is the same without it
    assert all("job" not in g for spec in jobs.values() for g in spec["groups"])
