/* osu_mpi: OSU-style MPI point-to-point latency and uni-directional bandwidth between
 * exactly 2 ranks (the MPI library's own choice of transport: shared memory, CMA, TCP, UCX..).
 *
 * How (both tests, per size S; rank 0 measures and prints, with clock_gettime(CLOCK_MONOTONIC)):
 *   lat: ping-pong with MPI_Send / MPI_Recv. Calibration chunks of k round trips
 *        (k = 10, 20, 40, ... until one chunk takes >= SECONDS/20 on rank 0),
 *        est = chunk time / k, N = clamp(SECONDS / est, 20, 10^7) (rank 0 decides and
 *        broadcasts), then max(100, N/10) untimed warm-up round trips and N timed ones,
 *        each round trip timed on its own. One-way = round trip / 2.
 *   bw:  window W = max(1, min(64, WINDOW_BYTES / S)). One window: rank 0 posts W
 *        MPI_Isend of S bytes and MPI_Waitall; rank 1 posts W MPI_Irecv, MPI_Waitall,
 *        then sends a 4-byte ack that rank 0 receives. Calibration chunks of k windows
 *        (k = 1, 2, 4, ...; the first one is the warm-up window) until one takes
 *        >= SECONDS/20, then N = clamp(SECONDS / est, 2, 10^7) timed windows after a
 *        barrier. MBps = N*W*S / time / 10^6.
 *   match: lat at 8 B while each rank holds N operations the ping-pong does not match,
 *        in QUEUE: posted (N MPI_Irecv from the peer, tags 1000..), wildcard (N MPI_Irecv
 *        from MPI_ANY_SOURCE, tags 1000..) or unexpected (N 8-byte MPI_Isend to the peer,
 *        tags 1000.., followed by a control message each way so they have arrived).
 *        Afterwards the receives are cancelled, the messages received (last first).
 *        As `quiver bench match`.
 *   Send and receive buffers (page aligned) are allocated once for the largest size and
 *   touched; all messages of a window use the same buffer (as OSU does).
 *
 * Usage:  mpirun -n 2 osu_mpi lat SIZES SECONDS
 *         mpirun -n 2 osu_mpi bw  SIZES SECONDS WINDOW_BYTES
 *         mpirun -n 2 osu_mpi match posted|wildcard|unexpected N SECONDS
 *         SIZES: comma-separated byte counts, each 1 .. 1073741824 (e.g. 8,1024,65536)
 *         SECONDS: target time per size (0 < SECONDS <= 3600)   WINDOW_BYTES: >= 1
 * Output (stdout of rank 0, one line per size, in the order given):
 *         lat size=S oneway_us_median=X oneway_us_mean=Y iters=N    (us, 3 decimals)
 *         bw size=S MBps=X window=W iters=N                          (N = timed windows)
 *         match queue=Q outstanding=N, then the lat line of size 8
 * Errors: message (and usage) on stderr from rank 0, every rank exits 1.
 */
#define _GNU_SOURCE
#include <mpi.h>

#define PROG_NAME "osu_mpi"
#define PROG_USAGE \
    "usage: mpirun -n 2 osu_mpi lat SIZES SECONDS\n" \
    "       mpirun -n 2 osu_mpi bw SIZES SECONDS WINDOW_BYTES\n" \
    "       mpirun -n 2 osu_mpi match posted|wildcard|unexpected N SECONDS\n" \
    "  SIZES: comma-separated byte counts (1..1073741824), e.g. 8,1024,65536\n" \
    "  SECONDS: target time per size (> 0)\n" \
    "output: lat size=S oneway_us_median=X oneway_us_mean=Y iters=N\n" \
    "        bw size=S MBps=X window=W iters=N\n"
#include "progs.h"

#define TAG_LAT 1
#define TAG_BW 100
#define TAG_ACK 101

static int rank;
static char *sbuf, *rbuf;
static MPI_Request req[MAX_WINDOW];
/* a real status array, not MPI_STATUSES_IGNORE: with MPICH's headers (where it is
 * (MPI_Status *)1) gcc 12 warns -Wstringop-overflow on MPI_Waitall */
