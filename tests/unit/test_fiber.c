/*
 * test_fiber.c — fibers (src/util/fiber.h), on which a gateway leader runs
 * its requests:
 *
 * - a fiber runs to its end, and starts again on the same stack;
 * - fibers that yield are resumed where they stopped, their locals (in
 *   registers and on their stack) intact, in the order the thread
 *   resumes them; the thread's own locals survive every switch too;
 * - lg__fiber_self names the fiber running, NULL outside;
 * - a fiber's stack is 16-aligned for the ABI (floating point and SSE
 *   code on it is right), and deep enough for a deep recursion;
 * - memory taken in one fiber and freed in another (the gateway's
 *   requests share the thread's allocator) is fine: ASan checks it;
 * - a thousand fibers at once each go round a few times and end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "util/fiber.h"
#include "util/internal.h"

#define STACK ((size_t)1 << 20)

static void set_one(void *arg) { *(int *)arg = 1; }

static void test_runs_to_the_end(void **state) {
  (void)state;
  lg__fiber_t *f = lg__fiber_new(STACK);
  assert_non_null(f);
  assert_null(lg__fiber_self());
  for (int round = 0; round < 3; round++) { /* the same stack again */
    int v = 0;
    assert_int_equal(lg__fiber_start(f, set_one, &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(lg__fiber_resume(f), 0); /* ended: nothing to resume */
  }
  lg__fiber_free(f);
}

/* ---- yields ---- */

typedef struct turn {
  int id;
  char *log;                  /* shared: the order of the turns */
  size_t *len;
  lg__fiber_t *self;
  uint64_t sum;
} turn_t;

static void note(turn_t *t, char c) { t->log[(*t->len)++] = c; }

/* Seven values mixed a round: enough that some live in the registers a
 * call keeps while the fiber is stopped (inlined, they stay in them). */
typedef struct mix {
  uint64_t a, b, c, d, e, g, h;
} mix_t;

static inline mix_t mix_start(int id) { return (mix_t){1u + (uint64_t)id, 3, 5, 7, 11, 13, 17}; }

static inline mix_t mix_round(mix_t m) {
  m.a = m.a * 31 + m.b;
  m.b = m.b * 37 + m.c;
  m.c = m.c * 41 + m.d;
  m.d = m.d * 43 + m.e;
  m.e = m.e * 47 + m.g;
  m.g = m.g * 53 + m.h;
  m.h = m.h * 59 + m.a;
  return m;
}

static inline uint64_t mix_sum(mix_t m) { return m.a ^ m.b ^ m.c ^ m.d ^ m.e ^ m.g ^ m.h; }

static void taker(void *arg) {
  turn_t *t = arg;
  t->self = lg__fiber_self();
  mix_t m = mix_start(t->id); /* lives across the yields */
  char buf[256];
  memset(buf, 'a' + t->id, sizeof buf);
  for (int i = 0; i < 4; i++) {
    note(t, (char)('0' + t->id));
    lg__fiber_yield();
    m = mix_round(m);
  }
  for (size_t i = 0; i < sizeof buf; i++)
    if (buf[i] != 'a' + t->id) fail_msg("the fiber's stack changed under it");
  t->sum = mix_sum(m);
}

static uint64_t expected_sum(int id) {
  mix_t m = mix_start(id);
  for (int i = 0; i < 4; i++) m = mix_round(m);
  return mix_sum(m);
}

static void test_yield_and_resume(void **state) {
  (void)state;
  char log[64] = {0};
  size_t len = 0;
  turn_t t[2] = {{.id = 1, .log = log, .len = &len}, {.id = 2, .log = log, .len = &len}};
  lg__fiber_t *f[2] = {lg__fiber_new(STACK), lg__fiber_new(STACK)};
  assert_non_null(f[0]);
  assert_non_null(f[1]);
  volatile uint64_t mine = 0x1234567890abcdefull; /* the thread's own local */
  assert_int_equal(lg__fiber_start(f[0], taker, &t[0]), 1);
  assert_int_equal(lg__fiber_start(f[1], taker, &t[1]), 1);
  assert_ptr_equal(t[0].self, f[0]);
  assert_ptr_equal(t[1].self, f[1]);
  assert_null(lg__fiber_self());
  /* f[1] twice for each of f[0]'s turns, then f[0] alone */
  int more0 = 1, more1 = 1;
  while (more0 || more1) {
    if (more1) more1 = lg__fiber_resume(f[1]);
    if (more1) more1 = lg__fiber_resume(f[1]);
    if (more0) more0 = lg__fiber_resume(f[0]);
  }
  assert_true(mine == 0x1234567890abcdefull);
  /* started: 1 2; then 2 2 1, 2 (f[1] ends on its next) 1, 1 (f[0] ends on its next) */
  assert_string_equal(log, "12221211");
  assert_int_equal(t[0].sum, expected_sum(1));
  assert_int_equal(t[1].sum, expected_sum(2));
  lg__fiber_free(f[0]);
  lg__fiber_free(f[1]);
}

