/*
 * hello: every rank of the job says who and where it is.
 *
 *   cc hello.c -o hello $(pkg-config --cflags --libs quiver)
 *   quiver run -n 4 -- ./hello
 */
#include <quiver.h>
#include <stdio.h>

/* Prints what failed and leaves main with 1. */
#define CHECK(call)                                                                       \
    do {                                                                                  \
        quiver_error err_ = (call);                                                       \
        if (err_ != QUIVER_OK) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,             \
                    quiver_strerror(err_), quiver_last_error_message());                  \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

int main(void) {
    /* The library must be the one the header describes (same major and minor). */
    if (quiver_version() / 100 != QUIVER_VERSION / 100) {
        fprintf(stderr, "hello: compiled for quiver %d but runs with %u\n", QUIVER_VERSION,
                quiver_version());
        return 1;
    }
    quiver_job *job = NULL;
    CHECK(quiver_job_from_env(&job));
    uint32_t rank, size, nid, nodes;
    const char *launcher;
    CHECK(quiver_job_rank(job, &rank));
    CHECK(quiver_job_size(job, &size));
    CHECK(quiver_job_nid(job, &nid));
    CHECK(quiver_job_node_count(job, &nodes));
    CHECK(quiver_job_launcher(job, &launcher));
    printf("hello from rank %u of %u on node %u of %u (started by %s)\n", rank, size, nid,
           nodes, launcher);
    fflush(stdout);
    /* Nobody leaves before everyone has spoken. */
    CHECK(quiver_job_barrier(job));
    CHECK(quiver_job_free(&job));
    return 0;
}
