/* afpacket_ring_pp: raw Ethernet ping-pong whose receive side spins on a memory-mapped
 * TPACKET_V2 receive ring instead of calling recvfrom: the fastest raw receive path we
 * know, the lower bound for any protocol over AF_PACKET (quiver eth reads the same kind
 * of ring). Compare with the anchors' limits/afpacket_pingpong.c (recvfrom spin).
 *
 * Frames: EtherType 0x88B5, 60 bytes (8-byte sequence number padded), sent with sendto
 * on the same socket. The client's first frame goes to the broadcast MAC, later ones to
 * the MAC learned from the reply. One-way = round trip / 2; the client prints
 * "oneway_avg_us= oneway_p50_us= oneway_p99_us=" like the anchor, and the mean time of
 * its sendto calls (sendto_avg_us=: on veth the call carries the frame through the
 * bridge into the peer's ring).
 *
 * The server prints its turnaround to stderr when it quits ("srv turnaround_mean_us="):
 * the mean time from the kernel's stamp of a received frame (tp_sec/tp_nsec, taken
 * while it fills the ring frame) to the sendto of the reply, over replies within 5 us;
 * quiver's build with the `eth-turnaround` feature logs the same figure, so a one-way
 * time splits into this turnaround and the kernel's path from sendto into the peer's
 * ring. Means only: the clock ticks in 256 ns steps on some virtual machines.
 *
 * Two environment variables, for experiments: RING_FRAMES (default 256; quiver eth's
 * default ring has 2648) sets the receive ring's frames, and TOUCH_BYTES writes one byte
 * per 64-byte line of a buffer that large after every send, standing in for the memory
 * a larger program touches between two system calls.
 *
 * QL_OMIT=filter|socket|protocol|epoll leaves one of quiverlike's settings out, to see
 * what each costs: the BPF filter; the second socket (frames go out through the ring's
 * own socket, which names the EtherType); sll_protocol 0 (the second socket names it);
 * or the epoll registration (whose callback runs on every frame the socket receives).
 *
 * MODE quiverlike gives the sockets what quiver eth's have, to see what they cost: the
 * frames go out through a second, unbound socket of protocol 0 (sll_protocol 0), the
 * ring socket has a classic BPF filter (EtherType, and PACKET_HOST or the first frame's
 * PACKET_BROADCAST), PACKET_IGNORE_OUTGOING
 * and an edge-triggered epoll registration, and frames are 58 bytes. Default: plain.
 *
 * usage: afpacket_ring_pp srv IFNAME [plain|quiverlike]
 *        afpacket_ring_pp cli IFNAME [iters [plain|quiverlike]]
 *        (iters default 100000; warm-up iters/10 + 100; both sides take the same mode)
 */
#define _GNU_SOURCE
#define PROG_NAME "afpacket_ring_pp"
#define PROG_USAGE "usage: afpacket_ring_pp srv IFNAME [MODE] | cli IFNAME [iters [MODE]]; MODE plain|quiverlike\n"
#include "progs.h"

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#define ETYPE 0x88B5
#define FRAME_SIZE 2048
static unsigned FRAMES = 256;     /* RING_FRAMES overrides (even, 2..65536) */
static size_t TOUCH_BYTES;         /* TOUCH_BYTES: memory written after each send */
static unsigned char *touch_buf;

static int fd, send_fd, ifindex, frame_len = 60;
static const char *ql_omit = ""; /* QL_OMIT: the quiverlike setting left out */
static double last_stamp_ns, turn_sum_ns; /* the newest frame's kernel stamp; turnarounds */
static long turn_count;
static double sendto_ns;
static long sendto_calls;
static unsigned char mymac[6];
static unsigned char *ring;
static unsigned slot;

/* Spins on the ring until a frame from another host arrives or the deadline passes;
 * copies its first bytes and the sender's MAC, hands the slot back. */
