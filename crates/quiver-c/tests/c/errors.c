/*
 * errors: every error path of the C library returns its code (tests/c_programs.rs).
 *
 *   ./errors outside               outside a job: NULL handles and outputs, bad
 *                                  arguments, codes and their strings, QUIVER_ERR_ENV,
 *                                  QUIVER_ERR_LAUNCHER (a PMI server answering garbage)
 *   quiver run -n 2 -- ./errors    in a job of two ranks (with QUIVER_CONNECT_TIMEOUT=2
 *                                  and QUIVER_MAX_MESSAGE=65536): bad ranks, DPIDs in
 *                                  use, no target, too large, timeouts, missing or
 *                                  closed endpoints, truncation, cancelled and unknown
 *                                  requests, the wrong thread, double closes, the
 *                                  error handler
 *
 * Prints one line per failed check and, at the end, "errors: N checks, M failed";
 * exits 1 when a check failed.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <quiver.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int checks, failures;

static void failed(int line, const char *what, const char *detail) {
    failures++;
    fprintf(stderr, "errors.c:%d: %s: %s\n", line, what, detail);
}

/* `call` returns `code`. */
#define EXPECT(code, call)                                                                \
    do {                                                                                  \
        checks++;                                                                         \
        quiver_error got_ = (call);                                                       \
        if (got_ != (code)) {                                                             \
            char d_[512];                                                                 \
            snprintf(d_, sizeof d_, "returned %d (%s: %s), expected %d (%s)", (int)got_,  \
                     quiver_strerror(got_), quiver_last_error_message(), (int)(code),     \
                     quiver_strerror(code));                                              \
            failed(__LINE__, #call, d_);                                                  \
        }                                                                                 \
    } while (0)

/* `cond` holds. */
#define ASSERT(cond)                                                                      \
    do {                                                                                  \
        checks++;                                                                         \
        if (!(cond))                                                                      \
            failed(__LINE__, #cond, "does not hold");                                     \
    } while (0)

/* The last error message contains `text`. */
#define LAST_SAYS(text)                                                                   \
    do {                                                                                  \
        checks++;                                                                         \
        if (strstr(quiver_last_error_message(), (text)) == NULL)                          \
            failed(__LINE__, "last error message", quiver_last_error_message());          \
    } while (0)

/* Stops at a failure that the later checks depend on. */
#define MUST(call)                                                                        \
    do {                                                                                  \
        quiver_error e_ = (call);                                                         \
        if (e_ != QUIVER_OK) {                                                            \
            fprintf(stderr, "errors.c:%d: %s: %s: %s\n", __LINE__, #call,                 \
                    quiver_strerror(e_), quiver_last_error_message());                    \
            exit(2);                                                                      \
        }                                                                                 \
    } while (0)

/* Calls with NULL handles and NULL outputs: QUIVER_ERR_NULL, never a crash. */
static void null_handles(void) {
    uint32_t u32;
    uint16_t u16;
    size_t sz;
    bool b;
    int fd;
    int64_t i64;
    const char *name;
    quiver_message msg;
    quiver_status st;
    quiver_request req = QUIVER_REQUEST_NULL;
    quiver_endpoint_counters ec;
    quiver_tagged_counters tc;
    char buf[8];

    EXPECT(QUIVER_ERR_NULL, quiver_job_from_env(NULL));
    LAST_SAYS("job is NULL");
    EXPECT(QUIVER_ERR_NULL, quiver_job_free(NULL));
    quiver_job *nojob = NULL;
    EXPECT(QUIVER_ERR_NULL, quiver_job_free(&nojob));
    EXPECT(QUIVER_ERR_NULL, quiver_job_rank(NULL, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_job_size(NULL, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_job_id(NULL, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_job_nid(NULL, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_job_node_count(NULL, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_job_launcher(NULL, &name));
    EXPECT(QUIVER_ERR_NULL, quiver_job_nid_of(NULL, 0, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_job_barrier(NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_job_barrier_progressing(NULL, NULL, 0));
    EXPECT(QUIVER_ERR_NULL, quiver_job_barrier_live(NULL, NULL, 0, NULL, 0, &sz));
    EXPECT(QUIVER_ERR_NULL, quiver_job_declare_failed(NULL, 0));
    EXPECT(QUIVER_ERR_NULL, quiver_job_failed_ranks(NULL, NULL, 0, &sz));
    char invitation[QUIVER_INVITATION_MAX];
    quiver_job *joint = NULL;
    EXPECT(QUIVER_ERR_NULL, quiver_job_invite(NULL, invitation, sizeof invitation));
    EXPECT(QUIVER_ERR_NULL, quiver_job_join(NULL, "x", &joint));
    EXPECT(QUIVER_ERR_NULL, quiver_job_joint_rank_of(NULL, 1, 0, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_job_joint_member(NULL, 0, &u32, &u32));

    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_open(NULL, 1, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_close(NULL));
    quiver_endpoint *noep = NULL;
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_close(&noep));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_dpid(NULL, &u16));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_rank(NULL, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_target(NULL, 0, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_target_rank(NULL, 0));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_target_endpoint(NULL, 0, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_transport_to(NULL, 0, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_write(NULL, buf, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_write_parts(NULL, buf, 1, buf, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_try_write(NULL, buf, 1, &b));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_read(NULL, &msg));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_read_timeout(NULL, 1, &msg));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_try_read(NULL, &msg, &b));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_release(NULL, 1, &sz));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_held(NULL, &sz));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_fd(NULL, &fd));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_poll_timeout(NULL, &i64));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_progress(NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_flush(NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_flush_timeout(NULL, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_stats(NULL, &ec));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_failed_ranks(NULL, NULL, 0, &sz));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_set_error_handler(NULL, NULL, NULL));

    EXPECT(QUIVER_ERR_NULL, quiver_tagged_open(NULL, 2, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_close(NULL));
    quiver_tagged *not = NULL;
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_close(&not));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_send(NULL, 0, 1, buf, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_recv(NULL, buf, 1, 0, 1, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_iprobe(NULL, 0, 1, &b, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_probe(NULL, 0, 1, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_isend(NULL, 0, 1, buf, 1, &req));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_ssend(NULL, 0, 1, buf, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_issend(NULL, 0, 1, buf, 1, &req));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_irecv(NULL, buf, 1, 0, 1, &req));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_test(NULL, &req, &b, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_wait(NULL, &req, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_wait_timeout(NULL, &req, 1, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_waitany(NULL, &req, 1, &sz, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_waitall(NULL, &req, 1, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_cancel(NULL, req, &b));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_abandon(NULL, &req));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_progress(NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_set_push(NULL, QUIVER_PUSH_ALL));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_set_btp(NULL, 1, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_push(NULL, &u32, &sz, &sz));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_stats(NULL, &tc));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_endpoint_stats(NULL, &ec));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_fd(NULL, &fd));
    void *shared;
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_alloc_shared(NULL, 64, &shared));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_free_shared(NULL, buf));

    /* One-sided operations. */
    quiver_rma *norma = NULL;
    quiver_window *nowin = NULL;
    quiver_rma_counters rc;
    quiver_strided layout = {0, 8, 8, 1};
    uint64_t u64, offs[1] = {0};
    uint8_t *base;
    const uint8_t *src = (const uint8_t *)buf;
    uint8_t *dst = (uint8_t *)buf;
    EXPECT(QUIVER_ERR_NULL, quiver_rma_open(NULL, 1, &norma));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_close(NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_close(&norma));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_set_wait(NULL, 0));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_allocate(NULL, 8, &nowin));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_free(NULL, &nowin));
    EXPECT(QUIVER_ERR_NULL, quiver_window_info(NULL, &u32, &sz, &base));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_put(NULL, 0, NULL, 0, src, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_put_notify(NULL, 0, NULL, 0, NULL, 0, 0));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_wait_counter(NULL, NULL, 0, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_get(NULL, 0, NULL, 0, dst, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_put_strided(NULL, 0, NULL, &layout, src, 8, 8));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_get_strided(NULL, 0, NULL, &layout, dst, 8, 8));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_put_indexed(NULL, 0, NULL, offs, src, 8, offs, 1, 8));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_get_indexed(NULL, 0, NULL, offs, dst, 8, offs, 1, 8));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_fetch_add(NULL, 0, NULL, 0, 1, &u64));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_compare_swap(NULL, 0, NULL, 0, 0, 1, &u64));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_swap(NULL, 0, NULL, 0, 1, &u64));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_flush(NULL, 0));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_flush_all(NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_barrier(NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_combine(NULL, 1, QUIVER_COMBINE_SUM, &u64));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_progress(NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_stats(NULL, &rc));
}

