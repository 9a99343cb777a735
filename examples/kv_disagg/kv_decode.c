/*
 * kv_decode: the decode side of disaggregated serving, receiving a request's KV cache from the
 * prefill instance layer by layer through the Mooncake KV plugin.
 *
 * Decode owns the destination blocks, so it picks them (scattered, as a paged KV cache hands
 * them out) and tells prefill which of its blocks go where. Prefill WRITEs each layer with the
 * notification "<req_id>:<layer>"; the plugin delivers a notification only once every byte of
 * its transfer is in place, so decode may use (here: verify) layer l the moment layer l's
 * notification arrives, while later layers are still on the wire.
 *
 *   1. load the plugin by path, create an instance, register one region per layer, fill every
 *      block with a filler byte (so a block nobody wrote is caught);
 *   2. connect to prefill's side channel; take prefill's HELLO (its agent name and geometry);
 *      pick the request's blocks; send our HELLO, our connection info, and each layer's base
 *      address and public data (prefill initiates every transfer: decode needs nothing of
 *      prefill's but its name);
 *   3. after READY, send the request and start the clock;
 *   4. for each layer in order: wait for its notification, verify its blocks byte for byte
 *      (and that blocks outside the request are untouched), print its line;
 *   5. print the summary and send the verdict to prefill.
 */
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kv_common.h"

#define FILLER 0xee /* what decode's blocks hold before prefill writes them */

struct decode {
    struct kv_config cfg;
    uint32_t req_blocks; /* --req-blocks: blocks per layer in the request */
    uint32_t seed;       /* --seed: picks the blocks */

    struct kv_node node;
    struct kv_peer peer; /* prefill */
    int fd;              /* the side channel */

    /* The request: prefill's block src[i] goes to our block dst[i] in every layer. */
    char req_id[32];
    uint32_t count;
    uint32_t *src, *dst;
    unsigned char *in_request; /* per block of ours: 1 if some dst[i] is it */
    unsigned char *filler;     /* one block of FILLER bytes, to compare with */

    uint64_t t0;          /* when the request was sent */
    uint64_t *arrived_ns; /* per layer: when its notification came (0: not yet) */
    mc_kv_notif_t notif;  /* 63 KiB: lives here, not on the stack */
};

static void usage(FILE *to)
{
    fprintf(to, "usage: kv_decode --plugin PATH --side HOST:PORT [options]\n" KV_COMMON_USAGE
                "  --req-blocks N      blocks per layer in the request (default: half of "
                "--blocks)\n"
                "  --seed N            seed that picks the blocks (default: from the clock)\n");
}

enum { OPT_REQ_BLOCKS = KV_OPT_OWN, OPT_SEED };

static int own_flag(struct decode *d, int opt, const char *arg)
{
    switch (opt) {
    case OPT_REQ_BLOCKS:
        return kv_parse_u32("req-blocks", arg, 1, 1u << 20, &d->req_blocks);
    case OPT_SEED:
        return kv_parse_u32("seed", arg, 0, UINT32_MAX, &d->seed);
    case KV_OPT_HELP:
        usage(stdout);
        exit(0);
    }
    return -1; /* unknown flag: getopt printed it */
}

