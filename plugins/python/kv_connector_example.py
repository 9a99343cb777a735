"""A disaggregated-serving KV connector on the Mooncake KV plugin, in the shape a serving stack
(vLLM's KV connector API) gives it, run as two processes on loopback.

  prefill process: computes the KV cache of some requests into per-layer block tables, publishes
      its connection info and per-layer region data (the "handshake"), and frees a request's
      blocks when the decode side's notification "<req_id>:<rank>" says it has read them.
  decode process: the scheduler side asks how many tokens of each request can be loaded from
      the remote; the worker side starts one READ per (request, layer), waits layer by layer as
      a model's forward pass would, checks every byte, then notifies the prefill side.

Usage: python3 kv_connector_example.py [--plugin PATH|NAME] [--protocol auto|tcp|shm]
The plugin defaults to $MC_BUILD_DIR/lib/libmooncake_kv.so when MC_BUILD_DIR is set, else the
name "mooncake_kv" (looked up in MC_PLUGIN_DIR). Exit 0 on success, 1 on failure, 77 when the
plugin cannot be loaded.
"""

import argparse
import json
import math
import os
import random
import select
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mooncake_kv as kv  # noqa: E402

LAYERS = 8
BLOCKS = 64                # blocks per layer on each side
BLOCK_BYTES = 16 * 1024    # one block of one layer
TOKENS_PER_BLOCK = 16
RANK = 0                   # tensor-parallel rank of this worker
TIMEOUT_S = 30
# Requests the prefill side computes: id -> prompt tokens.
REQUESTS = {"req-0": 100, "req-1": 37, "req-2": 250, "req-3": 64, "req-4": 16}
# Tokens of a request the decode side already has locally (a prefix cache hit).
DECODE_CACHED = {"req-2": 32}


def log(role, msg):
    print(f"[{role:7}] {msg}", file=sys.stderr, flush=True)


def block_content(layer, req_id, j):
    """What block j of a request holds in a layer: the same on both sides by construction."""
    return random.Random(f"{layer}/{req_id}/{j}").randbytes(BLOCK_BYTES)


class BlockPool:
    """Free block ids, handed out in a scattered order as a paged allocator's would be."""

    def __init__(self, n, seed):
        self.free = list(range(n))
        random.Random(seed).shuffle(self.free)

    def alloc(self, n):
        if n > len(self.free):
            raise RuntimeError(f"out of KV blocks: need {n}, {len(self.free)} free")
        out, self.free = self.free[:n], self.free[n:]
        return out

    def release(self, ids):
        self.free.extend(ids)


class KVCache:
    """Per-layer KV regions (bytearrays) registered with an agent."""

    def __init__(self, agent):
        self.layers = [bytearray(BLOCKS * BLOCK_BYTES) for _ in range(LAYERS)]
        self.regions = [agent.register(buf) for buf in self.layers]

    def block(self, layer, bid):
        return self.layers[layer][bid * BLOCK_BYTES:(bid + 1) * BLOCK_BYTES]

    def put(self, layer, bid, data):
        self.layers[layer][bid * BLOCK_BYTES:(bid + 1) * BLOCK_BYTES] = data

    def descs(self, layer, ids):
        r = self.regions[layer]
        return [(r.addr + bid * BLOCK_BYTES, BLOCK_BYTES, r) for bid in ids]


# ---- prefill side ----------------------------------------------------------------------------

def run_prefill(args):
    agent = kv.Agent(args.plugin, "prefill", LISTEN="127.0.0.1:0", PROTOCOL=args.protocol)
    cache, pool = KVCache(agent), BlockPool(BLOCKS, seed=1)
    blocks = {}
    for req_id, tokens in REQUESTS.items():  # "prefill": compute every layer's KV
        blocks[req_id] = pool.alloc(math.ceil(tokens / TOKENS_PER_BLOCK))
        for layer in range(LAYERS):
            for j, bid in enumerate(blocks[req_id]):
                cache.put(layer, bid, block_content(layer, req_id, j))
        log("prefill", f"{req_id}: {tokens} tokens computed into blocks {blocks[req_id]}")
    handshake = {
        "agent": agent.name, "conn": agent.conn_info().hex(),
        "layers": [{"md": r.public_data().hex(), "addr": r.addr} for r in cache.regions],
        "requests": {rid: {"num_tokens": REQUESTS[rid], "block_ids": b}
                     for rid, b in blocks.items()},
    }
    print(json.dumps(handshake), flush=True)
    # Blocks stay allocated until the decode side says it has read them.
    deadline = time.monotonic() + TIMEOUT_S
    while blocks and time.monotonic() < deadline:
        for sender, msg in agent.get_notifs():
            req_id, rank = msg.decode().rsplit(":", 1)
            freed = blocks.pop(req_id)
            pool.release(freed)
            log("prefill", f"{req_id}: read by {sender} (rank {rank}), freed {len(freed)} "
                f"blocks; {len(pool.free)}/{BLOCKS} free")
        time.sleep(0.001)
    print(json.dumps({"freed_all": not blocks}), flush=True)
    if blocks:
        log("prefill", f"FAIL: no notification for {sorted(blocks)} after {TIMEOUT_S} s")
    sys.stdin.read()  # serve until the decode side has gone
    agent.close()
    return 1 if blocks else 0


