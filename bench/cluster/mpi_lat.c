/* MPI ping-pong over a list of message sizes, each round trip timed on its own, for
 * bench/cluster.sh: the half-power curve of GAMMA's Figure 1 needs one message in flight
 * and the same sizes and the same statistic (median) as `quiver bench pingpong`.
 * (The anchors' mpi/pingpong.c reports the mean over powers of two only.)
 * usage: mpi_lat SIZES [T] [MIN_ITERS]
 *   SIZES     comma-separated byte counts, e.g. 8,12,16,24
 *   T         seconds of timed round trips per size (default 0.25)
 *   MIN_ITERS at least this many timed round trips per size (default 30)
 * Per size: 10 untimed round trips, one more to estimate the cost, then the timed ones.
 * Output from rank 0: "lat SIZE MEDIAN_US MEAN_US AVG80_US ITERS" (one-way = round trip / 2;
 * AVG80 = mean of the middle 80 % of the round trips, as `quiver bench` reports). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank;
static char *buf;

static double round_trip(size_t sz) {
    double t0 = MPI_Wtime();
    if (rank == 0) {
        MPI_Send(buf, sz, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
        MPI_Recv(buf, sz, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(buf, sz, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf, sz, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
    }
    return MPI_Wtime() - t0;
}
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int np; MPI_Comm_size(MPI_COMM_WORLD, &np); MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (np != 2 || argc < 2) { if (!rank) fprintf(stderr, "usage: mpirun -n 2 mpi_lat SIZES [T] [MIN_ITERS]\n"); MPI_Abort(MPI_COMM_WORLD, 2); }
    double T = argc > 2 ? atof(argv[2]) : 0.25;
    long min_it = argc > 3 ? atol(argv[3]) : 30;
    size_t sizes[256]; int ns = 0; size_t mx = 1;
    for (char *p = strtok(argv[1], ","); p && ns < 256; p = strtok(NULL, ",")) {
        sizes[ns] = strtoul(p, NULL, 0);
        if (sizes[ns] > mx) mx = sizes[ns];
        ns++;
    }
    buf = malloc(mx); memset(buf, 'a', mx);
    for (int k = 0; k < ns; k++) {
        size_t s = sizes[k];
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < 10; i++) round_trip(s);
        double est = round_trip(s);
        long it = est > 0 ? (long)(T / est) : 1000000;
        if (it < min_it) it = min_it;
        if (it > 1000000) it = 1000000;
        MPI_Bcast(&it, 1, MPI_LONG, 0, MPI_COMM_WORLD);
        double *t = malloc(sizeof(double) * it), sum = 0;
        for (long i = 0; i < it; i++) { t[i] = round_trip(s); sum += t[i]; }
        if (!rank) {
            qsort(t, it, sizeof(double), cmp);
            long lo = it / 10, hi = it - it / 10;
            double mid = 0;
            for (long i = lo; i < hi; i++) mid += t[i];
            printf("lat %zu %.3f %.3f %.3f %ld\n", s, t[it / 2] / 2 * 1e6, sum / it / 2 * 1e6,
                   mid / (hi - lo) / 2 * 1e6, it);
            fflush(stdout);
        }
        free(t);
    }
    MPI_Finalize();
    return 0;
}
