/* causes: handle_request() is fast (a few µs) except on call SLOW, where it is slow for a
 * cause the test chose, always inside a helper named for it, so a report can be checked
 * against the truth. Built with `cc -O2 -g -fno-optimize-sibling-calls -pthread` (no tail
 * calls: each helper keeps a frame under handle_request).
 *
 * Usage: causes MODE CALLS SLOW [DIR]. Prints `slow=START_NS DURATION_NS` for the slow
 * call (CLOCK_MONOTONIC, measured around the call by the program itself).
 *
 * Modes (cause → helper):
 *   sleep      nanosleep 20 ms                    → wait_for_backend
 *   compute    spin 20 ms                         → compute_checksum
 *   lock       a mutex another thread holds 25 ms → take_lock
 *   fsync      16 KiB written + fsync, for 25 ms  → flush_journal   (DIR: a disk, not tmpfs)
 *   pipe       read of a pipe written after 20 ms → read_reply
 *   condvar    a condition signalled after 20 ms  → wait_for_signal
 *   usleep     usleep 20 ms three calls deep      → backoff_retry
 *   faults     first touch of fresh pages, 8 MiB at a time, for 25 ms → touch_pages
 *   malloc     malloc/memset/free for 25 ms       → build_index
 *   syscalls   getppid() and write() to /dev/null for 25 ms → chatty_syscalls
 *   recursion  recursive fib(24) for 25 ms        → fib
 *   memcpy     copying a 32 MiB buffer for 25 ms  → copy_buffers
 * (The kernel- and CPU-heavy modes repeat their work for a time, not a count, so the call
 * is slow on any machine.)
 *   mixed      12 ms spin then 8 ms sleep         → crunch (on-CPU most)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}

volatile unsigned long sink;
/* How long the repeating modes work. */
#define WORK_NS 25000000ull
static const char *dir = ".";

static void nap_ms(long ms) {
    struct timespec d = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&d, NULL);
}

static void spin_ns(unsigned long long ns) {
    unsigned long long end = now_ns() + ns;
    while (now_ns() < end) sink++;
}

/* The other thread: on request, holds the mutex, writes the pipe or signals the
 * condition after a delay. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int signalled;
static atomic_int request, held;
static int pipefd[2];

static void *other(void *arg) {
    const char *mode = arg;
    while (atomic_load(&request) == 0) nap_ms(1);
    if (!strcmp(mode, "lock")) {
        pthread_mutex_lock(&mu);
        atomic_store(&held, 1);
        nap_ms(25);
        pthread_mutex_unlock(&mu);
    } else if (!strcmp(mode, "pipe")) {
        nap_ms(20);
        if (write(pipefd[1], "x", 1) != 1) abort();
    } else if (!strcmp(mode, "condvar")) {
        nap_ms(20);
        pthread_mutex_lock(&cmu);
        signalled = 1;
        pthread_cond_signal(&cond);
        pthread_mutex_unlock(&cmu);
    }
    return NULL;
}

__attribute__((noinline)) void wait_for_backend(void) { nap_ms(20); }

__attribute__((noinline)) void compute_checksum(void) { spin_ns(20000000ull); }

__attribute__((noinline)) void take_lock(void) {
    pthread_mutex_lock(&mu);
    sink++;
    pthread_mutex_unlock(&mu);
}

__attribute__((noinline)) void flush_journal(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/journal", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) abort();
    static char buf[16 << 10];
    memset(buf, 7, sizeof buf);
    unsigned long long end = now_ns() + WORK_NS;
    while (now_ns() < end) {
        if (write(fd, buf, sizeof buf) != sizeof buf) abort();
        fsync(fd);
    }
    close(fd);
}

__attribute__((noinline)) void read_reply(void) {
    char c;
    if (read(pipefd[0], &c, 1) != 1) abort();
}

__attribute__((noinline)) void wait_for_signal(void) {
    pthread_mutex_lock(&cmu);
    while (!signalled) pthread_cond_wait(&cond, &cmu);
    pthread_mutex_unlock(&cmu);
}

__attribute__((noinline)) void backoff_retry(void) { usleep(20000); }
__attribute__((noinline)) void retry_level2(void) { backoff_retry(); sink++; }
__attribute__((noinline)) void retry_level1(void) { retry_level2(); sink++; }

__attribute__((noinline)) void touch_pages(void) {
    size_t len = 8ul << 20;
    unsigned long long end = now_ns() + WORK_NS;
    while (now_ns() < end) {
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) abort();
        for (size_t i = 0; i < len; i += 4096) p[i] = 1;
        sink += p[len / 2];
        munmap(p, len);
    }
}

__attribute__((noinline)) void build_index(void) {
    unsigned long long end = now_ns() + WORK_NS;
    for (int i = 0; now_ns() < end; i++) {
        for (int j = 0; j < 100; j++) {
            size_t n = 64 + (size_t)((i * 100 + j) * 7919) % 4096;
            char *b = malloc(n);
            memset(b, j, n);
            sink += b[n / 2];
            free(b);
        }
    }
}

__attribute__((noinline)) void chatty_syscalls(void) {
    int fd = open("/dev/null", O_WRONLY);
    unsigned long long end = now_ns() + WORK_NS;
    while (now_ns() < end) {
        for (int i = 0; i < 100; i++) {
            sink += getppid();
            if (write(fd, "x", 1) != 1) abort();
        }
    }
    close(fd);
}

__attribute__((noinline)) unsigned long fib(int n) { return n < 2 ? (unsigned long)n : fib(n - 1) + fib(n - 2); }

/* Allocated and touched in main: the copies are all the call does. */
static char *buf_a, *buf_b;
#define COPY_LEN (32ul << 20)

