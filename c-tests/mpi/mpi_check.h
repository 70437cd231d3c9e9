/* Failure reports of the MPI test programs in c-tests/mpi/: each failed check is printed with the
 * rank and counted; the programs sum the counts over ranks and exit non-zero if any failed. */
#ifndef FH_MPI_CHECK_H
#define FH_MPI_CHECK_H

#include <stdio.h>

static int me, failures; /* this rank (MPI_COMM_WORLD), checks failed here */

#define FAIL(...)                                                                                \
    do {                                                                                         \
        failures++;                                                                              \
        fprintf(stderr, "rank %d: FAIL: ", me);                                                  \
        fprintf(stderr, __VA_ARGS__);                                                            \
        fprintf(stderr, "\n");                                                                   \
    } while (0)

#endif
