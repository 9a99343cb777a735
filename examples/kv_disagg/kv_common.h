/*
 * kv_disagg: what kv_prefill and kv_decode share.
 *
 *   - struct kv_config: the command-line flags both programs take.
 *   - struct kv_node: the loaded plugin, one instance of it, and the KV cache: one registered
 *     region per layer, each region `blocks` blocks of `block_size` bytes.
 *   - The side channel: a TCP connection between the two programs carrying length-prefixed
 *     frames, and a small encoder/decoder for their payloads. The plugin moves the KV bytes;
 *     everything it needs to know about the peer (connection info, each region's public
 *     data, the request) travels here, as it would over a serving stack's control plane.
 *   - The "KV" pattern prefill computes and decode verifies.
 */
#ifndef KV_COMMON_H
#define KV_COMMON_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>

#include <mooncake/kv_loader.h>

/* ---- flags ---- */

#define KV_MAX_OPTS 16

struct kv_config {
    const char *plugin;  /* --plugin PATH: the plugin file (required) */
    const char *agent;   /* --agent NAME */
    const char *listen;  /* --listen ADDR: the plugin's LISTEN option */
    const char *side;    /* --side HOST:PORT: the side channel (prefill listens there) */
    uint32_t layers;     /* --layers N */
    uint32_t blocks;     /* --blocks N: blocks per layer */
    uint32_t block_size; /* --block-size BYTES: a multiple of 8 */
    int timeout_ms;      /* --timeout SECONDS: bound on every wait */
    mc_kv_option_t opts[KV_MAX_OPTS]; /* LISTEN, then each --opt KEY=VALUE */
    size_t n_opts;
};

/* Long options every program takes; a program appends its own (values from KV_OPT_OWN). */
enum {
    KV_OPT_PLUGIN = 0x100,
    KV_OPT_AGENT,
    KV_OPT_LISTEN,
    KV_OPT_SIDE,
    KV_OPT_LAYERS,
    KV_OPT_BLOCKS,
    KV_OPT_BLOCK_SIZE,
    KV_OPT_OPT,
    KV_OPT_TIMEOUT,
    KV_OPT_HELP,
    KV_OPT_OWN, /* first value free for a program's own flags */
};

/* clang-format off */
#define KV_COMMON_LONGOPTS                                       \
    {"plugin", required_argument, NULL, KV_OPT_PLUGIN},         \
    {"agent", required_argument, NULL, KV_OPT_AGENT},           \
    {"listen", required_argument, NULL, KV_OPT_LISTEN},         \
    {"side", required_argument, NULL, KV_OPT_SIDE},             \
    {"layers", required_argument, NULL, KV_OPT_LAYERS},         \
    {"blocks", required_argument, NULL, KV_OPT_BLOCKS},         \
    {"block-size", required_argument, NULL, KV_OPT_BLOCK_SIZE}, \
    {"opt", required_argument, NULL, KV_OPT_OPT},               \
    {"timeout", required_argument, NULL, KV_OPT_TIMEOUT},       \
    {"help", no_argument, NULL, KV_OPT_HELP}
/* clang-format on */

#define KV_COMMON_USAGE                                                                            \
    "  --plugin PATH       the KV plugin (libmooncake_kv.so), loaded by path (required)\n"         \
    "  --side HOST:PORT    side channel: prefill listens there, decode connects (required)\n"      \
    "  --listen ADDR       the plugin's LISTEN address (default 127.0.0.1:0)\n"                    \
    "  --agent NAME        this instance's agent name\n"                                           \
    "  --layers N          layers, one registered region each (default 32)\n"                      \
    "  --blocks N          blocks per layer (default 128)\n"                                       \
    "  --block-size BYTES  bytes per block, a multiple of 8 (default 32768)\n"                     \
    "  --opt KEY=VALUE     any other plugin option (PROTOCOL=tcp, ...); repeatable\n"              \
    "  --timeout SECONDS   bound on every wait (default 30)\n"

/* The program's name, prefixed to every message (set by main). */
extern const char *kv_prog;

void kv_config_defaults(struct kv_config *c, const char *agent);
/* Apply one common flag: 1 if opt was one, 0 if not, -1 (message printed) if arg is bad. */
int kv_config_flag(struct kv_config *c, int opt, const char *arg);
/* After parsing: required flags present, sizes consistent. 0 or -1 (message printed). */
int kv_config_check(const struct kv_config *c);
/* Parse a number in min..max into *v. 0 or -1 (message printed). */
int kv_parse_u32(const char *flag, const char *arg, uint32_t min, uint32_t max, uint32_t *v);

/* ---- messages and time ---- */

void kv_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t kv_now_ns(void);
void kv_sleep_us(unsigned us);

