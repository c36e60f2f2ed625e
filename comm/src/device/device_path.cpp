// The device path (device_path.h): staged allreduce, staged collectives, and the IPC memory of one node.
//
// Staged allreduce. The host collectives reduce with the CPU and hand their buffers to the transport, so
// across nodes a device buffer comes to host memory and goes back. The message is cut into chunks
// (stagedChunkBytes) and each chunk is one host allreduce, in place on a pinned slot, so that three things
// overlap:
//
//     copy queue down (0):  [c+1][c+2]
//     CPU + wire:           [ allreduce c ]
//     copy queue up (1):    [c-1]
//
// Three pinned slots rotate (chunk c uses slot c mod 3). Chunk c+2 is fetched into the slot of chunk c-1 as
// soon as chunk c-1's copy up has been queued: the fetch waits for that copy on the device (await), not on
// the CPU, so the CPU goes straight on to allreduce chunk c, which it starts once that chunk's fetch has
// completed (sync). The two directions use separate queues, so on GPUs with two copy engines they run at
// once. A host sendbuff or recvbuff takes part directly and the copy on that side is skipped.
//
// Every rank must cut the message the same way, or their collectives would not match: the chunk size depends
// only on the message size. A rank that passes host buffers where the others pass device buffers runs one
// collective instead of several; below 512 KiB that is the same collective and works, above it the ranks'
// calls disagree, which the communicator detects and reports as a mismatch.
#include "device/device_path.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "device/node_kernel.h"
#include "dtype.h"
#include "env.h"
#include "error.h"

namespace ddl {
namespace {

constexpr int kSlots = 3;
constexpr size_t kMinChunkBytes = size_t{512} << 10;
// Events of the staged allreduce: slot k's fetch and its return.
constexpr int fetchedEvent(int k) { return k; }
constexpr int returnedEvent(int k) { return kSlots + k; }
static_assert(2 * kSlots <= DeviceRuntime::kEvents);
constexpr int kDown = 0, kUp = 1;  // the staged path's queues
// The staging pool is kept between calls up to this size, and freed after a call that needed more.
constexpr size_t kKeepPinnedBytes = size_t{256} << 20;

}  // namespace

size_t stagedChunkBytes(size_t bytes, size_t max_chunk_bytes) {
  const size_t max_chunk = std::max<size_t>(64, max_chunk_bytes / 64 * 64);
  const size_t quarter = ((bytes + 3) / 4 + 4095) / 4096 * 4096;  // at most four chunks
  return std::min(max_chunk, std::max(std::min(kMinChunkBytes, max_chunk), quarter));
}

// The members' IPC scratch as algo/shm.cpp's memory: the GPU copies and reduces on queue 0, and a fence waits
// for it, but only when something was queued since the last one.
class DevicePath::IpcMemory final : public NodeMemory {
 public:
  IpcMemory(DeviceRuntime& rt, std::vector<char*> bases, size_t round_bytes, int buffers)
      : rt_(rt), bases_(std::move(bases)), round_bytes_(round_bytes), buffers_(buffers) {}
  size_t roundBytes() const override { return round_bytes_; }
  char* roundSlot(int member, uint32_t g) const override {
    return bases_[member] + static_cast<size_t>(g % static_cast<uint32_t>(buffers_)) * round_bytes_;
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    rt_.copy(0, dst, src, bytes);
    dirty_ = true;
  }
  void reduce(void* dst, const void* a, const void* b, size_t count, ddlDataType_t type,
              ddlRedOp_t op) override {
    rt_.reduce(0, dst, a, b, count, type, op);
    dirty_ = true;
  }
  void finishAvg(void* buf, size_t count, ddlDataType_t type, int divisor) override {
    rt_.finishAvg(0, buf, count, type, divisor);
    dirty_ = true;
  }
  void fence() override {
    if (!dirty_) return;
    rt_.syncQueue(0);
    dirty_ = false;
  }
  void reset() { dirty_ = false; }