/* Every code has its own string; unknown codes one too; the version agrees. */
static void codes(void) {
    static const quiver_error all[] = {
        QUIVER_OK,
        QUIVER_ERR_NULL,
        QUIVER_ERR_INVALID_ARGUMENT,
        QUIVER_ERR_PANIC,
        QUIVER_ERR_WRONG_THREAD,
        QUIVER_ERR_ENV,
        QUIVER_ERR_CONFIG,
        QUIVER_ERR_RENDEZVOUS,
        QUIVER_ERR_MESSAGE_TOO_LARGE,
        QUIVER_ERR_NO_TARGET,
        QUIVER_ERR_NO_SUCH_RANK,
        QUIVER_ERR_NO_SUCH_ENDPOINT,
        QUIVER_ERR_DPID_IN_USE,
        QUIVER_ERR_PEER_CLOSED,
        QUIVER_ERR_PEER_FAILED,
        QUIVER_ERR_TOO_MANY_SENDERS,
        QUIVER_ERR_SEGMENT,
        QUIVER_ERR_LOST,
        QUIVER_ERR_CHANNEL_FAILED,
        QUIVER_ERR_TIMEOUT,
        QUIVER_ERR_TRUNCATED,
        QUIVER_ERR_CANCELLED,
        QUIVER_ERR_PROTOCOL,
        QUIVER_ERR_CLOSED,
        QUIVER_ERR_IO,
        QUIVER_ERR_OTHER,
        QUIVER_ERR_LAUNCHER,
        QUIVER_ERR_PORT,
    };
    size_t n = sizeof all / sizeof all[0];
    const char *unknown = quiver_strerror(-1);
    ASSERT(unknown != NULL && strcmp(unknown, "unknown quiver error code") == 0);
    ASSERT(strcmp(quiver_strerror(9999), unknown) == 0);
    for (size_t i = 0; i < n; i++) {
        const char *s = quiver_strerror(all[i]);
        ASSERT(s != NULL && s[0] != '\0' && strcmp(s, unknown) != 0);
        for (size_t j = 0; j < i; j++)
            ASSERT(strcmp(s, quiver_strerror(all[j])) != 0);
    }
    ASSERT(QUIVER_OK == 0);
    ASSERT(quiver_version() == QUIVER_VERSION);
    ASSERT(QUIVER_VERSION ==
           QUIVER_VERSION_MAJOR * 10000 + QUIVER_VERSION_MINOR * 100 + QUIVER_VERSION_PATCH);
}

