/* The reference beside `cargo xtask bench --freeze-only`: how long this machine keeps a
 * CPU from running a program that never blocks. A thread pinned to one CPU reads
 * CLOCK_MONOTONIC in a loop for SECONDS and counts the gaps between two reads: every gap
 * is an interrupt, a preemption or (in a VM) the host not running the vCPU. A trigger's
 * BPF program that meets such a gap between its first instruction and its freeze carries
 * it into the trigger-to-freeze latency, and nothing in lookback can shorten it.
 *
 * usage: cpu_stalls SECONDS CPU
 * prints: cpu=N secs=S reads=R ge10us=A ge20us=B ge50us=C ge100us=D max_us=M */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: cpu_stalls SECONDS CPU\n");
        return 2;
    }
    long secs = atol(argv[1]);
    int cpu = atoi(argv[2]);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("sched_setaffinity");
        return 1;
    }
    long start = now_ns(), prev = start, reads = 0, max = 0;
    long ge10 = 0, ge20 = 0, ge50 = 0, ge100 = 0;
    while (prev - start < secs * 1000000000L) {
        long t = now_ns(), gap = t - prev;
        prev = t;
        reads++;
        if (gap > max) max = gap;
        ge10 += gap >= 10000;
        ge20 += gap >= 20000;
        ge50 += gap >= 50000;
        ge100 += gap >= 100000;
    }
    printf("cpu=%d secs=%ld reads=%ld ge10us=%ld ge20us=%ld ge50us=%ld ge100us=%ld max_us=%ld\n",
           cpu, secs, reads, ge10, ge20, ge50, ge100, max / 1000);
    return 0;
}
