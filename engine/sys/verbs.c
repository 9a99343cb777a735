/* libibverbs through dlopen: the functions of it the engine calls, forwarded (see verbs.h). */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include <infiniband/verbs.h>

#include "verbs.h"

#define MC_HIDDEN __attribute__((visibility("hidden")))
#define VERBS_LIB "libibverbs.so.1"

/* verbs.h turns these into inline wrappers around the exported functions. */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

/* X(return type, name, value when unavailable, (parameters), (arguments)) */
#define VERBS_FUNCS(X)                                                                             \
    X(struct ibv_device **, ibv_get_device_list, NULL, (int *n), (n))                              \
    X(const char *, ibv_get_device_name, NULL, (struct ibv_device * d), (d))                       \
    X(struct ibv_context *, ibv_open_device, NULL, (struct ibv_device * d), (d))                   \
    X(int, ibv_close_device, -1, (struct ibv_context * c), (c))                                    \
    X(int, ibv_query_device, -1, (struct ibv_context * c, struct ibv_device_attr * a), (c, a))     \
    X(int, ibv_query_port, -1,                                                                     \
      (struct ibv_context * c, uint8_t p, struct _compat_ibv_port_attr * a), (c, p, a))            \
    X(int, ibv_query_gid, -1, (struct ibv_context * c, uint8_t p, int i, union ibv_gid *g),        \
      (c, p, i, g))                                                                                \
    X(int, _ibv_query_gid_ex, -1,                                                                  \
      (struct ibv_context * c, uint32_t p, uint32_t i, struct ibv_gid_entry *g, uint32_t f,        \
       size_t s),                                                                                  \
      (c, p, i, g, f, s))                                                                          \
    X(int, ibv_get_async_event, -1, (struct ibv_context * c, struct ibv_async_event * ev),         \
      (c, ev))                                                                                     \
    X(struct ibv_pd *, ibv_alloc_pd, NULL, (struct ibv_context * c), (c))                          \
    X(int, ibv_dealloc_pd, -1, (struct ibv_pd * pd), (pd))                                         \
    X(struct ibv_mr *, ibv_reg_mr, NULL, (struct ibv_pd * pd, void *a, size_t l, int acc),         \
      (pd, a, l, acc))                                                                             \
    X(struct ibv_mr *, ibv_reg_mr_iova2, NULL,                                                     \
      (struct ibv_pd * pd, void *a, size_t l, uint64_t iova, unsigned int acc),                    \
      (pd, a, l, iova, acc))                                                                       \
    X(struct ibv_mr *, ibv_reg_dmabuf_mr, NULL,                                                    \
      (struct ibv_pd * pd, uint64_t o, size_t l, uint64_t iova, int fd, int acc),                  \
      (pd, o, l, iova, fd, acc))                                                                   \
    X(int, ibv_dereg_mr, -1, (struct ibv_mr * mr), (mr))                                           \
    X(struct ibv_comp_channel *, ibv_create_comp_channel, NULL, (struct ibv_context * c), (c))     \
    X(int, ibv_destroy_comp_channel, -1, (struct ibv_comp_channel * ch), (ch))                     \
    X(struct ibv_cq *, ibv_create_cq, NULL,                                                        \
      (struct ibv_context * c, int n, void *ctx, struct ibv_comp_channel *ch, int v),              \
      (c, n, ctx, ch, v))                                                                          \
    X(int, ibv_destroy_cq, -1, (struct ibv_cq * cq), (cq))                                         \
    X(int, ibv_get_cq_event, -1,                                                                   \
      (struct ibv_comp_channel * ch, struct ibv_cq * *cq, void **ctx), (ch, cq, ctx))              \
    X(struct ibv_qp *, ibv_create_qp, NULL, (struct ibv_pd * pd, struct ibv_qp_init_attr * a),     \
      (pd, a))                                                                                     \
    X(int, ibv_modify_qp, -1, (struct ibv_qp * qp, struct ibv_qp_attr * a, int m), (qp, a, m))     \
    X(int, ibv_destroy_qp, -1, (struct ibv_qp * qp), (qp))                                         \
    X(const char *, ibv_wc_status_str, "unknown status", (enum ibv_wc_status s), (s))              \
    X(const char *, ibv_event_type_str, "unknown event", (enum ibv_event_type t), (t))             \
    X(const char *, ibv_port_state_str, "unknown state", (enum ibv_port_state s), (s))

#define VERBS_VOID_FUNCS(X)                                                                        \
    X(ibv_free_device_list, (struct ibv_device * *l), (l))                                         \
    X(ibv_ack_async_event, (struct ibv_async_event * ev), (ev))                                    \
    X(ibv_ack_cq_events, (struct ibv_cq * cq, unsigned int n), (cq, n))

static struct {
#define X(ret, name, fail, params, args) ret(*name) params;
    VERBS_FUNCS(X)
#undef X
#define X(name, params, args) void(*name) params;
    VERBS_VOID_FUNCS(X)
#undef X
} fn;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool loaded;
static char why[256];

static void load(void)
{
    void *h = dlopen(VERBS_LIB, RTLD_NOW | RTLD_LOCAL);
    const char *missing = NULL;

    if (!h) {
        snprintf(why, sizeof(why), "cannot load %s: %s", VERBS_LIB, dlerror());
        return;
    }
#define X(ret, name, fail, params, args)                                                           \
    if (!(*(void **)&fn.name = dlsym(h, #name)) && !missing)                                       \
        missing = #name;
    VERBS_FUNCS(X)
#undef X
#define X(name, params, args)                                                                      \
    if (!(*(void **)&fn.name = dlsym(h, #name)) && !missing)                                       \
        missing = #name;
    VERBS_VOID_FUNCS(X)
#undef X
    if (missing) {
        snprintf(why, sizeof(why), "%s has no %s (rdma-core too old?)", VERBS_LIB, missing);
        dlclose(h);
        return;
    }
    loaded = true; /* the handle stays open for the life of the process */
}

bool mc__verbs_available(const char **why_p)
{
    pthread_once(&once, load);
    if (!loaded && why_p)
        *why_p = why;
    return loaded;
}

#define X(ret, name, fail, params, args)                                                           \
    MC_HIDDEN ret name params                                                                      \
    {                                                                                              \
        if (!mc__verbs_available(NULL)) {                                                          \
            errno = ENOSYS;                                                                        \
            return fail;                                                                           \
        }                                                                                          \
        return fn.name args;                                                                       \
    }
VERBS_FUNCS(X)
#undef X

#define X(name, params, args)                                                                      \
    MC_HIDDEN void name params                                                                     \
    {                                                                                              \
        if (mc__verbs_available(NULL))                                                             \
            fn.name args;                                                                          \
    }
VERBS_VOID_FUNCS(X)
#undef X
