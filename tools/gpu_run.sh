#!/usr/bin/env bash
# Run Snakemake targets on a GPU machine that has python3 with torch and triton but no package
# registry, using a wheelhouse made elsewhere with tools/wheelhouse.sh:
#   tools/gpu_run.sh [--wheels DIR] [--limit SECONDS] [--pack FILE] TARGET... [-- SNAKEMAKE_ARGS]
# --limit stops Snakemake after that many seconds (finished jobs are kept; a rerun does the rest);
# --pack writes results/, logs/ and report/ into one tar.gz (to copy off a machine you give back).
set -uo pipefail
cd "$(dirname "$0")/.."
wheels=.whl limit=0 pack="" targets=() extra=()
while (($#)); do
    case $1 in
        --wheels) wheels=$2; shift 2 ;;
        --limit) limit=$2; shift 2 ;;
        --pack) pack=$2; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) targets+=("$1"); shift ;;
    esac
done
if ! python3 -c 'import snakemake' 2>/dev/null; then
    if [[ ! -d /tmp/lmperf-site/snakemake ]]; then  # installed once a machine (gpu_targets.sh calls this per target)
        [[ -d $wheels ]] || { echo "gpu_run: no snakemake and no wheelhouse at $wheels" >&2; exit 1; }
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/lmperf-site "$wheels"/*.whl \
            || { echo "gpu_run: installing the wheelhouse failed" >&2; exit 1; }
    fi
    export PYTHONPATH=/tmp/lmperf-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# The ladder's peer rungs need liger-kernel and torchao; a wheelhouse built without --peers leaves
# them `skipped` rows, which a published ladder would lose: say so before the budget is spent
python3 -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("liger_kernel", "torchao")))' \
    || echo "gpu_run: liger-kernel or torchao missing here: a ladder run here makes its peer rungs skipped rows" \
            "(build the wheelhouse with tools/wheelhouse.sh --peers)" >&2
# --rerun-incomplete: a job that --limit stopped after it wrote its CSV but before it exited keeps
# Snakemake's "incomplete" mark, and every later call would refuse to start; rerunning such a job
# costs seconds, since its journal holds every finished configuration. --keep-going: a job that
# fails (a case ended in an error) stops only the jobs that need its output, not the other sizes
# or sections of the target, which the budget was planned for.
run=(python3 -m snakemake --cores "${CORES:-all}" --rerun-incomplete --keep-going "${targets[@]}" "${extra[@]}")
start=$(date +%s)
if ((limit > 0)); then
    timeout --signal=INT --kill-after=60 "$limit" "${run[@]}"
else
    "${run[@]}"
fi
rc=$?
echo "gpu_run: snakemake exited $rc after $(( $(date +%s) - start )) s"
if [[ -n $pack ]]; then
    # the memory visualizer HTML stays behind: it can be larger than a transfer allows
    tar czf "$pack" --exclude="*/html" results logs report 2>/dev/null
    echo "gpu_run: packed results, logs and report into $pack"
fi
exit $rc