/* ---- the stack ---- */

typedef struct deep {
  int depth;
  double x;
  int aligned;
  uint64_t r;
} deep_t;

static uint64_t recurse(int n, volatile char *prev) {
  volatile char pad[1000];
  pad[0] = (char)n;
  pad[999] = prev ? prev[0] : 0;
  if (!n) return (uint64_t)pad[0];
  return recurse(n - 1, pad) + (uint64_t)(unsigned char)pad[999];
}

static void deep_and_aligned(void *arg) {
  deep_t *d = arg;
  _Alignas(16) double v[2] = {1.5, 2.25}; /* SSE stores of aligned data */
  d->aligned = ((uintptr_t)v & 15) == 0;
  volatile double y = 3.0;
  for (int i = 0; i < 10; i++) y = y * 1.5 + v[i & 1];
  d->x = y;
  lg__fiber_yield();
  d->r = recurse(d->depth, NULL); /* about 1 KB a frame */
}

static void test_stack(void **state) {
  (void)state;
  lg__fiber_t *f = lg__fiber_new(STACK);
  assert_non_null(f);
  deep_t d = {.depth = 600}; /* 600 KB of a 1 MB stack */
  assert_int_equal(lg__fiber_start(f, deep_and_aligned, &d), 1);
  assert_true(d.aligned);
  volatile double y = 3.0;
  for (int i = 0; i < 10; i++) y = y * 1.5 + ((i & 1) ? 2.25 : 1.5);
  assert_true(d.x == y);
  assert_int_equal(lg__fiber_resume(f), 0);
  assert_int_equal(d.r, recurse(600, NULL)); /* the same on the thread's stack */
  lg__fiber_free(f);
}

/* ---- memory across fibers ---- */

static void *handed;

static void take_memory(void *arg) {
  (void)arg;
  handed = lg__malloc(5000);
  memset(handed, 7, 5000);
  lg__fiber_yield();
}

static void free_memory(void *arg) {
  (void)arg;
  unsigned char *p = handed;
  for (int i = 0; i < 5000; i++)
    if (p[i] != 7) fail_msg("the other fiber's memory changed");
  lg__free(handed);
  handed = NULL;
}

static void test_memory_across_fibers(void **state) {
  (void)state;
  lg__fiber_t *a = lg__fiber_new(STACK), *b = lg__fiber_new(STACK);
  assert_int_equal(lg__fiber_start(a, take_memory, NULL), 1);
  assert_int_equal(lg__fiber_start(b, free_memory, NULL), 0);
  assert_null(handed);
  assert_int_equal(lg__fiber_resume(a), 0);
  lg__fiber_free(a);
  lg__fiber_free(b);
}

/* ---- many ---- */

enum { MANY = 1000, ROUNDS = 3 };

static void rounds(void *arg) {
  int *n = arg;
  for (int i = 0; i < ROUNDS; i++) {
    (*n)++;
    lg__fiber_yield();
  }
  (*n) += 100;
}

static void test_many(void **state) {
  (void)state;
  static lg__fiber_t *f[MANY];
  static int n[MANY];
  for (int i = 0; i < MANY; i++) {
    n[i] = 0;
    f[i] = lg__fiber_new(64 * 1024);
    assert_non_null(f[i]);
    assert_int_equal(lg__fiber_start(f[i], rounds, &n[i]), 1);
  }
  for (int r = 0; r < ROUNDS; r++)
    for (int i = 0; i < MANY; i++) assert_int_equal(lg__fiber_resume(f[i]), r < ROUNDS - 1);
  for (int i = 0; i < MANY; i++) {
    assert_int_equal(n[i], ROUNDS + 100);
    lg__fiber_free(f[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs_to_the_end),
      cmocka_unit_test(test_yield_and_resume),
      cmocka_unit_test(test_stack),
      cmocka_unit_test(test_memory_across_fibers),
      cmocka_unit_test(test_many),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
