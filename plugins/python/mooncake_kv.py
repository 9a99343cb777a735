"""Python binding of the Mooncake-C KV backend plugin (include/mooncake/kv_plugin.h).

Standard library only (ctypes). The binding loads the plugin itself, checks its ABI the way the
C loader (plugins/kv_loader.c) does, and wraps the handles in objects:

    plugin = Plugin("mooncake_kv")          # a path, or a name looked up in MC_PLUGIN_DIR
    with Agent(plugin, "prefill", LISTEN="127.0.0.1:0") as a:
        region = a.register(bytearray(1 << 20))
        peer_md = a.load_remote_md("decode", public_data)   # after a.load_remote(...)
        with a.prepare(WRITE, [(region.addr, 4096, region)],
                       [(remote_addr, 4096, peer_md)], "decode") as x:
            x.post(b"req-1:0")
            x.wait(10)

Every failing plugin call raises KVError (status, status_name, and the plugin's last_error text).
Threads: as in the C ABI, register/load/connect/disconnect/get_notifs on one agent are called
from one thread at a time; prepare/post/check/release and notify may run concurrently.
"""

import array
import collections
import ctypes
import fcntl
import itertools
import operator
import os
import stat
import time
import weakref

__all__ = [
    "Plugin", "Agent", "Region", "RemoteRegion", "Transfer", "KVError", "LoadError",
    "status_name", "OptionInfo", "Caps",
]

# ---- constants of the ABI -------------------------------------------------------------------

ABI_MAJOR = 1
ABI_MINOR = 0


def abi_version(major, minor):
    """MC_KV_ABI_VERSION: the 32-bit version a host passes to mc_kv_plugin_init."""
    return (major << 16) | minor


ABI_CURRENT = abi_version(ABI_MAJOR, ABI_MINOR)
INIT_SYMBOL = "mc_kv_plugin_init"

IN_PROG = 1
SUCCESS = 0
ERR_NOT_POSTED = -1
ERR_INVALID_PARAM = -2
ERR_BACKEND = -3
ERR_NOT_FOUND = -4
ERR_MISMATCH = -5
ERR_NOT_ALLOWED = -6
ERR_REPOST_ACTIVE = -7
ERR_UNKNOWN = -8
ERR_NOT_SUPPORTED = -9
ERR_REMOTE_DISCONNECT = -10
ERR_CANCELED = -11

STATUS_NAMES = {
    IN_PROG: "IN_PROG", SUCCESS: "SUCCESS", ERR_NOT_POSTED: "ERR_NOT_POSTED",
    ERR_INVALID_PARAM: "ERR_INVALID_PARAM", ERR_BACKEND: "ERR_BACKEND",
    ERR_NOT_FOUND: "ERR_NOT_FOUND", ERR_MISMATCH: "ERR_MISMATCH",
    ERR_NOT_ALLOWED: "ERR_NOT_ALLOWED", ERR_REPOST_ACTIVE: "ERR_REPOST_ACTIVE",
    ERR_UNKNOWN: "ERR_UNKNOWN", ERR_NOT_SUPPORTED: "ERR_NOT_SUPPORTED",
    ERR_REMOTE_DISCONNECT: "ERR_REMOTE_DISCONNECT", ERR_CANCELED: "ERR_CANCELED",
}

DRAM, VRAM, BLK, OBJ, FILE = 0, 1, 2, 3, 4
MEM_TYPE_NAMES = {DRAM: "DRAM", VRAM: "VRAM", BLK: "BLK", OBJ: "OBJ", FILE: "FILE"}

READ = 0   # remote -> local
WRITE = 1  # local -> remote

AGENT_MAX = 128
NOTIF_MAX = 63 * 1024
PUBLIC_MAX = 256
CONN_MAX = 256


def status_name(status):
    """The name of a status value ("IN_PROG", "ERR_REMOTE_DISCONNECT")."""
    return STATUS_NAMES.get(status, "UNKNOWN_STATUS")


class KVError(Exception):
    """A plugin call failed: .status (int), .status_name, .message (the plugin's last_error)."""

    def __init__(self, status, message, call=""):
        self.status = status
        self.status_name = status_name(status)
        self.message = message
        self.call = call
        where = call + ": " if call else ""
        super().__init__(f"{where}{self.status_name}"
                         + (f": {message}" if message else ""))


