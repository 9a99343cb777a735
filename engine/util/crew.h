/*
 * A crew: helper threads that run the pieces of a job next to the thread that asks for it
 * (internal).
 *
 * mc__crew_run(c, n, fn, arg) runs fn(arg, i) once for every i in [0, n) and returns when all
 * have run. The calling thread takes pieces too, so a job finishes even when every helper is
 * busy with another thread's job (or slow to wake): helpers only add hands. Pieces of one job
 * run in any order and at the same time; jobs of several threads share the helpers in the order
 * they came.
 */
#ifndef MC_UTIL_CREW_H
#define MC_UTIL_CREW_H

#include <stddef.h>

typedef struct mc_crew mc_crew_t;

/* A crew of `helpers` threads (at least 1), on the CPUs the process's main thread may use: 0,
 * or a negative errno. */
int mc__crew_create(unsigned helpers, mc_crew_t **crew_p);
/* Stop and join the helpers; no job may be running. NULL is fine. */
void mc__crew_destroy(mc_crew_t *c);
/* Run fn(arg, i) for i in [0, n) with the crew's help (c NULL: all in the calling thread). */
void mc__crew_run(mc_crew_t *c, size_t n, void (*fn)(void *arg, size_t i), void *arg);

#endif
