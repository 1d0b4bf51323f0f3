/* A blocking MPI ping-pong of N bytes, ITERS round trips (rank 0 sends first): the
 * smallest program that shows what an MPI library adds to each MPI_Send and MPI_Recv
 * (run one rank under callgrind; docs/PERFORMANCE.md, "The MPI layer's instructions").
 * Usage: mpi_pingpong N ITERS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc < 3) {
        if (rank == 0) fprintf(stderr, "usage: mpi_pingpong N ITERS\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int n = atoi(argv[1]), iters = atoi(argv[2]);
    if (n < 0 || n > 65536 || iters < 0) MPI_Abort(MPI_COMM_WORLD, 2);
    static char buf[65536];
    int peer = 1 - rank;
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(buf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        }
    }
    MPI_Finalize();
    return 0;
}
