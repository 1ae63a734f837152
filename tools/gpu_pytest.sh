#!/usr/bin/env bash
# A test file on the GPU in parallel shards (the FlashAttention tests take about 600 s in one
# process, about 250 s in six): tools/gpu_pytest.sh SHARDS LOGDIR FILE [pytest args, e.g. -k expr]
# Each shard's log is LOGDIR/shard<i>.log; the summary lines are printed; exit 1 if any failed.
set -uo pipefail
shards=$1 logdir=$2 file=$3
shift 3
mkdir -p "$logdir"
python3 -m pytest -q -p no:cacheprovider --collect-only "$file" "$@" | grep '::' > "$logdir/ids.txt"
echo "gpu_pytest: $(wc -l < "$logdir/ids.txt") tests in $shards shards"
split -n "r/$shards" -d "$logdir/ids.txt" "$logdir/part"
rc=0
for part in "$logdir"/part*; do
    i=${part##*part}
    # one id a line: ids hold spaces (parametrize ids), so no word splitting
    xargs -d '\n' -a "$part" python3 -m pytest -q -p no:cacheprovider > "$logdir/shard$i.log" 2>&1 &
done
for job in $(jobs -p); do wait "$job" || rc=1; done
for log in "$logdir"/shard*.log; do echo "$(basename "$log"): $(tail -1 "$log")"; done
grep -h "^FAILED\|^ERROR" "$logdir"/shard*.log | cut -c1-300
exit $rc
