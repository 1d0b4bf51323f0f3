/* An MPI program of the MPI-5 standard ABI (built with MPICH's mpicc_abi, against
 * mpi_abi.h): a ring of messages with every byte checked, wildcards and statuses,
 * non-blocking exchanges, collectives, and one-sided puts, gets and accumulates on
 * windows of both kinds. It runs unchanged on MPICH's libmpi_abi.so.1 and on quiver's.
 * Exits 0 and rank 0 prints "abi: OK" when every check held on every rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static unsigned char pattern(int src, size_t i, int round) {
    return (unsigned char)(src * 131 + i * 7 + round * 13 + (i >> 9));
}

static void ring(void) {
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    size_t sizes[] = {0, 1, 1000, 65536, 1 << 20};
    for (int k = 0; k < 5; k++) {
        size_t n = sizes[k];
        unsigned char *out = malloc(n + 1), *in = malloc(n + 1);
        for (size_t i = 0; i < n; i++) out[i] = pattern(rank, i, k);
        MPI_Status st;
        MPI_Sendrecv(out, (int)n, MPI_BYTE, next, k, in, (int)n, MPI_BYTE, MPI_ANY_SOURCE,
                     MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        int count;
        MPI_Get_count(&st, MPI_BYTE, &count);
        CHECK(st.MPI_SOURCE == prev && st.MPI_TAG == k && count == (int)n,
              "status %d %d %d", st.MPI_SOURCE, st.MPI_TAG, count);
        for (size_t i = 0; i < n; i++)
            if (in[i] != pattern(prev, i, k)) {
                CHECK(0, "ring of %zu bytes: byte %zu", n, i);
                break;
            }
        free(out);
        free(in);
    }
    /* Non-blocking both ways, and a receive from MPI_PROC_NULL. */
    int a = rank, b = -1, c = 7;
    MPI_Request r[3];
    MPI_Irecv(&b, 1, MPI_INT, prev, 5, MPI_COMM_WORLD, &r[0]);
    MPI_Isend(&a, 1, MPI_INT, next, 5, MPI_COMM_WORLD, &r[1]);
    MPI_Irecv(&c, 1, MPI_INT, MPI_PROC_NULL, 5, MPI_COMM_WORLD, &r[2]);
    MPI_Status sts[3];
    MPI_Waitall(3, r, sts);
    CHECK(b == prev && c == 7, "non-blocking: %d %d", b, c);
    CHECK(r[0] == MPI_REQUEST_NULL && r[1] == MPI_REQUEST_NULL, "requests freed");
    CHECK(sts[2].MPI_SOURCE == MPI_PROC_NULL && sts[2].MPI_TAG == MPI_ANY_TAG,
          "MPI_PROC_NULL's status %d %d", sts[2].MPI_SOURCE, sts[2].MPI_TAG);
    /* Collectives. */
    long sum = rank + 1, total = 0;
    MPI_Allreduce(&sum, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(total == (long)size * (size + 1) / 2, "allreduce %ld", total);
    double d = rank;
    MPI_Allreduce(MPI_IN_PLACE, &d, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    CHECK(d == size - 1, "in-place max %g", d);
    int root_val = rank == 0 ? 4242 : 0;
    MPI_Bcast(&root_val, 1, MPI_INT, 0, MPI_COMM_WORLD);
    CHECK(root_val == 4242, "bcast %d", root_val);
}

static void one_sided(void) {
    /* MPI_Win_allocate, fences, puts and gets. */
    int *mem;
    MPI_Win win;
    MPI_Win_allocate(4 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &mem, &win);
    for (int i = 0; i < 4; i++) mem[i] = -1;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int v[2] = {rank * 10, rank * 10 + 1};
    MPI_Win_fence(0, win);
    MPI_Put(v, 2, MPI_INT, next, 1, 2, MPI_INT, win);
    MPI_Win_fence(0, win);
    CHECK(mem[0] == -1 && mem[1] == prev * 10 && mem[2] == prev * 10 + 1 && mem[3] == -1,
          "put: %d %d %d %d", mem[0], mem[1], mem[2], mem[3]);
    int back[2] = {0, 0};
    MPI_Get(back, 2, MPI_INT, next, 1, 2, MPI_INT, win);
    MPI_Win_fence(0, win);
    CHECK(back[0] == v[0] && back[1] == v[1], "get: %d %d", back[0], back[1]);
    MPI_Win_free(&win);
    CHECK(win == MPI_WIN_NULL, "MPI_Win_free sets MPI_WIN_NULL");

    /* MPI_Win_create on MPI_Alloc_mem's memory, passive target, accumulates. */
    long *counter;
    MPI_Alloc_mem(sizeof(long), MPI_INFO_NULL, &counter);
    *counter = 0;
    MPI_Win_create(counter, sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    MPI_Barrier(MPI_COMM_WORLD);
    long one = 1, old;
    for (int k = 0; k < 100; k++) {
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
        MPI_Fetch_and_op(&one, &old, MPI_LONG, 0, 0, MPI_SUM, win);
        MPI_Accumulate(&one, 1, MPI_LONG, 0, 0, 1, MPI_LONG, MPI_SUM, win);
        MPI_Win_unlock(0, win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) CHECK(*counter == 200L * size, "counter %ld", *counter);
    MPI_Win_free(&win);
    MPI_Free_mem(counter);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(provided >= MPI_THREAD_FUNNELED, "thread level %d", provided);
    int major, minor;
    MPI_Abi_get_version(&major, &minor);
    CHECK(major == 1 && minor == 0, "MPI_Abi_get_version %d.%d", major, minor);
    ring();
    one_sided();
    /* An error class of the standard's numbering. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rc = MPI_Send(&major, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD), cls;
    MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_RANK, "a bad rank: class %d, not %d", cls, MPI_ERR_RANK);

    int total;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(lib, &len);
    int quiver = strstr(lib, "quiver") != NULL;
    if (rank == 0 && !total) printf("abi: OK (%d ranks, %s)\n", size, quiver ? "quiver" : "another MPI");
    MPI_Finalize();
    return total ? 1 : 0;
}
