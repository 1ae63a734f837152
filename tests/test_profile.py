import pandas as pd
import pytest

from lmperf.bench import profile
from lmperf.report import profile as profile_report
from lmperf.report.sections import Inputs


def profile_view(df):
    return profile_report.view(Inputs(results=None, frames={"profile": df}, bars={}, out_dir=None))

SPEC = {"cases": [{"size": "tiny", "context": 32}], "dtypes": ["fp32"], "batch_size": 2, "warmup": 1,
        "profiled_steps": 1, "models": {"tiny": {"d_model": 32, "d_ff": 64, "n_layers": 2, "n_heads": 2}}}


@pytest.mark.parametrize("name, category", [
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", "matmul"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("aten::mm", "matmul"), ("aten::bmm", "matmul"), ("aten::addmm", "matmul"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "softmax"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
    ("aten::mul", "other"), ("aten::mmax", "other"),
])
def test_kernel_categories(name, category):
    assert profile.category(name) == category


@pytest.fixture(scope="module")
def rows():
    case = profile.cases(SPEC)[0]
    data = [{**case, **r, "gpu": "none"} for r in profile.measure(case, SPEC["models"])]
    return pd.DataFrame(data)


def test_every_phase_is_profiled_and_its_shares_sum_to_one(rows):
    kernels = rows[rows["metric"] == "kernel_us_per_step"]
    assert set(kernels["phase"]) == {"forward", "backward", "optimizer"}
    for phase, g in kernels.groupby("phase"):
        assert g["share"].sum() == pytest.approx(1.0)
    fwd = kernels[kernels["phase"] == "forward"]
    assert (fwd["category"] == "matmul").any() and (fwd["category"] == "softmax").any()
    # The optimizer phase runs AdamW: no matrix multiplies.
    assert not (kernels[kernels["phase"] == "optimizer"]["category"] == "matmul").any()


def test_attention_parts_are_timed_with_their_flops(rows):
    parts = rows[rows["metric"] == "attention_part_us_per_step"].set_index("kernel")
    assert set(parts.index) == set(profile.ATTENTION_PARTS)
    # scores and values: 2 * B * N^2 * d per layer each, over 2 layers
    assert parts.loc["attention.scores", "flops"] == 2 * 2 * 32 * 32 * 32 * 2
    assert (parts["mean"] > 0).all()


def test_profile_view_renders_shares_and_top_kernels(rows):
    df = rows.assign(status="ok", profiled_steps=1, case_id=rows["case_id"])
    view = profile_view(df)
    case = view["cases"][0]
    shares = case["shares"].set_index("phase")
    assert list(shares.index) == ["forward", "backward", "optimizer"]
    assert shares.filter(like="share").sum(axis=1).tolist() == pytest.approx([100.0] * 3)
    assert [t["phase"] for t in case["tops"]] == ["forward", "backward", "optimizer"]
    assert "attention.scores" in set(case["attention"]["part"])


class _Event:
    def __init__(self, key, device_type, device_us, cpu_us=0.0):
        self.key, self.device_type = key, device_type
        self.device_time_total, self.cpu_time_total = device_us, cpu_us


class _Prof:
    def __init__(self, events):
        self.events = events

    def key_averages(self):
        return self.events


def test_gpu_range_time_counts_the_cpu_side_range_once():
    # On a GPU the profiler lists a record_function range twice: the CPU-side range (device
    # time = its kernels) and a device-side annotation spanning them.
    prof = _Prof([_Event("attention.scores", "DeviceType.CPU", 30.0, 5.0),
                  _Event("attention.scores", "DeviceType.CUDA", 34.0),
                  _Event("aten::bmm", "DeviceType.CPU", 30.0, 4.0)])
    assert profile.range_times(prof, cuda=True) == {"attention.scores": 30.0}
    assert profile.range_times(prof, cuda=False) == {"attention.scores": 5.0}

