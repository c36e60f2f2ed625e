/*
 * allreduce.c: the smallest complete libddl program, in C. Every rank fills a buffer with numbers that depend
 * on its rank, the ranks sum the buffers with ddlAllReduce, and each checks the sums. Run it under ddlrun,
 * which starts the ranks and gives them the rendezvous address that ddlCommInitFromEnv reads:
 *
 *   cc allreduce.c $(pkg-config --cflags --libs ddl) -o allreduce && ddlrun -np 2 -- ./allreduce
 *
 * or build it with CMake (CMakeLists.txt here). Exit status 0 when the sums are right on this rank.
 */
#include <ddl/ddl.h>
#include <stdint.h>
#include <stdio.h>

enum { kCount = 1001 }; /* odd, so the ring's chunks are uneven */

static int fail(const char* call, ddlResult_t result, ddlComm_t comm) {
  fprintf(stderr, "%s: %s: %s\n", call, ddlGetErrorString(result), ddlGetLastError(comm));
  if (comm != NULL) ddlCommDestroy(comm);
  return 1;
}

int main(void) {
  ddlComm_t comm = NULL;
  ddlResult_t r = ddlCommInitFromEnv(&comm, NULL); /* DDL_RANK, DDL_WORLD_SIZE, DDL_ROOT: set by ddlrun */
  if (r != ddlSuccess) return fail("ddlCommInitFromEnv", r, NULL);
  int rank = 0, nranks = 0, version = 0;
  ddlCommUserRank(comm, &rank);
  ddlCommCount(comm, &nranks);
  ddlGetVersion(&version);

  /* Rank r contributes r + 1 + i * nranks at index i: the sum over the ranks is n(n+1)/2 + i * n^2. */
  static int32_t buf[kCount];
  for (int i = 0; i < kCount; ++i) buf[i] = rank + 1 + i * nranks;
  r = ddlAllReduce(buf, buf, kCount, ddlInt32, ddlSum, comm); /* in place */
  if (r != ddlSuccess) return fail("ddlAllReduce", r, comm);

  int wrong = 0;
  for (int i = 0; i < kCount; ++i) {
    const int32_t want = nranks * (nranks + 1) / 2 + i * nranks * nranks;
    if (buf[i] != want && wrong++ < 3)
      fprintf(stderr, "rank %d: element %d is %d, expected %d\n", rank, i, buf[i], want);
  }
  r = ddlCommDestroy(comm);
  if (r != ddlSuccess) return fail("ddlCommDestroy", r, NULL);
  if (wrong > 0) {
    fprintf(stderr, "rank %d: %d of %d sums wrong\n", rank, wrong, kCount);
    return 1;
  }
  printf("rank %d of %d: allreduce of %d int32 correct (libddl %d)\n", rank, nranks, kCount, version);
  return 0;
}
