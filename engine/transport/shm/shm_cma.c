/*
 * Same-host transport, memory that is not the engine's: CMA (process_vm_readv/writev), each call
 * checked against the owner's registration table on a lane of our slot (see shm_int.h). A long
 * run of requests is cut into pieces that helper threads (util/crew.h, MC_SHM_CMA_THREADS) move
 * next to the submitting thread, one call per piece on a lane of its own.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "shm_int.h"
#include "../../util/thread_buf.h"

#define CMA_IOV         1024       /* iovecs per process_vm_readv/writev call (IOV_MAX) */
#define CMA_PIECE_TASKS 256        /* a long run is shared out in pieces of at most this many */
#define CMA_PIECE_BYTES (2u << 20) /* ... or this many bytes */
#define CMA_CALL_BYTES  (1u << 30) /* per call: one moves at most 2 GiB - 4 KiB */

/* Whether t may join a CMA run that starts at t0 (the owner's table not asked). */
static bool cma_like(const mc_task_t *t0, const mc_task_t *t)
{
    return t->peer == t0->peer && t->req.opcode == t0->req.opcode && t->tp == mc__shm_slot &&
           t->tp_hint == SHM_BY_CMA && atomic_load(&t->state) == MC_TASK_WAITING;
}

/* A lane of s's slot, held: the first one free from hint on, else hint's. */
static unsigned lane_take(shm_peer_t *s, unsigned hint)
{
    for (unsigned k = 0; k < s->lanes; k++) {
        unsigned l = (hint + k) % s->lanes;
        if (!pthread_mutex_trylock(&s->cma_lock[l]))
            return l;
    }
    pthread_mutex_lock(&s->cma_lock[hint % s->lanes]);
    return hint % s->lanes;
}

/* What one CMA call did: the run [i, end) it was given (end == i: none could go), and what
 * the call returned (got; errno in err). */
typedef struct cma_call {
    size_t end;
    ssize_t got;
    int err;
} cma_call_t;

/* One task larger than a call moves: one call per CMA_CALL_BYTES, while each moves all it was
 * asked. What they moved, or the first call's error. Between two calls the lane goes even and
 * odd again, and the range is checked again: an unregister's grace waits for one call, not the
 * task, and the calls after it see the range gone (they stop there: the task fails). */
static ssize_t cma_big(shm_peer_t *s, _Atomic uint64_t *lane, const mc_task_t *t)
{
    ssize_t total = 0;

    for (uint64_t off = 0; off < t->req.length;) {
        uint64_t len = t->req.length - off < CMA_CALL_BYTES ? t->req.length - off : CMA_CALL_BYTES;
        if (off) {
            atomic_fetch_add(lane, 2);
            if (!mc__shm_regtab_covers(s->regtab, t->req.target_offset, t->req.length))
                break;
        }
        struct iovec l = {(uint8_t *)t->req.local + off, len},
                     r = {(void *)(uintptr_t)(t->req.target_offset + off), len};
        ssize_t got = t->req.opcode == MC_WRITE ? process_vm_writev(s->pid, &l, 1, &r, 1, 0)
                                                : process_vm_readv(s->pid, &l, 1, &r, 1, 0);
        if (got < 0)
            return total ? total : got;
        total += got;
        off += len;
        if ((uint64_t)got < len)
            break;
    }
    return total;
}

/* One process_vm_writev/readv for the run of tasks from tasks[i] (below n; at most CMA_IOV of
 * them and CMA_CALL_BYTES, or one task of any size), on a lane of our slot: the lane is odd
 * during the check and the call (see shm_int.h). Touches no task. */