class LoadError(OSError):
    """The plugin could not be loaded: .path (the file, or the name looked for), .reason."""

    def __init__(self, path, reason):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


# ---- the C structures, field for field as in kv_plugin.h ----------------------------------------

_status_t = ctypes.c_int  # mc_kv_status_t: an enum with negative values
_handle = ctypes.c_void_p  # mc_kv_backend_t *, mc_kv_md_t *, mc_kv_xfer_t *


class mc_kv_option_t(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("value", ctypes.c_char_p),
                ("help", ctypes.c_char_p)]


class mc_kv_init_t(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("agent", ctypes.c_char_p),
                ("options", ctypes.POINTER(mc_kv_option_t)), ("n_options", ctypes.c_size_t)]


class mc_kv_caps_t(ctypes.Structure):
    _fields_ = [("supports_remote", ctypes.c_int), ("supports_local", ctypes.c_int),
                ("supports_notif", ctypes.c_int), ("mem_types", ctypes.c_uint32)]


class mc_kv_region_t(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint64), ("len", ctypes.c_uint64),
                ("dev_id", ctypes.c_uint64), ("type", ctypes.c_int)]


class mc_kv_desc_t(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint64), ("len", ctypes.c_uint64),
                ("dev_id", ctypes.c_uint64), ("md", _handle)]


class mc_kv_notif_t(ctypes.Structure):
    _fields_ = [("agent", ctypes.c_char * AGENT_MAX), ("len", ctypes.c_size_t),
                ("msg", ctypes.c_ubyte * NOTIF_MAX)]


_F = ctypes.CFUNCTYPE
_sizep = ctypes.POINTER(ctypes.c_size_t)
_handlep = ctypes.POINTER(_handle)
_descp = ctypes.POINTER(mc_kv_desc_t)

# The operations in declaration order: (name, prototype).
_OPS = [
    ("create", _F(_status_t, ctypes.POINTER(mc_kv_init_t), _handlep)),
    ("destroy", _F(None, _handle)),
    ("last_error", _F(ctypes.c_char_p, _handle)),
    ("caps", _F(_status_t, _handle, ctypes.POINTER(mc_kv_caps_t))),
    ("register_mem", _F(_status_t, _handle, ctypes.POINTER(mc_kv_region_t), _handlep)),
    ("deregister_mem", _F(_status_t, _handle, _handle)),
    ("public_data", _F(_status_t, _handle, _handle, ctypes.c_void_p, _sizep)),
    ("conn_info", _F(_status_t, _handle, ctypes.c_void_p, _sizep)),
    ("load_remote_conn_info",
     _F(_status_t, _handle, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)),
    ("connect", _F(_status_t, _handle, ctypes.c_char_p)),
    ("disconnect", _F(_status_t, _handle, ctypes.c_char_p)),
    ("load_remote_md", _F(_status_t, _handle, ctypes.c_char_p, ctypes.c_void_p,
                          ctypes.c_size_t, _handlep)),
    ("load_local_md", _F(_status_t, _handle, _handle, _handlep)),
    ("unload_md", _F(_status_t, _handle, _handle)),
    ("prep_xfer", _F(_status_t, _handle, ctypes.c_int, _descp, _descp, ctypes.c_size_t,
                     ctypes.c_char_p, _handlep)),
    ("post_xfer", _F(_status_t, _handle, _handle, ctypes.c_void_p, ctypes.c_size_t)),
    ("check_xfer", _F(_status_t, _handle, _handle)),
    ("release_xfer", _F(_status_t, _handle, _handle)),
    ("gen_notif", _F(_status_t, _handle, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)),
    ("get_notif", _F(ctypes.c_int, _handle, ctypes.POINTER(mc_kv_notif_t))),
]


class mc_kv_plugin_t(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("abi_major", ctypes.c_uint32), ("abi_minor", ctypes.c_uint32),
        ("name", ctypes.c_char_p), ("version", ctypes.c_char_p),
        ("mem_types", ctypes.c_uint32),
        ("options", ctypes.POINTER(mc_kv_option_t)), ("n_options", ctypes.c_size_t),
    ] + _OPS