static int parse_args(struct decode *d, int argc, char **argv)
{
    static const struct option longopts[] = {
        KV_COMMON_LONGOPTS,
        {"req-blocks", required_argument, NULL, OPT_REQ_BLOCKS},
        {"seed", required_argument, NULL, OPT_SEED},
        {NULL, 0, NULL, 0},
    };
    int opt, rc = 0;

    kv_config_defaults(&d->cfg, "decode");
    d->seed = (uint32_t)(kv_now_ns() ^ (uint64_t)getpid() << 16);
    while (rc == 0 && (opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        int common = kv_config_flag(&d->cfg, opt, optarg);

        rc = common ? (common < 0 ? -1 : 0) : own_flag(d, opt, optarg);
    }
    if (rc || optind != argc) {
        usage(stderr);
        return -1;
    }
    if (d->req_blocks == 0)
        d->req_blocks = d->cfg.blocks / 2 ? d->cfg.blocks / 2 : 1;
    return kv_config_check(&d->cfg);
}

/* ---- setup ---- */

/* One KV_MSG_LAYER per layer: what prefill needs to WRITE into it. */
static int send_layers(struct decode *d)
{
    const struct kv_node *n = &d->node;

    for (uint32_t l = 0; l < n->layers; l++) {
        unsigned char pub[MC_KV_PUBLIC_MAX], buf[64 + MC_KV_PUBLIC_MAX];
        struct kv_wire w = {.buf = buf, .cap = sizeof(buf)};
        size_t len = sizeof(pub);
        mc_kv_status_t st = n->p->public_data(n->b, n->md[l], pub, &len);

        if (st != MC_KV_SUCCESS)
            return kv_fail(n, "public_data", st);
        kv_put_u32(&w, l);
        kv_put_u64(&w, (uintptr_t)n->layer[l]);
        kv_put_bytes(&w, pub, len);
        if (kv_side_send(d->fd, KV_MSG_LAYER, buf, w.pos))
            return -1;
    }
    return 0;
}

static uint32_t next_random(uint32_t *state) /* xorshift32 */
{
    *state ^= *state << 13;
    *state ^= *state >> 17;
    *state ^= *state << 5;
    return *state;
}

/* The first k entries of a random permutation of 0..n-1 (partial Fisher-Yates). */
static uint32_t *pick_blocks(uint32_t n, uint32_t k, uint32_t *state)
{
    uint32_t *perm = malloc((size_t)n * sizeof(*perm));

    if (perm == NULL)
        return NULL;
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t j = i + next_random(state) % (n - i), t = perm[i];

        perm[i] = perm[j];
        perm[j] = t;
    }
    return perm;
}

/* Choose which of prefill's blocks land in which of ours: a random subset on each side. */
static int choose_request(struct decode *d)
{
    uint32_t state = d->seed ? d->seed : 1;

    d->count = d->req_blocks;
    if (d->count > d->node.blocks || d->count > d->peer.blocks) {
        kv_err("--req-blocks %u: we have %u blocks per layer, prefill %u", d->count, d->node.blocks,
               d->peer.blocks);
        return -1;
    }
    snprintf(d->req_id, sizeof(d->req_id), "req-%08x", d->seed);
    d->src = pick_blocks(d->peer.blocks, d->count, &state);
    d->dst = pick_blocks(d->node.blocks, d->count, &state);
    d->in_request = calloc(d->node.blocks, 1);
    d->filler = malloc(d->node.block_size);
    d->arrived_ns = calloc(d->node.layers, sizeof(*d->arrived_ns));
    if (!d->src || !d->dst || !d->in_request || !d->filler || !d->arrived_ns) {
        kv_err("out of memory");
        return -1;
    }
    for (uint32_t i = 0; i < d->count; i++)
        d->in_request[d->dst[i]] = 1;
    memset(d->filler, FILLER, d->node.block_size);
    return 0;
}

/* Wait for READY, send the request, start the clock. */
static int send_request(struct decode *d)
{
    size_t len = 4 + sizeof(d->req_id) + 4 + (size_t)d->count * 8;
    unsigned char *buf = malloc(len);
    struct kv_wire w = {.buf = buf, .cap = len};
    int rc = -1;

    if (buf == NULL) {
        kv_err("out of memory");
        return -1;
    }
    kv_put_bytes(&w, d->req_id, strlen(d->req_id));
    kv_put_u32(&w, d->count);
    for (uint32_t i = 0; i < d->count; i++) {
        kv_put_u32(&w, d->src[i]);
        kv_put_u32(&w, d->dst[i]);
    }
    if (!w.bad && kv_side_recv(d->fd, KV_MSG_READY, NULL, 0, &len, d->cfg.timeout_ms) == 0 &&
        kv_side_send(d->fd, KV_MSG_REQUEST, buf, w.pos) == 0) {
        d->t0 = kv_now_ns();
        rc = 0;
    }
    free(buf);
    return rc;
}

