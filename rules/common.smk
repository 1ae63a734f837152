# Configuration checks and names shared by every rule file; the logic is in lmperf.workflow.
import json
import re
import sys
from pathlib import Path

from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from lmperf import hardware, workflow as wf  # noqa: E402

validate(config, "../config/schema.yaml")
wf.check_config(config)

HW, SCALE = wf.machine(config)
VERSIONS = hardware.library_versions()
RESULTS = f"results/{HW}"
LOGS = f"logs/{HW}"
# Every benchmark rule passes these as params: a new hardware or library version reruns it.
PROVENANCE = {"hw": HW, "torch": VERSIONS["torch"], "triton": VERSIONS["triton"]}
# Package modules every benchmark imports.
HARNESS = ["src/lmperf/bench/common.py", "src/lmperf/bench/timing.py", "src/lmperf/hardware.py"]
# The training step every model benchmark runs (lmperf.train), with the model and the named ranges.
TRAIN_STEP = ["src/lmperf/model.py", "src/lmperf/ranges.py", "src/lmperf/train.py"]

