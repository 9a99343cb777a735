/* Wake-ups across a ring in shared memory: the membarrier side (shm_wake.h). */
#include <errno.h>
#include <linux/membarrier.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shm_wake.h"
#include "util/log.h"

/* The process that registered (a fork's child registers for itself), and whether it could.
 * Two threads may both register at once: the calls are idempotent, the answers the same. */
static _Atomic pid_t reg_pid;
static atomic_bool registered;

static int membarrier(int cmd)
{
    return (int)syscall(__NR_membarrier, cmd, 0, 0);
}

bool mc__wake_mb_init(bool want)
{
    pid_t me = getpid();

    if (!want)
        return false;
    if (atomic_load(&reg_pid) != me) {
        /* and a first one: a sandbox that lets it through lets the others */
        bool ok = membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0 &&
                  membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0;
        if (!ok)
            mc_info("shm: no membarrier (%s): same-host message rings fence every wake-up check",
                    strerror(errno));
        atomic_store(&registered, ok);
        atomic_store(&reg_pid, me);
    }
    return atomic_load(&registered);
}

bool mc__wake_barrier(void)
{
    if (membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) < 0) {
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            mc_warn("shm: membarrier: %s: message rings keep their side awake", strerror(errno));
        return false;
    }
    mc_debug("shm: rings' sides may sleep from now on: the other sides fence");
    return true;
}