# ---- decode side: the connector's scheduler and worker halves --------------------------------

class ReqMeta:
    def __init__(self, req_id, local_ids, remote_ids):
        self.req_id, self.local_ids, self.remote_ids = req_id, local_ids, remote_ids


class SchedulerConnector:
    """Scheduler side: knows what the remote computed, decides what to load."""

    def __init__(self, remote_requests):
        self.remote = remote_requests
        self.pending = []

    def get_num_new_matched_tokens(self, req_id, num_computed_tokens):
        """Tokens of the request, beyond those computed locally, loadable from the remote."""
        remote = self.remote.get(req_id)
        return max(0, remote["num_tokens"] - num_computed_tokens) if remote else 0

    def update_state_after_alloc(self, req_id, block_ids, num_computed_tokens):
        """The request got local blocks block_ids; the first computed ones are filled."""
        skip = num_computed_tokens // TOKENS_PER_BLOCK
        remote_ids = self.remote[req_id]["block_ids"][skip:]
        self.pending.append(ReqMeta(req_id, block_ids[skip:], remote_ids))

    def build_connector_meta(self):
        meta, self.pending = self.pending, []
        return meta


class WorkerConnector:
    """Worker side: registers the KV caches, starts the loads, waits per layer."""

    def __init__(self, agent):
        self.agent = agent
        self.remote_layers = []
        self.remote_agent = None
        self.loads = {}  # layer -> [(req_id, Transfer)]

    def register_kv_caches(self, cache):
        self.cache = cache

    def add_remote_agent(self, hs):
        self.remote_agent = hs["agent"]
        self.agent.load_remote(self.remote_agent, bytes.fromhex(hs["conn"]))
        for layer in hs["layers"]:
            md = self.agent.load_remote_md(self.remote_agent, bytes.fromhex(layer["md"]))
            self.remote_layers.append((layer["addr"], md))

    def start_load_kv(self, metadata):
        """One READ per (request, layer): posted now, moving while the model runs."""
        for layer in range(LAYERS):
            addr, md = self.remote_layers[layer]
            for m in metadata:
                remote = [(addr + bid * BLOCK_BYTES, BLOCK_BYTES, md) for bid in m.remote_ids]
                x = self.agent.prepare(kv.READ, self.cache.descs(layer, m.local_ids), remote,
                                       self.remote_agent)
                x.post()
                self.loads.setdefault(layer, []).append((m, x))

    def wait_for_layer_load(self, layer):
        """Block until every load of this layer is in; returns the bytes moved."""
        moved = 0
        for m, x in self.loads[layer]:
            x.wait(TIMEOUT_S)
            moved += len(m.local_ids) * BLOCK_BYTES
        return moved

    def close(self):
        """Forget the remote: its regions, then the agent itself."""
        for _, md in self.remote_layers:
            md.unload()
        self.agent.disconnect(self.remote_agent)

    def get_finished(self):
        """Requests whose every layer is in: tell the remote to free them, release handles."""
        done = []
        for m, _ in self.loads.get(0, []):
            log("decode", f"{m.req_id}: loaded, notifying {self.remote_agent} "
                f"'{m.req_id}:{RANK}'")
            self.agent.notify(self.remote_agent, f"{m.req_id}:{RANK}")
            done.append(m.req_id)
        for layer in list(self.loads):
            for _, x in self.loads.pop(layer):
                x.release()
        return done


