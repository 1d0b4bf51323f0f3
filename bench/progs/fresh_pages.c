/* fresh_pages: what filling a large buffer costs when its pages are fresh (each first
 * write faults a zeroed page in) against when they are already mapped, as a receiver
 * assembling a long message from 1500-byte fragments fills it (dm reuses released
 * reassembly buffers for this reason; docs/DESIGN-NOTES.md, "The token buffer pool").
 *
 * Per round: a fresh anonymous mapping of MIB MiB is filled with 1500-byte memcpy's
 * ("fresh"), then filled again ("mapped"), then unmapped.
 *
 * Usage:  fresh_pages [MIB [ROUNDS]]     (default 16 MiB, 3 rounds; pin it:
 *         taskset -c 1 fresh_pages 16 3)
 * Build:  gcc -O2 -o fresh_pages bench/progs/fresh_pages.c */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void fill(char *p, size_t n, const char *src, size_t frag) {
    for (size_t o = 0; o + frag <= n; o += frag) memcpy(p + o, src, frag);
}

int main(int argc, char **argv) {
    long mib = argc > 1 ? atol(argv[1]) : 16, rounds = argc > 2 ? atol(argv[2]) : 3;
    if (argc > 3 || mib <= 0 || mib > 4096 || rounds <= 0 || rounds > 1000) {
        fprintf(stderr, "usage: fresh_pages [MIB (1-4096) [ROUNDS (1-1000)]]\n");
        return 2;
    }
    const size_t n = (size_t)mib << 20, frag = 1500;
    char src[1500];
    memset(src, 1, sizeof src);
    for (long r = 0; r < rounds; r++) {
        char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("fresh_pages: mmap");
            return 1;
        }
        double t = now();
        fill(p, n, src, frag);
        double fresh = now() - t;
        t = now();
        fill(p, n, src, frag);
        double mapped = now() - t;
        printf("%ld MiB: fresh %.2f ms, mapped %.2f ms\n", mib, fresh * 1e3, mapped * 1e3);
        munmap(p, n);
    }
    return 0;
}
