/* sock_pp: kernel socket (UDP / TCP) ping-pong latency and TCP streaming bandwidth,
 * busy-polling like MPI and quiver's spin mode do.
 *
 * How: every receive is a non-blocking recv(..., MSG_DONTWAIT) spun in a loop (the
 * server waits for the client's connection and for the next command with poll(), then
 * spins on the data; after 1 s without data a waiting side sleeps in poll()); sends are
 * ordinary blocking send() calls, repeated until the whole message is written. TCP sockets have TCP_NODELAY on. Time: clock_gettime(CLOCK_MONOTONIC).
 * A negative CPU means "do not pin"; otherwise the process pins itself (sched_setaffinity).
 *
 * lat (udp or tcp), per size S: calibration chunks of k round trips (k = 10, 20, 40, ...
 *   until one chunk takes >= SECONDS/20), est = chunk time / k,
 *   N = clamp(SECONDS / est, 20, 10^7), then max(100, N/10) untimed warm-up round trips
 *   and N timed ones, each round trip timed on its own (send S bytes, receive the S-byte
 *   echo). One-way = round trip / 2. UDP: one datagram per message, S <= 65507, the
 *   reply must come within 1 s (UDP does not retransmit) or the client exits 3.
 * bw (tcp only), per size S: window W = max(1, min(64, WINDOW_BYTES / S)); a window is
 *   W messages of S bytes written back to back, then the server, once it has read all
 *   W*S bytes, answers with a 1-byte acknowledgement. Calibration chunks of k windows
 *   (k = 1, 2, 4, ...; the first one is the warm-up window) until one takes
 *   >= SECONDS/20, then N = clamp(SECONDS / est, 2, 10^7) timed windows.
 *   MBps = N*W*S / time / 10^6 (payload bytes only).
 *
 * Protocol (client -> server), all control messages are 32 bytes:
 *   "QVSOCKPP" | op u32 | window u32 | size u64 | count u64   (big-endian integers)
 *   HELLO(window = test: 1 lat, 2 bw) -> server answers HELLO_ACK (same layout)
 *   TCP only, one command before each phase:
 *   ECHO(size S, count C): server reads C messages of S bytes, echoes each when complete
 *   SINK(size S, window W, count C): C times, server reads W*S bytes (recv into a buffer
 *     of max(S, 64 KiB), so small messages are not read one syscall each), sends 1 byte back
 *   END: server exits 0.
 *   UDP: after HELLO the server echoes every datagram that is not a control message
 *   (the client retransmits HELLO until acknowledged, up to 5 s; END is sent 3 times).
 * The server serves one client session, then exits: 0 after END; 1 on errors, on a client
 * that goes away without END, or after 60 s without any client activity.
 * The client connects (TCP) / says HELLO (UDP) with retries for up to 5 s.
 *
 * Usage:
 *   sock_pp srv udp|tcp BIND_ADDR PORT CPU
 *   sock_pp cli udp|tcp SERVER_ADDR PORT CPU lat SIZES SECONDS
 *   sock_pp cli tcp     SERVER_ADDR PORT CPU bw  SIZES SECONDS WINDOW_BYTES
 *   SIZES: comma-separated byte counts, each 1 .. 1073741824 (e.g. 8,1024,65536)
 *   SECONDS: target time per size (0 < SECONDS <= 3600, e.g. 0.2)   WINDOW_BYTES: >= 1
 * Output (client, stdout, one line per size, in the order given):
 *   lat size=S oneway_us_median=X oneway_us_mean=Y iters=N      (us, 3 decimals)
 *   skip size=S reason=udp-datagram-limit                        (udp, S > 65507)
 *   bw size=S MBps=X window=W iters=N                            (N = timed windows)
 *   The server prints nothing on stdout.
 * Exit: 0 ok; 1 error (bad arguments print the usage); 3 UDP reply lost (> 1 s).
 */
#define _GNU_SOURCE
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROG_NAME "sock_pp"
#define PROG_USAGE \
    "usage: sock_pp srv udp|tcp BIND_ADDR PORT CPU\n" \
    "       sock_pp cli udp|tcp SERVER_ADDR PORT CPU lat SIZES SECONDS\n" \
    "       sock_pp cli tcp SERVER_ADDR PORT CPU bw SIZES SECONDS WINDOW_BYTES\n" \
    "  SIZES: comma-separated byte counts (1..1073741824), e.g. 8,1024,65536\n" \
    "  SECONDS: target time per size (> 0); CPU: -1 = no pinning\n" \
    "output: lat size=S oneway_us_median=X oneway_us_mean=Y iters=N\n" \
    "        skip size=S reason=udp-datagram-limit\n" \
    "        bw size=S MBps=X window=W iters=N\n"
