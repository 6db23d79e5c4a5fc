/*
 * test_json_region.c — the chunks that hold the trees lg__json_load reads
 * (src/util/util.c, "the region"; the gateway's requests and answers):
 *
 * - a tree read in chunks is the tree jansson reads, and is freed as any;
 * - a thread reading and freeing thousands of trees holds one chunk open,
 *   two at a moment, and gives it up when it ends;
 * - a value kept past its request keeps its chunk, and only its chunk,
 *   until it is freed;
 * - trees read on one thread and freed on others (as a run's values are,
 *   by whichever worker holds the run) bring every chunk back;
 * - a value larger than a chunk's share comes from malloc and mixes with
 *   chunked ones in one tree;
 * - with the region off (as under ASan) nothing is chunked.
 * Each test turns the region on itself: under ASan it is off by default.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "util/internal.h"

/* A conversation like the gateway's: n turns of a call and its result. */
static char *doc(int n, size_t pad) {
  lg__buf_t b = {0};
  lg__buf_puts(&b, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"");
  for (size_t i = 0; i < pad; i++) lg__buf_putc(&b, 'x');
  lg__buf_puts(&b, "\"}");
  for (int i = 0; i < n; i++)
    lg__buf_printf(&b,
                   ",{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_%d\",\"type\":"
                   "\"function\",\"function\":{\"name\":\"lookup\",\"arguments\":\"{\\\"id\\\":%d}\"}}]},"
                   "{\"role\":\"tool\",\"tool_call_id\":\"call_%d\",\"content\":\"ok %d\",\"n\":%d.5}",
                   i, i, i, i, i);
  lg__buf_puts(&b, "]}");
  assert_false(b.oom);
  return lg__buf_steal(&b, NULL);
}

static void same_as_jansson(const char *text, json_t *v) {
  json_t *want = json_loads(text, 0, NULL);
  assert_non_null(want);
  assert_true(json_equal(want, v));
  json_decref(want);
}

static json_t *load(const char *text) {
  json_t *v = lg__json_load(text, strlen(text), NULL, NULL);
  assert_non_null(v);
  return v;
}

static void test_a_tree_in_chunks(void **state) {
  (void)state;
  lg__json_region_enable(1);
  size_t base = lg__json_region_chunks();
  char *text = doc(26, 100);
  json_t *v = load(text);
  assert_int_equal(lg__json_region_chunks(), base + 1); /* this thread's chunk */
  same_as_jansson(text, v);
  /* changed after the read: the new values are malloc's, mixed in */
  json_object_set_new(v, "added", json_string("a value made outside the region"));
  json_array_remove(json_object_get(v, "messages"), 1);
  json_decref(v);
  assert_int_equal(lg__json_region_chunks(), base + 1); /* still open for the next read */
  lg__json_region_thread_end();
  assert_int_equal(lg__json_region_chunks(), base);
  free(text);
}

static void test_many_trees_one_chunk(void **state) {
  (void)state;
  lg__json_region_enable(1);
  size_t base = lg__json_region_chunks();
  char *text = doc(26, 2000); /* about 8 KB: the benchmark's body */
  size_t most = 0;
  for (int i = 0; i < 3000; i++) {
    json_t *v = load(text);
    size_t now = lg__json_region_chunks() - base;
    if (now > most) most = now;
    json_decref(v);
  }
  assert_true(most >= 1);
  assert_true(most <= 2); /* a full chunk goes back as soon as its last tree is freed */
  lg__json_region_thread_end();
  assert_int_equal(lg__json_region_chunks(), base);
  free(text);
}

static void test_kept_value_keeps_its_chunk(void **state) {
  (void)state;
  lg__json_region_enable(1);
  size_t base = lg__json_region_chunks();
  char *text = doc(26, 2000);
  json_t *first = load(text);
  json_t *kept = json_incref(json_array_get(json_object_get(first, "messages"), 4));
  json_decref(first);
  for (int i = 0; i < 500; i++) json_decref(load(text)); /* many chunks used since */
  assert_int_equal(lg__json_region_chunks(), base + 2);  /* the kept one's, and the open one */
  assert_string_equal(json_string_value(json_object_get(kept, "tool_call_id")), "call_1");
  json_t *copy = json_deep_copy(kept); /* what a run keeps: a copy outside the region */
  json_decref(kept);
  assert_int_equal(lg__json_region_chunks(), base + 1);
  assert_string_equal(json_string_value(json_object_get(copy, "tool_call_id")), "call_1");
  json_decref(copy);
  lg__json_region_thread_end();
  assert_int_equal(lg__json_region_chunks(), base);
  free(text);
}

