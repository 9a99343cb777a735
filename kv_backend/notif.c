/*
 * Notifications: the engine's, which name the sender's segment; a host wants the sender's agent
 * name, so every one starts with it, and the receiver checks it against the segment.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

_Static_assert(1 + MC_KV_AGENT_MAX + MC_KV_NOTIF_MAX <= MC_MSG_MAX,
               "a notification and its sender's name must fit an engine message");

mc_kv_status_t kv__notif_pack(mc_kv_backend_t *b, const void *msg, size_t len, void **out_p,
                              size_t *out_len_p)
{
    size_t name_len = strlen(b->agent);
    unsigned char *p;

    if (len > MC_KV_NOTIF_MAX || (len && !msg))
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "notification of %zu bytes: at most %d, and not NULL", len,
                        MC_KV_NOTIF_MAX);
    if (!(p = malloc(1 + name_len + len)))
        return kv__fail(b, MC_KV_ERR_BACKEND, "notification: out of memory");
    p[0] = (unsigned char)name_len;
    memcpy(p + 1, b->agent, name_len);
    if (len)
        memcpy(p + 1 + name_len, msg, len);
    *out_p = p;
    *out_len_p = 1 + name_len + len;
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
                        "gen_notif: %d notifications to '%s' are not acknowledged yet (the peer "
                        "does not keep up); retry later",
                        MC_MSG_WINDOW, agent);
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

int kv__get_notif(mc_kv_backend_t *b, mc_kv_notif_t *out)
{
    mc_notify_t *n = b->notif;
    char agent[MC_KV_AGENT_MAX];
    const char *msg;
    size_t name_len, len;
    mc_kv_status_t st;

    if (!out)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "get_notif: NULL output");
    if (mc_notify_pop(b->engine, n) != 1)
        return 0;
    name_len = n->len ? (unsigned char)n->msg[0] : 0;
    if (!n->len || 1 + name_len > n->len || name_len >= MC_KV_AGENT_MAX ||
        n->len - 1 - name_len > MC_KV_NOTIF_MAX) {
        /* Not one of ours (a plain engine notification): its sender is the segment name. */
        snprintf(agent, sizeof(agent), "%s", n->sender);
        msg = n->msg;
        len = n->len < MC_KV_NOTIF_MAX ? n->len : MC_KV_NOTIF_MAX;
    } else {
        memcpy(agent, n->msg + 1, name_len);
        agent[name_len] = 0;
        msg = n->msg + 1 + name_len;
        len = n->len - 1 - name_len;
    }
    if ((st = notif_sender_check(b, n->sender, agent, msg == n->msg)))
        return st;
    memcpy(out->agent, agent, sizeof(agent));
    out->len = len;
    memcpy(out->msg, msg, len);
    return 1;
}
