#!/usr/bin/env bash
# Run Snakemake targets one after another, in the order given, inside one time budget:
#   tools/gpu_targets.sh SECONDS PACK TARGET... [-- SNAKEMAKE_ARGS]
# A TARGET of several words ("env e2e ladder") is one Snakemake run of them all, side by side.
# Each target gets what is left of SECONDS (tools/gpu_run.sh --limit) and repacks PACK after
# it, so PACK holds the results, logs and journals of every target run so far. SNAKEMAKE_ARGS
# (e.g. --config contenders=...) go to every target's Snakemake.
set -uo pipefail
cd "$(dirname "$0")/.."
budget=$1 pack=$2; shift 2
targets=() extra=()
while (($#)); do
    if [[ $1 == -- ]]; then shift; extra=("$@"); break; fi
    targets+=("$1"); shift
done
start=$(date +%s)
for target in "${targets[@]}"; do
    left=$((budget - ($(date +%s) - start)))
    ((left > 20)) || { echo "gpu_targets: no time left for $target"; continue; }
    # shellcheck disable=SC2086  # a target of several words is several targets of one run
    tools/gpu_run.sh --limit "$left" --pack "$pack" $target -- "${extra[@]}"
done
echo "gpu_targets: done after $(( $(date +%s) - start )) s"
