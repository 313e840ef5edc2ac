/* A call chain five deep (main → level1 → level2 → level3 → handle → leaf_work) for the
 * unwinding tests, built with plain `gcc -O2` (no frame pointers, as distributions build):
 * the kernel's frame-pointer callchain of a sample in leaf_work is 1–2 frames deep, the
 * CFI (.eh_frame) knows all of them.
 *
 * Usage: deep CALLS SLOW_INDEX [SLOW_ITERS]. Each call of level1 runs leaf_work for 300k
 * iterations, the one at SLOW_INDEX for SLOW_ITERS (default 30M) at a time until it has
 * lasted at least 60 ms by the program's clock (however fast the CPU: the tests' latency
 * rules fire at 20 ms, and 30M iterations took 14 ms on a faster host); prints
 * `measured_slow=NS` for it (the program's own measurement), and `elapsed_ns=` (all calls)
 * and `result=` at the end. SLOW_INDEX -1: no slow call (the sampling benchmark). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}

volatile unsigned long sink;

/* The work after each call keeps the calls from becoming tail jumps. */
__attribute__((noinline)) void leaf_work(unsigned long n) {
    for (unsigned long i = 0; i < n; i++) sink += i * i;
}
/* When the slow call may end (CLOCK_MONOTONIC ns); 0 for the other calls (one leaf_work). */
static unsigned long long slow_until;
__attribute__((noinline)) void handle(unsigned long n) {
    do leaf_work(n); while (slow_until && now_ns() < slow_until);
    sink++;
}
__attribute__((noinline)) void level3(unsigned long n) { handle(n); sink++; }
__attribute__((noinline)) void level2(unsigned long n) { level3(n); sink++; }
__attribute__((noinline)) void level1(unsigned long n) { level2(n); sink++; }

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 200;
    int slow = argc > 2 ? atoi(argv[2]) : calls - 20;
    unsigned long slow_iters = argc > 3 ? strtoul(argv[3], NULL, 10) : 30000000ul;
    unsigned long long start = now_ns();
    for (int i = 0; i < calls; i++) {
        unsigned long n = i == slow ? slow_iters : 300000ul;
        unsigned long long t0 = now_ns();
        slow_until = i == slow ? t0 + 60000000ull : 0;
        level1(n);
        if (i == slow) printf("measured_slow=%llu\n", now_ns() - t0);
    }
    printf("elapsed_ns=%llu\n", now_ns() - start);
    printf("result=%lu\n", sink);
    return 0;
}
