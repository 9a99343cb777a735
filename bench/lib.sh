#!/usr/bin/env bash
# Helpers the benchmark scripts share (source it).

# A TCP port on 127.0.0.1 that was free just now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# True when something listens on TCP port $1 (state 0A in /proc/net/tcp).
listening() {
    awk -v p="$(printf '%04X' "$1")" '$4 == "0A" && $2 ~ (":" p "$") { f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# ucx_server TLS PORT LOG TIMEOUT_S: start an ucx_perftest server in the background (its PID
# in UCX_SERVER and appended to the caller's bg_pids) and wait until it listens. The client does
# not retry, and probing with a connection would not do: the server takes the first connection
# as its client.
ucx_server() {
    local i
    UCX_TLS=$1 timeout -k 5 "$4" ucx_perftest -p "$2" >"$3" 2>&1 &
    UCX_SERVER=$!
    bg_pids+=("$UCX_SERVER")
    for ((i = 0; i < 100; i++)); do
        listening "$2" && break
        sleep 0.1
    done
}
