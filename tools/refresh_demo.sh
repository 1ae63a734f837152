#!/usr/bin/env bash
# Incremental refresh, shown with Snakemake dry runs (README, "What reruns when"):
#   tools/refresh_demo.sh [SNAKEMAKE_ARGS...]
# Prints the jobs a full build would run now, then the jobs it would run after an edit of the
# LRPE kernel (one comment line appended, then removed again): expected, the LRPE rules and the
# report only. Run it where every result is current, e.g. right after a full run.
set -euo pipefail
cd "$(dirname "$0")/.."
kernel=src/lmperf/kernels/lrpe.py
# One dry run; prints its job table, or all of Snakemake's output and fails if the dry run fails
# (e.g. an "incomplete" mark left by a job that was stopped: gpu_run.sh --rerun-incomplete).
plan() {
    local out
    if ! out=$(python3 -m snakemake -n --quiet rules "$@" -- report/report.md 2>&1); then
        echo "$out"; echo "refresh_demo: the dry run failed (output above)" >&2; return 1
    fi
    if grep -q "^Job stats:" <<<"$out"; then
        sed -n '/^Job stats:/,/^total/p' <<<"$out" | sed -n '1,/^total/p'
    else
        echo "(nothing to be done)"
    fi
}
echo "== before: jobs a full build would run"
plan "$@"
cp -p "$kernel" "$kernel.orig"
trap 'mv "$kernel.orig" "$kernel"' EXIT
echo "# edited by tools/refresh_demo.sh" >> "$kernel"
echo "== after appending a comment line to $kernel"
plan "$@"
