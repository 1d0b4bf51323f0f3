/* An MPI program that checks what it receives, byte by byte: point-to-point (sizes from
 * 0 to 4 MiB, wildcards, MPI's order, non-blocking, derived datatypes, synchronous
 * sends that complete only once received), collectives
 * (every one IMB-MPI1 runs, a non-commutative user operation among them), communicator
 * splits and error codes. Built with MPICH's mpicc, it runs unchanged on MPICH's
 * libmpi.so.12 and on quiver's: its checks hold on both. Exits 0 and rank 0 prints
 * "verify: OK" when every check held on every rank. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static unsigned char pattern(int src, int dst, size_t i, int round) {
    return (unsigned char)(src * 131 + dst * 31 + i * 7 + round * 13 + (i >> 9));
}

/* The text of an error code. */
static const char *error_text(int rc) {
    static char text[MPI_MAX_ERROR_STRING];
    int len;
    MPI_Error_string(rc, text, &len);
    return text;
}

static void fill(unsigned char *b, size_t n, int src, int dst, int round) {
    for (size_t i = 0; i < n; i++) b[i] = pattern(src, dst, i, round);
}

static size_t bad_byte(const unsigned char *b, size_t n, int src, int dst, int round) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != pattern(src, dst, i, round)) return i;
    return (size_t)-1;
}

/* A number written in decimal digits and 10 to the power of its digit count. */
typedef struct {
    long value, scale;
} digits_t;

/* An associative, non-commutative operation: the digits of `in`, then those of
 * `inout` (so the result of a reduction spells the ranks' digits in rank order). */
static void digits(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    digits_t *a = in, *b = inout;
    for (int i = 0; i < *len; i++) {
        b[i].value = a[i].value * b[i].scale + b[i].value;
        b[i].scale = a[i].scale * b[i].scale;
    }
}

