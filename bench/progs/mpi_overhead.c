/* What an MPI library costs per call when nothing waits: one process, ITERS rounds of
 * MPI_Irecv + MPI_Send to itself + MPI_Wait (an 8-byte eager message), then ITERS of
 * MPI_Irecv + MPI_Cancel + MPI_Wait. Prints the time per round of each; run it under
 * callgrind for the instructions of each call (docs/PERFORMANCE.md, "MPI's
 * point-to-point calls, instruction by instruction").
 * Usage: mpi_overhead ITERS   (one rank) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int iters = argc > 1 ? atoi(argv[1]) : 0;
    if (iters <= 0) {
        fprintf(stderr, "usage: mpi_overhead ITERS\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char out[8] = {0}, in[8];
    MPI_Request req;
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        MPI_Irecv(in, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD, &req);
        MPI_Send(out, 8, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
    double t1 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        MPI_Irecv(in, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &req);
        MPI_Cancel(&req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
    double t2 = MPI_Wtime();
    printf("irecv+send+wait %.3f us, irecv+cancel+wait %.3f us per round\n",
           (t1 - t0) * 1e6 / iters, (t2 - t1) * 1e6 / iters);
    MPI_Finalize();
    return 0;
}
