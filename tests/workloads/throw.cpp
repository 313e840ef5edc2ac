/* C++ exceptions through a probed function, for the `func:_Z4worki>DURATION` latency
 * tests: a return probe that rewrites the return address (uretprobe) breaks the unwinder,
 * probes on the function's own `ret`s must not. Build: g++ -O1 -g throw.cpp
 *
 *   throw CALLS THRESHOLD_US
 *
 * Call i of work(i), i = 0..CALLS-1, is exactly one of:
 *   i % 10 == 3   work throws std::runtime_error itself (fast);
 *   i % 10 == 7   work calls thrower(), which throws: the exception unwinds THROUGH work,
 *                 running the destructor of a guard object in work's frame (fast);
 *   i % 25 == 5   work spins SLOW_US (20 ms) and returns normally;
 *   otherwise     work returns at once.
 * Every exception is caught in main, around the call. main measures each call itself
 * (CLOCK_MONOTONIC, before the call and after it returns or its exception is caught) and
 * prints on stdout:
 *   measured_slow=N   calls that lasted more than THRESHOLD_US
 *   thrown=N          calls that ended in an exception
 *   result=CHECKSUM   a function of the return values and the caught exceptions only
 * and exits 0 (2 on bad arguments, 3 when the counts are not the expected ones).
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <stdexcept>

static const long SLOW_US = 20000;

static long long now_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Busy-waits (never sleeps): the call stays on CPU. */
__attribute__((noinline)) void spin_us(long us) {
    long long end = now_ns() + us * 1000LL;
    while (now_ns() < end) {}
}

volatile long guards_run;

struct Guard {
    long id;
    ~Guard() { guards_run = guards_run + id; }
};

/* Throws from below work, so the exception propagates through work's frame. */
__attribute__((noinline)) int thrower(int i) {
    char msg[32];
    std::snprintf(msg, sizeof msg, "%d", i * 3);
    throw std::runtime_error(msg);
}

/* The probed function: _Z4worki. noipa as well as noinline: no clone, no constant
 * propagation into the caller, the call goes to this symbol. */
__attribute__((noinline, noipa)) int work(int i) {
    if (i % 10 == 3) {
        char msg[32];
        std::snprintf(msg, sizeof msg, "%d", i * 5);
        throw std::runtime_error(msg);
    }
    Guard guard{i};
    int r = i * 7 + 1;
    if (i % 10 == 7) r += thrower(i);
    if (i % 25 == 5) spin_us(SLOW_US);
    guard.id = 1;
    return r;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: throw CALLS THRESHOLD_US\n");
        return 2;
    }
    long calls = std::atol(argv[1]);
    long long threshold_ns = std::atoll(argv[2]) * 1000LL;
    unsigned long long checksum = 1469598103934665603ULL;
    long slow = 0, thrown = 0, expected_thrown = 0, expected_slow = 0;
    for (int i = 0; i < calls; i++) {
        unsigned long long value;
        long long start = now_ns();
        try {
            value = (unsigned long long)work(i);
        } catch (const std::runtime_error &e) {
            value = 1000000ULL + std::strtoull(e.what(), nullptr, 10);
            thrown++;
        }
        long long took = now_ns() - start;
        if (took > threshold_ns) slow++;
        checksum = (checksum ^ value) * 1099511628211ULL;
        if (i % 10 == 3 || i % 10 == 7) expected_thrown++;
        else if (i % 25 == 5) expected_slow++;
    }
    std::printf("measured_slow=%ld\nthrown=%ld\nslow_calls=%ld\nresult=%llu\n", slow, thrown,
                expected_slow, checksum ^ (unsigned long long)guards_run);
    return thrown == expected_thrown ? 0 : 3;
}
