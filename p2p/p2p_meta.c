/* Metadata calls that ride out a store that is briefly unreachable (etcd restarting). */
#include <errno.h>
#include <string.h>

#include "p2p_int.h"

#define P2P_META_RETRY_MS 100

bool mc__p2p_meta_down(int rc)
{
    return rc == -MC_EMETA || rc == -MC_ETIMEOUT || rc == -ECONNREFUSED || rc == -EAGAIN;
}

int mc__p2p_meta_get(mc_p2p_t *p2p, const char *key, mc_meta_kv_t *kv_p)
{
    uint64_t end = mc__p2p_now_ms() + p2p->connect_timeout_ms;
    int rc;

    while ((rc = mc_meta_get(p2p->meta, key, strlen(key), kv_p)) != 0 && mc__p2p_meta_down(rc) &&
           mc__p2p_now_ms() < end)
        mc__p2p_sleep_ms(P2P_META_RETRY_MS);
    if (rc && rc != -ENOENT)
        mc__p2p_error(mc__p2p_meta_down(rc) ? -MC_EMETA : rc, "metadata get %s: %s", key,
                      mc_last_error());
    return rc && mc__p2p_meta_down(rc) ? -MC_EMETA : rc;
}
