#!/usr/bin/env bash
# Messages between two "hosts" (network namespaces joined by a veth link) over a lossy link:
# both ends of the link drop what overflows a small token-bucket queue (tc tbf), and the
# initiator's connections to the target are killed every few hundred milliseconds (ss -K).
# mooncake-bench --operation msg --verify streams messages and ping-pongs: the target must
# count every message once, in order, with every byte right, and every echo must come back.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../fixtures/netns.sh"
source "$here/../fixtures/bench_target.sh"
netns_require

B=${MC_BUILD_DIR:-build}
BENCH=$B/bin/mooncake-bench
[[ -x $BENCH ]] || { echo "missing $BENCH"; exit 1; }
P=mcm$$
LOG=$(mktemp -d)
trap 'netns_down $P || true; rm -rf "$LOG"' EXIT
netns_up $P 2 1
A1=$(netns_addr $P 1 1)
A2=$(netns_addr $P 2 1)
LOSSY="tbf rate 200mbit burst 16kb limit 24kb"
netns_tc $P 1 1 "$LOSSY"
netns_tc $P 2 1 "$LOSSY"

bench_target_start $P 2 "$LOG/target.log" "$A2:0" 4096 --operation msg
SEG=$BENCH_SEGMENT
PORT=${SEG##*:}
echo "target segment $SEG"

for size in 64 16384; do
    netns_exec $P 1 env MC_LISTEN="$A1:0" MC_METADATA=none "$BENCH" --mode initiator \
        --segment_id "$SEG" --operation msg --block_size $size --duration 6 --verify --json \
        >"$LOG/ini.log" 2>"$LOG/ini.err" &
    ini=$!
    kills=0
    while kill -0 $ini 2>/dev/null; do
        sleep 0.3
        n=$(netns_exec $P 1 ss -HK state established "( dport = :$PORT )" 2>/dev/null | wc -l)
        kills=$((kills + n))
    done
    rc=0
    wait $ini || rc=$?
    last=$(grep '^{' "$LOG/ini.log" | tail -n1 || true)
    echo "$size B: $kills connections killed: $last"
    if [[ $rc -ne 0 ]] || ! grep -q '"verify":"ok"' <<<"$last"; then
        cat "$LOG/ini.err"
        echo "FAIL: messages of $size B not all delivered once, in order, intact"
        exit 1
    fi
    ((kills > 0)) || { echo "FAIL: no connection was killed"; exit 1; }
done
drops=$(netns_exec $P 1 tc -s qdisc show dev "$(netns_ifname $P 1 1)" | awk '/dropped/ { gsub(",", "", $7); print $7; exit }')
echo "packets dropped by the initiator's queue: $drops"
((drops > 0)) || { echo "FAIL: the link lost nothing"; exit 1; }
echo PASS
