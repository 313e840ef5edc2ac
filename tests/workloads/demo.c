/* The built-in demo of `cargo xtask demo`: a "server" whose request handler is usually fast
 * and sometimes slow. lookback's latency trigger should catch exactly the slow calls. */
#include <stdio.h>
#include <time.h>

static void sleep_us(long us) {
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}

__attribute__((noinline)) void parse_request(int i) { sleep_us(100 + (i % 3) * 50); }

__attribute__((noinline)) void query_database(int i) {
    /* Every 10th request hits a cold cache. */
    sleep_us(i % 10 == 7 ? 8000 : 200);
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
