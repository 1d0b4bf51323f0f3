/* copy_bw: the memory-copy ceilings under any intra-node transport.
 *
 *   memcpy: single-thread memcpy() bandwidth of a SIZE-byte buffer into another one
 *           (the one copy that a shared-memory bounce buffer costs per side).
 *   cma:    process_vm_readv() (cross-memory attach, the kernel's single-copy path used
 *           by Open MPI / UCX) bandwidth: a child process owns a SIZE-byte buffer, the
 *           parent copies it into its own buffer.
 *
 * How: buffers are page aligned and touched (memset) before timing. memcpy: one
 * warm-up copy, then copies in growing batches until at least 0.3 s have passed.
 * cma: fork a child pinned to CPU_OWNER that allocates and touches the buffer, sends its
 * address over a pipe and waits (blocking read on a second pipe, which ends when the
 * parent closes it or exits). The parent, pinned to CPU_READER, does one warm-up read,
 * then reads the whole buffer with process_vm_readv (one iovec each side; short reads
 * are continued) repeatedly for at least 0.3 s. Time: clock_gettime(CLOCK_MONOTONIC).
 * A negative CPU means "do not pin".
 *
 * Usage:  copy_bw memcpy SIZE CPU
 *         copy_bw cma SIZE CPU_READER CPU_OWNER
 *         SIZE: bytes (>= 1), plain decimal
 * Output: one line on stdout:
 *         MBps=X        X = copied bytes / second / 10^6, 1 decimal
 * Errors: message on stderr, exit 1 (bad arguments also print the usage);
 *         exit 2 if process_vm_readv is refused with EPERM (ptrace restrictions).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROG_NAME "copy_bw"
#define PROG_USAGE \
    "usage: copy_bw memcpy SIZE CPU\n" \
    "       copy_bw cma SIZE CPU_READER CPU_OWNER\n" \
    "  SIZE in bytes (>= 1); CPU numbers, -1 = no pinning\n" \
    "output: MBps=X (10^6 bytes per second)\n"
#include "progs.h"

#define MIN_SECONDS 0.3
#define MAX_SIZE (1ull << 40)

static char *alloc_touched(size_t size, int fill) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, size)) {
        fprintf(stderr, "copy_bw: cannot allocate %zu bytes\n", size);
        return NULL;
    }
    memset(p, fill, size);
    return p;
}

static int run_memcpy(size_t size, int cpu) {
    if (pin_cpu(cpu)) return 1;
    char *src = alloc_touched(size, 1), *dst = alloc_touched(size, 2);
    if (!src || !dst) return 1;
    memcpy(dst, src, size); /* warm-up */
    __asm__ __volatile__("" : : "r"(dst) : "memory");

    unsigned long long copies = 0, batch = 1;
    double t0 = now_s(), el;
    for (;;) {
        double tb = now_s();
        for (unsigned long long r = 0; r < batch; r++) {
            memcpy(dst, src, size);
            __asm__ __volatile__("" : : "r"(dst) : "memory"); /* keep every copy */
        }
        copies += batch;
        double t = now_s();
        el = t - t0;
        if (el >= MIN_SECONDS) break;
        if (t - tb < 0.01) batch *= 2; /* batches of ~10 ms keep clock reads negligible */
    }
    if (dst[size - 1] != 1) {
        fprintf(stderr, "copy_bw: copy check failed\n");
        return 1;
    }
    printf("MBps=%.1f\n", (double)size * (double)copies / el / 1e6);
    fflush(stdout);
    free(src);
    free(dst);
    return 0;
}

/* reads the whole remote buffer; 0 ok, else errno */
static int read_remote(pid_t pid, char *dst, uintptr_t remote, size_t size) {
    size_t done = 0;
    while (done < size) {
        struct iovec l = {dst + done, size - done};
        struct iovec r = {(void *)(remote + done), size - done};
        ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return EIO;
        done += (size_t)n;
    }
    return 0;
}

static int run_cma(size_t size, int cpu_reader, int cpu_owner) {
    int to_parent[2], to_child[2];
    if (pipe(to_parent) || pipe(to_child)) die_errno("pipe");
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) die_errno("fork");
    if (pid == 0) { /* owner */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_parent[0]);
        close(to_child[1]);
        if (getppid() != parent || pin_cpu(cpu_owner)) _exit(1);
        char *buf = alloc_touched(size, 3);
        if (!buf) _exit(1);
        uintptr_t a = (uintptr_t)buf;
        if (write(to_parent[1], &a, sizeof a) != (ssize_t)sizeof a) _exit(1);
        char c;
        while (read(to_child[0], &c, 1) < 0 && errno == EINTR) {
        } /* wait until the parent closes the pipe (or exits) */
        _exit(0);
    }
    close(to_parent[1]);
    close(to_child[0]);
    int rc = 1;
    uintptr_t remote = 0;
    char *dst = NULL;
    if (pin_cpu(cpu_reader)) goto out;
    ssize_t got;
    do got = read(to_parent[0], &remote, sizeof remote);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof remote) {
        fprintf(stderr, "copy_bw: owner process failed to start\n");
        goto out;
    }
    if (!(dst = alloc_touched(size, 0))) goto out;

    int e = read_remote(pid, dst, remote, size); /* warm-up */
    if (e == EPERM) {
        fprintf(stderr, "copy_bw: process_vm_readv: permission denied (EPERM): cross-memory attach is "
                        "blocked (ptrace restrictions: kernel.yama.ptrace_scope, container seccomp, "
                        "or missing CAP_SYS_PTRACE)\n");
        rc = 2;
        goto out;
    }
    unsigned long long reads = 0, batch = 1;
    double t0 = now_s(), el = 0;
    while (!e) {
        double tb = now_s();
        for (unsigned long long r = 0; r < batch && !e; r++) e = read_remote(pid, dst, remote, size);
        if (e) break;
        reads += batch;
        double t = now_s();
        el = t - t0;
        if (el >= MIN_SECONDS) break;
        if (t - tb < 0.01) batch *= 2;
    }
    if (e) {
        fprintf(stderr, "copy_bw: process_vm_readv: %s\n", strerror(e));
        rc = e == EPERM ? 2 : 1;
        goto out;
    }
    if (dst[size - 1] != 3) {
        fprintf(stderr, "copy_bw: copy check failed\n");
        goto out;
    }
    printf("MBps=%.1f\n", (double)size * (double)reads / el / 1e6);
    fflush(stdout);
    rc = 0;
out:
    free(dst);
    close(to_child[1]); /* releases the owner */
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    int cma;
    if (!strcmp(argv[1], "memcpy")) cma = 0;
    else if (!strcmp(argv[1], "cma")) cma = 1;
    else bad_usage("unknown mode '%s'", argv[1]);
    if (argc != (cma ? 5 : 4)) usage();
    unsigned long long size;
    int cpu_a, cpu_b;
    if (parse_ull(argv[2], 1, MAX_SIZE, &size)) bad_usage("bad SIZE '%s'", argv[2]);
    if (!cma) {
        if (parse_cpu(argv[3], &cpu_a)) bad_usage("bad CPU '%s'", argv[3]);
        return run_memcpy((size_t)size, cpu_a);
    }
    if (parse_cpu(argv[3], &cpu_a) || parse_cpu(argv[4], &cpu_b)) bad_usage("bad CPU number");
    return run_cma((size_t)size, cpu_a, cpu_b);
}