/* Outside a job: joining fails with QUIVER_ERR_ENV and says what to do; a launcher's
 * PMI server that answers garbage gives QUIVER_ERR_LAUNCHER. */
static void outside(void) {
    quiver_job *job = NULL;
    EXPECT(QUIVER_ERR_ENV, quiver_job_from_env(&job));
    ASSERT(job == NULL);
    ASSERT(strlen(quiver_last_error_message()) > 10);

    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) {
        failed(__LINE__, "socketpair", "failed");
        return;
    }
    static const char garbage[] = "this is not PMI\n";
    ASSERT(write(pair[1], garbage, sizeof garbage - 1) == (ssize_t)(sizeof garbage - 1));
    char fd[16];
    snprintf(fd, sizeof fd, "%d", pair[0]);
    setenv("PMI_FD", fd, 1);
    setenv("PMI_RANK", "0", 1);
    setenv("PMI_SIZE", "2", 1);
    EXPECT(QUIVER_ERR_LAUNCHER, quiver_job_from_env(&job));
    ASSERT(job == NULL);
    LAST_SAYS("PMI_FD");
    unsetenv("PMI_FD");
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
    close(pair[0]);
    close(pair[1]);
}

/* The error handler: sees each error an endpoint delivers, with its code. */
struct seen {
    int calls;
    quiver_error last;
    char message[256];
};

static void on_error(quiver_error code, const char *message, void *user) {
    struct seen *s = user;
    s->calls++;
    s->last = code;
    snprintf(s->message, sizeof s->message, "%s", message);
}

/* What another thread gets from a tagged endpoint it did not open. */
struct intruder {
    quiver_tagged *t;
    quiver_error progress, close, send;
};

static void *intrude(void *arg) {
    struct intruder *in = arg;
    char byte = 1;
    in->progress = quiver_tagged_progress(in->t);
    in->send = quiver_tagged_send(in->t, 0, 1, &byte, 1);
    in->close = quiver_tagged_close(&in->t);
    return NULL;
}

struct rma_intruder {
    quiver_rma *r;
    quiver_window *w;
    quiver_error progress, info, close;
};

static void *rma_intrude(void *arg) {
    struct rma_intruder *in = arg;
    size_t len;
    in->progress = quiver_rma_progress(in->r);
    in->info = quiver_window_info(in->w, NULL, &len, NULL);
    in->close = quiver_rma_close(&in->r);
    return NULL;
}

