#!/usr/bin/env bash
# The "Scaling across GPUs" study on a multi-GPU machine, without Snakemake: every job of
# the distributed section's jobs (rule distributed_study: all-reduce, data-parallel step; one torchrun per study and process
# count, grids from config/sections/distributed.yaml) into results/<gpu>-x<count>/distributed/ (e.g.
# results/h200-x2/), then the section rendered alone into report/distributed/<gpu>-x<count>/.
#   tools/distributed_gpu.sh [--scale full|smoke] [--limit SECONDS] [--wheels DIR] [--pack FILE] [--force]
# Jobs the machine has GPUs for run first; those that need more GPUs run last and write their
# `skipped` "needs N GPUs" rows (their Gloo all-reduces on the CPU are still measured). --limit
# stops the current job once the total time is spent (default 480 s): a rerun skips the CSVs that
# exist and resumes an unfinished job from its journal. --force remeasures every job.
set -uo pipefail
cd "$(dirname "$0")/.."
scale=full limit=480 wheels=.whl pack="" force=0
while (($#)); do
    case $1 in
        --scale) scale=$2; shift 2 ;;
        --limit) limit=$2; shift 2 ;;
        --wheels) wheels=$2; shift 2 ;;
        --pack) pack=$2; shift 2 ;;
        --force) force=1; shift ;;
        *) echo "distributed_gpu: unknown argument $1" >&2; exit 2 ;;
    esac
done
# pandas and pyyaml (the harness and the config; required), matplotlib and tabulate (the
# rendered section; optional): from the wheelhouse tools/wheelhouse.sh builds, where the
# machine's python3 lacks them
if ! python3 -c 'import pandas, yaml, matplotlib, tabulate' 2>/dev/null && [[ -d $wheels ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/lmperf-site "$wheels"/*.whl \
        || { echo "distributed_gpu: installing the wheelhouse failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/lmperf-site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c 'import pandas, yaml' 2>/dev/null \
    || { echo "distributed_gpu: python3 lacks pandas or pyyaml, and no wheelhouse at $wheels" >&2; exit 1; }
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# one line per job: study, processes, spec (JSON), those this machine has GPUs for first
plan=$(python3 - "$scale" <<'PY'
import sys
from lmperf import catalog, hardware, workflow
config = catalog.read_config("config/config.yaml")
config.setdefault("hw", "auto")
dist, gpus = config["distributed"][sys.argv[1]], hardware.gpu_count()
jobs = [(s, n) for s in workflow.DISTRIBUTED_STUDIES for n in dist[s]["procs"]]
jobs.sort(key=lambda job: (job[1] > max(gpus, 1), job[1]))
print(workflow.distributed_hw(config))
for study, n in jobs:
    print(f"{study}\t{n}\t{workflow.distributed_spec(config, dist, study)}")
PY
) || { echo "distributed_gpu: reading config/config.yaml and config/sections/ failed" >&2; exit 1; }
hw=$(head -1 <<<"$plan")
echo "distributed_gpu: $(nvidia-smi -L 2>/dev/null | wc -l) GPUs -> results/$hw/distributed/, scale $scale, limit $limit s"
mkdir -p "results/$hw/distributed" "logs/$hw/distributed"
start=$(date +%s) rc=0
while IFS=$'\t' read -r study procs spec; do
    out=results/$hw/distributed/${study}_n${procs}.csv log=logs/$hw/distributed/${study}_n${procs}.log
    if [[ -f $out && $force == 0 ]]; then echo "distributed_gpu: $out exists, skipped"; continue; fi
    left=$((limit - ($(date +%s) - start)))
    if ((left <= 10)); then echo "distributed_gpu: time limit reached before $out"; rc=124; break; fi
    echo "distributed_gpu: $study on $procs processes -> $out ($left s left)"
    rm -f "$out"
    timeout --signal=TERM --kill-after=30 "$left" python3 -m torch.distributed.run --standalone \
        --nproc_per_node="$procs" -m lmperf.bench.distributed "$study" --spec "$spec" --out "$out" \
        --hw "$hw" --progress-log "$log" 2>&1 | tee -a "$log.stderr"
    status=${PIPESTATUS[0]}
    if ((status != 0)); then echo "distributed_gpu: $study n=$procs exited $status (journal kept; rerun resumes)"; rc=$status; fi
done < <(tail -n +2 <<<"$plan")
echo "distributed_gpu: measured in $(( $(date +%s) - start )) s"
python3 -m lmperf.report.section distributed --results "results/$hw" --out "report/distributed/$hw/distributed.md" \
    || echo "distributed_gpu: rendering the section failed (the CSVs are kept)"
if [[ -n $pack ]]; then
    tar czf "$pack" "results/$hw" "logs/$hw" report/distributed 2>/dev/null
    echo "distributed_gpu: packed results/$hw, logs/$hw and report/distributed into $pack"
fi
exit $rc