 private:
  DeviceRuntime& rt_;
  std::vector<char*> bases_;
  size_t round_bytes_;
  int buffers_;
  bool dirty_ = false;
};

DevicePath::DevicePath(std::unique_ptr<DeviceRuntime> runtime, int rank, size_t max_chunk_bytes)
    : rt_(std::move(runtime)), rank_(rank), max_chunk_bytes_(max_chunk_bytes) {}

DevicePath::~DevicePath() {
  KeepDevice keep(*rt_);
  rt_->drain();
  ipcRelease();
  releasePinned();
}

bool DevicePath::handles(std::initializer_list<const void*> ptrs) {
  // Asked of every blocking call, also while this thread or another captures a CUDA graph (torch_ddl's
  // registration rounds; a CPU tensor's collective on torch_ddl's worker): in the global capture mode CUDA
  // may count the question as unsafe and invalidate that capture.
  DeviceRuntime::RelaxedCapture relaxed(*rt_);
  for (const void* p : ptrs)
    if (p && rt_->deviceOf(p) >= 0) return true;
  return false;
}

char* DevicePath::pinned(size_t bytes) {
  if (pinned_bytes_ < bytes) {
    // The smaller buffer is kept until release: freeing pinned memory synchronises the whole device, which
    // would also wait for other ranks' kernels where ranks are threads of one process. Doubling bounds what
    // is kept to the size of the last buffer.
    const size_t grown = std::max(bytes, 2 * pinned_bytes_);
    char* bigger = static_cast<char*>(rt_->allocHost(grown));
    if (pinned_) retired_pinned_.push_back(pinned_);
    pinned_ = bigger;
    pinned_bytes_ = grown;
  }
  return pinned_;
}

void DevicePath::releasePinned() noexcept {
  if (pinned_) rt_->freeHost(pinned_);
  for (char* p : retired_pinned_) rt_->freeHost(p);
  retired_pinned_.clear();
  pinned_ = nullptr;
  pinned_bytes_ = 0;
}

void DevicePath::stagedAllReduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                                 const HostAllReduce& host, size_t max_chunks) {
  const int send_dev = rt_->deviceOf(sendbuf);
  const int recv_dev = rt_->deviceOf(recvbuf);
  DDL_ASSERT(count > 0 && (send_dev >= 0 || recv_dev >= 0));
  const size_t es = typeSize(type);
  const size_t bytes = count * es;
  // The chunk is a multiple of 64 bytes, so a whole number of elements of any type.
  size_t chunk_elems = stagedChunkBytes(bytes, max_chunk_bytes_) / es;
  if (max_chunks != SIZE_MAX && max_chunks > 0) {
    const size_t per64 = 64 / es;
    const size_t at_least = ((count + max_chunks - 1) / max_chunks + per64 - 1) / per64 * per64;
    chunk_elems = std::max(chunk_elems, at_least);
  }
  const size_t nchunks = (count + chunk_elems - 1) / chunk_elems;
  const size_t slot_bytes = (std::min(chunk_elems, count) * es + 63) / 64 * 64;
  const int dev = send_dev >= 0 ? send_dev : recv_dev;
  rt_->bind(dev);
  char* const slots = pinned(kSlots * slot_bytes);
  if (!reported_ && !getEnv("DDL_DEBUG").empty()) {
    std::fprintf(
        stderr,
        "ddl: rank %d: device buffers are staged through pinned host memory (%s), %zu chunk(s) of up to "
        "%zu bytes\n",
        rank_, rt_->name(), nchunks, chunk_elems * es);
    reported_ = true;
  }

  const char* src_base = static_cast<const char*>(sendbuf);
  char* dst_base = static_cast<char*>(recvbuf);
  auto offset = [&](size_t c) { return c * chunk_elems * es; };
  auto length = [&](size_t c) { return std::min(chunk_elems, count - c * chunk_elems) * es; };
  auto slot = [&](size_t c) { return slots + (c % kSlots) * slot_bytes; };
  // Down: chunk c into its slot, once the slot's previous chunk has gone back up.
  auto fetch = [&](size_t c) {
    const int k = static_cast<int>(c % kSlots);
    if (recv_dev >= 0 && c >= kSlots) rt_->await(kDown, returnedEvent(k));
    rt_->copy(kDown, slot(c), src_base + offset(c), length(c));
    rt_->record(kDown, fetchedEvent(k));
  };

  try {
    if (send_dev >= 0) {
      for (size_t c = 0; c < std::min<size_t>(kSlots - 1, nchunks); ++c) fetch(c);
    }
    for (size_t c = 0; c < nchunks; ++c) {
      const int k = static_cast<int>(c % kSlots);
      if (send_dev >= 0) {
        rt_->sync(fetchedEvent(k));
        if (c + kSlots - 1 < nchunks) fetch(c + kSlots - 1);
      } else if (recv_dev >= 0 && c >= kSlots) {
        rt_->sync(returnedEvent(k));  // the host writes this slot next: its previous chunk must be up
      }
      const void* src = send_dev >= 0 ? static_cast<const void*>(slot(c)) : src_base + offset(c);
      void* dst = recv_dev >= 0 ? static_cast<void*>(slot(c)) : dst_base + offset(c);
      host(src, dst, length(c) / es);
      if (recv_dev >= 0) {
        rt_->copy(kUp, dst_base + offset(c), slot(c), length(c));
        rt_->record(kUp, returnedEvent(k));
      }
    }
    if (recv_dev >= 0) rt_->syncQueue(kUp);
  } catch (...) {
    rt_->drain();  // no copy may still run into the user's buffers or the slots once we return
    throw;
  }
}

