/*
 * Notifications: the engine's, which name the sender's segment; a host wants the sender's agent
 * name, so every one starts with it.
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

int kv__get_notif(mc_kv_backend_t *b, mc_kv_notif_t *out)
{
    mc_notify_t *n = b->notif;
    size_t name_len;

    if (!out)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "get_notif: NULL output");
    if (mc_notify_pop(b->engine, n) != 1)
        return 0;
    name_len = n->len ? (unsigned char)n->msg[0] : 0;
    if (!n->len || 1 + name_len > n->len || name_len >= MC_KV_AGENT_MAX ||
        n->len - 1 - name_len > MC_KV_NOTIF_MAX) {
        /* Not one of ours (a plain engine notification): its sender is the segment name. */
        snprintf(out->agent, sizeof(out->agent), "%s", n->sender);
        out->len = n->len < MC_KV_NOTIF_MAX ? n->len : MC_KV_NOTIF_MAX;
        memcpy(out->msg, n->msg, out->len);
        return 1;
    }
    memcpy(out->agent, n->msg + 1, name_len);
    out->agent[name_len] = 0;
    out->len = n->len - 1 - name_len;
    memcpy(out->msg, n->msg + 1 + name_len, out->len);
    return 1;
}
