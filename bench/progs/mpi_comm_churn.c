/* Communicators made and freed one after the other: ROUNDS of MPI_Comm_dup of
 * MPI_COMM_WORLD, one MPI_Sendrecv round the ring on it (its value checked), then
 * MPI_Comm_free. Prints the mean time per round, and the mean of each call over the
 * rounds after the first (which may open endpoints the later ones reuse).
 * Usage: mpi_comm_churn ROUNDS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int n = argc > 1 ? atoi(argv[1]) : 0;
    if (n < 2) {
        if (rank == 0) fprintf(stderr, "usage: mpi_comm_churn ROUNDS (at least 2)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double dup = 0, sendrecv = 0, free_ = 0, t0 = MPI_Wtime();
    for (int i = 0; i < n; i++) {
        MPI_Comm c;
        double a = MPI_Wtime();
        MPI_Comm_dup(MPI_COMM_WORLD, &c);
        double b = MPI_Wtime();
        int v = i * 10 + rank, got = -1, left = (rank + size - 1) % size;
        MPI_Sendrecv(&v, 1, MPI_INT, (rank + 1) % size, 7, &got, 1, MPI_INT, left, 7, c,
                     MPI_STATUS_IGNORE);
        if (got != i * 10 + left) {
            fprintf(stderr, "rank %d: round %d got %d\n", rank, i, got);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        double d = MPI_Wtime();
        MPI_Comm_free(&c);
        double e = MPI_Wtime();
        if (i > 0) {
            dup += b - a;
            sendrecv += d - b;
            free_ += e - d;
        }
    }
    if (rank == 0)
        printf("%d rounds: %.1f us each; after the first: dup %.1f us, sendrecv %.1f us, "
               "free %.1f us\n",
               n, (MPI_Wtime() - t0) * 1e6 / n, dup * 1e6 / (n - 1), sendrecv * 1e6 / (n - 1),
               free_ * 1e6 / (n - 1));
    MPI_Finalize();
    return 0;
}
