/* Forward declarations and limits shared by the internal headers (internal). */
#ifndef MC_FWD_H
#define MC_FWD_H

#include <stdint.h>

#include <mooncake/engine.h>

#define MC_TP_MAX    8  /* transports one engine may have (transport/table.c) */
#define MC_MAX_RAILS 16 /* rails per peer and transport */
/* Buffers that are not memory of this process (files) get their addresses from here up to
 * MC_OPAQUE_END: no user-space pointer reaches it (at most 2^57 with 5-level paging), so a
 * segment's addresses never mix the two kinds, and every address stays a positive JSON
 * integer (descriptors). */
#define MC_OPAQUE_BASE 0x4000000000000000ull
#define MC_OPAQUE_END  0x7fffffffffffffffull

typedef struct mc_buffer mc_buffer_t;
typedef struct mc_desc mc_desc_t;
typedef struct mc_desc_buffer mc_desc_buffer_t;
typedef struct mc_peer mc_peer_t;
typedef struct mc_rail mc_rail_t;
typedef struct mc_task mc_task_t;
typedef struct mc_slice mc_slice_t;
typedef struct mc_link mc_link_t;
typedef struct mc_msg mc_msg_t;
typedef struct mc_transport_ops mc_transport_ops_t;

/* A message ring's records lent to the held queue, not copied (msg_ring.h). */
typedef struct mc_ring_lend {
    unsigned n;        /* records lent whose handlers did not run yet */
    uint64_t returned; /* while n: the ring position up to which every record was given back */
    unsigned slot;     /* the lending transport's: its reap gives them back (mc__reap_mark) */
} mc_ring_lend_t;

/* A message whose sender waits to hear that its handler ran: its stream, its number there and
 * the transport it came over (msg.c, MC__MSG_LATER). */
typedef struct mc_msg_tell {
    uint64_t stream, seq;
    uint8_t tp;
} mc_msg_tell_t;

/* A message lent by a ring and handed to its handler without a held record (callbacks.c). */
#define MC_QUICK_MAX 16
typedef struct mc_quick {
    const char *from;
    const void *msg;
    size_t len;
    mc_ring_lend_t *lend;
    uint64_t end;
    uint8_t id;
} mc_quick_t;

#endif