/* ---- across threads ---- */

enum { PRODUCERS = 3, TREES = 400 };

typedef struct queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  json_t *v[PRODUCERS * TREES];
  size_t head, tail, producers_left;
} queue_t;

static const char *shared_text;

static void *producer(void *arg) {
  queue_t *q = arg;
  for (int i = 0; i < TREES; i++) {
    json_t *v = lg__json_load(shared_text, strlen(shared_text), NULL, NULL);
    pthread_mutex_lock(&q->mu);
    q->v[q->tail++] = v;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
  }
  lg__json_region_thread_end();
  pthread_mutex_lock(&q->mu);
  q->producers_left--;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

static void *consumer(void *arg) {
  queue_t *q = arg;
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (q->head == q->tail && q->producers_left) pthread_cond_wait(&q->cv, &q->mu);
    if (q->head == q->tail) {
      pthread_mutex_unlock(&q->mu);
      return NULL;
    }
    json_t *v = q->v[q->head++];
    pthread_mutex_unlock(&q->mu);
    assert_non_null(v);
    assert_int_equal(json_array_size(json_object_get(v, "messages")), 1 + 2 * 26);
    json_decref(v);
  }
}

static void test_freed_on_other_threads(void **state) {
  (void)state;
  lg__json_region_enable(1);
  size_t base = lg__json_region_chunks();
  char *text = doc(26, 2000);
  shared_text = text;
  static queue_t q;
  memset(&q, 0, sizeof q);
  pthread_mutex_init(&q.mu, NULL);
  pthread_cond_init(&q.cv, NULL);
  q.producers_left = PRODUCERS;
  pthread_t p[PRODUCERS], c[2];
  for (int i = 0; i < PRODUCERS; i++) assert_int_equal(pthread_create(&p[i], NULL, producer, &q), 0);
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&c[i], NULL, consumer, &q), 0);
  for (int i = 0; i < PRODUCERS; i++) pthread_join(p[i], NULL);
  for (int i = 0; i < 2; i++) pthread_join(c[i], NULL);
  assert_int_equal(q.head, (size_t)PRODUCERS * TREES);
  assert_int_equal(lg__json_region_chunks(), base); /* every chunk back */
  pthread_mutex_destroy(&q.mu);
  pthread_cond_destroy(&q.cv);
  free(text);
}

static void test_big_value_from_malloc(void **state) {
  (void)state;
  lg__json_region_enable(1);
  size_t base = lg__json_region_chunks();
  char *text = doc(3, 64 * 1024); /* a 64 KB string: beyond a chunk's share */
  json_t *v = load(text);
  same_as_jansson(text, v);
  const char *sys = json_string_value(json_object_get(json_array_get(json_object_get(v, "messages"), 0), "content"));
  assert_int_equal(strlen(sys), 64 * 1024);
  json_decref(v);
  lg__json_region_thread_end();
  assert_int_equal(lg__json_region_chunks(), base);
  free(text);
}

static void test_off(void **state) {
  (void)state;
  lg__json_region_enable(0);
  size_t base = lg__json_region_chunks();
  char *text = doc(26, 100);
  json_t *v = load(text);
  assert_int_equal(lg__json_region_chunks(), base);
  same_as_jansson(text, v);
  json_decref(v);
  free(text);
  lg__json_region_enable(1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_tree_in_chunks),
      cmocka_unit_test(test_many_trees_one_chunk),
      cmocka_unit_test(test_kept_value_keeps_its_chunk),
      cmocka_unit_test(test_freed_on_other_threads),
      cmocka_unit_test(test_big_value_from_malloc),
      cmocka_unit_test(test_off),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
