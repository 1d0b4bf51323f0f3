/*
 * ring: a token goes round the ring of ranks LAPS times over Directed Point endpoints.
 * Each rank reads the token (a view into its endpoint's buffer pool, no copy), checks
 * it, adds itself, writes it on to the next rank and only then releases the view.
 *
 *   cc ring.c -o ring $(pkg-config --cflags --libs quiver)
 *   quiver run -n 4 -- ./ring [LAPS]
 *   QUIVER_TRANSPORT=udp quiver run -n 4 -- ./ring [LAPS]     (over UDP)
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
        fprintf(stderr, "ring: " __VA_ARGS__);                                            \
        fputc('\n', stderr);                                                              \
        return 1;                                                                         \
    } while (0)

/* The token: a header, then `hops` bytes, each the rank that added it. */
struct token {
    uint32_t lap;
    uint32_t hops;
};

int main(int argc, char **argv) {
    uint32_t laps = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 10;
    if (laps == 0 || laps > 1000)
        FAIL("LAPS must be within 1..1000");
    quiver_job *job = NULL;
    CHECK(quiver_job_from_env(&job));
    uint32_t rank, size;
    CHECK(quiver_job_rank(job, &rank));
    CHECK(quiver_job_size(job, &size));
    if (size < 2)
        FAIL("needs 2 ranks or more (quiver run -n 2 -- ./ring)");

    quiver_endpoint *ep = NULL;
    CHECK(quiver_endpoint_open(job, 1, &ep));
    uint32_t next = (rank + 1) % size, prev = (rank + size - 1) % size;
    CHECK(quiver_endpoint_target_rank(ep, next)); /* waits for `next` to open DPID 1 */

    uint32_t transport;
    CHECK(quiver_endpoint_transport_to(ep, next, &transport));
    const char *over = transport == QUIVER_TRANSPORT_SHM   ? "shm"
                       : transport == QUIVER_TRANSPORT_UDP ? "udp"
                                                           : "eth";

    size_t cap = sizeof(struct token) + (size_t)laps * size + 1;
    unsigned char *out = malloc(cap);
    if (out == NULL)
        FAIL("out of memory");
    if (rank == 0) { /* the first hop of the first lap */
        struct token t = {0, 1};
        memcpy(out, &t, sizeof t);
        out[sizeof t] = 0;
        CHECK(quiver_endpoint_write(ep, out, sizeof t + 1));
    }
    for (uint32_t lap = 0; lap < laps; lap++) {
        quiver_message msg;
        CHECK(quiver_endpoint_read(ep, &msg));
        struct token t;
        if (msg.len < sizeof t)
            FAIL("rank %u: a token of %zu bytes", rank, msg.len);
        memcpy(&t, msg.data, sizeof t);
        const unsigned char *trail = (const unsigned char *)msg.data + sizeof t;
        if (msg.source_rank != prev || msg.source_dpid != 1)
            FAIL("rank %u: token from rank %u DPID %u, not %u", rank, msg.source_rank,
                 (unsigned)msg.source_dpid, prev);
        if (msg.len != sizeof t + t.hops)
            FAIL("rank %u: token of %zu bytes claims %u hops", rank, msg.len, t.hops);
        for (uint32_t h = 0; h < t.hops; h++)
            if (trail[h] != (unsigned char)(h % size))
                FAIL("rank %u: hop %u was made by %u, not %u", rank, h, trail[h], h % size);
        /* Rank 0 sees the token at the end of each lap, the others on its way. */
        uint32_t expected = rank == 0 ? (t.lap + 1) * size : t.lap * size + rank;
        if (t.hops != expected)
            FAIL("rank %u: lap %u arrived after %u hops, not %u", rank, t.lap, t.hops, expected);
        /* Rank 0 starts the next lap; the last lap ends with it. */
        if (rank == 0)
            t.lap++;
        if (rank != 0 || t.lap < laps) {
            memcpy(out, &t, sizeof t);
            memcpy(out + sizeof t, trail, t.hops);
            out[sizeof t + t.hops] = (unsigned char)(rank % 256);
            t.hops++;
            memcpy(out, &t, sizeof t);
            CHECK(quiver_endpoint_write(ep, out, sizeof t + t.hops));
        }
        /* The view stays valid until here: now its token goes back to the pool. */
        size_t released = 0;
        CHECK(quiver_endpoint_release(ep, 1, &released));
        if (released != 1)
            FAIL("rank %u: released %zu messages, not 1", rank, released);
        if (rank == 0 && lap + 1 == laps) {
            printf("ring: %u ranks, %u laps over %s, the token came back after %u hops, "
                   "every hop verified\n",
                   size, laps, over, t.hops);
            fflush(stdout);
        }
    }
    quiver_endpoint_counters st;
    CHECK(quiver_endpoint_stats(ep, &st));
    /* Every rank read `laps` tokens and wrote `laps` (rank 0: the first hop and one
     * start of each later lap). */
    if (st.msgs_received != laps || st.msgs_sent != laps)
        FAIL("rank %u: stats say %llu read, %llu written; expected %u of each", rank,
             (unsigned long long)st.msgs_received, (unsigned long long)st.msgs_sent, laps);
    size_t held;
    CHECK(quiver_endpoint_held(ep, &held));
    if (held != 0)
        FAIL("rank %u: %zu messages still held", rank, held);
    free(out);
    /* Everyone has read its last token before anyone closes its endpoint; meanwhile the
     * endpoint goes on acknowledging what it received (over UDP its peers wait for that). */
    const quiver_endpoint *progressing[1] = {ep};
    CHECK(quiver_job_barrier_progressing(job, progressing, 1));
    CHECK(quiver_endpoint_close(&ep));
    CHECK(quiver_job_free(&job));
    return 0;
}