_INIT_FN = _F(ctypes.c_void_p, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t)

# Descriptor lists are built as flat arrays of 64-bit words, which needs this exact layout.
_FAST_DESCS = (ctypes.sizeof(mc_kv_desc_t) == 32 and ctypes.sizeof(ctypes.c_void_p) == 8
               and array.array("Q").itemsize == 8)

OptionInfo = collections.namedtuple("OptionInfo", "key default help")
Caps = collections.namedtuple("Caps", "supports_remote supports_local supports_notif mem_types")


def _bits_to_types(mask):
    return frozenset(t for t in range(32) if mask & (1 << t))


def _as_bytes(data, what):
    if isinstance(data, str):
        return data.encode()
    try:
        return bytes(data)
    except TypeError:
        raise TypeError(f"{what} must be bytes-like or str, not {type(data).__name__}") from None


# ---- loading ---------------------------------------------------------------------------------

def _find_by_name(name):
    """lib<name>.so in each directory of MC_PLUGIN_DIR, else what dlopen finds by itself."""
    env = os.environ.get("MC_PLUGIN_DIR", "")
    for d in filter(None, env.split(":")):
        path = os.path.join(d, f"lib{name}.so")
        if os.access(path, os.R_OK):
            return path
    return None


def _dlopen(what):
    """(path, CDLL) for a path or a name; LoadError naming the file otherwise."""
    mode = os.RTLD_NOW | os.RTLD_LOCAL
    if "/" in what:
        if not os.access(what, os.R_OK):
            reason = os.strerror(2) if not os.path.exists(what) else "not readable"
            raise LoadError(what, reason)
        path = what
    else:
        path = _find_by_name(what)
        if path is None:
            # The dynamic loader's own search (LD_LIBRARY_PATH, the system directories).
            try:
                return f"lib{what}.so", ctypes.CDLL(f"lib{what}.so", mode=mode)
            except OSError as e:
                env = os.environ.get("MC_PLUGIN_DIR")
                raise LoadError(f"lib{what}.so", f"not found in MC_PLUGIN_DIR "
                                f"({env if env is not None else 'unset'}) nor by the dynamic "
                                f"loader ({e})") from None
    try:
        return path, ctypes.CDLL(path, mode=mode)
    except OSError as e:
        raise LoadError(path, f"cannot be loaded: {e}") from None


class Plugin:
    """A loaded KV backend plugin: Plugin(path) or Plugin(name), name found via MC_PLUGIN_DIR."""

    def __init__(self, path_or_name="mooncake_kv"):
        self.path, self._dl = _dlopen(os.fspath(path_or_name))
        try:
            init = _INIT_FN((INIT_SYMBOL, self._dl))
        except AttributeError:
            raise LoadError(self.path, f"not a KV plugin: no symbol {INIT_SYMBOL}") from None
        why = ctypes.create_string_buffer(256)
        host = ABI_CURRENT
        ptr = init(host, why, len(why))
        if not ptr:
            raise LoadError(self.path, f"refused this host (ABI {host >> 16}.{host & 0xffff}): "
                            f"{why.value.decode(errors='replace') or 'no reason given'}")
        self._t = ctypes.cast(ptr, ctypes.POINTER(mc_kv_plugin_t)).contents
        self._check_table()
        for name, _ in _OPS:  # fetch each function pointer once
            setattr(self, "_" + name, getattr(self._t, name))

    def _check_table(self):
        t = self._t
        if t.abi_major != ABI_MAJOR:
            raise LoadError(self.path, f"plugin ABI {t.abi_major}.{t.abi_minor}, this host "
                            f"speaks major {ABI_MAJOR}")
        if t.abi_minor < ABI_MINOR or t.size < ctypes.sizeof(mc_kv_plugin_t):
            raise LoadError(self.path, f"plugin ABI {t.abi_major}.{t.abi_minor} (table of "
                            f"{t.size} bytes) is older than this host's "
                            f"{ABI_MAJOR}.{ABI_MINOR}")
        for name, _ in _OPS:
            if not getattr(t, name):
                raise LoadError(self.path, f"the plugin's table has no {name} operation")

    @property
    def name(self):
        return self._t.name.decode() if self._t.name else ""

    @property
    def version(self):
        return self._t.version.decode() if self._t.version else ""

    @property
    def abi(self):
        """(major, minor) of the plugin's table."""
        return (self._t.abi_major, self._t.abi_minor)

    @property
    def options(self):
        """The options an Agent takes: a list of OptionInfo(key, default, help)."""
        out = []
        for i in range(self._t.n_options):
            o = self._t.options[i]
            out.append(OptionInfo(*((s or b"").decode() for s in (o.key, o.value, o.help))))
        return out

    @property
    def mem_types(self):
        """The memory types the plugin handles at all (a frozenset of DRAM, VRAM, ...)."""
        return _bits_to_types(self._t.mem_types)

    def __repr__(self):
        return f"<Plugin {self.name} {self.version} ABI {self.abi[0]}.{self.abi[1]} {self.path}>"


