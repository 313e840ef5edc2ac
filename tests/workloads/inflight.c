/* Calls that are slow while they still run, for the in-flight latency tests
 * (`--detect running`: a call fires once it has run longer than the threshold, before it
 * returns, or when it never returns). Build: cc -O2 -g -pthread inflight.c
 *
 *   inflight deadlock
 *       two threads call lb_transfer(first, second) in opposite lock order; their calls
 *       1..6 are serialized by a gate outside the function (fast, no deadlock), call 7 of
 *       each locks its first mutex, waits on a barrier until the other thread holds its own
 *       first mutex too, then locks the second: both block in pthread_mutex_lock for ever.
 *       Prints `thread=K tid=TID` per thread, `ready pid=PID`, then waits for SIGUSR1
 *       (sigwait: no read, no probed call) before the threads start; after each completed
 *       call `progress=TID CALLS`. Never exits.
 *   pipe
 *       prints `ready pid=PID`, waits for SIGUSR1, prints `reading tid=TID`, then
 *       lb_wait_pipe() read()s a pipe whose write end it keeps open and nobody writes:
 *       blocked in read for ever.
 *   mixed CALLS
 *       lb_maybe_slow(i), i = 0..CALLS-1, on the main thread: sleeps SLOW_MS (120 ms)
 *       when i % 3 == 1, 20 ms when i % 6 == 2, 1 ms otherwise (nanosleep: off the CPU).
 *   spin4 THREADS CALLS
 *       THREADS threads each call lb_spin(i) CALLS times: a busy loop (on the CPU) of
 *       SLOW_MS when i % 4 == 3, 1 ms otherwise.
 *   recurse ROUNDS DEPTH
 *       lb_rec(DEPTH) recurses down to lb_rec(0); round r < ROUNDS is slow: the innermost
 *       call sleeps SLOW_MS, so every level is slow. Then 20 fast rounds (innermost returns
 *       at once) and, last, lb_rec_twin(DEPTH): the same recursion in an unprobed twin whose
 *       innermost call sleeps SLOW_MS, frames at the heights lb_rec's had.
 *       Prints `last_slow_end=NS`, when the last slow round returned.
 *   sibling ROUNDS
 *       run_table() calls table[0] = lb_fast (microseconds) then table[1] = lb_other (sleeps
 *       SLOW_MS, then spins 30 ms) through ONE call instruction (a loop with a volatile index
 *       over a volatile table: gcc can neither peel nor devirtualize it), ROUNDS times:
 *       lb_other runs at the stack height, with the return address, lb_fast had.
 *   longjmp ROUNDS
 *       jump_round() calls jump_table[0] = lb_jump_through, which longjmp()s out to the
 *       caller's setjmp (itself when the round is even, from lb_jump_below when odd: through
 *       it), then, through the same call instruction, jump_table[1] = lb_after_jump (sleeps
 *       SLOW_MS, spins 30 ms): a slow call at the height of the abandoned one.
 *
 * Every mode that ends records each call of its probed function (lb_maybe_slow, lb_spin,
 * every level of lb_rec; the caller reads CLOCK_MONOTONIC just before and just after the
 * call) and prints, one line per call, `call=TID START_NS DURATION_NS`, then
 *   slow_calls=N      calls meant to be slow (sibling, longjmp: rounds of the slow sibling)
 *   result=CHECKSUM   a function of the return values only
 * and exits 0 (2 on bad arguments).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A slow call: longer than the tests' 10 ms threshold by more than the 100 ms a running
 * call may take to fire, so it must have fired. */
#define SLOW_MS 120

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Sleeps `ms` milliseconds (off the CPU), whatever signals come. */
__attribute__((noinline)) static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

/* Busy-waits `ms` milliseconds of wall-clock time (never sleeps). */
__attribute__((noinline)) static void spin_ms(long ms) {
    long long end = now_ns() + ms * 1000000LL;
    while (now_ns() < end) {}
}

static unsigned long long mix(unsigned long long h, unsigned long long v) {
    return (h ^ v) * 1099511628211ULL;
}

/* ---- the calls, as their callers measured them ---- */

struct call {
    pid_t tid;
    long long start, duration;
};

#define MAX_CALLS 4096
static struct call calls[MAX_CALLS];
static int ncalls;

static void record(long long start, long long end) {
    int at = __atomic_fetch_add(&ncalls, 1, __ATOMIC_RELAXED);
    if (at < MAX_CALLS) calls[at] = (struct call){gettid(), start, end - start};
}

static int finish(long slow, unsigned long long result) {
    int n = ncalls < MAX_CALLS ? ncalls : MAX_CALLS;
    for (int i = 0; i < n; i++)
        printf("call=%d %lld %lld\n", calls[i].tid, calls[i].start, calls[i].duration);
    printf("slow_calls=%ld\nresult=%llu\n", slow, result);
    return 0;
}

