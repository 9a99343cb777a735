# Helpers for the softverbs shell tests (sourced). Sets LD_LIBRARY_PATH to the stand-in, gives
# the test its own fabric and control directory, and kills every process it started on exit.
set -u
: "${MC_BUILD_DIR:?MC_BUILD_DIR must point at the build directory}"
SV_LIB=$MC_BUILD_DIR/lib/softverbs
if [ ! -e "$SV_LIB/libibverbs.so.1" ]; then
    echo "skipped: $SV_LIB/libibverbs.so.1 not built"
    exit 77
fi
command -v ibv_rc_pingpong >/dev/null 2>&1 || {
    echo "skipped: ibverbs-utils not installed"
    exit 77
}
export LD_LIBRARY_PATH=$SV_LIB
export SOFTVERBS_FABRIC=sv-test-$$
SV_TMP=$(mktemp -d)
export SOFTVERBS_CTL_DIR=$SV_TMP/ctl
SV_PIDS=""
fails=0

sv_cleanup() {
    local p
    for p in $SV_PIDS; do
        kill "$p" 2>/dev/null
    done
    for p in $SV_PIDS; do
        wait "$p" 2>/dev/null
    done
    rm -rf "$SV_TMP"
}
trap sv_cleanup EXIT
trap 'exit 1' INT TERM

check() { # check "what" command...
    local what=$1
    shift
    if "$@"; then
        echo "ok: $what"
    else
        echo "FAIL: $what"
        fails=$((fails + 1))
    fi
}

# wait_for SECONDS command...: retries the command every 0.1 s until it succeeds.
wait_for() {
    local end=$((SECONDS + $1))
    shift
    until "$@"; do
        [ "$SECONDS" -ge "$end" ] && return 1
        sleep 0.1
    done
}

# A TCP port for the pingpong handshake, free at the time of asking: below the kernel's
# ephemeral range (32768 and up by default), which outbound connections take their ports from
# (one did take a port picked here between asking and binding: "Couldn't listen"), and in no
# socket at all.
free_port() {
    local p lo
    lo=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    while :; do
        p=$((10000 + RANDOM % (lo - 10000)))
        ss -Hta "sport = :$p" 2>/dev/null | grep -q . || {
            echo "$p"
            return
        }
    done
}

listening() { ss -Htln "sport = :$1" | grep -q .; }

# alive PID: true while the process runs.
alive() { kill -0 "$1" 2>/dev/null; }

# wait_exit SECONDS PID: waits for the process to end; returns its status, 124 on timeout.
wait_exit() {
    wait_for "$1" eval "! kill -0 $2 2>/dev/null" || return 124
    wait "$2"
}

# pingpong NAME "server args" "client args": runs ibv_rc_pingpong (or $PP_TOOL) server and
# client on loopback; true when both succeed. Logs in $SV_TMP/NAME.{server,client}.
pingpong() {
    local name=$1 sargs=$2 cargs=$3 port spid cpid src crc tool=${PP_TOOL:-ibv_rc_pingpong}
    port=$(free_port)
    # shellcheck disable=SC2086
    $tool -p "$port" $sargs >"$SV_TMP/$name.server" 2>&1 &
    spid=$!
    SV_PIDS="$SV_PIDS $spid"
    if ! wait_for 60 listening "$port"; then
        echo "server did not listen"
        cat "$SV_TMP/$name.server"
        return 1
    fi
    # shellcheck disable=SC2086
    $tool -p "$port" $cargs localhost >"$SV_TMP/$name.client" 2>&1 &
    cpid=$!
    SV_PIDS="$SV_PIDS $cpid"
    wait_exit 240 "$cpid"
    crc=$?
    wait_exit 60 "$spid"
    src=$?
    if [ "$src" != 0 ] || [ "$crc" != 0 ]; then
        echo "server rc=$src client rc=$crc"
        cat "$SV_TMP/$name.server" "$SV_TMP/$name.client"
        return 1
    fi
    tail -n 1 "$SV_TMP/$name.client"
}
