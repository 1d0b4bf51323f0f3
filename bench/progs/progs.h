/* progs.h: helpers shared by the benchmark programs of bench/progs/ (header only; every
 * function is static inline, so a program that does not use one gets no warning).
 *
 * A program defines, before including it: _GNU_SOURCE (before any #include), PROG_NAME
 * (its name: the prefix of every error message) and PROG_USAGE (its usage text).
 *
 * It provides:
 *   now_s, now_ns      CLOCK_MONOTONIC time in seconds / nanoseconds
 *   die(fmt, ...), die_errno(fmt, ...)
 *                      "PROG_NAME: message[: strerror(errno)]" on stderr, exit 1
 *   usage(), bad_usage(fmt, ...)
 *                      [a "PROG_NAME: message" line, then] PROG_USAGE on stderr, exit 1
 *   parse_long, parse_ull, parse_cpu, parse_seconds, parse_sizes
 *                      strict decimal command-line numbers: 0 ok, -1 bad
 *   pin_cpu            pin the calling process to one CPU (negative: no pinning)
 *   the sizing rules and output lines of the lat / bw tests (osu_mpi, sock_pp):
 *     MAX_SIZES, MAX_MSG, MAX_ITERS, MAX_WINDOW, calib_more, calibrate, clamp_iters,
 *     lat_warmup, window_count, print_lat, print_bw
 */
#ifndef PROGS_H
#define PROGS_H

#if !defined(_GNU_SOURCE) || !defined(PROG_NAME) || !defined(PROG_USAGE)
#error "define _GNU_SOURCE, PROG_NAME and PROG_USAGE before including progs.h"
#endif

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------- clock ---------- */

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* ---------- errors ---------- */

static inline _Noreturn void usage(void) {
    fputs(PROG_USAGE, stderr);
    exit(1);
}

