"""A contender's distributed adapters, both handout years (bench/contender_distributed.py): the 2025
DDPs with the bucketed one's batch-start hook, buckets smaller than the model, and an FSDP checked
on the course's model kind, per compute dtype, for sharding. Fixtures of our own that behave like
students' code: tests/fixtures/contenders_dist/."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lmperf.bench import contender_distributed as cd

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "contenders_dist"


def _check(spec: dict, out: Path) -> pd.DataFrame:
    """The distributed check job as the workflow runs it (each case in a process of its own): one
    row a case, by case id."""
    proc = subprocess.run([sys.executable, "-m", "lmperf.bench.contenders", "distributed", "--spec", json.dumps(spec),
                           "--out", str(out), "--hw", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_csv(out).set_index("case_id")


def _passed(row) -> bool:
    return row["status"] == "ok" and str(row["passed"]).lower() == "true"


# ---------------------------------------------------------------------------------------------
# Cases: both years' contracts, the bucketed DDP per bucket size, FSDP per compute dtype


def test_every_contract_of_both_years_is_a_case_and_buckets_include_sizes_below_the_model():
    from lmperf import contenders
    from lmperf.bench.contenders import distributed_cases
    cases = distributed_cases({"contenders": {"mine": "x.py"}})
    assert {c["contract"] for c in cases} == set(contenders.DISTRIBUTED)
    bucketed = [c for c in cases if c["contract"] == "ddp_bucketed"]
    assert [c["case_id"] for c in bucketed] == [f"mine-ddp_bucketed-b{mb:g}-gloo" for mb in cd.BUCKETS_MB]
    model_mb = sum(p.numel() * p.element_size() for p in cd.toy_model().parameters()) / 2**20
    sizes = [c["bucket_size_mb"] for c in bucketed]
    assert min(sizes) < model_mb / 4 and any(s < model_mb < 2 * s for s in sizes) and max(sizes) > model_mb
    fsdp = {c["case_id"]: c["compute_dtype"] for c in cases if c["contract"] == "fsdp"}
    assert fsdp == {"mine-fsdp-gloo": "fp32", "mine-fsdp-fp16-gloo": "fp16"}
    assert len({c["case_id"] for c in cases}) == len(cases)
    only = distributed_cases({"contenders": {"mine": "x.py"}, "contracts": ["fsdp"], "fsdp_dtypes": ["fp16"]})
    assert [c["case_id"] for c in only] == ["mine-fsdp-fp16-gloo"]


def test_the_timed_study_runs_a_bucketed_contender_at_ddps_default_bucket():
    from lmperf.bench.distributed import ddp
    spec = {"contenders": {"mine": "x.py"}, "variants": ["ddp"], "bucket_caps_mb": [25, 100], "sizes": ["tiny"],
            "batch_per_gpu": 1, "context": 16, "memory_context": 8, "dtype": "fp32", "warmup": 1, "timed_steps": 1,
            "profiled_steps": 0}
    caps = {c["case_id"]: c["bucket_cap_mb"] for c in ddp.cases(spec, 2)}
    assert caps["tiny-mine-ddp_bucketed-b25-n2"] == ddp.CONTENDER_BUCKET_MB == 25
    assert caps["tiny-mine-ddp_individual_parameters-n2"] is None
    assert "tiny-mine-ddp_bucketed-b25-ctx8-n2" in caps  # its memory too, beside DDP's


HOOKED = '''
import torch
CALLS = []

class Wrapper(torch.nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module, self.bucket_size_mb = module, bucket_size_mb
    def forward(self, x):
        CALLS.append("forward")
        return self.module(x)

def get_ddp_bucketed(module, bucket_size_mb):
    CALLS.append(("built", bucket_size_mb))
    return Wrapper(module, bucket_size_mb)

def ddp_bucketed_on_after_backward(ddp_model, optimizer):
    CALLS.append("after")

def ddp_bucketed_on_train_batch_start(ddp_model, optimizer):
    CALLS.append("start")
'''


def test_the_timed_step_calls_the_batch_start_hook_once_a_step_before_its_forward(tmp_path):
    """bench/distributed/ddp.py's contender build: the hook first in every step, however many
    micro-batches; the after-backward hook as the step's reduce; the bucket size passed."""
    import contextlib

    import torch

    from lmperf import train
    from lmperf.bench.distributed import ddp
    (tmp_path / "hooked.py").write_text(HOOKED)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    wrapped, opt, reduce = ddp.contender_build(("hooked", str(tmp_path / "hooked.py"), "ddp_bucketed"), model, 1,
                                                "foreach", 25)
    tokens = torch.randint(11, (4, 5))
    for _ in range(2):
        train.step(wrapped, opt, tokens[:, :-1], tokens[:, 1:], contextlib.nullcontext(), micro_batches=2,
                   reduce=reduce)
    calls = next(m for name, m in sys.modules.items() if name.startswith("lmperf_contender_hooked")).CALLS
    assert calls == [("built", 25)] + ["start", "forward", "forward", "after"] * 2