#include "progs.h"

#define CTRL_LEN 32
#define MAGIC "QVSOCKPP"
#define UDP_MAX 65507
#define SERVER_IDLE_S 60.0
#define CLIENT_IDLE_S 30.0 /* TCP client: no progress for this long = error */
#define UDP_REPLY_S 1.0
#define SPIN_S 1.0 /* busy-poll this long without data, then sleep in poll() */
#define CONNECT_S 5.0
#define SINK_CHUNK 65536 /* smallest read buffer of the bw receiver */

enum { OP_HELLO = 1, OP_HELLO_ACK = 2, OP_ECHO = 3, OP_SINK = 4, OP_END = 5 };
enum { TEST_LAT = 1, TEST_BW = 2 };

struct ctrl {
    uint32_t op, window;
    uint64_t size, count;
};

/* ---------- control messages ---------- */

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (24 - 8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (56 - 8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}
static void encode(unsigned char *b, const struct ctrl *c) {
    memcpy(b, MAGIC, 8);
    put32(b + 8, c->op);
    put32(b + 12, c->window);
    put64(b + 16, c->size);
    put64(b + 24, c->count);
}
static int decode(const unsigned char *b, size_t len, struct ctrl *c) {
    if (len != CTRL_LEN || memcmp(b, MAGIC, 8)) return -1;
    c->op = get32(b + 8);
    c->window = get32(b + 12);
    c->size = get64(b + 16);
    c->count = get64(b + 24);
    return 0;
}

/* ---------- socket helpers ---------- */

static struct addrinfo *resolve(const char *host, const char *port, int type, int passive) {
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = type;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    int e = getaddrinfo(host, port, &hints, &res);
    if (e) die("address %s port %s: %s", host, port, gai_strerror(e));
    return res;
}

static void nodelay(int fd) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) die_errno("setsockopt(TCP_NODELAY)");
}

/* waits until fd is readable; 0 ok, -1 timeout */
static int wait_readable(int fd, double timeout_s) {
    double deadline = now_s() + timeout_s;
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) die_errno("poll");
    }
}

static void tx_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            die_errno("send");
        }
        p += n;
        len -= (size_t)n;
    }
}

/* busy-polls until len bytes arrived; exits on EOF, error, or idle_s without progress.
 * After SPIN_S seconds without progress it stops spinning and sleeps in poll(). */
static void rx_all(int fd, void *buf, size_t len, double idle_s, const char *who) {
    char *p = buf;
    double last = now_s();
    while (len) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            last = now_s();
            continue;
        }
        if (n == 0) die("%s: peer closed the connection", who);
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die_errno("recv");
        double t = now_s();
        if (t - last > SPIN_S && wait_readable(fd, last + idle_s - t))
            die("%s: nothing received for %.0f s", who, idle_s);
    }
}

static void *alloc_touched(size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, size ? size : 1)) die("out of memory");
    memset(p, 'x', size);
    return p;
}

/* ---------- server ---------- */

