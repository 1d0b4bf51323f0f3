/* What the test programs share: the rank, the size, and CHECK, which counts a failed
 * condition and says where (the first 20 of each rank). Include after mpi.h (or
 * mpi_abi.h's mpi.h). */
#include <stdio.h>

static int rank, size, failures;

#define CHECK(cond, ...)                                                            \
    do {                                                                            \
        if (!(cond)) {                                                              \
            if (failures++ < 20) {                                                  \
                fprintf(stderr, "rank %d: line %d: ", rank, __LINE__);              \
                fprintf(stderr, __VA_ARGS__);                                       \
                fprintf(stderr, "\n");                                              \
            }                                                                       \
        }                                                                           \
    } while (0)
