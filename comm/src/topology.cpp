// Topology (topology.h): strides and coordinates of the grid, and DDL_TOPOLOGY read with ddl's topology grammar
// (common/topology_dims.h) against the rank count.
#include "topology.h"

#include "common/topology_dims.h"
#include "error.h"

namespace ddl {

int Topology::size() const { return static_cast<int>(topologyRanks(dims)); }

std::string Topology::str() const { return formatTopologyDims(dims); }

int Topology::stride(int dim) const {
  int s = 1;
  for (int i = 0; i < dim; ++i) s *= dims[i];
  return s;
}

int Topology::coord(int rank, int dim) const { return (rank / stride(dim)) % dims[dim]; }

int Topology::nontrivialDims() const {
  int n = 0;
  for (int d : dims) n += d > 1;
  return n;
}

Topology parseTopology(const std::string& text, int nranks) {
  Topology t;
  if (nranks < 1) {
    fail(ddlInvalidArgument, "a topology for " + std::to_string(nranks) + " ranks: a communicator has at least 1");
  }
  if (text.empty()) {
    t.dims = {nranks};
    return t;
  }
  if (std::string why = parseTopologyDims(text, &t.dims); !why.empty()) {
    fail(ddlInvalidArgument, "invalid topology '" + text + "': " + why +
                                 " (expected dims like 2x2 or 4x8x2 whose product is the rank count)");
  }
  if (const long long product = topologyRanks(t.dims); product != nranks) {
    fail(ddlInvalidArgument, "topology " + text + " has " + std::to_string(product) +
                                 " ranks but the communicator has " + std::to_string(nranks) +
                                 "; the product of the dims must equal the rank count");
  }
  return t;
}

}  // namespace ddl
