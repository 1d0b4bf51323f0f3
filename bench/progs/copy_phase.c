/* copy_phase: copy rates outside the network stack, printed every second, to see
 * whether the machine's fast and slow phases (docs/PERFORMANCE.md, "Emulated clusters")
 * reach them.
 *
 *   memcpy: 64 KiB copies from one hot buffer into a 256 MiB region, moving through it
 *           (writes that miss the cache), for 0.5 s;
 *   pipe:   8 writes of 64 KiB into a pipe of 1 MiB, then 8 reads, for 0.5 s (the
 *           kernel's copies into and out of pages it allocates and frees).
 *
 * Usage:  copy_phase SECONDS     (pin it: taskset -c 0 copy_phase 90)
 * Build:  gcc -O2 -o copy_phase bench/progs/copy_phase.c */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 2 || atoi(argv[1]) <= 0) {
        fprintf(stderr, "usage: copy_phase SECONDS\n");
        return 2;
    }
    const int secs = atoi(argv[1]);
    const size_t region = (size_t)256 << 20, chunk = 64 << 10;
    char *src = aligned_alloc(4096, chunk), *dst = aligned_alloc(4096, chunk);
    char *big = aligned_alloc(4096, region);
    int p[2];
    if (!src || !dst || !big || pipe(p) != 0) {
        perror("copy_phase: setup");
        return 1;
    }
    fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
    memset(src, 1, chunk);
    memset(big, 1, region);
    printf("seconds  memcpy_GBps  pipe_GBps\n");
    const double t0 = now();
    size_t off = 0;
    while (now() - t0 < secs) {
        double a = now();
        size_t n = 0;
        while (now() - a < 0.5) {
            memcpy(big + off, src, chunk);
            off = (off + chunk) % region;
            n += chunk;
        }
        const double mem = n / (now() - a) / 1e9;
        a = now();
        n = 0;
        while (now() - a < 0.5) {
            for (int k = 0; k < 8; k++)
                if (write(p[1], src, chunk) != (ssize_t)chunk) { perror("write"); return 1; }
            for (int k = 0; k < 8; k++)
                if (read(p[0], dst, chunk) != (ssize_t)chunk) { perror("read"); return 1; }
            n += 8 * chunk;
        }
        printf("%7.1f  %11.2f  %9.2f\n", now() - t0, mem, n / (now() - a) / 1e9);
        fflush(stdout);
    }
    return 0;
}