namespace {
// wireAllReduce's events: slot k's chunk fetched, slot k's chunk folded, slot k's pieces back on the device.
constexpr int kWireSlots = 2;
constexpr int wireFetched(int k) { return k; }
constexpr int wireFolded(int k) { return kWireSlots + k; }
constexpr int wireReturned(int k) { return 2 * kWireSlots + k; }
static_assert(3 * kWireSlots <= DeviceRuntime::kEvents);
size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

// wireAllReduce: chunk c lives in slot c mod 2 of pinned memory ([ the chunk | the pieces that arrive ]) and
// goes through four steps: fetch (the chunk comes down, queue 0), scatter (piece j to member j, this member's
// piece in from every other), fold (queue 1: the GPU folds the arrived pieces into the block and copies the
// folded piece down) and gather (the folded piece out to every member, theirs in and up, queue 1). Round c
// posts chunk c's scatter, then runs chunk c-1's gather (waiting for its fold), then fetches chunk c+1 into
// the slot chunk c-1 has just left, then folds chunk c once its scatter is in:
//
//     wire:        [scatter c  |  gather c-1 ]            [scatter c+1 | gather c ]
//     GPU fold:                                 [fold c]
//     copies:      [up c-1 ]                  [down c+1]  [up c      ]
//
// so a chunk's fold overlaps the next chunk's scatter, and the copies overlap the wire. A slot is fetched
// into again only once its gather has gone up (the fetch waits for that on the device) and its fold has
// finished (the round before waited for it).
void DevicePath::wireAllReduce(Session& s, const Group& g, void* block, size_t n, ddlDataType_t type,
                               ddlRedOp_t op, int avg_divisor) {
  const uint32_t unit0 = s.phase();  // every member starts it, with data or not
  if (n == 0) return;
  const int k = g.size(), me = g.me;
  DDL_ASSERT(k >= 2);
  const size_t es = typeSize(type);
  char* const dev = static_cast<char*>(block);
  rt_->bind(rt_->deviceOf(block));
  // Two units of the phase per chunk: at most tag::kMaxUnits / 2 chunks.
  size_t chunk = stagedChunkBytes(n * es, max_chunk_bytes_) / es;
  chunk = std::max(chunk, (n + tag::kMaxUnits / 2 - 1) / (tag::kMaxUnits / 2));
  const size_t nchunks = (n + chunk - 1) / chunk;
  // Pieces in whole 16-byte units (node::share), so that the fold's vector loads stay aligned; the first is
  // the largest.
  const size_t u = node::unitElems(es);
  auto piece = [&](size_t len, int j) {
    size_t lo = 0, hi = 0;
    node::share(len, k, j, u, &lo, &hi);
    return std::pair{lo, hi - lo};
  };
  const size_t piece_bytes = round64(piece(std::min(chunk, n), 0).second * es);
  const size_t chunk_bytes = round64(std::min(chunk, n) * es);
  const size_t slot_bytes = chunk_bytes + static_cast<size_t>(k) * piece_bytes;
  char* const pool = pinned(kWireSlots * slot_bytes);
  auto slotIndex = [](size_t c) { return static_cast<int>(c % kWireSlots); };
  auto length = [&](size_t c) { return std::min(chunk, n - c * chunk); };
  auto onDevice = [&](size_t c) { return dev + c * chunk * es; };
  auto pinnedCopy = [&](size_t c) { return pool + static_cast<size_t>(slotIndex(c)) * slot_bytes; };
  auto arrived = [&](size_t c, int j) {
    return pinnedCopy(c) + chunk_bytes + static_cast<size_t>(j) * piece_bytes;
  };
  auto pieceAt = [&](size_t c, int j) { return piece(length(c), j).first * es; };
  auto pieceBytes = [&](size_t c, int j) { return piece(length(c), j).second * es; };
  auto unit = [&](size_t c, int step) { return unit0 + static_cast<uint32_t>(2 * c + step); };

  auto fetch = [&](size_t c) {
    if (c >= kWireSlots) rt_->await(kDown, wireReturned(slotIndex(c)));
    rt_->copy(kDown, pinnedCopy(c), onDevice(c), length(c) * es);
    rt_->record(kDown, wireFetched(slotIndex(c)));
  };
  std::vector<Request*> scattering;
  auto scatter = [&](size_t c) {
    rt_->sync(wireFetched(slotIndex(c)));
    scattering.clear();
    for (int j = 0; j < k; ++j) {
      if (j == me) continue;
      if (const size_t b = pieceBytes(c, me))
        scattering.push_back(s.recv(g.ranks[j], unit(c, 0), arrived(c, j), b));
      if (const size_t b = pieceBytes(c, j)) {
        scattering.push_back(s.send(g.ranks[j], unit(c, 0), pinnedCopy(c) + pieceAt(c, j), b));
      }
    }
  };
  // Into this member's own piece in the block (device memory), the others in member order. Each piece is
  // folded by one member only and then gathered, so every member gets the same bits.
  auto fold = [&](size_t c) {
    for (Request* r : scattering) s.wait(r);
    if (const size_t b = pieceBytes(c, me)) {
      const size_t pn = b / es;
      char* const mine = onDevice(c) + pieceAt(c, me);
      for (int j = 0; j < k; ++j) {
        if (j != me) rt_->reduce(kUp, mine, mine, arrived(c, j), pn, type, op);
      }
      if (avg_divisor > 0) rt_->finishAvg(kUp, mine, pn, type, avg_divisor);
      rt_->copy(kUp, pinnedCopy(c) + pieceAt(c, me), mine, b);
    }
    rt_->record(kUp, wireFolded(slotIndex(c)));
  };
  std::vector<Request*> gathering;
  auto gather = [&](size_t c) {
    rt_->sync(wireFolded(slotIndex(c)));
    gathering.clear();
    for (int j = 0; j < k; ++j) {
      if (j == me) continue;
      if (const size_t b = pieceBytes(c, j)) {
        gathering.push_back(s.recv(g.ranks[j], unit(c, 1), pinnedCopy(c) + pieceAt(c, j), b));
      }
      if (const size_t b = pieceBytes(c, me)) {
        gathering.push_back(s.send(g.ranks[j], unit(c, 1), pinnedCopy(c) + pieceAt(c, me), b));
      }
    }
    for (Request* r : gathering) s.wait(r);
    for (int j = 0; j < k; ++j) {
      if (const size_t b = pieceBytes(c, j); j != me && b) {
        rt_->copy(kUp, onDevice(c) + pieceAt(c, j), pinnedCopy(c) + pieceAt(c, j), b);
      }
    }
    rt_->record(kUp, wireReturned(slotIndex(c)));
  };

  try {
    fetch(0);
    for (size_t c = 0; c <= nchunks; ++c) {
      if (c < nchunks) scatter(c);
      if (c >= 1) gather(c - 1);
      if (c + 1 < nchunks) fetch(c + 1);
      if (c < nchunks) fold(c);
    }
    rt_->syncQueue(kUp);
  } catch (...) {
    rt_->drain();  // nothing may still copy into the block or the pool once we return
    throw;
  }
}

void DevicePath::stage(
    const std::vector<Span>& inputs, const std::vector<Span>& outputs,
    const std::function<void(const std::vector<const void*>& in, const std::vector<void*>& out)>& body) {
  // Where each device span goes in the pool, 64-byte aligned; an input inside a device output goes inside its
  // copy (and that output is copied down too, since its bytes are the input's), as does a partial output.
  auto dev = [&](const Span& s) { return s.p && s.bytes ? rt_->deviceOf(s.p) : -1; };
  auto inside = [](const Span& in, const Span& out) {
    const char *a = static_cast<const char*>(in.p), *b = static_cast<const char*>(out.p);
    return a >= b && a + in.bytes <= b + out.bytes;
  };
  std::vector<size_t> out_at(outputs.size(), SIZE_MAX), in_at(inputs.size(), SIZE_MAX);
  std::vector<int> in_of(inputs.size(), -1);  // the output an input lies in
  std::vector<bool> out_down(outputs.size(), false);
  size_t total = 0;
  int device = -1;
  auto place = [&](size_t bytes) {
    const size_t at = total;
    total += (bytes + 63) / 64 * 64;
    return at;
  };
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (const int d = dev(outputs[o]); d >= 0) {
      out_at[o] = place(outputs[o].bytes);
      out_down[o] = outputs[o].partial;
      device = d;
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const int d = dev(inputs[i]);
    if (d < 0) continue;
    device = d;
    for (size_t o = 0; o < outputs.size() && in_of[i] < 0; ++o) {
      if (out_at[o] != SIZE_MAX && inside(inputs[i], outputs[o])) {
        in_of[i] = static_cast<int>(o);
        out_down[o] = true;
      }
    }
    if (in_of[i] < 0) in_at[i] = place(inputs[i].bytes);
  }
  if (device < 0) {  // nothing on a device after all
    std::vector<const void*> in;
    std::vector<void*> out;
    for (const Span& s : inputs) in.push_back(s.p);
    for (const Span& s : outputs) out.push_back(const_cast<void*>(s.p));
    return body(in, out);
  }
  rt_->bind(device);
  char* const pool = pinned(total);
  std::vector<const void*> in(inputs.size());
  std::vector<void*> out(outputs.size());
  try {
    for (size_t o = 0; o < outputs.size(); ++o) {
      out[o] = out_at[o] == SIZE_MAX ? const_cast<void*>(outputs[o].p) : pool + out_at[o];
      if (out_down[o]) rt_->copy(kDown, out[o], outputs[o].p, outputs[o].bytes);
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (in_of[i] >= 0) {
        const size_t o = static_cast<size_t>(in_of[i]);
        in[i] = static_cast<char*>(out[o]) +
                (static_cast<const char*>(inputs[i].p) - static_cast<const char*>(outputs[o].p));
      } else if (in_at[i] != SIZE_MAX) {
        in[i] = pool + in_at[i];
        rt_->copy(kDown, pool + in_at[i], inputs[i].p, inputs[i].bytes);
      } else {
        in[i] = inputs[i].p;
      }
    }
    rt_->syncQueue(kDown);
    body(in, out);
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (out_at[o] != SIZE_MAX) rt_->copy(kUp, const_cast<void*>(outputs[o].p), out[o], outputs[o].bytes);
    }
    rt_->syncQueue(kUp);
  } catch (...) {
    rt_->drain();
    if (pinned_bytes_ > kKeepPinnedBytes) releasePinned();
    throw;
  }
  if (pinned_bytes_ > kKeepPinnedBytes) releasePinned();
}