static void in_a_job(void) {
    quiver_job *job = NULL;
    MUST(quiver_job_from_env(&job));
    uint32_t rank, size, u32;
    MUST(quiver_job_rank(job, &rank));
    MUST(quiver_job_size(job, &size));
    if (size != 2) {
        fprintf(stderr, "errors: run with 2 ranks\n");
        exit(2);
    }
    uint32_t peer = 1 - rank;
    size_t sz;
    bool b;
    char buf[256];
    memset(buf, 'x', sizeof buf);

    /* The job: NULL outputs, ranks out of range. */
    EXPECT(QUIVER_ERR_NULL, quiver_job_rank(job, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_job_launcher(job, NULL));
    EXPECT(QUIVER_ERR_NO_SUCH_RANK, quiver_job_nid_of(job, size, &u32));
    LAST_SAYS("rank 2 does not exist");
    EXPECT(QUIVER_ERR_NO_SUCH_RANK, quiver_job_declare_failed(job, size));
    EXPECT(QUIVER_ERR_NULL, quiver_job_failed_ranks(job, NULL, 4, &sz));
    EXPECT(QUIVER_OK, quiver_job_failed_ranks(job, NULL, 0, &sz));
    ASSERT(sz == 0);
    const quiver_endpoint *none[1] = {NULL};
    EXPECT(QUIVER_ERR_NULL, quiver_job_barrier_progressing(job, NULL, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_job_barrier_progressing(job, none, 1));
    LAST_SAYS("endpoints[0] is NULL");

    /* Joint jobs: a short buffer, text that is no invitation, a job that is not joint,
     * and an invitation nobody accepts (QUIVER_CONNECT_TIMEOUT is 2 s). */
    char invitation[QUIVER_INVITATION_MAX];
    quiver_job *joint = NULL;
    EXPECT(QUIVER_ERR_NULL, quiver_job_invite(job, NULL, sizeof invitation));
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_job_invite(job, invitation, 100));
    LAST_SAYS("QUIVER_INVITATION_MAX");
    EXPECT(QUIVER_ERR_NULL, quiver_job_join(job, NULL, &joint));
    EXPECT(QUIVER_ERR_CONFIG, quiver_job_join(job, "hello", &joint));
    LAST_SAYS("not a quiver invitation");
    EXPECT(QUIVER_ERR_CONFIG, quiver_job_joint_rank_of(job, 1, 0, &u32));
    LAST_SAYS("is not a joint job");
    EXPECT(QUIVER_ERR_CONFIG, quiver_job_joint_member(job, 0, &u32, &u32));
    EXPECT(QUIVER_OK, quiver_job_invite(job, invitation, sizeof invitation));
    ASSERT(strncmp(invitation, "quiver-invitation-v1:", 21) == 0);
    EXPECT(QUIVER_ERR_RENDEZVOUS, quiver_job_join(job, invitation, &joint));
    LAST_SAYS("a job to accept the invitation");
    ASSERT(joint == NULL);
    /* The host keeps its invitation when nobody came: it may try again. */
    EXPECT(QUIVER_ERR_RENDEZVOUS, quiver_job_join(job, invitation, &joint));
    LAST_SAYS("a job to accept the invitation");

    /* An endpoint: its DPID taken twice, writes without a target, bad ranks. */
    quiver_endpoint *ep = NULL, *again = NULL;
    MUST(quiver_endpoint_open(job, 1, &ep));
    EXPECT(QUIVER_ERR_DPID_IN_USE, quiver_endpoint_open(job, 1, &again));
    ASSERT(again == NULL);
    struct seen seen = {0, QUIVER_OK, ""};
    EXPECT(QUIVER_OK, quiver_endpoint_set_error_handler(ep, on_error, &seen));
    EXPECT(QUIVER_ERR_NO_TARGET, quiver_endpoint_write(ep, buf, 8));
    ASSERT(seen.calls == 1 && seen.last == QUIVER_ERR_NO_TARGET);
    ASSERT(strstr(seen.message, "no target") != NULL);
    EXPECT(QUIVER_ERR_NO_TARGET, quiver_endpoint_try_write(ep, buf, 8, &b));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_try_write(ep, buf, 8, NULL));
    EXPECT(QUIVER_OK, quiver_endpoint_set_error_handler(ep, NULL, NULL));
    EXPECT(QUIVER_ERR_NO_TARGET, quiver_endpoint_write(ep, buf, 8));
    ASSERT(seen.calls == 2); /* the write and the try_write reached it, no call since */
    EXPECT(QUIVER_ERR_NO_SUCH_RANK, quiver_endpoint_target_rank(ep, size));
    EXPECT(QUIVER_ERR_NO_SUCH_RANK, quiver_endpoint_target_rank(ep, QUIVER_ANY_SOURCE));
    EXPECT(QUIVER_ERR_NO_SUCH_RANK, quiver_endpoint_transport_to(ep, size, &u32));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_transport_to(ep, peer, NULL));

    /* Nothing to read: a timeout, and an empty try. */
    quiver_message msg = {NULL, 0, 0, 0};
    EXPECT(QUIVER_ERR_TIMEOUT, quiver_endpoint_read_timeout(ep, 1000, &msg));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_read_timeout(ep, 1000, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_read(ep, NULL));
    EXPECT(QUIVER_OK, quiver_endpoint_try_read(ep, &msg, &b));
    ASSERT(!b);
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_try_read(ep, &msg, NULL));
    EXPECT(QUIVER_OK, quiver_endpoint_release(ep, 3, &sz));
    ASSERT(sz == 0);
    EXPECT(QUIVER_OK, quiver_endpoint_release(ep, 3, NULL));
    int64_t wait_us;
    EXPECT(QUIVER_OK, quiver_endpoint_poll_timeout(ep, &wait_us));
    ASSERT(wait_us >= -1);
    int fd = -1;
    EXPECT(QUIVER_OK, quiver_endpoint_fd(ep, &fd));
    ASSERT(fd >= 0);

    /* Endpoints nobody opens: not found after QUIVER_CONNECT_TIMEOUT (2 s here). */
    EXPECT(QUIVER_ERR_NO_SUCH_ENDPOINT, quiver_endpoint_target_endpoint(ep, peer, 999));
    EXPECT(QUIVER_ERR_NO_SUCH_ENDPOINT, quiver_endpoint_target(ep, 0, 998));

    /* With a target: bad buffers, a message over QUIVER_MAX_MESSAGE (64 KiB here). */
    MUST(quiver_endpoint_target_rank(ep, peer));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_write(ep, NULL, 5));
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_write_parts(ep, buf, 1, NULL, 5));
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_endpoint_write(ep, buf, (size_t)-1));
    size_t big_len = (64 << 10) + 1;
    char *big = calloc(1, big_len);
    EXPECT(QUIVER_ERR_MESSAGE_TOO_LARGE, quiver_endpoint_write(ep, big, big_len));
    LAST_SAYS("exceeds the maximum message size");
    free(big);
    /* An empty message with a NULL pointer is fine, and arrives as an empty view. */
    EXPECT(QUIVER_OK, quiver_endpoint_write(ep, NULL, 0));
    EXPECT(QUIVER_OK, quiver_endpoint_read(ep, &msg));
    ASSERT(msg.len == 0 && msg.data == NULL && msg.source_rank == peer && msg.source_dpid == 1);
    EXPECT(QUIVER_OK, quiver_endpoint_held(ep, &sz));
    ASSERT(sz == 1);
    EXPECT(QUIVER_OK, quiver_endpoint_release(ep, 5, &sz));
    ASSERT(sz == 1);
    /* A receiver that closed its endpoint: rank 1 closes DPID 4, rank 0 writes to it. */
    quiver_endpoint *ep4 = NULL;
    MUST(quiver_endpoint_open(job, 4, &ep4));
    MUST(quiver_endpoint_target_rank(ep4, peer));
    MUST(quiver_job_barrier(job));
    if (rank == 1)
        EXPECT(QUIVER_OK, quiver_endpoint_close(&ep4));
    MUST(quiver_job_barrier(job));
    if (rank == 0) {
        EXPECT(QUIVER_ERR_PEER_CLOSED, quiver_endpoint_write(ep4, buf, 8));
        LAST_SAYS("was closed by its owner");
        EXPECT(QUIVER_OK, quiver_endpoint_close(&ep4));
    }
    MUST(quiver_job_barrier(job));
    EXPECT(QUIVER_OK, quiver_endpoint_close(&ep));
    ASSERT(ep == NULL);
    EXPECT(QUIVER_ERR_NULL, quiver_endpoint_close(&ep)); /* closed twice */

    /* Tagged endpoints. */
    quiver_tagged *t = NULL, *t2 = NULL;
    MUST(quiver_tagged_open(job, 2, &t));
    MUST(quiver_tagged_open(job, 3, &t2));
    quiver_request req = QUIVER_REQUEST_NULL, other = QUIVER_REQUEST_NULL;
    quiver_status st;
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_send(t, peer, QUIVER_ANY_TAG, buf, 1));
    LAST_SAYS("QUIVER_ANY_TAG");
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_isend(t, peer, QUIVER_ANY_TAG, buf, 1, &req));
    ASSERT(req == QUIVER_REQUEST_NULL);
    EXPECT(QUIVER_ERR_NO_SUCH_RANK, quiver_tagged_send(t, size, 1, buf, 1));
    EXPECT(QUIVER_ERR_NO_SUCH_RANK, quiver_tagged_isend(t, size, 1, buf, 1, &req));
    EXPECT(QUIVER_ERR_NO_SUCH_RANK, quiver_tagged_ssend(t, size, 1, buf, 1));
    EXPECT(QUIVER_ERR_NO_SUCH_RANK, quiver_tagged_issend(t, size, 1, buf, 1, &req));
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_issend(t, peer, QUIVER_ANY_TAG, buf, 1, &req));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_issend(t, peer, 1, buf, 1, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_ssend(t, peer, 1, NULL, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_send(t, peer, 1, NULL, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_recv(t, NULL, 4, peer, 1, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_irecv(t, buf, 4, peer, 1, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_probe(t, peer, 1, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_iprobe(t, peer, 1, NULL, &st));
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_set_push(t, 99));
    uint32_t mode = 99;
    EXPECT(QUIVER_OK, quiver_tagged_push(t, &mode, NULL, NULL));
    ASSERT(mode == QUIVER_PUSH_PULL);

    /* Shared buffers: none of 0 bytes, no freeing of what was not allocated, or twice. */
    void *shared = NULL;
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_alloc_shared(t, 0, &shared));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_alloc_shared(t, 64, NULL));
    EXPECT(QUIVER_OK, quiver_tagged_alloc_shared(t, 64, &shared));
    ASSERT(shared != NULL && ((unsigned char *)shared)[63] == 0);
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_free_shared(t2, shared));
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_free_shared(t, buf));
    EXPECT(QUIVER_OK, quiver_tagged_free_shared(t, shared));
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_free_shared(t, shared));
    /* One left for the close to free. */
    EXPECT(QUIVER_OK, quiver_tagged_alloc_shared(t2, 4096, &shared));

    /* Truncation: rank 0 sends 100 bytes, rank 1 receives them into 10. */
    if (rank == 0) {
        char msg100[100];
        for (int i = 0; i < 100; i++)
            msg100[i] = (char)i;
        EXPECT(QUIVER_OK, quiver_tagged_send(t, peer, 5, msg100, sizeof msg100));
    } else {
        char small[10];
        memset(&st, 0xff, sizeof st);
        EXPECT(QUIVER_OK, quiver_tagged_probe(t, QUIVER_ANY_SOURCE, 5, &st));
        ASSERT(st.peer == peer && st.tag == 5 && st.len == 100);
        EXPECT(QUIVER_ERR_TRUNCATED, quiver_tagged_recv(t, small, sizeof small, peer, 5, &st));
        ASSERT(st.peer == peer && st.tag == 5 && st.len == 100);
        ASSERT(st.error == QUIVER_ERR_TRUNCATED);
        ASSERT(small[0] == 0 && small[9] == 9);
        LAST_SAYS("truncated");
    }

    /* A receive nothing matches: times out (still pending), tests not done, is
     * cancelled, and its wait says so; the spent request is unknown afterwards. */
    char rbuf[16];
    EXPECT(QUIVER_OK, quiver_tagged_irecv(t, rbuf, sizeof rbuf, peer, 77, &req));
    ASSERT(req != QUIVER_REQUEST_NULL);
    quiver_request kept = req;
    EXPECT(QUIVER_ERR_TIMEOUT, quiver_tagged_wait_timeout(t, &req, 1000, &st));
    ASSERT(req == kept);
    EXPECT(QUIVER_OK, quiver_tagged_test(t, &req, &b, &st));
    ASSERT(!b && req == kept);
    EXPECT(QUIVER_OK, quiver_tagged_cancel(t, req, &b));
    ASSERT(b);
    EXPECT(QUIVER_ERR_CANCELLED, quiver_tagged_wait(t, &req, &st));
    ASSERT(req == QUIVER_REQUEST_NULL && st.error == QUIVER_ERR_CANCELLED);
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_wait(t, &req, &st)); /* NULL request */
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_wait(t, &kept, &st)); /* spent */
    LAST_SAYS("not pending");
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_cancel(t, kept, &b));
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_abandon(t, &kept));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_wait(t, NULL, &st));

    /* Another endpoint's request is refused and stays pending there. */
    EXPECT(QUIVER_OK, quiver_tagged_irecv(t2, rbuf, sizeof rbuf, peer, 78, &other));
    quiver_request foreign = other;
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_wait(t, &other, &st));
    ASSERT(other == foreign);
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_test(t, &other, &b, &st));
    EXPECT(QUIVER_OK, quiver_tagged_test(t2, &other, &b, &st));
    ASSERT(!b && other == foreign);

    /* waitany and waitall: nothing to wait for, twice the same request, unknown ones. */
    quiver_request reqs[3] = {QUIVER_REQUEST_NULL, QUIVER_REQUEST_NULL, QUIVER_REQUEST_NULL};
    quiver_status sts[3];
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_waitany(t, reqs, 3, &sz, &st));
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_waitany(t, reqs, 0, &sz, &st));
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_waitany(t, NULL, 1, &sz, &st));
    EXPECT(QUIVER_OK, quiver_tagged_waitall(t, reqs, 3, sts));
    ASSERT(sts[2].error == QUIVER_OK && sts[2].len == 0);
    reqs[0] = foreign;
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_waitall(t, reqs, 3, sts));
    LAST_SAYS("reqs[0]");
    reqs[1] = foreign;
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_waitany(t2, reqs, 3, &sz, &st));
    LAST_SAYS("appears twice");
    ASSERT(reqs[0] == foreign && reqs[1] == foreign);
    /* Abandoned: the request is gone, the buffer the caller's again. */
    EXPECT(QUIVER_OK, quiver_tagged_abandon(t2, &other));
    ASSERT(other == QUIVER_REQUEST_NULL);
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_tagged_cancel(t2, foreign, &b));

    /* A receive cancelled inside waitall: its status says so, the others' theirs. */
    quiver_request two[2];
    EXPECT(QUIVER_OK, quiver_tagged_irecv(t, rbuf, 8, peer, 80, &two[0]));
    EXPECT(QUIVER_OK, quiver_tagged_isend(t, peer, 81, buf, 4, &two[1]));
    EXPECT(QUIVER_OK, quiver_tagged_cancel(t, two[0], &b));
    ASSERT(b);
    EXPECT(QUIVER_ERR_CANCELLED, quiver_tagged_waitall(t, two, 2, sts));
    ASSERT(sts[0].error == QUIVER_ERR_CANCELLED && sts[1].error == QUIVER_OK);
    ASSERT(sts[1].peer == peer && sts[1].tag == 81 && sts[1].len == 4);
    ASSERT(two[0] == QUIVER_REQUEST_NULL && two[1] == QUIVER_REQUEST_NULL);
    /* The peer's small send arrived (pushed whole): receive it with waitany. */
    quiver_request one[2] = {QUIVER_REQUEST_NULL, QUIVER_REQUEST_NULL};
    EXPECT(QUIVER_OK, quiver_tagged_irecv(t, rbuf, sizeof rbuf, QUIVER_ANY_SOURCE, 81, &one[1]));
    EXPECT(QUIVER_OK, quiver_tagged_waitany(t, one, 2, &sz, &st));
    ASSERT(sz == 1 && one[1] == QUIVER_REQUEST_NULL && st.peer == peer && st.len == 4);
    /* A synchronous send completes only once the peer's receive took it (neither rank
       posts its receive before the barrier), then a blocking one each way in turn. */
    quiver_request sync = QUIVER_REQUEST_NULL;
    EXPECT(QUIVER_OK, quiver_tagged_issend(t, peer, 90, buf, 4, &sync));
    for (int i = 0; i < 1000; i++) {
        EXPECT(QUIVER_OK, quiver_tagged_test(t, &sync, &b, &st));
        ASSERT(!b);
    }
    MUST(quiver_job_barrier(job));
    EXPECT(QUIVER_OK, quiver_tagged_recv(t, rbuf, sizeof rbuf, peer, 90, &st));
    ASSERT(st.len == 4);
    EXPECT(QUIVER_OK, quiver_tagged_wait(t, &sync, &st));
    ASSERT(sync == QUIVER_REQUEST_NULL && st.len == 4);
    for (uint32_t turn = 0; turn < 2; turn++) {
        if (turn == rank) {
            EXPECT(QUIVER_OK, quiver_tagged_ssend(t, peer, 91, buf, 0));
        } else {
            EXPECT(QUIVER_OK, quiver_tagged_recv(t, rbuf, sizeof rbuf, peer, 91, &st));
            ASSERT(st.len == 0);
        }
    }

    /* Another thread may not use the tagged endpoint, not even to close it. */
    struct intruder in = {t, QUIVER_OK, QUIVER_OK, QUIVER_OK};
    pthread_t th;
    ASSERT(pthread_create(&th, NULL, intrude, &in) == 0);
    pthread_join(th, NULL);
    ASSERT(in.progress == QUIVER_ERR_WRONG_THREAD);
    ASSERT(in.send == QUIVER_ERR_WRONG_THREAD);
    ASSERT(in.close == QUIVER_ERR_WRONG_THREAD);
    ASSERT(in.t == t);
    EXPECT(QUIVER_OK, quiver_tagged_progress(t)); /* still fine on its own thread */

    /* One-sided operations: NULL windows, buffers and outputs, ranges outside the
       window and a misaligned word (refused at the origin), unknown arguments, another
       thread; the collective free clears the handle. */
    quiver_rma *r = NULL;
    quiver_window *w = NULL;
    uint64_t u64;
    const uint8_t *src = (const uint8_t *)buf;
    MUST(quiver_rma_open(job, 41, &r));
    MUST(quiver_rma_allocate(r, 64, &w));
    MUST(quiver_rma_barrier(r));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_put(r, peer, NULL, 0, src, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_put(r, peer, w, 0, NULL, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_get(r, peer, w, 0, NULL, 1));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_allocate(r, 8, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_combine(r, 1, QUIVER_COMBINE_SUM, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_stats(r, NULL));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_put_strided(r, peer, w, NULL, src, 8, 8));
    EXPECT(QUIVER_ERR_NULL, quiver_rma_put_indexed(r, peer, w, NULL, src, 8, NULL, 1, 8));
    EXPECT(QUIVER_ERR_RMA, quiver_rma_put(r, peer, w, 60, src, 8));
    EXPECT(QUIVER_ERR_RMA, quiver_rma_get(r, peer, w, 64, (uint8_t *)buf, 1));
    EXPECT(QUIVER_ERR_RMA, quiver_rma_fetch_add(r, peer, w, 4, 1, &u64));
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_rma_combine(r, 1, 99, &u64));
    LAST_SAYS("QUIVER_COMBINE_");
    EXPECT(QUIVER_ERR_INVALID_ARGUMENT, quiver_rma_set_wait(r, -5));
    EXPECT(QUIVER_OK, quiver_rma_fetch_add(r, peer, w, 8, 1, NULL));
    struct rma_intruder rin = {r, w, QUIVER_OK, QUIVER_OK, QUIVER_OK};
    pthread_t rth;
    ASSERT(pthread_create(&rth, NULL, rma_intrude, &rin) == 0);
    pthread_join(rth, NULL);
    ASSERT(rin.progress == QUIVER_ERR_WRONG_THREAD);
    ASSERT(rin.info == QUIVER_ERR_WRONG_THREAD);
    ASSERT(rin.close == QUIVER_ERR_WRONG_THREAD && rin.r == r);
    MUST(quiver_rma_barrier(r));
    EXPECT(QUIVER_OK, quiver_rma_free(r, &w));
    ASSERT(w == NULL);
    EXPECT(QUIVER_ERR_NULL, quiver_rma_free(r, &w));
    EXPECT(QUIVER_OK, quiver_rma_close(&r));
    ASSERT(r == NULL);

    /* Every rank is done with both endpoints before they close (twice). */
    MUST(quiver_job_barrier(job));
    EXPECT(QUIVER_OK, quiver_tagged_close(&t2));
    EXPECT(QUIVER_OK, quiver_tagged_close(&t));
    ASSERT(t == NULL);
    EXPECT(QUIVER_ERR_NULL, quiver_tagged_close(&t));
    EXPECT(QUIVER_OK, quiver_job_free(&job));
    EXPECT(QUIVER_ERR_NULL, quiver_job_free(&job)); /* freed twice */
}

int main(int argc, char **argv) {
    int is_outside = argc > 1 && strcmp(argv[1], "outside") == 0;
    ASSERT(quiver_last_error_message() != NULL && quiver_last_error_message()[0] == '\0');
    null_handles();
    codes();
    if (is_outside)
        outside();
    else
        in_a_job();
    printf("errors: %d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