static int server_tcp(const char *bind_addr, const char *port) {
    struct addrinfo *res = resolve(bind_addr, port, SOCK_STREAM, 1);
    int ls = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (ls < 0) die_errno("socket");
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, res->ai_addr, res->ai_addrlen)) die_errno("bind");
    freeaddrinfo(res);
    if (listen(ls, 1)) die_errno("listen");
    if (wait_readable(ls, SERVER_IDLE_S)) die("server: no client connected within 60 s");
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) die_errno("accept");
    close(ls);
    nodelay(fd);

    char *buf = NULL;
    size_t cap = 0;
    int hello = 0;
    for (;;) {
        unsigned char cb[CTRL_LEN];
        struct ctrl c;
        if (wait_readable(fd, SERVER_IDLE_S)) die("server: client idle for 60 s");
        rx_all(fd, cb, CTRL_LEN, SERVER_IDLE_S, "server");
        if (decode(cb, CTRL_LEN, &c)) die("server: protocol error (bad control message)");
        if (c.op != OP_HELLO && !hello) die("server: protocol error (no HELLO)");
        if ((c.op == OP_ECHO || c.op == OP_SINK) && (c.size < 1 || c.size > MAX_MSG))
            die("server: protocol error (bad size)");
        if (c.op == OP_SINK && (c.window < 1 || c.window > MAX_WINDOW)) die("server: protocol error (bad window)");
        size_t need = c.op == OP_SINK && c.size < SINK_CHUNK ? SINK_CHUNK : (size_t)c.size;
        if ((c.op == OP_ECHO || c.op == OP_SINK) && need > cap) {
            free(buf);
            buf = alloc_touched(need);
            cap = need;
        }
        switch (c.op) {
        case OP_HELLO: {
            if (c.window != TEST_LAT && c.window != TEST_BW) die("server: protocol error (unknown test)");
            struct ctrl a = {.op = OP_HELLO_ACK, .window = c.window};
            encode(cb, &a);
            tx_all(fd, cb, CTRL_LEN);
            hello = 1;
            break;
        }
        case OP_ECHO:
            for (uint64_t i = 0; i < c.count; i++) {
                rx_all(fd, buf, c.size, SERVER_IDLE_S, "server");
                tx_all(fd, buf, c.size);
            }
            break;
        case OP_SINK:
            for (uint64_t i = 0; i < c.count; i++) {
                uint64_t left = c.size * c.window;
                while (left) { /* the window, read in pieces of up to max(S, 64 KiB) */
                    size_t n = left < cap ? (size_t)left : cap;
                    rx_all(fd, buf, n, SERVER_IDLE_S, "server");
                    left -= n;
                }
                tx_all(fd, "A", 1);
            }
            break;
        case OP_END:
            close(fd);
            free(buf);
            return 0;
        default:
            die("server: protocol error (unknown op)");
        }
    }
}

static int server_udp(const char *bind_addr, const char *port) {
    struct addrinfo *res = resolve(bind_addr, port, SOCK_DGRAM, 1);
    int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (fd < 0) die_errno("socket");
    if (bind(fd, res->ai_addr, res->ai_addrlen)) die_errno("bind");
    freeaddrinfo(res);
    static unsigned char buf[65536];
    struct ctrl c;
    /* wait for the HELLO of one client, then talk to that client only */
    double deadline = now_s() + SERVER_IDLE_S;
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0 || wait_readable(fd, left)) die("server: no client within 60 s");
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(fd, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
            die_errno("recvfrom");
        }
        if (decode(buf, (size_t)n, &c) || c.op != OP_HELLO) continue; /* stray datagram */
        if (c.window != TEST_LAT) die("server: protocol error (udp supports only the lat test)");
        if (connect(fd, (struct sockaddr *)&from, fl)) die_errno("connect");
        break;
    }
    unsigned char ack[CTRL_LEN];
    struct ctrl a = {.op = OP_HELLO_ACK, .window = TEST_LAT};
    encode(ack, &a);
    if (send(fd, ack, CTRL_LEN, 0) < 0) die_errno("send");
    deadline = now_s() + SERVER_IDLE_S;
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == ECONNREFUSED) die("server: client went away without END");
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die_errno("recv");
            double t = now_s();
            if (t > deadline - SERVER_IDLE_S + SPIN_S && wait_readable(fd, deadline - t))
                die("server: client idle for 60 s");
            continue;
        }
        deadline = now_s() + SERVER_IDLE_S;
        if (!decode(buf, (size_t)n, &c)) {
            if (c.op == OP_END) return 0;
            if (c.op == OP_HELLO) send(fd, ack, CTRL_LEN, 0); /* our ACK was lost */
            continue;
        }
        if (send(fd, buf, (size_t)n, 0) != n) {
            if (errno == ECONNREFUSED) die("server: client went away without END");
            die_errno("send");
        }
    }
}

/* ---------- client ---------- */

static int cfd, is_udp;
static char *sbuf, *rbuf;

static void send_ctrl(uint32_t op, uint32_t window, uint64_t size, uint64_t count) {
    unsigned char b[CTRL_LEN];
    struct ctrl c = {.op = op, .window = window, .size = size, .count = count};
    encode(b, &c);
    if (is_udp) {
        if (send(cfd, b, CTRL_LEN, 0) < 0 && errno != ECONNREFUSED) die_errno("send");
    } else {
        tx_all(cfd, b, CTRL_LEN);
    }
}

