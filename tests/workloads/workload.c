/* Test workload for lookback's integration tests and benchmarks. Every behaviour the tests
 * need is a mode chosen on the command line; the functions the tests probe are global and
 * never inlined. Build: cc -O1 -g -fno-omit-frame-pointer -pthread workload.c -L. -lworkload
 *
 *   workload [--wait] MODE ARGS...
 *     --wait                   read one line from stdin before starting (for `attach`)
 *     calls N SLOW_EVERY SLOW_US FAST_US THREADS
 *                              each thread calls lb_work() N times; every SLOW_EVERY-th call
 *                              (1-based) sleeps SLOW_US, the others FAST_US
 *     recurse DEPTH SLEEP_US   lb_recurse(DEPTH): each level sleeps SLEEP_US after recursing
 *                              and prints level_ns=DEPTH:NS, its duration as it measured it
 *     lib N SLOW_US            calls lib_slow() (in libworkload.so) N times
 *     fsync N                  write+fsync a temp file N times
 *     nanosleep N US           N nanosleeps of US
 *     enoent N                 N openat() of a missing file
 *     getpid N                 N getpid() syscalls; prints ns_per_op= (benchmarks)
 *     loop N                   N calls of lb_noop(); prints ns_per_op= (benchmarks)
 *     loopnop N                N calls of lb_noop_nop5() (NOP5 entry); prints ns_per_op=
 *     looprets N               N calls of lb_noop_rets() (three rets); prints ns_per_op=
 *     segv | abort | usr1      die by SIGSEGV / SIGABRT, or raise SIGUSR1 (handled) once
 *     started                  print started_ns=NOW (CLOCK_REALTIME at main), call lb_work(1)
 *     fork N SLOW_US           fork a child that calls lb_work(SLOW_US) N times; parent waits
 *     spin MS THREADS          each thread busy-loops in lb_spin() for MS ms (on-CPU work for
 *                              sampling tests)
 *     forkspin MS              fork a child that runs lb_spin(MS); the parent waits
 *     forks N LIVE_US          fork N children without exec, as fast as it can; each sleeps
 *                              LIVE_US and exits (a pre-fork server's churn); prints forked=N
 *     spinbg MS COUNT BG_MS [FILE]
 *                              a thread busy-loops in lb_busy() for BG_MS ms while the main
 *                              thread calls lb_spin(MS) COUNT times (on-CPU work after a
 *                              trigger: in-kernel freeze tests); with FILE, then waits until
 *                              FILE exists (at most 60 s) and calls lb_spin(MS) once more
 *     execstorm N RATE MS [call]
 *                              fork+exec N children, RATE a second; each spins MS ms, or with
 *                              `call` makes one lb_work() call of MS ms; prints child=PID
 *                              for each, then elapsed_ns=, then raises SIGUSR1
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int lib_slow(long us);

static void sleep_us(long us) {
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    while (nanosleep(&ts, &ts) != 0) {}
}

__attribute__((noinline)) int lb_work(long us) { sleep_us(us); return 1; }

static long long now_ns(void);

__attribute__((noinline)) int lb_recurse(int depth, long us) {
    long long t0 = now_ns();
    int r = depth > 0 ? lb_recurse(depth - 1, us) : 0;
    sleep_us(us);
    /* Each level's own measurement, for tests that must not depend on the clock. */
    printf("level_ns=%d:%lld\n", depth, now_ns() - t0);
    return r + 1;
}

volatile long sink;
__attribute__((noinline)) void lb_noop(long i) { sink += i; }

/* Writes through `p`: NULL faults here, in a frame of its own under main (segv mode). */
__attribute__((noinline)) void lb_fault(volatile int *p) {
    *p = 1;
    sink++;
}

