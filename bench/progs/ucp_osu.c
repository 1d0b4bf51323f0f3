/* ucp_osu: OSU-style uni-directional bandwidth and message rate with UCX's UCP tag API
 * (ucp_tag_send_nbx / ucp_tag_recv_nbx), the test osu_mpi's `bw` runs on MPI, so that
 * UCX is measured in the same shape as the MPIs and quiver (ucx_perftest's tag_bw is a
 * stream with no per-window acknowledgement, a different test).
 *
 * How, per size S: window W = max(1, min(64, WINDOW_BYTES / S)). One window: the client
 *   (the sender) starts W ucp_tag_send_nbx of S bytes from one buffer and progresses the
 *   worker until all are complete; the server starts W ucp_tag_recv_nbx into one buffer
 *   (as OSU does), progresses until all are complete, then sends a 4-byte acknowledgement
 *   that the client receives. Calibration chunks of k windows (k = 1, 2, 4, ...; the
 *   first one is the warm-up window) until one takes >= SECONDS/20, then
 *   N = clamp(SECONDS / est, 2, 10^7) timed windows. MBps = N*W*S / time / 10^6; messages
 *   per second = MBps * 10^6 / S. Transports are UCX's choice (UCX_TLS, UCX_NET_DEVICES).
 *   Polling only (ucp_worker_progress in a loop), as ucx_perftest's default.
 *
 * Out of band, a TCP connection: the client connects (retrying for up to 5 s), both send
 *   their worker address (u64 length, big-endian, then the bytes), then the client sends
 *   before each chunk a command of 3 u64 (size, window, count; all 0: end). The server
 *   serves one client, then exits 0; 1 on errors.
 *
 * Usage:
 *   ucp_osu srv BIND_ADDR PORT CPU
 *   ucp_osu cli SERVER_ADDR PORT CPU bw SIZES SECONDS WINDOW_BYTES
 *   CPU: the CPU to pin to, or -1.  SIZES: comma-separated byte counts (1..1073741824).
 *   SECONDS: target time per size (0 < SECONDS <= 3600).  WINDOW_BYTES: >= 1.
 * Output (client, stdout, one line per size): bw size=S MBps=X window=W iters=N
 */
#define _GNU_SOURCE
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define PROG_NAME "ucp_osu"
#define PROG_USAGE \
    "usage: ucp_osu srv BIND_ADDR PORT CPU\n" \
    "       ucp_osu cli SERVER_ADDR PORT CPU bw SIZES SECONDS WINDOW_BYTES\n" \
    "output: bw size=S MBps=X window=W iters=N\n"
#include "progs.h"

#define TAG_BW 100
#define TAG_ACK 101

static ucp_context_h ctx;
static ucp_worker_h worker;
static ucp_ep_h ep;
static int ctl = -1;
static char *sbuf, *rbuf;
static void *req[MAX_WINDOW];

/* ---------- the control connection ---------- */

static void write_all(const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(ctl, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die_errno("control write");
        c += w;
        n -= (size_t)w;
    }
}

/* 0 when the peer closed before the first byte */
static int read_all(void *p, size_t n) {
    char *c = p;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(ctl, c + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die_errno("control read");
        if (r == 0) {
            if (got == 0) return 0;
            die("control connection closed mid-message");
        }
        got += (size_t)r;
    }
    return 1;
}

static void put_u64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (56 - 8 * i));
    write_all(b, 8);
}

static int get_u64(uint64_t *v) {
    unsigned char b[8];
    if (!read_all(b, 8)) return 0;
    *v = 0;
    for (int i = 0; i < 8; i++) *v = *v << 8 | b[i];
    return 1;
}

static struct addrinfo *resolve(const char *host, const char *port, int passive) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
                             .ai_flags = passive ? AI_PASSIVE : 0};
    struct addrinfo *ai;
    int e = getaddrinfo(host, port, &hints, &ai);
    if (e) die("resolving %s:%s: %s", host, port, gai_strerror(e));
    return ai;
}

