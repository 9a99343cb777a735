#!/usr/bin/env bash
# mooncake-p2p as a script sees it: exit codes (usage 1, not found 2, verification 3, metadata
# unreachable 4, collision 6, local 7, interrupted 130), publish -> fetch -> identical file, a
# --serve-after holder feeding the next fetch, list, serve, rm, and publishers that exit 0 on
# SIGINT/SIGTERM. Every process it starts is killed at exit; every wait is bounded.
set -uo pipefail
: "${MC_BUILD_DIR:?set by ctest}"
tool=$MC_BUILD_DIR/bin/mooncake-p2p
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc-p2p-tool.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
export MC_METADATA=file://$tmp/meta MC_LISTEN=127.0.0.1:0 MC_METADATA_TTL=3 MC_LOG_LEVEL=error

fail() {
    echo "test_p2p_tool: FAIL: $*" >&2
    exit 1
}
step() { echo "== $*"; }

# expect CODE CMD...: run CMD (output in $tmp/out, $tmp/err), fail unless it exits CODE.
expect() {
    local want=$1 rc
    shift
    timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [[ $rc != "$want" ]]; then
        cat "$tmp/out" "$tmp/err" >&2
        fail "$* exited $rc, expected $want"
    fi
}

# wait_for FILE PATTERN: until FILE has a line matching PATTERN (10 s).
wait_for() {
    for ((i = 0; i < 100; i++)); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    cat "$1" >&2
    fail "no \"$2\" in $1"
}

# background NAME CMD...: start CMD with its output in $tmp/NAME.log; its PID in $bg.
background() {
    local name=$1
    shift
    "$@" >"$tmp/$name.log" 2>&1 &
    bg=$!
    pids+=("$bg")
}

# finish PID CODE: the process exits with CODE within 15 s.
finish() {
    local rc
    for ((i = 0; i < 150; i++)); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$1" 2>/dev/null && fail "process $1 still running"
    wait "$1"
    rc=$?
    [[ $rc == "$2" ]] || fail "process $1 exited $rc, expected $2"
}

step "usage errors exit 1"
expect 1 "$tool"
expect 1 "$tool" bogus
expect 1 "$tool" fetch onlyone
expect 1 "$tool" list --force
expect 1 "$tool" publish --shard-size 12Q file name
expect 0 "$tool" --help
grep -q '130 interrupted' "$tmp/out" || fail "--help does not list the exit codes"

step "publish, fetch, identical bytes"
head -c $((5 * 1024 * 1024 + 321)) /dev/urandom >"$tmp/src"
background pub "$tool" publish "$tmp/src" ckpt/a --shard-size 64K
pub=$bg
wait_for "$tmp/pub.log" '^published ckpt/a: 5243201 bytes, 81 shards'
expect 0 "$tool" fetch ckpt/a "$tmp/out1"
cmp "$tmp/src" "$tmp/out1" || fail "fetched bytes differ"
grep -q '^fetched ckpt/a: 5243201 bytes' "$tmp/out" || fail "no summary line"
grep -q 'holders' "$tmp/err" || fail "no progress line on a non-terminal"

step "not found exits 2, collision 6, bad name 1"
expect 2 "$tool" fetch nothere "$tmp/out2"
[[ ! -e $tmp/out2 && ! -e $tmp/out2.p2p-part ]] || fail "a failed fetch left a file"
expect 2 "$tool" rm nothere
expect 6 "$tool" publish "$tmp/src" ckpt/a
expect 1 "$tool" publish "$tmp/src" 'ckpt//a'
expect 1 "$tool" publish "$tmp/src" 'ckpt/replica/a'

step "a replica entry the store cannot hold fails the fetch (exit 1, says why, leaves no file)"
long=ckpt/$(printf 'x%.0s' {1..95}) # its replica key, with a long segment name, is too long for
background lpub "$tool" publish "$tmp/src" "$long" --shard-size 1M # a file name of the store
lpub=$bg
wait_for "$tmp/lpub.log" "^published $long"
MC_SEGMENT_NAME=$(printf 'f%.0s' {1..127}) expect 1 "$tool" fetch "$long" "$tmp/out4"
grep -q 'replica entry.*too long' "$tmp/err" || fail "no reason: $(cat "$tmp/err")"
[[ ! -e $tmp/out4 && ! -e $tmp/out4.p2p-part ]] || fail "a failed fetch left a file"
kill -INT "$lpub"
finish "$lpub" 0

step "--no-p2p --json: only the origin"
expect 0 "$tool" fetch ckpt/a "$tmp/out3" --no-p2p --json --max-inflight 4 --random
cmp "$tmp/src" "$tmp/out3" || fail "fetched bytes differ"
grep -q '"ok":true,"bytes":5243201,.*"from_origin":5243201,"from_replicas":0' "$tmp/out" ||
    fail "unexpected summary: $(cat "$tmp/out")"

