/* Helper threads that run the pieces of a job next to its caller (see crew.h). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "util/crew.h"
#include "util/list.h"

typedef struct crew_job {
    mc_list_t link; /* in the crew's jobs while some of its pieces are not taken */
    void (*fn)(void *arg, size_t i);
    void *arg;
    size_t n, taken, done;
} crew_job_t;

struct mc_crew {
    pthread_mutex_t lock;
    pthread_cond_t work; /* a job came, or stop */
    pthread_cond_t done; /* a job's last piece ran */
    mc_list_t jobs;
    bool stop;
    unsigned n_threads;
    pthread_t threads[];
};

/* The next piece of j (caller holds the lock and saw one left). */
static size_t take(crew_job_t *j)
{
    size_t i = j->taken++;

    if (j->taken == j->n)
        mc_list_del(&j->link);
    return i;
}

/* Run piece i of j, then count it (the last touch of j: its owner may return after). */
static void run_piece(mc_crew_t *c, crew_job_t *j, size_t i)
{
    pthread_mutex_unlock(&c->lock);
    j->fn(j->arg, i);
    pthread_mutex_lock(&c->lock);
    if (++j->done == j->n)
        pthread_cond_broadcast(&c->done);
}

static void *helper(void *arg)
{
    mc_crew_t *c = arg;

    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->stop && mc_list_empty(&c->jobs))
            pthread_cond_wait(&c->work, &c->lock);
        if (c->stop)
            break;
        crew_job_t *j = mc_container_of(c->jobs.next, crew_job_t, link);
        run_piece(c, j, take(j));
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

int mc__crew_create(unsigned helpers, mc_crew_t **crew_p)
{
    mc_crew_t *c;
    int rc = 0;

    if (!helpers)
        return -EINVAL;
    c = calloc(1, sizeof(*c) + helpers * sizeof(pthread_t));
    if (!c)
        return -ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, NULL);
    mc_list_init(&c->jobs);
    /* On the CPUs of the process's main thread, not of whichever thread came first: a host
     * often pins the threads that submit, and helpers pinned beside one would add no hands. */
    pthread_attr_t attr;
    cpu_set_t cpus;
    bool have_attr = !pthread_attr_init(&attr);
    bool pin = have_attr && !sched_getaffinity(getpid(), sizeof(cpus), &cpus) &&
               !pthread_attr_setaffinity_np(&attr, sizeof(cpus), &cpus);
    for (; c->n_threads < helpers; c->n_threads++) {
        rc = -pthread_create(&c->threads[c->n_threads], pin ? &attr : NULL, helper, c);
        if (rc)
            break;
    }
    if (have_attr)
        pthread_attr_destroy(&attr);
    if (!c->n_threads) {
        mc__crew_destroy(c);
        return rc;
    }
    *crew_p = c; /* fewer helpers than asked still help */
    return 0;
}

void mc__crew_destroy(mc_crew_t *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->work);
    pthread_mutex_unlock(&c->lock);
    for (unsigned i = 0; i < c->n_threads; i++)
        pthread_join(c->threads[i], NULL);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->work);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

void mc__crew_run(mc_crew_t *c, size_t n, void (*fn)(void *arg, size_t i), void *arg)
{
    crew_job_t j = {.fn = fn, .arg = arg, .n = n};
    int cancel;

    if (!c || n < 2) {
        for (size_t i = 0; i < n; i++)
            fn(arg, i);
        return;
    }
    /* The job lives on this stack until every helper is done with it: no cancellation in
     * between (the waits below are cancellation points). */
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
    pthread_mutex_lock(&c->lock);
    mc_list_push_back(&c->jobs, &j.link);
    if (n - 1 < c->n_threads) /* a helper per piece past the caller's first */
        for (size_t k = 1; k < n; k++)
            pthread_cond_signal(&c->work);
    else
        pthread_cond_broadcast(&c->work);
    while (j.taken < j.n)
        run_piece(c, &j, take(&j));
    while (j.done < j.n)
        pthread_cond_wait(&c->done, &c->lock);
    pthread_mutex_unlock(&c->lock);
    pthread_setcancelstate(cancel, NULL);
}
