/* handle() alternating with sleeps, for the off-CPU tests: each of CALLS rounds runs
 * handle() (a 0.3 ms spin; 15 ms at SLOW_INDEX) and then sleeps 5 ms in main, so a
 * timeline that lets a slice span a period the thread was off the CPU merges handle()
 * across the sleeps. Built with plain `cc -O2`.
 *
 * Usage: offcpu CALLS SLOW_INDEX. Prints `call=START_NS DURATION_NS` per handle() call
 * (CLOCK_MONOTONIC, the trace's clock: the program's own measurement) and `result=`. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}

volatile unsigned long sink;

__attribute__((noinline)) void handle(unsigned long long spin_ns) {
    unsigned long long end = now_ns() + spin_ns;
    while (now_ns() < end) sink++;
}

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 200;
    int slow = argc > 2 ? atoi(argv[2]) : calls - 10;
    struct timespec nap = {0, 5000000};
    for (int i = 0; i < calls; i++) {
        unsigned long long t0 = now_ns();
        handle(i == slow ? 15000000ull : 300000ull);
        unsigned long long t1 = now_ns();
        printf("call=%llu %llu\n", t0, t1 - t0);
        fflush(stdout);
        nanosleep(&nap, NULL);
    }
    printf("result=%lu\n", sink);
    return 0;
}
