# Configuration checks and names shared by every rule file; the logic is in lmperf.workflow.
import json
import os
import re
import sys
from pathlib import Path

from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from lmperf import catalog, cluster, declare, hardware, planning, repeats as repeat_plan, specs, workflow as wf  # noqa: E402
from lmperf.bench import device  # noqa: E402
from lmperf.failures import ACCEPT_ERRORS_ENV  # noqa: E402

# The report's sections, each declared once (lmperf.declare): the built-in ones (lmperf.catalog)
# and those of the modules config `sections` names. Their jobs are the rules of rules/jobs.smk.
try:
    SECTIONS = catalog.load(config)
except ValueError as e:
    raise WorkflowError(f"lmperf: {e}") from None
# Each section's defaults (a built-in one's config/sections/<name>.yaml, another's declaration:
# lmperf.catalog.with_defaults) under what config/config.yaml, --configfile and --config set; the
# schema checks the built-in sections' keys and fills the defaults of the keys they leave out.
SCHEMA_PART = catalog.schema_part(config, SECTIONS, Path(workflow.basedir) / "config")
try:
    validate(SCHEMA_PART, "../config/schema.yaml")
except WorkflowError as e:  # --config key=value parses nested values as strings
    raise WorkflowError(f"{e}\nA nested override (e.g. models.tiny.d_model) takes a YAML file: "
                        "--configfile my.yaml, which Snakemake merges over config/config.yaml") from None
config.update(SCHEMA_PART)
planning.check_config(config)
# A user's contenders (config `contenders`) are found here, never imported (only their own
# processes import their code): one that is not there, or whose code imports packages this
# environment lacks, stops the run before any job, naming them.
from lmperf import contenders as contenders_mod  # noqa: E402
try:
    contenders_mod.check(config.get("contenders"))
except contenders_mod.ContenderError as e:
    raise WorkflowError(f"lmperf: {e}") from None

# The Slurm executor plugin reads USER (for your account): set where unset (lmperf.cluster)
cluster.ensure_user()

# A local run's jobs run side by side (snakemake --cores all): each waits for the GPU after its
# imports, a timing job until it has the GPU to itself, a check beside other checks
# (lmperf.bench.device: a lock file). A cluster job has its node's GPU to itself: no lock.
device.configure(workflow.local_exec)
# Which ready job Snakemake starts first (`priority:`; profiles/default lets 6 GPU jobs be in
# flight): the checks, which share the GPU with each other, then the jobs that compile in worker
# processes before their timed loop (the ladder, FlashAttention's bench, PyTorch attention; the
# ladder's and PyTorch attention's warm-ups, the longest, first), whose warm-ups share it too,
# then the rest. Without it the in-flight slots filled with timing jobs asleep on the lock, and
# the checks waited behind every one of them: an H100 run's first 26 minutes ran no check
# (tools/data/side_by_side_h100/at_28cbca2). The warming jobs declare one core in a local run
# (lmperf.specs.warm_threads), so that they enter beside the checks. The order changes no
# measurement: a timing job has the GPU to itself whenever it runs.
# The priorities are declared beside the jobs (lmperf.declare).
PRIORITY_CHECK = declare.PRIORITY_CHECK

HW, SCALE = wf.machine(config)
# Each rule that runs a command declares what its job asks of a cluster (CPUs, memory, wall
# time) as **cluster.job(SCALE): lmperf.cluster and docs/cluster.md say why the rules hold them.
# config `depth`: standard, or deep (the report needs the deep target's results too: rules/report.smk)
DEPTH = config["depth"]
# report/report.md, or report/quick/report.md at the quick scale (results/<hw>-quick)
REPORT = wf.report_path(SCALE)
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

# Every result CSV a full run writes here, with its job's spec (lmperf.workflow.result_files):
# each benchmark rule's output pattern is wf.output(<folder>, <rule>) (the jobs' declared
# layout), its spec wf.spec_of(RESULT_FILES, <its output>), its wildcards' values wf.wildcard(...),
# and a section's rule takes wf.paths(RESULT_FILES, <section>): the layout has one source. The
# multi-GPU section writes into results/<gpu>-x<count> (results/cpu without a GPU).
planning.check_distributed_config(config)
DIST_HW = wf.distributed_hw(config)
RESULT_FILES = tuple(wf.result_files(config, RESULTS, SCALE, [f"results/{DIST_HW}"], SECTIONS))
wf.check_cases(RESULT_FILES, SCALE)  # the quick scale's ladder rungs (config ladder.quick.cases)

# A machine without CUDA cannot measure a GPU's folder or the full grids: a dry run plans it
# with a note, a run stops before its first job (Snakemake would delete the CSVs first).
CANNOT_MEASURE = wf.cannot_measure(HW, SCALE, hardware.gpu_name())
if CANNOT_MEASURE:
    print(f"lmperf: note: {CANNOT_MEASURE}", file=sys.stderr)


onstart:
    wf.refuse_to_measure(CANNOT_MEASURE, workflow.dag.needrun_jobs(), workflow.local_exec)
    # A cluster run from a host without a GPU names the nodes' hw and scale (lmperf.cluster).
    if unknown := cluster.unknown_machine(config, hardware.gpu_name(), workflow.local_exec):
        raise RuntimeError(f"lmperf: not starting: {unknown}. No job was submitted.")