static int setup(struct decode *d)
{
    if (kv_node_open(&d->node, &d->cfg))
        return -1;
    for (uint32_t l = 0; l < d->node.layers; l++)
        memset(d->node.layer[l], FILLER, kv_layer_bytes(&d->node));
    if ((d->fd = kv_side_connect(d->cfg.side, d->cfg.timeout_ms)) < 0)
        return -1;
    /* Prefill speaks first; check what it has before telling it anything. */
    if (kv_recv_hello(d->fd, &d->node, &d->peer, d->cfg.timeout_ms) || choose_request(d))
        return -1;
    if (kv_send_hello(d->fd, &d->node) || kv_send_conn(d->fd, &d->node) || send_layers(d))
        return -1;
    printf("decode: request %s to %s: %u of %u blocks per layer (%u B each), %u layers\n",
           d->req_id, d->peer.agent, d->count, d->node.blocks, d->node.block_size, d->node.layers);
    return send_request(d);
}

/* ---- notifications ---- */

/* Take one notification: it must be "<req_id>:<layer>" from prefill, for a layer not seen. */
static int take_notif(struct decode *d)
{
    const mc_kv_notif_t *nf = &d->notif;
    size_t idl = strlen(d->req_id);
    char text[64], *end;
    unsigned long l;

    if (strcmp(nf->agent, d->peer.agent) || nf->len <= idl + 1 || nf->len >= sizeof(text) ||
        memcmp(nf->msg, d->req_id, idl) || nf->msg[idl] != ':') {
        kv_err("unexpected notification from '%s' (%zu bytes)", nf->agent, nf->len);
        return -1;
    }
    memcpy(text, nf->msg + idl + 1, nf->len - idl - 1);
    text[nf->len - idl - 1] = '\0';
    l = strtoul(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end || l >= d->node.layers || d->arrived_ns[l]) {
        kv_err("notification '%s:%s': no such layer, or a repeat", d->req_id, text);
        return -1;
    }
    d->arrived_ns[l] = kv_now_ns() - d->t0;
    return 0;
}

/* True if prefill closed the side channel (it sends nothing else after READY). */
static int prefill_gone(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    char c;

    return poll(&pfd, 1, 0) > 0 && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
}

/* Pop every queued notification, stamping its arrival. Called while waiting and between blocks
 * while verifying, so that a layer's latency does not include the verification of the layers
 * before it. */
static int drain_notifs(struct decode *d)
{
    int got;

    while ((got = d->node.p->get_notif(d->node.b, &d->notif)) == 1) {
        if (take_notif(d))
            return -1;
    }
    return got < 0 ? kv_fail(&d->node, "get_notif", got) : 0;
}

/* Poll the plugin until layer l's notification is in (keeping any others that come first). */
static int wait_layer(struct decode *d, uint32_t l)
{
    uint64_t deadline = kv_now_ns() + (uint64_t)d->cfg.timeout_ms * 1000000;

    for (;;) {
        if (drain_notifs(d))
            return -1;
        if (d->arrived_ns[l])
            return 0;
        if (prefill_gone(d->fd)) {
            kv_err("layer %u: prefill closed the side channel before its notification", l);
            return -1;
        }
        if (kv_now_ns() > deadline) {
            kv_err("layer %u: no notification within %d s", l, d->cfg.timeout_ms / 1000);
            return -1;
        }
        kv_sleep_us(20);
    }
}

/* ---- verification ---- */

/* Every block of the request holds prefill's pattern for (layer, its prefill block). */
static int verify_request_blocks(struct decode *d, uint32_t l)
{
    for (uint32_t i = 0; i < d->count; i++) {
        if (drain_notifs(d))
            return -1;
        const unsigned char *got = kv_block(&d->node, l, d->dst[i]);
        int64_t off = kv_check_block(got, l, d->src[i], d->node.block_size);

        if (off >= 0) {
            kv_err("layer %u: MISMATCH in block %u (from prefill block %u) at byte %" PRId64
                   ": got 0x%02x",
                   l, d->dst[i], d->src[i], off, got[off]);
            return -1;
        }
    }
    return 0;
}

