// The point-to-point seam under the collective algorithms: tagged, non-blocking sends and receives between the
// ranks of one communicator, with explicit progress. UcxTransport is the real one; LocalTransport connects
// ranks that are threads of one process (fast algorithm tests, failure injection).
//
// Threads: one thread at a time calls a Transport's methods (the communicator serialises its callers).
// LocalTransport may complete a Request from another rank's thread; `done` is atomic for that reason.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ddl {

// One posted send or receive. Owned by the caller; its address must stay fixed until it is done (or cancelled
// and done). Filled in by the transport.
struct Request {
  std::atomic<bool> done{false};
  bool ok = true;
  int peer = -1;           // the peer rank for sends and matched receives, -1 = any source
  bool is_recv = false;
  size_t posted_len = 0;   // buffer size given to send/recv
  size_t length = 0;       // bytes actually received
  uint64_t sender_tag = 0; // full tag of the matched message (receives)
  bool truncated = false;  // the message was longer than the receive buffer
  std::string error;       // transport message when !ok
  void* impl = nullptr;    // transport-private
  void* impl2 = nullptr;   // transport-private

  // Back to a fresh request, for reuse.
  void reset() {
    done.store(false, std::memory_order_relaxed);
    ok = true;
    peer = -1;
    is_recv = false;
    posted_len = length = 0;
    sender_tag = 0;
    truncated = false;
    error.clear();
    impl = impl2 = nullptr;
  }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Host name of a rank, for error messages.
  virtual std::string hostOf(int rank) const = 0;
  // The node key of a rank (node_key.h): ranks with equal keys share a node and may share memory. Empty when
  // unknown (then the rank shares a node with nobody).
  virtual std::string nodeOf(int rank) const = 0;

  // Posts a send of len bytes to peer with tag. buf must stay valid until r.done.
  virtual void send(Request& r, int peer, uint64_t tag, const void* buf, size_t len) = 0;
  // Posts a receive matching messages whose tag equals tag on the bits set in mask. peer is informational
  // (the peer the tag selects, -1 = any) so that a failed peer can fail the request.
  virtual void recv(Request& r, int peer, uint64_t tag, uint64_t mask, void* buf, size_t len) = 0;
  // Asks to cancel an incomplete request; it becomes done (possibly !ok) after further progress.
  virtual void cancel(Request& r) = 0;
  // Drives communication; returns true when anything happened.
  virtual bool progress() = 0;
  // Looks, without receiving it, for a message that arrived but matches no posted receive and whose tag equals
  // tag on the bits of mask; returns true and its full tag in *sender_tag when there is one.
  virtual bool probe(uint64_t tag, uint64_t mask, uint64_t* sender_tag) = 0;
  // Non-empty when the transport knows that peer failed (its process died, its connection broke). Only a
  // connected peer (below) can be known to have failed.
  virtual std::string peerError(int peer) const = 0;
  // Whether this rank has a connection to peer. UcxTransport connects on the first send to or receive from a
  // peer, so a rank holds connections to the peers its algorithms use, not to all p-1.
  virtual bool connected(int peer) const { return peer >= 0 && peer < size() && peer != rank(); }
  // How many peers this rank has connected to (tests, DDL_DEBUG).
  virtual int connectedPeers() const { return size() - 1; }
  // Blocks the calling thread for at most timeout_us, or until the transport has news, whichever is first.
  // Used after spinning has found nothing, so idle ranks leave the CPU to others.
  virtual void idleWait(int timeout_us) = 0;
  // Any thread: ends an idleWait in progress (new work for the waiting thread, e.g. a point-to-point post).
  virtual void wake() {}
  // True when send and recv accept CUDA device memory (UCX built with CUDA support). Informational for now:
  // across nodes device buffers are staged through host memory either way (device_path.h).
  virtual bool deviceMemory() const { return false; }
};

}  // namespace ddl
