/* What PACKET_VNET_HDR (segmentation offload for packet sockets) can do for quiver's
 * raw Ethernet frames. Sends, on IFACE to DSTMAC, through an AF_PACKET socket with
 * PACKET_VNET_HDR set:
 *   1. one MTU-sized frame of quiver's EtherType (0x88B5), no offload requested;
 *   2. one 8000-byte frame of that EtherType with a virtio_net_hdr asking the kernel to
 *      cut it into MTU-sized frames (gso_type UDP_L4, then TCPV4);
 *   3. the same 8000 bytes as an IPv4/UDP datagram (the header quiver's eth frames
 *      leave out), gso_type UDP_L4.
 * and prints what the kernel answered to each, and how many frames left the interface
 * (its tx_packets counter). quiver's eth frames carry no IP header by design, so only
 * what case 2 answers matters to them.
 *
 * usage: vnet_probe IFACE DSTMAC        (needs CAP_NET_RAW; run inside a cluster node)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define QUIVER_ETHERTYPE 0x88B5
#ifndef VIRTIO_NET_HDR_GSO_UDP_L4
#define VIRTIO_NET_HDR_GSO_UDP_L4 5 /* Linux 5.18 uapi; older headers lack it */
#endif

static long tx_packets(const char *ifname) {
    char path[256];
    snprintf(path, sizeof path, "/sys/class/net/%s/statistics/tx_packets", ifname);
    FILE *f = fopen(path, "r");
    long n = -1;
    if (f) {
        if (fscanf(f, "%ld", &n) != 1) n = -1;
        fclose(f);
    }
    return n;
}

static int mtu_of(int fd, const char *ifname) {
    struct ifreq ifr = {0};
    strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
    if (ioctl(fd, SIOCGIFMTU, &ifr) < 0) return 1500;
    return ifr.ifr_mtu;
}

/* Sends one buffer (virtio_net_hdr + frame); prints the outcome and the frames that left. */
static void attempt(int fd, struct sockaddr_ll *to, const char *ifname, const char *what,
                    struct virtio_net_hdr *vh, uint8_t *frame, size_t len) {
    static uint8_t buf[70000];
    memcpy(buf, vh, sizeof *vh);
    memcpy(buf + sizeof *vh, frame, len);
    long before = tx_packets(ifname);
    ssize_t n = sendto(fd, buf, sizeof *vh + len, 0, (struct sockaddr *)to, sizeof *to);
    int err = errno;
    usleep(100000);
    long after = tx_packets(ifname);
    if (n < 0)
        printf("%-58s refused: %s (errno %d), frames sent: %ld\n", what, strerror(err), err,
               after - before);
    else
        printf("%-58s accepted (%zd bytes), frames sent: %ld\n", what, n, after - before);
}

static uint16_t ip_checksum(const void *p, size_t len) {
    const uint16_t *w = p;
    uint32_t sum = 0;
    for (; len > 1; len -= 2) sum += *w++;
    if (len) sum += *(const uint8_t *)w;
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s IFACE DSTMAC\n", argv[0]);
        return 2;
    }
    const char *ifname = argv[1];
    unsigned m[6];
    if (sscanf(argv[2], "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6) {
        fprintf(stderr, "bad MAC %s\n", argv[2]);
        return 2;
    }
    int fd = socket(AF_PACKET, SOCK_RAW, 0);
    if (fd < 0) {
        perror("socket(AF_PACKET) (needs CAP_NET_RAW)");
        return 1;
    }
    int one = 1;
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0) {
        perror("PACKET_VNET_HDR");
        return 1;
    }
    struct sockaddr_ll to = {0};
    to.sll_family = AF_PACKET;
    to.sll_ifindex = if_nametoindex(ifname);
    to.sll_halen = 6;
    for (int i = 0; i < 6; i++) to.sll_addr[i] = (uint8_t)m[i];
    if (!to.sll_ifindex) {
        fprintf(stderr, "no interface %s\n", ifname);
        return 1;
    }
    int mtu = mtu_of(fd, ifname);
    static uint8_t frame[9000 + 64];
    struct ether_header *eh = (struct ether_header *)frame;
    memcpy(eh->ether_dhost, to.sll_addr, 6);
    memset(eh->ether_shost, 0x02, 6);
    printf("interface %s, MTU %d, kernel PACKET_VNET_HDR: on\n", ifname, mtu);

    /* 1. An MTU-sized frame of quiver's EtherType, no offload. */
    struct virtio_net_hdr none = {.gso_type = VIRTIO_NET_HDR_GSO_NONE};
    eh->ether_type = htons(QUIVER_ETHERTYPE);
    memset(frame + ETH_HLEN, 0xab, 8000);
    attempt(fd, &to, ifname, "1. EtherType 0x88B5, MTU-sized, no offload", &none, frame,
            ETH_HLEN + mtu);

    /* 2. 8000 bytes of quiver's EtherType, asking the kernel to segment. */
    struct virtio_net_hdr gso = {
        .gso_type = VIRTIO_NET_HDR_GSO_UDP_L4,
        .hdr_len = ETH_HLEN + 36,
        .gso_size = mtu - 36,
    };
    attempt(fd, &to, ifname, "2a. EtherType 0x88B5, 8000 B, gso_type UDP_L4", &gso, frame,
            ETH_HLEN + 8000);
    gso.gso_type = VIRTIO_NET_HDR_GSO_TCPV4;
    attempt(fd, &to, ifname, "2b. EtherType 0x88B5, 8000 B, gso_type TCPV4", &gso, frame,
            ETH_HLEN + 8000);
    gso.gso_type = VIRTIO_NET_HDR_GSO_UDP_L4;
    gso.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    gso.csum_start = ETH_HLEN;
    gso.csum_offset = 0;
    attempt(fd, &to, ifname, "2c. EtherType 0x88B5, 8000 B, UDP_L4 + NEEDS_CSUM", &gso, frame,
            ETH_HLEN + 8000);

    /* 3. The same payload as IPv4/UDP: what the offload is made for. */
    size_t payload = 8000;
    eh->ether_type = htons(ETHERTYPE_IP);
    struct iphdr *ip = (struct iphdr *)(frame + ETH_HLEN);
    memset(ip, 0, sizeof *ip);
    ip->version = 4;
    ip->ihl = 5;
    ip->ttl = 64;
    ip->protocol = IPPROTO_UDP;
    ip->tot_len = htons(sizeof *ip + sizeof(struct udphdr) + payload);
    ip->saddr = htonl(0x0a4d0001);
    ip->daddr = htonl(0x0a4d0002);
    ip->check = ip_checksum(ip, sizeof *ip);
    struct udphdr *udp = (struct udphdr *)(ip + 1);
    udp->source = htons(9);
    udp->dest = htons(9);
    udp->len = htons(sizeof *udp + payload);
    udp->check = 0;
    memset(udp + 1, 0xcd, payload);
    struct virtio_net_hdr ipgso = {
        .flags = VIRTIO_NET_HDR_F_NEEDS_CSUM,
        .gso_type = VIRTIO_NET_HDR_GSO_UDP_L4,
        .hdr_len = ETH_HLEN + sizeof *ip + sizeof *udp,
        .gso_size = mtu - sizeof *ip - sizeof *udp,
        .csum_start = ETH_HLEN + sizeof *ip,
        .csum_offset = offsetof(struct udphdr, check),
    };
    attempt(fd, &to, ifname, "3. IPv4/UDP, 8000 B payload, gso_type UDP_L4", &ipgso, frame,
            ETH_HLEN + sizeof *ip + sizeof *udp + payload);
    close(fd);
    return 0;
}