static void point_to_point(void) {
    const size_t sizes[] = {0, 1, 7, 64, 1000, 4096, 65539, 1 << 20, (4 << 20) + 5};
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int k = 0; k < (int)(sizeof sizes / sizeof *sizes); k++) {
        size_t n = sizes[k];
        unsigned char *out = malloc(n + 1), *in = malloc(n + 1);
        fill(out, n, rank, right, k);
        memset(in, 0xEE, n + 1);
        MPI_Status st;
        int rc = MPI_Sendrecv(out, (int)n, MPI_BYTE, right, k, in, (int)n + 1, MPI_BYTE, left, k,
                              MPI_COMM_WORLD, &st);
        CHECK(rc == MPI_SUCCESS, "sendrecv of %zu bytes: %s", n, error_text(rc));
        int got = -1;
        MPI_Get_count(&st, MPI_BYTE, &got);
        CHECK(got == (int)n, "count %d, not %zu", got, n);
        CHECK(st.MPI_SOURCE == left && st.MPI_TAG == k, "status %d/%d", st.MPI_SOURCE, st.MPI_TAG);
        size_t at = bad_byte(in, n, left, rank, k);
        CHECK(at == (size_t)-1, "%zu bytes from %d: byte %zu is wrong", n, left, at);
        CHECK(in[n] == 0xEE, "a byte past the message was written");
        free(out);
        free(in);
    }

    /* Wildcards and MPI's order: every other rank sends 50 numbered messages to rank 0,
     * which receives them with MPI_ANY_SOURCE and MPI_ANY_TAG. */
    enum { N = 50 };
    if (rank == 0) {
        int next[64] = {0};
        for (int m = 0; m < N * (size - 1); m++) {
            int v[2];
            MPI_Status st;
            MPI_Recv(v, 2, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            CHECK(v[0] == st.MPI_SOURCE, "message says it is from %d, status %d", v[0], st.MPI_SOURCE);
            CHECK(v[1] == next[st.MPI_SOURCE], "from %d: message %d before %d", v[0], v[1], next[st.MPI_SOURCE]);
            CHECK(st.MPI_TAG == 100 + v[1] % 3, "tag %d", st.MPI_TAG);
            next[st.MPI_SOURCE] = v[1] + 1;
        }
    } else {
        MPI_Request reqs[N];
        int v[N][2];
        for (int m = 0; m < N; m++) {
            v[m][0] = rank;
            v[m][1] = m;
            MPI_Isend(v[m], 2, MPI_INT, 0, 100 + m % 3, MPI_COMM_WORLD, &reqs[m]);
        }
        MPI_Waitall(N, reqs, MPI_STATUSES_IGNORE);
    }
    /* Rank 0's wildcard receives must not meet the next phase's messages. */
    MPI_Barrier(MPI_COMM_WORLD);

    /* Non-blocking exchange with everyone, 100 KB each, received in any order. */
    size_t n = 100000;
    unsigned char *out = malloc(n * size), *in = malloc(n * size);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * 2 * size);
    for (int p = 0; p < size; p++) {
        fill(out + p * n, n, rank, p, 77);
        MPI_Irecv(in + p * n, (int)n, MPI_BYTE, p, 77, MPI_COMM_WORLD, &reqs[p]);
    }
    for (int p = 0; p < size; p++) MPI_Isend(out + p * n, (int)n, MPI_BYTE, p, 77, MPI_COMM_WORLD, &reqs[size + p]);
    for (int done = 0; done < 2 * size; done++) {
        int idx;
        int rc = MPI_Waitany(2 * size, reqs, &idx, MPI_STATUS_IGNORE);
        CHECK(rc == MPI_SUCCESS, "waitany: %s", error_text(rc));
    }
    for (int p = 0; p < size; p++) {
        size_t at = bad_byte(in + p * n, n, p, rank, 77);
        CHECK(at == (size_t)-1, "exchange from %d: byte %zu", p, at);
    }
    free(out);
    free(in);
    free(reqs);

    /* A vector sent, received contiguous: every other double of 2000. */
    double src[2000], dst[1000];
    for (int i = 0; i < 2000; i++) src[i] = rank * 1e4 + i;
    MPI_Datatype every_other;
    MPI_Type_vector(1000, 1, 2, MPI_DOUBLE, &every_other);
    MPI_Type_commit(&every_other);
    int rc = MPI_Sendrecv(src, 1, every_other, right, 9, dst, 1000, MPI_DOUBLE, left, 9, MPI_COMM_WORLD,
                          MPI_STATUS_IGNORE);
    CHECK(rc == MPI_SUCCESS, "vector sendrecv: %s", error_text(rc));
    for (int i = 0; i < 1000; i++)
        CHECK(dst[i] == left * 1e4 + 2 * i, "vector element %d: %g", i, dst[i]);
    /* And contiguous sent, received into the vector's places. */
    double back[2000];
    for (int i = 0; i < 2000; i++) back[i] = -1;
    rc = MPI_Sendrecv(dst, 1000, MPI_DOUBLE, left, 10, back, 1, every_other, right, 10, MPI_COMM_WORLD,
                      MPI_STATUS_IGNORE);
    CHECK(rc == MPI_SUCCESS, "sendrecv into a vector: %s", error_text(rc));
    for (int i = 0; i < 2000; i++)
        CHECK(back[i] == (i % 2 ? -1 : rank * 1e4 + i), "unpacked element %d: %g", i, back[i]);
    MPI_Type_free(&every_other);

    /* Indexed (in the old type's extents) and hindexed (in bytes): ints 0, 1, 5 and 7. */
    int ints[8], got[4] = {-1, -1, -1, -1};
    for (int i = 0; i < 8; i++) ints[i] = rank * 100 + i;
    int lens[2] = {2, 1}, at[2] = {0, 5};
    MPI_Aint bytes_at[2] = {0, 7 * sizeof(int)};
    int lens2[2] = {0, 1};
    MPI_Datatype idx, hidx;
    MPI_Type_indexed(2, lens, at, MPI_INT, &idx);
    MPI_Type_create_hindexed(2, lens2, bytes_at, MPI_INT, &hidx);
    MPI_Type_commit(&idx);
    MPI_Type_commit(&hidx);
    MPI_Sendrecv(ints, 1, idx, right, 11, got, 3, MPI_INT, left, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Sendrecv(ints, 1, hidx, right, 12, got + 3, 1, MPI_INT, left, 12, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    CHECK(got[0] == left * 100 && got[1] == left * 100 + 1 && got[2] == left * 100 + 5 && got[3] == left * 100 + 7,
          "indexed: %d %d %d %d", got[0], got[1], got[2], got[3]);
    MPI_Type_free(&idx);
    MPI_Type_free(&hidx);
}

static void collectives(MPI_Comm comm) {
    int r, n;
    MPI_Comm_rank(comm, &r);
    MPI_Comm_size(comm, &n);

    size_t big = 1 << 20;
    unsigned char *b = malloc(big);
    int root = n - 1;
    if (r == root) fill(b, big, root, 0, 5); else memset(b, 0, big);
    MPI_Bcast(b, (int)big, MPI_BYTE, root, comm);
    CHECK(bad_byte(b, big, root, 0, 5) == (size_t)-1, "bcast");
    free(b);

    long v[3] = {r + 1, 2 * r, -r}, sum[3] = {0};
    MPI_Reduce(v, sum, 3, MPI_LONG, MPI_SUM, 0, comm);
    if (r == 0)
        CHECK(sum[0] == (long)n * (n + 1) / 2 && sum[1] == (long)n * (n - 1) && sum[2] == -(long)n * (n - 1) / 2,
              "reduce %ld %ld %ld", sum[0], sum[1], sum[2]);

    double d = r * 1.5, mx = 0;
    MPI_Allreduce(&d, &mx, 1, MPI_DOUBLE, MPI_MAX, comm);
    CHECK(mx == (n - 1) * 1.5, "allreduce max %g", mx);
    int inplace = r;
    MPI_Allreduce(MPI_IN_PLACE, &inplace, 1, MPI_INT, MPI_SUM, comm);
    CHECK(inplace == n * (n - 1) / 2, "in-place allreduce %d", inplace);

    struct { double value; int index; } loc = {(double)(r % 2), r}, best;
    MPI_Allreduce(&loc, &best, 1, MPI_DOUBLE_INT, MPI_MAXLOC, comm);
    CHECK(best.value == (n > 1 ? 1.0 : 0.0) && best.index == (n > 1 ? 1 : 0), "maxloc %g %d", best.value, best.index);

    MPI_Op op;
    MPI_Op_create(digits, 0, &op);
    MPI_Datatype pair;
    MPI_Type_contiguous(2, MPI_LONG, &pair);
    MPI_Type_commit(&pair);
    digits_t digit[2] = {{r + 1, 10}, {9 - r % 9, 10}}, number[2];
    MPI_Allreduce(digit, number, 2, pair, op, comm);
    long expect = 0, expect2 = 0;
    for (int i = 0; i < n; i++) expect = expect * 10 + (i + 1), expect2 = expect2 * 10 + (9 - i % 9);
    CHECK(number[0].value == expect && number[1].value == expect2,
          "non-commutative reduction %ld %ld, not %ld %ld", number[0].value, number[1].value, expect, expect2);
    MPI_Type_free(&pair);
    MPI_Op_free(&op);

    int *all = malloc(sizeof(int) * n * 4), *mine = malloc(sizeof(int) * n * 4);
    int me2[2] = {r, r * r};
    MPI_Gather(me2, 2, MPI_INT, all, 2, MPI_INT, 0, comm);
    if (r == 0)
        for (int i = 0; i < n; i++) CHECK(all[2 * i] == i && all[2 * i + 1] == i * i, "gather from %d", i);
    MPI_Allgather(me2, 2, MPI_INT, all, 2, MPI_INT, comm);
    for (int i = 0; i < n; i++) CHECK(all[2 * i] == i && all[2 * i + 1] == i * i, "allgather from %d", i);

    int *counts = malloc(sizeof(int) * n), *displs = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) counts[i] = i + 1, displs[i] = i * (n + 1);
    int *vbuf = malloc(sizeof(int) * n * (n + 1)), *own = malloc(sizeof(int) * (n + 1));
    for (int i = 0; i <= r; i++) own[i] = 1000 * r + i;
    MPI_Allgatherv(own, r + 1, MPI_INT, vbuf, counts, displs, MPI_INT, comm);
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++) CHECK(vbuf[displs[i] + j] == 1000 * i + j, "allgatherv %d.%d", i, j);

    for (int i = 0; i < n * 2; i++) mine[i] = r * 100 + i;
    MPI_Alltoall(mine, 2, MPI_INT, all, 2, MPI_INT, comm);
    for (int i = 0; i < n; i++)
        CHECK(all[2 * i] == i * 100 + 2 * r && all[2 * i + 1] == i * 100 + 2 * r + 1, "alltoall from %d", i);

    int scattered[2] = {-1, -1};
    MPI_Scatter(all, 2, MPI_INT, scattered, 2, MPI_INT, 0, comm);
    if (r == 0) { /* rank 0's own alltoall result */ }
    int block = -1;
    int *contrib = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) contrib[i] = r + i;
    MPI_Reduce_scatter_block(contrib, &block, 1, MPI_INT, MPI_SUM, comm);
    CHECK(block == n * (n - 1) / 2 + n * r, "reduce_scatter_block %d", block);

    long scan = 0, exscan = -7, one = r + 1;
    MPI_Scan(&one, &scan, 1, MPI_LONG, MPI_SUM, comm);
    CHECK(scan == (long)(r + 1) * (r + 2) / 2, "scan %ld", scan);
    MPI_Exscan(&one, &exscan, 1, MPI_LONG, MPI_SUM, comm);
    if (r > 0) CHECK(exscan == (long)r * (r + 1) / 2, "exscan %ld", exscan);
    MPI_Barrier(comm);
    free(all), free(mine), free(counts), free(displs), free(vbuf), free(own), free(contrib);
}