# ---- an instance -----------------------------------------------------------------------------

class _Child:
    """Something an Agent owns (region, remote region, transfer): dies with the agent."""

    _h = None

    def _live(self):
        if self._h is None:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._h

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass  # garbage collection: nowhere to report to


class Agent:
    """One instance of the plugin (one transfer engine) with an agent name.

    Agent(plugin, "name", LISTEN="127.0.0.1:0", PROTOCOL="tcp"): option values become strings.
    plugin may be a Plugin or what Plugin() takes. close() destroys the instance.
    """

    def __init__(self, plugin, name, **options):
        self._h = None
        self.plugin = plugin if isinstance(plugin, Plugin) else Plugin(plugin)
        self.name = name
        self._children = weakref.WeakSet()
        self._notif = None
        self._notif_error = None  # get_notif's error behind notifications already returned
        opts = (mc_kv_option_t * max(len(options), 1))()
        keep = []
        for i, (k, v) in enumerate(options.items()):
            if isinstance(v, bool):
                v = int(v)
            keep += [str(k).encode(), str(v).encode()]
            opts[i].key, opts[i].value = keep[-2], keep[-1]
        init = mc_kv_init_t(ctypes.sizeof(mc_kv_init_t), name.encode(), opts, len(options))
        h = _handle()
        st = self.plugin._create(ctypes.byref(init), ctypes.byref(h))
        if st != SUCCESS:
            msg = self.plugin._last_error(None)
            raise KVError(st, (msg or b"").decode(errors="replace"), f"create agent {name!r}")
        self._h = h.value

    # -- plumbing
    def _call(self, what, st, ok=(SUCCESS,)):
        if st not in ok:
            raise KVError(st, self.last_error(), what)
        return st

    def _live(self):
        if self._h is None:
            raise ValueError(f"agent {self.name!r} is closed")
        return self._h

    def last_error(self):
        """The plugin's message for the last failure on this agent."""
        if self._h is None:
            return ""
        return (self.plugin._last_error(self._h) or b"").decode(errors="replace")

    def close(self):
        """Destroy the instance; every region, remote region and transfer of it is closed."""
        if self._h is None:
            return
        children = list(self._children)
        for c in children:
            c._h = None  # their handles die with the instance
        h, self._h = self._h, None
        self.plugin._destroy(h)
        for c in children:
            c._keep = None  # only now may the memory go

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return f"<Agent {self.name!r}{' closed' if self._h is None else ''}>"

    # -- information
    def caps(self):
        c = mc_kv_caps_t()
        self._call("caps", self.plugin._caps(self._live(), ctypes.byref(c)))
        return Caps(bool(c.supports_remote), bool(c.supports_local), bool(c.supports_notif),
                    _bits_to_types(c.mem_types))

    def _sized(self, what, fn, room):
        """Call a public_data/conn_info style function, growing the buffer if told to."""
        for _ in range(2):
            buf = ctypes.create_string_buffer(room)
            n = ctypes.c_size_t(room)
            st = fn(buf, ctypes.byref(n))
            if st == ERR_INVALID_PARAM and n.value > room:
                room = n.value
                continue
            self._call(what, st)
            return buf.raw[:n.value]
        raise KVError(ERR_INVALID_PARAM, f"the plugin asked for {room} bytes twice", what)

    def conn_info(self):
        """This agent's connection info (bytes) for peers' load_remote()."""
        h = self._live()
        return self._sized("conn_info", lambda b, n: self.plugin._conn_info(h, b, n), CONN_MAX)

    # -- memory
    def register(self, buffer_or_addr, length=None, mem_type=DRAM, dev_id=0):
        """Register memory: a writable buffer (bytearray, memoryview, ctypes object, mmap) or
        an int address with length. The Region keeps the buffer alive until deregistered."""
        return Region(self, buffer_or_addr, length, mem_type, dev_id)

    def register_file(self, file, offset=0, length=0):
        """Register a file (an open file object or descriptor, which must stay open until the
        Region is deregistered) from offset, length bytes (0: to its end): the FILE type.
        Descriptors name offsets in the file: region.desc(k, n) is n bytes at offset + k, and
        (offset + k, n, view) those bytes through load_local(region) or a peer's view."""
        fd = file if isinstance(file, int) else file.fileno()
        if not length:  # 0 left: the plugin says why
            length = max(_file_size(fd) - offset, 0)
        return Region(self, offset, length, FILE, fd)

    def load_remote(self, agent_name, conn_info):
        """Learn a peer agent from its conn_info() bytes."""
        info = _as_bytes(conn_info, "conn_info")
        self._call(f"load_remote_conn_info {agent_name!r}",
                   self.plugin._load_remote_conn_info(self._live(), agent_name.encode(), info,
                                                      len(info)))

    def load_remote_md(self, agent_name, public_data):
        """A RemoteRegion of agent_name from the public_data() bytes of one of its regions."""
        data = _as_bytes(public_data, "public_data")
        h = _handle()
        self._call(f"load_remote_md {agent_name!r}",
                   self.plugin._load_remote_md(self._live(), agent_name.encode(), data,
                                               len(data), ctypes.byref(h)))
        return RemoteRegion(self, h.value, agent_name, None)

    def load_local(self, region):
        """The loopback view of a local Region, for transfers to this agent's own name."""
        if not isinstance(region, Region) or region.agent is not self:
            raise TypeError("load_local takes a Region registered on this agent")
        h = _handle()
        self._call("load_local_md",
                   self.plugin._load_local_md(self._live(), region._live(), ctypes.byref(h)))
        return RemoteRegion(self, h.value, self.name, region)

    def connect(self, agent_name):
        """Wait until the peer answers (SUCCESS) or raise (NOT_FOUND, REMOTE_DISCONNECT)."""
        self._call(f"connect {agent_name!r}",
                   self.plugin._connect(self._live(), agent_name.encode()))

    def disconnect(self, agent_name):
        self._call(f"disconnect {agent_name!r}",
                   self.plugin._disconnect(self._live(), agent_name.encode()))

    # -- transfers
    def prepare(self, op, local_descs, remote_descs, remote_agent):
        """A Transfer of equal-length lists of (addr, len, region) tuples: local ones in
        Regions of this agent, remote ones in RemoteRegions of remote_agent."""
        if op not in (READ, WRITE):
            raise ValueError(f"op must be READ or WRITE, not {op!r}")
        if len(local_descs) != len(remote_descs):
            raise ValueError(f"{len(local_descs)} local descriptors but {len(remote_descs)} "
                             "remote ones")
        local_regions = self._check_regions(local_descs, Region, "local")
        remote_regions = self._check_regions(remote_descs, RemoteRegion, "remote")
        lo, ro = _desc_array(local_descs), _desc_array(remote_descs)
        h = _handle()
        self._call(f"prep_xfer to {remote_agent!r}",
                   self.plugin._prep_xfer(self._live(), op, lo, ro, len(local_descs),
                                          remote_agent.encode(), ctypes.byref(h)))
        return Transfer(self, h.value, op, len(local_descs), remote_agent,
                        (local_regions, remote_regions))

    def _check_regions(self, descs, kind, side):
        try:
            regions = set(map(operator.itemgetter(2), descs))
        except (TypeError, IndexError):
            raise TypeError(f"{side} descriptors must be (addr, len, region) tuples") from None
        for r in regions:
            if not isinstance(r, kind):
                raise TypeError(f"{side} descriptors need a {kind.__name__}, "
                                f"got {type(r).__name__}")
            if r.agent is not self:
                raise ValueError(f"{side} descriptor's {r!r} belongs to another agent")
            r._live()
        return regions

    def notify(self, agent_name, msg):
        """Send a notification (bytes or str) to agent_name."""
        data = _as_bytes(msg, "msg")
        self._call(f"gen_notif to {agent_name!r}",
                   self.plugin._gen_notif(self._live(), agent_name.encode(), data, len(data)))

    def get_notifs(self):
        """Every notification received so far: a list of (sender agent, message bytes). One the
        plugin refused (a spoofed sender, one too large) raises KVError, after those before it
        were returned: the call that meets it returns them, and the next one raises."""
        if self._notif is None:
            self._notif = mc_kv_notif_t()
        if self._notif_error is not None:
            err, self._notif_error = self._notif_error, None
            raise err
        n, out = self._notif, []
        while True:
            rc = self.plugin._get_notif(self._live(), ctypes.byref(n))
            if rc == 0:
                return out
            if rc != 1:
                if out:  # (popped already: they would be lost with the exception)
                    self._notif_error = KVError(rc, self.last_error(), "get_notif")
                    return out
                self._call("get_notif", rc)
            out.append((n.agent.decode(errors="replace"), ctypes.string_at(n.msg, n.len)))


