// The multi-dimensional layout of a communicator's ranks, as in IBM DDL's `-mode r:4x8x2`.
//
// dims[0] varies fastest: with "4x8x2", ranks 0-3 share dims 1 and 2 (e.g. the 4 GPUs of one node), ranks 0, 4,
// 8, ... share dims 0 and 2 (one GPU per node across the 8 nodes of a switch), and so on. A flat communicator
// of p ranks is the one-dimensional topology "p".
#pragma once

#include <string>
#include <vector>

namespace ddl {

struct Topology {
  std::vector<int> dims;

  int size() const;                 // product of dims
  std::string str() const;          // "4x8x2"
  int coord(int rank, int dim) const;
  int stride(int dim) const;        // product of dims before dim
  // Number of dims larger than 1: mdring runs one ring per such dim.
  int nontrivialDims() const;
};

// Parses "AxBxC" (positive integers, 'x' or 'X' between). An empty string gives the flat topology of nranks.
// Throws ddlInvalidArgument when malformed or when the product differs from nranks, with a message that says
// both numbers.
Topology parseTopology(const std::string& text, int nranks);

}  // namespace ddl
