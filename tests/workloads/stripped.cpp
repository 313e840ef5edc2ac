// A C++ program for the separate-debug-file tests: the tests strip it three ways (a
// .gnu_debuglink file, a build-id directory, MiniDebugInfo), so its static functions have
// names only there. Run: stripped MS ROUNDS [wait] — waits for a line on stdin when asked,
// then each round spins MS ms in spin_for (static: not in .dynsym) and calls getppid.
// Build: g++ -O1 -g stripped.cpp
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <unistd.h>

static long now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

// The clock is read every 2^20 iterations, so almost every sample lands in this loop.
__attribute__((noinline, noclone)) static long spin_for(long ms) {
    long end = now_ns() + ms * 1000000L;
    volatile long n = 0;
    do {
        for (long i = 0; i < (1L << 20); i++) n = n + 1;
    } while (now_ns() < end);
    return n;
}

int main(int argc, char **argv) {
    long ms = argc > 1 ? std::atol(argv[1]) : 50;
    int rounds = argc > 2 ? std::atoi(argv[2]) : 1;
    if (argc > 3 && std::strcmp(argv[3], "wait") == 0) {
        char line[16];
        if (!std::fgets(line, sizeof line, stdin)) return 3;
    }
    long sum = 0;
    for (int i = 0; i < rounds; i++) {
        sum += spin_for(ms) & 1;
        sum += getppid() > 0;
    }
    std::printf("result=%ld\n", sum);
    return 0;
}
