#!/usr/bin/env bash
# Helpers the benchmark scripts share (source it).

# A TCP port that was free just now, below the kernel's ephemeral range: outbound connections
# take their local ports from that range, and one could take the port between now and the
# server's bind.
free_port() {
    python3 - <<'PY'
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    p = random.randrange(10000, lo)
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", p))
        print(p)
        break
    except OSError:
        pass
    finally:
        s.close()
PY
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
