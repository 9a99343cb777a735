/*
 * kv_prefill: the prefill side of disaggregated serving, moving a request's KV cache to the
 * decode instance layer by layer through the Mooncake KV plugin.
 *
 * The pattern that hides the transfer behind compute: as soon as layer l is computed, its blocks
 * are WRITten into decode's blocks, with the notification "<req_id>:<l>", and prefill goes on
 * to compute layer l+1 at once. Several layers' transfers are in flight at any time; they are
 * checked between layers and released when done. Only when --inflight transfers are pending
 * does prefill wait, for the oldest.
 *
 *   1. load the plugin by path, create an instance, register one region per layer;
 *   2. accept decode on the side channel; swap HELLOs (agent, geometry); load decode's
 *      connection info;
 *   3. receive each of decode's layer regions (base address + public data) and load it;
 *   4. READY; receive the request: which of our blocks go to which of decode's blocks;
 *   5. compute and post each layer (above), then drain, and wait for decode's verdict.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_common.h"

struct prefill {
    struct kv_config cfg;
    uint32_t window;     /* --inflight: most transfers pending at once */
    uint32_t compute_us; /* --compute-us: model time per layer, simulated by sleeping */
    int64_t corrupt;     /* --corrupt-layer: spoil one byte of that layer (-1: none) */

    struct kv_node node;
    struct kv_peer peer; /* decode */
    int fd;              /* the side channel */
    mc_kv_md_t **remote_md;
    uint64_t *remote_base;

    /* The request: src[i] (our block) goes to dst[i] (decode's block) in every layer. */
    char req_id[64];
    uint32_t count;
    uint32_t *src, *dst;
    mc_kv_desc_t *local, *remote; /* one layer's descriptor lists, rebuilt per layer */

    /* Per layer: its transfer while pending, and times since the request came in ("done" is
     * when prefill saw it done: it checks between layers). */
    mc_kv_xfer_t **xfer;
    uint32_t inflight, max_inflight, oldest;
    uint64_t t0, *posted_ns, *done_ns;
};

static void usage(FILE *to)
{
    fprintf(to, "usage: kv_prefill --plugin PATH --side HOST:PORT [options]\n" KV_COMMON_USAGE
                "  --inflight N        most layer transfers pending at once (default 4)\n"
                "  --compute-us N      simulated compute time per layer (default 0)\n"
                "  --corrupt-layer L   spoil one byte of layer L before sending it, to see decode "
                "catch it\n");
}

enum { OPT_INFLIGHT = KV_OPT_OWN, OPT_COMPUTE_US, OPT_CORRUPT };

/* This program's own flags; 0 or -1 (message printed). */
static int own_flag(struct prefill *pf, int opt, const char *arg)
{
    uint32_t layer;

    switch (opt) {
    case OPT_INFLIGHT:
        return kv_parse_u32("inflight", arg, 1, 1024, &pf->window);
    case OPT_COMPUTE_US:
        return kv_parse_u32("compute-us", arg, 0, 10000000, &pf->compute_us);
    case OPT_CORRUPT:
        if (kv_parse_u32("corrupt-layer", arg, 0, 4095, &layer))
            return -1;
        pf->corrupt = layer;
        return 0;
    case KV_OPT_HELP:
        usage(stdout);
        exit(0);
    }
    return -1; /* unknown flag: getopt printed it */
}

