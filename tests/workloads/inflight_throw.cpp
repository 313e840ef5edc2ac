/* C++ exceptions out of and through a probed function, for the in-flight latency tests
 * (`--detect running`): a call an exception ended must not be taken for one still running
 * when the catcher then makes a slow call at the same stack height.
 * Build: g++ -O2 -g inflight_throw.cpp
 *
 *   inflight_throw ROUNDS
 *
 * Round i calls, through ONE call instruction inside one try block (a loop with a volatile
 * index over a volatile table), table[0] = lb_throws(i) then table[1] = lb_slow_after(i).
 * lb_throws makes a fast call (lb_fast_step), then throws std::runtime_error itself (i
 * even) or calls lb_throw_below, which throws through it (i odd, running the destructor of
 * a guard object in lb_throws's frame); it never returns. The catch is in the loop, so
 * lb_slow_after (sleeps 120 ms, then spins 30 ms) runs at the height, and with the return
 * address, lb_throws had. Both are extern "C": the trigger names them as they are.
 * Prints on stdout
 *   thrown=N          calls that ended in an exception (ROUNDS)
 *   slow_calls=N      slow calls of lb_slow_after (ROUNDS)
 *   result=CHECKSUM   a function of the return values and the caught exceptions only
 * and exits 0 (2 on bad arguments, 3 when the counts are not the expected ones).
 */
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <stdexcept>

static long long now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

volatile long guards_run;

struct Guard {
    long id;
    ~Guard() { guards_run = guards_run + id; }
};

extern "C" {

__attribute__((noinline, noipa)) long lb_fast_step(long i) { return i * 7 + 1; }

__attribute__((noinline, noipa)) long lb_throw_below(long i) {
    char msg[32];
    std::snprintf(msg, sizeof msg, "%ld", i * 3);
    throw std::runtime_error(msg);
}

/* The probed function: a fast call, then an exception out of it or through it. */
__attribute__((noinline, noipa)) long lb_throws(long i) {
    Guard guard{i};
    long r = lb_fast_step(i);
    if (i % 2) r += lb_throw_below(i);
    char msg[32];
    std::snprintf(msg, sizeof msg, "%ld", r);
    throw std::runtime_error(msg);
}

/* The slow sibling: off the CPU, then on it. */
__attribute__((noinline, noipa)) long lb_slow_after(long i) {
    struct timespec ts = {0, 120 * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
    long long end = now_ns() + 30 * 1000000LL;
    while (now_ns() < end) {}
    return i * 13 + 2;
}
}

static long (*volatile table[2])(long) = {lb_throws, lb_slow_after};
static volatile int table_len = 2;

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: inflight_throw ROUNDS\n");
        return 2;
    }
    long rounds = std::atol(argv[1]);
    unsigned long long checksum = 1469598103934665603ULL;
    long thrown = 0, slow = 0;
    for (long i = 0; i < rounds; i++) {
        for (volatile int k = 0; k < table_len; k++) {
            unsigned long long value;
            try {
                value = (unsigned long long)table[k](i); /* the one call site */
                slow++;
            } catch (const std::runtime_error &e) {
                value = 1000000ULL + std::strtoull(e.what(), nullptr, 10);
                thrown++;
            }
            checksum = (checksum ^ value) * 1099511628211ULL;
        }
    }
    std::printf("thrown=%ld\nslow_calls=%ld\nresult=%llu\n", thrown, slow,
                checksum ^ (unsigned long long)guards_run);
    return thrown == rounds && slow == rounds ? 0 : 3;
}