def test_weights_are_compared_by_the_courses_rule_and_nan_is_wrong():
    import numpy as np
    import torch

    from lmperf import contenders
    reference = {"w": torch.tensor([1.0, -2.0])}
    rank = lambda *w: {"weights": {"module.w": np.array(w, dtype=np.float32)}}
    atol, rtol = cd.FSDP_TOLERANCE["fp32"]
    worst, tolerance, ok = cd.compare_weights(reference, {0: rank(1.0, -2.0 - 1e-4), 1: rank(1.0, -2.0)}, atol, rtol)
    assert ok and worst == pytest.approx(1e-4, rel=1e-2) and tolerance == pytest.approx(atol + rtol * 2)
    assert not cd.compare_weights(reference, {0: rank(1.0, -2.0 - 3e-4)}, atol, rtol)[2]
    with pytest.raises(contenders.Wrong, match="NaN"):
        cd.compare_weights(reference, {0: rank(float("nan"), -2.0)}, atol, rtol)


# ---------------------------------------------------------------------------------------------
# Sharding: what a rank holds against its share


def _rank(held_kib: float, whole_kib: float = 64.0, replicated_kib: float = 1.0) -> dict:
    return {"held_bytes": (held_kib + replicated_kib) * 1024, "whole_bytes": whole_kib * 1024,
            "replicated_bytes": replicated_kib * 1024}


@pytest.mark.parametrize("held, sharded, words", [
    (32.0, True, "(1.00x)"),
    (32.0 * cd.SHARD_TOLERANCE, True, f"({cd.SHARD_TOLERANCE:.2f}x)"),
    (32.0 * cd.SHARD_TOLERANCE + 1, False, "holds more than its share"),
    (64.0, False, "keeps full copies"),
])
def test_a_rank_may_hold_its_share_of_the_sharded_weights_within_the_tolerance(held, sharded, words):
    ok, message = cd.sharding_verdict({0: _rank(32.0), 1: _rank(held)}, world=2)
    assert ok is sharded and words in message, message


def test_held_bytes_count_a_shard_that_keeps_its_whole_storage_and_tensors_in_closures():
    import torch
    before = cd.live_storages()
    full = torch.zeros(1000)
    view = full[:500]  # a "shard" that is a view keeps all 1,000
    del full
    hidden = (lambda t: (lambda: t))(torch.zeros(250))  # a tensor only a closure holds
    assert cd.held_since(before) == (1000 + 250) * 4
    del view, hidden


# ---------------------------------------------------------------------------------------------
# The 2025 names: the individual-parameters DDP and the bucketed DDP with its batch-start hook


@pytest.fixture(scope="module")
def ddp_rows(tmp_path_factory):
    spec = {"contenders": {"h2025": str(FIXTURES / "handout2025.py"),
                           "lastdrop": str(FIXTURES / "forgets_last_bucket.py")},
            "contracts": ["ddp", "ddp_individual_parameters", "ddp_bucketed", "sharded_optimizer"],
            "procs": 2, "steps": 3, "time_limit_s": 300}
    return _check(spec, tmp_path_factory.mktemp("ddp") / "distributed.csv")


