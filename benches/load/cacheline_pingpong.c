/* One cache line handed between two cores: each thread waits for the counter's parity to
 * be its own, then increments it, so every increment finds the line in the other core's
 * cache. Prints the time per hand-off (a line transfer plus an atomic add): the cost of
 * an atomic that two worker threads both write (benches/history/2026-11-passes.md, issue 16, twentieth pass).
 *
 *   gcc -O2 -pthread -o /tmp/pingpong benches/load/cacheline_pingpong.c && /tmp/pingpong
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define HANDOFFS_PER_THREAD 2000000L

static _Alignas(128) atomic_long counter;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *run(void *arg) {
  long parity = (long)arg;
  for (long i = 0; i < HANDOFFS_PER_THREAD; i++) {
    while ((atomic_load_explicit(&counter, memory_order_acquire) & 1) != parity) {
    }
    atomic_fetch_add(&counter, 1);
  }
  return NULL;
}

int main(void) {
  pthread_t threads[2];
  double start = now();
  for (long i = 0; i < 2; i++) pthread_create(&threads[i], NULL, run, (void *)i);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  printf("one hand-off (line transfer + atomic add): %.1f ns\n",
         (now() - start) * 1e9 / (2.0 * HANDOFFS_PER_THREAD));
  return 0;
}
