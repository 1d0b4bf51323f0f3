/* pause_cost: the time of one x86 `pause` instruction (what Rust's
 * std::hint::spin_loop emits), the spin-wait hint in every polling loop of quiver.
 * Prints the mean of 10 million, three times.
 *
 * usage: taskset -c 1 pause_cost   (x86 only)
 */
#define _GNU_SOURCE
#define PROG_NAME "pause_cost"
#define PROG_USAGE "usage: pause_cost\n"
#include "progs.h"

#include <immintrin.h>
#include <stdio.h>

int main(int argc, char **argv) {
    (void)argv;
    if (argc != 1) usage();
    const long n = 10000000;
    for (int r = 0; r < 3; r++) {
        double t = now_ns();
        for (long i = 0; i < n; i++) _mm_pause();
        printf("pause_ns=%.2f\n", (now_ns() - t) / n);
    }
    return 0;
}
