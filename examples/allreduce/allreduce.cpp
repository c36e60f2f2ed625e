// allreduce.cpp: allreduce.c in C++. ddl/ddl.h is a C header with extern "C" guards, so C++ includes and
// links it as it is. Run it under ddlrun: ddlrun -np 2 -- ./allreduce_cxx
#include <ddl/ddl.h>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() {
  ddlComm_t comm = nullptr;
  if (ddlResult_t r = ddlCommInitFromEnv(&comm, nullptr); r != ddlSuccess) {
    std::fprintf(stderr, "ddlCommInitFromEnv: %s: %s\n", ddlGetErrorString(r), ddlGetLastError(nullptr));
    return 1;
  }
  int rank = 0, nranks = 0;
  ddlCommUserRank(comm, &rank);
  ddlCommCount(comm, &nranks);

  // Rank r contributes r + 1 + i * nranks at index i: the sum over the ranks is n(n+1)/2 + i * n^2.
  std::vector<std::int64_t> sum(1001);
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = rank + 1 + std::int64_t(i) * nranks;
  if (ddlResult_t r = ddlAllReduce(sum.data(), sum.data(), sum.size(), ddlInt64, ddlSum, comm);
      r != ddlSuccess) {
    std::fprintf(stderr, "ddlAllReduce: %s: %s\n", ddlGetErrorString(r), ddlGetLastError(comm));
    ddlCommDestroy(comm);
    return 1;
  }
  ddlCommDestroy(comm);
  for (std::size_t i = 0; i < sum.size(); ++i) {
    const std::int64_t want = nranks * (nranks + 1) / 2 + std::int64_t(i) * nranks * nranks;
    if (sum[i] != want) {
      std::fprintf(stderr, "rank %d: element %zu is %lld, expected %lld\n", rank, i, (long long)sum[i],
                   (long long)want);
      return 1;
    }
  }
  std::printf("rank %d of %d: allreduce of %zu int64 correct (C++)\n", rank, nranks, sum.size());
  return 0;
}