static void cma_move(shm_peer_t *s, mc_task_t *tasks, size_t i, size_t n, unsigned hint,
                     cma_call_t *r)
{
    static mc_thread_buf_t tb = MC_THREAD_BUF_INIT(2 * CMA_IOV * sizeof(struct iovec));
    static __thread void *mine; /* 32 KiB: not on the stack */
    struct iovec few[2][8], *liov = mc__thread_buf(&tb, &mine), *riov = few[1];
    size_t max = 8;
    if (liov) {
        riov = liov + CMA_IOV;
        max = CMA_IOV;
    } else { /* no memory for them: a few at a time */
        liov = few[0];
    }
    unsigned l = lane_take(s, hint);
    _Atomic uint64_t *lane = &s->regtab->slot[s->slot].lane[l];
    uint64_t bytes = 0;
    size_t j = i, k = 0;

    atomic_fetch_add(lane, 1);
    for (; j < n && k < max && cma_like(&tasks[i], &tasks[j]) &&
           (!k || bytes + tasks[j].req.length <= CMA_CALL_BYTES) &&
           mc__shm_regtab_covers(s->regtab, tasks[j].req.target_offset, tasks[j].req.length);
         j++, k++) {
        liov[k] = (struct iovec){tasks[j].req.local, tasks[j].req.length};
        riov[k] =
            (struct iovec){(void *)(uintptr_t)tasks[j].req.target_offset, tasks[j].req.length};
        bytes += tasks[j].req.length;
    }
    r->got = !k                                ? 0
             : bytes > CMA_CALL_BYTES          ? cma_big(s, lane, &tasks[i])
             : tasks[i].req.opcode == MC_WRITE ? process_vm_writev(s->pid, liov, k, riov, k, 0)
                                               : process_vm_readv(s->pid, liov, k, riov, k, 0);
    r->err = errno;
    r->end = j;
    atomic_fetch_add(lane, 1);
    pthread_mutex_unlock(&s->cma_lock[l]);
}

/* The tasks of a call from tasks[i] end as it says. Returns the end of its run; i when nothing
 * moved (the tasks then go over another transport). */
static size_t cma_settle(mc_engine_t *e, shm_peer_t *s, mc_task_t *tasks, size_t i,
                         const cma_call_t *r)
{
    ssize_t got = r->got;
    int err = r->err;

    /* Not permitted (ptrace restrictions) or not there (a seccomp filter, a kernel without
     * it): never again to this peer, and these go over another transport. */
    if (r->end > i && got < 0 && (err == EPERM || err == ENOSYS)) {
        if (!atomic_exchange(&s->cma_off, true))
            mc_warn("CMA to %s unavailable (%s): other transports carry what shared memory "
                    "does not map",
                    tasks[i].peer->name, strerror(err));
        return i;
    }
    bool moved = got >= 0;
    for (size_t x = i; x < r->end; x++) {
        uint64_t len = tasks[x].req.length;
        if (got >= 0 && (uint64_t)got >= len) {
            got -= (ssize_t)len;
            mc__shm_task_done(e, &tasks[x]);
        } else {
            mc__task_finish(&tasks[x], MC_TASK_FAILED,
                            !moved && err == ESRCH ? -MC_EPEERDEAD : -MC_EACCESS,
                            "segment %s: CMA %s: %s", tasks[x].peer->name,
                            moved ? "moved less than asked" : "failed",
                            moved ? "owner memory changed" : strerror(err));
            got = -1;
        }
    }
    return r->end;
}

/* Move a run of tasks from tasks[i] with one call. Returns the end of the run; i when nothing
 * moved. */
static size_t cma_one(mc_engine_t *e, shm_peer_t *s, mc_task_t *tasks, size_t i, size_t n)
{
    cma_call_t r;

    cma_move(s, tasks, i, n, 0, &r);
    return cma_settle(e, s, tasks, i, &r);
}

/* The helpers, started by the first run long enough to share (NULL: none). */
static mc_crew_t *cma_crew(shm_engine_t *se)
{
    pthread_mutex_lock(&se->crew_lock);
    if (se->cma_helpers && !se->crew_tried) {
        se->crew_tried = true;
        int rc = mc__crew_create(se->cma_helpers, &se->crew);
        if (rc)
            mc_warn("shm: no CMA helper threads (%s): one thread moves each run", strerror(-rc));
    }
    pthread_mutex_unlock(&se->crew_lock);
    return se->crew;
}