static int deletes, delete_saw_size;

/* An attribute's delete function: counts, and uses the communicator (still valid). */
static int on_delete(MPI_Comm comm, int key, void *value, void *extra) {
    (void)key;
    (void)extra;
    int n = -1;
    MPI_Comm_size(comm, &n);
    delete_saw_size = n;
    deletes += (int)(long)value;
    return MPI_SUCCESS;
}

static void attributes(void) {
    int key;
    MPI_Comm_create_keyval(MPI_COMM_DUP_FN, on_delete, &key, NULL);
    MPI_Comm a, b;
    MPI_Comm_dup(MPI_COMM_WORLD, &a);
    MPI_Comm_set_attr(a, key, (void *)7L);
    MPI_Comm_dup(a, &b); /* the attribute is copied (MPI_COMM_DUP_FN) */
    void *v = NULL;
    int flag = 0;
    MPI_Comm_get_attr(b, key, &v, &flag);
    CHECK(flag && v == (void *)7L, "copied attribute %d %p", flag, v);
    int rc = MPI_Comm_delete_attr(MPI_COMM_WORLD, key); /* never set there */
    CHECK(rc == MPI_SUCCESS, "deleting an absent attribute: %d", rc);
    MPI_Comm_free(&a);
    CHECK(deletes == 7 && delete_saw_size == size, "delete function: %d, size %d", deletes, delete_saw_size);
    MPI_Comm_free_keyval(&key);
    CHECK(key == MPI_KEYVAL_INVALID, "freed key");
    MPI_Comm_free(&b); /* its attribute's key was freed: its delete function still runs */
    CHECK(deletes == 14, "delete function after the key was freed: %d", deletes);
    int *ub = NULL;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    CHECK(flag && *ub >= 32767, "MPI_TAG_UB");
}

