# Configuration checks and names shared by every rule file; the logic is in lmperf.workflow.
import json
import re
import sys
from pathlib import Path

from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from lmperf import hardware, workflow as wf  # noqa: E402

try:
    validate(config, "../config/schema.yaml")
except WorkflowError as e:  # --config key=value parses nested values as strings
    raise WorkflowError(f"{e}\nA nested override (e.g. models.tiny.d_model) takes a YAML file: "
                        "--configfile my.yaml, which Snakemake merges over config/config.yaml") from None
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

# A machine without CUDA cannot measure a GPU's folder or the full grids: a dry run plans it
# with a note, a run stops before its first job (Snakemake would delete the CSVs first).
CANNOT_MEASURE = wf.cannot_measure(HW, SCALE, hardware.gpu_name())
if CANNOT_MEASURE:
    print(f"lmperf: note: {CANNOT_MEASURE}", file=sys.stderr)


onstart:
    wf.refuse_to_measure(CANNOT_MEASURE, workflow.dag.needrun_jobs(), workflow.local_exec)
