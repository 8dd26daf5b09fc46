/* mpi_test.h — for the unit tests that need several MPI ranks.  Run as a
 * plain test (meson test, or by hand), such a program re-executes itself
 * under `mpiexec -n RANKS` and exits with mpiexec's status:
 *
 *     if (!mpi_test_child())
 *         return mpi_test_relaunch("name", 4);
 */
#ifndef TRD_TEST_MPI_TEST_H
#define TRD_TEST_MPI_TEST_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Whether this process is one of the ranks (relaunched, or started by a
 * launcher directly). */
static inline int mpi_test_child(void)
{
    return getenv("TRD_MPI_TEST_CHILD") || getenv("PMI_RANK") || getenv("PMI_SIZE") ||
           getenv("OMPI_COMM_WORLD_SIZE");
}

static inline int mpi_test_relaunch(const char *name, int ranks)
{
    char self[4096], n_ranks[16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "%s: cannot find this program: %s\n", name, strerror(errno));
        return 1;
    }
    self[n] = '\0';
    snprintf(n_ranks, sizeof n_ranks, "%d", ranks);
    setenv("TRD_MPI_TEST_CHILD", "1", 1);
    char *args[] = {"mpiexec", "-n", n_ranks, self, NULL};
    execvp("mpiexec", args);
    fprintf(stderr, "%s: cannot run mpiexec: %s (this test needs MPICH's mpiexec on PATH)\n", name,
            strerror(errno));
    return 1;
}

#endif
