/*
 * fiber.h — a function that can stop in the middle and be resumed later,
 * on a stack of its own, by the thread that started it (ucontext).
 *
 * The gateway runs each request its loop's leader reads as a fiber: the
 * request stops while its upstream thinks, and the thread goes on with
 * the loop and the other requests (gateway.c, "fibers"). A fiber is
 * resumed only by the thread that started it: the code it runs keeps
 * per-thread state (the JSON region, the store's reader).
 */
#ifndef LG_FIBER_H
#define LG_FIBER_H

#include <stddef.h>

typedef struct lg__fiber lg__fiber_t;

/* A fiber with a stack of `stack` bytes (reserved, not committed: a page
 * is resident once touched) and a guard page under it. NULL: no memory. */
lg__fiber_t *lg__fiber_new(size_t stack);
void lg__fiber_free(lg__fiber_t *f);

/* Runs fn(arg) on f (which must not be running a function now) until it
 * yields or returns. Returns 1 while fn has not returned, 0 once it has
 * (f can then start another). */
int lg__fiber_start(lg__fiber_t *f, void (*fn)(void *), void *arg);
/* Resumes f where it yielded, until it yields again or returns: as
 * lg__fiber_start. */
int lg__fiber_resume(lg__fiber_t *f);

/* From inside a fiber: back to the thread that started or resumed it. */
void lg__fiber_yield(void);
/* The fiber this thread runs now, or NULL. */
lg__fiber_t *lg__fiber_self(void);

#endif