static void communicators(void) {
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);
    int hr, hn;
    MPI_Comm_rank(half, &hr);
    MPI_Comm_size(half, &hn);
    CHECK(hn == (size + 1 - rank % 2) / 2, "split size %d", hn);
    /* Keys are -rank: the highest world rank is rank 0 of its half. */
    int world_of_0;
    MPI_Group wg, hg;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Comm_group(half, &hg);
    int zero = 0;
    MPI_Group_translate_ranks(hg, 1, &zero, wg, &world_of_0);
    int highest = size - 1 - ((size - 1) % 2 != rank % 2);
    CHECK(world_of_0 == highest, "rank 0 of the half is world rank %d, not %d", world_of_0, highest);
    collectives(half);
    /* A message on one communicator does not match a wildcard receive on another. */
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    int result;
    MPI_Comm_compare(dup, MPI_COMM_WORLD, &result);
    CHECK(result == MPI_CONGRUENT, "compare %d", result);
    if (size >= 2 && rank < 2) {
        int peer = 1 - rank, a = 10 + rank, b = 20 + rank, x = -1, y = -1;
        MPI_Request rq[2];
        MPI_Irecv(&x, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, dup, &rq[0]);
        MPI_Send(&a, 1, MPI_INT, peer, 1, MPI_COMM_WORLD);
        MPI_Send(&b, 1, MPI_INT, peer, 1, dup);
        MPI_Recv(&y, 1, MPI_INT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Wait(&rq[0], MPI_STATUS_IGNORE);
        CHECK(x == 20 + peer && y == 10 + peer, "communicators mixed: %d %d", x, y);
    }
    MPI_Comm_free(&dup);
    /* A communicator freed with operations pending on it: they complete. */
    MPI_Comm d2;
    MPI_Comm_dup(MPI_COMM_WORLD, &d2);
    if (size >= 2 && rank < 2) {
        int v = 42 + rank, w = -1;
        MPI_Request rq[2];
        MPI_Irecv(&w, 1, MPI_INT, 1 - rank, 3, d2, &rq[0]);
        MPI_Isend(&v, 1, MPI_INT, 1 - rank, 3, d2, &rq[1]);
        int rc = MPI_Comm_free(&d2);
        CHECK(rc == MPI_SUCCESS && d2 == MPI_COMM_NULL, "free with operations pending: %d", rc);
        rc = MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
        CHECK(rc == MPI_SUCCESS && w == 43 - rank, "operations of a freed communicator: %d, %d", rc, w);
    } else {
        MPI_Comm_free(&d2);
    }
    MPI_Comm_free(&half);
    MPI_Group_free(&wg);
    MPI_Group_free(&hg);
}