static int rx(unsigned char *buf, unsigned char *from_mac, double deadline) {
    for (;;) {
        struct tpacket2_hdr *h = (struct tpacket2_hdr *)(ring + (size_t)slot * FRAME_SIZE);
        if (__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER) {
            struct sockaddr_ll *sll = (struct sockaddr_ll *)((unsigned char *)h + TPACKET_ALIGN(sizeof *h));
            int mine = sll->sll_pkttype == PACKET_OUTGOING;
            last_stamp_ns = h->tp_sec * 1e9 + h->tp_nsec;
            unsigned len = h->tp_snaplen < 64 ? h->tp_snaplen : 64;
            memcpy(buf, (unsigned char *)h + h->tp_mac, len);
            memcpy(from_mac, sll->sll_addr, 6);
            __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
            slot = (slot + 1) % FRAMES;
            if (!mine && len >= 22) return 0;
            continue;
        }
        if (now_ns() > deadline) return -1;
    }
}

static void tx(unsigned char *frame, const unsigned char *dst) {
    if (last_stamp_ns > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double d = ts.tv_sec * 1e9 + ts.tv_nsec - last_stamp_ns;
        if (d >= 0 && d < 5000) turn_sum_ns += d, turn_count++;
        last_stamp_ns = 0;
    }
    memcpy(frame, dst, 6);
    memcpy(frame + 6, mymac, 6);
    frame[12] = ETYPE >> 8;
    frame[13] = ETYPE & 0xff;
    struct sockaddr_ll to = {.sll_family = AF_PACKET, .sll_ifindex = ifindex, .sll_halen = 6,
                             .sll_protocol = (send_fd == fd || !strcmp(ql_omit, "protocol")) ? htons(ETYPE) : 0};
    memcpy(to.sll_addr, dst, 6);
    double t = now_ns();
    if (sendto(send_fd, frame, frame_len, 0, (struct sockaddr *)&to, sizeof to) != frame_len)
        die_errno("sendto");
    sendto_ns += now_ns() - t;
    sendto_calls++;
    for (size_t k = 0; k < TOUCH_BYTES; k += 64) touch_buf[k]++;
}

