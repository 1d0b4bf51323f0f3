/*
 * ports: GAMMA's ports from C. Every rank binds port 0 to port 0 of the next rank and a
 * receive buffer with a handler that checks each message in place, counts it and
 * signals the port; port 1 to every other rank's port 1 (a broadcast) with a handler
 * that checks the root; an error handler on port 2, which has no buffer, must hear of
 * the message each rank sends it. A token goes round the ring LAPS times; then every
 * rank broadcasts once; every byte is checked.
 *
 *   cc ports.c -o ports $(pkg-config --cflags --libs quiver)
 *   quiver run -n 4 -- ./ports [LAPS]
 */
#include <quiver.h>
#include <stdatomic.h>
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
        fprintf(stderr, "ports: " __VA_ARGS__);                                           \
        fputc('\n', stderr);                                                              \
        return 1;                                                                         \
    } while (0)

/* What the handlers count: atomic, since with QUIVER_RELIABILITY=offload the handlers of
   network messages run on the engine's thread. */
struct state {
    uint32_t rank, size;
    quiver_ports *p;                 /* for the handler that must not call back in */
    _Atomic uint32_t ring_seen;      /* ring messages handled */
    _Atomic uint32_t bad;            /* messages that were not what they should be */
    _Atomic uint32_t bcast_from;     /* bit r: rank r's broadcast arrived */
    _Atomic uint32_t errors_seen;    /* port errors of port 2 */
};

/* Port 0: the token, 8 bytes: the lap and the rank that sent it. */
static void on_ring(quiver_delivery *d, void *ctx) {
    struct state *s = ctx;
    uint32_t rank;
    size_t len;
    const void *data;
    if (quiver_delivery_info(d, NULL, &rank, NULL, &len, &data) != QUIVER_OK || len != 8) {
        s->bad++;
        return;
    }
    uint32_t word[2];
    memcpy(word, data, 8);
    if (word[1] != rank || rank != (s->rank + s->size - 1) % s->size) s->bad++;
    /* A handler may not call its ports back (only quiver_delivery_*): refused, not a
       deadlock or a crash. */
    if (s->ring_seen == 0 && quiver_ports_signal(s->p, 0) == QUIVER_OK) s->bad++;
    s->ring_seen++;
    quiver_delivery_signal(d);
}

/* Port 1: a broadcast of 4 bytes, the root's rank; the delivery names the root. */
static void on_bcast(quiver_delivery *d, void *ctx) {
    struct state *s = ctx;
    uint32_t rank, root;
    size_t len;
    const void *data;
    if (quiver_delivery_info(d, NULL, &rank, NULL, &len, &data) != QUIVER_OK || len != 4) {
        s->bad++;
        return;
    }
    memcpy(&root, data, 4);
    if (root != rank || rank == s->rank) s->bad++;
    s->bcast_from |= 1u << rank;
    quiver_delivery_signal(d);
}

static void on_port2_error(const quiver_port_error *e, void *ctx) {
    struct state *s = ctx;
    if (e->kind != QUIVER_PORT_NO_BUFFER || e->port != 2 || e->len != 3) s->bad++;
    s->errors_seen++;
}

int main(int argc, char **argv) {
    uint32_t laps = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 10;
    quiver_job *job = NULL;
    quiver_ports *p = NULL;
    struct state s = {0};
    CHECK(quiver_job_from_env(&job));
    CHECK(quiver_job_rank(job, &s.rank));
    CHECK(quiver_job_size(job, &s.size));
    if (s.size < 2 || s.size > 32) FAIL("run with 2 to 32 ranks");
    CHECK(quiver_ports_open(job, 5, &p));
    s.p = p;
    uint32_t next = (s.rank + 1) % s.size, prev = (s.rank + s.size - 1) % s.size;
    CHECK(quiver_ports_bind_to(p, 0, next, 0));
    CHECK(quiver_ports_bind_buffer(p, 0, 64));
    CHECK(quiver_ports_bind_handler(p, 0, on_ring, &s));
    CHECK(quiver_ports_bind_all(p, 1, 1));
    CHECK(quiver_ports_bind_buffer(p, 1, 4));
    CHECK(quiver_ports_bind_handler(p, 1, on_bcast, &s));
    CHECK(quiver_ports_bind_to(p, 3, prev, 2)); /* to the previous rank's port 2 */
    CHECK(quiver_ports_bind_error_handler(p, 2, on_port2_error, &s));
    CHECK(quiver_job_barrier(job)); /* everyone bound before anyone sends */

    for (uint32_t lap = 0; lap < laps; lap++) {
        uint32_t token[2] = {lap, s.rank};
        if (s.rank == 0) {
            CHECK(quiver_ports_send(p, 0, token, 8));
            CHECK(quiver_ports_wait(p, 0, 1));
        } else {
            CHECK(quiver_ports_wait(p, 0, 1));
            CHECK(quiver_ports_send(p, 0, token, 8));
        }
    }
    uint32_t me = s.rank;
    CHECK(quiver_ports_send(p, 1, &me, 4));       /* to everyone */
    CHECK(quiver_ports_send(p, 3, "abc", 3));     /* to a port with no buffer */
    CHECK(quiver_ports_wait(p, 1, s.size - 1));
    while (s.errors_seen == 0) CHECK(quiver_ports_progress(p));

    uint8_t last[8];
    size_t len = 0;
    uint32_t from = 0;
    CHECK(quiver_ports_read(p, 0, last, sizeof last, &len, &from));
    if (len != 8 || from != prev) FAIL("rank %u: read %zu bytes from rank %u", s.rank, len, from);
    quiver_port_counters c;
    CHECK(quiver_ports_stats(p, &c));
    uint32_t want = ((s.size == 32) ? 0xffffffffu : ((1u << s.size) - 1)) & ~(1u << s.rank);
    if (s.bad || s.ring_seen != laps || s.bcast_from != want || c.errors != 1)
        FAIL("rank %u: %u bad, %u ring messages of %u, broadcasts %#x of %#x, %llu errors",
             s.rank, (unsigned)s.bad, (unsigned)s.ring_seen, laps, (unsigned)s.bcast_from, want,
             (unsigned long long)c.errors);
    /* Leave together, forwarding meanwhile: another rank may still need this one to
       forward its broadcast. */
    CHECK(quiver_ports_barrier(p, job));
    CHECK(quiver_ports_close(&p));
    printf("ports: rank %u: %u laps, %u broadcasts, 1 port error, every byte verified\n",
           s.rank, laps, s.size - 1);
    CHECK(quiver_job_free(&job));
    return 0;
}
