/* Our own segment descriptor (the format is described in descriptor.c) and host identity. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "topology/topology.h"
#include "transport/transport.h"

int mc__host_id(char *buf, size_t size)
{
    char boot[64] = "";
    struct stat st;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, boot, sizeof(boot) - 1) : -1;

    if (fd >= 0)
        close(fd);
    if (n <= 0)
        return mc__set_error(-EIO, "cannot read /proc/sys/kernel/random/boot_id");
    boot[n] = 0;
    boot[strcspn(boot, "\n")] = 0;
    if (stat("/proc/self/ns/net", &st) < 0)
        return mc__set_error(-errno, "cannot stat /proc/self/ns/net");
    snprintf(buf, size, "%s/net:%llu", boot, (unsigned long long)st.st_ino);
    return 0;
}

static json_t *buffer_json(mc_engine_t *e, const mc_buffer_t *b)
{
    json_t *jb = json_pack("{s:I,s:I,s:s}", "addr", (json_int_t)b->addr, "length",
                           (json_int_t)b->len, "location", b->location);

    if (jb && b->internal && json_object_set_new(jb, "internal", json_true())) {
        json_decref(jb);
        return NULL;
    }
    if (jb && b->read_only && json_object_set_new(jb, "read_only", json_true())) {
        json_decref(jb);
        return NULL;
    }
    for (unsigned i = 0; jb && i < mc__n_transports; i++) {
        const mc_transport_ops_t *ops = mc__transports[i];
        if (e->tp[i] && mc__buffer_visible(b, i) && MC_TP_HAS(ops, encode_buffer) &&
            ops->encode_buffer(e, b, jb)) {
            json_decref(jb);
            return NULL;
        }
    }
    return jb;
}

/* Append the n buffers of v to arr; false when out of memory. */
static bool buffers_append(mc_engine_t *e, json_t *arr, mc_buffer_t *const *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        json_t *jb = buffer_json(e, v[i]);
        if (!jb || json_array_append_new(arr, jb))
            return false;
    }
    return true;
}

/* Memory, then the opaque buffers (files), whose addresses come after all memory. */
static json_t *buffers_json(mc_engine_t *e)
{
    json_t *arr = json_array();

    pthread_rwlock_rdlock(&e->mem.lock);
    if (arr && (!buffers_append(e, arr, e->mem.v, e->mem.n) ||
                !buffers_append(e, arr, e->mem.ov, e->mem.on))) {
        json_decref(arr);
        arr = NULL;
    }
    pthread_rwlock_unlock(&e->mem.lock);
    return arr;
}

/* The NIC priority matrix, so that peers can choose their side too. */
static json_t *matrix_json(mc_engine_t *e)
{
    char *text;
    json_t *m = NULL;

    if (mc__topo_matrix_json(&e->topo, &text) == 0) {
        m = json_loads(text, 0, NULL);
        free(text);
    }
    return m ? m : json_object();
}

int mc__desc_encode_local(mc_engine_t *e, char **json_p, size_t *len_p)
{
    char instance[17], *text;
    json_t *root;

    snprintf(instance, sizeof(instance), "%016llx", (unsigned long long)e->instance);
    root = json_pack("{s:s,s:i,s:s,s:s,s:i,s:o*,s:o}", "name", e->name, "version", MC_DESC_VERSION,
                     "host", e->host_id, "instance", instance, "pid", (int)getpid(), "buffers",
                     buffers_json(e), "priority_matrix", matrix_json(e));

    for (unsigned i = 0; root && i < mc__n_transports; i++) {
        const mc_transport_ops_t *ops = mc__transports[i];
        if (e->tp[i] && MC_TP_HAS(ops, encode) && ops->encode(e, root)) {
            json_decref(root);
            root = NULL;
        }
    }
    if (!root || !json_object_get(root, "buffers")) {
        json_decref(root);
        return mc__set_error(-ENOMEM, "cannot build the segment descriptor");
    }
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return mc__set_error(-ENOMEM, "cannot encode the segment descriptor");
    *json_p = text;
    *len_p = strlen(text);
    return 0;
}