static void client_connect_tcp(const char *host, const char *port) {
    struct addrinfo *res = resolve(host, port, SOCK_STREAM, 0);
    double deadline = now_s() + CONNECT_S;
    int last = 0;
    for (;;) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
            if (fd < 0) die_errno("socket");
            if (!connect(fd, ai->ai_addr, ai->ai_addrlen)) {
                freeaddrinfo(res);
                cfd = fd;
                nodelay(cfd);
                return;
            }
            last = errno;
            close(fd);
        }
        if (now_s() > deadline)
            die("connect to %s port %s failed for %.0f s: %s", host, port, CONNECT_S, strerror(last));
        usleep(50000);
    }
}

static void client_hello_tcp(int test) {
    unsigned char b[CTRL_LEN];
    struct ctrl c;
    send_ctrl(OP_HELLO, (uint32_t)test, 0, 0);
    rx_all(cfd, b, CTRL_LEN, CLIENT_IDLE_S, "client");
    if (decode(b, CTRL_LEN, &c) || c.op != OP_HELLO_ACK) die("client: protocol error (bad HELLO_ACK)");
}

/* connected UDP socket; HELLO retransmitted until acknowledged, for up to 5 s */
static void client_connect_udp(const char *host, const char *port) {
    struct addrinfo *res = resolve(host, port, SOCK_DGRAM, 0);
    cfd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (cfd < 0) die_errno("socket");
    if (connect(cfd, res->ai_addr, res->ai_addrlen)) die_errno("connect");
    freeaddrinfo(res);
    double deadline = now_s() + CONNECT_S;
    unsigned char b[65536];
    struct ctrl c;
    while (now_s() < deadline) {
        send_ctrl(OP_HELLO, TEST_LAT, 0, 0);
        double until = now_s() + 0.2;
        while (now_s() < until) {
            ssize_t n = recv(cfd, b, sizeof b, MSG_DONTWAIT);
            if (n < 0) {
                if (errno == ECONNREFUSED) { /* no server (yet) */
                    usleep(50000);
                    break;
                }
                if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die_errno("recv");
                continue;
            }
            if (!decode(b, (size_t)n, &c) && c.op == OP_HELLO_ACK) return;
        }
    }
    die("no answer from udp server %s port %s within %.0f s", host, port, CONNECT_S);
}

/* one round trip of size bytes; returns its duration in seconds */
static double round_trip(size_t size, uint64_t seq) {
    if (!is_udp) {
        double t0 = now_s();
        tx_all(cfd, sbuf, size);
        rx_all(cfd, rbuf, size, CLIENT_IDLE_S, "client");
        return now_s() - t0;
    }
    if (size >= 8) memcpy(sbuf, &seq, 8);
    double t0 = now_s(), deadline = t0 + UDP_REPLY_S;
    ssize_t n = send(cfd, sbuf, size, 0);
    if (n != (ssize_t)size) die_errno("send");
    for (;;) {
        n = recv(cfd, rbuf, 65536, MSG_DONTWAIT);
        if (n >= 0) {
            if ((size_t)n == size && (size < 8 || !memcmp(rbuf, &seq, 8))) return now_s() - t0;
            continue; /* a stale or duplicate datagram */
        }
        if (errno == ECONNREFUSED) die("client: udp server went away");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die_errno("recv");
        if (now_s() > deadline) {
            fprintf(stderr, "sock_pp: client: udp reply to message %llu (size %zu) not received within 1 s\n",
                    (unsigned long long)seq, size);
            exit(3);
        }
    }
}

static uint64_t seq_no;

/* count round trips; returns the total time; per-round-trip times into out (may be NULL) */
static double rt_phase(size_t size, long count, double *out) {
    if (!is_udp) send_ctrl(OP_ECHO, 0, size, (uint64_t)count);
    double total = 0;
    for (long i = 0; i < count; i++) {
        double t = round_trip(size, ++seq_no);
        if (out) out[i] = t;
        total += t;
    }
    return total;
}

/* rt_phase for calibrate() (w unused) */
static double rt_calib(size_t size, int w, long count) {
    (void)w;
    return rt_phase(size, count, NULL);
}

