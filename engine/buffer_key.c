/* Buffer keys: one registered buffer of ours, packed in MC_BUFFER_KEY_SIZE bytes, that a peer
 * adds to its view of us without our descriptor (hosts that carry remote keys of their own).
 *
 *    0 u32 magic "MCBK"   4 u8 version   5 u8 parts   6 u16 bytes used
 *    8 u64 owner's instance   16 u64 addr   24 u64 length   32 location (16 bytes, NUL padded)
 *   48 parts: u8 transport slot, u8 length, that transport's bytes for the buffer (key_pack)
 *   MC_BUFFER_KEY_SIZE - 1: u8 flags (bit 0: read-only memory), past what the parts use: an
 *   older packer's zero there (or a part, when its parts filled the key) says none
 *
 * Little-endian, zero-filled to the end. The bytes of each transport are what its codec stores
 * for the buffer when it decodes our descriptor, so the peer ends up with the same view either
 * way; its codec's decode_key checks them as strictly as the JSON. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "transport/transport.h"
#include "util/bytes.h"

#define KEY_MAGIC   0x4b42434du /* 'M' 'C' 'B' 'K' */
#define KEY_VERSION 1
#define KEY_HDR     48
#define KEY_LOC     16
#define KEY_FLAGS   (MC_BUFFER_KEY_SIZE - 1)
#define KEY_FLAG_RO 0x1u

_Static_assert(KEY_HDR < MC_BUFFER_KEY_SIZE, "a key needs room for its parts");

/* The parts of every transport that has some for b. Caller holds mem.lock for reading. */
static int pack_parts(mc_engine_t *e, const mc_buffer_t *b, uint8_t *key, size_t *used_p,
                      unsigned *n_p)
{
    size_t used = KEY_HDR;
    unsigned n = 0;

    for (unsigned i = 0; i < mc__n_transports; i++) {
        const mc_transport_ops_t *ops = mc__transports[i];
        if (!e->tp[i] || !mc__buffer_visible(b, i) || !MC_TP_HAS(ops, key_pack))
            continue;
        size_t room = KEY_FLAGS - used; /* (the flags byte stays free) */
        if (room < 3)
            return mc__set_error(-E2BIG, "buffer 0x%llx: its key does not fit in %d bytes",
                                 (unsigned long long)b->addr, MC_BUFFER_KEY_SIZE);
        int len = ops->key_pack(e, b, key + used + 2, room - 2 > 255 ? 255 : room - 2);
        if (len < 0)
            return len;
        if (!len)
            continue;
        key[used] = (uint8_t)i;
        key[used + 1] = (uint8_t)len;
        used += 2 + (size_t)len;
        n++;
    }
    *used_p = used;
    *n_p = n;
    return 0;
}

/* The key of the buffer holding [addr, addr+len): the nearest one (any), or the registration
 * of that range (reg: mc__mem_find_reg_locked). */
static int key_pack(mc_engine_t *e, const void *addr, size_t len, bool reg, void *out)
{
    uint8_t key[MC_BUFFER_KEY_SIZE] = {0};
    size_t used = 0;
    unsigned n = 0;
    mc_buffer_t *b;
    int rc;

    if (!e || !out)
        return mc__set_error(-EINVAL, "mc_buffer_key_pack: NULL argument");
    uint64_t a = (uint64_t)(uintptr_t)addr;
    pthread_rwlock_rdlock(&e->mem.lock);
    b = reg ? mc__mem_find_reg_locked(e, a, len) : mc__mem_find_any_locked(e, a, len);
    if (!b) {
        pthread_rwlock_unlock(&e->mem.lock);
        return mc__set_error(-ENOENT, "mc_buffer_key_pack: %p+%zu is in no registered buffer", addr,
                             len);
    }
    rc = strlen(b->location) < KEY_LOC
             ? 0
             : mc__set_error(-E2BIG, "location %s is too long for a key", b->location);
    if (!rc)
        rc = pack_parts(e, b, key, &used, &n);
    if (!rc) {
        mc__put32(key, KEY_MAGIC);
        key[4] = KEY_VERSION;
        key[5] = (uint8_t)n;
        mc__put16(key + 6, (uint16_t)used);
        mc__put64(key + 8, e->instance);
        mc__put64(key + 16, b->addr);
        mc__put64(key + 24, b->len);
        memcpy(key + 32, b->location, strlen(b->location));
        key[KEY_FLAGS] = b->read_only ? KEY_FLAG_RO : 0;
    }
    pthread_rwlock_unlock(&e->mem.lock);
    if (!rc)
        memcpy(out, key, sizeof(key));
    return rc;
}

