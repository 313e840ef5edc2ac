/* The ways a probed C function ends other than one plain `ret`, for the
 * `func:SYMBOL>DURATION` latency tests (probes on each exit instead of a uretprobe).
 * Build: cc -O1 -g -pthread exits.c
 *
 *   exits longjmp THREADS JUMPS SLOW THRESHOLD_US
 *       each thread calls lb_jumpy(1) JUMPS times: it longjmp()s out to the caller's
 *       setjmp (no return), then lb_jumpy(0) SLOW times: it spins 20 ms and returns.
 *   exits tail CALLS THRESHOLD_US
 *       lb_tailer (asm) ends in `jmp lb_tail_target`: a direct tail call. Call i spins
 *       20 ms when i % 20 == 5, in lb_tail_target (after the jump), or when i % 20 == 15,
 *       in lb_tailer itself (before the jump); the others are fast.
 *   exits tail-indirect CALLS THRESHOLD_US
 *       the same through lb_tailer_indirect (asm), which ends in `jmp *%rax` with the
 *       target loaded from the function pointer lb_tail_fn.
 *   exits rets CALLS THRESHOLD_US
 *       lb_three_rets (asm) has three `ret`s, one per path, chosen by i % 3; call i spins
 *       20 ms (on its path, before its ret) when i % 20 is 5, 9 or 13 (one per path).
 *   exits switch CALLS THRESHOLD_US
 *       lb_switch (asm) dispatches on i % 4 through an in-function jump table (`jmp *%rax`
 *       to a case inside the function, not an exit); cases 1 and 3 spin 20 ms. The caller
 *       picks case 1 when i % 20 == 5, case 3 when i % 20 == 15, case 0 or 2 otherwise.
 *   exits threads THREADS CALLS THRESHOLD_US
 *       THREADS threads call lb_jumpy(2) (fast) and, when i % 10 == 3, lb_jumpy(0)
 *       (20 ms spin) concurrently, CALLS calls each.
 *
 * Every mode measures each call in the caller (CLOCK_MONOTONIC around the call) and prints
 * on stdout
 *   measured_slow=N   calls that returned after more than THRESHOLD_US
 *   slow_calls=N      calls that were meant to spin (the tail modes split them into
 *                     slow_in_target=N and slow_before_jump=N)
 *   result=CHECKSUM   a function of the return values only
 * and exits 0 (2 on bad arguments).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOW_US 20000L

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Busy-waits for `us` microseconds (never sleeps: the call stays on CPU). Called from the
 * asm functions below, hence global. */
__attribute__((noinline)) void lb_spin_us(long us) {
    long long end = now_ns() + us * 1000LL;
    while (now_ns() < end) {}
}

static long long threshold_ns;

/* FNV-style mixing of the results, in call order. */
static unsigned long long mix(unsigned long long h, unsigned long long v) {
    return (h ^ v) * 1099511628211ULL;
}

/* ---- longjmp / threads: lb_jumpy ---- */

static __thread jmp_buf jump_back;

/* how == 1: longjmp()s out to jump_back; how == 0: spins SLOW_US and returns; otherwise
 * returns at once. */
__attribute__((noinline, noipa)) long lb_jumpy(int how) {
    volatile long r = how * 3 + 1;
    if (how == 1) longjmp(jump_back, 2);
    if (how == 0) lb_spin_us(SLOW_US);
    return r;
}

struct job {
    long jumps, slow, calls;
    long measured_slow, meant_slow;
    unsigned long long result;
};

/* One call of lb_jumpy(1), which comes back here through longjmp: returns its value.
 * A function of its own, so that no local of the loop lives across setjmp. */
__attribute__((noinline)) static int jump_once(void) {
    int back = setjmp(jump_back);
    if (back == 0) {
        lb_jumpy(1);
        abort(); /* lb_jumpy(1) never returns */
    }
    return back;
}

static void *longjmp_thread(void *p) {
    struct job *job = p;
    unsigned long long h = 1469598103934665603ULL;
    /* Calls left by longjmp never return: they are no latency of a return, and are not
     * measured (a preempted one can take longer than the threshold on a busy machine). */
    for (long j = 0; j < job->jumps; j++) {
        int back = jump_once();
        h = mix(h, (unsigned long long)back);
    }
    for (long s = 0; s < job->slow; s++) {
        long long start = now_ns();
        long r = lb_jumpy(0);
        if (now_ns() - start > threshold_ns) job->measured_slow++;
        job->meant_slow++;
        h = mix(h, (unsigned long long)r);
    }
    job->result = h;
    return NULL;
}

