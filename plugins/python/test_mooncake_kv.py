"""Tests of the Python binding (mooncake_kv.py) against the real plugin.

Run: MC_BUILD_DIR=build python3 plugins/python/test_mooncake_kv.py [-v] [Test.name]
(the plugin is $MC_BUILD_DIR/lib/libmooncake_kv.so; exit 77 when it is absent).
"""

import ctypes
import hashlib
import json
import mmap
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import mooncake_kv as kv  # noqa: E402

BUILD_DIR = os.environ.get("MC_BUILD_DIR", "build")
PLUGIN_PATH = os.path.abspath(os.path.join(BUILD_DIR, "lib", "libmooncake_kv.so"))
LISTEN = "127.0.0.1:0"
KiB, MiB = 1 << 10, 1 << 20


def setUpModule():
    if not os.path.exists(PLUGIN_PATH):
        raise unittest.SkipTest(f"{PLUGIN_PATH} is not built")


def rand(n, seed):
    return random.Random(seed).randbytes(n)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def scatter(n_blocks, seed):
    """A permutation of block ids: scattered, so neighbours are not merged into one range."""
    ids = list(range(n_blocks))
    random.Random(seed).shuffle(ids)
    return ids


def wait_notifs(agent, count, timeout=10.0, on_each=None):
    """Collect count notifications (calling on_each(n) as each is seen) or fail."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < count:
        for n in agent.get_notifs():
            if on_each:
                on_each(n)
            got.append(n)
        if len(got) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{agent.name}: {len(got)} of {count} notifications "
                                     f"after {timeout} s: {got!r}")
            time.sleep(0.0005)
    return got


def libc_path():
    """The path of the C library this process runs with (a .so that is not a plugin)."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/libc.so" in path or "/libc-" in path:
                return path
    raise unittest.SkipTest("libc's path not found in /proc/self/maps")


class Fixture(unittest.TestCase):
    """Agents closed at the end of each test."""

    @classmethod
    def setUpClass(cls):
        cls.plugin = kv.Plugin(PLUGIN_PATH)

    def agent(self, name, **options):
        options.setdefault("LISTEN", LISTEN)
        options.setdefault("LOG_LEVEL", "error")  # teardown of connected pairs warns
        a = kv.Agent(self.plugin, name, **options)
        self.addCleanup(a.close)
        return a

    def pair(self, size, **options):
        """Agents A and B that know each other; B's region of size bytes loaded into A."""
        a, b = self.agent("A", **options), self.agent("B", **options)
        a.load_remote("B", b.conn_info())
        b.load_remote("A", a.conn_info())
        self.abuf, self.bbuf = bytearray(size), bytearray(size)
        self.la, self.rb = a.register(self.abuf), b.register(self.bbuf)
        self.rmd = a.load_remote_md("B", self.rb.public_data())
        return a, b

    def block_descs(self, region, ids, block, addr=None):
        base = region.addr if addr is None else addr
        return [(base + i * block, block, region) for i in ids]