static int parse_args(struct prefill *pf, int argc, char **argv)
{
    static const struct option longopts[] = {
        KV_COMMON_LONGOPTS,
        {"inflight", required_argument, NULL, OPT_INFLIGHT},
        {"compute-us", required_argument, NULL, OPT_COMPUTE_US},
        {"corrupt-layer", required_argument, NULL, OPT_CORRUPT},
        {NULL, 0, NULL, 0},
    };
    int opt, rc = 0;

    kv_config_defaults(&pf->cfg, "prefill");
    pf->window = 4;
    pf->corrupt = -1;
    while (rc == 0 && (opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        int common = kv_config_flag(&pf->cfg, opt, optarg);

        rc = common ? (common < 0 ? -1 : 0) : own_flag(pf, opt, optarg);
    }
    if (rc || optind != argc) {
        usage(stderr);
        return -1;
    }
    return kv_config_check(&pf->cfg);
}

/* ---- setup: decode's regions and the request ---- */

/* One KV_MSG_LAYER: layer index, base address of decode's region, its public data. */
static int load_remote_layer(struct prefill *pf, const unsigned char *buf, size_t len)
{
    struct kv_wire w = {.buf = (unsigned char *)buf, .cap = len};
    uint32_t l = kv_get_u32(&w);
    uint64_t base = kv_get_u64(&w);
    size_t n;
    const void *pub = kv_get_bytes(&w, &n);
    mc_kv_status_t st;

    if (w.bad || w.pos != len || l >= pf->node.layers || pf->remote_md[l]) {
        kv_err("side channel: malformed or repeated LAYER message (%zu bytes)", len);
        return -1;
    }
    st = pf->node.p->load_remote_md(pf->node.b, pf->peer.agent, pub, n, &pf->remote_md[l]);
    if (st != MC_KV_SUCCESS)
        return kv_fail(&pf->node, "load_remote_md", st);
    pf->remote_base[l] = base;
    return 0;
}

static int load_remote_layers(struct prefill *pf)
{
    unsigned char buf[64 + MC_KV_PUBLIC_MAX];
    size_t len;

    pf->remote_md = calloc(pf->node.layers, sizeof(*pf->remote_md));
    pf->remote_base = calloc(pf->node.layers, sizeof(*pf->remote_base));
    if (pf->remote_md == NULL || pf->remote_base == NULL) {
        kv_err("out of memory");
        return -1;
    }
    for (uint32_t l = 0; l < pf->node.layers; l++) {
        if (kv_side_recv(pf->fd, KV_MSG_LAYER, buf, sizeof(buf), &len, pf->cfg.timeout_ms) ||
            load_remote_layer(pf, buf, len))
            return -1;
    }
    return 0;
}

/* The pairs of a REQUEST, each block id checked against its side's block count. */
static int parse_pairs(struct prefill *pf, struct kv_wire *w)
{
    pf->count = kv_get_u32(w);
    if (w->bad || pf->count == 0 || pf->count > (w->cap - w->pos) / 8) {
        kv_err("side channel: REQUEST with a bad block count");
        return -1;
    }
    pf->src = calloc(pf->count, sizeof(*pf->src));
    pf->dst = calloc(pf->count, sizeof(*pf->dst));
    if (pf->src == NULL || pf->dst == NULL) {
        kv_err("out of memory");
        return -1;
    }
    for (uint32_t i = 0; i < pf->count; i++) {
        pf->src[i] = kv_get_u32(w);
        pf->dst[i] = kv_get_u32(w);
        if (pf->src[i] >= pf->node.blocks || pf->dst[i] >= pf->peer.blocks) {
            kv_err("request pair %u: block %u -> %u is out of range (%u -> %u blocks)", i,
                   pf->src[i], pf->dst[i], pf->node.blocks, pf->peer.blocks);
            return -1;
        }
    }
    return 0;
}

static int recv_request(struct prefill *pf)
{
    unsigned char *buf = malloc(KV_FRAME_MAX);
    struct kv_wire w = {.buf = buf};
    int rc = -1;

    if (buf == NULL) {
        kv_err("out of memory");
        return -1;
    }
    if (kv_side_recv(pf->fd, KV_MSG_REQUEST, buf, KV_FRAME_MAX, &w.cap, pf->cfg.timeout_ms) == 0) {
        kv_get_str(&w, pf->req_id, sizeof(pf->req_id));
        if (w.bad || pf->req_id[0] == '\0')
            kv_err("side channel: REQUEST without a request id");
        else if (parse_pairs(pf, &w) == 0 && w.pos == w.cap)
            rc = 0;
        else if (w.pos != w.cap)
            kv_err("side channel: REQUEST has %zu bytes past its pairs", w.cap - w.pos);
    }
    pf->t0 = kv_now_ns();
    free(buf);
    return rc;
}

/* Everything before the first layer: connect with decode and learn its regions and request. */
static int setup(struct prefill *pf)
{
    mc_kv_status_t st;

    if (kv_node_open(&pf->node, &pf->cfg))
        return -1;
    if ((pf->fd = kv_side_accept(pf->cfg.side, pf->cfg.timeout_ms)) < 0)
        return -1;
    if (kv_send_hello(pf->fd, &pf->node) ||
        kv_recv_hello(pf->fd, &pf->node, &pf->peer, pf->cfg.timeout_ms) ||
        kv_recv_conn(pf->fd, &pf->node, &pf->peer, pf->cfg.timeout_ms))
        return -1;
    /* Optional: opens the connection now, so the first layer does not pay for it. */
    if ((st = pf->node.p->connect(pf->node.b, pf->peer.agent)) != MC_KV_SUCCESS)
        return kv_fail(&pf->node, "connect", st);
    if (load_remote_layers(pf) || kv_side_send(pf->fd, KV_MSG_READY, NULL, 0) || recv_request(pf))
        return -1;
    printf("prefill: request %s from %s: %u blocks per layer, %u layers, %u in flight at most\n",
           pf->req_id, pf->peer.agent, pf->count, pf->node.layers, pf->window);
    return 0;
}

/* ---- the layer loop ---- */

/* "Compute" layer l: write the request's blocks of it (the pattern stands in for the model's
 * keys and values). */
static void compute_layer(struct prefill *pf, uint32_t l)
{
    for (uint32_t i = 0; i < pf->count; i++)
        kv_fill_block(kv_block(&pf->node, l, pf->src[i]), l, pf->src[i], pf->node.block_size);
    if (pf->compute_us)
        kv_sleep_us(pf->compute_us);
    if (pf->corrupt == (int64_t)l) /* the self-test of decode's check */
        kv_block(&pf->node, l, pf->src[pf->count / 2])[pf->node.block_size / 2] ^= 0xff;
}

static void mark_done(struct prefill *pf, uint32_t l)
{
    pf->done_ns[l] = kv_now_ns() - pf->t0;
    pf->xfer[l] = NULL;
    pf->inflight--;
}

/* Prepare layer l's transfer (one descriptor pair per block: scattered on both sides) and post
 * it with its notification; it stays in pf->xfer[l] until done. */
static int post_layer(struct prefill *pf, uint32_t l)
{
    const struct kv_node *n = &pf->node;
    char notif[96];
    mc_kv_status_t st;

    for (uint32_t i = 0; i < pf->count; i++) {
        pf->local[i] =
            (mc_kv_desc_t){(uintptr_t)kv_block(n, l, pf->src[i]), n->block_size, 0, n->md[l]};
        pf->remote[i] = (mc_kv_desc_t){pf->remote_base[l] + (uint64_t)pf->dst[i] * n->block_size,
                                       n->block_size, 0, pf->remote_md[l]};
    }
    st = n->p->prep_xfer(n->b, MC_KV_WRITE, pf->local, pf->remote, pf->count, pf->peer.agent,
                         &pf->xfer[l]);
    if (st != MC_KV_SUCCESS)
        return kv_fail(n, "prep_xfer", st);
    pf->inflight++;
    if (pf->inflight > pf->max_inflight)
        pf->max_inflight = pf->inflight;
    pf->posted_ns[l] = kv_now_ns() - pf->t0;
    snprintf(notif, sizeof(notif), "%s:%u", pf->req_id, l);
    st = n->p->post_xfer(n->b, pf->xfer[l], notif, strlen(notif));
    if (st != MC_KV_SUCCESS && st != MC_KV_IN_PROG)
        return kv_fail(n, "post_xfer", st);
    return 0;
}

/* Check every pending transfer once; release those that are done. 1 if one finished, 0 if
 * none did, -1 on a failed transfer. */
static int reap(struct prefill *pf, uint32_t upto)
{
    const struct kv_node *n = &pf->node;
    int finished = 0;

    for (uint32_t l = pf->oldest; l <= upto; l++) {
        mc_kv_status_t st;

        if (pf->xfer[l] == NULL || (st = n->p->check_xfer(n->b, pf->xfer[l])) == MC_KV_IN_PROG)
            continue;
        if (st != MC_KV_SUCCESS) {
            kv_err("layer %u: transfer failed", l);
            return kv_fail(n, "check_xfer", st);
        }
        if ((st = n->p->release_xfer(n->b, pf->xfer[l])) != MC_KV_SUCCESS)
            return kv_fail(n, "release_xfer", st);
        mark_done(pf, l);
        finished = 1;
    }
    while (pf->oldest <= upto && pf->xfer[pf->oldest] == NULL)
        pf->oldest++;
    return finished;
}

/* Reap until at most `allowed` transfers are pending, or the timeout runs out. */
static int reap_until(struct prefill *pf, uint32_t upto, uint32_t allowed)
{
    uint64_t deadline = kv_now_ns() + (uint64_t)pf->cfg.timeout_ms * 1000000;

    for (;;) {
        int rc = reap(pf, upto);

        if (rc < 0)
            return -1;
        if (pf->inflight <= allowed)
            return 0;
        if (kv_now_ns() > deadline) {
            kv_err("layer %u: transfer not done after %d s", pf->oldest, pf->cfg.timeout_ms / 1000);
            return -1;
        }
        if (rc == 0)
            kv_sleep_us(20);
    }
}

static int run_layers(struct prefill *pf)
{
    uint32_t last = pf->node.layers - 1;

    for (uint32_t l = 0; l <= last; l++) {
        compute_layer(pf, l);
        if (post_layer(pf, l))
            return -1;
        /* Do not wait for this layer: only make room when the window is full. */
        if (reap_until(pf, l, pf->window - 1))
            return -1;
    }
    return reap_until(pf, last, 0);
}

/* ---- the end ---- */

/* Times since the request came in. A layer posted before the previous one is done is a transfer
 * that overlapped compute. */
static void print_layers(const struct prefill *pf)
{
    uint64_t last = 0;

    for (uint32_t l = 0; l < pf->node.layers; l++) {
        printf("prefill: layer %3u  posted at %8.3f ms  done at %8.3f ms\n", l,
               pf->posted_ns[l] / 1e6, pf->done_ns[l] / 1e6);
        last = pf->done_ns[l] > last ? pf->done_ns[l] : last;
    }
    printf("prefill: %u layers sent in %.3f ms, up to %u transfers in flight\n", pf->node.layers,
           last / 1e6, pf->max_inflight);
}

/* Decode's verdict: 0 and a message if it verified every layer. */
static int recv_result(struct prefill *pf)
{
    unsigned char buf[1024];
    struct kv_wire w = {.buf = buf};
    char msg[512];
    uint32_t code;

    if (kv_side_recv(pf->fd, KV_MSG_RESULT, buf, sizeof(buf), &w.cap, pf->cfg.timeout_ms))
        return -1;
    code = kv_get_u32(&w);
    kv_get_str(&w, msg, sizeof(msg));
    if (w.bad) {
        kv_err("side channel: malformed RESULT");
        return -1;
    }
    printf("prefill: decode says: %s\n", msg);
    return code == 0 ? 0 : -1;
}

static int alloc_layer_state(struct prefill *pf)
{
    uint32_t layers = pf->node.layers;

    pf->local = calloc(pf->count, sizeof(*pf->local));
    pf->remote = calloc(pf->count, sizeof(*pf->remote));
    pf->xfer = calloc(layers, sizeof(*pf->xfer));
    pf->posted_ns = calloc(layers, sizeof(*pf->posted_ns));
    pf->done_ns = calloc(layers, sizeof(*pf->done_ns));
    if (!pf->local || !pf->remote || !pf->xfer || !pf->posted_ns || !pf->done_ns) {
        kv_err("out of memory");
        return -1;
    }
    return 0;
}

/* Undo in reverse: pending transfers, decode's regions, decode itself, then our instance. */
static void teardown(struct prefill *pf)
{
    const struct kv_node *n = &pf->node;

    for (uint32_t l = 0; pf->xfer && l < n->layers; l++) {
        if (pf->xfer[l])
            n->p->release_xfer(n->b, pf->xfer[l]);
    }
    for (uint32_t l = 0; pf->remote_md && l < n->layers; l++) {
        if (pf->remote_md[l])
            n->p->unload_md(n->b, pf->remote_md[l]);
    }
    if (n->b && pf->peer.agent[0])
        n->p->disconnect(n->b, pf->peer.agent);
    kv_node_close(&pf->node);
    if (pf->fd >= 0)
        close(pf->fd);
    free(pf->remote_md);
    free(pf->remote_base);
    free(pf->src);
    free(pf->dst);
    free(pf->local);
    free(pf->remote);
    free(pf->xfer);
    free(pf->posted_ns);
    free(pf->done_ns);
}

int main(int argc, char **argv)
{
    struct prefill pf = {.fd = -1};
    int rc = -1;

    kv_prog = "kv_prefill";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parse_args(&pf, argc, argv))
        return 2;
    if (setup(&pf) == 0 && alloc_layer_state(&pf) == 0 && run_layers(&pf) == 0) {
        print_layers(&pf);
        rc = recv_result(&pf);
    }
    teardown(&pf);
    if (rc)
        kv_err("FAILED");
    return rc ? 1 : 0;
}