static void lat_size(size_t size, double seconds) {
    long iters = clamp_iters(seconds, calibrate(rt_calib, size, 0, 10, seconds, calib_more), 20);
    long warm = lat_warmup(iters);
    double *lat = malloc(sizeof(double) * (size_t)(warm + iters));
    if (!lat) die("out of memory");
    rt_phase(size, warm + iters, lat);
    print_lat(size, lat + warm, iters);
    free(lat);
}

/* count windows of w messages of size bytes, each acknowledged; returns the time */
static double bw_phase(size_t size, int w, long count) {
    char ack;
    send_ctrl(OP_SINK, (uint32_t)w, size, (uint64_t)count);
    double t0 = now_s();
    for (long i = 0; i < count; i++) {
        for (int j = 0; j < w; j++) tx_all(cfd, sbuf, size);
        rx_all(cfd, &ack, 1, CLIENT_IDLE_S, "client");
    }
    return now_s() - t0;
}

static void bw_size(size_t size, double seconds, unsigned long long window_bytes) {
    int w = window_count(window_bytes, size);
    /* calibration; its first window is the warm-up */
    long n = clamp_iters(seconds, calibrate(bw_phase, size, w, 1, seconds, calib_more), 2);
    print_bw(size, w, n, bw_phase(size, w, n));
}

int main(int argc, char **argv) {
    if (argc < 3) usage();
    int srv;
    if (!strcmp(argv[1], "srv")) srv = 1;
    else if (!strcmp(argv[1], "cli")) srv = 0;
    else bad_usage("first argument must be srv or cli");
    if (!strcmp(argv[2], "udp")) is_udp = 1;
    else if (!strcmp(argv[2], "tcp")) is_udp = 0;
    else bad_usage("transport must be udp or tcp");
    int cpu;
    unsigned long long port;
    if (argc < 6) usage();
    if (parse_ull(argv[4], 1, 65535, &port)) bad_usage("bad PORT '%s'", argv[4]);
    if (parse_cpu(argv[5], &cpu)) bad_usage("bad CPU '%s'", argv[5]);
    if (srv) {
        if (argc != 6) usage();
        if (pin_cpu(cpu)) return 1;
        return is_udp ? server_udp(argv[3], argv[4]) : server_tcp(argv[3], argv[4]);
    }

    if (argc < 9) usage();
    int test;
    if (!strcmp(argv[6], "lat")) test = TEST_LAT;
    else if (!strcmp(argv[6], "bw")) test = TEST_BW;
    else bad_usage("test must be lat or bw");
    if (test == TEST_BW && is_udp)
        bad_usage("bw over udp is not supported: kernel UDP has no flow control, so a sender outruns the "
                  "receiver and datagrams are dropped; measure a UDP stream with iperf3 instead");
    if (argc != (test == TEST_LAT ? 9 : 10)) usage();
    static size_t sizes[MAX_SIZES];
    int nsizes;
    double seconds;
    unsigned long long window_bytes = 0;
    if (parse_sizes(argv[7], sizes, &nsizes)) bad_usage("bad SIZES '%s'", argv[7]);
    if (parse_seconds(argv[8], &seconds)) bad_usage("bad SECONDS '%s'", argv[8]);
    if (test == TEST_BW && parse_ull(argv[9], 1, 1ull << 40, &window_bytes))
        bad_usage("bad WINDOW_BYTES '%s'", argv[9]);
    if (pin_cpu(cpu)) return 1;
    size_t max = 8;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > max && (!is_udp || sizes[i] <= UDP_MAX)) max = sizes[i];
    sbuf = alloc_touched(is_udp ? 65536 : max);
    rbuf = alloc_touched(is_udp ? 65536 : max);

    if (is_udp) client_connect_udp(argv[3], argv[4]);
    else {
        client_connect_tcp(argv[3], argv[4]);
        client_hello_tcp(test);
    }
    for (int i = 0; i < nsizes; i++) {
        if (is_udp && sizes[i] > UDP_MAX) {
            printf("skip size=%zu reason=udp-datagram-limit\n", sizes[i]);
            fflush(stdout);
            continue;
        }
        if (test == TEST_LAT) lat_size(sizes[i], seconds);
        else bw_size(sizes[i], seconds, window_bytes);
    }
    for (int i = 0; i < (is_udp ? 3 : 1); i++) send_ctrl(OP_END, 0, 0, 0);
    close(cfd);
    return 0;
}
