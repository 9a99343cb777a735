#!/usr/bin/env bash
# Two engines on two "hosts" (network namespaces joined by a veth link): the initiator opens the
# target by handshake with its ip:port (no metadata server), sees it as a different host (other
# network namespace), and moves data both ways, every block verified. Then the link is cut
# mid-run: the transfer must fail within seconds, not hang.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../fixtures/netns.sh"
source "$here/../fixtures/bench_target.sh"
netns_require

B=${MC_BUILD_DIR:-build}
BENCH=$B/bin/mooncake-bench
[[ -x $BENCH ]] || { echo "missing $BENCH"; exit 1; }
P=mct$$
LOG=$(mktemp -d)
trap 'netns_down $P || true; rm -rf "$LOG"' EXIT
netns_up $P 2 1
A2=$(netns_addr $P 2 1)

bench_target_start $P 2 "$LOG/target.log" "$A2:0" 64M
SEG=$BENCH_SEGMENT
[[ $SEG == "$A2":* ]] || { echo "FAIL: segment $SEG is not on $A2"; exit 1; }
echo "target segment $SEG"

for op in write read; do
    out=$(netns_exec $P 1 env MC_LISTEN="$(netns_addr $P 1 1):0" MC_METADATA=none \
        "$BENCH" --mode initiator --segment_id "$SEG" --operation $op --buffer_size 64M \
        --block_size 1M --batch_size 8 --duration 1 --verify --json)
    last=$(tail -n1 <<<"$out")
    echo "$last"
    grep -q '"verify":"ok"' <<<"$last" || { echo "FAIL: $op not verified"; exit 1; }
    grep -q '"same_host":false' <<<"$last" || { echo "FAIL: namespaces seen as one host"; exit 1; }
done

# Cut the link while an initiator is writing: it must give up within the timeouts.
netns_exec $P 1 env MC_LISTEN="$(netns_addr $P 1 1):0" MC_METADATA=none MC_IO_TIMEOUT_MS=1000 \
    MC_CONNECT_TIMEOUT_MS=1000 MC_TRANSFER_TIMEOUT=5 "$BENCH" --mode initiator \
    --segment_id "$SEG" --buffer_size 64M --block_size 1M --batch_size 8 --duration 30 \
    >"$LOG/cut.log" 2>&1 &
ini=$!
sleep 1.5
netns_link_set $P 1 1 down
start=$(date +%s)
rc=0
wait $ini || rc=$?
took=$(( $(date +%s) - start ))
echo "initiator exited $rc after the cut, in ${took}s"
[[ $rc -ne 0 ]] || { echo "FAIL: transfer over a cut link reported success"; exit 1; }
(( took <= 20 )) || { echo "FAIL: took ${took}s to notice the cut"; exit 1; }
grep -q 'task failed' "$LOG/cut.log" || { cat "$LOG/cut.log"; echo "FAIL: no task failure"; exit 1; }
echo PASS