bool DevicePath::ipcSetup(int dev, size_t round_bytes, int buffers, const NodeExchange& ex,
                          std::string* why) {
  const std::string mine = ipcOffer(dev, round_bytes, buffers);
  std::vector<char> all(kIpcRecordBytes * static_cast<size_t>(ex.members));
  std::memcpy(all.data() + static_cast<size_t>(ex.me) * kIpcRecordBytes, mine.data(), kIpcRecordBytes);
  ex.allgather(all, kIpcRecordBytes);
  std::vector<std::string> records(ex.members);
  for (int m = 0; m < ex.members; ++m) records[m].assign(all.data() + m * kIpcRecordBytes, kIpcRecordBytes);
  const bool ok = ipcAccept(records, ex.me, why);
  if (ex.agree(ok)) return true;
  if (ok) *why = "another rank could not share its device scratch (its DDL_DEBUG output says why)";
  // Every member closes the others' scratch before any frees its own (the second agreement between).
  ipcClosePeers();
  ex.agree(true);
  ipcRelease();
  return false;
}

std::string DevicePath::ipcOffer(int dev, size_t round_bytes, int buffers) {
  ipcRelease();
  std::string record(kIpcRecordBytes, '\0');
  auto refuse = [&](const std::string& why) {
    record[0] = 0;
    const size_t n = std::min(why.size(), kIpcRecordBytes - 2);
    record[1] = static_cast<char>(n);
    std::memcpy(&record[2], why.data(), n);
    return record;
  };
  try {
    rt_->bind(dev);
    ipc_dev_ = dev;
    ipc_own_ = rt_->allocDevice(round_bytes * static_cast<size_t>(buffers));
    const std::string handle = rt_->exportMemory(ipc_own_);
    if (handle.size() > kIpcRecordBytes - 2) return refuse("the runtime's IPC handle is too long");
    record[0] = 1;
    record[1] = static_cast<char>(handle.size());
    std::memcpy(&record[2], handle.data(), handle.size());
    ipc_round_bytes_ = round_bytes;
    ipc_buffers_ = buffers;
    return record;
  } catch (const Error& e) {
    return refuse(e.what());
  }
}