static void serve_control(const char *bind_addr, const char *port) {
    struct addrinfo *ai = resolve(bind_addr, port, 1);
    int s = socket(ai->ai_family, SOCK_STREAM, 0);
    int one = 1;
    if (s < 0) die_errno("socket");
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, ai->ai_addr, ai->ai_addrlen)) die_errno("bind %s:%s", bind_addr, port);
    if (listen(s, 1)) die_errno("listen");
    freeaddrinfo(ai);
    ctl = accept(s, NULL, NULL);
    if (ctl < 0) die_errno("accept");
    close(s);
    setsockopt(ctl, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void connect_control(const char *host, const char *port) {
    struct addrinfo *ai = resolve(host, port, 0);
    double until = now_s() + 5;
    for (;;) {
        ctl = socket(ai->ai_family, SOCK_STREAM, 0);
        if (ctl < 0) die_errno("socket");
        if (connect(ctl, ai->ai_addr, ai->ai_addrlen) == 0) break;
        close(ctl);
        if (now_s() > until) die_errno("connecting to %s:%s", host, port);
        usleep(20000);
    }
    freeaddrinfo(ai);
    int one = 1;
    setsockopt(ctl, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---------- UCP ---------- */

static void check(ucs_status_t st, const char *what) {
    if (st != UCS_OK) die("%s: %s", what, ucs_status_string(st));
}

/* context, worker, and an endpoint to the peer whose address comes over the control link */
static void ucp_setup(void) {
    ucp_config_t *config;
    check(ucp_config_read(NULL, NULL, &config), "ucp_config_read");
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    check(ucp_init(&params, config, &ctx), "ucp_init");
    ucp_config_release(config);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    check(ucp_worker_create(ctx, &wp, &worker), "ucp_worker_create");
    ucp_address_t *mine;
    size_t mine_len;
    check(ucp_worker_get_address(worker, &mine, &mine_len), "ucp_worker_get_address");
    put_u64(mine_len);
    write_all(mine, mine_len);
    ucp_worker_release_address(worker, mine);
    uint64_t len;
    if (!get_u64(&len) || len == 0 || len > (1u << 20)) die("bad peer address");
    void *theirs = malloc(len);
    if (!theirs || !read_all(theirs, len)) die("reading the peer's address");
    ucp_ep_params_t epp = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                           .address = theirs};
    check(ucp_ep_create(worker, &epp, &ep), "ucp_ep_create");
    free(theirs);
}

/* waits for a request returned by a _nbx call (NULL: completed at once) and frees it */
static void wait_req(void *r, const char *what) {
    if (r == NULL) return;
    if (UCS_PTR_IS_ERR(r)) die("%s: %s", what, ucs_status_string(UCS_PTR_STATUS(r)));
    ucs_status_t st;
    while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(r);
    check(st, what);
}

static void *send_tag(const void *buf, size_t len, ucp_tag_t tag) {
    ucp_request_param_t p = {.op_attr_mask = 0};
    return ucp_tag_send_nbx(ep, buf, len, tag, &p);
}

static void *recv_tag(void *buf, size_t len, ucp_tag_t tag) {
    ucp_request_param_t p = {.op_attr_mask = 0};
    return ucp_tag_recv_nbx(worker, buf, len, tag, (ucp_tag_t)-1, &p);
}

/* ---------- the test ---------- */

/* count windows of w messages of size bytes, each acknowledged; returns the time */
static double window_chunk(int client, size_t size, int w, long count) {
    char ack[4] = {0};
    double t0 = now_s();
    for (long i = 0; i < count; i++) {
        for (int j = 0; j < w; j++)
            req[j] = client ? send_tag(sbuf, size, TAG_BW) : recv_tag(rbuf, size, TAG_BW);
        for (int j = 0; j < w; j++) wait_req(req[j], client ? "send" : "receive");
        if (client)
            wait_req(recv_tag(ack, sizeof ack, TAG_ACK), "acknowledgement");
        else
            wait_req(send_tag(ack, sizeof ack, TAG_ACK), "acknowledgement");
    }
    return now_s() - t0;
}

/* the client's chunk: tells the server how many windows to serve, then runs them */
static double client_chunk(size_t size, int w, long count) {
    put_u64(size);
    put_u64((uint64_t)w);
    put_u64((uint64_t)count);
    return window_chunk(1, size, w, count);
}

static int client_more(double t, double seconds, long k) {
    return calib_more(t, seconds, k);
}

static char *alloc_touched(size_t n) {
    char *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    if (!p) die("out of memory");
    memset(p, 0xa5, n);
    return p;
}

int main(int argc, char **argv) {
    if (argc < 5) usage();
    int client = !strcmp(argv[1], "cli");
    if (!client && strcmp(argv[1], "srv")) bad_usage("first argument must be srv or cli");
    int cpu;
    if (parse_cpu(argv[4], &cpu)) bad_usage("bad CPU");
    size_t sizes[MAX_SIZES];
    int nsizes = 0;
    double seconds = 0;
    unsigned long long window_bytes = 0;
    if (client) {
        if (argc != 9 || strcmp(argv[5], "bw")) bad_usage("the client runs: bw SIZES SECONDS WINDOW_BYTES");
        if (parse_sizes(argv[6], sizes, &nsizes)) bad_usage("bad SIZES");
        if (parse_seconds(argv[7], &seconds)) bad_usage("bad SECONDS");
        if (parse_ull(argv[8], 1, 1ull << 40, &window_bytes)) bad_usage("bad WINDOW_BYTES");
    } else if (argc != 5) {
        usage();
    }
    if (pin_cpu(cpu)) return 1;
    if (client)
        connect_control(argv[2], argv[3]);
    else
        serve_control(argv[2], argv[3]);
    ucp_setup();
    size_t largest = 4;
    for (int i = 0; i < nsizes; i++) largest = sizes[i] > largest ? sizes[i] : largest;
    if (client) {
        sbuf = alloc_touched(largest);
        for (int i = 0; i < nsizes; i++) {
            int w = window_count(window_bytes, sizes[i]);
            double est = calibrate(client_chunk, sizes[i], w, 1, seconds, client_more);
            long n = clamp_iters(seconds, est, 2);
            print_bw(sizes[i], w, n, client_chunk(sizes[i], w, n));
        }
        put_u64(0);
        put_u64(0);
        put_u64(0);
    } else {
        uint64_t size, w, count;
        size_t have = 0;
        while (get_u64(&size) && get_u64(&w) && get_u64(&count) && size > 0) {
            if (w < 1 || w > MAX_WINDOW || size > MAX_MSG) die("bad command from the client");
            if (size > have) {
                free(rbuf);
                rbuf = alloc_touched(size);
                have = size;
            }
            window_chunk(0, size, (int)w, (long)count);
        }
    }
    /* what the peer still needs from this side (the last acknowledgement) goes first */
    void *close_req = ucp_ep_close_nb(ep, UCP_EP_CLOSE_MODE_FLUSH);
    if (UCS_PTR_IS_PTR(close_req)) {
        while (ucp_request_check_status(close_req) == UCS_INPROGRESS) ucp_worker_progress(worker);
        ucp_request_free(close_req);
    }
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
    close(ctl);
    return 0;
}
