/*
 * Notifications: the engine's, which name the sender's segment; a host wants the sender's agent
 * name, so every one this plugin sends starts with it, and the receiver checks it against the
 * segment: [u32 KV_NOTIF_MAGIC][u8 agent length][agent][message]. Without the magic a plain
 * engine notification (a process that uses the engine itself) whose first byte happened to fit
 * read as another agent's, its message cut.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

#define HDR 5 /* magic and agent length */

_Static_assert(HDR + MC_KV_AGENT_MAX + MC_KV_NOTIF_MAX <= MC_MSG_MAX,
               "a notification and its sender's name must fit an engine message");

mc_kv_status_t kv__notif_pack(mc_kv_backend_t *b, const void *msg, size_t len, void **out_p,
                              size_t *out_len_p)
{
    size_t name_len = strlen(b->agent);
    uint32_t magic = KV_NOTIF_MAGIC;
    unsigned char *p;

    if (len > MC_KV_NOTIF_MAX || (len && !msg))
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "notification of %zu bytes: at most %d, and not NULL", len,
                        MC_KV_NOTIF_MAX);
    if (!(p = malloc(HDR + name_len + len)))
        return kv__fail(b, MC_KV_ERR_BACKEND, "notification: out of memory");
    memcpy(p, &magic, 4);
    p[4] = (unsigned char)name_len;
    memcpy(p + HDR, b->agent, name_len);
    if (len)
        memcpy(p + HDR + name_len, msg, len);
    *out_p = p;
    *out_len_p = HDR + name_len + len;
    return MC_KV_SUCCESS;
}

mc_kv_status_t kv__gen_notif(mc_kv_backend_t *b, const char *agent, const void *msg, size_t len)
{
    mc_segment_id_t seg = MC_SEGMENT_INVALID;
    mc_kv_status_t st;
    kv_agent_t *a;
    size_t plen;
    void *p;
    int rc;

    pthread_rwlock_rdlock(&b->agents_lock);
    if ((a = agent ? kv__agent_find(b, agent) : NULL))
        seg = a->seg;
    pthread_rwlock_unlock(&b->agents_lock);
    if (!a)
        return kv__fail(b, MC_KV_ERR_NOT_FOUND, "gen_notif: agent '%s' is not loaded",
                        agent ? agent : "(null)");
    if ((st = kv__notif_pack(b, msg, len, &p, &plen)))
        return st;
    rc = mc_notify_send(b->engine, seg, p, plen);
    free(p);
    if (rc == -EAGAIN)
        return kv__fail(b, MC_KV_ERR_BACKEND,
                        "gen_notif: the message window to '%s' is full (%d notifications or %d "
                        "bytes queued or unacknowledged: the peer does not keep up); retry later",
                        agent, MC_MSG_WINDOW, MC_MSG_WINDOW_BYTES);
    return rc < 0 ? kv__fail_engine(b, rc, "gen_notif") : MC_KV_SUCCESS;
}

/* Whether a notification that names agent `claimed` may come from segment `sender` (the name
 * the engine gives the process it came from; the name is the sender's word, the segment is
 * not). An agent whose connection info is loaded is known by its segment: a notification that
 * names it must come from that segment, and one from a loaded agent's segment must name that
 * agent (a process restarted at the segment of a loaded agent is that agent until the host
 * disconnects it). A sender that names no loaded agent, from no loaded agent's segment, is
 * taken at its word: hosts get notifications from agents they never loaded (vLLM's prefill side
 * does not load the decode side that READs from it with a notification). A plain engine
 * notification (plain: not in this plugin's format) names its segment, which must then not be
 * a loaded agent's name from another segment. Caller is exclusive. */
static mc_kv_status_t notif_sender_check(mc_kv_backend_t *b, const char *sender,
                                         const char *claimed, bool plain)
{
    const kv_agent_t *named, *from = NULL;
    mc_kv_status_t st = MC_KV_SUCCESS;

    pthread_rwlock_rdlock(&b->agents_lock);
    if (!(named = kv__agent_find(b, claimed)) && !plain) /* (plain: named by its segment) */
        for (from = b->agents; from && strcmp(from->segment, sender); from = from->next)
            ;
    if (named && strcmp(named->segment, sender))
        st = kv__fail(b, MC_KV_ERR_MISMATCH,
                      "get_notif: a notification from segment '%s' names agent '%s', whose "
                      "segment is '%s': dropped",
                      sender, claimed, named->segment);
    else if (from)
        st = kv__fail(b, MC_KV_ERR_MISMATCH,
                      "get_notif: a notification from agent '%s' (segment '%s') names agent "
                      "'%s': dropped",
                      from->name, sender, claimed);
    pthread_rwlock_unlock(&b->agents_lock);
    return st;
}

/* Whether n is one this plugin sent (*name_len_p: its agent name's length). */
static bool notif_framed(const mc_notify_t *n, size_t *name_len_p)
{
    uint32_t magic = 0;
    size_t name_len;

    if (n->len < HDR)
        return false;
    memcpy(&magic, n->msg, 4);
    name_len = (unsigned char)n->msg[4];
    *name_len_p = name_len;
    return magic == KV_NOTIF_MAGIC && name_len && name_len < MC_KV_AGENT_MAX &&
           HDR + name_len <= n->len && n->len - HDR - name_len <= MC_KV_NOTIF_MAX;
}

int kv__get_notif(mc_kv_backend_t *b, mc_kv_notif_t *out)
{
    mc_notify_t *n = b->notif;
    char agent[MC_KV_AGENT_MAX];
    const char *msg;
    size_t name_len, len;
    mc_kv_status_t st;

    if (!out)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "get_notif: NULL output");
    if (b->drives_progress)
        mc_engine_progress(b->engine);
    if (mc_notify_pop(b->engine, n) != 1)
        return 0;
    if (notif_framed(n, &name_len)) {
        memcpy(agent, n->msg + HDR, name_len);
        agent[name_len] = 0;
        msg = n->msg + HDR + name_len;
        len = n->len - HDR - name_len;
    } else {
        /* A plain engine notification: its sender is the segment name. */
        if (n->len > MC_KV_NOTIF_MAX)
            return kv__fail(b, MC_KV_ERR_NOT_SUPPORTED,
                            "get_notif: a plain engine notification of %zu bytes from segment "
                            "'%s', more than a notification holds (%d): dropped",
                            n->len, n->sender, MC_KV_NOTIF_MAX);
        snprintf(agent, sizeof(agent), "%s", n->sender);
        msg = n->msg;
        len = n->len;
    }
    if ((st = notif_sender_check(b, n->sender, agent, msg == n->msg)))
        return st;
    memcpy(out->agent, agent, sizeof(agent));
    out->len = len;
    memcpy(out->msg, msg, len);
    return 1;
}