int mc_buffer_key_pack(mc_engine_t *e, const void *addr, void *out)
{
    return key_pack(e, addr, 1, false, out);
}

int mc_buffer_key_pack_range(mc_engine_t *e, const void *addr, size_t len, void *out)
{
    if (!len)
        return mc__set_error(-EINVAL, "mc_buffer_key_pack_range: empty range");
    return key_pack(e, addr, len, true, out);
}

/* The header of a key, checked. */
static int key_header(const uint8_t *k, size_t len, uint64_t *addr_p, uint64_t *len_p, char *loc,
                      size_t *used_p)
{
    size_t used;

    if (len != MC_BUFFER_KEY_SIZE || mc__get32(k) != KEY_MAGIC || k[4] != KEY_VERSION)
        return mc__set_error(-MC_EPROTO, "not a buffer key (%zu bytes, magic %08x, version %u)",
                             len, len >= 5 ? mc__get32(k) : 0, len >= 5 ? k[4] : 0);
    used = mc__get16(k + 6);
    *addr_p = mc__get64(k + 16);
    *len_p = mc__get64(k + 24);
    if (used < KEY_HDR || used > MC_BUFFER_KEY_SIZE || !*len_p || *addr_p + *len_p < *addr_p ||
        !memchr(k + 32, 0, KEY_LOC) || !k[32])
        return mc__set_error(-MC_EPROTO, "buffer key: bad length, range or location");
    memcpy(loc, k + 32, KEY_LOC);
    *used_p = used;
    return 0;
}

/* Each transport's part into b, checked by the transport against d. */
static int key_parts(mc_engine_t *e, const uint8_t *k, size_t used, unsigned n, mc_desc_t *d,
                     mc_desc_buffer_t *b)
{
    size_t at = KEY_HDR;

    for (unsigned j = 0; j < n; j++) {
        if (used - at < 2 || used - at - 2 < k[at + 1])
            return mc__set_error(-MC_EPROTO, "buffer key: part %u overruns the key", j);
        unsigned slot = k[at], len = k[at + 1];
        const mc_transport_ops_t *ops = slot < mc__n_transports ? mc__transports[slot] : NULL;
        if (!ops)
            return mc__set_error(-MC_EPROTO, "buffer key: unknown transport %u", slot);
        /* A transport not in use here leaves it out: the buffer is reached by the others. */
        if (e->tp[slot] && ops->codec && ops->codec->decode_key) {
            int rc = ops->codec->decode_key(k + at + 2, len, d->tp[slot], d, slot, b);
            if (rc)
                return rc;
        }
        at += 2 + len;
    }
    return at == used ? 0 : mc__set_error(-MC_EPROTO, "buffer key: trailing bytes");
}

static bool same_parts(const mc_desc_t *d, const mc_desc_buffer_t *a, const mc_desc_buffer_t *b)
{
    for (unsigned i = 0; i < MC_TP_MAX; i++) {
        if (!a->part[i] != !b->part[i] || a->part_len[i] != b->part_len[i])
            return false;
        if (a->part[i] && memcmp(mc__desc_part(d, a, i), mc__desc_part(d, b, i), a->part_len[i]))
            return false;
    }
    return true;
}

/* The buffer key just added as b, of a range d holds already: that entry if it says the same
 * (b goes again); else NULL, and it is of an earlier registration of the range (a registration
 * cache, or memory registered again at the same address: what transports keep for it, memory
 * regions and their keys, is new), which goes. Caller holds peers_lock for writing. */