/* More communicators made and freed, one after the other, than a process can have at
 * once (quiver: 22911 context ids): a freed one's id is taken again. Each carries a
 * message round its ring. */
static void many_communicators(int quiver) {
    for (int i = 0; i < 23000; i++) {
        MPI_Comm c;
        if (i % 3 == 2)
            MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &c);
        else
            MPI_Comm_dup(MPI_COMM_WORLD, &c);
        int cr, cn;
        MPI_Comm_rank(c, &cr);
        MPI_Comm_size(c, &cn);
        int v = i * 16 + cr, got = -1;
        int rc = MPI_Sendrecv(&v, 1, MPI_INT, (cr + 1) % cn, 9, &got, 1, MPI_INT,
                              (cr + cn - 1) % cn, 9, c, MPI_STATUS_IGNORE);
        int ok = rc == MPI_SUCCESS && got == i * 16 + (cr + cn - 1) % cn;
        CHECK(ok, "communicator %d: %s, got %d", i, error_text(rc), got);
        MPI_Comm_free(&c);
        if (!ok) break;
    }
    /* More freed at once than quiver parks (16): the endpoints of the others close (and
     * their ids are retired, which the program cannot see); the communicators made
     * before and after work. */
    for (int round = 0; round < 2; round++) {
        MPI_Comm cs[20];
        for (int i = 0; i < 20; i++) MPI_Comm_dup(MPI_COMM_WORLD, &cs[i]);
        for (int i = 0; i < 20; i++) {
            int v = round * 100 + i * 4 + rank, got = -1;
            int rc = MPI_Sendrecv(&v, 1, MPI_INT, (rank + 1) % size, 3, &got, 1, MPI_INT,
                                  (rank + size - 1) % size, 3, cs[i], MPI_STATUS_IGNORE);
            CHECK(rc == MPI_SUCCESS && got == round * 100 + i * 4 + (rank + size - 1) % size,
                  "communicator %d of round %d: %s, got %d", i, round, error_text(rc), got);
        }
        for (int i = 0; i < 20; i++) MPI_Comm_free(&cs[i]);
    }
    /* A message left unreceived on a freed communicator (an erroneous program) is not
     * received on the communicators made after it (quiver retires the id; MPICH may give
     * it to the next communicator, message and all). */
    if (quiver && size >= 2) {
        MPI_Comm c;
        MPI_Comm_dup(MPI_COMM_WORLD, &c);
        int v = 77, flag = 0;
        if (rank == 0) MPI_Send(&v, 1, MPI_INT, 1, 5, c);
        if (rank == 1)
            while (!flag) MPI_Iprobe(0, 5, c, &flag, MPI_STATUS_IGNORE);
        MPI_Comm_free(&c);
        for (int i = 0; i < 3; i++) {
            MPI_Comm_dup(MPI_COMM_WORLD, &c);
            MPI_Barrier(c);
            flag = 0;
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c, &flag, MPI_STATUS_IGNORE);
            CHECK(!flag, "a later communicator (%d) has the message of a freed one", i);
            MPI_Comm_free(&c);
        }
    }
}