/* "PROG_NAME: message[: strerror(errno)]" on stderr, [then the usage text,] exit 1 */
__attribute__((format(printf, 3, 4)))
static inline _Noreturn void fail_exit(int with_errno, int with_usage, const char *fmt, ...) {
    int e = errno;
    va_list ap;
    va_start(ap, fmt);
    fputs(PROG_NAME ": ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (with_errno) fprintf(stderr, ": %s", strerror(e));
    fputc('\n', stderr);
    if (with_usage) usage();
    exit(1);
}
#define die(...) fail_exit(0, 0, __VA_ARGS__)
#define die_errno(...) fail_exit(1, 0, __VA_ARGS__)
#define bad_usage(...) fail_exit(0, 1, __VA_ARGS__)

/* ---------- argument parsing ---------- */

#define MAX_SIZES 1024       /* entries of a SIZES list */
#define MAX_MSG (1ull << 30) /* largest size in a SIZES list */

/* decimal long in [min, max] (strtol syntax: leading blanks and a sign allowed) */
static inline int parse_long(const char *s, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

/* plain decimal digits only, value in [min, max] */
static inline int parse_ull(const char *s, unsigned long long min, unsigned long long max,
                            unsigned long long *out) {
    char *end;
    if (*s < '0' || *s > '9') return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

/* a CPU number, or -1 for "no pinning" */
static inline int parse_cpu(const char *s, int *out) {
    long v;
    if (parse_long(s, -1, CPU_SETSIZE - 1, &v)) return -1;
    *out = (int)v;
    return 0;
}

/* SECONDS: 0 < x <= 3600 */
static inline int parse_seconds(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v <= 0 || v > 3600) return -1;
    *out = v;
    return 0;
}

/* SIZES: comma-separated byte counts, each 1 .. MAX_MSG, at most MAX_SIZES of them;
 * sizes must hold MAX_SIZES entries */
static inline int parse_sizes(const char *arg, size_t *sizes, int *n) {
    char tmp[16384];
    if (strlen(arg) >= sizeof tmp || !*arg) return -1;
    strcpy(tmp, arg);
    *n = 0;
    char *p = tmp;
    for (;;) {
        char *c = strchr(p, ',');
        if (c) *c = 0;
        unsigned long long v;
        if (*n >= MAX_SIZES || parse_ull(p, 1, MAX_MSG, &v)) return -1;
        sizes[(*n)++] = (size_t)v;
        if (!c) return 0;
        p = c + 1;
    }
}

/* ---------- CPU pinning ---------- */

/* 0 ok (or cpu < 0: nothing done); -1 after a message on stderr */
static inline int pin_cpu(int cpu) {
    if (cpu < 0) return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set)) {
        fprintf(stderr, PROG_NAME ": sched_setaffinity(cpu %d): %s\n", cpu, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---------- lat / bw tests ---------- */

#define MAX_ITERS 10000000L /* most timed round trips / windows per size */
#define MAX_WINDOW 64       /* most messages in flight in a bw window */

/* calibration goes on while a chunk of k units took < seconds/20 (and k < 2^24) */
static inline int calib_more(double t, double seconds, long k) {
    /* chunks of at least 5 ms too: a stall of a few ms in a tiny first chunk (seen on this
     * 2-core VM) must not be taken for the speed of the path */
    return (t < seconds / 20 || t < 0.005) && k < (1L << 24);
}

/* Calibration: chunk(size, w, k) runs k units (round trips, or windows of w messages) of
 * size bytes and returns their time in s; it runs for k = k0, 2*k0, 4*k0, ... while
 * more(t, seconds, k) (calib_more, or a wrapper that lets MPI ranks agree on it).
 * Returns the estimated time of one unit: the fastest chunk's time / its k (a chunk
 * slowed by a stall does not count). */
static inline double calibrate(double (*chunk)(size_t size, int w, long k), size_t size, int w, long k0,
                               double seconds, int (*more)(double t, double seconds, long k)) {
    double best = -1;
    for (long k = k0;; k *= 2) {
        double t = chunk(size, w, k);
        if (best < 0 || t / (double)k < best) best = t / (double)k;
        if (!more(t, seconds, k)) return best;
    }
}

/* units for a timed phase of about target s at est s each: clamp(target / est, lo, MAX_ITERS) */
static inline long clamp_iters(double target, double est, long lo) {
    double n = est > 0 ? target / est : (double)MAX_ITERS;
    if (n > (double)MAX_ITERS) return MAX_ITERS;
    return n < (double)lo ? lo : (long)n;
}

/* untimed warm-up round trips before iters timed ones: max(100, iters/10) */
static inline long lat_warmup(long iters) {
    return iters / 10 > 100 ? iters / 10 : 100;
}

/* messages per bw window: max(1, min(MAX_WINDOW, window_bytes / size)) */
static inline int window_count(unsigned long long window_bytes, size_t size) {
    unsigned long long q = window_bytes / size;
    return q < 1 ? 1 : q > MAX_WINDOW ? MAX_WINDOW : (int)q;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* "lat size=S oneway_us_median=X oneway_us_mean=Y iters=N" from n round-trip times
 * (seconds; rt is sorted in place) */
static inline void print_lat(size_t size, double *rt, long n) {
    double sum = 0;
    for (long i = 0; i < n; i++) sum += rt[i];
    qsort(rt, (size_t)n, sizeof(double), cmp_double);
    double med = n % 2 ? rt[n / 2] : (rt[n / 2 - 1] + rt[n / 2]) / 2;
    printf("lat size=%zu oneway_us_median=%.3f oneway_us_mean=%.3f iters=%ld\n", size, med / 2 * 1e6,
           sum / (double)n / 2 * 1e6, n);
    fflush(stdout);
}

/* "bw size=S MBps=X window=W iters=N" for n windows of w messages of size bytes in t s */
static inline void print_bw(size_t size, int w, long n, double t) {
    printf("bw size=%zu MBps=%.2f window=%d iters=%ld\n", size, (double)size * w * (double)n / t / 1e6, w, n);
    fflush(stdout);
}

#endif
