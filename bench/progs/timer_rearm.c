/* What arming a kernel high-resolution timer costs on this machine. A shaping qdisc
 * (tbf) arms one (its watchdog) whenever it holds a frame back for want of tokens, and
 * the timer it arms is almost always the earliest one of the CPU, so the kernel must
 * reprogram the CPU's timer device; in a virtual machine that write leaves the guest.
 *
 * Measures, with timerfd_settime on CLOCK_MONOTONIC, the cost of one call that
 *   1. re-arms a timer 50 us ahead (the earliest timer of the CPU: the device is
 *      reprogrammed),
 *   2. re-arms it 10 s ahead (not the earliest: no reprogramming),
 * and of a trivial system call (getppid) for scale.
 *
 * usage: timer_rearm [CPU]        (pins to CPU when given)
 */
#define _GNU_SOURCE
#define PROG_NAME "timer_rearm"
#define PROG_USAGE "usage: timer_rearm [CPU]\n"
#include "progs.h"

#include <sys/timerfd.h>
#include <unistd.h>

#define CALLS 200000

int main(int argc, char **argv) {
    int cpu = -1;
    if (argc > 2) usage();
    if (argc == 2 && parse_cpu(argv[1], &cpu)) bad_usage("bad CPU '%s'", argv[1]);
    if (pin_cpu(cpu)) die_errno("pinning to CPU %d", cpu);
    int fd = timerfd_create(CLOCK_MONOTONIC, 0);
    if (fd < 0) die_errno("timerfd_create");
    struct itimerspec when = {0};

    double t0 = now_s();
    for (int i = 0; i < CALLS; i++) {
        /* vary the expiry so that no call finds the timer already set there */
        when.it_value.tv_sec = 0;
        when.it_value.tv_nsec = 50000 + (i & 1023);
        if (timerfd_settime(fd, 0, &when, NULL)) die_errno("timerfd_settime");
    }
    double t1 = now_s();
    for (int i = 0; i < CALLS; i++) {
        when.it_value.tv_sec = 10;
        when.it_value.tv_nsec = i & 1023;
        if (timerfd_settime(fd, 0, &when, NULL)) die_errno("timerfd_settime");
    }
    double t2 = now_s();
    for (int i = 0; i < CALLS; i++) (void)getppid();
    double t3 = now_s();

    printf("re-arm, earliest timer (+50 us): %.2f us per call\n", (t1 - t0) / CALLS * 1e6);
    printf("re-arm, not the earliest (+10 s): %.2f us per call\n", (t2 - t1) / CALLS * 1e6);
    printf("getppid:                         %.2f us per call\n", (t3 - t2) / CALLS * 1e6);
    return 0;
}