static mc_desc_buffer_t *known_as(mc_desc_t *d, mc_desc_buffer_t *b)
{
    size_t at = (size_t)(b - d->buffers), lo = at, hi = at + 1;

    while (lo > 0 && d->buffers[lo - 1].addr == b->addr) /* sorted: those of its address */
        lo--;
    while (hi < d->n_buffers && d->buffers[hi].addr == b->addr)
        hi++;
    for (size_t i = lo; i < hi; i++) {
        mc_desc_buffer_t *o = &d->buffers[i];
        if (o == b || o->len != b->len || strcmp(o->location, b->location))
            continue;
        if (same_parts(d, o, b))
            return o;
        mc__desc_buffer_replaced(d, o);
        return NULL;
    }
    return NULL;
}

int mc_segment_add_buffer(mc_engine_t *e, mc_segment_id_t id, const void *key, size_t len)
{
    const uint8_t *k = key;
    uint64_t addr = 0, blen = 0;
    char loc[KEY_LOC];
    size_t used = 0;
    mc_peer_t *p;
    mc_desc_buffer_t *b;
    int rc;

    if (!e || !key)
        return mc__set_error(-EINVAL, "mc_segment_add_buffer: NULL argument");
    rc = key_header(k, len, &addr, &blen, loc, &used);
    if (rc)
        return rc;
    /* a host that adds the key it is about to use, every time (UCX's module): its entry is the
     * newest already, unless another key came meanwhile */
    pthread_rwlock_rdlock(&e->peers_lock);
    p = mc__peer_get(e, id);
    bool newest = p && p->state != MC_SEGMENT_DEAD && p->desc.keys_added &&
                  p->key_newest_layout == p->desc.layout && !memcmp(p->key_newest, k, len);
    pthread_rwlock_unlock(&e->peers_lock);
    if (newest)
        return 0;
    pthread_rwlock_wrlock(&e->peers_lock);
    p = mc__peer_get(e, id);
    if (!p)
        rc = mc__set_error(-ENOENT, "no open segment with id %u", id);
    else if (p->desc.instance != mc__get64(k + 8))
        rc = mc__set_error(
            -MC_ENOSEGMENT, "the key is of engine instance %016llx, segment %s is %016llx",
            (unsigned long long)mc__get64(k + 8), p->name, (unsigned long long)p->desc.instance);
    else if (p->state == MC_SEGMENT_DEAD)
        rc = mc__set_error(-MC_EPEERDEAD, "%s", p->dead_reason);
    if (rc)
        goto out;
    size_t parts_len = p->desc.parts_len;
    unsigned packs = p->desc.parts_packs;
    rc = mc__desc_buffer_add(&p->desc, addr, blen, loc, &b);
    if (!rc) {
        b->read_only = used <= KEY_FLAGS && (k[KEY_FLAGS] & KEY_FLAG_RO);
        rc = key_parts(e, k, used, k[5], &p->desc, b);
        /* numbered before known_as, which may move b (it drops an earlier entry); the newest
         * key's buffer is used first (mc__desc_find), and one given again counts as new */
        uint64_t added = b->added = ++p->desc.keys_added;
        b->serial = ++p->desc.serials;
        mc_desc_buffer_t *same = rc ? NULL : known_as(&p->desc, b);
        bool drop = rc || same;
        if (same)
            same->added = added;
        if (drop && p->desc.parts_packs == packs) {
            mc__desc_buffer_remove(&p->desc, b); /* its bytes were the last added: taken back */
            p->desc.parts_len = parts_len;
        } else if (drop) {
            mc__desc_buffer_replaced(&p->desc, b); /* packed meanwhile: they are dead */
        }
        if (!rc) {
            memcpy(p->key_newest, k, len);
            p->key_newest_layout = p->desc.layout;
        }
    }
out:
    pthread_rwlock_unlock(&e->peers_lock);
    return rc;
}
