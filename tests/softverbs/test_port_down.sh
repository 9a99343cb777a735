#!/usr/bin/env bash
# softverbs: fault control from outside the processes. Two devices; ibv_rc_pingpong runs a
# long exchange between them and the test sets softverbs0's port down through its control
# file. The process on softverbs0 must fail with flushed work requests; its peer either ends
# with retry-exceeded or, when it was only waiting for a receive, keeps waiting (RC reports no
# error to a pure receiver), and is then stopped. After port up a new pingpong must pass.
# Exit 0 pass, 1 fail, 77 skipped.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=sv_lib.sh
. "$here/sv_lib.sh"
export SOFTVERBS_DEVICES=2
mkdir -p "$SOFTVERBS_CTL_DIR"

port=$(free_port)
stdbuf -oL ibv_rc_pingpong -p "$port" -d softverbs0 -n 100000000 >"$SV_TMP/server" 2>&1 &
spid=$!
SV_PIDS="$SV_PIDS $spid"
check "server listens" wait_for 60 listening "$port"
stdbuf -oL ibv_rc_pingpong -p "$port" -d softverbs1 -n 100000000 localhost >"$SV_TMP/client" 2>&1 &
cpid=$!
SV_PIDS="$SV_PIDS $cpid"
check "client connected" wait_for 60 grep -q "remote address" "$SV_TMP/client"
check "server connected" wait_for 60 grep -q "remote address" "$SV_TMP/server"

echo "port=down" >"$SOFTVERBS_CTL_DIR/softverbs0"
wait_exit 60 "$spid"
src=$?
check "process on the downed port fails (rc=$src)" test "$src" != 0 -a "$src" != 124
check "... with a flush error" grep -q "Flushed" "$SV_TMP/server"
wait_exit 15 "$cpid"
crc=$?
if [ "$crc" = 124 ]; then
    echo "note: peer was waiting for a receive; stopping it"
    kill "$cpid"
else
    check "peer ends with retry-exceeded (rc=$crc)" grep -q "retry counter exceeded" "$SV_TMP/client"
fi
cat "$SV_TMP/server" "$SV_TMP/client"

out=$(ibv_devinfo -d softverbs0)
check "ibv_devinfo shows the port down" grep -q "PORT_DOWN" <<<"$out"
echo "port=up" >"$SOFTVERBS_CTL_DIR/softverbs0"
out=$(ibv_devinfo -d softverbs0)
check "ibv_devinfo shows the port active again" grep -q "PORT_ACTIVE" <<<"$out"
check "pingpong after port up" pingpong after "-d softverbs0" "-d softverbs1"

[ "$fails" = 0 ] || exit 1
echo PASSED