__attribute__((noinline)) void copy_buffers(void) {
    unsigned long long end = now_ns() + WORK_NS;
    for (int i = 0; now_ns() < end; i++) {
        memcpy(i % 2 ? buf_a : buf_b, i % 2 ? buf_b : buf_a, COPY_LEN);
        buf_a[i % 64] ^= 1;
    }
    sink += buf_a[COPY_LEN / 3] + buf_b[COPY_LEN / 5];
}

__attribute__((noinline)) void crunch(void) {
    spin_ns(12000000ull);
    nap_ms(8);
}

static const char *mode;

__attribute__((noinline)) void handle_request(int slow) {
    if (!slow) {
        sink++;
        return;
    }
    if (!strcmp(mode, "sleep")) wait_for_backend();
    else if (!strcmp(mode, "compute")) compute_checksum();
    else if (!strcmp(mode, "lock")) {
        atomic_store(&request, 1);
        while (!atomic_load(&held)) sink++;
        take_lock();
    } else if (!strcmp(mode, "fsync")) flush_journal();
    else if (!strcmp(mode, "pipe")) {
        atomic_store(&request, 1);
        read_reply();
    } else if (!strcmp(mode, "condvar")) {
        atomic_store(&request, 1);
        wait_for_signal();
    } else if (!strcmp(mode, "usleep")) retry_level1();
    else if (!strcmp(mode, "faults")) touch_pages();
    else if (!strcmp(mode, "malloc")) build_index();
    else if (!strcmp(mode, "syscalls")) chatty_syscalls();
    else if (!strcmp(mode, "recursion")) {
        unsigned long long end = now_ns() + WORK_NS;
        while (now_ns() < end) sink += fib(24);
    }
    else if (!strcmp(mode, "memcpy")) copy_buffers();
    else if (!strcmp(mode, "mixed")) crunch();
    else abort();
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: causes MODE CALLS SLOW [DIR]\n");
        return 2;
    }
    mode = argv[1];
    int calls = atoi(argv[2]), slow = atoi(argv[3]);
    if (argc > 4) dir = argv[4];
    if (pipe(pipefd)) abort();
    if (!strcmp(mode, "memcpy")) {
        buf_a = malloc(COPY_LEN);
        buf_b = malloc(COPY_LEN);
        if (!buf_a || !buf_b) abort();
        memset(buf_a, 1, COPY_LEN);
        memset(buf_b, 2, COPY_LEN);
    }
    pthread_t t;
    pthread_create(&t, NULL, other, (void *)mode);
    for (int i = 0; i < calls; i++) {
        unsigned long long t0 = now_ns();
        handle_request(i == slow);
        unsigned long long t1 = now_ns();
        if (i == slow) printf("slow=%llu %llu\n", t0, t1 - t0);
        fflush(stdout);
        nap_ms(2);
    }
    atomic_store(&request, 1);
    pthread_join(t, NULL);
    return 0;
}
