#!/usr/bin/env bash
# A run longer than one call on a lent GPU machine (one call at most 10 minutes; the machine goes
# back soon after a call ends, and each call replaces the repository's tracked files): start
# Snakemake's targets detached from the call, in a copy of the repository outside it, then follow
# them call after call until they end.
#   tools/gpu_detached.sh start DIR BUDGET_S PACK TARGET... [-- SNAKEMAKE_ARGS]  copy the repository to DIR with an
#                          empty results/ and logs/, start tools/gpu_targets.sh BUDGET_S there in
#                          its own session (setsid), then follow it for $FOLLOW_S seconds (480: with
#                          the copy and the wheel install, a 540 s follow ran past a 600 s call);
#                          SEED=DIR (a carried folder laid out like results/) starts results/ with
#                          those files, written now, so Snakemake keeps them: the files an earlier
#                          machine measured at the same commit
#   tools/gpu_detached.sh follow DIR SECONDS PACK  wait up to SECONDS for it to end (a call must
#                          end before its limit), then pack DIR's results/ and logs/ (journals
#                          included) into PACK
# Every `follow` prints the run's
# progress and "gpu_detached: running" or "gpu_detached: done (rc N)"; the next call must start
# before the idle machine goes back. `follow` on a machine without the run (it went back and a
# bare one came) exits 3 at once. Unpack PACK elsewhere and copy back the CSVs the run wrote.
set -uo pipefail
cd "$(dirname "$0")/.."
verb=${1:-} dir=${2:-}
[[ -n $verb && -n $dir ]] || { sed -n '2,16p' "$0" >&2; exit 2; }

follow() {  # follow DIR SECONDS PACK
    local dir=$1 seconds=$2 pack=$3 end=$((SECONDS + $2))
    # a machine that went back between two calls comes back bare: say so at once (waiting out
    # SECONDS on it spends device time on nothing); the run is lost, its last PACK is what is left
    if [[ ! -f $dir/.gpu_detached.log ]]; then
        echo "gpu_detached: no run in $dir on this machine (the machine was replaced since the run started?)" >&2
        return 3
    fi
    while [[ ! -f $dir/.gpu_detached.rc ]] && ((SECONDS < end)); do sleep 5; done
    # the memory visualizer's HTML stays behind: it can be larger than a transfer allows; Snakemake's
    # own log comes along (a job that fails before its first progress line says why only there)
    tar czf "$pack" -C "$dir" --exclude="*.html" results logs .gpu_detached.log 2>/dev/null
    # a job's traceback without the library warnings around it (Dynamo's run to thousands of lines)
    grep -v "^[WI][0-9]\{4\} " "$dir/.gpu_detached.log" \
        | grep -h "wrote\|resuming\|starting over\|Error\|error:\|Traceback\|gpu_run\|gpu_targets" \
        | cut -c1-220 | tail -40
    if [[ -f $dir/.gpu_detached.rc ]]; then
        echo "gpu_detached: done (rc $(cat "$dir/.gpu_detached.rc")); packed into $pack"
    else
        echo "gpu_detached: running ($(tail -1 "$dir/.gpu_detached.log" | cut -c1-160)); packed into $pack"
    fi
}

case $verb in
    start)
        budget=$3 pack=$4; shift 4
        rm -rf "$dir" && mkdir -p "$dir" || exit 1
        tar cf - --exclude=./results --exclude=./logs --exclude=./.snakemake --exclude='./.venv*' \
            --exclude=./.cache . | tar xf - -C "$dir"
        mkdir -p "$dir/results" "$dir/logs" && : > "$dir/.gpu_detached.log"
        if [[ -n ${SEED:-} ]]; then
            cp -r "$SEED"/. "$dir/results/" || exit 1
            find "$dir/results" -type f -exec touch {} +  # newer than every input: kept, not rerun
            echo "gpu_detached: results/ starts with $(find "$dir/results" -name '*.csv' | wc -l) files of $SEED"
        fi
        # the braces: `&` detaches the command alone; on `cd && command &` the whole list would
        # wait in a subshell holding the call's stdout, and a pipe after this script (| tail)
        # would wait for the run's end (a start call so ran out its limit and printed nothing)
        (cd "$dir" && { setsid nohup bash -c 'tools/gpu_targets.sh "$@"; echo $? > .gpu_detached.rc' \
            gpu_targets "$budget" "$dir/pack.tgz" "$@" > .gpu_detached.log 2>&1 < /dev/null & })
        echo "gpu_detached: started ${*} in $dir (budget ${budget} s)"
        follow "$dir" "${FOLLOW_S:-480}" "$pack"
        ;;
    follow)
        follow "$dir" "$3" "$4"
        ;;
    *)
        echo "gpu_detached: unknown verb $verb (start or follow)" >&2; exit 2 ;;
esac
