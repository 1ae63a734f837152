# Configuration checks and helpers shared by every rule file. Nothing here imports torch, so
# planning (and `snakemake -n`) stays fast.
import json
import re
import sys
from pathlib import Path

from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from lmperf import hardware  # noqa: E402

validate(config, "../config/schema.yaml")


def _check_config():
    for scale, e2e in config["e2e"].items():
        for study, spec in e2e["studies"].items():
            unknown = [s for s in spec["sizes"] if s not in config["models"]]
            if unknown:
                raise ValueError(f"config: e2e.{scale}.studies.{study}.sizes names {unknown}, "
                                 f"which are not under models: {sorted(config['models'])}")


_check_config()

GPU_NAME = hardware.gpu_name()
HW = hardware.hw_slug(GPU_NAME) if config["hw"] == "auto" else config["hw"]
SCALE = config["scale"] if config["scale"] != "auto" else ("full" if GPU_NAME else "smoke")
VERSIONS = hardware.library_versions()
RESULTS = f"results/{HW}"
LOGS = f"logs/{HW}"


def _python():
    """The interpreter rules run: the one running Snakemake (so a venv need not be activated),
    or the conda env's `python` under --sdm conda."""
    try:
        from snakemake.settings.types import DeploymentMethod

        if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
            return "python"
    except (ImportError, AttributeError):
        pass
    return sys.executable


PYTHON = _python()


# Every benchmark rule takes these params: a new hardware or library version reruns it.
def provenance_params():
    return {"hw": HW, "torch": VERSIONS["torch"], "triton": VERSIONS["triton"]}


PROVENANCE_ARGS = ("--hw {params.hw} --log {log} "
                   "--expect-torch {params.torch} --expect-triton {params.triton}")


# Package modules every benchmark imports.
HARNESS = ["src/lmperf/bench/common.py", "src/lmperf/hardware.py"]
