/* An MPI program that checks one-sided communication byte by byte: windows on memory of
 * MPI_Alloc_mem, of malloc and of MPI_Win_allocate; puts and gets of sizes up to 1 MiB
 * under fences and under locks, with derived datatypes on both sides; accumulates,
 * get-accumulates, fetch-and-op and compare-and-swap from every rank at once, whose
 * totals must be exact; exclusive locks that make a plain read-modify-write safe;
 * windows of disjoint communicators made at the same time; the windows' attributes and
 * synchronization errors. Built with MPICH's mpicc, it runs unchanged on MPICH's
 * libmpi.so.12 and on quiver's. Exits 0 and rank 0 prints "rma: OK" when every check
 * held on every rank. */
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static unsigned char pattern(int src, size_t i, int round) {
    return (unsigned char)(src * 131 + i * 7 + round * 13 + (i >> 9));
}

#define BIG (1 << 20)
#define ADDS 200

/* Every rank puts into the next and gets from the previous, under fences, every size. */
static void fenced_puts_and_gets(void *mem, const char *what) {
    MPI_Win win;
    MPI_Win_create(mem, BIG, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    unsigned char *src = malloc(BIG), *dst = malloc(BIG);
    size_t sizes[] = {0, 1, 7, 8, 100, 4096, 65536, 200000, BIG};
    for (int k = 0; k < (int)(sizeof sizes / sizeof *sizes); k++) {
        size_t n = sizes[k];
        for (size_t i = 0; i < n; i++) src[i] = pattern(rank, i, k);
        MPI_Win_fence(0, win);
        MPI_Put(src, (int)n, MPI_BYTE, next, 0, (int)n, MPI_BYTE, win);
        MPI_Win_fence(0, win);
        const unsigned char *got = mem;
        for (size_t i = 0; i < n; i++)
            if (got[i] != pattern(prev, i, k)) {
                CHECK(0, "%s: put of %zu bytes: byte %zu", what, n, i);
                break;
            }
        /* And read back from the next rank what this one put there. */
        memset(dst, 0xee, n);
        MPI_Get(dst, (int)n, MPI_BYTE, next, 0, (int)n, MPI_BYTE, win);
        MPI_Win_fence(0, win);
        CHECK(n == 0 || memcmp(dst, src, n) == 0, "%s: get of %zu bytes", what, n);
    }
    free(src);
    free(dst);
    MPI_Win_free(&win);
    CHECK(win == MPI_WIN_NULL, "MPI_Win_free sets MPI_WIN_NULL");
}

/* Strided both ways: every other int of the origin lands in every third of the target. */
static void derived_types(void) {
    int *mem;
    MPI_Win win;
    MPI_Win_allocate(3 * 64 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &mem,
                     &win);
    for (int i = 0; i < 3 * 64; i++) mem[i] = -1;
    MPI_Datatype every2, every3;
    MPI_Type_vector(64, 1, 2, MPI_INT, &every2);
    MPI_Type_vector(64, 1, 3, MPI_INT, &every3);
    MPI_Type_commit(&every2);
    MPI_Type_commit(&every3);
    int src[128], back[128];
    for (int i = 0; i < 128; i++) src[i] = rank * 1000 + i;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    MPI_Win_fence(0, win);
    /* Displacement 1 (in ints: the window's unit). */
    MPI_Put(src, 1, every2, next, 1, 1, every3, win);
    MPI_Win_fence(0, win);
    for (int i = 0; i < 3 * 64; i++) {
        int want = (i >= 1 && (i - 1) % 3 == 0) ? prev * 1000 + 2 * ((i - 1) / 3) : -1;
        CHECK(mem[i] == want, "strided put: int %d is %d, not %d", i, mem[i], want);
    }
    for (int i = 0; i < 128; i++) back[i] = -7;
    MPI_Get(back, 1, every2, next, 1, 1, every3, win);
    MPI_Win_fence(0, win);
    for (int i = 0; i < 128; i++) {
        int want = i % 2 == 0 ? src[i] : -7;
        CHECK(back[i] == want, "strided get: int %d is %d, not %d", i, back[i], want);
    }
    MPI_Type_free(&every2);
    MPI_Type_free(&every3);
    MPI_Win_free(&win);
}

/* Every rank adds to every rank's counters at once, passive target. */
static void atomics(void) {
    struct counters {
        long sum;     /* MPI_Accumulate SUM of longs */
        long fetched; /* MPI_Fetch_and_op SUM */
        double d;     /* MPI_Accumulate SUM of doubles */
        int i;        /* MPI_Get_accumulate SUM of ints */
        int max;      /* MPI_Accumulate MAX */
        long cas;     /* a ticket taken by compare-and-swap */
        int icas;     /* the same with ints */
        int pad;
        long lmax;    /* MPI_Accumulate MAX of longs (a compare-and-swap loop on quiver) */
        /* Elements smaller than a word, side by side, updated by every rank at once
         * (quiver changes each with an atomic of its whole word). */
        short s[4];          /* SUM of shorts, each rank on two of them */
        unsigned char b[8];  /* BOR of bytes, each rank its own bit in all of them */
        float f;             /* SUM of floats */
        int imin;            /* MIN of ints */
        int fi;              /* MPI_Fetch_and_op SUM of ints */
        int pad2;
    } *c;
    MPI_Alloc_mem(sizeof *c, MPI_INFO_NULL, &c);
    memset(c, 0, sizeof *c);
    MPI_Win win;
    MPI_Win_create(c, sizeof *c, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock_all(0, win);
    long one = 1;
    double half = 0.5;
    int two = 2, my_max = 100 + rank;
    for (int k = 0; k < ADDS; k++) {
        for (int t = 0; t < size; t++) {
            MPI_Accumulate(&one, 1, MPI_LONG, t, 0, 1, MPI_LONG, MPI_SUM, win);
            long old;
            MPI_Fetch_and_op(&one, &old, MPI_LONG, t, 8, MPI_SUM, win);
            MPI_Accumulate(&half, 1, MPI_DOUBLE, t, 16, 1, MPI_DOUBLE, MPI_SUM, win);
            int was;
            MPI_Get_accumulate(&two, 1, MPI_INT, &was, 1, MPI_INT, t, 24, 1, MPI_INT,
                               MPI_SUM, win);
            MPI_Win_flush(t, win);
            CHECK(old >= 0 && old < (long)ADDS * size, "fetched %ld", old);
            CHECK(was % 2 == 0, "get-accumulated %d", was);
            MPI_Accumulate(&my_max, 1, MPI_INT, t, 28, 1, MPI_INT, MPI_MAX, win);
            long my_lmax = (long)rank * ADDS + k;
            MPI_Accumulate(&my_lmax, 1, MPI_LONG, t, 48, 1, MPI_LONG, MPI_MAX, win);
            /* Take a ticket: increment by compare-and-swap until it holds. */
            long cur = 0, got;
            for (;;) {
                long want = cur + 1;
                MPI_Compare_and_swap(&want, &cur, &got, MPI_LONG, t, 32, win);
                MPI_Win_flush(t, win);
                if (got == cur) break;
                cur = got;
            }
            short one_s = 1;
            MPI_Aint at_s = offsetof(struct counters, s);
            MPI_Accumulate(&one_s, 1, MPI_SHORT, t, at_s + 2 * (rank % 4), 1, MPI_SHORT,
                           MPI_SUM, win);
            MPI_Accumulate(&one_s, 1, MPI_SHORT, t, at_s + 2 * ((rank + 1) % 4), 1, MPI_SHORT,
                           MPI_SUM, win);
            unsigned char bit[8];
            memset(bit, 1 << (rank % 8), sizeof bit);
            MPI_Accumulate(bit, 8, MPI_BYTE, t, offsetof(struct counters, b), 8, MPI_BYTE,
                           MPI_BOR, win);
            float quarter = 0.25f;
            MPI_Accumulate(&quarter, 1, MPI_FLOAT, t, offsetof(struct counters, f), 1,
                           MPI_FLOAT, MPI_SUM, win);
            int my_min = -rank - k;
            MPI_Accumulate(&my_min, 1, MPI_INT, t, offsetof(struct counters, imin), 1, MPI_INT,
                           MPI_MIN, win);
            int three = 3, fi_was;
            MPI_Fetch_and_op(&three, &fi_was, MPI_INT, t, offsetof(struct counters, fi),
                             MPI_SUM, win);
            MPI_Win_flush(t, win);
            CHECK(fi_was % 3 == 0 && fi_was >= 0 && fi_was < 3 * ADDS * size,
                  "int fetch-and-op %d", fi_was);
            int icur = 0, igot;
            for (;;) {
                int want = icur + 1;
                MPI_Compare_and_swap(&want, &icur, &igot, MPI_INT, t, 40, win);
                MPI_Win_flush(t, win);
                if (igot == icur) break;
                icur = igot;
            }
        }
    }
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);
    long n = (long)ADDS * size;
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
    CHECK(c->sum == n, "accumulated %ld, not %ld", c->sum, n);
    CHECK(c->fetched == n, "fetch-and-op %ld, not %ld", c->fetched, n);
    CHECK(c->d == 0.5 * n, "doubles %g, not %g", c->d, 0.5 * n);
    CHECK(c->i == 2 * n, "get-accumulate %d, not %ld", c->i, 2 * n);
    CHECK(c->max == 100 + size - 1, "max %d", c->max);
    CHECK(c->cas == n, "compare-and-swap tickets %ld, not %ld", c->cas, n);
    CHECK(c->icas == n, "int compare-and-swap tickets %d, not %ld", c->icas, n);
    CHECK(c->lmax == (long)(size - 1) * ADDS + ADDS - 1, "long max %ld", c->lmax);
    for (int q = 0; q < 4; q++) {
        long want = 0;
        for (int r = 0; r < size; r++) want += (r % 4 == q) + ((r + 1) % 4 == q);
        CHECK(c->s[q] == want * ADDS, "short %d: %d, not %ld", q, c->s[q], want * ADDS);
    }
    unsigned char bits = 0;
    for (int r = 0; r < size; r++) bits |= (unsigned char)(1 << (r % 8));
    for (int q = 0; q < 8; q++) CHECK(c->b[q] == bits, "byte %d: %#x, not %#x", q, c->b[q], bits);
    CHECK(c->f == 0.25f * n, "floats %g, not %g", c->f, 0.25 * n);
    CHECK(c->imin == -(size - 1) - (ADDS - 1), "int min %d", c->imin);
    CHECK(c->fi == 3 * n, "int fetch-and-op %d, not %ld", c->fi, 3 * n);
    MPI_Win_unlock(rank, win);
    /* A fetch of MPI_NO_OP reads without changing. */
    long peek = -1, dummy = 5;
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
    MPI_Fetch_and_op(&dummy, &peek, MPI_LONG, 0, 0, MPI_NO_OP, win);
    MPI_Win_unlock(0, win);
    CHECK(peek == n, "MPI_NO_OP read %ld", peek);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);
    MPI_Free_mem(c);
}