class LoadTest(Fixture):
    def test_load_by_path(self):
        p = kv.Plugin(PLUGIN_PATH)
        self.assertEqual(p.name, "mooncake")
        self.assertRegex(p.version, r"^\d+\.\d+\.\d+")
        self.assertEqual(p.abi[0], kv.ABI_MAJOR)
        self.assertGreaterEqual(p.abi[1], kv.ABI_MINOR)
        self.assertIn(kv.DRAM, p.mem_types)
        keys = {o.key: o for o in p.options}
        for k in ("LISTEN", "PROTOCOL", "SLICE_SIZE", "METADATA"):
            self.assertIn(k, keys)
        self.assertEqual(keys["METADATA"].default, "none")
        self.assertTrue(all(o.help for o in p.options))

    def test_load_by_name(self):
        with mock.patch.dict(os.environ,
                             {"MC_PLUGIN_DIR": "/nonexistent:" + os.path.dirname(PLUGIN_PATH)}):
            p = kv.Plugin("mooncake_kv")
        self.assertEqual(os.path.realpath(p.path), os.path.realpath(PLUGIN_PATH))
        self.assertEqual(p.name, "mooncake")

    def test_missing_path(self):
        with self.assertRaises(kv.LoadError) as cm:
            kv.Plugin("/nonexistent/dir/libmooncake_kv.so")
        self.assertEqual(str(cm.exception),
                         "/nonexistent/dir/libmooncake_kv.so: No such file or directory")

    def test_missing_name(self):
        with tempfile.TemporaryDirectory() as d:
            with mock.patch.dict(os.environ, {"MC_PLUGIN_DIR": d}), \
                    self.assertRaises(kv.LoadError) as cm:
                kv.Plugin("no_such_kv_plugin")
            self.assertIn("libno_such_kv_plugin.so: not found in MC_PLUGIN_DIR", str(cm.exception))
            self.assertIn(d, str(cm.exception))

    def test_not_a_plugin(self):
        path = libc_path()
        with self.assertRaises(kv.LoadError) as cm:
            kv.Plugin(path)
        self.assertEqual(str(cm.exception),
                         f"{path}: not a KV plugin: no symbol mc_kv_plugin_init")

    def test_abi_refused(self):
        for major, minor in ((2, 0), (1, 0xfffe)):
            with mock.patch.object(kv, "ABI_CURRENT", kv.abi_version(major, minor)), \
                    self.assertRaises(kv.LoadError) as cm:
                kv.Plugin(PLUGIN_PATH)
            self.assertTrue(str(cm.exception).startswith(
                f"{PLUGIN_PATH}: refused this host (ABI {major}.{minor}): "), str(cm.exception))
            self.assertNotIn("no reason given", str(cm.exception))

    def test_not_a_library(self):
        with tempfile.NamedTemporaryFile(suffix=".so") as f:
            f.write(b"not an ELF file")
            f.flush()
            with self.assertRaises(kv.LoadError) as cm:
                kv.Plugin(f.name)
            self.assertIn(f"{f.name}: cannot be loaded", str(cm.exception))

    def test_bad_option_key(self):
        with self.assertRaises(kv.KVError) as cm:
            kv.Agent(self.plugin, "bad", LISTEN=LISTEN, NO_SUCH_OPTION="1")
        self.assertEqual(cm.exception.status, kv.ERR_INVALID_PARAM)
        self.assertEqual(cm.exception.status_name, "ERR_INVALID_PARAM")
        self.assertIn("NO_SUCH_OPTION", cm.exception.message)

    def test_bad_option_value(self):
        with self.assertRaises(kv.KVError) as cm:
            kv.Agent(self.plugin, "bad", LISTEN=LISTEN, PROTOCOL="carrier-pigeon")
        self.assertEqual(cm.exception.status, kv.ERR_INVALID_PARAM)
        self.assertIn("PROTOCOL", cm.exception.message)

    def test_status_names(self):
        self.assertEqual(kv.status_name(kv.ERR_REMOTE_DISCONNECT), "ERR_REMOTE_DISCONNECT")
        self.assertEqual(kv.status_name(kv.IN_PROG), "IN_PROG")
        self.assertEqual(kv.status_name(42), "UNKNOWN_STATUS")