static void *threads_thread(void *p) {
    struct job *job = p;
    unsigned long long h = 1469598103934665603ULL;
    for (long i = 0; i < job->calls; i++) {
        int slow = i % 10 == 3;
        long long start = now_ns();
        long r = lb_jumpy(slow ? 0 : 2);
        if (now_ns() - start > threshold_ns) job->measured_slow++;
        job->meant_slow += slow;
        h = mix(h, (unsigned long long)r);
    }
    job->result = h;
    return NULL;
}

static int run_threads(long threads, struct job proto, void *(*body)(void *)) {
    if (threads < 1 || threads > 64) return 2;
    struct job jobs[64];
    pthread_t t[64];
    for (long k = 0; k < threads; k++) {
        jobs[k] = proto;
        if (pthread_create(&t[k], NULL, body, &jobs[k]) != 0) return 4;
    }
    long measured = 0, meant = 0;
    unsigned long long result = 0;
    for (long k = 0; k < threads; k++) {
        pthread_join(t[k], NULL);
        measured += jobs[k].measured_slow;
        meant += jobs[k].meant_slow;
        result = result * 31 + jobs[k].result;
    }
    printf("measured_slow=%ld\nslow_calls=%ld\nresult=%llu\n", measured, meant, result);
    return 0;
}

/* ---- tail calls: lb_tailer, lb_tailer_indirect -> lb_tail_target ---- */

#define TAIL_SLOW_TARGET 1L /* lb_tail_target spins */
#define TAIL_SLOW_BEFORE 2L /* the tailer spins before its jump */

/* The tail-call target: spins when asked, returns a function of its argument. */
__attribute__((noinline, noipa)) long lb_tail_target(long x) {
    if (x & TAIL_SLOW_TARGET) lb_spin_us(SLOW_US);
    return x * 5 + 3;
}

long (*lb_tail_fn)(long) = lb_tail_target;

long lb_tailer(long x);
long lb_tailer_indirect(long x);

/* Both take x in %rdi; with TAIL_SLOW_BEFORE set they call lb_spin_us(SLOW_US) first
 * (%rbx keeps x; one push makes %rsp 16-byte aligned for the call), then tail-jump with x
 * in %rdi. */
__asm__(
    "    .text\n"
    "    .globl lb_tailer\n"
    "    .type lb_tailer, @function\n"
    "lb_tailer:\n"
    "    .cfi_startproc\n"
    "    push %rbx\n"
    "    .cfi_adjust_cfa_offset 8\n"
    "    .cfi_rel_offset %rbx, 0\n"
    "    mov %rdi, %rbx\n"
    "    test $2, %bl\n"
    "    jz 1f\n"
    "    mov $20000, %edi\n"
    "    call lb_spin_us\n"
    "1:  mov %rbx, %rdi\n"
    "    pop %rbx\n"
    "    .cfi_adjust_cfa_offset -8\n"
    "    .cfi_restore %rbx\n"
    "    jmp lb_tail_target\n"
    "    .cfi_endproc\n"
    "    .size lb_tailer, .-lb_tailer\n"
    "\n"
    "    .globl lb_tailer_indirect\n"
    "    .type lb_tailer_indirect, @function\n"
    "lb_tailer_indirect:\n"
    "    .cfi_startproc\n"
    "    push %rbx\n"
    "    .cfi_adjust_cfa_offset 8\n"
    "    .cfi_rel_offset %rbx, 0\n"
    "    mov %rdi, %rbx\n"
    "    test $2, %bl\n"
    "    jz 1f\n"
    "    mov $20000, %edi\n"
    "    call lb_spin_us\n"
    "1:  mov %rbx, %rdi\n"
    "    pop %rbx\n"
    "    .cfi_adjust_cfa_offset -8\n"
    "    .cfi_restore %rbx\n"
    "    mov lb_tail_fn(%rip), %rax\n"
    "    jmp *%rax\n"
    "    .cfi_endproc\n"
    "    .size lb_tailer_indirect, .-lb_tailer_indirect\n");