static void errors(int quiver) {
    int x = 0, rc;
    rc = MPI_Send(&x, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD);
    int cls;
    MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_RANK, "send to a rank past the end: %d", rc);
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    CHECK(len > 0 && strlen(text) == (size_t)len, "error string of %d bytes", len);
    if (size >= 2 && rank < 2) {
        char big[100], small[10];
        memset(big, 'q', sizeof big);
        MPI_Status st;
        st.MPI_SOURCE = -5;
        if (rank == 0) {
            MPI_Send(big, 100, MPI_CHAR, 1, 4, MPI_COMM_WORLD);
        } else {
            rc = MPI_Recv(small, 10, MPI_CHAR, 0, 4, MPI_COMM_WORLD, &st);
            MPI_Error_class(rc, &cls);
            CHECK(cls == MPI_ERR_TRUNCATE, "truncated receive: %d", rc);
            CHECK(st.MPI_SOURCE == 0 && st.MPI_TAG == 4, "truncated status %d/%d", st.MPI_SOURCE, st.MPI_TAG);
        }
    }
    if (quiver) {
        /* A function quiver does not implement says so. */
        MPI_Comm inter;
        rc = MPI_Intercomm_create(MPI_COMM_SELF, 0, MPI_COMM_WORLD, 0, 0, &inter);
        CHECK(rc == MPI_ERR_UNSUPPORTED_OPERATION, "an unimplemented call returned %d", rc);
    }
}

/* Synchronous sends: rank 0's MPI_Issend (of 0, 4 and 300 000 bytes) stays incomplete
 * through MPI_Test while rank 1 has not posted its receive, and still once rank 1 has
 * seen the message arrive (MPI_Probe, then a word to rank 0); it completes after rank
 * 1's receive (posted on rank 0's "go"). Then MPI_Ssend returns and its message arrives
 * whole. */
static void synchronous(void) {
    if (size < 2 || rank > 1) return;
    const size_t sizes[] = {0, 4, 300000};
    unsigned char *b = malloc(300000);
    for (int k = 0; k < 3; k++) {
        size_t n = sizes[k];
        if (rank == 0) {
            fill(b, n, 0, 1, 40 + k);
            MPI_Request r;
            int rc = MPI_Issend(b, (int)n, MPI_BYTE, 1, 300 + k, MPI_COMM_WORLD, &r);
            CHECK(rc == MPI_SUCCESS, "issend of %zu bytes: %s", n, error_text(rc));
            int done = 0;
            for (int i = 0; i < 2000 && !done; i++) MPI_Test(&r, &done, MPI_STATUS_IGNORE);
            CHECK(!done, "issend of %zu bytes complete before its receive was posted", n);
            MPI_Recv(NULL, 0, MPI_BYTE, 1, 398, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int i = 0; i < 200 && !done; i++) MPI_Test(&r, &done, MPI_STATUS_IGNORE);
            CHECK(!done, "issend of %zu bytes complete once it arrived, before its receive", n);
            MPI_Send(NULL, 0, MPI_BYTE, 1, 399, MPI_COMM_WORLD);
            if (!done) MPI_Wait(&r, MPI_STATUS_IGNORE);
            rc = MPI_Ssend(b, (int)n, MPI_BYTE, 1, 310 + k, MPI_COMM_WORLD);
            CHECK(rc == MPI_SUCCESS, "ssend of %zu bytes: %s", n, error_text(rc));
        } else {
            MPI_Status st;
            MPI_Probe(0, 300 + k, MPI_COMM_WORLD, &st);
            MPI_Send(NULL, 0, MPI_BYTE, 0, 398, MPI_COMM_WORLD);
            MPI_Recv(NULL, 0, MPI_BYTE, 0, 399, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int tag = 300 + k; tag <= 310 + k; tag += 10) {
                memset(b, 0xEE, 300000);
                int rc = MPI_Recv(b, 300000, MPI_BYTE, 0, tag, MPI_COMM_WORLD, &st);
                int got = -1;
                MPI_Get_count(&st, MPI_BYTE, &got);
                CHECK(rc == MPI_SUCCESS && got == (int)n, "synchronous message of %zu bytes: %d", n, got);
                CHECK(bad_byte(b, n, 0, 1, 40 + k) == (size_t)-1, "synchronous message of %zu bytes", n);
            }
        }
    }
    free(b);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(lib, &len);
    int quiver = strstr(lib, "quiver") != NULL;

    point_to_point();
    synchronous();
    collectives(MPI_COMM_WORLD);
    communicators();
    many_communicators(quiver);
    attributes();
    errors(quiver);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0 && total) printf("verify: %d checks FAILED\n", total);
    if (rank == 0 && !total) printf("verify: OK (%d ranks, %s)\n", size, quiver ? "quiver" : "another MPI");
    MPI_Finalize();
    return total != 0;
}