/* ---- the plugin instance and its KV cache ---- */

struct kv_node {
    mc_kv_loaded_t *loaded;
    const mc_kv_plugin_t *p; /* the plugin's table */
    mc_kv_backend_t *b;      /* our instance */
    char agent[MC_KV_AGENT_MAX];
    uint32_t layers, blocks, block_size;
    unsigned char **layer; /* layer[l]: blocks * block_size bytes */
    mc_kv_md_t **md;       /* md[l]: layer l's registration */
};

/* Load the plugin by path, create the instance, allocate and register every layer. On failure
 * everything done so far is undone and -1 returned (message printed). */
int kv_node_open(struct kv_node *n, const struct kv_config *c);
void kv_node_close(struct kv_node *n);
/* Print "what: STATUS: the plugin's last_error" and return -1. */
int kv_fail(const struct kv_node *n, const char *what, int status);

static inline uint64_t kv_layer_bytes(const struct kv_node *n)
{
    return (uint64_t)n->blocks * n->block_size;
}

static inline unsigned char *kv_block(const struct kv_node *n, uint32_t layer, uint32_t block)
{
    return n->layer[layer] + (uint64_t)block * n->block_size;
}

/* ---- the KV pattern ---- */

/* Fill a block with the bytes prefill "computes" for (layer, block). */
void kv_fill_block(unsigned char *dst, uint32_t layer, uint32_t block, uint32_t block_size);
/* Compare a block with that pattern: -1 if it matches, else the offset of the first wrong
 * byte. */
int64_t kv_check_block(const unsigned char *got, uint32_t layer, uint32_t block,
                       uint32_t block_size);

/* ---- the side channel ---- */

enum kv_msg {
    KV_MSG_HELLO = 1, /* both ways: agent, layers, blocks, block_size */
    KV_MSG_CONN,      /* decode -> prefill: the plugin's conn_info bytes */
    KV_MSG_LAYER,     /* decode -> prefill, one per layer: layer, base address, public data */
    KV_MSG_READY,     /* prefill -> decode: everything loaded, send the request */
    KV_MSG_REQUEST,   /* decode -> prefill: req id, then (prefill block, decode block) pairs */
    KV_MSG_RESULT,    /* decode -> prefill: 0 if every layer verified, and a message */
};

#define KV_FRAME_MAX (16u << 20) /* largest payload either side accepts */

/* Listen on HOST:PORT, accept one connection, close the listener. fd or -1. */
int kv_side_accept(const char *hostport, int timeout_ms);
/* Connect to HOST:PORT, retrying while nobody listens yet. fd or -1. */
int kv_side_connect(const char *hostport, int timeout_ms);
/* A frame is an 8-byte header (type, payload length; big-endian u32 each) and the payload. */
int kv_side_send(int fd, uint32_t type, const void *payload, size_t len);
/* Receive one frame of the expected type into buf (room cap); its length in *len. */
int kv_side_recv(int fd, uint32_t type, void *buf, size_t cap, size_t *len, int timeout_ms);

/* Wait until the peer closes the channel (read returns end of file). 0 or -1. */
int kv_side_wait_close(int fd, int timeout_ms);

/* Payload encoding: big-endian integers and length-prefixed byte strings. Reading or writing
 * past the end sets bad instead of touching memory; check it once at the end. */
struct kv_wire {
    unsigned char *buf;
    size_t cap, pos;
    int bad;
};

void kv_put_u32(struct kv_wire *w, uint32_t v);
void kv_put_u64(struct kv_wire *w, uint64_t v);
void kv_put_bytes(struct kv_wire *w, const void *p, size_t n);
uint32_t kv_get_u32(struct kv_wire *w);
uint64_t kv_get_u64(struct kv_wire *w);
const void *kv_get_bytes(struct kv_wire *w, size_t *n);
/* A byte string as a C string into dst (room cap): bad if it does not fit or holds a NUL. */
void kv_get_str(struct kv_wire *w, char *dst, size_t cap);

/* ---- the handshake ---- */

struct kv_peer {
    char agent[MC_KV_AGENT_MAX];
    uint32_t layers, blocks, block_size;
};

/* Both ways: our agent name and geometry. */
int kv_send_hello(int fd, const struct kv_node *n);
/* The peer's HELLO, checked against our geometry (same layers and block size). */
int kv_recv_hello(int fd, const struct kv_node *n, struct kv_peer *peer, int timeout_ms);
/* Only toward whoever initiates transfers (here: decode to prefill): our conn_info. */
int kv_send_conn(int fd, const struct kv_node *n);
/* Receive the peer's conn_info and load it into our instance. */
int kv_recv_conn(int fd, struct kv_node *n, const struct kv_peer *peer, int timeout_ms);

#endif