def run_decode(args):
    hs = json.loads(sys.stdin.readline())
    agent = kv.Agent(args.plugin, "decode", LISTEN="127.0.0.1:0", PROTOCOL=args.protocol)
    cache, pool = KVCache(agent), BlockPool(BLOCKS, seed=2)
    sched, worker = SchedulerConnector(hs["requests"]), WorkerConnector(agent)
    worker.register_kv_caches(cache)
    worker.add_remote_agent(hs)

    local_blocks = {}
    for req_id, tokens in REQUESTS.items():
        computed = DECODE_CACHED.get(req_id, 0)
        ext = sched.get_num_new_matched_tokens(req_id, computed)
        local_blocks[req_id] = ids = pool.alloc(math.ceil(tokens / TOKENS_PER_BLOCK))
        for layer in range(LAYERS):  # the prefix this side computed itself
            for j in range(computed // TOKENS_PER_BLOCK):
                cache.put(layer, ids[j], block_content(layer, req_id, j))
        sched.update_state_after_alloc(req_id, ids, computed)
        log("decode", f"{req_id}: {computed} tokens local, {ext} to load from "
            f"{hs['agent']} into blocks {ids}")
    t0 = time.perf_counter()
    worker.start_load_kv(sched.build_connector_meta())
    bad = 0
    for layer in range(LAYERS):  # the forward pass reaches each layer in turn
        t1 = time.perf_counter()
        moved = worker.wait_for_layer_load(layer)
        t2 = time.perf_counter()
        errors = [f"{rid}[{j}]" for rid, ids in local_blocks.items() for j, bid in enumerate(ids)
                  if cache.block(layer, bid) != block_content(layer, rid, j)]
        bad += len(errors)
        log("decode", f"layer {layer}: {moved // BLOCK_BYTES:3} blocks, {moved >> 10:4} KiB, "
            f"ready at {(t2 - t0) * 1e3:6.2f} ms (waited {(t2 - t1) * 1e3:5.2f} ms), "
            + (f"MISMATCH in {errors}" if errors else "verified"))
    finished = worker.get_finished()
    log("decode", f"{len(finished)} requests finished loading")
    sys.stdin.read()  # the driver closes stdin once the prefill side has freed everything
    worker.close()
    agent.close()
    return 1 if bad else 0


# ---- the driver: both processes on loopback ----------------------------------------------------

def default_plugin():
    build = os.environ.get("MC_BUILD_DIR")
    return os.path.join(build, "lib", "libmooncake_kv.so") if build else "mooncake_kv"


def read_line(proc, what):
    """One line of a child's stdout within TIMEOUT_S."""
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
    line = proc.stdout.readline() if ready else None
    if not line:
        state = "exited" if proc.poll() is not None else f"silent for {TIMEOUT_S} s"
        raise RuntimeError(f"no {what} from process {proc.pid}: {state}")
    return line


def run_both(args):
    try:
        p = kv.Plugin(args.plugin)
    except kv.LoadError as e:
        print(f"SKIP: {e}", file=sys.stderr)
        return 77
    print(f"plugin {p.name} {p.version} (ABI {p.abi[0]}.{p.abi[1]}) from {p.path}; "
          f"{LAYERS} layers x {BLOCKS} blocks x {BLOCK_BYTES >> 10} KiB per side",
          file=sys.stderr)
    me = [sys.executable, os.path.abspath(__file__), "--plugin", args.plugin,
          "--protocol", args.protocol, "--role"]
    prefill = subprocess.Popen(me + ["prefill"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    decode = None
    try:
        handshake = read_line(prefill, "handshake")
        decode = subprocess.Popen(me + ["decode"], stdin=subprocess.PIPE, text=True)
        decode.stdin.write(handshake)
        decode.stdin.flush()
        read_line(prefill, "report of freed blocks")
        decode.stdin.close()  # decode leaves first, then prefill: no one loses a peer midway
        rc_decode = decode.wait(TIMEOUT_S)
        prefill.stdin.close()
        rc_prefill = prefill.wait(TIMEOUT_S)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    finally:
        for proc in (prefill, decode):
            if proc and proc.poll() is None:
                proc.kill()  # by its PID
                proc.wait()
        prefill.stdout.close()
    ok = rc_prefill == 0 and rc_decode == 0
    print(f"{'OK' if ok else 'FAIL'}: prefill exit {rc_prefill}, decode exit {rc_decode}",
          file=sys.stderr)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plugin", default=default_plugin())
    ap.add_argument("--protocol", default="auto")
    ap.add_argument("--role", choices=("prefill", "decode"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "prefill":
        return run_prefill(args)
    if args.role == "decode":
        return run_decode(args)
    return run_both(args)


if __name__ == "__main__":
    sys.exit(main())