static MPI_Status stat[MAX_WINDOW];

/* rank 0 prints the message (and the usage); every rank finalizes; returns main's exit code */
static int fail(const char *msg, int show_usage) {
    if (rank == 0) {
        fprintf(stderr, PROG_NAME ": %s\n", msg);
        if (show_usage) fputs(PROG_USAGE, stderr);
    }
    MPI_Finalize();
    return 1;
}

/* rank 0 decides whether calibration goes on; both ranks learn it */
static int more(double t, double seconds, long k) {
    int m = rank == 0 && calib_more(t, seconds, k);
    MPI_Bcast(&m, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return m;
}

/* rank 0 turns an estimate into an iteration count; both ranks learn it */
static long plan(double est, double seconds, long lo) {
    long n = rank == 0 ? clamp_iters(seconds, est, lo) : 0;
    MPI_Bcast(&n, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    return n;
}

/* count round trips of s bytes; rank 0: returns the total time, per-trip times into out */
static double lat_chunk(int s, long count, double *out) {
    double total = 0;
    for (long i = 0; i < count; i++) {
        if (rank == 0) {
            double t0 = now_s();
            MPI_Send(sbuf, s, MPI_CHAR, 1, TAG_LAT, MPI_COMM_WORLD);
            MPI_Recv(rbuf, s, MPI_CHAR, 1, TAG_LAT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            double t = now_s() - t0;
            if (out) out[i] = t;
            total += t;
        } else {
            MPI_Recv(rbuf, s, MPI_CHAR, 0, TAG_LAT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, s, MPI_CHAR, 0, TAG_LAT, MPI_COMM_WORLD);
        }
    }
    return total;
}

/* lat_chunk for calibrate() (w unused) */
static double lat_calib(size_t size, int w, long count) {
    (void)w;
    return lat_chunk((int)size, count, NULL);
}

static void lat_size(int s, double seconds) {
    long iters = plan(calibrate(lat_calib, (size_t)s, 0, 10, seconds, more), seconds, 20);
    long warm = lat_warmup(iters);
    double *lat = NULL;
    if (rank == 0 && !(lat = malloc(sizeof(double) * (size_t)iters))) {
        fprintf(stderr, "osu_mpi: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    lat_chunk(s, warm, NULL);
    lat_chunk(s, iters, lat);
    if (rank == 0) {
        print_lat((size_t)s, lat, iters);
        free(lat);
    }
}

/* count windows of w messages of size bytes, each acknowledged; rank 0: returns the time */
static double bw_chunk(size_t size, int w, long count) {
    int s = (int)size;
    char ack[4] = {0};
    double t0 = now_s();
    for (long i = 0; i < count; i++) {
        if (rank == 0) {
            for (int j = 0; j < w; j++) MPI_Isend(sbuf, s, MPI_CHAR, 1, TAG_BW, MPI_COMM_WORLD, &req[j]);
            MPI_Waitall(w, req, stat);
            MPI_Recv(ack, 4, MPI_CHAR, 1, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int j = 0; j < w; j++) MPI_Irecv(rbuf, s, MPI_CHAR, 0, TAG_BW, MPI_COMM_WORLD, &req[j]);
            MPI_Waitall(w, req, stat);
            MPI_Send(ack, 4, MPI_CHAR, 0, TAG_ACK, MPI_COMM_WORLD);
        }
    }
    return now_s() - t0;
}

static void bw_size(int s, double seconds, unsigned long long window_bytes) {
    int w = window_count(window_bytes, (size_t)s);
    long n = plan(calibrate(bw_chunk, (size_t)s, w, 1, seconds, more), seconds, 2);
    MPI_Barrier(MPI_COMM_WORLD);
    double t = bw_chunk((size_t)s, w, n);
    if (rank == 0) print_bw((size_t)s, w, n, t);
}

/* lat at 8 B with n operations outstanding in queue q (see the top of the file) */
static int match_test(const char *q, long n, double seconds) {
    int peer = 1 - rank, posted = !strcmp(q, "posted"), wild = !strcmp(q, "wildcard");
    if (!posted && !wild && strcmp(q, "unexpected")) return fail("QUEUE must be posted, wildcard or unexpected", 1);
    char *idle = calloc((size_t)n + 1, 8);
    MPI_Request *reqs = calloc((size_t)n + 1, sizeof(MPI_Request));
    if (!idle || !reqs) return fail("out of memory", 0);
    if (posted || wild) {
        for (long i = 0; i < n; i++)
            MPI_Irecv(idle + 8 * i, 8, MPI_CHAR, wild ? MPI_ANY_SOURCE : peer, 1000 + (int)i, MPI_COMM_WORLD, &reqs[i]);
    } else {
        char ctl = 0;
        memset(idle, 0x33, (size_t)n * 8);
        if (rank == 1) MPI_Recv(&ctl, 1, MPI_CHAR, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (long i = 0; i < n; i++)
            MPI_Isend(idle + 8 * i, 8, MPI_CHAR, peer, 1000 + (int)i, MPI_COMM_WORLD, &reqs[i]);
        MPI_Send(&ctl, 1, MPI_CHAR, peer, 2, MPI_COMM_WORLD);
        if (rank == 0) MPI_Recv(&ctl, 1, MPI_CHAR, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (rank == 0) printf("match queue=%s outstanding=%ld\n", q, n);
    lat_size(8, seconds);
    if (posted || wild) {
        for (long i = 0; i < n; i++) {
            MPI_Cancel(&reqs[i]);
            MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
        }
    } else {
        char got[8];
        for (long i = n - 1; i >= 0; i--) {
            MPI_Recv(got, 8, MPI_CHAR, peer, 1000 + (int)i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (memcmp(got, "33333333", 8) != 0) {
                fprintf(stderr, "osu_mpi: rank %d: outstanding message %ld corrupted\n", rank, i);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
        for (long i = 0; i < n; i++) MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
    }
    free(idle);
    free(reqs);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int np;
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (np != 2) return fail("needs exactly 2 ranks (mpirun -n 2)", 0);
    if (argc < 2) return fail("missing test", 1);
    if (!strcmp(argv[1], "match")) {
        unsigned long long n;
        double seconds;
        if (argc != 5) return fail("wrong number of arguments", 1);
        if (parse_ull(argv[3], 0, 1000000, &n)) return fail("bad N", 1);
        if (parse_seconds(argv[4], &seconds)) return fail("bad SECONDS", 1);
        if (posix_memalign((void **)&sbuf, 4096, 8) || posix_memalign((void **)&rbuf, 4096, 8))
            return fail("out of memory", 0);
        return match_test(argv[2], (long)n, seconds);
    }
    int bw;
    if (!strcmp(argv[1], "lat")) bw = 0;
    else if (!strcmp(argv[1], "bw")) bw = 1;
    else return fail("test must be lat, bw or match", 1);
    if (argc != (bw ? 5 : 4)) return fail("wrong number of arguments", 1);
    static size_t sizes[MAX_SIZES];
    int nsizes;
    double seconds;
    unsigned long long window_bytes = 0;
    if (parse_sizes(argv[2], sizes, &nsizes)) return fail("bad SIZES", 1);
    if (parse_seconds(argv[3], &seconds)) return fail("bad SECONDS", 1);
    if (bw && parse_ull(argv[4], 1, 1ull << 40, &window_bytes)) return fail("bad WINDOW_BYTES", 1);

    size_t max = 1;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > max) max = sizes[i];
    if (posix_memalign((void **)&sbuf, 4096, max) || posix_memalign((void **)&rbuf, 4096, max)) {
        fprintf(stderr, "osu_mpi: rank %d: cannot allocate %zu bytes\n", rank, max);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(sbuf, 'a', max);
    memset(rbuf, 'b', max);
    for (int i = 0; i < nsizes; i++) {
        if (bw) bw_size((int)sizes[i], seconds, window_bytes);
        else lat_size((int)sizes[i], seconds);
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
