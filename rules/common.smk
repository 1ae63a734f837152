# Configuration checks and names shared by every rule file; the logic is in lmperf.workflow.
import json
import os
import re
import sys
from pathlib import Path

from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from lmperf import hardware, workflow as wf  # noqa: E402
from lmperf.bench.failures import ACCEPT_ERRORS_ENV  # noqa: E402

validate(config, "../config/schema.yaml")
wf.check_config(config)

HW, SCALE = wf.machine(config)
VERSIONS = hardware.library_versions()
RESULTS = f"results/{HW}"
LOGS = f"logs/{HW}"
# Every benchmark rule passes these as params: a new hardware or library version reruns it.
# Its code inputs are wf.code_inputs(<its command's module>): every lmperf module it can import.
PROVENANCE = {"hw": HW, "torch": VERSIONS["torch"], "triton": VERSIONS["triton"]}
# config accept_errors: the case ids whose `error` rows do not fail their job. It reaches the
# benchmarks through the environment, not params: it decides a job's exit status, not what it
# measures, so changing it reruns nothing (a failed job reruns anyway: it has no outputs).
os.environ[ACCEPT_ERRORS_ENV] = json.dumps(config["accept_errors"])