class TwoAgentTest(Fixture):
    BLOCK = 16 * KiB
    BLOCKS = 64

    def test_caps_and_closed(self):
        a = self.agent("A")
        c = a.caps()
        self.assertTrue(c.supports_remote and c.supports_local and c.supports_notif)
        self.assertIn(kv.DRAM, c.mem_types)
        a.close()
        with self.assertRaises(ValueError):
            a.conn_info()

    def test_write_scattered(self):
        a, b = self.pair(self.BLOCK * self.BLOCKS)
        self.abuf[:] = rand(len(self.abuf), 1)
        src, dst = scatter(self.BLOCKS, 2)[:40], scatter(self.BLOCKS, 3)[:40]
        with a.prepare(kv.WRITE, self.block_descs(self.la, src, self.BLOCK),
                       self.block_descs(self.rmd, dst, self.BLOCK, self.rb.addr), "B") as x:
            self.assertIn(x.post(), (kv.IN_PROG, kv.SUCCESS))
            self.assertEqual(x.wait(10), kv.SUCCESS)
        expect = bytearray(len(self.bbuf))
        for s, d in zip(src, dst):
            expect[d * self.BLOCK:(d + 1) * self.BLOCK] = \
                self.abuf[s * self.BLOCK:(s + 1) * self.BLOCK]
        self.assertEqual(self.bbuf, expect)

    def test_read_scattered(self):
        a, b = self.pair(self.BLOCK * self.BLOCKS)
        self.bbuf[:] = rand(len(self.bbuf), 4)
        self.abuf[:] = bytes(len(self.abuf))
        src, dst = scatter(self.BLOCKS, 5)[:50], scatter(self.BLOCKS, 6)[:50]
        with a.prepare(kv.READ, self.block_descs(self.la, dst, self.BLOCK),
                       self.block_descs(self.rmd, src, self.BLOCK, self.rb.addr), "B") as x:
            x.post()
            x.wait(10)
        expect = bytearray(len(self.abuf))
        for s, d in zip(src, dst):
            expect[d * self.BLOCK:(d + 1) * self.BLOCK] = \
                self.bbuf[s * self.BLOCK:(s + 1) * self.BLOCK]
        self.assertEqual(self.abuf, expect)

    def test_notif_arrives_after_data(self):
        size = 32 * MiB  # large enough that an early notification would be seen early
        a, b = self.pair(size)
        block = 256 * KiB
        ids = scatter(size // block, 7)
        x = a.prepare(kv.WRITE, self.block_descs(self.la, range(len(ids)), block),
                      self.block_descs(self.rmd, ids, block, self.rb.addr), "B")
        self.addCleanup(x.release)
        for round_ in range(3):
            self.abuf[:] = rand(size, 100 + round_)
            expect = bytearray(size)
            for s, d in enumerate(ids):
                expect[d * block:(d + 1) * block] = self.abuf[s * block:(s + 1) * block]
            msg = f"req-{round_}:0".encode()
            seen = []

            def on_notif(n):  # the data must be there when the notification is
                seen.append(n)
                self.assertEqual(n, ("A", msg))
                self.assertTrue(self.bbuf == expect,
                                f"round {round_}: notification before the data")

            x.post(msg)
            wait_notifs(b, 1, 20, on_notif)
            self.assertEqual(x.wait(10), kv.SUCCESS)
        self.assertEqual(b.get_notifs(), [])

    def test_notify_standalone_in_order(self):
        a, b = self.pair(4096)
        msgs = [f"msg {i}".encode() * (i + 1) for i in range(20)]
        for m in msgs:
            a.notify("B", m)
        a.notify("B", "text")
        big = rand(kv.NOTIF_MAX, 8)
        a.notify("B", big)
        got = wait_notifs(b, len(msgs) + 2)
        self.assertEqual(got, [("A", m) for m in msgs] + [("A", b"text"), ("A", big)])
        b.notify("A", b"back")
        self.assertEqual(wait_notifs(a, 1), [("B", b"back")])

    def test_notif_refused_keeps_the_rest(self):
        """A notification the plugin refuses (another instance that says it is B) raises, but
        never takes with it the ones popped before it in the same call."""
        a, b = self.pair(4096)
        impostor = self.agent("B")
        impostor.load_remote("A", a.conn_info())
        b.notify("A", b"one")
        b.notify("A", b"two")
        time.sleep(0.3)  # (so that the refused one comes between, as a rule)
        impostor.notify("A", b"spoof")
        time.sleep(0.3)
        b.notify("A", b"three")
        got, refused, deadline = [], [], time.monotonic() + 10
        while (len(got) < 3 or not refused) and time.monotonic() < deadline:
            try:
                got += a.get_notifs()
            except kv.KVError as e:
                refused.append(e.status)
            time.sleep(0.001)
        self.assertEqual(got, [("B", b"one"), ("B", b"two"), ("B", b"three")])
        self.assertEqual(refused, [kv.ERR_MISMATCH])
        self.assertEqual(a.get_notifs(), [])

    def test_notify_unknown_agent(self):
        a = self.agent("A")
        with self.assertRaises(kv.KVError) as cm:
            a.notify("nobody", b"x")
        self.assertEqual(cm.exception.status, kv.ERR_NOT_FOUND)

    def big_transfer(self, size=64 * MiB):
        """A, B over tcp and a WRITE of size bytes in 1 MiB blocks: still in flight for a while
        after post."""
        a, b = self.pair(size, PROTOCOL="tcp")
        n = size // MiB
        x = a.prepare(kv.WRITE, self.block_descs(self.la, range(n), MiB),
                      self.block_descs(self.rmd, scatter(n, 9), MiB, self.rb.addr), "B")
        return a, b, x

    def test_repost_rules(self):
        a, b, x = self.big_transfer()
        with x:
            with self.assertRaises(kv.KVError) as cm:
                x.check()
            self.assertEqual(cm.exception.status, kv.ERR_NOT_POSTED)
            self.assertEqual(x.post(b"first"), kv.IN_PROG)
            with self.assertRaises(kv.KVError) as cm:
                x.post(b"second")
            self.assertEqual(cm.exception.status, kv.ERR_REPOST_ACTIVE)
            self.assertEqual(x.wait(30), kv.SUCCESS)
            self.assertEqual(x.check(), kv.SUCCESS)
            # A finished transfer may be posted again, and its new data lands.
            self.abuf[:MiB] = rand(MiB, 10)
            self.assertIn(x.post(b"third"), (kv.IN_PROG, kv.SUCCESS))
            x.wait(30)
            first = scatter(len(self.abuf) // MiB, 9)[0]
            self.assertEqual(self.bbuf[first * MiB:(first + 1) * MiB], self.abuf[:MiB])
            self.assertEqual(wait_notifs(b, 2), [("A", b"first"), ("A", b"third")])

    def test_release_in_flight(self):
        a, b, x = self.big_transfer()
        self.assertEqual(x.post(b"dropped"), kv.IN_PROG)
        x.release()
        x.release()  # a second release is a no-op in the binding
        with self.assertRaises(ValueError):
            x.check()
        # Notifications of one sender are in order: once the marker is in, a notification of
        # the released transfer would have been too.
        a.notify("B", b"marker")
        self.assertEqual(wait_notifs(b, 1), [("A", b"marker")])
        time.sleep(0.2)
        self.assertEqual(b.get_notifs(), [])
        # The regions are free again and the agents still work.
        self.rmd.unload()
        self.rb.deregister()
        self.bbuf[:] = bytes(len(self.bbuf))
        rb = b.register(self.bbuf)
        rmd = a.load_remote_md("B", rb.public_data())
        self.abuf[:4096] = rand(4096, 11)
        with a.prepare(kv.WRITE, [(self.la.addr, 4096, self.la)], [(rb.addr, 4096, rmd)],
                       "B") as y:
            y.post(b"after")
            y.wait(10)
        self.assertEqual(self.bbuf[:4096], self.abuf[:4096])
        self.assertEqual(wait_notifs(b, 1), [("A", b"after")])

    def test_deregister_in_use(self):
        a, b = self.pair(64 * KiB)
        x = a.prepare(kv.WRITE, [self.la.desc(0, 4096)], [(self.rb.addr, 4096, self.rmd)], "B")
        with self.assertRaises(kv.KVError) as cm:
            self.la.deregister()
        self.assertEqual(cm.exception.status, kv.ERR_NOT_ALLOWED)
        with self.assertRaises(kv.KVError) as cm:
            self.rmd.unload()
        self.assertEqual(cm.exception.status, kv.ERR_NOT_ALLOWED)
        x.release()
        self.rmd.unload()
        self.la.deregister()
        self.abuf.extend(b"x")  # the buffer is no longer pinned

    def test_loopback(self):
        a = self.agent("A")
        buf = bytearray(rand(256 * KiB, 12)) + bytearray(256 * KiB)
        with a.register(buf) as r, a.load_local(r) as view:
            ids = scatter(64, 13)
            with a.prepare(kv.WRITE, [r.desc(i * 4096, 4096) for i in range(64)],
                           [(r.addr + 256 * KiB + d * 4096, 4096, view) for d in ids],
                           "A") as x:
                x.post(b"self")
                x.wait(10)
            for i, d in enumerate(ids):
                lo = 256 * KiB + d * 4096
                self.assertEqual(buf[lo:lo + 4096], buf[i * 4096:(i + 1) * 4096])
            self.assertEqual(wait_notifs(a, 1), [("A", b"self")])

    def test_file(self):
        a = self.agent("A")
        data = rand(64 * 4096, 14)
        buf = bytearray(64 * 4096)
        with tempfile.TemporaryFile() as f:
            f.write(data)
            f.flush()
            f.seek(100)
            with a.register_file(f, offset=4096) as fr, a.register(buf) as r, \
                    a.load_local(fr) as view:
                self.assertEqual((fr.addr, fr.len), (4096, 63 * 4096))
                self.assertEqual(f.tell(), 100)  # the host's reads go on where they were
                self.assertEqual(os.lseek(f.fileno(), 0, os.SEEK_CUR), 100)
                ids = scatter(63, 15)
                with a.prepare(kv.READ, [r.desc(i * 4096, 4096) for i in range(63)],
                               [(4096 + d * 4096, 4096, view) for d in ids], "A") as x:
                    x.post()
                    x.wait(10)
                for i, d in enumerate(ids):
                    lo = (d + 1) * 4096
                    self.assertEqual(buf[i * 4096:(i + 1) * 4096], data[lo:lo + 4096])
                buf[:4096] = rand(4096, 16)
                with a.prepare(kv.WRITE, [r.desc(0, 4096)], [(4096 + 8192, 4096, view)], "A") as x:
                    x.post()
                    x.wait(10)
                self.assertEqual(os.pread(f.fileno(), 4096, 4096 + 8192), buf[:4096])
        with self.assertRaises(kv.KVError) as cm:
            a.register(0, 4096, kv.FILE, dev_id=1 << 30)
        self.assertEqual(cm.exception.status, kv.ERR_INVALID_PARAM)
        self.assertIn("not an open file descriptor", str(cm.exception))

    def test_register_kinds(self):
        a = self.agent("A")
        carr = (ctypes.c_char * 8192)()
        mm = mmap.mmap(-1, 8192)
        self.addCleanup(mm.close)
        for obj, length, size in ((bytearray(8192), None, 8192), (memoryview(bytearray(8192)),
                                  4096, 4096), (carr, None, 8192), (mm, None, 8192),
                                  (ctypes.addressof(carr), 8192, 8192)):
            with a.register(obj, length) as r:
                self.assertEqual(r.len, size)
                self.assertLessEqual(len(r.public_data()), kv.PUBLIC_MAX)
        with self.assertRaises(ValueError):
            a.register(b"read-only bytes")
        with self.assertRaises(ValueError):
            a.register(12345)
        with self.assertRaises(TypeError):
            a.register("a string")

    def test_remote_errors(self):
        a, b = self.pair(4096)
        with self.assertRaises(kv.KVError) as cm:
            a.load_remote_md("C", self.rb.public_data())
        self.assertEqual(cm.exception.status, kv.ERR_NOT_FOUND)
        with self.assertRaises(kv.KVError) as cm:
            a.load_remote("C", b.conn_info())
        self.assertEqual(cm.exception.status, kv.ERR_MISMATCH)
        a.connect("B")
        with self.assertRaises(kv.KVError) as cm:
            a.disconnect("B")  # B's region is still loaded
        self.assertEqual(cm.exception.status, kv.ERR_NOT_ALLOWED)
        with self.assertRaises(kv.KVError) as cm:  # outside B's region
            a.prepare(kv.WRITE, [self.la.desc(0, 4096)], [(self.rb.addr + 4096, 4096,
                                                           self.rmd)], "B")
        self.assertEqual(cm.exception.status, kv.ERR_INVALID_PARAM)
        self.assertTrue(cm.exception.message)
        with self.assertRaises(ValueError):
            a.prepare(kv.WRITE, [self.la.desc(0, 4096)], [], "B")
        with self.assertRaises(TypeError):
            a.prepare(kv.WRITE, [self.la.desc(0, 4096)], [(self.rb.addr, 4096, self.la)], "B")

    def test_100k_descriptors(self):
        n, blk = 100_000, 64
        a, b = self.pair(n * blk)
        self.abuf[:] = rand(n * blk, 14)
        perm = scatter(n, 15)
        local = [(self.la.addr + i * blk, blk, self.la) for i in range(n)]
        remote = [(self.rb.addr + p * blk, blk, self.rmd) for p in perm]
        t0 = time.perf_counter()
        x = a.prepare(kv.WRITE, local, remote, "B")
        prep_s = time.perf_counter() - t0
        with x:
            x.post()
            x.wait(60)
        expect = bytearray(n * blk)
        for i, p in enumerate(perm):
            expect[p * blk:(p + 1) * blk] = self.abuf[i * blk:(i + 1) * blk]
        self.assertEqual(self.bbuf, expect)
        # And back: READ every block into a second local region at its original place.
        back = bytearray(n * blk)
        with a.register(back) as lb:
            local2 = [(lb.addr + i * blk, blk, lb) for i in range(n)]
            with a.prepare(kv.READ, local2, remote, "B") as y:
                y.post()
                y.wait(60)
        self.assertEqual(back, self.abuf)
        print(f"\n  100000 descriptors: prepare {prep_s * 1e3:.0f} ms", file=sys.stderr)
        self.assertLess(prep_s, 5.0)


# A peer in another process: JSON lines on stdin/stdout.
PEER = r"""
import hashlib, json, os, random, sys, time
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])
import mooncake_kv as kv
plugin, name, proto, size, seed = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), \
    int(sys.argv[6])
a = kv.Agent(plugin, name, LISTEN="127.0.0.1:0", PROTOCOL=proto, LOG_LEVEL="error")
buf = bytearray(random.Random(seed).randbytes(size) if seed else size)
r = a.register(buf)
def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()
say(pid=os.getpid(), conn=a.conn_info().hex(), md=r.public_data().hex(), addr=r.addr)
for line in sys.stdin:
    c = json.loads(line)
    try:
        if c["cmd"] == "load":
            a.load_remote(c["agent"], bytes.fromhex(c["conn"]))
            say(ok=True)
        elif c["cmd"] == "wait_notif":  # the buffer's digest as the notification is seen
            deadline = time.monotonic() + c["timeout"]
            got = []
            while not got and time.monotonic() < deadline:
                got = a.get_notifs()
                time.sleep(0 if got else 0.0005)
            say(notifs=[[s, m.hex()] for s, m in got], sha=hashlib.sha256(buf).hexdigest())
        elif c["cmd"] == "notify":
            a.notify(c["agent"], bytes.fromhex(c["msg"]))
            say(ok=True)
        elif c["cmd"] == "quit":
            r.close()
            a.close()
            say(ok=True)
            break
    except kv.KVError as e:
        say(error=str(e))
"""


class Peer:
    """A peer agent in a child process, driven over its stdin/stdout."""

    def __init__(self, test, name, proto, size, seed):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PEER, HERE, PLUGIN_PATH, name, proto, str(size), str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        test.addCleanup(self.stop)
        self.hello = self.read(30)

    def read(self, timeout=10):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise AssertionError(f"peer {self.proc.pid}: no answer in {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"peer {self.proc.pid} exited ({self.proc.wait(5)})")
        reply = json.loads(line)
        if "error" in reply:
            raise AssertionError(f"peer: {reply['error']}")
        return reply

    def ask(self, wait_s=10, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read(wait_s)

    def kill(self):
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc.poll() is None:
            self.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()


class PeerProcessTest(Fixture):
    def connect_peer(self, proto, size, seed):
        host = self.agent("host", PROTOCOL=proto)
        peer = Peer(self, "peer", proto, size, seed)
        host.load_remote("peer", bytes.fromhex(peer.hello["conn"]))
        self.assertEqual(peer.ask(cmd="load", agent="host", conn=host.conn_info().hex()),
                         {"ok": True})
        rmd = host.load_remote_md("peer", bytes.fromhex(peer.hello["md"]))
        return host, peer, rmd

    def test_peer_process(self):
        for proto in ("tcp", "auto"):
            with self.subTest(protocol=proto):
                self.peer_round(proto)

    def peer_round(self, proto):
        size, blk = 4 * MiB, 32 * KiB
        host, peer, rmd = self.connect_peer(proto, size, seed=21)
        peer_data = bytearray(rand(size, 21))
        buf = bytearray(size)
        ra = peer.hello["addr"]
        with host.register(buf) as lr:
            n = size // blk
            src, dst = scatter(n, 22), scatter(n, 23)
            # READ the peer's blocks to scattered places here.
            with host.prepare(kv.READ, [(lr.addr + d * blk, blk, lr) for d in dst],
                              [(ra + s * blk, blk, rmd) for s in src], "peer") as x:
                x.post()
                x.wait(30)
            for s, d in zip(src, dst):
                self.assertEqual(buf[d * blk:(d + 1) * blk], peer_data[s * blk:(s + 1) * blk])
            # WRITE new blocks there with a notification; the peer digests its memory as soon
            # as the notification shows.
            buf[:] = rand(size, 24)
            half = src[:n // 2]
            with host.prepare(kv.WRITE, [(lr.addr + i * blk, blk, lr) for i in range(len(half))],
                              [(ra + s * blk, blk, rmd) for s in half], "peer") as x:
                x.post(b"req-9:0")
                got = peer.ask(30, cmd="wait_notif", timeout=20)
                x.wait(30)
            for i, s in enumerate(half):
                peer_data[s * blk:(s + 1) * blk] = buf[i * blk:(i + 1) * blk]
            self.assertEqual(got["notifs"], [["host", b"req-9:0".hex()]])
            self.assertEqual(got["sha"], sha(peer_data), "peer memory differs at the notif")
            host.notify("peer", b"standalone")
            self.assertEqual(peer.ask(cmd="wait_notif", timeout=10)["notifs"],
                             [["host", b"standalone".hex()]])
            self.assertEqual(peer.ask(cmd="notify", agent="host", msg=b"from-peer".hex()),
                             {"ok": True})
            self.assertEqual(wait_notifs(host, 1), [("peer", b"from-peer")])
        rmd.unload()
        self.assertEqual(peer.ask(cmd="quit"), {"ok": True})
        self.assertEqual(peer.proc.wait(10), 0)
        host.disconnect("peer")
        host.close()

    def test_peer_killed_mid_transfer(self):
        size = 128 * MiB
        host, peer, rmd = self.connect_peer("tcp", size, seed=0)
        buf = bytearray(size)
        lr = host.register(buf)
        n = size // MiB
        ra = peer.hello["addr"]
        x = host.prepare(kv.WRITE, [(lr.addr + i * MiB, MiB, lr) for i in range(n)],
                         [(ra + s * MiB, MiB, rmd) for s in scatter(n, 31)], "peer")
        self.addCleanup(x.release)
        self.assertEqual(x.post(), kv.IN_PROG)
        self.assertEqual(x.check(), kv.IN_PROG, "finished before the kill: make it larger")
        t0 = time.monotonic()
        peer.kill()
        with self.assertRaises(kv.KVError) as cm:
            x.wait(20)
        took = time.monotonic() - t0
        self.assertEqual(cm.exception.status, kv.ERR_REMOTE_DISCONNECT, str(cm.exception))
        self.assertLess(took, 10.0)
        print(f"\n  peer killed: {cm.exception.status_name} after {took:.2f} s "
              f"({cm.exception.message})", file=sys.stderr)


if __name__ == "__main__":
    if not os.path.exists(PLUGIN_PATH):
        print(f"SKIP: {PLUGIN_PATH} is not built (set MC_BUILD_DIR)", file=sys.stderr)
        sys.exit(77)
    unittest.main()