static int run_tail(long calls, long (*tailer)(long)) {
    long measured = 0, in_target = 0, before_jump = 0;
    unsigned long long h = 1469598103934665603ULL;
    for (long i = 0; i < calls; i++) {
        long x = i << 2;
        if (i % 20 == 5) { x |= TAIL_SLOW_TARGET; in_target++; }
        if (i % 20 == 15) { x |= TAIL_SLOW_BEFORE; before_jump++; }
        long long start = now_ns();
        long r = tailer(x);
        if (now_ns() - start > threshold_ns) measured++;
        h = mix(h, (unsigned long long)r);
    }
    printf("measured_slow=%ld\nslow_calls=%ld\nslow_in_target=%ld\nslow_before_jump=%ld\n"
           "result=%llu\n",
           measured, in_target + before_jump, in_target, before_jump, h);
    return 0;
}

/* ---- three rets: lb_three_rets ---- */

long lb_three_rets(long x);

/* x in %rdi: the path in bits 0-1 (0, 1 or 2; 3 takes path 0), the spin flag in bit 2.
 * Each path spins (bit 2) on its own, computes its own value and returns with its own
 * `ret`. %rbx keeps x across the call; the push aligns %rsp to 16 bytes. */
__asm__(
    "    .text\n"
    "    .globl lb_three_rets\n"
    "    .type lb_three_rets, @function\n"
    "lb_three_rets:\n"
    "    .cfi_startproc\n"
    "    push %rbx\n"
    "    .cfi_adjust_cfa_offset 8\n"
    "    .cfi_rel_offset %rbx, 0\n"
    "    mov %rdi, %rbx\n"
    "    mov %edi, %eax\n"
    "    and $3, %eax\n"
    "    cmp $1, %eax\n"
    "    je .Lthree_path1\n"
    "    cmp $2, %eax\n"
    "    je .Lthree_path2\n"
    /* path 0 */
    "    test $4, %bl\n"
    "    jz 1f\n"
    "    mov $20000, %edi\n"
    "    call lb_spin_us\n"
    "1:  lea 7(%rbx), %rax\n"
    "    pop %rbx\n"
    "    .cfi_remember_state\n"
    "    .cfi_adjust_cfa_offset -8\n"
    "    .cfi_restore %rbx\n"
    "    ret\n"
    "    .cfi_restore_state\n"
    ".Lthree_path1:\n"
    "    test $4, %bl\n"
    "    jz 1f\n"
    "    mov $20000, %edi\n"
    "    call lb_spin_us\n"
    "1:  lea (%rbx,%rbx,2), %rax\n"
    "    pop %rbx\n"
    "    .cfi_remember_state\n"
    "    .cfi_adjust_cfa_offset -8\n"
    "    .cfi_restore %rbx\n"
    "    ret\n"
    "    .cfi_restore_state\n"
    ".Lthree_path2:\n"
    "    test $4, %bl\n"
    "    jz 1f\n"
    "    mov $20000, %edi\n"
    "    call lb_spin_us\n"
    "1:  mov %rbx, %rax\n"
    "    xor $0x55, %rax\n"
    "    pop %rbx\n"
    "    .cfi_adjust_cfa_offset -8\n"
    "    .cfi_restore %rbx\n"
    "    ret\n"
    "    .cfi_endproc\n"
    "    .size lb_three_rets, .-lb_three_rets\n");

static int run_rets(long calls) {
    long measured = 0, meant = 0;
    unsigned long long h = 1469598103934665603ULL;
    for (long i = 0; i < calls; i++) {
        long x = (i << 3) | (i % 3);
        long m = i % 20;
        if (m == 5 || m == 9 || m == 13) { x |= 4; meant++; }
        long long start = now_ns();
        long r = lb_three_rets(x);
        if (now_ns() - start > threshold_ns) measured++;
        h = mix(h, (unsigned long long)r);
    }
    printf("measured_slow=%ld\nslow_calls=%ld\nresult=%llu\n", measured, meant, h);
    return 0;
}

/* ---- no size: lb_unsized ---- */

/* A function whose ELF symbol has no size (hand-written asm without `.size`): its end, and
 * so its exits, cannot be known. A latency rule on it must be refused with the choices; an
 * entry rule works. Called once at the start of every mode. */
void lb_unsized(void);
__asm__(
    "    .text\n"
    "    .globl lb_unsized\n"
    "    .type lb_unsized, @function\n"
    "lb_unsized:\n"
    "    ret\n");

