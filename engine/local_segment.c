/* What this engine publishes about itself: its host identity and its segment descriptor (the
 * format is described in descriptor.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "engine_int.h"
#include "topology.h"

int mc__host_id(char *buf, size_t size)
{
    char boot[64] = "";
    struct stat st;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    if (!f || !fgets(boot, sizeof(boot), f)) {
        if (f)
            fclose(f);
        return mc__set_error(-EIO, "cannot read /proc/sys/kernel/random/boot_id");
    }
    fclose(f);
    boot[strcspn(boot, "\n")] = 0;
    if (stat("/proc/self/ns/net", &st) < 0)
        return mc__set_error(-errno, "cannot stat /proc/self/ns/net");
    snprintf(buf, size, "%s/net:%llu", boot, (unsigned long long)st.st_ino);
    return 0;
}

static json_t *buffers_json(mc_engine_t *e)
{
    json_t *arr = json_array();

    pthread_rwlock_rdlock(&e->mem.lock);
    for (size_t i = 0; arr && i < e->mem.n; i++) {
        const mc_buffer_t *b = e->mem.v[i];
        uint64_t chunk;
        json_t *jb = json_pack("{s:I,s:I,s:s,s:b}", "addr", (json_int_t)b->addr, "length",
                               (json_int_t)b->len, "location", b->location, "shm", b->memfd >= 0);
        json_t *rkeys = mc__rdma_rkeys_json(b, &chunk);
        if (jb && rkeys) {
            json_object_set_new(jb, "rkey", rkeys);
            json_object_set_new(jb, "mr_chunk", json_integer((json_int_t)chunk));
        }
        json_array_append_new(arr, jb);
    }
    pthread_rwlock_unlock(&e->mem.lock);
    return arr;
}

static json_t *endpoints_json(mc_engine_t *e)
{
    json_t *arr = json_array();

    for (unsigned i = 0; arr && i < e->n_listens; i++)
        json_array_append_new(
            arr, json_pack("{s:s,s:s}", "transport", "tcp", "addr", e->listen_addrs[i]));
    if (arr && e->shm_name[0])
        json_array_append_new(arr, json_pack("{s:s,s:s}", "transport", "shm", "addr", e->shm_name));
    return arr;
}

/* The NIC priority matrix, so that peers can choose their side too. */
static json_t *matrix_json(mc_engine_t *e)
{
    char *text;
    json_t *m = NULL;

    if (e->topo && mc__topo_matrix_json(e->topo, &text) == 0) {
        m = json_loads(text, 0, NULL);
        free(text);
    }
    return m ? m : json_object();
}

int mc__desc_encode_local(mc_engine_t *e, char **json_p, size_t *len_p)
{
    json_t *root =
        json_pack("{s:s,s:i,s:s,s:i,s:o,s:o,s:o}", "name", e->name, "version", MC_PROTO_VERSION,
                  "host", e->host_id, "pid", (int)getpid(), "endpoints", endpoints_json(e),
                  "buffers", buffers_json(e), "priority_matrix", matrix_json(e));
    json_t *rdma = mc__rdma_devices_json(e);
    char *text;

    if (root && rdma)
        json_object_set_new(root, "rdma", rdma);
    else
        json_decref(rdma);

    if (!root)
        return mc__set_error(-ENOMEM, "cannot build the segment descriptor");
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return mc__set_error(-ENOMEM, "cannot encode the segment descriptor");
    *json_p = text;
    *len_p = strlen(text);
    return 0;
}