step "a --serve-after holder feeds the next fetch"
background r1 "$tool" fetch ckpt/a "$tmp/r1" --serve-after
r1=$bg
wait_for "$tmp/r1.log" 'serving ckpt/a until interrupted'
expect 0 "$tool" fetch ckpt/a "$tmp/out4" --json
cmp "$tmp/src" "$tmp/out4" || fail "fetched bytes differ"
grep -q '"from_origin":0,"from_replicas":5243201' "$tmp/out" ||
    fail "not from the replica: $(cat "$tmp/out")"
expect 0 "$tool" list ckpt/
grep -Eq '^ckpt/a +5243201 +81 +2 +2 ' "$tmp/out" || fail "list: $(cat "$tmp/out")"

step "serve: a copy that does not match exits 3; a good one is a holder"
cp "$tmp/src" "$tmp/bad"
# byte 100000 changed (a constant written there matched the random byte one time in 256)
b=$(od -An -tu1 -j100000 -N1 "$tmp/bad" | tr -d ' ')
printf "\\$(printf '%03o' $(((b + 1) % 256)))" | dd of="$tmp/bad" bs=1 seek=100000 conv=notrunc status=none
expect 3 "$tool" serve ckpt/a "$tmp/bad"
head -c -1 "$tmp/out1" >"$tmp/short" # one byte short
expect 3 "$tool" serve ckpt/a "$tmp/short"
background srv "$tool" serve ckpt/a "$tmp/out1"
srv=$bg
wait_for "$tmp/srv.log" '^serving ckpt/a'
expect 0 "$tool" list
grep -Eq '^ckpt/a +5243201 +81 +3 +3 ' "$tmp/out" || fail "list: $(cat "$tmp/out")"

step "fetch interrupted exits 130 and leaves no file"
background slow "$tool" fetch ckpt/a "$tmp/out5" --limit-rate 1M --no-p2p
slow=$bg
sleep 1
kill -INT "$slow"
finish "$slow" 130
[[ ! -e $tmp/out5 && ! -e $tmp/out5.p2p-part ]] || fail "an interrupted fetch left a file"

step "a second fetch into the same file is refused (exit 7); the first one's file is whole"
background slow2 "$tool" fetch ckpt/a "$tmp/out7" --limit-rate 2M --no-p2p
slow2=$bg
for ((i = 0; i < 100; i++)); do [[ -e $tmp/out7.p2p-part ]] && break; sleep 0.1; done
expect 7 "$tool" fetch ckpt/a "$tmp/out7"
grep -q 'another fetch writes into it' "$tmp/err" || fail "refusal: $(cat "$tmp/err")"
finish "$slow2" 0
cmp -s "$tmp/src" "$tmp/out7" || fail "the first fetch's file differs from the object"

step "rm without --keep-replicas: a fetch under way finishes from the holders it knows"
background pub3 "$tool" publish "$tmp/src" ckpt/c --shard-size 64K
pub3=$bg
wait_for "$tmp/pub3.log" '^published ckpt/c'
background slow3 "$tool" fetch ckpt/c "$tmp/out8" --limit-rate 1M --timeout-ms 2000
slow3=$bg
for ((i = 0; i < 100; i++)); do [[ -e $tmp/out8.p2p-part ]] && break; sleep 0.1; done
sleep 0.5
expect 0 "$tool" rm ckpt/c
finish "$slow3" 0
cmp -s "$tmp/src" "$tmp/out8" || fail "the fetch under the rm differs from the object"
kill -TERM "$pub3"
finish "$pub3" 0

step "holders and publisher exit 0 on SIGINT/SIGTERM; the description goes with the origin"
kill -INT "$r1"
finish "$r1" 0
kill -TERM "$srv"
finish "$srv" 0
kill -TERM "$pub"
finish "$pub" 0
expect 0 "$tool" list
grep -q '^ckpt/a ' "$tmp/out" && fail "ckpt/a still listed: $(cat "$tmp/out")"

step "rm of an object whose origin died"
background pub2 "$tool" publish "$tmp/src" ckpt/b
pub2=$bg
wait_for "$tmp/pub2.log" '^published ckpt/b'
kill -KILL "$pub2"
wait "$pub2" 2>/dev/null
expect 0 "$tool" list ckpt/b
grep -q '^ckpt/b ' "$tmp/out" || fail "the description did not outlive its origin"
expect 0 "$tool" rm ckpt/b
expect 2 "$tool" fetch ckpt/b "$tmp/out6"

step "metadata unreachable exits 4"
expect 4 "$tool" --metadata etcd://127.0.0.1:1 list
echo "test_p2p_tool: OK"
