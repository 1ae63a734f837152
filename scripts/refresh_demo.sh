#!/usr/bin/env bash
# Incremental refresh, shown with Snakemake dry runs (README, "What reruns when"):
#   scripts/refresh_demo.sh [SNAKEMAKE_ARGS...]
# Prints the jobs a full build would run now, then the jobs it would run after an edit of the
# LRPE kernel (one comment line appended, then removed again): expected, the LRPE rules and the
# report only. Run it where every result is current, e.g. right after a full run.
set -euo pipefail
cd "$(dirname "$0")/.."
kernel=src/lmperf/kernels/lrpe.py
plan() { python3 -m snakemake -n --quiet rules "$@" -- report/report.md 2>&1 \
             | sed -n '/^Job stats:/,/^total/p' | sed -n '1,/^total/p'
         python3 -m snakemake -n "$@" -- report/report.md 2>&1 | grep -q "Nothing to be done" \
             && echo "(nothing to be done)" || true; }
echo "== before: jobs a full build would run"
plan "$@"
cp -p "$kernel" "$kernel.orig"
trap 'mv "$kernel.orig" "$kernel"' EXIT
echo "# edited by scripts/refresh_demo.sh" >> "$kernel"
echo "== after appending a comment line to $kernel"
plan "$@"
