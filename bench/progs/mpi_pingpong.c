/* A blocking MPI ping-pong of N bytes, ITERS round trips (rank 0 sends first): the
 * smallest program that shows what an MPI library adds to each MPI_Send and MPI_Recv
 * (run one rank under callgrind; docs/PERFORMANCE.md, "The MPI layer's instructions").
 * With a third argument `pingping`, both ranks post MPI_Irecv, MPI_Send and MPI_Wait at
 * once, as IMB-P2P's PingPing does. The send and receive buffers are apart, from malloc,
 * or from MPI_Alloc_mem (as IMB-P2P's) when MPI_PINGPONG_ALLOC_MEM is set.
 * Usage: mpi_pingpong N ITERS [pingping] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc < 3) {
        if (rank == 0) fprintf(stderr, "usage: mpi_pingpong N ITERS [pingping]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int n = atoi(argv[1]), iters = atoi(argv[2]);
    if (n < 0 || iters < 0) MPI_Abort(MPI_COMM_WORLD, 2);
    char *buf, *rbuf;
    size_t room = n > 0 ? (size_t)n : 1;
    if (getenv("MPI_PINGPONG_ALLOC_MEM")) {
        MPI_Alloc_mem((MPI_Aint)room, MPI_INFO_NULL, &buf);
        MPI_Alloc_mem((MPI_Aint)room, MPI_INFO_NULL, &rbuf);
    } else {
        buf = malloc(room);
        rbuf = malloc(room);
        if (!buf || !rbuf) MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(buf, 1, room);
    memset(rbuf, 1, room);
    int peer = 1 - rank;
    if (argc > 3 && strcmp(argv[3], "pingping") == 0) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) {
            MPI_Request req;
            MPI_Irecv(rbuf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &req);
            MPI_Send(buf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            MPI_Wait(&req, MPI_STATUS_IGNORE);
        }
        if (rank == 0 && iters > 0)
            printf("pingping %d B: %.3f us per iteration\n", n, (MPI_Wtime() - t0) * 1e6 / iters);
        MPI_Finalize();
        return 0;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(buf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            MPI_Recv(rbuf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(rbuf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        }
    }
    if (rank == 0 && iters > 0)
        printf("pingpong %d B: %.3f us one way\n", n, (MPI_Wtime() - t0) * 1e6 / iters / 2);
    MPI_Finalize();
    return 0;
}
