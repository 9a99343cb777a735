/* Wake-ups across a ring in shared memory: the membarrier side (shm_wake.h). */
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shm_wake.h"
#include "util/log.h"

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t reg_pid; /* the process that tried (a fork's child tries for itself) */
static bool registered;

static int membarrier(int cmd)
{
    return (int)syscall(__NR_membarrier, cmd, 0, 0);
}

bool mc__wake_mb_init(bool want)
{
    bool ok;

    if (!want)
        return false;
    pthread_mutex_lock(&reg_lock);
    if (reg_pid != getpid()) {
        reg_pid = getpid();
        /* and a first one: a sandbox that lets it through lets the others */
        registered = membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0 &&
                     membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0;
        if (!registered)
            mc_info("shm: no membarrier (%s): same-host message rings fence every wake-up check",
                    strerror(errno));
    }
    ok = registered;
    pthread_mutex_unlock(&reg_lock);
    return ok;
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
