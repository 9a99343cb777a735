#!/usr/bin/env bash
# Multi-rail TCP across network namespaces: two hosts joined by three veth links, each engine
# listening on its address of every link, so a peer is reachable over three rails.
#  1. striping: one 64 MiB request at a time; every rail carries bytes; verified.
#  2. failover: a link goes down in the middle of a verified transfer and comes back: the
#     transfer completes, the rail shows errors, and it carries bytes again after the link is up.
#  3. a rail whose qdisc drops everything is abandoned within the I/O timeout; the transfer
#     completes on the others, verified.
#  4. the NIC priority matrix: with link 1 preferred for cpu:0 memory only rail 1 carries data;
#     with link 1 down the available rails take over.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../fixtures/netns.sh"
source "$here/../fixtures/bench_target.sh"
netns_require

B=${MC_BUILD_DIR:-build}
BENCH=$B/bin/mooncake-bench
[[ -x $BENCH ]] || { echo "missing $BENCH"; exit 1; }
P=mcr$$
LOG=$(mktemp -d)
trap 'netns_down $P || true; rm -rf "$LOG"' EXIT
LINKS=3
netns_up $P 2 $LINKS

listen_list() { bench_listen_list $P "$1" 1 $LINKS; }

bench_target_start $P 2 "$LOG/target.log" "$(listen_list 2)" 64M
SEG=$BENCH_SEGMENT
echo "target segment $SEG"

initiator() { # extra env and args...
    netns_exec $P 1 env MC_LISTEN="$(listen_list 1)" MC_METADATA=none MC_IO_TIMEOUT_MS=1000 \
        MC_CONNECT_TIMEOUT_MS=1000 "$@"
}

rails_json() { # JSON summary line -> "bytes errors state" per rail, one line each
    python3 -c 'import json,sys
d=json.loads(sys.stdin.read().strip().splitlines()[-1])
assert d["verify"]=="ok", d["verify"]
for r in d["rails"]: print(r["bytes"], r["errors"], r["state"], r["name"])'
}

echo "== 1. striping: one 64 MiB request per batch"
out=$(initiator "$BENCH" --mode initiator --segment_id "$SEG" --buffer_size 64M \
    --block_size 64M --batch_size 1 --duration 2 --verify --json)
echo "$out" | tail -n1
rails=$(echo "$out" | rails_json)
echo "$rails"
[[ $(wc -l <<<"$rails") -eq $LINKS ]] || { echo "FAIL: expected $LINKS rails"; exit 1; }
while read -r bytes errors state name; do
    (( bytes > 0 )) || { echo "FAIL: rail $name carried nothing"; exit 1; }
done <<<"$rails"

echo "== 2. failover: link 2 down for 3 s in the middle of a transfer"
initiator "$BENCH" --mode initiator --segment_id "$SEG" --buffer_size 64M --block_size 4M \
    --batch_size 8 --duration 9 --interval 0.5 --verify --json >"$LOG/fo.out" 2>"$LOG/fo.err" &
ini=$!
sleep 2.5
netns_link_set $P 1 2 down
sleep 3
netns_link_set $P 1 2 up
up_at=$(grep -c '^rails t=' "$LOG/fo.err" || true)
rc=0
wait $ini || rc=$?
tail -n1 "$LOG/fo.out"
[[ $rc -eq 0 ]] || { cat "$LOG/fo.err"; echo "FAIL: transfer failed ($rc)"; exit 1; }
rails=$(rails_json <"$LOG/fo.out")
echo "$rails"
read -r _ errors2 _ name2 < <(sed -n 2p <<<"$rails")
(( errors2 > 0 )) || { echo "FAIL: rail $name2 shows no failure"; exit 1; }
# Bytes of rail 2 at the moment the link came back, and at the end: it must have grown.
before=$(grep '^rails t=' "$LOG/fo.err" | sed -n "${up_at}p" | awk '{print $3}' | cut -d, -f2)
after=$(grep '^rails t=' "$LOG/fo.err" | tail -n1 | awk '{print $3}' | cut -d, -f2)
echo "rail 2 bytes: $before when the link came back, $after at the end"
(( after > before )) || { echo "FAIL: rail 2 did not rejoin"; exit 1; }

echo "== 3. a black-holed rail is abandoned"
netns_tc $P 1 3 blackhole
netns_tc $P 2 3 blackhole
start=$(date +%s)
out=$(initiator "$BENCH" --mode initiator --segment_id "$SEG" --buffer_size 64M \
    --block_size 4M --batch_size 8 --duration 3 --verify --json)
took=$(( $(date +%s) - start ))
echo "$out" | tail -n1
rails=$(echo "$out" | rails_json)
echo "$rails"
read -r bytes3 errors3 _ name3 < <(sed -n 3p <<<"$rails")
(( errors3 > 0 )) || { echo "FAIL: black-holed rail $name3 shows no failure"; exit 1; }
(( took <= 15 )) || { echo "FAIL: took ${took}s"; exit 1; }
netns_tc $P 1 3 none
netns_tc $P 2 3 none

echo "== 4. priority matrix: link 1 preferred, the others available"
m="{\"cpu:0\": [[\"$(netns_ifname $P 1 1)\"], [\"$(netns_ifname $P 1 2)\", \"$(netns_ifname $P 1 3)\"]]}"
out=$(initiator MC_NIC_PRIORITY_MATRIX="$m" "$BENCH" --mode initiator --segment_id "$SEG" \
    --buffer_size 64M --block_size 4M --batch_size 8 --duration 2 --verify --json)
rails=$(echo "$out" | rails_json)
echo "$rails"
read -r b1 _ < <(sed -n 1p <<<"$rails")
read -r b2 _ < <(sed -n 2p <<<"$rails")
read -r b3 _ < <(sed -n 3p <<<"$rails")
(( b1 > 0 && b2 == 0 && b3 == 0 )) || { echo "FAIL: only the preferred rail should carry data"; exit 1; }
# The segment is opened while link 1 is up (its name is link 1's address); then link 1 goes.
initiator MC_NIC_PRIORITY_MATRIX="$m" "$BENCH" --mode initiator --segment_id "$SEG" \
    --buffer_size 64M --block_size 4M --batch_size 8 --duration 6 --verify --json \
    >"$LOG/pm.out" 2>"$LOG/pm.err" &
ini=$!
sleep 2
netns_link_set $P 1 1 down
rc=0
wait $ini || rc=$?
[[ $rc -eq 0 ]] || { cat "$LOG/pm.err"; echo "FAIL: transfer failed ($rc)"; exit 1; }
rails=$(rails_json <"$LOG/pm.out")
echo "$rails"
read -r b2 _ < <(sed -n 2p <<<"$rails")
read -r b3 _ < <(sed -n 3p <<<"$rails")
(( b2 > 0 && b3 > 0 )) || { echo "FAIL: the available rails did not take over"; exit 1; }
netns_link_set $P 1 1 up
echo PASS
