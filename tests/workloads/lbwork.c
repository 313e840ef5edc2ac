/* The workload the container tests run in containers (tests/tests/containers.rs), built
 * with gcc on the host and copied into an image; its comm is "lbwork".
 *
 *   lbwork crash MS       work for about MS ms, then parse_record() reads through a NULL
 *                         pointer: SIGSEGV in parse_record <- main
 *   lbwork steps N MS     wait 50 ms (the agent hears of the exec meanwhile), then N
 *                         calls of slow_step(), each sleeping MS ms; prints
 *                         "slow_calls=N"; the whole run stays under 100 ms for N*MS <= 40
 *   lbwork sleeps N MS    spin 50 ms without a system call, then N nanosleep(MS ms) calls
 *                         (a syscall rule's target)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct record {
    const char *name;
    int *value;
};

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

__attribute__((noinline)) int parse_record(struct record *r) {
    return r->value[0] + (int)strlen(r->name);
}

__attribute__((noinline)) long busy(long n) {
    volatile long s = 0;
    for (long i = 0; i < n; i++) s += i;
    return s;
}

/* Spins for `ms` ms reading the clock through the vDSO: no system call a rule could see. */
static void spin_ms(long ms) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L < ms);
}

__attribute__((noinline)) void slow_step(long ms) {
    sleep_ms(ms);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: lbwork crash MS | steps N MS | sleeps N MS\n");
        return 2;
    }
    if (strcmp(argv[1], "crash") == 0) {
        long ms = atol(argv[2]);
        for (long i = 0; i < ms; i++) {
            busy(200000);
            sleep_ms(1);
        }
        struct record r = {"x", NULL};
        return parse_record(&r);
    }
    if (argc < 4) return 2;
    long n = atol(argv[2]), ms = atol(argv[3]);
    if (strcmp(argv[1], "steps") == 0) {
        sleep_ms(50);
        for (long i = 0; i < n; i++) slow_step(ms);
        printf("slow_calls=%ld\n", n);
        return 0;
    }
    if (strcmp(argv[1], "sleeps") == 0) {
        spin_ms(50);
        for (long i = 0; i < n; i++) sleep_ms(ms);
        return 0;
    }
    return 2;
}