bool DevicePath::ipcAccept(const std::vector<std::string>& records, int me, std::string* why) {
  DDL_ASSERT(me >= 0 && me < static_cast<int>(records.size()));
  std::vector<char*> bases(records.size(), nullptr);
  auto undo = [&] {
    for (size_t m = 0; m < bases.size(); ++m)
      if (bases[m] && static_cast<int>(m) != me) rt_->closeMemory(bases[m]);
  };
  for (size_t m = 0; m < records.size(); ++m) {
    const std::string& r = records[m];
    const size_t n = r.size() >= 2 ? static_cast<unsigned char>(r[1]) : 0;
    if (r.size() != kIpcRecordBytes || n > kIpcRecordBytes - 2) {
      *why = "member " + std::to_string(m) + " sent a malformed IPC record";
    } else if (r[0] != 1) {
      *why = "member " + std::to_string(m) + " has no device scratch: " + r.substr(2, n);
    } else if (static_cast<int>(m) == me) {
      if (!ipc_own_) {
        *why = "this rank has no device scratch";
      } else {
        bases[m] = static_cast<char*>(ipc_own_);
        continue;
      }
    } else {
      try {
        bases[m] = static_cast<char*>(rt_->importMemory(r.substr(2, n)));
        continue;
      } catch (const Error& e) {
        *why = "opening member " + std::to_string(m) + "'s device scratch: " + e.what();
      }
    }
    undo();
    return false;
  }
  ipc_bases_ = bases;
  ipc_mem_ = std::make_unique<IpcMemory>(*rt_, std::move(bases), ipc_round_bytes_, ipc_buffers_);
  return true;
}

