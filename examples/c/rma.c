/*
 * rma: one-sided operations from C. Every rank allocates a window; ROUNDS times, every
 * rank puts a pattern of its own into the next rank's window, flushes, meets the
 * others at the barrier, checks in place what the previous rank put into its own
 * window, and gets back what it put; every rank adds 1 to word 0 of rank 0's window
 * (fetch-and-add) and rank 0 finds the exact sum; a column of a matrix goes by a
 * strided put, scattered elements by an indexed get; a put that counts wakes its
 * target; compare-and-swap and the combining tree answer what they should. Every byte
 * is checked; the window is freed collectively.
 *
 *   cc rma.c -o rma $(pkg-config --cflags --libs quiver)
 *   quiver run -n 3 -- ./rma [ROUNDS]
 */
#include <quiver.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        quiver_error err_ = (call);                                                       \
        if (err_ != QUIVER_OK) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,             \
                    quiver_strerror(err_), quiver_last_error_message());                  \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

#define FAIL(...)                                                                         \
    do {                                                                                  \
        fprintf(stderr, "rma: " __VA_ARGS__);                                             \
        fputc('\n', stderr);                                                              \
        return 1;                                                                         \
    } while (0)

/* The window: word 0 the sum, word 1 the counter of notifying puts, word 2 for
   compare-and-swap, then DATA bytes put by the previous rank, then a 16 x 16 matrix of
   8-byte elements. */
#define SUM 0
#define COUNTER 8
#define CAS 16
#define DATA 64
#define LEN 200000
#define MATRIX (DATA + LEN)
#define N 16
#define WINDOW (MATRIX + N * N * 8)

static uint8_t pattern(uint32_t rank, uint32_t round, size_t i) {
    return (uint8_t)(rank * 31 + round * 7 + i * 13 + (i >> 8));
}

