/* Messages (ordered per peer, dispatched to handlers) and notifications (message id 0)
 * (internal). The control transport carries them. */
#ifndef MC_MSG_H
#define MC_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "fwd.h"
#include "util/list.h"

typedef struct mc_msg {
    mc_list_t link;
    mc_segment_id_t target;
    uint8_t id;
    uint32_t len;
    char data[];
} mc_msg_t;

typedef struct mc_notify_item {
    mc_list_t link;
    char sender[MC_NAME_MAX];
    size_t len;
    char msg[];
} mc_notify_item_t;

/* Queue a message from the submission queue onto its peer (progress context). */
void mc__msg_route(mc_engine_t *e, mc_msg_t *m);
/* A message arrived from sender: dispatch it (progress context). */
void mc__msg_deliver(mc_engine_t *e, const char *sender, uint8_t id, const void *data, size_t len);
/* Queue a message from the progress context. */
int mc__msg_enqueue(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data,
                    size_t len);
/* A message is on its way: it no longer counts against the peer's queue. */
void mc__msg_sent(mc_peer_t *p, mc_msg_t *m);
void mc__msgs_fini(mc_engine_t *e);

#endif
