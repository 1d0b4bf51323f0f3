/* MPI_Bcast measured as bench's ports_bcast example measures quiver's broadcast: rank 0
 * broadcasts, every other rank answers each broadcast (or each window of them) with an
 * empty message to rank 0.
 *   last <size> <median us>  : from MPI_Bcast until rank 0 has every acknowledgement
 *   bw <size> <median MB/s>  : windows of WINDOW broadcasts, one acknowledgement each
 * usage: mpirun -n N mpi_bcast [SIZES [ITERS [WINDOW]]]  (SIZES comma-separated) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n ? v[n / 2] : 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char *sizes = argc > 1 ? argv[1] : "8,1024,65536";
    int iters = argc > 2 ? atoi(argv[2]) : 1000;
    int window = argc > 3 ? atoi(argv[3]) : 16;
    /* The same untimed warm-up as ports_bcast: 2000 broadcasts of 8 bytes. */
    char warm[8] = {0};
    for (int i = 0; i < 2000; i++) {
        MPI_Bcast(warm, 8, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            for (int k = 1; k < n; k++)
                MPI_Recv(NULL, 0, MPI_BYTE, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Send(NULL, 0, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
        }
    }
    char *list = strdup(sizes);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        long size = atol(tok);
        char *buf = malloc(size > 0 ? size : 1);
        memset(buf, 0x5a, size > 0 ? size : 1);
        int warmup = iters / 10;
        double *lat = malloc(sizeof(double) * iters);
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < warmup + iters; i++) {
            double t0 = MPI_Wtime();
            MPI_Bcast(buf, (int)size, MPI_BYTE, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                for (int k = 1; k < n; k++)
                    MPI_Recv(NULL, 0, MPI_BYTE, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (i >= warmup) lat[i - warmup] = (MPI_Wtime() - t0) * 1e6;
            } else {
                MPI_Send(NULL, 0, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
            }
        }
        int windows = iters / window;
        if (windows < 3) windows = 3;
        if (windows > 50) windows = 50;
        double *bw = malloc(sizeof(double) * windows);
        for (int w = 0; w < windows + 1; w++) {
            double t0 = MPI_Wtime();
            for (int k = 0; k < window; k++) MPI_Bcast(buf, (int)size, MPI_BYTE, 0, MPI_COMM_WORLD);
            if (rank == 0) {
                for (int k = 1; k < n; k++)
                    MPI_Recv(NULL, 0, MPI_BYTE, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (w > 0) bw[w - 1] = (double)size * window / (MPI_Wtime() - t0) / 1e6;
            } else {
                MPI_Send(NULL, 0, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
            }
        }
        if (rank == 0) {
            printf("last %ld %.3f\n", size, median(lat, iters));
            printf("bw %ld %.3f\n", size, median(bw, windows));
            fflush(stdout);
        }
        free(lat);
        free(bw);
        free(buf);
    }
    free(list);
    MPI_Finalize();
    return 0;
}
