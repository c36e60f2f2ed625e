// The collective algorithms. One file each; select.cpp chooses among them.
//
// Every function runs one collective (or one phase of one) inside a Session, on host buffers of `count`
// elements of `type`. They throw ddl::Error on failure (see session.h). "src" may equal "dst" (in place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddl/ddl.h"
#include "session.h"
#include "topology.h"

namespace ddl {

class ShmNode;

// The allreduce algorithms DDL_ALGO names (select.cpp chooses among them). kShm: every rank on one node, over
// the node's shared memory (shm.cpp).
enum class Algo { kAuto, kRing, kMdRing, kRhd, kShm };
const char* algoName(Algo a);
Algo parseAlgo(const std::string& name);  // throws ddlInvalidArgument listing the valid names

// The ranks of one ring or tree, in order, and this rank's index among them.
struct Group {
  std::vector<int> ranks;
  int me = 0;
  int size() const { return static_cast<int>(ranks.size()); }
};
Group flatGroup(int nranks, int rank);
// The d_k ranks that share every coordinate of `rank` except dimension k of topo, in coordinate order
// (mdring's rings; where the node is dim 0 and one dim is above it, the ranks that meet across the nodes).
Group groupAlong(const Topology& topo, int rank, int k);
// The first dim of grid above dim 0 with more than one rank: where the node is dim 0 with one dim above it
// (GPUs x nodes), the dim along which the nodes meet. There must be one.
int dimAboveNode(const Topology& grid);

// Element range [begin, begin + count) of block i when count elements are split into g blocks
// as evenly as possible (the first count % g blocks get one more).
size_t blockBegin(size_t count, int g, int i);
size_t blockCount(size_t count, int g, int i);

// What the algorithms need to know about the data.
struct DataSpec {
  ddlDataType_t type;
  ddlRedOp_t op;
  size_t elem;          // bytes per element
  size_t segment_bytes; // pipeline segment size
};
// The DataSpec of a collective that no tuning rule sizes: forced_segment (0: the default) as its segment.
DataSpec dataSpec(ddlDataType_t type, ddlRedOp_t op, size_t forced_segment);

// Ring phases over `count` elements split into g blocks (block b at blockBegin(count, g, b)).
//
// Steps t in [t_begin, t_end) of the 2(g-1)-step ring allreduce: at step t this member sends block
// (me - t + shift) mod g to the next member and receives block (me - t - 1 + shift) mod g from the previous
// one. Steps < g-1 reduce (reduce-scatter: the received partial is combined with src into dst); steps >= g-1
// copy (allgather: received straight into dst). After the reduce-scatter steps member `me` holds the fully
// reduced block (me + 1 + shift) mod g. avg_divisor > 0 divides that block by it when the last reduce-scatter
// step finishes (ddlAvg), before the allgather sends it on.
void ringSteps(Session& s, const Group& g, const DataSpec& d, const char* src, char* dst, size_t count,
               int t_begin, int t_end, int shift, int avg_divisor);
inline int ringOwnedBlock(const Group& g, int shift) { return ((g.me + 1 + shift) % g.size() + g.size()) % g.size(); }

// Allreduce algorithms. All leave every rank with bit-identical results.
void ringAllReduce(Session& s, const DataSpec& d, const void* src, void* dst, size_t count);
// node: the ranks of dim 0 share a node and this segment (one ShmNode member per dim-0 coordinate, in order):
// dim 0 runs over shared memory (shmReduceScatter and shmAllGather); null: every dim over the transport.
void mdringAllReduce(Session& s, const DataSpec& d, const Topology& topo, const void* src, void* dst,
                     size_t count, ShmNode* node = nullptr);
// The dims above dim 0 of mdring, in place on this rank's block after a reduce-scatter along dim 0 by other
// means (the device path's over CUDA IPC): block holds elements [lo, lo + n) of the message, this rank's
// block lo = blockBegin(count, d0, coordinate 0), as shmReduceScatter leaves it. The allgathers end with the
// block's whole result; dim 0's allgather is the caller's again. ddlAvg divides at the last dim.
void mdringAboveDim0(Session& s, const DataSpec& d, const Topology& topo, void* block, size_t lo, size_t n);
void rhdAllReduce(Session& s, const DataSpec& d, const void* src, void* dst, size_t count);

void ringAllGather(Session& s, const DataSpec& d, const void* src, void* dst, size_t sendcount);
void ringReduceScatter(Session& s, const DataSpec& d, const void* src, void* dst, size_t recvcount);
void broadcast(Session& s, const DataSpec& d, const void* src, void* dst, size_t count, int root);
void barrier(Session& s);
// The result on root only (dst is not touched elsewhere); a tree for small messages, reduce-scatter + gather
// for large ones (reduce.cpp).
void reduceTo(Session& s, const DataSpec& d, const void* src, void* dst, size_t count, int root);
// Root's dst holds rank r's sendcount elements at r * sendcount (gather); rank r's dst gets root's src block r
// (scatter). src (gather) and dst (scatter) are the root's only where the others pass nothing.
void gather(Session& s, const DataSpec& d, const void* src, void* dst, size_t sendcount, int root);
void scatter(Session& s, const DataSpec& d, const void* src, void* dst, size_t recvcount, int root);
// Counts and displacements in elements, one per rank; the receive of rank j's block must have the count j
// sends. The own block is copied; src may overlap dst.
void allToAllv(Session& s, const DataSpec& d, const void* src, const size_t* sendcounts, const size_t* sdispls,
               void* dst, const size_t* recvcounts, const size_t* rdispls);

// Where the shared-memory collectives keep their rounds and how they move bytes. Null (the default): the
// node's segment (ShmNode's slots), moved and reduced by the CPU. The device path (device_path.h) passes each
// member's device memory, opened by the others through CUDA IPC, moved and reduced by the GPU. Slots have the
// node's ShmNode::buffers() round buffers either way: the node's counters pace both.
class NodeMemory {
 public:
  virtual ~NodeMemory() = default;
  virtual size_t roundBytes() const = 0;  // one round buffer of a member's slot
  virtual char* roundSlot(int member, uint32_t g) const = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void reduce(void* dst, const void* a, const void* b, size_t count, ddlDataType_t type,
                      ddlRedOp_t op) = 0;
  virtual void finishAvg(void* buf, size_t count, ddlDataType_t type, int divisor) = 0;
  // What the calls above wrote is complete and visible to the other members: before every publish.
  virtual void fence() = 0;
};

// Shared memory among the ranks of one node (algo/shm.cpp; Session's ranks need not all be members). Member i
// owns block i (blockBegin(count, n, i)). allreduce: every member ends with the whole result. reducescatter:
// the member's reduced block goes to `mine`. allgather: each member's block is in buf at its place; every
// member ends with all of them. avg_divisor > 0 divides the reduced blocks by it (ddlAvg's final step).
// memory: see NodeMemory.
void shmAllReduce(Session& s, ShmNode& node, const DataSpec& d, const void* src, void* dst, size_t count,
                  int avg_divisor, NodeMemory* memory = nullptr);
// Up to this many bytes, shmAllReduce has every member reduce the whole message (one synchronisation per round);
// above, each member reduces its block (two, but each byte read once).
size_t shmOneShotBytes(int members);
void shmReduceScatter(Session& s, ShmNode& node, const DataSpec& d, const void* src, void* mine, size_t count,
                      int avg_divisor, NodeMemory* memory = nullptr);
void shmAllGather(Session& s, ShmNode& node, const DataSpec& d, void* buf, size_t count,
                  NodeMemory* memory = nullptr);
// The root member's src to every other member's dst (the root's dst is not touched).
void shmBroadcast(Session& s, ShmNode& node, const DataSpec& d, const void* src, void* dst, size_t count,
                  int root_member, NodeMemory* memory = nullptr);

class TuneTable;
struct AllReduceChoice {
  Algo algo;  // never kAuto
  size_t segment_bytes;
};
// The allreduce algorithm and segment size for a message: forced_algo (unless kAuto) and forced_segment (unless
// 0) win; the rest comes from the first matching rule of `tune` (may be null), else of the built-in table.
// topology is the configured one as Topology::str() prints it; has_grid whether mdring has a grid to run on
// (mdringGrid(topo).nontrivialDims() >= 2). Both are computed once per communicator: this runs per call, and
// looks no rule up when algorithm and segment are both forced.
AllReduceChoice chooseAllReduce(Algo forced_algo, size_t forced_segment, const TuneTable* tune,
                                const std::string& topology, bool has_grid, int nranks, size_t bytes);
// chooseAllReduce's algorithm with no tuning file.
Algo selectAllReduce(Algo forced, const Topology& topo, int nranks, size_t bytes);
// The grid mdring runs on: the configured topology when it has two or more non-trivial dims; for a flat one,
// p's prime factors in ascending order (8 -> 2x2x2, 6 -> 2x3; a prime p stays flat). On a flat network every
// factorisation moves the same bytes as the flat ring but in 2·Σ(dᵢ-1) steps instead of 2(p-1).
Topology mdringGrid(const Topology& configured);
// The pipeline segment size of collectives without a tuning rule: forced_bytes when set, else the default.
size_t selectSegmentBytes(size_t forced_bytes);

}  // namespace ddl