/* An exclusive lock makes a get, an increment and a put of the same word safe. */
static void exclusive_locks(void) {
    int *mem = malloc(2 * sizeof(int));
    mem[0] = mem[1] = 0;
    MPI_Win win;
    MPI_Win_create(mem, 2 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    for (int k = 0; k < 50; k++) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
        int v;
        MPI_Get(&v, 1, MPI_INT, 0, 1, 1, MPI_INT, win);
        MPI_Win_flush(0, win);
        v++;
        MPI_Put(&v, 1, MPI_INT, 0, 1, 1, MPI_INT, win);
        MPI_Win_unlock(0, win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
        CHECK(mem[1] == 50 * size, "locked increments %d, not %d", mem[1], 50 * size);
        MPI_Win_unlock(0, win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);
    free(mem);
}

/* Windows of the two halves of the job, made at the same time. */
static void split_windows(void) {
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    int hr, hn;
    MPI_Comm_rank(half, &hr);
    MPI_Comm_size(half, &hn);
    long *mem;
    MPI_Win win;
    MPI_Win_allocate(sizeof(long), sizeof(long), MPI_INFO_NULL, half, &mem, &win);
    *mem = 0;
    MPI_Win_fence(0, win);
    long mine = 1 + rank;
    MPI_Accumulate(&mine, 1, MPI_LONG, 0, 0, 1, MPI_LONG, MPI_SUM, win);
    MPI_Win_fence(0, win);
    if (hr == 0) {
        long want = 0;
        for (int r = rank % 2; r < size; r += 2) want += 1 + r;
        CHECK(*mem == want, "half %d summed %ld, not %ld", rank % 2, *mem, want);
    }
    MPI_Group g, wg;
    MPI_Win_get_group(win, &g);
    MPI_Comm_group(half, &wg);
    int cmp;
    MPI_Group_compare(g, wg, &cmp);
    CHECK(cmp == MPI_IDENT, "the window's group is its communicator's");
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    /* The communicator may go before the window. */
    MPI_Comm_free(&half);
    MPI_Win_fence(0, win);
    MPI_Win_free(&win);
}

static void attributes_and_errors(void) {
    char *mem;
    MPI_Win win;
    MPI_Win_allocate(100, 4, MPI_INFO_NULL, MPI_COMM_WORLD, &mem, &win);
    void *base;
    MPI_Aint *wsize;
    int *unit, *flavor, *model, flag;
    MPI_Win_get_attr(win, MPI_WIN_BASE, &base, &flag);
    CHECK(flag && base == mem, "MPI_WIN_BASE");
    MPI_Win_get_attr(win, MPI_WIN_SIZE, &wsize, &flag);
    CHECK(flag && *wsize == 100, "MPI_WIN_SIZE");
    MPI_Win_get_attr(win, MPI_WIN_DISP_UNIT, &unit, &flag);
    CHECK(flag && *unit == 4, "MPI_WIN_DISP_UNIT");
    MPI_Win_get_attr(win, MPI_WIN_CREATE_FLAVOR, &flavor, &flag);
    CHECK(flag && *flavor == MPI_WIN_FLAVOR_ALLOCATE, "MPI_WIN_CREATE_FLAVOR");
    MPI_Win_get_attr(win, MPI_WIN_MODEL, &model, &flag);
    CHECK(flag && (*model == MPI_WIN_UNIFIED || *model == MPI_WIN_SEPARATE), "MPI_WIN_MODEL");
    MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
    int rc = MPI_Win_unlock(0, win);
    int cls;
    MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_RMA_SYNC, "an unlock without a lock: class %d", cls);
    /* Synchronization with MPI_PROC_NULL does nothing and succeeds. */
    rc = MPI_Win_lock(MPI_LOCK_SHARED, MPI_PROC_NULL, 0, win);
    CHECK(rc == MPI_SUCCESS, "a lock of MPI_PROC_NULL: %d", rc);
    rc = MPI_Win_unlock(MPI_PROC_NULL, win);
    CHECK(rc == MPI_SUCCESS, "an unlock of MPI_PROC_NULL: %d", rc);
    /* A put to MPI_PROC_NULL moves nothing and succeeds. */
    MPI_Win_fence(0, win);
    rc = MPI_Put(mem, 1, MPI_BYTE, MPI_PROC_NULL, 0, 1, MPI_BYTE, win);
    CHECK(rc == MPI_SUCCESS, "a put to MPI_PROC_NULL");
    MPI_Win_fence(0, win);
    MPI_Win_free(&win);
    /* An empty window keeps the base it was given. */
    static char nothing[8];
    MPI_Win_create(nothing + 1, 0, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    MPI_Win_get_attr(win, MPI_WIN_BASE, &base, &flag);
    CHECK(flag && base == nothing + 1, "an empty window's base");
    MPI_Win_free(&win);
}

/* A window of three ints: the last one's word would reach past the part's end (quiver
 * takes the accumulate mutex for it, its atomics for the other two), all three updated
 * in one call and in calls of their own by every rank at once. */
static void the_last_word(void) {
    int *w;
    MPI_Win win;
    MPI_Win_allocate(3 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &w, &win);
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, win);
    w[0] = w[1] = w[2] = 0;
    MPI_Win_unlock(rank, win);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock_all(0, win);
    int ones[3] = {1, 1, 1}, two = 2, was;
    for (int k = 0; k < ADDS; k++)
        for (int t = 0; t < size; t++) {
            MPI_Accumulate(ones, 3, MPI_INT, t, 0, 3, MPI_INT, MPI_SUM, win);
            MPI_Fetch_and_op(&two, &was, MPI_INT, t, 2, MPI_SUM, win);
            MPI_Accumulate(&two, 1, MPI_INT, t, 1, 1, MPI_INT, MPI_SUM, win);
            MPI_Win_flush(t, win);
            CHECK(was >= 0 && was < 3 * ADDS * size, "the last int was %d", was);
        }
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);
    long n = (long)ADDS * size;
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
    CHECK(w[0] == n && w[1] == 3 * n && w[2] == 3 * n, "the ints: %d %d %d, not %ld %ld %ld",
          w[0], w[1], w[2], n, 3 * n, 3 * n);
    MPI_Win_unlock(rank, win);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    void *shared;
    MPI_Alloc_mem(BIG, MPI_INFO_NULL, &shared);
    memset(shared, 0, BIG);
    fenced_puts_and_gets(shared, "MPI_Alloc_mem's memory");
    MPI_Free_mem(shared);
    void *plain = calloc(1, BIG);
    fenced_puts_and_gets(plain, "malloc's memory");
    free(plain);
    derived_types();
    atomics();
    the_last_word();
    exclusive_locks();
    split_windows();
    attributes_and_errors();

    int total;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(lib, &len);
    int quiver = strstr(lib, "quiver") != NULL;
    if (rank == 0 && !total) printf("rma: OK (%d ranks, %s)\n", size, quiver ? "quiver" : "another MPI");
    MPI_Finalize();
    return total ? 1 : 0;
}