/* Blocks SIGUSR1, here and in every thread created from now on. */
static void block_release(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

/* Says `ready pid=PID` and returns once SIGUSR1 came: the test attaches in between. */
static void wait_release(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    printf("ready pid=%d\n", getpid());
    int sig;
    while (sigwait(&set, &sig) != 0 || sig != SIGUSR1) {}
}

/* ---- deadlock: lb_transfer ---- */

#define DEADLOCK_CALL 7
static pthread_mutex_t accounts[2] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
/* told: both threads said their tid (and main); start_line: released (and main);
 * past_gate: both threads are done with their gated calls; both_hold_first: both hold
 * their first mutex. */
static pthread_barrier_t told, start_line, past_gate, both_hold_first;
static volatile long balance;

/* Locks `first` then `second`, moves one unit, unlocks. With `deadlock`, waits between the
 * two locks until the other thread holds its own first lock (this thread's second). */
__attribute__((noinline, noipa)) long lb_transfer(pthread_mutex_t *first, pthread_mutex_t *second,
                                                  int deadlock) {
    pthread_mutex_lock(first);
    if (deadlock) pthread_barrier_wait(&both_hold_first);
    pthread_mutex_lock(second);
    long r = ++balance;
    pthread_mutex_unlock(second);
    pthread_mutex_unlock(first);
    return r;
}

static void *transfer_thread(void *p) {
    int k = (int)(long)p;
    pid_t tid = gettid();
    printf("thread=%d tid=%d\n", k, tid);
    pthread_barrier_wait(&told);
    pthread_barrier_wait(&start_line);
    for (int call = 1;; call++) {
        if (call < DEADLOCK_CALL) {
            pthread_mutex_lock(&gate);
            lb_transfer(&accounts[k], &accounts[1 - k], 0);
            pthread_mutex_unlock(&gate);
        } else {
            /* Call 7, never left: nobody holds the gate, or will again. */
            pthread_barrier_wait(&past_gate);
            lb_transfer(&accounts[k], &accounts[1 - k], 1);
        }
        printf("progress=%d %d\n", tid, call);
    }
    return NULL;
}

static int deadlock(void) {
    block_release();
    pthread_barrier_init(&told, NULL, 3);
    pthread_barrier_init(&start_line, NULL, 3);
    pthread_barrier_init(&past_gate, NULL, 2);
    pthread_barrier_init(&both_hold_first, NULL, 2);
    pthread_t t[2];
    for (long k = 0; k < 2; k++)
        if (pthread_create(&t[k], NULL, transfer_thread, (void *)k) != 0) return 4;
    pthread_barrier_wait(&told);
    wait_release();
    pthread_barrier_wait(&start_line);
    pthread_join(t[0], NULL);
    return 5; /* never reached: the threads deadlock */
}

/* ---- pipe: lb_wait_pipe ---- */

__attribute__((noinline, noipa)) long lb_wait_pipe(int fd) {
    char c;
    return read(fd, &c, 1);
}

static int pipe_mode(void) {
    int fds[2];
    if (pipe(fds) != 0) return 4;
    block_release();
    wait_release();
    printf("reading tid=%d\n", gettid());
    long r = lb_wait_pipe(fds[0]); /* never returns: fds[1] stays open */
    printf("read returned %ld\n", r);
    return 5;
}

/* ---- mixed: lb_maybe_slow ---- */

__attribute__((noinline, noipa)) long lb_maybe_slow(int i) {
    if (i % 3 == 1)
        nap_ms(SLOW_MS);
    else if (i % 6 == 2)
        nap_ms(20);
    else
        nap_ms(1);
    return i * 7L + 1;
}

static int mixed(long n) {
    unsigned long long h = 1469598103934665603ULL;
    long slow = 0;
    for (int i = 0; i < n; i++) {
        long long start = now_ns();
        long r = lb_maybe_slow(i);
        record(start, now_ns());
        slow += i % 3 == 1 || i % 6 == 2;
        h = mix(h, (unsigned long long)r);
    }
    return finish(slow, h);
}

/* ---- spin4: lb_spin on several threads ---- */

__attribute__((noinline, noipa)) long lb_spin(int i) {
    spin_ms(i % 4 == 3 ? SLOW_MS : 1);
    return i * 5L + 3;
}

static long spin_calls;

static void *spin_thread(void *p) {
    unsigned long long h = 1469598103934665603ULL;
    for (int i = 0; i < spin_calls; i++) {
        long long start = now_ns();
        long r = lb_spin(i);
        record(start, now_ns());
        h = mix(h, (unsigned long long)r);
    }
    *(unsigned long long *)p = h;
    return NULL;
}

static int spin4(long threads, long n) {
    if (threads < 1 || threads > 16) return 2;
    spin_calls = n;
    pthread_t t[16];
    unsigned long long results[16];
    for (long k = 0; k < threads; k++)
        if (pthread_create(&t[k], NULL, spin_thread, &results[k]) != 0) return 4;
    unsigned long long h = 0;
    for (long k = 0; k < threads; k++) {
        pthread_join(t[k], NULL);
        h = h * 31 + results[k];
    }
    long slow = 0;
    for (long i = 0; i < n; i++) slow += i % 4 == 3;
    return finish(slow * threads, h);
}

/* ---- recurse: lb_rec, and its unprobed twin ---- */

/* Each level measures the call to the level below it (main measures the outermost). */
__attribute__((noinline, noipa)) long lb_rec(int depth, int slow) {
    if (depth == 0) {
        if (slow) nap_ms(SLOW_MS);
        return 1;
    }
    long long start = now_ns();
    long r = lb_rec(depth - 1, slow);
    record(start, now_ns());
    return r * 3 + depth;
}

/* lb_rec's code under another name: not probed. */
__attribute__((noinline, noipa)) long lb_rec_twin(int depth, int slow) {
    if (depth == 0) {
        if (slow) nap_ms(SLOW_MS);
        return 1;
    }
    long long start = now_ns();
    long r = lb_rec_twin(depth - 1, slow);
    (void)start;
    return r * 3 + depth;
}

static int recurse(long rounds, long depth) {
    if (depth < 0 || depth > 64) return 2;
    unsigned long long h = 1469598103934665603ULL;
    long long last_slow_end = 0;
    for (long r = 0; r < rounds + 20; r++) {
        long long start = now_ns();
        long v = lb_rec((int)depth, r < rounds);
        long long end = now_ns();
        record(start, end);
        if (r < rounds) last_slow_end = end;
        h = mix(h, (unsigned long long)v);
    }
    h = mix(h, (unsigned long long)lb_rec_twin((int)depth, 1));
    printf("last_slow_end=%lld\n", last_slow_end);
    return finish(rounds * (depth + 1), h);
}

/* ---- sibling: lb_fast and lb_other through one call instruction ---- */

static volatile unsigned long long sink;

__attribute__((noinline, noipa)) void lb_fast(int i) { sink = sink * 3 + (unsigned)i; }

__attribute__((noinline, noipa)) void lb_other(int i) {
    nap_ms(SLOW_MS);
    spin_ms(30);
    sink = sink * 5 + (unsigned)i;
}

static void (*volatile table[2])(int) = {lb_fast, lb_other};
static volatile int table_len = 2;

/* The index is volatile too: knowing the table's size, gcc would otherwise peel the loop
 * into two call instructions. */
__attribute__((noinline, noipa)) void run_table(int i) {
    for (volatile int k = 0; k < table_len; k++) table[k](i); /* the one call site */
}

static int sibling(long rounds) {
    for (int i = 0; i < rounds; i++) run_table(i);
    return finish(rounds, sink);
}

/* ---- longjmp: lb_jump_through, then lb_after_jump from the same call site ---- */

static jmp_buf jump_back;

__attribute__((noinline, noipa)) void lb_jump_below(int i) { longjmp(jump_back, i + 1); }

__attribute__((noinline, noipa)) long lb_jump_through(int i) {
    volatile long r = i * 11L;
    if (i % 2) lb_jump_below(i); /* through lb_jump_through */
    longjmp(jump_back, i + 1);   /* out of it */
    return r;
}

__attribute__((noinline, noipa)) long lb_after_jump(int i) {
    nap_ms(SLOW_MS);
    spin_ms(30);
    return i * 13L + 2;
}

static long (*volatile jump_table[2])(int) = {lb_jump_through, lb_after_jump};

/* Calls lb_jump_through, which comes back here through longjmp, then lb_after_jump
 * through the same call instruction; returns what lb_after_jump returned plus the jump's
 * value. The locals that live across setjmp are volatile. */
__attribute__((noinline)) static long jump_round(int i) {
    volatile int which = 0;
    volatile long jumped = 0;
    int back = setjmp(jump_back);
    if (back != 0) {
        which = 1;
        jumped = back;
    }
    long r = jump_table[which](i); /* the one call site */
    return r + jumped;
}

static int longjmp_mode(long rounds) {
    unsigned long long h = 1469598103934665603ULL;
    for (int i = 0; i < rounds; i++) h = mix(h, (unsigned long long)jump_round(i));
    return finish(rounds, h);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    long a = argc > 2 ? atol(argv[2]) : 0, b = argc > 3 ? atol(argv[3]) : 0;
    if (!strcmp(mode, "deadlock") && argc == 2) return deadlock();
    if (!strcmp(mode, "pipe") && argc == 2) return pipe_mode();
    if (!strcmp(mode, "mixed") && argc == 3) return mixed(a);
    if (!strcmp(mode, "spin4") && argc == 4) return spin4(a, b);
    if (!strcmp(mode, "recurse") && argc == 4) return recurse(a, b);
    if (!strcmp(mode, "sibling") && argc == 3) return sibling(a);
    if (!strcmp(mode, "longjmp") && argc == 3) return longjmp_mode(a);
    fprintf(stderr,
            "usage: inflight deadlock | pipe | mixed CALLS | spin4 THREADS CALLS |\n"
            "       recurse ROUNDS DEPTH | sibling ROUNDS | longjmp ROUNDS\n");
    return 2;
}
