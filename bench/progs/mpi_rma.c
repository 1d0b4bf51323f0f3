/* One-sided operations with MPI (passive target, MPI_Win_lock_all), the counterpart of
 * crates/quiver/examples/rma_bench.rs: rank 0 works on rank 1's window while rank 1
 * waits in MPI_Barrier (which makes progress). Prints lines as rma_bench's JSON:
 *   8-byte MPI_Put + MPI_Win_flush, 8-byte MPI_Get + flush, MPI_Fetch_and_op (sum) +
 *   flush: medians of ITERS in µs; MPI_Barrier on every rank (the slowest rank's median); per size, REPS puts then one flush (median of 5
 *   rounds) and one get + flush (median of REPS), in MB/s.
 * usage: mpirun -n 2 mpi_rma [SIZES [ITERS [REPS]]] */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) { qsort(v, n, sizeof *v, cmp); return v[n / 2]; }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *sizes_arg = argc > 1 ? argv[1] : "65536,1048576,16777216";
    int iters = argc > 2 ? atoi(argv[2]) : 10000, reps = argc > 3 ? atoi(argv[3]) : 20;
    long sizes[16]; int ns = 0; long largest = 64;
    char *s = strdup(sizes_arg);
    for (char *t = strtok(s, ","); t && ns < 16; t = strtok(NULL, ",")) {
        sizes[ns] = atol(t); if (sizes[ns] > largest) largest = sizes[ns]; ns++;
    }
    char *base; MPI_Win win;
    MPI_Win_allocate(largest, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    memset(base, 0, largest);
    MPI_Barrier(MPI_COMM_WORLD);
    {
        double *b = malloc(sizeof(double) * iters);
        for (int i = 0; i < 1000; i++) MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < iters; i++) {
            double t = MPI_Wtime();
            MPI_Barrier(MPI_COMM_WORLD);
            b[i] = (MPI_Wtime() - t) * 1e6;
        }
        /* The slowest rank's median, as quiver's examples report theirs. */
        double mine = median(b, iters), slowest = 0;
        MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("{\"bench\":\"rma_barrier\",\"size\":0,\"barrier_us\":%.3f}\n", slowest);
        free(b);
    }
    if (rank == 0) {
        char *data = malloc(largest), *back = malloc(largest);
        memset(data, 7, largest);
        double *v = malloc(sizeof(double) * (iters > reps ? iters : reps));
        uint64_t w = 0, one = 1, old;
        MPI_Win_lock_all(0, win);
        for (int i = 0; i < 1000; i++) { MPI_Put(&w, 8, MPI_BYTE, 1, 0, 8, MPI_BYTE, win); MPI_Win_flush(1, win); }
        for (int i = 0; i < iters; i++) {
            double t = MPI_Wtime();
            MPI_Put(&w, 8, MPI_BYTE, 1, 0, 8, MPI_BYTE, win); MPI_Win_flush(1, win);
            v[i] = (MPI_Wtime() - t) * 1e6;
        }
        double put = median(v, iters);
        for (int i = 0; i < iters; i++) {
            double t = MPI_Wtime();
            MPI_Get(&w, 8, MPI_BYTE, 1, 0, 8, MPI_BYTE, win); MPI_Win_flush(1, win);
            v[i] = (MPI_Wtime() - t) * 1e6;
        }
        double get = median(v, iters);
        for (int i = 0; i < iters; i++) {
            double t = MPI_Wtime();
            MPI_Fetch_and_op(&one, &old, MPI_UINT64_T, 1, 8, MPI_SUM, win); MPI_Win_flush(1, win);
            v[i] = (MPI_Wtime() - t) * 1e6;
        }
        printf("{\"bench\":\"rma_latency\",\"size\":8,\"put_us\":%.3f,\"get_us\":%.3f,\"fadd_us\":%.3f}\n",
               put, get, median(v, iters));
        for (int k = 0; k < ns; k++) {
            long n = sizes[k];
            double r[5];
            for (int j = 0; j < 5; j++) {
                double t = MPI_Wtime();
                for (int i = 0; i < reps; i++) MPI_Put(data, n, MPI_BYTE, 1, 0, n, MPI_BYTE, win);
                MPI_Win_flush(1, win);
                r[j] = (double)n * reps / (MPI_Wtime() - t) / 1e6;
            }
            for (int i = 0; i < reps; i++) {
                double t = MPI_Wtime();
                MPI_Get(back, n, MPI_BYTE, 1, 0, n, MPI_BYTE, win); MPI_Win_flush(1, win);
                v[i] = (double)n / (MPI_Wtime() - t) / 1e6;
            }
            for (long i = 0; i < n; i++) if (back[i] != 7) { fprintf(stderr, "bad byte\n"); return 1; }
            printf("{\"bench\":\"rma_bw\",\"size\":%ld,\"put_MBps\":%.0f,\"get_MBps\":%.0f}\n", n, median(r, 5), median(v, reps));
        }
        MPI_Win_unlock_all(win);
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);
    MPI_Finalize();
    return 0;
}