int main(int argc, char **argv) {
    uint32_t rounds = argc > 1 ? (uint32_t)atoi(argv[1]) : 3;
    if (rounds < 1 || rounds > 100) {
        fprintf(stderr, "rma: ROUNDS is 1 to 100\n");
        return 2;
    }
    quiver_job *job = NULL;
    CHECK(quiver_job_from_env(&job));
    uint32_t rank, size;
    CHECK(quiver_job_rank(job, &rank));
    CHECK(quiver_job_size(job, &size));
    uint32_t next = (rank + 1) % size, prev = (rank + size - 1) % size;

    quiver_rma *r = NULL;
    CHECK(quiver_rma_open(job, 40, &r));
    quiver_window *w = NULL;
    CHECK(quiver_rma_allocate(r, WINDOW, &w));
    uint8_t *mine;
    size_t len;
    CHECK(quiver_window_info(w, NULL, &len, &mine));
    if (len != WINDOW) FAIL("rank %u: a window of %zu bytes, not %d", rank, len, WINDOW);
    CHECK(quiver_rma_barrier(r));

    uint8_t *out = malloc(LEN), *back = malloc(LEN);
    for (uint32_t round = 0; round < rounds; round++) {
        size_t n = LEN - round * 1000; /* a different length each round */
        for (size_t i = 0; i < n; i++) out[i] = pattern(rank, round, i);
        CHECK(quiver_rma_put(r, next, w, DATA, out, n));
        CHECK(quiver_rma_flush(r, next));
        CHECK(quiver_rma_barrier(r));
        for (size_t i = 0; i < n; i++)
            if (mine[DATA + i] != pattern(prev, round, i))
                FAIL("rank %u round %u: byte %zu of the window is %u", rank, round, i,
                     mine[DATA + i]);
        memset(back, 0, n);
        CHECK(quiver_rma_get(r, next, w, DATA, back, n));
        if (memcmp(back, out, n) != 0) FAIL("rank %u round %u: the get differs", rank, round);
        uint64_t old;
        CHECK(quiver_rma_fetch_add(r, 0, w, SUM, 1, &old));
        CHECK(quiver_rma_barrier(r));
    }
    if (rank == 0) {
        uint64_t sum;
        memcpy(&sum, mine + SUM, 8);
        if (sum != (uint64_t)rounds * size) FAIL("the sum is %llu", (unsigned long long)sum);
    }

    /* Column `rank` of the next rank's matrix, from a dense vector. */
    uint64_t column[N], got[N];
    for (int i = 0; i < N; i++) column[i] = (uint64_t)rank << 32 | (uint64_t)i;
    quiver_strided col = {MATRIX + rank * 8, N * 8, 8, N};
    CHECK(quiver_rma_put_strided(r, next, w, &col, (const uint8_t *)column, sizeof column, 8));
    CHECK(quiver_rma_flush(r, next));
    CHECK(quiver_rma_barrier(r));
    for (int i = 0; i < N; i++) {
        uint64_t v;
        memcpy(&v, mine + MATRIX + (i * N + prev) * 8, 8);
        if (v != ((uint64_t)prev << 32 | (uint64_t)i)) FAIL("rank %u: column element %d", rank, i);
    }
    /* The same column back, in reverse order, by an indexed get. */
    uint64_t from[N], to[N];
    for (int i = 0; i < N; i++) {
        from[i] = MATRIX + (i * N + rank) * 8;
        to[i] = (N - 1 - i) * 8;
    }
    CHECK(quiver_rma_get_indexed(r, next, w, from, (uint8_t *)got, sizeof got, to, N, 8));
    for (int i = 0; i < N; i++)
        if (got[N - 1 - i] != column[i]) FAIL("rank %u: indexed element %d", rank, i);

    /* A put that counts, and its target waiting for it. */
    CHECK(quiver_rma_put_notify(r, next, w, DATA, out, 100, COUNTER));
    CHECK(quiver_rma_wait_counter(r, w, COUNTER, 1));
    for (size_t i = 0; i < 100; i++)
        if (mine[DATA + i] != pattern(prev, rounds - 1, i)) FAIL("rank %u: notified byte %zu", rank, i);

    /* Compare-and-swap on the next rank's word: only the expected value swaps. */
    uint64_t seen;
    CHECK(quiver_rma_compare_swap(r, next, w, CAS, 1, 5, &seen));
    if (seen != 0) FAIL("rank %u: compare-and-swap found %llu", rank, (unsigned long long)seen);
    CHECK(quiver_rma_compare_swap(r, next, w, CAS, 0, 5, &seen));
    CHECK(quiver_rma_swap(r, next, w, CAS, 9, &seen));
    if (seen != 5) FAIL("rank %u: swap found %llu", rank, (unsigned long long)seen);

    uint64_t total, most;
    CHECK(quiver_rma_combine(r, rank + 1, QUIVER_COMBINE_SUM, &total));
    CHECK(quiver_rma_combine(r, rank, QUIVER_COMBINE_MAX, &most));
    if (total != (uint64_t)size * (size + 1) / 2 || most != size - 1)
        FAIL("rank %u: combined %llu and %llu", rank, (unsigned long long)total,
             (unsigned long long)most);
    /* Bad input is a typed error: past the window's end, a misaligned word. */
    if (quiver_rma_put(r, next, w, WINDOW - 4, out, 8) != QUIVER_ERR_RMA)
        FAIL("rank %u: a put past the window's end was not refused", rank);
    if (quiver_rma_fetch_add(r, next, w, 4, 1, NULL) != QUIVER_ERR_RMA)
        FAIL("rank %u: a misaligned fetch-and-add was not refused", rank);
    if (quiver_rma_combine(r, 1, 99, &total) != QUIVER_ERR_INVALID_ARGUMENT)
        FAIL("rank %u: an unknown combining operation was not refused", rank);

    CHECK(quiver_rma_barrier(r));
    quiver_rma_counters c;
    CHECK(quiver_rma_stats(r, &c));
    CHECK(quiver_rma_free(r, &w));
    if (w != NULL) FAIL("rank %u: the freed window's handle was not cleared", rank);
    CHECK(quiver_rma_close(&r));
    printf("rma: rank %u: %u rounds, %llu puts, %llu gets, %llu atomics, every byte verified\n",
           rank, rounds, (unsigned long long)c.puts, (unsigned long long)c.gets,
           (unsigned long long)c.atomics);
    free(out);
    free(back);
    CHECK(quiver_job_free(&job));
    return 0;
}
