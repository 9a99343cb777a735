#!/usr/bin/env bash
# Multi-rail benchmark across network namespaces: two hosts joined by LINKS veth links, each
# limited by tc tbf to RATE in both directions. In one run it measures:
#   - a raw TCP stream alone on each link (mc-raw-tcp): the baseline;
#   - one large engine transfer (one 64 MiB request per batch) over 1 link and over all links,
#     WRITE and READ;
#   - a multi-GiB verified engine WRITE with link 2 cut in the middle (failover).
# Prints aggregate and per-rail figures and ends with one JSON line holding ratio_1link and
# ratio_4link (engine throughput / sum of the raw per-link baselines it could use),
# failover_completed and failover_verified.
#
# Settings: LINKS (4), RATE (400mbit), DURATION (8 s per measurement), FAILOVER_DURATION (30 s),
# MC_BUILD_DIR (build). Needs root (network namespaces).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
source "$root/tests/fixtures/netns.sh"
source "$root/tests/fixtures/bench_target.sh"
netns_require

LINKS=${LINKS:-4}
RATE=${RATE:-400mbit}
DURATION=${DURATION:-8}
FAILOVER_DURATION=${FAILOVER_DURATION:-30}
B=${MC_BUILD_DIR:-build}
[[ $B == /* ]] || B=$root/$B
BENCH=$B/bin/mooncake-bench
RAW=$B/bin/mc-raw-tcp
P=mcb$$
LOG=$(mktemp -d)
trap 'netns_down $P >/dev/null 2>&1 || true; rm -rf "$LOG"' EXIT

netns_up $P 2 "$LINKS" >/dev/null
for k in $(seq "$LINKS"); do
    for h in 1 2; do
        netns_tc $P $h "$k" "tbf rate $RATE burst 256kb latency 50ms"
    done
done

addrs() { bench_listen_list $P "$@"; } # host first last -> "a:0,b:0"
gbps() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["gbps"])'; }

echo "== raw TCP alone on each link ($RATE)" >&2
raw_sum=0
raw=()
for k in $(seq "$LINKS"); do
    a2=$(netns_addr $P 2 "$k")
    port=$((20000 + k))
    NETNS_LOG=$LOG/raw$k.log netns_spawn $P 2 "$RAW" --mode target --host "$a2" --port $port \
        --buffer_size 64M >/dev/null
    sleep 0.5
    g=$(netns_exec $P 1 "$RAW" --mode initiator --host "$a2" --port $port --block_size 1M \
        --buffer_size 64M --duration "$DURATION" --json | gbps)
    raw+=("$g")
    raw_sum=$(python3 -c "print($raw_sum + $g)")
    echo "  link $k: $g GB/s" >&2
done

start_target() { # name first_link last_link -> SEG
    bench_target_start $P 2 "$LOG/$1.log" "$(addrs 2 "$2" "$3")" 256M
    SEG=$BENCH_SEGMENT
}
engine() { # first_link last_link segment args...
    local f=$1 l=$2 seg=$3
    shift 3
    netns_exec $P 1 env MC_LISTEN="$(addrs 1 "$f" "$l")" MC_METADATA=none "$BENCH" \
        --mode initiator --segment_id "$seg" --buffer_size 256M --block_size 64M --batch_size 1 \
        --json "$@"
}

start_target one 1 1
seg1=$SEG
start_target all 1 "$LINKS"
segall=$SEG
declare -A res
for op in write read; do
    echo "== engine $op over 1 link" >&2
    res[${op}_1]=$(engine 1 1 "$seg1" --operation $op --duration "$DURATION" | tee -a "$LOG/runs" | gbps)
    echo "  ${res[${op}_1]} GB/s" >&2
    echo "== engine $op over $LINKS links" >&2
    out=$(engine 1 "$LINKS" "$segall" --operation $op --duration "$DURATION")
    echo "$out" | grep -E '^(rail|[0-9*]+\.)' >&2 || true
    res[${op}_all]=$(echo "$out" | gbps)
    echo "  ${res[${op}_all]} GB/s" >&2
done

echo "== failover: ${FAILOVER_DURATION} s verified WRITE over $LINKS links, link 2 cut at half time" >&2
engine 1 "$LINKS" "$segall" --duration "$FAILOVER_DURATION" --verify >"$LOG/fo.out" 2>"$LOG/fo.err" &
ini=$!
sleep "$(python3 -c "print($FAILOVER_DURATION / 2)")"
netns_link_set $P 1 2 down
rc=0
wait $ini || rc=$?
grep -E '^(rail|[0-9*]+\.)' "$LOG/fo.out" >&2 || true
fo_bytes=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["bytes"])' "$LOG/fo.out" 2>/dev/null || echo 0)
completed=false
verified=false
[[ $rc -eq 0 ]] && completed=true
grep -q '"verify":"ok"' "$LOG/fo.out" && verified=true

python3 - "$raw_sum" "${raw[0]}" "${res[write_1]}" "${res[read_1]}" "${res[write_all]}" \
    "${res[read_all]}" "$completed" "$verified" "$fo_bytes" "$LINKS" "$RATE" <<'PY'
import json, sys
raw_sum, raw1, w1, r1, wa, ra = map(float, sys.argv[1:7])
completed, verified = sys.argv[7] == "true", sys.argv[8] == "true"
fo_bytes, links, rate = int(sys.argv[9]), int(sys.argv[10]), sys.argv[11]
one = min(w1, r1) / raw1
allr = min(wa, ra) / raw_sum
print(f"raw TCP: {raw1:.4f} GB/s on link 1, {raw_sum:.4f} GB/s summed over {links} links ({rate} each)")
print(f"engine 1 link : write {w1:.4f}  read {r1:.4f} GB/s  -> ratio_1link {one:.3f}")
print(f"engine {links} links: write {wa:.4f}  read {ra:.4f} GB/s  -> ratio_4link {allr:.3f}")
print(f"failover: completed={completed} verified={verified} bytes={fo_bytes}")
print(json.dumps({"links": links, "rate": rate, "raw_link1_gbps": raw1, "raw_sum_gbps": raw_sum,
                  "engine_write_1link_gbps": w1, "engine_read_1link_gbps": r1,
                  "engine_write_all_gbps": wa, "engine_read_all_gbps": ra,
                  "ratio_1link": round(one, 4), "ratio_4link": round(allr, 4),
                  "failover_bytes": fo_bytes, "failover_completed": completed,
                  "failover_verified": verified}))
PY