typedef struct cma_job {
    shm_peer_t *s;
    mc_task_t *tasks;
    size_t *start; /* piece p is the run [start[p], start[p + 1]) */
    cma_call_t *call;
} cma_job_t;

/* Cut tasks [i, end) into pieces of CMA_PIECE_TASKS requests or CMA_PIECE_BYTES: how many; the
 * first task of each in start[] (NULL: count only). */
static size_t cut(const mc_task_t *tasks, size_t i, size_t end, size_t *start)
{
    size_t pieces = 0, in_piece = 0, bytes = 0;

    for (size_t x = i; x < end; x++) {
        if (in_piece++ == 0) {
            if (start)
                start[pieces] = x;
            pieces++;
        }
        bytes += tasks[x].req.length;
        if (in_piece == CMA_PIECE_TASKS || bytes >= CMA_PIECE_BYTES)
            in_piece = bytes = 0;
    }
    return pieces;
}

static void cma_piece(void *arg, size_t p)
{
    cma_job_t *j = arg;

    cma_move(j->s, j->tasks, j->start[p], j->start[p + 1], (unsigned)p, &j->call[p]);
}

/* A long run of CMA tasks from tasks[i] is cut into pieces of CMA_PIECE_TASKS requests or
 * CMA_PIECE_BYTES, which the helpers and this thread move side by side, each piece with one
 * call on a lane of its own (a thread copies 4 KiB pieces of another process's memory at
 * 0.4-0.6 M/s on the project's VM, two at 0.8-1.1 M/s: mc-cma-bw --pattern random). Returns the
 * end of the run, every task in it moved, failed or sent to another transport; i when the run is
 * too short to share, or nobody would help. An ORDERED task ends the run (it is not shared: its
 * writes land in order). */
static size_t cma_shared(mc_engine_t *e, shm_peer_t *s, mc_task_t *tasks, size_t i, size_t n)
{
    size_t end = i, pieces;
    cma_job_t job = {.s = s, .tasks = tasks};
    mc_crew_t *crew;

    if (s->lanes < 2 || !shm_of(e)->cma_helpers)
        return i;
    while (end < n && cma_like(&tasks[i], &tasks[end]) && !tasks[end].ordered)
        end++;
    pieces = cut(tasks, i, end, NULL);
    if (pieces < 2 || !(crew = cma_crew(shm_of(e))))
        return i;
    job.start = malloc((pieces + 1) * sizeof(*job.start));
    job.call = malloc(pieces * sizeof(*job.call));
    if (!job.start || !job.call) {
        free(job.start);
        free(job.call);
        return i;
    }
    cut(tasks, i, end, job.start);
    job.start[pieces] = end;
    mc__crew_run(crew, pieces, cma_piece, &job);
    /* In order; what a piece left (a request outside the owner's table, CMA refused) goes
     * alone, or over another transport. */
    for (size_t p = 0; p < pieces; p++) {
        size_t k = cma_settle(e, s, tasks, job.start[p], &job.call[p]);
        while (k < job.start[p + 1]) {
            size_t m = atomic_load(&s->cma_off) ? k : cma_one(e, s, tasks, k, job.start[p + 1]);
            if (m == k && atomic_load(&tasks[k].state) == MC_TASK_WAITING)
                mc__task_reroute(e, &tasks[k]);
            k = m > k ? m : k + 1;
        }
    }
    free(job.start);
    free(job.call);
    return end;
}

size_t mc__shm_cma(mc_engine_t *e, shm_peer_t *s, mc_task_t *tasks, size_t i, size_t n)
{
    size_t j = cma_shared(e, s, tasks, i, n);

    return j > i ? j : cma_one(e, s, tasks, i, n);
}