def _file_size(fd):
    """The size of an open file or block device (whose st_size is 0), without moving the
    descriptor's offset: the host's own reads go on where they were."""
    st = os.fstat(fd)
    if not stat.S_ISBLK(st.st_mode):
        return st.st_size
    size = array.array("Q", [0])
    fcntl.ioctl(fd, _BLKGETSIZE64, size)
    return size[0]


_BLKGETSIZE64 = 0x80081272  # _IOR(0x12, 114, size_t)


def _desc_array(descs):
    """The mc_kv_desc_t array of (addr, len, region) tuples, in one pass over the list."""
    n = len(descs)
    if not _FAST_DESCS:
        arr = (mc_kv_desc_t * n)()
        for i, (a, ln, r) in enumerate(descs):
            arr[i] = mc_kv_desc_t(a, ln, r._dev_id, r._h)
        return arr
    try:
        words = array.array("Q", itertools.chain.from_iterable(
            (a, ln, r._dev_id, r._h) for a, ln, r in descs))
    except OverflowError:
        raise ValueError("a descriptor's address or length is negative or over 64 bits") \
            from None
    if n == 0:
        return None
    return (mc_kv_desc_t * n).from_buffer(words)


class Region(_Child):
    """A registered local region. .addr, .len, .buffer; public_data(); deregister()/close()."""

    def __init__(self, agent, obj, length, mem_type, dev_id):
        self.agent = agent
        self.buffer = obj
        self.mem_type = mem_type
        self._dev_id = self.dev_id = dev_id
        self.addr, size, self._keep = _address_of(obj, length)
        self.len = size if length is None else length
        if length is not None and length > size:
            raise ValueError(f"length {length} is more than the buffer's {size} bytes")
        reg = mc_kv_region_t(self.addr, self.len, dev_id, mem_type)
        h = _handle()
        agent._call(f"register_mem of {self.len} bytes at {self.addr:#x}",
                    agent.plugin._register_mem(agent._live(), ctypes.byref(reg),
                                               ctypes.byref(h)))
        self._h = h.value
        agent._children.add(self)

    def public_data(self):
        """The bytes a peer passes to its load_remote_md() to reach this region."""
        h, a = self._live(), self.agent
        return a._sized("public_data",
                        lambda b, n: a.plugin._public_data(a._live(), h, b, n), PUBLIC_MAX)

    def desc(self, offset=0, length=None):
        """The descriptor (addr, len, self) of a range of this region."""
        if length is None:
            length = self.len - offset
        return (self.addr + offset, length, self)

    def deregister(self):
        """Deregister (KVError ERR_NOT_ALLOWED while a transfer or a local view uses it)."""
        if self._h is None:
            return
        self.agent._call("deregister_mem",
                         self.agent.plugin._deregister_mem(self.agent._live(), self._h))
        self._h = None
        self._keep = self.buffer = None

    close = deregister

    def __repr__(self):
        return f"<Region {self.len} bytes at {self.addr:#x} of {self.agent.name!r}>"


