/* Shared library for the "symbol in a shared library" trigger tests. */
#include <time.h>

__attribute__((noinline)) int lib_slow(long us) {
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    while (nanosleep(&ts, &ts) != 0) {}
    return 0;
}
