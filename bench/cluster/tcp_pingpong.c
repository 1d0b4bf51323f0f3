/* TCP ping-pong (TCP_NODELAY), 8-byte payload by default: the kernel-TCP twin of the
 * anchors' limits/udp_pingpong.c, for bench/cluster.sh.
 * usage: tcp_pingpong srv BIND_IP PORT MODE
 *        tcp_pingpong cli SERVER_IP PORT MODE [iters] [size]
 * MODE: busy  = non-blocking recv (MSG_DONTWAIT) spun in a loop
 *       block = ordinary blocking recv
 * The server echoes each message of the client's size (read in full, then sent back) until
 * the client closes. The client runs iters/10 + 100 untimed round trips, then iters timed
 * ones, and prints avg and p50 one-way latency (= round trip / 2) in us. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }

/* reads exactly len bytes; 0 on success, -1 on EOF, error or deadline */
static int rx_all(int fd, char *buf, size_t len, int busy, double deadline_ns) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, buf + got, len - got, busy ? MSG_DONTWAIT : 0);
        if (n > 0) { got += n; continue; }
        if (n == 0) return -1;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) { perror("recv"); return -1; }
        if (now_ns() > deadline_ns) return -1;
    }
    return 0;
}
static int tx_all(int fd, const char *buf, size_t len) {
    size_t put = 0;
    while (put < len) {
        ssize_t n = send(fd, buf + put, len - put, MSG_NOSIGNAL);
        if (n < 0) { if (errno == EINTR || errno == EAGAIN) continue; perror("send"); return -1; }
        put += n;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: see source\n"); return 2; }
    int srv = !strcmp(argv[1], "srv");
    int busy = !strcmp(argv[4], "busy");
    long iters = argc > 5 ? atol(argv[5]) : 100000;
    size_t size = argc > 6 ? atol(argv[6]) : 8;
    int one = 1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[3])) };
    inet_pton(AF_INET, argv[2], &a.sin_addr);
    static char buf[1 << 20];
    if (size > sizeof buf) { fprintf(stderr, "size too large\n"); return 2; }
    struct timeval tv = { 1, 0 };   /* blocking recv wakes every 1 s to check the deadline */
    if (srv) {
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1)) { perror("bind/listen"); return 1; }
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) { perror("accept"); return 1; }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        size_t msz;   /* the client sends its message size first */
        if (rx_all(fd, (char *)&msz, sizeof msz, 0, now_ns() + 20e9) || msz > sizeof buf) return 1;
        while (!rx_all(fd, buf, msz, busy, now_ns() + 20e9))
            if (tx_all(fd, buf, msz)) return 1;
        return 0;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { perror("connect"); return 1; }
    if (tx_all(fd, (char *)&size, sizeof size)) return 1;
    long warm = iters / 10 + 100;
    double *lat = malloc(sizeof(double) * iters), t0 = 0;
    for (long i = 0; i < warm + iters; i++) {
        double s = now_ns();
        if (i == warm) t0 = s;
        if (tx_all(fd, buf, size)) return 1;
        if (rx_all(fd, buf, size, busy, s + 5e9)) { fprintf(stderr, "client: reply lost at i=%ld\n", i); return 1; }
        if (i >= warm) lat[i - warm] = now_ns() - s;
    }
    double tot = now_ns() - t0;
    close(fd);
    qsort(lat, iters, sizeof(double), cmp);
    printf("mode=%s size=%zu iters=%ld oneway_avg_us=%.3f oneway_p50_us=%.3f oneway_p99_us=%.3f\n",
           argv[4], size, iters, tot / iters / 2e3, lat[iters / 2] / 2e3, lat[(long)(iters * 0.99)] / 2e3);
    return 0;
}
