/* The built-in demo of `cargo xtask demo`: a "server" whose request handler is usually fast
 * and sometimes slow. lookback's latency trigger should catch exactly the slow calls. */
#include <stdio.h>
#include <time.h>

static void sleep_us(long us) {
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}

__attribute__((noinline)) void parse_request(int i) { sleep_us(100 + (i % 3) * 50); }

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

volatile unsigned long checksum;

__attribute__((noinline)) unsigned long hash_row(unsigned long row) {
    for (int k = 0; k < 64; k++)
        row = row * 6364136223846793005UL + 1442695040888963407UL;
    return row;
}

/* The slow path burns CPU (a cold-cache scan), so a sampling recorder sees it on-CPU. */
__attribute__((noinline)) void scan_cold_cache(long us) {
    long end = now_ns() + us * 1000;
    unsigned long row = 0;
    while (now_ns() < end)
        checksum += hash_row(row++);
}

__attribute__((noinline)) void query_database(int i) {
    /* Every 10th request hits a cold cache. */
    if (i % 10 == 7)
        scan_cold_cache(8000);
    else
        sleep_us(200);
}

__attribute__((noinline)) int handle_request(int i) {
    parse_request(i);
    query_database(i);
    return i * 2;
}

int main(void) {
    int sum = 0;
    for (int i = 0; i < 40; i++)
        sum += handle_request(i);
    printf("demo-workload: served 40 requests (checksum %d)\n", sum);
    return 0;
}
