// StreamPath's registered buffers (stream_path.h, ddlCommRegister): each member shares the allocation of its
// buffer over CUDA IPC and opens the others'; the table row of a registration holds every member's buffer as
// this rank maps it, which the node kernel reads to work on the members' buffers in place (node_kernel.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "device/stream_path.h"
#include "error.h"

namespace ddl {
namespace {

// A member's record in a registration's exchange (kNodeRecordBytes):
//   [0] 1: shares its buffer, 0: cannot (why at kTextAt)   [8..16) the buffer's offset in its allocation
//   [16..18) text length   [32..) the allocation's IPC handle, or why not
constexpr size_t kTextAt = 32, kTextMax = kNodeRecordBytes - kTextAt;

std::string encode(bool ok, uint64_t offset, const std::string& text) {
  std::string b(kNodeRecordBytes, '\0');
  b[0] = ok ? 1 : 0;
  std::memcpy(&b[8], &offset, sizeof offset);
  const auto n = static_cast<uint16_t>(std::min(text.size(), kTextMax));
  std::memcpy(&b[16], &n, sizeof n);
  std::memcpy(&b[kTextAt], text.data(), n);
  return b;
}

bool decode(const char* b, bool* ok, uint64_t* offset, std::string* text) {
  uint16_t n = 0;
  std::memcpy(&n, b + 16, sizeof n);
  if (n > kTextMax || (b[0] != 0 && b[0] != 1)) return false;
  *ok = b[0] == 1;
  std::memcpy(offset, b + 8, sizeof *offset);
  text->assign(b + kTextAt, n);
  return true;
}

}  // namespace

char* StreamPath::openShared(const std::string& handle) {
  auto it = opened_.find(handle);
  if (it == opened_.end()) {
    it = opened_.emplace(handle, std::make_pair(static_cast<char*>(rt_.importMemory(handle)), 0)).first;
  }
  ++it->second.second;
  return it->second.first;
}

void StreamPath::closeShared(const std::string& handle) noexcept {
  auto it = opened_.find(handle);
  if (it == opened_.end() || --it->second.second > 0) return;
  rt_.closeMemory(it->second.first);
  opened_.erase(it);
}

int StreamPath::takeRow() {
  int row = 0;
  while (row < static_cast<int>(rows_.size()) && rows_[row]) ++row;
  if (row >= node::kMaxRegistrations) return -1;
  if (row >= static_cast<int>(rows_.size())) rows_.resize(row + 1, false);
  rows_[row] = true;
  return row;
}

StreamPath::Registration* StreamPath::addRegistration(char* ptr, size_t bytes, const NodeExchange& ex,
                                                      std::string* why) {
  auto reg = std::make_unique<Registration>();
  reg->ptr = ptr;
  reg->bytes = bytes;
  if (!ready_) {  // nothing reads buffers in place: an inert registration, on every member alike
    registrations_.push_back(std::move(reg));
    return registrations_.back().get();
  }
  // The same rows are used on every member (the same registrations in the same order).
  const int row = takeRow();
  if (!share(*reg, row, ex, why)) {
    if (row >= 0) rows_[row] = false;
    return nullptr;
  }
  reg->row = row;
  registrations_.push_back(std::move(reg));
  return registrations_.back().get();
}

bool StreamPath::share(Registration& reg, int row, const NodeExchange& ex, std::string* why) {
  char* const ptr = reg.ptr;
  const size_t bytes = reg.bytes;
  bool ok = row >= 0;
  std::string text = ok ? ""
                        : "a communicator holds at most " + std::to_string(node::kMaxRegistrations) +
                              " registrations, two for each captured allreduce among them: deregister some";
  void* base = nullptr;
  size_t size = 0;
  if (ok && rt_.deviceOf(ptr) != dev_) {
    ok = false;
    text = "its buffer is on device " + std::to_string(rt_.deviceOf(ptr)) + ", the node kernel on device " +
           std::to_string(dev_);
  }
  if (ok && (!rt_.allocationOf(ptr, &base, &size) || ptr + bytes > static_cast<char*>(base) + size)) {
    ok = false;
    text = "its buffer is not inside one device allocation of " + std::string(rt_.name());
  }
  if (ok) {
    try {
      text = rt_.exportMemory(base);
      if (text.size() > kTextMax) fail(ddlCudaError, "the runtime's IPC handle is too long");
    } catch (const Error& e) {
      ok = false;
      text = std::string("its buffer cannot be shared over CUDA IPC (") + e.what() +
             "); memory from cuMemCreate, as PyTorch's expandable segments, cannot be: such buffers take the "
             "staged path";
    }
  }
  const uint64_t offset = ok ? static_cast<uint64_t>(ptr - static_cast<char*>(base)) : 0;
  if (ok) reg.id = rt_.allocationId(ptr);
  std::vector<char> all(kNodeRecordBytes * static_cast<size_t>(members_));
  const std::string mine = encode(ok, offset, text);
  std::memcpy(all.data() + static_cast<size_t>(me_) * kNodeRecordBytes, mine.data(), kNodeRecordBytes);
  ex.allgather(all, kNodeRecordBytes);
  if (!ok) *why = text;

  std::vector<char*> peers(node::kMaxRanks, nullptr);
  for (int m = 0; m < members_ && ok; ++m) {
    bool theirs = false;
    uint64_t off = 0;
    std::string t;
    if (!decode(all.data() + static_cast<size_t>(m) * kNodeRecordBytes, &theirs, &off, &t)) {
      ok = false;
      *why = "member " + std::to_string(m) + " sent a malformed record";
    } else if (!theirs) {
      ok = false;
      *why = m == me_ ? t : "member " + std::to_string(m) + ": " + t;
    } else if (m != me_) {
      try {
        peers[m] = openShared(t) + off;
        reg.imports.push_back(t);
      } catch (const Error& e) {
        ok = false;
        *why = "opening member " + std::to_string(m) + "'s buffer: " + e.what();
      }
    }
  }
  if (ok) {
    // The others' entries first, this rank's last: a kernel takes the row for live once its own entry is
    // set (node::liveRef), which a replay may read meanwhile.
    try {
      rt_.bind(dev_);
      char** const at = static_cast<char**>(table_) + static_cast<size_t>(row) * node::kMaxRanks;
      rt_.copy(0, at, peers.data(), node::kMaxRanks * sizeof(char*));
      rt_.syncQueue(0);
      peers[0] = ptr;
      rt_.copy(0, at + me_, peers.data(), sizeof(char*));
      rt_.syncQueue(0);
    } catch (const Error& e) {
      ok = false;
      *why = std::string("writing the registration table: ") + e.what();
    }
  }
  if (!ex.agree(ok)) {
    if (ok) *why = "another rank could not share its buffer (its ddlCommRegister call returns why)";
    for (const auto& h : reg.imports) closeShared(h);
    reg.imports.clear();
    if (ok) {  // this rank's entry is set: empty the row again
      try {
        std::fill(peers.begin(), peers.end(), nullptr);
        rt_.copy(0, static_cast<char**>(table_) + static_cast<size_t>(row) * node::kMaxRanks, peers.data(),
                 node::kMaxRanks * sizeof(char*));
        rt_.syncQueue(0);
      } catch (const Error&) {
      }
    }
    return false;
  }
  return true;
}

uint64_t StreamPath::graphRef(char* p, size_t bytes) {
  const uint64_t have = refOf(p, bytes);
  const int row = takeRow();
  if (row < 0) return have;
  auto reg = std::make_unique<Registration>();
  reg->ptr = p;
  reg->bytes = bytes;
  reg->row = row;
  reg->pending = true;
  registrations_.push_back(std::move(reg));
  return have ? have : static_cast<uint64_t>(row + 1) << node::kRefOffsetBits;
}

int StreamPath::registerGraphBuffers(const NodeExchange& ex, std::string* why) {
  int failed = 0;
  for (const auto& r : registrations_) {
    if (!r->pending) continue;
    r->pending = false;
    std::string w;
    if (!share(*r, r->row, ex, &w)) {  // the row stays reserved and empty: its calls are staged
      if (failed++ == 0) *why = w;
    }
  }
  return failed;
}

bool StreamPath::removeRegistration(Registration* r, const NodeExchange& ex) {
  auto it = std::find_if(registrations_.begin(), registrations_.end(),
                         [r](const std::unique_ptr<Registration>& p) { return p.get() == r; });
  if (it == registrations_.end()) return false;
  if (r->row >= 0) {
    // Each member waits for its own kernels (the only readers of its mappings) and closes its mappings of the
    // others' buffers; then they meet, so that on return no member maps this rank's buffer any more and the
    // caller may free it (freeing memory a peer still maps is undefined in CUDA).
    waitForKernels();
    for (const auto& h : r->imports) closeShared(h);
    r->imports.clear();
    ex.agree(true);
    rows_[r->row] = false;
    // The row's pointers stay in the table until it is used again: no call refers to it meanwhile (refOf).
  }
  registrations_.erase(it);
  return true;
}

uint64_t StreamPath::refOf(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  for (const auto& r : registrations_) {
    if (r->row >= 0 && c >= r->ptr && c + bytes <= r->ptr + r->bytes) {
      // Memory freed and allocated again at that address (against ddlCommRegister's contract) is not what the
      // peers mapped: staged, rather than read where the old allocation was.
      if (r->id != 0 && rt_.allocationId(c) != r->id) return 0;
      return static_cast<uint64_t>(r->row + 1) << node::kRefOffsetBits | static_cast<uint64_t>(c - r->ptr);
    }
  }
  return 0;
}

void StreamPath::dropRegistrations() noexcept {
  for (const auto& r : registrations_)
    for (const auto& h : r->imports) closeShared(h);
  registrations_.clear();
  rows_.clear();
  for (const auto& [h, open] : opened_) rt_.closeMemory(open.first);
  opened_.clear();
}

}  // namespace ddl
