// StreamPath (stream_path.h): the node kernel's setup and launches, and the host-paced scheme's hand-over.
#include "device/stream_path.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "dtype.h"
#include "error.h"

namespace ddl {
namespace {

// A member's record in the setup exchange (kNodeRecordBytes):
//   [0] 1: offers its region, 0: refuses (why at kTextAt)   [1] MPS serves its GPU
//   [4..8) pid   [8..10) identity length   [10..12) handle length   [12..16) the GPU's resident CTAs
//   [16..80) the GPU's identity   [96..) the IPC handle, or why it refuses
constexpr size_t kIdentAt = 16, kIdentMax = 64, kTextAt = 96, kTextMax = kNodeRecordBytes - kTextAt;

struct Record {
  bool ok = false;
  bool mps = false;
  int32_t pid = 0;
  int32_t capacity = 0;     // the node kernel's CTAs its GPU keeps resident at once
  std::string ident, text;  // text: the handle, or why not
};

std::string encode(const Record& r) {
  std::string b(kNodeRecordBytes, '\0');
  b[0] = r.ok ? 1 : 0;
  b[1] = r.mps ? 1 : 0;
  std::memcpy(&b[4], &r.pid, sizeof r.pid);
  const uint16_t il = static_cast<uint16_t>(std::min(r.ident.size(), kIdentMax));
  const uint16_t tl = static_cast<uint16_t>(std::min(r.text.size(), kTextMax));
  std::memcpy(&b[8], &il, 2);
  std::memcpy(&b[10], &tl, 2);
  std::memcpy(&b[12], &r.capacity, sizeof r.capacity);
  std::memcpy(&b[kIdentAt], r.ident.data(), il);
  std::memcpy(&b[kTextAt], r.text.data(), tl);
  return b;
}

bool decode(const char* b, Record* r) {
  uint16_t il = 0, tl = 0;
  std::memcpy(&il, b + 8, 2);
  std::memcpy(&tl, b + 10, 2);
  if (il > kIdentMax || tl > kTextMax || (b[0] != 0 && b[0] != 1)) return false;
  r->ok = b[0] == 1;
  r->mps = b[1] == 1;
  std::memcpy(&r->pid, b + 4, sizeof r->pid);
  std::memcpy(&r->capacity, b + 12, sizeof r->capacity);
  r->ident.assign(b + kIdentAt, il);
  r->text.assign(b + kTextAt, tl);
  return true;
}

bool debug() { return !getEnv("DDL_DEBUG").empty(); }

// The words the kernels and the host share (words_host_), pinned and mapped.
struct Words {
  uint32_t abort;
  uint32_t error;
  node::MismatchDetail detail;
};

}  // namespace

int nodeKernelBlocks(const std::vector<int>& capacity, const std::vector<int>& sharing, int forced,
                     int* short_member) {
  int blocks = forced > 0 ? forced : node::kMaxBlocks;
  for (size_t m = 0; m < capacity.size(); ++m) {
    if (sharing[m] <= 1) {
      // A GPU of its own binds nothing (its blocks never wait for each other): as many as it keeps resident
      // where it says, the forced count whatever it says.
      if (forced <= 0 && capacity[m] > 0) blocks = std::min(blocks, std::max(capacity[m], node::kMinBlocks));
      continue;
    }
    const int fits = capacity[m] / sharing[m];
    if (fits < std::max(forced, node::kMinBlocks)) {
      if (short_member) *short_member = static_cast<int>(m);
      return 0;
    }
    blocks = std::min(blocks, fits);
  }
  return blocks;
}

StreamPath::StreamPath(DeviceRuntime& rt, int rank, int timeout_ms, DeviceScheme forced, size_t slot_bytes,
                       int forced_blocks)
    : rt_(rt),
      rank_(rank),
      timeout_ms_(timeout_ms),
      forced_(forced),
      // Every block's sub-slot holds a 16-byte unit from each of up to kMaxRanks members (reduce-scatter).
      slot_bytes_(std::max<size_t>(kMinNodeSlotBytes, (slot_bytes ? slot_bytes : kNodeSlotBytes) /
                                                          (node::kUnitBytes * node::kMaxBlocks) *
                                                          (node::kUnitBytes * node::kMaxBlocks))),
      forced_blocks_(forced_blocks) {}

StreamPath::~StreamPath() { release(); }

void StreamPath::closePeers() noexcept {
  if (stream_) {
    // Nothing of ours may still run when the regions go: an abort ends a kernel stuck waiting for a peer.
    void* done = nullptr;
    try {
      done = rt_.newEvent(dev_);
      rt_.recordOn(stream_, done);
      // A timeout, then an abort, then one more timeout at most. A stream that still has not drained (its
      // kernel waits behind caller's work that never ends) keeps everything it may touch: abandoned.
      const auto timeout = std::chrono::milliseconds(timeout_ms_);
      const auto end = std::chrono::steady_clock::now() + timeout;
      bool drained = false;
      while (!(drained = rt_.eventDone(done)) && std::chrono::steady_clock::now() < end + timeout) {
        if (std::chrono::steady_clock::now() > end) abort();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (!drained) abandoned_ = true;
    } catch (const Error&) {
    }
    if (done) rt_.deleteEvent(done);
  }
  if (abandoned_) {
    regions_.clear();  // left open, as this rank's region is left allocated
    registrations_.clear();
    opened_.clear();
    ready_ = false;
    return;
  }
  for (size_t m = 0; m < regions_.size(); ++m)
    if (regions_[m] && regions_[m] != own_) rt_.closeMemory(regions_[m]);
  regions_.clear();
  dropRegistrations();
  ready_ = false;
}

void StreamPath::release() noexcept {
  closePeers();
  if (abandoned_) {  // a peer's kernel, or a kernel of ours not yet run, may still use all of it
    own_ = stream_ = fork_ = join_ = words_host_ = words_dev_ = poison_ = table_ = nullptr;
    abort_word_.store(nullptr);
    error_word_.store(nullptr);
    return;
  }
  if (own_) rt_.freeDevice(own_);
  own_ = nullptr;
  if (table_) rt_.freeDevice(table_);
  table_ = nullptr;
  if (stream_) rt_.deleteStream(stream_);
  if (fork_) rt_.deleteEvent(fork_);
  if (join_) rt_.deleteEvent(join_);
  stream_ = fork_ = join_ = nullptr;
  abort_word_.store(nullptr);
  error_word_.store(nullptr);
  if (words_host_) rt_.freeMapped(words_host_);
  words_host_ = words_dev_ = nullptr;
  if (poison_) rt_.freeHost(poison_);
  poison_ = nullptr;
  region_bytes_ = 0;
}

bool StreamPath::setupNode(int dev, const NodeExchange& ex, std::string* why) {
  release();
  dev_ = dev;
  members_ = ex.members;
  me_ = ex.me;
  Record mine;
  mine.pid = static_cast<int32_t>(rt_.processId());
  if (forced_ == DeviceScheme::kHost) {
    mine.text = "DDL_DEVICE_SCHEME=host";
  } else if (members_ > node::kMaxRanks) {
    mine.text = "the node kernel serves up to " + std::to_string(node::kMaxRanks) + " ranks per node";
  } else {
    try {
      mine.ident = rt_.deviceIdentity(dev);
      mine.mps = rt_.sharedByMps(dev);
      mine.capacity = rt_.nodeKernelCapacity(dev);
      region_bytes_ = node::Layout::bytes(slot_bytes_);
      rt_.bind(dev);
      own_ = rt_.allocDevice(region_bytes_);
      rt_.zeroDevice(own_, node::Layout::kDataOffset);  // flags and counters start at 0 on every member
      mine.text = rt_.exportMemory(own_);
      if (mine.text.size() > kTextMax) fail(ddlCudaError, "the runtime's IPC handle is too long");
      mine.ok = true;
    } catch (const Error& e) {
      mine.ok = false;
      mine.text = e.what();
    }
  }
  std::vector<char> all(kNodeRecordBytes * static_cast<size_t>(members_));
  const std::string enc = encode(mine);
  std::memcpy(all.data() + static_cast<size_t>(me_) * kNodeRecordBytes, enc.data(), kNodeRecordBytes);
  ex.allgather(all, kNodeRecordBytes);

  // Every member reaches the same decision from the same records (the openings below aside, which the
  // agreement covers).
  std::vector<Record> recs(members_);
  bool ok = true;
  for (int m = 0; m < members_ && ok; ++m) {
    if (!decode(all.data() + static_cast<size_t>(m) * kNodeRecordBytes, &recs[m])) {
      *why = "member " + std::to_string(m) + " sent a malformed record";
      ok = false;
    } else if (!recs[m].ok) {
      *why = m == me_ ? recs[m].text : "member " + std::to_string(m) + ": " + recs[m].text;
      ok = false;
    }
  }
  for (int m = 0; m < members_ && ok; ++m) {
    for (int k = m + 1; k < members_ && ok; ++k) {
      if (recs[m].ident == recs[k].ident && recs[m].pid != recs[k].pid && !(recs[m].mps && recs[k].mps)) {
        *why = "members " + std::to_string(m) + " and " + std::to_string(k) +
               " share one GPU without the MPS daemon, so their kernels take turns (start "
               "nvidia-cuda-mps-control -d, or give each rank a GPU of its own)";
        ok = false;
      }
    }
  }
  // The blocks: ranks sharing a GPU wait for each other inside the kernel, so all their CTAs must be resident
  // at once.
  blocks_ = 0;
  if (ok) {
    std::vector<int> capacity(members_), sharing(members_);
    for (int m = 0; m < members_; ++m) {
      capacity[m] = recs[m].capacity;
      for (int k = 0; k < members_; ++k) sharing[m] += recs[k].ident == recs[m].ident;
    }
    int m = 0;  // where there are too few: the member whose GPU holds them
    blocks_ = nodeKernelBlocks(capacity, sharing, forced_blocks_, &m);
    if (!blocks_) {
      *why = std::to_string(sharing[m]) + " ranks share member " + std::to_string(m) + "'s GPU, whose " +
             std::to_string(capacity[m]) + " resident CTAs cannot hold " +
             std::to_string(std::max(forced_blocks_, node::kMinBlocks)) + " for each" +
             (forced_blocks_ ? " (DDL_NODE_BLOCKS)" : "") + " at once";
      ok = false;
    }
  }
  if (ok) {
    regions_.assign(members_, nullptr);
    try {
      for (int m = 0; m < members_; ++m) {
        regions_[m] =
            m == me_ ? static_cast<char*>(own_) : static_cast<char*>(rt_.importMemory(recs[m].text));
      }
      stream_ = rt_.newStream(dev);
      fork_ = rt_.newEvent(dev);
      join_ = rt_.newEvent(dev);
      words_host_ = rt_.allocMapped(sizeof(Words), &words_dev_);
      poison_ = rt_.allocHost(node::kMaxBlocks * sizeof(uint64_t));
      // The registrations' table (ddlCommRegister), here rather than at the first registration: a graph's
      // capture may reserve rows (graphRef), and nothing may be allocated during a capture.
      table_ = rt_.allocDevice(kRegistrationTableBytes);
      rt_.zeroDevice(table_, kRegistrationTableBytes);
      std::fill_n(static_cast<uint64_t*>(poison_), node::kMaxBlocks, node::kPoison);
    } catch (const Error& e) {
      *why = std::string("setting up the node kernel: ") + e.what();
      ok = false;
    }
  }
  // Every rank of the communicator agrees; then every member closes the others' regions before any frees
  // its own (the agreement is also that meeting).
  const bool agreed = ex.agree(ok);
  if (!agreed) {
    if (ok) *why = "another rank could not set up the node kernel (its DDL_DEBUG output says why)";
    blocks_ = 0;
    closePeers();
    ex.agree(true);
    release();
    if (debug()) {
      std::fprintf(stderr, "ddl: rank %d: stream-ordered device collectives are host-paced: %s\n", rank_,
                   why->c_str());
    }
    return false;
  }
  auto* words = static_cast<Words*>(words_host_);
  abort_word_.store(&words->abort);
  error_word_.store(&words->error);
  if (aborted_.load()) abort();
  ready_ = true;
  if (debug()) {
    bool shared = false;
    for (int m = 1; m < members_; ++m) shared = shared || recs[m].ident == recs[0].ident;
    std::fprintf(
        stderr,
        "ddl: rank %d: stream-ordered device collectives run the node kernel (%s) among the node's %d "
        "ranks%s, %d CTAs per kernel, %zu MiB of device memory per rank\n",
        rank_, rt_.name(), members_,
        shared ? (recs[0].mps ? " sharing a GPU under MPS" : " sharing a GPU (forced)") : "", blocks_,
        region_bytes_ >> 20);
  }
  return true;
}

void StreamPath::launch(void* stream, node::Args a, bool capturing) {
  complete(a, capturing);
  DDL_ASSERT(node::chunkElems(a) > 0);
  rt_.recordOn(stream, fork_);
  rt_.waitOn(stream_, fork_);
  rt_.launchNode(stream_, dev_, a);
  rt_.recordOn(stream_, join_);
  rt_.waitOn(stream, join_);
}

void StreamPath::complete(node::Args& a, bool capturing) {
  DDL_ASSERT(ready_);
  a.nranks = members_;
  a.rank = me_;
  if (a.blocks == 0) a.blocks = blocks_;  // the plan's, else (the kPoison kernel) the setup's
  DDL_ASSERT(a.blocks == blocks_);
  for (int m = 0; m < node::kMaxRanks; ++m) a.regions[m] = m < members_ ? regions_[m] : nullptr;
  a.slot_bytes = slot_bytes_;
  a.sub_slot_bytes = node::subSlotBytesOf(slot_bytes_, a.blocks);
  a.block_units = node::blockUnitsOf(a.count, a.elem, a.blocks);
  auto* words_dev = static_cast<Words*>(words_dev_);
  a.abort = &words_dev->abort;
  a.error = &words_dev->error;
  a.detail = &words_dev->detail;
  a.timeout_ns = static_cast<uint64_t>(timeout_ms_) * 1000000;
  a.signature = node::signatureOf(a.kind, a.count, a.type, a.op, a.root);
  a.regs = nullptr;
  a.send_ref = a.recv_ref = 0;
  if (a.kind != node::Kind::kAllReduceOneShot && a.kind != node::Kind::kAllReduceTwoShot) return;
  if (!capturing && registrations_.empty()) return;  // nothing to look up (most calls)
  const size_t bytes = a.count * a.elem;
  DeviceRuntime::RelaxedCapture relaxed(rt_);  // refOf asks CUDA about the buffers, also during a capture
  if (capturing) {  // every rank alike reserves two rows (graphRef)
    a.send_ref = graphRef(static_cast<char*>(const_cast<void*>(a.send)), bytes);
    a.recv_ref = graphRef(static_cast<char*>(a.recv), bytes);
  } else {
    a.send_ref = refOf(a.send, bytes);
    a.recv_ref = a.recv == a.send ? a.send_ref : refOf(a.recv, bytes);  // in place: asked once
  }
  if (!registrations_.empty()) a.regs = static_cast<char* const*>(table_);
}

void StreamPath::waitForStream(void* stream, int dev) {
  rt_.waitForStream(stream, dev, [this] { return aborted_.load(); });
}

void StreamPath::waitForKernels() {
  DDL_ASSERT(ready_);
  rt_.waitForStream(stream_, dev_, [this] { return aborted_.load(); });
}

void StreamPath::poisonFlags() noexcept {
  if (!ready_ || !poison_) return;
  try {
    rt_.bind(dev_);
    const auto* words = static_cast<const uint64_t*>(poison_);
    for (int p = 0; p < members_; ++p)
      for (int b = 0; b < blocks_; ++b) rt_.copy(0, node::flagOf(regions_[p], b, me_), words + b, 8);
    rt_.syncQueue(0);
  } catch (const Error&) {
    rt_.drain();
  }
  // A kernel of this rank still on its way (an earlier collective whose peers all came) raises its flags
  // after the copies above: poison them again after it.
  try {
    DeviceRuntime::RelaxedCapture relaxed(rt_);
    if (rt_.capturing(stream_)) return;  // it joined a capture (a launch that failed then): not into a graph
    node::Args a{};
    a.kind = node::Kind::kPoison;
    a.type = ddlUint8;
    a.elem = 1;
    complete(a, false);
    rt_.launchNode(stream_, dev_, a);  // not forked from the caller's stream: never in a graph it captures
  } catch (const Error&) {
  }
}

void StreamPath::abort() {
  aborted_.store(true);
  if (uint32_t* w = abort_word_.load()) reinterpret_cast<volatile uint32_t*>(w)[0] = 1;
}

uint32_t StreamPath::gpuError() const {
  const uint32_t* w = error_word_.load();
  return w ? reinterpret_cast<const volatile uint32_t*>(w)[0] : node::kNoError;
}

std::string StreamPath::describeCall(uint64_t sig) {
  const node::Signature s = node::Signature::of(sig);
  const auto root = s.root;
  const auto op = s.op;
  const std::string n = std::to_string(s.count) + " " + typeName(s.type);
  switch (s.kind) {
    case node::Kind::kAllReduceOneShot:
    case node::Kind::kAllReduceTwoShot:
      return "allreduce of " + n + " (" + opName(op) + ")";
    case node::Kind::kReduceScatter:
      return "reduce-scatter of " + n + " per rank (" + opName(op) + ")";
    case node::Kind::kAllGather:
      return "allgather of " + n + " per rank";
    case node::Kind::kBroadcast:
      return "broadcast of " + n + " from member " + std::to_string(root);
    case node::Kind::kReduce:
      return "reduce of " + n + " (" + opName(op) + ") to member " + std::to_string(root);
    default:
      return "an unknown call";
  }
}

std::string StreamPath::describeGpuError() const {
  const uint32_t code = gpuError();
  const auto* words = static_cast<const Words*>(words_host_);
  if (code != node::kMismatch || !words) return describeGpuError(code);
  const volatile node::MismatchDetail& d = words->detail;
  // Signatures are never 0: a detail not (yet) written in full gives the general message.
  if (d.member_plus_one == 0 || d.theirs == 0 || d.mine == 0) return describeGpuError(code);
  return "stream-ordered collective mismatch: member " + std::to_string(d.member_plus_one - 1) +
         " of the node called " + describeCall(d.theirs) + " where this rank called " + describeCall(d.mine) +
         ": every rank must make the same calls in the same order";
}

std::string StreamPath::describeGpuError(uint32_t code) {
  switch (code) {
    case node::kTimedOut:
      return "a stream-ordered collective's kernel waited past the timeout for a rank of its node "
             "(DDL_TIMEOUT_MS)";
    case node::kAborted:
      return "communicator aborted by ddlCommAbort (a stream-ordered kernel stopped)";
    case node::kPeerFailed:
      return "a rank of the node failed inside a stream-ordered collective's kernel (timeout, abort or "
             "mismatch there)";
    case node::kMismatch:
      return "stream-ordered collective mismatch: a member of the node called a different collective, count, "
             "type, op or root: every rank must make the same calls in the same order";
    case node::kConcurrent:
      return "two stream-ordered collectives of this communicator ran at once on its GPU (a CUDA graph "
             "replayed on one stream while a call on another stream, unordered, also ran): launch graphs on "
             "the stream the communicator's other stream-ordered calls use, or order the streams with events";
    default:
      return "the node kernel reported failure " + std::to_string(code);
  }
}

}  // namespace ddl
