#include "topology.h"

#include <cerrno>
#include <cstdlib>

#include "error.h"

namespace ddl {

int Topology::size() const {
  int p = 1;
  for (int d : dims) p *= d;
  return p;
}

std::string Topology::str() const {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(dims[i]);
  }
  return s;
}

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
  auto bad = [&](const std::string& why) {
    fail(ddlInvalidArgument, "invalid topology '" + text + "': " + why +
                                 " (expected dims like 2x2 or 4x8x2 whose product is the rank count)");
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find_first_of("xX", pos);
    if (end == std::string::npos) end = text.size();
    std::string part = text.substr(pos, end - pos);
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) bad("'" + part + "' is not a positive integer");
    errno = 0;
    long v = std::strtol(part.c_str(), nullptr, 10);
    if (errno || v <= 0 || v > (1 << 20)) bad("'" + part + "' is not a positive integer");
    t.dims.push_back(static_cast<int>(v));
    if (t.dims.size() > 16) bad("more than 16 dimensions");
    pos = end + 1;
  }
  long long product = 1;
  for (int d : t.dims) {
    product *= d;
    if (product > (1LL << 31)) bad("the product is too large");
  }
  if (product != nranks) {
    fail(ddlInvalidArgument, "topology " + text + " has " + std::to_string(product) + " ranks but the communicator has " +
                                 std::to_string(nranks) + "; the product of the dims must equal the rank count");
  }
  return t;
}

}  // namespace ddl