/* quiver eth's socket settings (MODE quiverlike). */
static void like_quiver(void) {
    if (strcmp(ql_omit, "socket")) {
        send_fd = socket(AF_PACKET, SOCK_RAW, 0);
        if (send_fd < 0) die_errno("socket(AF_PACKET, 0)");
    }
    frame_len = 58;
    struct sock_filter code[] = {
        {BPF_LD | BPF_H | BPF_ABS, 0, 0, 12},                      /* EtherType */
        {BPF_JMP | BPF_JEQ | BPF_K, 0, 4, ETYPE},
        {BPF_LD | BPF_B | BPF_ABS, 0, 0, SKF_AD_OFF + SKF_AD_PKTTYPE},
        {BPF_JMP | BPF_JEQ | BPF_K, 1, 0, PACKET_HOST},
        {BPF_JMP | BPF_JEQ | BPF_K, 0, 1, PACKET_BROADCAST}, /* the client's first frame */
        {BPF_RET | BPF_K, 0, 0, 0xffffffff},
        {BPF_RET | BPF_K, 0, 0, 0},
    };
    struct sock_fprog prog = {sizeof code / sizeof code[0], code};
    if (strcmp(ql_omit, "filter") && setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog))
        die_errno("SO_ATTACH_FILTER");
    int one = 1;
    if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one)) die_errno("PACKET_IGNORE_OUTGOING");
    if (strcmp(ql_omit, "epoll")) {
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
        if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)) die_errno("epoll");
    }
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "srv") && strcmp(argv[1], "cli"))) usage();
    int srv = !strcmp(argv[1], "srv");
    long iters = 100000;
    const char *mode = srv ? (argc > 3 ? argv[3] : "plain") : (argc > 4 ? argv[4] : "plain");
    if (!srv && argc > 3 && parse_long(argv[3], 1, 100000000, &iters)) bad_usage("bad iters '%s'", argv[3]);
    if (strcmp(mode, "plain") && strcmp(mode, "quiverlike")) bad_usage("bad mode '%s'", mode);
    if (getenv("QL_OMIT")) {
        ql_omit = getenv("QL_OMIT");
        if (strcmp(ql_omit, "filter") && strcmp(ql_omit, "socket") && strcmp(ql_omit, "protocol") &&
            strcmp(ql_omit, "epoll"))
            bad_usage("bad QL_OMIT '%s' (filter, socket, protocol or epoll)", ql_omit);
    }
    long env_val;
    if (getenv("RING_FRAMES")) {
        if (parse_long(getenv("RING_FRAMES"), 2, 65536, &env_val) || env_val % 2)
            bad_usage("bad RING_FRAMES '%s' (even, 2..65536)", getenv("RING_FRAMES"));
        FRAMES = (unsigned)env_val;
    }
    if (getenv("TOUCH_BYTES")) {
        if (parse_long(getenv("TOUCH_BYTES"), 0, 1L << 30, &env_val))
            bad_usage("bad TOUCH_BYTES '%s'", getenv("TOUCH_BYTES"));
        TOUCH_BYTES = (size_t)env_val;
        if (TOUCH_BYTES && !(touch_buf = calloc(TOUCH_BYTES, 1))) die("out of memory");
    }

    fd = socket(AF_PACKET, SOCK_RAW, htons(ETYPE));
    if (fd < 0) die_errno("socket(AF_PACKET)");
    send_fd = fd;
    struct ifreq ifr = {0};
    strncpy(ifr.ifr_name, argv[2], IFNAMSIZ - 1);
    if (ioctl(fd, SIOCGIFINDEX, &ifr)) die_errno("SIOCGIFINDEX %s", argv[2]);
    ifindex = ifr.ifr_ifindex;
    if (ioctl(fd, SIOCGIFHWADDR, &ifr)) die_errno("SIOCGIFHWADDR");
    memcpy(mymac, ifr.ifr_hwaddr.sa_data, 6);
    int v = TPACKET_V2;
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &v, sizeof v)) die_errno("PACKET_VERSION");
    struct tpacket_req req = {.tp_block_size = FRAME_SIZE * 2, .tp_block_nr = FRAMES / 2,
                              .tp_frame_size = FRAME_SIZE, .tp_frame_nr = FRAMES};
    if (setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req)) die_errno("PACKET_RX_RING");
    ring = mmap(NULL, (size_t)FRAMES * FRAME_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ring == MAP_FAILED) die_errno("mmap");
    struct sockaddr_ll b = {.sll_family = AF_PACKET, .sll_protocol = htons(ETYPE), .sll_ifindex = ifindex};
    if (bind(fd, (struct sockaddr *)&b, sizeof b)) die_errno("bind");
    if (!strcmp(mode, "quiverlike")) like_quiver();

    unsigned char buf[64], frame[60] = {0}, from[6];
    if (srv) {
        for (;;) {
            if (rx(buf, from, now_ns() + 20e9) < 0) die("server: idle timeout");
            if (buf[22] == 'Q') { /* quit flag after the payload */
                if (turn_count)
                    fprintf(stderr, "srv turnaround_mean_us=%.3f n=%ld\n", turn_sum_ns / turn_count / 1e3, turn_count);
                return 0;
            }
            memcpy(frame + 14, buf + 14, 8);
            tx(frame, from);
        }
    }
    unsigned char peer[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    long warm = iters / 10 + 100;
    double *lat = malloc(sizeof(double) * iters), t0 = 0;
    if (!lat) die("out of memory");
    for (long i = 0; i < warm + iters; i++) {
        double s = now_ns();
        if (i == warm) t0 = s;
        memcpy(frame + 14, &i, 8);
        tx(frame, peer);
        for (;;) {
            if (rx(buf, from, s + 5e9) < 0) die("client: reply lost at i=%ld", i);
            if (!memcmp(buf + 14, &i, 8)) break;
        }
        if (i == 0) memcpy(peer, from, 6);
        if (i >= warm) lat[i - warm] = now_ns() - s;
    }
    double tot = now_ns() - t0;
    frame[22] = 'Q';
    tx(frame, peer);
    qsort(lat, iters, sizeof(double), cmp_double);
    printf("mode=ring-%s iters=%ld oneway_avg_us=%.3f oneway_p50_us=%.3f oneway_p99_us=%.3f sendto_avg_us=%.3f\n",
           mode, iters, tot / iters / 2e3, lat[iters / 2] / 2e3, lat[(long)(iters * 0.99)] / 2e3,
           sendto_ns / sendto_calls / 1e3);
    return 0;
}