def _address_of(obj, length):
    """(address, size, what to keep alive) of a buffer or an int address."""
    if isinstance(obj, int):
        if length is None:
            raise ValueError("registering an address needs a length")
        return obj, length, None
    if isinstance(obj, ctypes._SimpleCData) or isinstance(obj, (ctypes.Array, ctypes.Structure,
                                                                 ctypes.Union)):
        return ctypes.addressof(obj), ctypes.sizeof(obj), obj
    try:
        m = memoryview(obj)
    except TypeError:
        raise TypeError(f"cannot register a {type(obj).__name__}: need a writable buffer or "
                        "an int address") from None
    if m.readonly:
        raise ValueError(f"cannot register a read-only {type(obj).__name__} (the plugin may "
                         "write into it)")
    if not m.c_contiguous:
        raise ValueError("cannot register a non-contiguous buffer")
    # An exported view pins the memory: a bytearray cannot be resized (moved) while it lives.
    view = (ctypes.c_char * m.nbytes).from_buffer(m.cast("B"))
    return ctypes.addressof(view), m.nbytes, view


class RemoteRegion(_Child):
    """A peer's region loaded from its public data (or a loopback view); unload()/close()."""

    def __init__(self, agent, handle, agent_name, local):
        self.agent = agent
        self.remote_agent = agent_name
        self._h = handle
        self._dev_id = 0
        self._keep = local  # a loopback view keeps its Region registered
        agent._children.add(self)

    def unload(self):
        if self._h is None:
            return
        self.agent._call("unload_md", self.agent.plugin._unload_md(self.agent._live(), self._h))
        self._h = self._keep = None

    close = unload

    def __repr__(self):
        return f"<RemoteRegion of {self.remote_agent!r} on {self.agent.name!r}>"


