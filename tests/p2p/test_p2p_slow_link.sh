#!/usr/bin/env bash
# A fetch from one holder over a slow link: its shards wait in the engine's queue behind the
# ones ahead of them (a peer's tasks are carved in order), so the last of the first eight gets
# its first byte long after its submit. That wait is not a stall: while the holder keeps sending,
# no shard may be canceled and retried. Two network namespaces on a bridge, each link shaped
# with tbf (tests/fixtures/hosts.sh); mooncake-p2p publish in one, fetch --no-p2p in the other
# with a 3 s shard timeout: one shard alone takes 1.1 s at 30 Mbit/s (1.7 s from its first byte,
# with the 2 MiB the engine keeps in flight ahead of it), the eighth in flight starts after
# ~7.3 s, where shards were canceled at 5 s.
# Checks: the file is identical and the fetch retried nothing. Skips (77) where namespaces,
# veth or tbf cannot be made. Everything it made is removed at exit.
set -uo pipefail
: "${MC_BUILD_DIR:?set by ctest}" "${MC_SOURCE_DIR:?set by ctest}"
tool=$MC_BUILD_DIR/bin/mooncake-p2p
source "$MC_SOURCE_DIR/tests/fixtures/hosts.sh"

P=p2psl$$
tmp=""
pids=()
cleanup() {
    trap - EXIT
    hosts_stop_pids "${pids[@]}"
    hosts_bridge_down
    [[ -z $tmp ]] || rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "test_p2p_slow_link: FAIL: $*" >&2
    exit 1
}

[[ $(id -u) == 0 ]] || { echo "test_p2p_slow_link: needs root (namespaces): skipped"; exit 77; }
if ! hosts_bridge_up "$P" 1 30mbit 10.233.0 2>"/tmp/$P.err"; then
    echo "test_p2p_slow_link: cannot build the namespaces: $(head -c 300 "/tmp/$P.err"): skipped"
    rm -f "/tmp/$P.err"
    exit 77
fi
rm -f "/tmp/$P.err"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc-p2p-slow.XXXXXX")
export MC_METADATA=file://$tmp/meta MC_PROTOCOL=tcp MC_LOG_LEVEL=error
head -c $((32 << 20)) /dev/urandom >"$tmp/src"

ip netns exec "$P-h0" timeout -k 5 120 "$tool" --listen 10.233.0.1:0 publish "$tmp/src" ckpt/slow \
    --shard-size 4M >"$tmp/pub.log" 2>&1 &
pids+=($!)
for ((i = 0; i < 100; i++)); do
    grep -q '^published ckpt/slow' "$tmp/pub.log" && break
    sleep 0.1
done
grep -q '^published ckpt/slow' "$tmp/pub.log" || { cat "$tmp/pub.log" >&2; fail "not published"; }

ip netns exec "$P-h1" timeout -k 5 90 "$tool" --listen 10.233.0.2:0 fetch ckpt/slow "$tmp/out" \
    --no-p2p --timeout-ms 3000 --json >"$tmp/fetch.out" 2>"$tmp/fetch.err"
rc=$?
cat "$tmp/fetch.out"
[[ $rc == 0 ]] || { cat "$tmp/fetch.err" >&2; fail "the fetch exited $rc"; }
cmp -s "$tmp/src" "$tmp/out" || fail "the fetched file differs"
grep -q '"retries":0[,}]' "$tmp/fetch.out" ||
    fail "shards waiting behind others were canceled and retried: $(tail -1 "$tmp/fetch.out")"
echo "test_p2p_slow_link: ok"