@pytest.mark.slow
def test_the_2025_ddps_train_to_one_process_weights(ddp_rows):
    cases = ["h2025-ddp_individual_parameters-gloo"] + [f"h2025-ddp_bucketed-b{mb:g}-gloo" for mb in cd.BUCKETS_MB]
    for case in cases:
        assert _passed(ddp_rows.loc[case]), ddp_rows.loc[case].to_dict()
        assert ddp_rows.loc[case, "median"] <= cd.TOLERANCE
    # its buckets reset only in its batch-start hook: passing at every size says the hook ran each step
    assert "ddp_bucketed_on_train_batch_start called" in ddp_rows.loc["h2025-ddp_bucketed-b0.0001-gloo", "message"]
    # the 2026 names it does not define, and the adapter it leaves raising, are not implemented
    assert ddp_rows.loc["h2025-ddp-gloo", "status"] == "skipped"
    assert "raised NotImplementedError" in ddp_rows.loc["h2025-sharded_optimizer-gloo", "message"]


@pytest.mark.slow
def test_a_bucketed_ddp_that_drops_its_last_partial_bucket_is_caught_only_by_small_buckets(ddp_rows):
    rows = {mb: ddp_rows.loc[f"lastdrop-ddp_bucketed-b{mb:g}-gloo"] for mb in cd.BUCKETS_MB}
    assert _passed(rows[max(cd.BUCKETS_MB)])  # one bucket holds the model: nothing is dropped
    for mb in sorted(cd.BUCKETS_MB)[:-1]:
        assert rows[mb]["status"] == "ok" and not _passed(rows[mb]), rows[mb].to_dict()
        assert rows[mb]["median"] > 100 * cd.TOLERANCE


# ---------------------------------------------------------------------------------------------
# FSDP: the course's model kind, SGD, the course's tolerance per compute dtype, sharding


@pytest.fixture(scope="module")
def fsdp_rows(tmp_path_factory):
    spec = {"contenders": {"course": str(FIXTURES / "course_repo" / "adapters.py"),
                           "copies": str(FIXTURES / "course_repo" / "full_copies.py"),
                           "torchkinds": str(FIXTURES / "torch_kinds_fsdp.py")},
            "contracts": ["fsdp"], "procs": 2, "steps": 3, "time_limit_s": 300}
    return _check(spec, tmp_path_factory.mktemp("fsdp") / "distributed.csv")


@pytest.mark.slow
def test_a_sharding_fsdp_passes_on_the_repositorys_transformer(fsdp_rows):
    row = fsdp_rows.loc["course-fsdp-gloo"]
    assert _passed(row), row.to_dict()
    assert "cs336_basics.model.BasicsTransformerLM (the contender's)" in row["message"]
    assert "SGD" in row["message"] and "(1.00x)" in row["message"]
    atol, rtol = cd.FSDP_TOLERANCE["fp32"]
    assert atol <= row["tolerance"] <= atol + rtol  # the course's fp32 rule at the deciding weight


@pytest.mark.slow
def test_an_fsdp_computing_in_fp16_is_judged_by_the_courses_fp16_tolerance(fsdp_rows):
    fp16, fp32 = fsdp_rows.loc["course-fsdp-fp16-gloo"], fsdp_rows.loc["course-fsdp-gloo"]
    assert _passed(fp16), fp16.to_dict()
    assert "compute_dtype float16 (logits in float16)" in fp16["message"]
    assert "the course test's model of cs336_basics.model's Embedding, RMSNorm and Linear" in fp16["message"]
    assert "compute_dtype None (logits in float32)" in fp32["message"]
    # fp16 rounding shows (more than fp32's, above the fp32 check's 1e-5 for AdamW), within its own tolerance
    assert fp16["median"] > 10 * fp32["median"] and fp16["tolerance"] >= cd.FSDP_TOLERANCE["fp16"][0]


@pytest.mark.slow
def test_an_fsdp_that_keeps_full_copies_is_reported_not_passed(fsdp_rows):
    for case in ("copies-fsdp-gloo", "copies-fsdp-fp16-gloo"):
        row = fsdp_rows.loc[case]
        assert row["status"] == "wrong" and not _passed(row), row.to_dict()
        assert row["message"].startswith("keeps full copies") and "(2.00x)" in row["message"]
        assert "within tolerance" in row["message"]  # its weights are right: sharding is what fails


@pytest.mark.slow
def test_without_cs336_basics_the_fsdp_trains_lmperfs_transformer_of_the_same_kinds(fsdp_rows):
    for case in ("torchkinds-fsdp-gloo", "torchkinds-fsdp-fp16-gloo"):
        row = fsdp_rows.loc[case]
        assert _passed(row), row.to_dict()
        assert "lmperf's Transformer" in row["message"] and "(1.00x)" in row["message"]
