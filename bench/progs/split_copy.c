/* The split copy without quiver: how fast two processes move SIZE bytes when the
 * receiver reads the first part with process_vm_readv while the sender writes the rest
 * with process_vm_writev, at once (FRACTION: the sender's share; 0 = the receiver reads
 * everything alone, as limits/cma_bw does). The child (sender, core 1) owns the source,
 * the parent (receiver, core 0) the destination; a shared word starts each round.
 * usage: split_copy SIZE FRACTION        prints: size=.. frac=.. GBps=..
 * Built and run by hand: gcc -O2 -o split_copy bench/progs/split_copy.c
 *                        ./split_copy 1048576 0; ./split_copy 1048576 0.5 */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdatomic.h>
#include <immintrin.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); sched_setaffinity(0, sizeof s, &s); }
struct sh { _Atomic long go; char pad[56]; _Atomic long done; uintptr_t src, dst; pid_t ppid; };
int main(int argc, char **argv) {
    size_t sz = strtoull(argv[1], NULL, 0); double frac = atof(argv[2]); /* fraction the sender writes */
    struct sh *s = mmap(0, 4096, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0);
    char *dst; if (posix_memalign((void **)&dst, 4096, sz)) return 1; memset(dst, 0, sz);
    s->dst = (uintptr_t)dst; s->ppid = getpid();
    size_t half = (size_t)(sz * (1 - frac)) & ~4095UL;
    pid_t pid = fork();
    if (pid == 0) {
        pin(1);
        char *buf; if (posix_memalign((void **)&buf, 4096, sz)) _exit(1); memset(buf, 3, sz);
        s->src = (uintptr_t)buf;
        long r = 0;
        atomic_store(&s->done, -1);
        for (;;) {
            while (atomic_load(&s->go) == r) _mm_pause();
            r = atomic_load(&s->go);
            if (half < sz) {
                struct iovec l = { buf + half, sz - half }, rm = { dst + half, sz - half };
                if (process_vm_writev(s->ppid, &l, 1, &rm, 1, 0) != (ssize_t)(sz - half)) { perror("writev"); _exit(1); }
            }
            atomic_store(&s->done, r);
        }
    }
    pin(0);
    while (atomic_load(&s->done) != -1) ;
    long reps = 1; double t;
    long r = 0;
    for (;;) {
        double t0 = now();
        for (long i = 0; i < reps; i++) {
            r++; atomic_store(&s->go, r);
            if (half) { struct iovec l = { dst, half }, rm = { (void *)s->src, half };
              if (process_vm_readv(pid, &l, 1, &rm, 1, 0) != (ssize_t)half) { perror("readv"); return 1; } }
            while (atomic_load(&s->done) != r) _mm_pause();
        }
        t = now() - t0;
        if (t >= 0.3) break;
        reps *= 2;
    }
    kill(pid, SIGKILL); waitpid(pid, NULL, 0);
    printf("size=%zu frac=%.2f GBps=%.3f check=%d%d\n", sz, frac, (double)sz * reps / t / 1e9, dst[0], dst[sz-1]);
    return 0;
}
