#!/usr/bin/env bash
# Engines over etcd:// metadata. Two engines open each other; etcd stops (SIGTERM) for 10 s in the
# middle of a verified transfer between them and comes back: the transfer completes and both
# segments are published. Then their leases are revoked behind their back (as when a partition
# outlasts the TTL): both engines re-grant and publish again, and a third process opens both.
# Finally a killed engine's entries vanish by themselves within the lease TTL.
set -u
src=${MC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${MC_BUILD_DIR:-$src/build}/bin
command -v etcd >/dev/null 2>&1 || { echo "etcd not installed: skipped"; exit 77; }
command -v etcdctl >/dev/null 2>&1 || { echo "etcdctl not installed: skipped"; exit 77; }
[[ -x $bin/mooncake-bench ]] || { echo "no $bin/mooncake-bench"; exit 1; }
# shellcheck source=../fixtures/etcd.sh
source "$src/tests/fixtures/etcd.sh"

work=$(mktemp -d /tmp/mc-etcd-engine-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    etcd_stop "$work/etcd"
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$work"/*.out "$work"/*.err; do [[ -f $f ]] && { echo "--- $f"; tail -n 15 "$f"; } >&2; done
    exit 1
}

etcd_start "$work/etcd" >/dev/null || fail "etcd did not start"
export MC_METADATA=etcd://$ETCD_ENDPOINT MC_METADATA_TTL=3 MC_LOG_LEVEL=error
ctl() { ETCDCTL_API=3 etcdctl --endpoints="$ETCD_ENDPOINT" --command-timeout=2s "$@"; }
n_segments() { ctl get --prefix mooncake/ram/ --keys-only 2>/dev/null | grep -c . ; }
lease_ids() { ctl lease list | sed -n 's/^\([0-9a-f]\{6,\}\)$/\1/p'; }

"$bin/mooncake-bench" --mode target --metadata "$MC_METADATA" --buffer_size 8388608 \
    >"$work/target.out" 2>"$work/target.err" &
tpid=$!
pids+=("$tpid")
for ((i = 0; i < 100; i++)); do
    seg=$(sed -n 's/^segment: //p' "$work/target.out")
    [[ -n $seg ]] && break
    sleep 0.1
done
[[ -n $seg ]] || fail "the target printed no segment name"
ctl get "mooncake/ram/$seg" --print-value-only | grep -q . || fail "target not published"

# 22 s of verified writes; etcd is away from t=4 s to t=14 s.
"$bin/mooncake-bench" --mode initiator --segment_id "$seg" --metadata "$MC_METADATA" \
    --buffer_size 8388608 --block_size 65536 --duration 22 --verify --json \
    >"$work/initiator.out" 2>"$work/initiator.err" &
ipid=$!
pids+=("$ipid")
for ((i = 0; i < 50 && $(n_segments) < 2; i++)); do sleep 0.1; done
[[ $(n_segments) == 2 ]] || fail "the initiator's segment is not published"
sleep 4
mapfile -d '' args <"/proc/$ETCD_PID/cmdline"
kill -TERM "$ETCD_PID"
for ((i = 0; i < 100; i++)); do etcd__alive "$ETCD_PID" || break; sleep 0.1; done
etcd__alive "$ETCD_PID" && fail "etcd did not stop"
echo "etcd stopped; outage of 10 s"
sleep 10
"${args[@]}" </dev/null >>"$work/etcd/etcd.out" 2>&1 &
ETCD_PID=$!
echo "$ETCD_PID" >"$work/etcd/etcd.pid"
for ((i = 0; i < 100; i++)); do etcd__healthy "$ETCD_URL" && break; sleep 0.1; done
etcd__healthy "$ETCD_URL" || fail "etcd did not come back"
echo "etcd back"
for ((i = 0; i < 100 && $(n_segments) < 2; i++)); do sleep 0.1; done
[[ $(n_segments) == 2 ]] || fail "segments not published after etcd came back: $(n_segments)"
leases=$(lease_ids)
[[ $(echo "$leases" | grep -c .) == 2 ]] || fail "expected 2 leases, got: $leases"
# Each lease holds its engine's segment; revoking it takes the key (an engine may publish again
# at once, under a new lease, so the keys are not counted in between).
for l in $leases; do
    ctl lease timetolive "$l" --keys | grep -q "mooncake/ram/" || fail "lease $l holds no segment"
done
for l in $leases; do ctl lease revoke "$l" >/dev/null || fail "cannot revoke lease $l"; done
for l in $leases; do
    ctl lease timetolive "$l" | grep -q "already expired" || fail "lease $l outlived its revoke"
done
echo "leases revoked; waiting for both engines to publish again"
for ((i = 0; i < 100 && $(n_segments) < 2; i++)); do sleep 0.1; done
[[ $(n_segments) == 2 ]] || fail "segments not re-published after their leases were lost"
for l in $(lease_ids); do
    grep -qx "$l" <<<"$leases" && fail "lease $l was revoked but is listed again"
done
ctl get --prefix mooncake/rpc_meta/ --keys-only | grep -c . | grep -qx 2 ||
    fail "endpoints not re-published"

# A third process opens both segments (reads only, so the running verify is not disturbed).
for s in $(ctl get --prefix mooncake/ram/ --keys-only | sed -n 's|^mooncake/ram/||p'); do
    "$bin/mooncake-bench" --mode initiator --segment_id "$s" --metadata "$MC_METADATA" \
        --operation read --buffer_size 65536 --block_size 4096 --duration 0.3 --json \
        >"$work/third.out" 2>"$work/third.err" || fail "a third process cannot open $s"
done
echo "a third process opened both segments"

wait "$ipid" || fail "the transfer across the etcd outage failed"
grep -q '"verify":"ok"' "$work/initiator.out" || fail "the transfer's verify did not pass"
echo "transfer across the outage: $(tail -n 1 "$work/initiator.out")"

# A killed engine disappears with its lease (TTL 3 s).
kill -KILL "$tpid"
wait "$tpid" 2>/dev/null
for ((i = 0; i < 80 && $(n_segments) > 0; i++)); do sleep 0.1; done
[[ $(n_segments) == 0 ]] || fail "a killed engine's segment is still published after 8 s"
echo "PASS"