/* What gcc -pg -mfentry -mnop-mcount emits: a 5-byte NOP at the entry. */
__attribute__((noinline)) void lb_noop_nop5(long i) {
    __asm__ volatile(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00");
    sink += i;
}

/* Three `ret`s, one per path (i % 3): the cost of a latency rule on a function with several
 * exits (each gets its own uprobe). Hand-written so the compiler cannot merge them. */
void lb_noop_rets(long i);
__asm__(
    "    .text\n"
    "    .globl lb_noop_rets\n"
    "    .type lb_noop_rets, @function\n"
    "lb_noop_rets:\n"
    "    mov %rdi, %rax\n"
    "    mov $3, %ecx\n"
    "    xor %edx, %edx\n"
    "    div %rcx\n"
    "    test %rdx, %rdx\n"
    "    jne 1f\n"
    "    ret\n"
    "1:  cmp $1, %rdx\n"
    "    jne 2f\n"
    "    ret\n"
    "2:  ret\n"
    "    .size lb_noop_rets, .-lb_noop_rets\n");


/* Busy for `ms` milliseconds, calling lb_noop so the samples have a two-deep user stack. */
__attribute__((noinline)) void lb_spin(long ms) {
    long long end = now_ns() + ms * 1000000LL;
    long i = 0;
    while (now_ns() < end)
        for (int k = 0; k < 1000; k++) lb_noop(i++);
}

static void *spin_thread(void *p) { lb_spin(*(long *)p); return NULL; }

/* lb_spin under another name, for work that must not trigger a lb_spin rule. */
__attribute__((noinline)) void lb_busy(long ms) {
    long long end = now_ns() + ms * 1000000LL;
    long i = 0;
    while (now_ns() < end)
        for (int k = 0; k < 1000; k++) lb_noop(i++);
}

static void *busy_thread(void *p) { lb_busy(*(long *)p); return NULL; }

struct calls { long n, slow_every, slow_us, fast_us; };

/* Each call's duration as the program measured it (`call_ns=`): on a busy machine a
 * "fast" 100 µs sleep can take longer than a test's threshold, and then it is slow. */
static void *calls_thread(void *p) {
    struct calls *c = p;
    for (long i = 1; i <= c->n; i++) {
        long long t0 = now_ns();
        lb_work(c->slow_every > 0 && i % c->slow_every == 0 ? c->slow_us : c->fast_us);
        printf("call_ns=%lld\n", now_ns() - t0);
    }
    return NULL;
}

static void usr1(int sig) { (void)sig; }

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Benchmarks print the loop's cost per iteration, measured around the loop only. */
static void report(long n, long long start) {
    if (n > 0) printf("ns_per_op=%.1f\n", (double)(now_ns() - start) / (double)n);
}

int main(int argc, char **argv) {
    int a = 1;
    if (a < argc && strcmp(argv[a], "--wait") == 0) {
        char line[16];
        a++;
        if (!fgets(line, sizeof line, stdin)) return 3;
    }
    if (a >= argc) { fprintf(stderr, "usage: workload [--wait] MODE ARGS\n"); return 2; }
    const char *mode = argv[a++];
#define ARG(i) (a + (i) < argc ? atol(argv[a + (i)]) : 0)
    if (!strcmp(mode, "calls")) {
        long threads = ARG(4) > 0 ? ARG(4) : 1;
        struct calls c = { ARG(0), ARG(1), ARG(2), ARG(3) };
        pthread_t t[64];
        for (long i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, calls_thread, &c);
        for (long i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    } else if (!strcmp(mode, "spin")) {
        long ms = ARG(0), threads = ARG(1) > 0 ? ARG(1) : 1;
        pthread_t t[64];
        for (long i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, spin_thread, &ms);
        for (long i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    } else if (!strcmp(mode, "spinbg")) {
        long bg = ARG(2);
        pthread_t t;
        pthread_create(&t, NULL, busy_thread, &bg);
        for (long i = 0; i < ARG(1); i++) lb_spin(ARG(0));
        if (a + 3 < argc) {
            for (int k = 0; k < 6000 && access(argv[a + 3], F_OK) != 0; k++) sleep_us(10000);
            lb_spin(ARG(0));
        }
        pthread_join(t, NULL);
    } else if (!strcmp(mode, "forkspin")) {
        pid_t child = fork();
        if (child == 0) {
            lb_spin(ARG(0));
            _exit(0);
        }
        waitpid(child, NULL, 0);
    } else if (!strcmp(mode, "forks")) {
        long forked = 0;
        for (long i = 0; i < ARG(0); i++) {
            pid_t child = fork();
            if (child == 0) {
                usleep((useconds_t)ARG(1));
                _exit(0);
            }
            if (child > 0) forked++;
            while (waitpid(-1, NULL, WNOHANG) > 0) {}
        }
        while (wait(NULL) > 0) {}
        printf("forked=%ld\n", forked);
    } else if (!strcmp(mode, "recurse")) {
        lb_recurse((int)ARG(0), ARG(1));
    } else if (!strcmp(mode, "lib")) {
        for (long i = 0; i < ARG(0); i++) lib_slow(ARG(1));
    } else if (!strcmp(mode, "fsync")) {
        char path[] = "/tmp/lookback-workload-XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0) return 4;
        unlink(path);
        for (long i = 0; i < ARG(0); i++) {
            if (write(fd, "x", 1) != 1) return 5;
            fsync(fd);
        }
        close(fd);
    } else if (!strcmp(mode, "nanosleep")) {
        for (long i = 0; i < ARG(0); i++) sleep_us(ARG(1));
    } else if (!strcmp(mode, "enoent")) {
        for (long i = 0; i < ARG(0); i++) {
            int fd = open("/nonexistent/lookback-workload", O_RDONLY);
            if (fd >= 0) close(fd);
        }
    } else if (!strcmp(mode, "getpid")) {
        long long t = now_ns();
        for (long i = 0; i < ARG(0); i++) syscall(SYS_getpid);
        report(ARG(0), t);
    } else if (!strcmp(mode, "loop")) {
        long long t = now_ns();
        for (long i = 0; i < ARG(0); i++) lb_noop(i);
        report(ARG(0), t);
    } else if (!strcmp(mode, "loopnop")) {
        long long t = now_ns();
        for (long i = 0; i < ARG(0); i++) lb_noop_nop5(i);
        report(ARG(0), t);
    } else if (!strcmp(mode, "looprets")) {
        long long t = now_ns();
        for (long i = 0; i < ARG(0); i++) lb_noop_rets(i);
        report(ARG(0), t);
    } else if (!strcmp(mode, "started")) {
        /* When main began (wall clock): a tool's start-up delay, seen from outside
           (cargo xtask bench --startup-only); then one call of the probed function. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        printf("started_ns=%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
        lb_work(1);
    } else if (!strcmp(mode, "segv")) {
        lb_fault(NULL);
    } else if (!strcmp(mode, "abort")) {
        abort();
    } else if (!strcmp(mode, "usr1")) {
        signal(SIGUSR1, usr1);
        raise(SIGUSR1);
    } else if (!strcmp(mode, "spinusr1")) {
        /* Busy for MS ms, then a SIGUSR1 to itself: a short-lived process whose
           snapshot shows whether it was recorded from its start. */
        signal(SIGUSR1, usr1);
        lb_spin(ARG(0));
        raise(SIGUSR1);
    } else if (!strcmp(mode, "execstorm")) {
        /* N children, RATE a second, each exec'ing this program to spin MS ms (by its own
           clock), or with `call` to make one lb_work() call of MS ms; their pids on stdout
           (`child=PID`); then a SIGUSR1 to itself. */
        long n = ARG(0), rate = ARG(1) > 0 ? ARG(1) : 1000;
        int call = a + 3 < argc && !strcmp(argv[a + 3], "call");
        char self[4096], ms[32], us[32];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0) return 6;
        self[len] = 0;
        snprintf(ms, sizeof ms, "%ld", ARG(2));
        snprintf(us, sizeof us, "%ld", ARG(2) * 1000);
        /* One write per line: the children write to the same pipe (`call_ns=`), and a
           line split across two block writes would be cut by theirs. */
        setvbuf(stdout, NULL, _IOLBF, 0);
        signal(SIGUSR1, usr1);
        long long start = now_ns();
        for (long i = 0; i < n; i++) {
            long long due = start + i * 1000000000LL / rate;
            while (now_ns() < due) sleep_us(100);
            pid_t child = fork();
            if (child == 0) {
                if (call) execl(self, "workload", "calls", "1", "1", us, us, (char *)NULL);
                else execl(self, "workload", "spin", ms, (char *)NULL);
                _exit(127);
            }
            if (child > 0) printf("child=%d\n", (int)child);
            while (waitpid(-1, NULL, WNOHANG) > 0) {}
        }
        while (wait(NULL) > 0) {}
        printf("elapsed_ns=%lld\n", now_ns() - start);
        fflush(stdout);
        raise(SIGUSR1);
    } else if (!strcmp(mode, "fork")) {
        pid_t child = fork();
        if (child == 0) {
            for (long i = 0; i < ARG(0); i++) lb_work(ARG(1));
            _exit(0);
        }
        waitpid(child, NULL, 0);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