/* Every other block still holds the filler: nothing was written where it should not be. */
static int verify_other_blocks(struct decode *d, uint32_t l)
{
    for (uint32_t b = 0; b < d->node.blocks; b++) {
        const unsigned char *p = kv_block(&d->node, l, b);

        if (d->in_request[b])
            continue;
        if (drain_notifs(d))
            return -1;
        if (memcmp(p, d->filler, d->node.block_size) == 0)
            continue;
        for (uint32_t i = 0; i < d->node.block_size; i++) {
            if (p[i] != FILLER) {
                kv_err("layer %u: block %u is not in the request but byte %u changed to 0x%02x", l,
                       b, i, p[i]);
                return -1;
            }
        }
    }
    return 0;
}

/* One line per layer. The gap is the time since the previous layer's notification (since the
 * request, for layer 0) and the rate is the layer's bytes over that gap: how fast layers arrive
 * once they flow. Notifications that came in together (gap under 10 us) get no rate. */
static void print_layer(const struct decode *d, uint32_t l, uint64_t prev_ns)
{
    uint64_t bytes = (uint64_t)d->count * d->node.block_size;
    uint64_t at = d->arrived_ns[l], gap = at > prev_ns ? at - prev_ns : 0;

    printf("decode: layer %3u  blocks %u  bytes %" PRIu64 "  latency %8.3f ms  gap %7.3f ms  ", l,
           d->count, bytes, at / 1e6, gap / 1e6);
    if (gap >= 10000)
        printf("%7.2f GB/s  verified\n", (double)bytes / (double)gap);
    else
        printf("   (burst)  verified\n");
}

static int receive_layers(struct decode *d)
{
    uint64_t prev = 0;

    for (uint32_t l = 0; l < d->node.layers; l++) {
        if (wait_layer(d, l) || verify_request_blocks(d, l) || verify_other_blocks(d, l))
            return -1;
        print_layer(d, l, prev);
        if (d->arrived_ns[l] > prev)
            prev = d->arrived_ns[l];
    }
    return 0;
}

/* ---- the end ---- */

static void print_summary(const struct decode *d, char *msg, size_t room)
{
    uint64_t total = (uint64_t)d->count * d->node.block_size * d->node.layers, last = 0;

    for (uint32_t l = 0; l < d->node.layers; l++)
        last = d->arrived_ns[l] > last ? d->arrived_ns[l] : last;
    snprintf(msg, room,
             "all %u layers verified: %" PRIu64 " bytes in %.3f ms (%.2f GB/s), first layer "
             "after %.3f ms",
             d->node.layers, total, last / 1e6, (double)total / (double)last,
             d->arrived_ns[0] / 1e6);
    printf("decode: %s\n", msg);
}

static int send_result(struct decode *d, uint32_t code, const char *msg)
{
    unsigned char buf[1024];
    struct kv_wire w = {.buf = buf, .cap = sizeof(buf)};

    kv_put_u32(&w, code);
    kv_put_bytes(&w, msg, strlen(msg) < 512 ? strlen(msg) : 511);
    return w.bad ? -1 : kv_side_send(d->fd, KV_MSG_RESULT, buf, w.pos);
}

/* Leave only once prefill has let go of us (closed the side channel after releasing our
 * regions), so that its engine does not see us vanish while it still holds them. */
static void wait_for_prefill(struct decode *d)
{
    if (kv_side_wait_close(d->fd, d->cfg.timeout_ms))
        kv_err("prefill did not close the side channel (ignored)");
}

static void teardown(struct decode *d)
{
    kv_node_close(&d->node);
    if (d->fd >= 0)
        close(d->fd);
    free(d->src);
    free(d->dst);
    free(d->in_request);
    free(d->filler);
    free(d->arrived_ns);
}

int main(int argc, char **argv)
{
    struct decode *d = calloc(1, sizeof(*d));
    char msg[512];
    int rc = -1;

    kv_prog = "kv_decode";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (d == NULL || parse_args(d, argc, argv)) {
        free(d);
        return 2;
    }
    d->fd = -1;
    if (setup(d) == 0) {
        if ((rc = receive_layers(d)) == 0) {
            print_summary(d, msg, sizeof(msg));
            rc = send_result(d, 0, msg);
            wait_for_prefill(d);
        } else if (!prefill_gone(d->fd)) {
            send_result(d, 1, "decode failed, see its output");
        }
    }
    teardown(d);
    free(d);
    if (rc)
        kv_err("FAILED");
    return rc ? 1 : 0;
}
