// Fuzzes the two parsers of a topology string: libddl's DDL_TOPOLOGY (comm/src/topology.h) and the
// coordinator's --topology override (coordinator/placement/ring_layout.h), which must agree on what a job's
// ranks get. Input: two bytes of rank count (little end first), then the text.
//
// Checks: a parsed topology multiplies to the rank count and prints back as an equivalent string; the two
// accept the same texts (both use common/topology_dims.h), with the same dims.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "error.h"
#include "placement/ring_layout.h"
#include "topology.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "topology_fuzz: %s\n", what);
    std::abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int nranks = data[0] | (data[1] << 8);
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);

  bool comm_ok = false;
  ddl::Topology topo;
  try {
    topo = ddl::parseTopology(text, nranks);
    comm_ok = true;
  } catch (const ddl::Error& e) {
    check(e.code() == ddlInvalidArgument, "an error other than ddlInvalidArgument");
  }
  if (comm_ok) {
    check(topo.size() == nranks, "the dims do not multiply to the rank count");
    check(!topo.dims.empty() && topo.dims.size() <= 16, "dims count out of range");
    for (int d : topo.dims) check(d > 0, "a dim below 1");
    if (nranks > 0) {
      for (int dim = 0; dim < static_cast<int>(topo.dims.size()); ++dim) {
        check(topo.coord(nranks - 1, dim) == topo.dims[dim] - 1, "the last rank's coordinate is wrong");
      }
    }
    ddl::Topology again = ddl::parseTopology(topo.str(), nranks);  // what ddlCommGetTopology prints parses
    check(again.dims == topo.dims, "str() does not parse back to the same dims");
  }

  std::vector<int> dims;
  const std::string error = ddl::placement::parseTopologyOverride(text, nranks, &dims);
  if (!text.empty() && nranks > 0) {
    check(error.empty() == comm_ok, "the coordinator and libddl disagree on whether a topology is valid");
  }
  if (error.empty() && comm_ok && !text.empty()) {
    check(dims == topo.dims, "the coordinator and libddl parse the same topology differently");
  }
  return 0;
}
