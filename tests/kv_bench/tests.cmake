# Smoke tests of mooncake-kv-bench (tools/mooncake_kv_bench.c): one small verified point,
# 1000 x 4 KiB, through the plugin loaded by path. The JSON line must carry every field with
# the values asked for, and the data must have been checked ("verified": true).
if(TARGET mooncake_kv AND TARGET mooncake-kv-bench)
  # The checker: $1 = op, stdin = the benchmark's stdout. Exactly one JSON line; fields present
  # and consistent (p99 of 5 posts is their maximum, so at least their average).
  set(MC_KV_BENCH_CHECK [=[
import json, sys
op = sys.argv[1]
lines = [l for l in sys.stdin.read().splitlines() if l.strip()]
assert len(lines) == 1, "expected one JSON line, got %r" % lines
p = json.loads(lines[0])
remote = sys.argv[2] if len(sys.argv) > 2 else "memory"
want = dict(block_size=4096, num_descs=1000, op=op, iters=5, verified=True, remote=remote)
for k, v in want.items():
    assert p.get(k) == v, "%s: %r, expected %r" % (k, p.get(k), v)
for k in ("gbps", "descs_per_sec", "descs_per_sec_incl_prep", "descs_per_sec_cycle",
          "cycle_us", "post_us_avg"):
    assert isinstance(p.get(k), (int, float)) and p[k] > 0, "%s: %r" % (k, p.get(k))
assert p["prep_us"] >= 0 and p["post_us_p99"] >= p["post_us_avg"] >= p["post_us_min"] > 0, p
assert p["descs_per_sec_incl_prep"] <= p["descs_per_sec"], p
assert abs(p["descs_per_sec"] - 1000 / (p["post_us_avg"] / 1e6)) <= 0.01 * p["descs_per_sec"], p
assert abs(p["gbps"] - 4096e3 / p["post_us_avg"] / 1e3) <= 0.01 * p["gbps"], p
assert abs(p["descs_per_sec_cycle"] - 1000 / (p["cycle_us"] / 1e6)) <= 0.01 * p["descs_per_sec_cycle"], p
print("ok:", lines[0])
]=])

  # The peer spawned by the benchmark itself (socketpair side channel), READ and WRITE.
  foreach(op read write)
    add_test(NAME kv_bench_smoke_${op} COMMAND bash -c [=[
set -euo pipefail
out=$(timeout 120 "$1" --plugin "$2" --block_size 4096 --num_descs 1000 --iters 5 --op "$3" \
    --verify --json)
python3 -c "$4" "$3" <<<"$out"
]=] kv_bench $<TARGET_FILE:mooncake-kv-bench> $<TARGET_FILE:mooncake_kv> ${op}
      "${MC_KV_BENCH_CHECK}")
    set_tests_properties(kv_bench_smoke_${op} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 180
      LABELS kv
      ENVIRONMENT "MC_BUILD_DIR=${CMAKE_BINARY_DIR};MC_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  endforeach()

  # --remote_file: the peer's region is a file (the plugin's FILE type). A WRITE, verified by
  # the peer reading the file back, then a READ of it, verified here; the file holds N*B bytes.
  add_test(NAME kv_bench_smoke_file COMMAND bash -c [=[
set -euo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for op in write read; do
    out=$(timeout 120 "$1" --plugin "$2" --block_size 4096 --num_descs 1000 --iters 5 \
        --op $op --verify --json --remote_file "$dir/kv.bin")
    python3 -c "$3" $op file <<<"$out"
done
[[ $(stat -c %s "$dir/kv.bin") -eq 4096000 ]]
]=] kv_bench $<TARGET_FILE:mooncake-kv-bench> $<TARGET_FILE:mooncake_kv> "${MC_KV_BENCH_CHECK}")

  # The documented two-command form: a peer serving a TCP side channel on loopback, and an
  # initiator pointed at it with --peer; the peer must exit 0 after "done".
  add_test(NAME kv_bench_smoke_peer COMMAND bash -c [=[
set -euo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
timeout 120 "$1" --plugin "$2" --serve --listen_side 127.0.0.1:0 --protocol tcp >"$log" 2>&1 &
peer=$!
for _ in $(seq 100); do
    grep -q '^listening: ' "$log" && break
    sleep 0.1
done
addr=$(sed -n 's/^listening: //p' "$log")
[[ -n $addr ]] || { echo "peer did not start: $(cat "$log")" >&2; kill "$peer"; exit 1; }
out=$(timeout 120 "$1" --plugin "$2" --peer "$addr" --protocol tcp --block_size 4096 \
    --num_descs 1000 --iters 5 --op read --json)
python3 -c "$3" read <<<"$out"
wait "$peer" || { echo "peer failed: $(cat "$log")" >&2; exit 1; }
]=] kv_bench $<TARGET_FILE:mooncake-kv-bench> $<TARGET_FILE:mooncake_kv> "${MC_KV_BENCH_CHECK}")
  # A plugin path that does not exist: exit 1 and a message naming the file.
  add_test(NAME kv_bench_no_plugin COMMAND bash -c [=[
set -uo pipefail
err=$("$1" --plugin /nonexistent/libmooncake_kv.so --num_descs 10 2>&1 >/dev/null)
rc=$?
[[ $rc -eq 1 && $err == *"/nonexistent/libmooncake_kv.so"* ]] || {
    echo "expected exit 1 naming the file, got $rc: $err" >&2
    exit 1
}
]=] kv_bench $<TARGET_FILE:mooncake-kv-bench>)
  set_tests_properties(kv_bench_smoke_file kv_bench_smoke_peer kv_bench_no_plugin PROPERTIES SKIP_RETURN_CODE 77
    TIMEOUT 180 LABELS kv
    ENVIRONMENT "MC_BUILD_DIR=${CMAKE_BINARY_DIR};MC_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endif()