class Transfer(_Child):
    """A prepared transfer: post(), check(), wait(), release()/close()."""

    def __init__(self, agent, handle, op, count, remote_agent, regions):
        self.agent = agent
        self.op = op
        self.count = count
        self.remote_agent = remote_agent
        self._h = handle
        self._keep = regions  # the regions must outlive the handle
        p = agent.plugin
        self._post_fn, self._check_fn, self._release_fn = p._post_xfer, p._check_xfer, \
            p._release_xfer
        agent._children.add(self)

    def post(self, notif=b""):
        """Start the transfer; notif (bytes/str, empty: none) reaches the remote agent after
        the data. Returns IN_PROG or SUCCESS; raises KVError otherwise (ERR_REPOST_ACTIVE if
        the previous post has not finished)."""
        data = _as_bytes(notif, "notif") if notif else None
        st = self._post_fn(self.agent._live(), self._live(), data, len(data) if data else 0)
        return self.agent._call("post_xfer", st, (IN_PROG, SUCCESS))

    def check(self):
        """IN_PROG or SUCCESS; raises KVError for what ended the transfer."""
        st = self._check_fn(self.agent._live(), self._live())
        return st if st in (IN_PROG, SUCCESS) else self.agent._call("check_xfer", st, ())

    def wait(self, timeout=60.0):
        """Poll check() until SUCCESS; KVError on failure, TimeoutError after timeout s."""
        deadline = time.monotonic() + timeout
        nap = 0.00002
        while self.check() == IN_PROG:
            if time.monotonic() > deadline:
                raise TimeoutError(f"transfer to {self.remote_agent!r} still in progress "
                                   f"after {timeout} s")
            time.sleep(nap)
            nap = min(nap * 2, 0.001)
        return SUCCESS

    def release(self):
        """Free the handle, aborting the transfer if in flight (its notification is dropped)."""
        if self._h is None:
            return
        h, self._h = self._h, None
        try:
            self.agent._call("release_xfer", self._release_fn(self.agent._live(), h))
        finally:
            self._keep = None  # the regions may go once the handle is gone

    close = release

    def __repr__(self):
        op = "READ" if self.op == READ else "WRITE"
        return f"<Transfer {op} of {self.count} descriptors to {self.remote_agent!r}>"