/* ---- jump table: lb_switch ---- */

long lb_switch(long x);

/* case = x & 3 through a table of 32-bit offsets (relative to the table, in .rodata, as
 * gcc emits them); cases 1 and 3 spin; one shared exit with one `ret`. */
__asm__(
    "    .text\n"
    "    .globl lb_switch\n"
    "    .type lb_switch, @function\n"
    "lb_switch:\n"
    "    .cfi_startproc\n"
    "    push %rbx\n"
    "    .cfi_adjust_cfa_offset 8\n"
    "    .cfi_rel_offset %rbx, 0\n"
    "    mov %rdi, %rbx\n"
    "    mov %edi, %eax\n"
    "    and $3, %eax\n"
    "    lea .Lswitch_table(%rip), %rdx\n"
    "    movslq (%rdx,%rax,4), %rax\n"
    "    add %rdx, %rax\n"
    "    jmp *%rax\n"
    ".Lswitch_case0:\n"
    "    lea 11(%rbx), %rax\n"
    "    jmp .Lswitch_done\n"
    ".Lswitch_case1:\n"
    "    mov $20000, %edi\n"
    "    call lb_spin_us\n"
    "    lea (%rbx,%rbx,4), %rax\n"
    "    jmp .Lswitch_done\n"
    ".Lswitch_case2:\n"
    "    mov %rbx, %rax\n"
    "    shl $1, %rax\n"
    "    jmp .Lswitch_done\n"
    ".Lswitch_case3:\n"
    "    mov $20000, %edi\n"
    "    call lb_spin_us\n"
    "    mov %rbx, %rax\n"
    "    xor $0x3c, %rax\n"
    ".Lswitch_done:\n"
    "    pop %rbx\n"
    "    .cfi_adjust_cfa_offset -8\n"
    "    .cfi_restore %rbx\n"
    "    ret\n"
    "    .cfi_endproc\n"
    "    .size lb_switch, .-lb_switch\n"
    "    .pushsection .rodata\n"
    "    .balign 4\n"
    ".Lswitch_table:\n"
    "    .long .Lswitch_case0-.Lswitch_table\n"
    "    .long .Lswitch_case1-.Lswitch_table\n"
    "    .long .Lswitch_case2-.Lswitch_table\n"
    "    .long .Lswitch_case3-.Lswitch_table\n"
    "    .popsection\n");

static int run_switch(long calls) {
    long measured = 0, meant = 0;
    unsigned long long h = 1469598103934665603ULL;
    for (long i = 0; i < calls; i++) {
        long m = i % 20, c = m == 5 ? 1 : m == 15 ? 3 : (i & 1) * 2;
        meant += c & 1;
        long long start = now_ns();
        long r = lb_switch((i << 2) | c);
        if (now_ns() - start > threshold_ns) measured++;
        h = mix(h, (unsigned long long)r);
    }
    printf("measured_slow=%ld\nslow_calls=%ld\nresult=%llu\n", measured, meant, h);
    return 0;
}

static int usage(void) {
    fprintf(stderr,
            "usage: exits longjmp THREADS JUMPS SLOW THRESHOLD_US\n"
            "       exits tail|tail-indirect|rets|switch CALLS THRESHOLD_US\n"
            "       exits threads THREADS CALLS THRESHOLD_US\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    lb_unsized();
    const char *mode = argv[1];
    long a[4] = { 0 };
    int n = argc - 2;
    if (n > 4) return usage();
    for (int k = 0; k < n; k++) a[k] = atol(argv[k + 2]);
    threshold_ns = a[n > 0 ? n - 1 : 0] * 1000LL;
    if (!strcmp(mode, "longjmp") && n == 4)
        return run_threads(a[0], (struct job){ .jumps = a[1], .slow = a[2] }, longjmp_thread);
    if (!strcmp(mode, "threads") && n == 3)
        return run_threads(a[0], (struct job){ .calls = a[1] }, threads_thread);
    if (!strcmp(mode, "tail") && n == 2) return run_tail(a[0], lb_tailer);
    if (!strcmp(mode, "tail-indirect") && n == 2) return run_tail(a[0], lb_tailer_indirect);
    if (!strcmp(mode, "rets") && n == 2) return run_rets(a[0]);
    if (!strcmp(mode, "switch") && n == 2) return run_switch(a[0]);
    return usage();
}
