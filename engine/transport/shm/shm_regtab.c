/* The owner's side of the shared registration table (see shm_int.h). */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../sys/memfd.h"
#include "shm_int.h"

/* Lane i of the table's lanes counted across slots. */
#define LANE(t, i) (&(t)->slot[(i) / MC_REGTAB_LANES].lane[(i) % MC_REGTAB_LANES])

int mc__shm_regtab_create(mc_engine_t *e)
{
    int fd = mc__memfd_fixed("mooncake-regtab", sizeof(mc_regtab_t));
    void *p;

    if (fd < 0)
        return fd;
    p = mmap(NULL, sizeof(mc_regtab_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return -errno;
    }
    shm_of(e)->regtab = p;
    shm_of(e)->regtab_fd = fd;
    mc__shm_regtab_publish(e);
    return 0;
}

void mc__shm_regtab_destroy(mc_engine_t *e)
{
    shm_engine_t *s = shm_of(e);

    if (s->regtab) {
        munmap(s->regtab, sizeof(mc_regtab_t));
        close(s->regtab_fd);
        s->regtab = NULL;
    }
}

/* Rewrite the entries from the registration table (none once withdrawn). Caller holds
 * e->mem.lock (either mode; the table has one writer because registrations change under the
 * write lock, and the engine calls this right after each change), or withdraws. */
void mc__shm_regtab_publish(mc_engine_t *e)
{
    mc_regtab_t *t = shm_of(e)->regtab;
    bool gone = shm_of(e)->regtab_withdrawn; /* empty from then on */
    size_t n = gone ? 0 : e->mem.n < MC_REGTAB_ENTRIES ? e->mem.n : MC_REGTAB_ENTRIES;

    if (!t)
        return;
    atomic_fetch_add(&t->seq, 1); /* odd: readers retry */
    /* A reader that sees an entry written from here on sees seq odd when it reads it again
     * (its acquire fence, in covers). */
    atomic_thread_fence(memory_order_release);
    for (size_t i = 0; i < n; i++) {
        atomic_store_explicit(&t->ent[i].addr, e->mem.v[i]->addr, memory_order_relaxed);
        atomic_store_explicit(&t->ent[i].len, e->mem.v[i]->len, memory_order_relaxed);
    }
    atomic_store(&t->n, (uint32_t)n);
    atomic_store(&t->overflow, !gone && e->mem.n > MC_REGTAB_ENTRIES);
    atomic_fetch_add(&t->seq, 1);
}

/* The engine is going: empty the table, so that no peer's CMA starts on our memory any more,
 * and wait out those running, before the memory is unmapped or handed back to the host. Peers
 * hear that we went only when they see our connections close, which may be later. */
bool mc__shm_regtab_withdraw(mc_engine_t *e)
{
    if (!shm_of(e)->regtab)
        return true;
    shm_of(e)->regtab_withdrawn = true;
    mc__shm_regtab_publish(e);
    return mc__shm_regtab_grace(e, mc__now_ns() + (uint64_t)e->cfg.io_timeout_ms * MC_MS);
}

/* Whether the process slot was last handed to is gone (its calls with it): no such process, or
 * one that exited and waits to be reaped (a zombie makes no call). */
static bool slot_peer_gone(shm_engine_t *s, int slot)
{
    pid_t pid = atomic_load(&s->regtab_pid[slot]);
    char path[64], stat[256];
    bool gone = false;
    FILE *f;

    if (pid <= 0)
        return false;
    if (kill(pid, 0) < 0)
        return errno == ESRCH;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if ((f = fopen(path, "r"))) {
        /* "pid (comm) S ...": the state after the last ')' (comm may hold one) */
        size_t n = fread(stat, 1, sizeof(stat) - 1, f);
        stat[n] = 0;
        const char *r = strrchr(stat, ')');
        gone = r && (r[2] == 'Z' || r[2] == 'X');
        fclose(f);
    }
    return gone;
}

/* After a registration was removed: wait until no peer's CMA that might have seen it is still
 * running (each odd lane moves on, or its process is gone: one killed in a call leaves its lane
 * odd). false at the deadline: a peer may still write, and the caller must not let the memory
 * go. */
bool mc__shm_regtab_grace(mc_engine_t *e, uint64_t deadline_ns)
{
    shm_engine_t *s = shm_of(e);
    mc_regtab_t *t = s->regtab;

    if (!t)
        return true;
    /* A lane read later than the removal may show a newer call, which saw the removal: waiting
     * for it as well costs only that call's time. */
    for (int i = 0; i < MC_REGTAB_SLOTS * MC_REGTAB_LANES; i++) {
        uint64_t seen = atomic_load(LANE(t, i));
        while ((seen & 1) && atomic_load(LANE(t, i)) == seen &&
               !slot_peer_gone(s, i / MC_REGTAB_LANES)) {
            if (mc__now_ns() > deadline_ns) {
                mc_warn("unregister: a same-host peer's copy did not finish in time");
                return false;
            }
            usleep(50);
        }
    }
    return true;
}

int mc__shm_regtab_slot_get(mc_engine_t *e)
{
    shm_engine_t *s = shm_of(e);

    for (int i = 0; i < MC_REGTAB_SLOTS; i++) {
        if (!s->regtab_used[i]) {
            s->regtab_used[i] = true;
            for (int l = 0; l < MC_REGTAB_LANES; l++)
                atomic_store(&s->regtab->slot[i].lane[l], 0);
            return i;
        }
    }
    return -ENOSPC;
}

void mc__shm_regtab_slot_put(mc_engine_t *e, int slot)
{
    if (slot >= 0 && slot < MC_REGTAB_SLOTS)
        shm_of(e)->regtab_used[slot] = false;
}

/* How long a reader waits for a consistent table: an owner that died while rewriting it leaves
 * seq odd for good. A reader that gives up says "not covered", and the task goes over another
 * transport, which asks the owner itself. Long enough for an owner preempted mid-rewrite on a
 * loaded machine; the reader yields its core meanwhile. */
#define REGTAB_WAIT_NS (100 * MC_MS)

bool mc__shm_regtab_covers(const mc_regtab_t *t, uint64_t addr, uint64_t len)
{
    uint64_t deadline = 0;

    for (;;) {
        uint64_t s0 = atomic_load(&t->seq);
        bool ok = false;
        if (!(s0 & 1)) {
            uint32_t n = atomic_load(&t->n);
            for (uint32_t i = 0; i < n && i < MC_REGTAB_ENTRIES && !ok; i++) {
                uint64_t a = atomic_load_explicit(&t->ent[i].addr, memory_order_relaxed);
                uint64_t l = atomic_load_explicit(&t->ent[i].len, memory_order_relaxed);
                ok = addr >= a && len <= l && addr - a <= l - len;
            }
            /* the entries are read before seq is again (a load of seq alone lets them pass it) */
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&t->seq, memory_order_relaxed) == s0)
                return ok;
        }
        uint64_t now = mc__now_ns();
        if (!deadline)
            deadline = now + REGTAB_WAIT_NS;
        else if (now > deadline)
            return false;
        else
            sched_yield();
    }
}
