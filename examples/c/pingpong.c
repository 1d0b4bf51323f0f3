/*
 * pingpong: ranks 0 and 1 bounce tagged messages of growing sizes (Push-Pull underneath:
 * small ones pushed whole, large ones pulled with a single copy on one node), check
 * every byte and report the round-trip time; then both exchange a large message at
 * once with non-blocking operations (two blocking sends of that size would wait for
 * each other for ever), and rank 0 sends one from the job's shared pool, which rank 1
 * reads in place. Other ranks only take part in the barriers.
 *
 *   cc pingpong.c -o pingpong $(pkg-config --cflags --libs quiver)
 *   quiver run -n 2 -- ./pingpong [ITERATIONS]
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <quiver.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
        fprintf(stderr, "pingpong: " __VA_ARGS__);                                        \
        fputc('\n', stderr);                                                              \
        return 1;                                                                         \
    } while (0)

static const size_t SIZES[] = {0, 8, 1024, 64 << 10, 1 << 20};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])
#define LARGEST (1 << 20)
#define TAG 7

/* Byte i of message `seq` from rank `from`. */
static unsigned char pattern(uint32_t from, uint32_t seq, size_t i) {
    return (unsigned char)(from * 131 + seq * 31 + i * 7);
}

static void fill(unsigned char *buf, size_t len, uint32_t from, uint32_t seq) {
    for (size_t i = 0; i < len; i++)
        buf[i] = pattern(from, seq, i);
}

/* The first byte of `buf` that is not what rank `from` sent as message `seq`, or len. */
static size_t first_wrong(const unsigned char *buf, size_t len, uint32_t from, uint32_t seq) {
    for (size_t i = 0; i < len; i++)
        if (buf[i] != pattern(from, seq, i))
            return i;
    return len;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    uint32_t iters = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 100;
    if (iters == 0)
        FAIL("ITERATIONS must be at least 1");
    quiver_job *job = NULL;
    CHECK(quiver_job_from_env(&job));
    uint32_t rank, size;
    CHECK(quiver_job_rank(job, &rank));
    CHECK(quiver_job_size(job, &size));
    if (size < 2)
        FAIL("needs 2 ranks (quiver run -n 2 -- ./pingpong)");
    quiver_tagged *t = NULL;
    CHECK(quiver_tagged_open(job, 2, &t)); /* every rank opens the same DPID */
    unsigned char *out = malloc(LARGEST), *in = malloc(LARGEST);
    if (out == NULL || in == NULL)
        FAIL("out of memory");

    if (rank < 2) {
        uint32_t peer = 1 - rank;
        for (size_t s = 0; s < NSIZES; s++) {
            size_t len = SIZES[s];
            double start = now_us();
            for (uint32_t i = 0; i < iters; i++) {
                uint32_t seq = (uint32_t)s * iters + i;
                quiver_status st;
                if (rank == 0) {
                    fill(out, len, rank, seq);
                    CHECK(quiver_tagged_send(t, peer, TAG, out, len));
                    CHECK(quiver_tagged_recv(t, in, LARGEST, peer, TAG, &st));
                } else {
                    CHECK(quiver_tagged_recv(t, in, LARGEST, QUIVER_ANY_SOURCE, QUIVER_ANY_TAG,
                                             &st));
                    fill(out, len, rank, seq);
                    CHECK(quiver_tagged_send(t, peer, TAG, out, len));
                }
                if (st.peer != peer || st.tag != TAG || st.len != len || st.error != QUIVER_OK)
                    FAIL("rank %u: status {peer %u, tag %u, len %llu, error %d} for %zu bytes",
                         rank, st.peer, st.tag, (unsigned long long)st.len, (int)st.error, len);
                size_t bad = first_wrong(in, len, peer, seq);
                if (bad != len)
                    FAIL("rank %u: byte %zu of %zu-byte message %u is wrong", rank, bad, len,
                         seq);
            }
            double rtt = (now_us() - start) / iters;
            if (rank == 0) {
                printf("pingpong: %8zu bytes  %10.2f us round trip  (%u iterations, verified)\n",
                       len, rtt, iters);
                fflush(stdout);
            }
        }

        /* Both at once: post the receive, start the send, wait for both. */
        quiver_request reqs[2];
        quiver_status sts[2];
        uint32_t seq = 1000000 + rank;
        fill(out, LARGEST, rank, seq);
        memset(in, 0, LARGEST);
        CHECK(quiver_tagged_irecv(t, in, LARGEST, peer, TAG + 1, &reqs[0]));
        CHECK(quiver_tagged_isend(t, peer, TAG + 1, out, LARGEST, &reqs[1]));
        CHECK(quiver_tagged_waitall(t, reqs, 2, sts));
        if (reqs[0] != QUIVER_REQUEST_NULL || reqs[1] != QUIVER_REQUEST_NULL)
            FAIL("rank %u: waitall left a request", rank);
        if (sts[0].peer != peer || sts[0].len != LARGEST || sts[1].peer != peer)
            FAIL("rank %u: exchange statuses are wrong", rank);
        size_t bad = first_wrong(in, LARGEST, peer, 1000000 + peer);
        if (bad != LARGEST)
            FAIL("rank %u: byte %d of the exchanged message is wrong", rank, (int)bad);
        if (rank == 0) {
            printf("pingpong: exchanged %d bytes both ways at once with isend/irecv, verified\n",
                   LARGEST);
            fflush(stdout);
        }

        /* From the job's shared pool: a receiver on the same node reads it in place. */
        if (rank == 0) {
            void *shared = NULL;
            CHECK(quiver_tagged_alloc_shared(t, LARGEST, &shared));
            fill(shared, LARGEST, rank, 2000000);
            CHECK(quiver_tagged_send(t, peer, TAG + 2, shared, LARGEST));
            CHECK(quiver_tagged_free_shared(t, shared));
        } else {
            quiver_status st;
            CHECK(quiver_tagged_recv(t, in, LARGEST, peer, TAG + 2, &st));
            size_t wrong = first_wrong(in, LARGEST, peer, 2000000);
            if (st.len != LARGEST || wrong != LARGEST)
                FAIL("rank 1: the message from the shared pool is wrong at byte %zu", wrong);
            quiver_tagged_counters c;
            CHECK(quiver_tagged_stats(t, &c));
            uint32_t nid0, nid1;
            CHECK(quiver_job_nid_of(job, 0, &nid0));
            CHECK(quiver_job_nid_of(job, 1, &nid1));
            if (nid0 == nid1 && c.pulled_shared == 0)
                FAIL("rank 1: the message from the shared pool was not read in place");
        }
        CHECK(quiver_job_barrier(job));
        if (rank == 0) {
            printf("pingpong: sent %d bytes from the shared pool, verified\n", LARGEST);
            fflush(stdout);
        }
    }
    quiver_tagged_counters ts;
    CHECK(quiver_tagged_stats(t, &ts));
    /* The receiver of the 1 MiB messages pulled them (same node: one copy). */
    if (rank < 2 && ts.pulled_direct + ts.pulled_shared + ts.pulled_by_request == 0)
        FAIL("rank %u: nothing was pulled", rank);
    free(out);
    free(in);
    CHECK(quiver_job_barrier(job));
    CHECK(quiver_tagged_close(&t));
    CHECK(quiver_job_free(&job));
    return 0;
}
