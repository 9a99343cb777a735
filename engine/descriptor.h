/*
 * Segment descriptors (internal): what an engine publishes about itself (metadata key
 * mooncake/[cluster/]ram/<name>, mc_segment_export, the handshake's descriptor reply) and what we
 * hold of each peer. The format is JSON, described in descriptor.c; the core writes and reads its
 * own fields (name, host, pid, buffers' address, length and location) and each transport its
 * parts, through the transport's encode ops and its codec here.
 */
#ifndef MC_DESCRIPTOR_H
#define MC_DESCRIPTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "fwd.h"

#define MC_DESC_VERSION 2
#define MC_OWNER_NONE   UINT8_MAX
#define MC_HOST_ID_MAX  96

struct mc_desc_buffer {
    uint64_t addr, len;
    char location[MC_LOCATION_MAX];
    uint32_t part[MC_TP_MAX];     /* offset + 1 of transport i's bytes for it in mc_desc_t.parts */
    uint32_t part_len[MC_TP_MAX]; /* and their length */
    bool read_only;               /* the owner may not write it: peers only read it */
    uint8_t owner;                /* 0: memory; else 1 + the slot of the transport whose codec said
                                     it owns this opaque buffer (a file): only it may move it;
                                     MC_OWNER_NONE: opaque, and no transport here knows its kind */
    bool internal;                /* the peer's own (bounce buffers): not listed to hosts */
    uint64_t added;               /* added by a key (mc_segment_add_buffer): its number among
                                     them, from 1; 0: listed by the descriptor */
    uint64_t serial;              /* its own number in its peer's view, never changed or given
                                     again (added is given anew when a key comes again) */
};

struct mc_desc {
    char name[MC_NAME_MAX];
    char host_id[MC_HOST_ID_MAX]; /* boot id + network namespace: equal means same host */
    uint64_t instance;            /* the engine's random instance; 0: not published */
    int pid;
    size_t n_buffers;
    mc_desc_buffer_t *buffers; /* sorted by addr; they may overlap */
    uint64_t max_len;          /* of the longest memory buffer: how far back a lookup looks
                                  (opaque ones never overlap: one look is enough) */
    void *tp[MC_TP_MAX];       /* each transport's decoded part (its codec's), or NULL */
    uint8_t *parts;            /* per-buffer bytes of the transports, 8-byte aligned pieces */
    size_t parts_len, parts_cap;
    size_t parts_dead; /* of them, the bytes of buffers replaced since (mc__desc_buffer_replaced) */
    unsigned parts_packs; /* how often they were packed together (offsets changed) */
    uint64_t keys_added;  /* buffers added by keys so far (mc_desc_buffer_t.added) */
    uint64_t serials;     /* the last mc_desc_buffer_t.serial given (a descriptor that replaces
                             this one carries it on, so that none is given twice) */
    uint32_t layout;      /* changes whenever entries move (one added or removed, the whole
                             descriptor replaced): an index into buffers taken earlier names the
                             same entry only while this is the same */
};

/* How a transport reads its parts of a peer's descriptor. Pure functions of the JSON: they are
 * fuzzed (fuzz/fuzz_desc.c). Every entry may be NULL. */
typedef struct mc_desc_codec {
    /* Its part of the descriptor object: a new object in *part_p (NULL when it has none), freed
     * with free_part. -MC_EPROTO with a reason on bad input. */
    int (*decode)(json_t *root, const char *name, void **part_p);
    /* Its part of one buffer object jb: stored with mc__desc_part_add(d, b, slot, ...). part is
     * what decode made of the whole descriptor. */
    int (*decode_buffer)(json_t *jb, const void *part, mc_desc_t *d, unsigned slot,
                         mc_desc_buffer_t *b);
    /* The same from its bytes in a buffer key (its key_pack op wrote them). part may be NULL
     * (the peer's descriptor is not known yet, or has no part of it): then it may store the
     * part the key carries in d->tp[slot] (settings of the owner's that its requests must
     * respect), which the descriptor replaces when it arrives. */
    int (*decode_key)(const uint8_t *in, size_t len, const void *part, mc_desc_t *d, unsigned slot,
                      mc_desc_buffer_t *b);
    void (*free_part)(void *part);
} mc_desc_codec_t;

/* Decode a peer descriptor: bounded and strict; -MC_EPROTO or -MC_EVERSION with a reason. Free
 * with mc__desc_free. */
int mc__desc_decode(const void *buf, size_t len, mc_desc_t *d);
void mc__desc_free(mc_desc_t *d);
/* The buffer of d holding [addr, addr+len), or NULL (binary search: buffers are sorted). */
const mc_desc_buffer_t *mc__desc_find(const mc_desc_t *d, uint64_t addr, uint64_t len);
/* The entry of [addr, addr+len) with that serial (mc_desc_buffer_t.serial), if d still has it:
 * the one a task was routed with, found again after entries moved. */
const mc_desc_buffer_t *mc__desc_entry(const mc_desc_t *d, uint64_t addr, uint64_t len,
                                       uint64_t serial);
/* Insert a buffer in order (its transport parts empty); *b_p points at it until the next
 * insertion. 0 or -ENOMEM. remove: take b out again. */
int mc__desc_buffer_add(mc_desc_t *d, uint64_t addr, uint64_t len, const char *location,
                        mc_desc_buffer_t **b_p);
void mc__desc_buffer_remove(mc_desc_t *d, mc_desc_buffer_t *b);
/* Take out b, whose range a newer entry (a buffer key) describes now. Its parts' bytes are dead;
 * once they are half of parts (and DESC_DEAD_PACK at least), the live ones are packed together
 * again: without it, a peer whose registration cache registers a range again and again would
 * fill parts up to its limit, past which keys are refused. Pointers to parts do not last. */
void mc__desc_buffer_replaced(mc_desc_t *d, mc_desc_buffer_t *b);

/* Store len bytes as transport slot's part of buffer b. 0 or -ENOMEM. */
int mc__desc_part_add(mc_desc_t *d, mc_desc_buffer_t *b, unsigned slot, const void *data,
                      size_t len);
/* Transport slot's bytes for buffer b, 8-byte aligned; NULL if it has none. */
static inline const void *mc__desc_part(const mc_desc_t *d, const mc_desc_buffer_t *b,
                                        unsigned slot)
{
    return b->part[slot] ? d->parts + b->part[slot] - 1 : NULL;
}

/* Our own descriptor as JSON text (malloc'ed, *len_p without the NUL). Any thread. */
int mc__desc_encode_local(mc_engine_t *e, char **json_p, size_t *len_p);

/* This host's identity: boot id and network namespace. */
int mc__host_id(char *buf, size_t size);

#endif
