/* The core's side of the transport interface: slots, lookup by name, and the routing of
 * control requests and links between the control transport and the others. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "transport/transport.h"

static pthread_once_t slots_once = PTHREAD_ONCE_INIT;

static void assign_slots(void)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        *mc__transports[i]->slot = i;
}

void mc__transports_setup(void)
{
    pthread_once(&slots_once, assign_slots);
}

unsigned mc__transport_control(void)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (mc__transports[i]->flags & MC_TP_CONTROL)
            return i;
    return 0; /* table.c always has one */
}

int mc__transport_find(const char *name)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (!strcmp(mc__transports[i]->name, name))
            return (int)i;
    return -ENOENT;
}

bool mc__ctrl_ready(mc_engine_t *e, mc_peer_t *p)
{
    return mc__transports[e->ctrl]->ctrl_ready(e, p);
}

int mc__grant_ask(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], grant_ask))
            return mc__transports[i]->grant_ask(e, p, addr, serial);
    return -ENOTSUP;
}

void mc__grant_answer(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial, bool ok)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], grant_answer))
            mc__transports[i]->grant_answer(e, p, addr, serial, ok);
}

unsigned mc__revoke(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial)
{
    unsigned busy = 0;

    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], revoke))
            busy += mc__transports[i]->revoke(e, p, addr, serial);
    return busy;
}

int mc__ctrl_request(mc_engine_t *e, mc_peer_t *p, mc_slice_t *s, mc_link_t **link_p)
{
    const mc_transport_ops_t *ctrl = mc__transports[e->ctrl];

    return ctrl->ctrl_send(e, p, s, link_p);
}

int mc__ctrl_deliver(mc_engine_t *e, mc_link_t *l, unsigned slot, const void *req, size_t len,
                     void *ans, size_t *ans_len)
{
    const mc_transport_ops_t *ops = slot < mc__n_transports ? mc__transports[slot] : NULL;

    *ans_len = 0;
    if (!ops || !e->tp[slot] || !MC_TP_HAS(ops, ctrl_recv))
        return mc__set_error(-MC_ENODEV, "%s has no transport %u to answer a control request",
                             e->name, slot);
    return ops->ctrl_recv(e, l, req, len, ans, ans_len);
}

void mc__ctrl_defer(mc_link_t *l, unsigned slot, mc_ctrl_later_t *w)
{
    w->link = l;
    w->id = l->req_id;
    mc__link_bind(l, &w->bound, slot);
}

void mc__ctrl_answer(mc_engine_t *e, mc_ctrl_later_t *w, int status, const void *ans, size_t len)
{
    const mc_transport_ops_t *ctrl = mc__transports[e->ctrl];
    mc_link_t *l = w->link;

    if (!l)
        return; /* the link went: the asker heard of it */
    mc__link_unbind(&w->bound);
    w->link = NULL;
    if (!MC_TP_HAS(ctrl, ctrl_answer))
        mc_warn("%s cannot answer control requests later", ctrl->name);
    else if (ctrl->ctrl_answer(e, l, w->id, status, ans, len))
        mc_debug("answer to control request %u not sent: %s", w->id, mc_last_error());
}

void mc__ctrl_answered(mc_engine_t *e, mc_slice_t *s, mc_link_t *l, int status, const void *ans,
                       size_t len)
{
    const mc_transport_ops_t *ops = mc__transports[s->tp];

    if (s->ctx && MC_TP_HAS(ops, ctrl_reply))
        ops->ctrl_reply(e, s, l, status, ans, len);
}

void mc__link_lost(mc_engine_t *e, mc_link_t *l)
{
    mc_list_t *n;

    while ((n = mc_list_pop_front(&l->bound))) {
        mc_link_bound_t *b = mc_container_of(n, mc_link_bound_t, node);
        mc__transports[b->tp]->link_lost(e, b);
    }
}
