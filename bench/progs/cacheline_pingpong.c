/* cacheline_pingpong: one-way latency of handing one cache line back and forth
 * between two processes (the hardware floor under any shared-memory transport).
 *
 * How: a MAP_SHARED|MAP_ANONYMOUS page is mapped, fork() makes a child; the parent
 * pins itself to CPU_A, the child to CPU_B (sched_setaffinity; a negative CPU means
 * "do not pin"). Both sides spin on ONE 64-byte-aligned cache line holding a sequence
 * number, written with release stores and read with acquire loads (C11 atomics).
 * Round trip i: the parent stores 2i-1 and waits for 2i; the child waits for 2i-1 and
 * stores 2i. ITERS/10 untimed warm-up round trips come first, then ITERS timed ones
 * (clock_gettime(CLOCK_MONOTONIC) around the whole timed loop).
 * If CPU_A == CPU_B (both >= 0) the spin loops call sched_yield(), since pure spinning
 * on one CPU would hand over only once per scheduler timeslice; that case measures a
 * context switch, not a cache-line transfer.
 *
 * Usage:  cacheline_pingpong ITERS CPU_A CPU_B
 *         ITERS >= 1 round trips; CPU_A / CPU_B: CPU numbers (-1 = no pinning)
 * Output: one line on stdout:
 *         oneway_ns=X        X = timed total ns / (2 * ITERS), 1 decimal
 * Errors: message on stderr, exit 1 (bad arguments also print the usage).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROG_NAME "cacheline_pingpong"
#define PROG_USAGE \
    "usage: cacheline_pingpong ITERS CPU_A CPU_B\n" \
    "  ITERS  timed round trips (>= 1); ITERS/10 warm-up round trips come first\n" \
    "  CPU_A  CPU of the parent (-1 = no pinning)\n" \
    "  CPU_B  CPU of the child  (-1 = no pinning)\n" \
    "output: oneway_ns=X\n"
#include "progs.h"

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

static int same_cpu; /* CPU_A == CPU_B >= 0: yield instead of pause */
static inline void relax(void) {
    if (same_cpu) sched_yield();
    else CPU_RELAX();
}

#define ABORT_SEQ UINT64_MAX /* written by the child when it cannot run */

struct line {
    alignas(64) _Atomic uint64_t seq;
    char pad[64 - sizeof(uint64_t)];
};
_Static_assert(sizeof(struct line) == 64, "one cache line");

int main(int argc, char **argv) {
    long iters;
    int cpu_a, cpu_b;
    if (argc != 4) usage();
    if (parse_long(argv[1], 1, LONG_MAX / 4, &iters)) bad_usage("bad ITERS '%s'", argv[1]);
    if (parse_cpu(argv[2], &cpu_a) || parse_cpu(argv[3], &cpu_b)) bad_usage("bad CPU number");
    long warm = iters / 10;
    same_cpu = cpu_a >= 0 && cpu_a == cpu_b;
    uint64_t total = (uint64_t)(warm + iters);

    struct line *ln = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ln == MAP_FAILED) die_errno("mmap");
    atomic_store_explicit(&ln->seq, 0, memory_order_relaxed);
    if (pin_cpu(cpu_a)) return 1; /* pin before fork: a bad CPU_A fails cleanly */
    fflush(NULL);

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) die_errno("fork");
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the parent */
        if (getppid() != parent || pin_cpu(cpu_b)) {
            atomic_store_explicit(&ln->seq, ABORT_SEQ, memory_order_release);
            _exit(1);
        }
        for (uint64_t i = 1; i <= total; i++) {
            while (atomic_load_explicit(&ln->seq, memory_order_acquire) != 2 * i - 1) relax();
            atomic_store_explicit(&ln->seq, 2 * i, memory_order_release);
        }
        _exit(0);
    }

    double t0 = now_ns();
    for (uint64_t i = 1; i <= total; i++) {
        if (i == (uint64_t)warm + 1) t0 = now_ns();
        atomic_store_explicit(&ln->seq, 2 * i - 1, memory_order_release);
        uint32_t spins = 0;
        for (;;) {
            uint64_t v = atomic_load_explicit(&ln->seq, memory_order_acquire);
            if (v == 2 * i) break;
            if (v == ABORT_SEQ) {
                fprintf(stderr, "cacheline_pingpong: child failed to start\n");
                waitpid(pid, NULL, 0);
                return 1;
            }
            relax();
            if ((++spins & 0xFFFFFFu) == 0) { /* every 2^24 spins: is the child still alive? */
                int st;
                if (waitpid(pid, &st, WNOHANG) == pid) {
                    fprintf(stderr, "cacheline_pingpong: child died\n");
                    return 1;
                }
            }
        }
    }
    double dt = now_ns() - t0;

    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "cacheline_pingpong: child did not exit cleanly\n");
        return 1;
    }
    printf("oneway_ns=%.1f\n", dt / (2.0 * (double)iters));
    fflush(stdout);
    munmap(ln, 4096);
    return 0;
}