void DevicePath::ipcClosePeers() noexcept {
  ipc_mem_.reset();
  if (ipc_bases_.empty()) return;
  KeepDevice keep(*rt_);
  try {
    rt_->bind(ipc_dev_);  // handles are closed on the device that opened them
  } catch (const Error&) {
  }
  rt_->drain();  // no kernel of ours still reads a peer's scratch
  for (char* b : ipc_bases_)
    if (b && b != ipc_own_) rt_->closeMemory(b);
  ipc_bases_.clear();
}

void DevicePath::ipcRelease() noexcept {
  ipcClosePeers();
  if (ipc_own_) {
    KeepDevice keep(*rt_);
    rt_->setCurrent(ipc_dev_);
    rt_->freeDevice(ipc_own_);
  }
  ipc_own_ = nullptr;
  ipc_dev_ = -1;
}

NodeMemory& DevicePath::ipcMemory() {
  DDL_ASSERT(ipc_mem_);
  rt_->bind(ipc_dev_);
  ipc_mem_->reset();
  return *ipc_mem_;
}

}  // namespace ddl

#ifndef DDL_HAVE_CUDA
namespace ddl {
std::unique_ptr<DeviceRuntime> makeCudaRuntime() { return nullptr; }  // a build without the CUDA Toolkit
}  // namespace ddl
#endif
