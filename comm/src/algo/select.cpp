// Algorithm and segment-size selection for allreduce. DDL_ALGO / ddlConfig_t.algorithm and DDL_SEGMENT_BYTES
// force a choice; otherwise the tuning table decides (DDL_TUNE_FILE, written by ddl-bench --tune, else the
// built-in one in tune.cpp): see algo/tune.h.
#include "algo/algo.h"
#include "algo/tune.h"
#include "dtype.h"
#include "error.h"

namespace ddl {
namespace {
constexpr size_t kDefaultSegmentBytes = 256 * 1024;
}  // namespace

const char* algoName(Algo a) {
  switch (a) {
    case Algo::kAuto:
      return "auto";
    case Algo::kRing:
      return "ring";
    case Algo::kMdRing:
      return "mdring";
    case Algo::kRhd:
      return "rhd";
    case Algo::kShm:
      return "shm";
  }
  return "invalid";
}

Algo parseAlgo(const std::string& name) {
  for (Algo a : {Algo::kAuto, Algo::kRing, Algo::kMdRing, Algo::kRhd, Algo::kShm}) {
    if (name == algoName(a)) return a;
  }
  fail(ddlInvalidArgument, "unknown algorithm '" + name + "': use auto, ring, mdring, rhd or shm");
}

AllReduceChoice chooseAllReduce(Algo forced_algo, size_t forced_segment, const TuneTable* tune,
                                const std::string& topology, bool has_grid, int nranks, size_t bytes) {
  AllReduceChoice c{forced_algo == Algo::kAuto ? Algo::kRing : forced_algo, selectSegmentBytes(forced_segment)};
  if (forced_algo != Algo::kAuto && forced_segment > 0) return c;  // nothing left for a rule to decide
  const TuneRule* rule = tune != nullptr ? tune->find(nranks, topology, bytes) : nullptr;
  if (rule == nullptr) rule = TuneTable::builtin().find(nranks, topology, bytes);
  if (forced_algo == Algo::kAuto && rule != nullptr) {
    c.algo = rule->algo;
    // mdring needs a grid (given, or factorised: see mdringGrid); a prime count keeps the flat ring.
    if (c.algo == Algo::kMdRing && !has_grid) c.algo = Algo::kRing;
  }
  if (forced_segment == 0 && rule != nullptr && rule->algo == c.algo && rule->segment_bytes > 0) {
    c.segment_bytes = rule->segment_bytes;  // a segment measured for another algorithm is not carried over
  }
  return c;
}

Algo selectAllReduce(Algo forced, const Topology& topo, int nranks, size_t bytes) {
  return chooseAllReduce(forced, 0, nullptr, topo.str(), mdringGrid(topo).nontrivialDims() >= 2, nranks, bytes)
      .algo;
}

Topology mdringGrid(const Topology& configured) {
  if (configured.nontrivialDims() >= 2) return configured;
  Topology grid;
  int p = configured.size();
  for (int f = 2; f * f <= p; ++f) {
    while (p % f == 0) {
      grid.dims.push_back(f);
      p /= f;
    }
  }
  if (p > 1 || grid.dims.empty()) grid.dims.push_back(p);
  return grid;
}

size_t selectSegmentBytes(size_t forced_bytes) { return forced_bytes > 0 ? forced_bytes : kDefaultSegmentBytes; }

DataSpec dataSpec(ddlDataType_t type, ddlRedOp_t op, size_t forced_segment) {
  return DataSpec{type, op, typeSize(type), selectSegmentBytes(forced_segment)};
}

}  // namespace ddl
