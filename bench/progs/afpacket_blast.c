/* A raw Ethernet stream through an emulated link, without quiver: what the link and the
 * kernel deliver to the simplest sender and receiver of MTU-sized frames.
 *
 *   afpacket_blast send IFACE DSTMAC SNDBUF SECONDS [CPU]
 *       sends 1514-byte frames of EtherType 0x88B6 (not quiver's) to DSTMAC, one
 *       blocking sendto each, from an AF_PACKET socket whose send buffer is SNDBUF bytes
 *       (SO_SNDBUFFORCE): the sender sleeps while that much is queued below it, so the
 *       link's qdisc always holds a queue and the sender never drops;
 *   afpacket_blast recv IFACE SECONDS [CPU]
 *       busy-polls a TPACKET_V2 receive ring bound to EtherType 0x88B6 (as quiver's eth
 *       endpoints do: the kernel copies each frame into the ring on the sending core),
 *       copies each frame out and gives it back; prints the frames and the kernel's drops.
 *
 * The sender's count covers what it handed over in its own time; compare it with the
 * receiving interface's rx_packets to see that nothing was lost. Needs CAP_NET_RAW; run inside the nodes of a `quiver cluster`.
 */
#define _GNU_SOURCE
#define PROG_NAME "afpacket_blast"
#define PROG_USAGE                                                    \
    "usage: afpacket_blast send IFACE DSTMAC SNDBUF SECONDS [CPU]\n" \
    "       afpacket_blast recv IFACE SECONDS [CPU]\n"
#include "progs.h"

#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define ETHERTYPE 0x88B6
#define FRAME 1514
#define RING_FRAME 2048
#define RING_BLOCK (1 << 16)
#define RING_BLOCKS 64

static int if_index(const char *name) {
    int i = (int)if_nametoindex(name);
    if (i == 0) die_errno("interface %s", name);
    return i;
}

static void own_mac(int fd, const char *ifname, unsigned char *mac) {
    struct ifreq r = {0};
    snprintf(r.ifr_name, sizeof r.ifr_name, "%s", ifname);
    if (ioctl(fd, SIOCGIFHWADDR, &r)) die_errno("SIOCGIFHWADDR %s", ifname);
    memcpy(mac, r.ifr_hwaddr.sa_data, 6);
}

static int send_stream(const char *ifname, const char *dst, long sndbuf, double seconds) {
    int fd = socket(AF_PACKET, SOCK_RAW, 0);
    if (fd < 0) die_errno("socket");
    int sb = (int)sndbuf;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sb, sizeof sb)) die_errno("SO_SNDBUFFORCE");
    unsigned char frame[FRAME] = {0};
    if (sscanf(dst, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", frame, frame + 1, frame + 2, frame + 3,
               frame + 4, frame + 5) != 6)
        bad_usage("bad MAC '%s'", dst);
    own_mac(fd, ifname, frame + 6); /* a bridge drops frames from an invalid source MAC */
    frame[12] = ETHERTYPE >> 8;
    frame[13] = ETHERTYPE & 0xff;
    struct sockaddr_ll to = {0};
    to.sll_family = AF_PACKET;
    to.sll_ifindex = if_index(ifname);
    to.sll_halen = 6;
    memcpy(to.sll_addr, frame, 6);
    long sent = 0, failed = 0;
    double start = now_s(), end = start + seconds, stop;
    for (;;) {
        if (sendto(fd, frame, FRAME, 0, (struct sockaddr *)&to, sizeof to) == FRAME)
            sent++;
        else
            failed++;
        if ((sent & 63) == 0 && (stop = now_s()) > end) break;
    }
    printf("sent %ld frames of %d bytes in %.6f s, %ld failed sends\n", sent, FRAME, stop - start,
           failed);
    return 0;
}

static int recv_stream(const char *ifname, double seconds) {
    int fd = socket(AF_PACKET, SOCK_RAW, htons(ETHERTYPE));
    if (fd < 0) die_errno("socket");
    int version = TPACKET_V2;
    if (setsockopt(fd, SOL_PACKET, PACKET_VERSION, &version, sizeof version))
        die_errno("PACKET_VERSION");
    struct tpacket_req req = {
        .tp_block_size = RING_BLOCK,
        .tp_block_nr = RING_BLOCKS,
        .tp_frame_size = RING_FRAME,
        .tp_frame_nr = RING_BLOCK / RING_FRAME * RING_BLOCKS,
    };
    if (setsockopt(fd, SOL_PACKET, PACKET_RX_RING, &req, sizeof req)) die_errno("PACKET_RX_RING");
    unsigned char *ring = mmap(NULL, (size_t)RING_BLOCK * RING_BLOCKS, PROT_READ | PROT_WRITE,
                               MAP_SHARED, fd, 0);
    if (ring == MAP_FAILED) die_errno("mmap");
    struct sockaddr_ll at = {0};
    at.sll_family = AF_PACKET;
    at.sll_protocol = htons(ETHERTYPE);
    at.sll_ifindex = if_index(ifname);
    if (bind(fd, (struct sockaddr *)&at, sizeof at)) die_errno("bind");
    unsigned char copy[RING_FRAME];
    volatile unsigned sink = 0;
    long frames = 0;
    unsigned i = 0;
    double end = now_s() + seconds;
    for (long k = 0;; k++) {
        struct tpacket2_hdr *h = (struct tpacket2_hdr *)(ring + (size_t)i * RING_FRAME);
        if (__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER) {
            unsigned len = h->tp_snaplen < RING_FRAME ? h->tp_snaplen : RING_FRAME;
            memcpy(copy, (unsigned char *)h + h->tp_mac, len);
            sink += copy[len / 2];
            __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
            i = (i + 1) % req.tp_frame_nr;
            frames++;
        }
        if ((k & 4095) == 0 && now_s() > end) break;
    }
    struct tpacket_stats st;
    socklen_t len = sizeof st;
    if (getsockopt(fd, SOL_PACKET, PACKET_STATISTICS, &st, &len)) die_errno("PACKET_STATISTICS");
    printf("received %ld frames in %.1f s, kernel drops %u\n", frames, seconds, st.tp_drops);
    return 0;
}

int main(int argc, char **argv) {
    double seconds;
    long sndbuf;
    int cpu = -1;
    if (argc >= 6 && !strcmp(argv[1], "send")) {
        if (argc > 7) usage();
        if (parse_long(argv[4], 4096, 1L << 30, &sndbuf)) bad_usage("bad SNDBUF '%s'", argv[4]);
        if (parse_seconds(argv[5], &seconds)) bad_usage("bad SECONDS '%s'", argv[5]);
        if (argc == 7 && parse_cpu(argv[6], &cpu)) bad_usage("bad CPU '%s'", argv[6]);
        if (pin_cpu(cpu)) die_errno("pinning to CPU %d", cpu);
        return send_stream(argv[2], argv[3], sndbuf, seconds);
    }
    if (argc >= 4 && !strcmp(argv[1], "recv")) {
        if (argc > 5) usage();
        if (parse_seconds(argv[3], &seconds)) bad_usage("bad SECONDS '%s'", argv[3]);
        if (argc == 5 && parse_cpu(argv[4], &cpu)) bad_usage("bad CPU '%s'", argv[4]);
        if (pin_cpu(cpu)) die_errno("pinning to CPU %d", cpu);
        return recv_stream(argv[2], seconds);
    }
    usage();
}
