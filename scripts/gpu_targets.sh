#!/usr/bin/env bash
# Run Snakemake targets one after another, in the order given, inside one time budget:
#   scripts/gpu_targets.sh SECONDS PACK TARGET...
# Each target gets what is left of SECONDS (scripts/gpu_run.sh --limit); the results, logs and
# journals of all of them are packed into PACK at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
budget=$1 pack=$2; shift 2
start=$(date +%s)
for target in "$@"; do
    left=$((budget - ($(date +%s) - start)))
    ((left > 20)) || { echo "gpu_targets: no time left for $target"; continue; }
    scripts/gpu_run.sh --limit "$left" "$target"
done
tar czf "$pack" --exclude="*/html" results logs report 2>/dev/null
echo "gpu_targets: packed into $pack after $(( $(date +%s) - start )) s"
