"""A KV cache offload tier on the Mooncake KV plugin: blocks of finished requests are spilled
from the KV pool in memory to a file (the plugin's FILE regions: a file descriptor, offsets in
the file), their memory is reused, and a later request with the same prefix loads them back
into other blocks of the pool, as a prefix cache with a disk tier does.

  spill: one WRITE per request, every layer's blocks scattered in the pool -> free slots of the
         file, also scattered (what a paged allocator and a slot map give)
  load:  one READ per request, file slots -> fresh pool blocks; every byte is checked

Usage: python3 kv_offload_example.py [--plugin PATH|NAME] [--file PATH] [--layers N]
The plugin defaults to $MC_BUILD_DIR/lib/libmooncake_kv.so when MC_BUILD_DIR is set, else the
name "mooncake_kv" (looked up in MC_PLUGIN_DIR). The file defaults to a temporary one in
$TMPDIR, removed at the end; --file PATH is created or truncated and kept. Exit 0 on success, 1
on failure, 77 when the plugin cannot be loaded.
"""

import argparse
import mmap
import os
import random
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mooncake_kv as kv  # noqa: E402

BLOCK_BYTES = 16 * 1024  # one block of one layer
POOL_BLOCKS = 512        # blocks per layer in memory
FILE_SLOTS = 1024        # block slots per layer in the file
# Finished requests and the blocks (per layer) their KV cache fills.
REQUESTS = {"req-0": 96, "req-1": 40, "req-2": 128, "req-3": 64, "req-4": 16}


def block_content(layer, req_id, j):
    """Block j of a request in a layer: known to the checker by construction."""
    return random.Random(f"{layer}/{req_id}/{j}").randbytes(BLOCK_BYTES)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    build = os.environ.get("MC_BUILD_DIR")
    ap.add_argument("--plugin", default=os.path.join(build, "lib", "libmooncake_kv.so")
                    if build else "mooncake_kv")
    ap.add_argument("--file", help="the offload file (default: a temporary one)")
    ap.add_argument("--layers", type=int, default=4)
    return ap.parse_args()


class Tier:
    """The pool in memory, the file, and which slots hold what."""

    def __init__(self, agent, f, layers):
        self.layers = layers
        self.layer_bytes = POOL_BLOCKS * BLOCK_BYTES
        self.slot_layer_bytes = FILE_SLOTS * BLOCK_BYTES
        self.pool = mmap.mmap(-1, layers * self.layer_bytes)  # page-aligned: O_DIRECT I/O
        os.ftruncate(f.fileno(), layers * self.slot_layer_bytes)
        self.mem = agent.register(self.pool)
        self.file = agent.register_file(f)
        self.view = agent.load_local(self.file)  # the file as the instance's own "remote"
        self.free_blocks = list(range(POOL_BLOCKS))
        self.free_slots = list(range(FILE_SLOTS))
        random.Random(1).shuffle(self.free_blocks)
        random.Random(2).shuffle(self.free_slots)

    def close(self):
        self.view.unload()
        self.file.deregister()
        self.mem.deregister()
        self.pool.close()

    def block_off(self, layer, b):
        return layer * self.layer_bytes + b * BLOCK_BYTES

    def slot_off(self, layer, s):
        return layer * self.slot_layer_bytes + s * BLOCK_BYTES

    def descs(self, blocks, slots):
        """(pool descriptors, file descriptors) of every layer of blocks <-> slots."""
        local, remote = [], []
        for layer in range(self.layers):
            for b, s in zip(blocks, slots):
                local.append(self.mem.desc(self.block_off(layer, b), BLOCK_BYTES))
                remote.append((self.slot_off(layer, s), BLOCK_BYTES, self.view))
        return local, remote

    def move(self, agent, op, blocks, slots):
        local, remote = self.descs(blocks, slots)
        t0 = time.perf_counter()
        with agent.prepare(op, local, remote, agent.name) as x:
            x.post()
            x.wait(30)
        return time.perf_counter() - t0


def main():
    args = parse_args()
    try:
        plugin = kv.Plugin(args.plugin)
    except kv.LoadError as e:
        print(f"kv_offload_example: skipped: {e}", file=sys.stderr)
        return 77
    if args.file:
        f = open(args.file, "w+b")
    else:
        f = tempfile.TemporaryFile(dir=os.environ.get("TMPDIR"))
    agent = kv.Agent(plugin, "offload", LOG_LEVEL="error")
    tier = Tier(agent, f, args.layers)
    ok = True
    try:
        spilled = {}
        for req, n in REQUESTS.items():  # compute, then spill and free the blocks
            blocks = [tier.free_blocks.pop() for _ in range(n)]
            for layer in range(tier.layers):
                for j, b in enumerate(blocks):
                    off = tier.block_off(layer, b)
                    tier.pool[off:off + BLOCK_BYTES] = block_content(layer, req, j)
            slots = [tier.free_slots.pop() for _ in range(n)]
            secs = tier.move(agent, kv.WRITE, blocks, slots)
            size = n * tier.layers * BLOCK_BYTES
            print(f"spill: {req}  {n * tier.layers:4d} blocks  {size / 2**20:5.2f} MiB -> file"
                  f"  {secs * 1e3:7.2f} ms  {size / secs / 1e9:5.2f} GB/s", flush=True)
            for layer in range(tier.layers):  # the memory goes to other requests
                for b in blocks:
                    off = tier.block_off(layer, b)
                    tier.pool[off:off + BLOCK_BYTES] = bytes(BLOCK_BYTES)
            tier.free_blocks[:0] = blocks
            spilled[req] = slots
        random.Random(3).shuffle(tier.free_blocks)
        total = 0
        for req, slots in spilled.items():  # prefix hits: load back into other blocks
            n = len(slots)
            blocks = [tier.free_blocks.pop() for _ in range(n)]
            secs = tier.move(agent, kv.READ, blocks, slots)
            bad = sum(tier.pool[tier.block_off(layer, b):tier.block_off(layer, b) + BLOCK_BYTES]
                      != block_content(layer, req, j)
                      for layer in range(tier.layers) for j, b in enumerate(blocks))
            size = n * tier.layers * BLOCK_BYTES
            total += size
            print(f"load:  {req}  {n * tier.layers:4d} blocks  {size / 2**20:5.2f} MiB <- file"
                  f"  {secs * 1e3:7.2f} ms  {size / secs / 1e9:5.2f} GB/s  "
                  f"{'verified' if not bad else f'{bad} BLOCKS WRONG'}", flush=True)
            ok = ok and not bad
            tier.free_blocks[:0] = blocks
        print(f"offload: {len(spilled)} requests, {total / 2**20:.1f} MiB spilled to "
              f"{args.file or 'a temporary file'} and loaded back into other blocks, "
              f"{'every block verified' if ok else 'SOME BLOCKS WRONG'}")
    except kv.KVError as e:
        print(f"kv_offload_example: {e}", file=sys.stderr)
        ok = False
    finally:
        tier.close()
        agent.close()
        f.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
