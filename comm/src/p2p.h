// Point-to-point sends and receives beside the collectives: ddlSend, ddlRecv, ddlIsend, ddlIrecv.
//
// Matching: p2p messages carry tag::kP2P, so they never match a collective's receive (nor the reverse). An
// untagged operation (ddlIsend, ddlIrecv) carries a sequence number per ordered pair of ranks: the k-th send
// from a to b matches the k-th receive on b from a, MPI's non-overtaking order. A tagged one (ddlIsendTagged,
// ddlIrecvTagged) carries the user's tag instead (tag::kUserTag in the unit, its bits spread over the unit and
// the sequence field; see userTagBits) and no sequence number: a receive matches the first message from its
// peer with its tag, or, from DDL_ANY_SOURCE, from any rank (the sender bits masked out; the sender is read
// back from the matched tag). Messages of one pair and tag keep their order because the transport matches in
// arrival order per sender (UCX's tag matching, LocalTransport's queue). The unit bit keeps the two kinds
// apart. Either way the tag's signature covers the type and count, so a receive whose type or count differs
// from the send's fails as a mismatch naming the peer, as a collective's does, instead of reading garbage or
// waiting for ever.
//
// Progress: operations are submitted from any thread and wait in `incoming_`; the thread that drives the
// transport posts them and completes what finished: a collective's Session between its rounds (so a send
// and a collective in flight at once never wait for each other), or the communicator's executor when no
// collective runs. Each operation has its own deadline, the communicator's timeout from the moment it is
// posted. A timeout, a dead or failed peer or ddlCommAbort fails it with a message naming the peer rank and
// host; a failed operation also breaks the communicator, since the pair's sequence numbers no longer agree.
//
// Threads: submit(), active() and broken() from any thread; poll() and shutdown() only from the thread that
// holds the transport (the communicator's op lock).
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "async_op.h"
#include "ddl/ddl.h"
#include "deadline.h"
#include "session.h"

namespace ddl {

struct P2POp {
  bool is_recv = false;
  int peer = -1;
  void* buf = nullptr;  // a send only reads it
  size_t count = 0;
  ddlDataType_t type = ddlUint8;
  int tag = -1;            // >= 0: tagged; then a receive's peer may be DDL_ANY_SOURCE
  int* source = nullptr;   // a tagged receive: gets the sender's rank before result finishes
  std::shared_ptr<AsyncOp> result = std::make_shared<AsyncOp>();
  // Filled in when posted.
  Request req;
  uint16_t seq = 0;
  uint64_t sig_bits = 0;
  std::optional<Deadline> deadline;
  // A failure found while the request was still posted: it is cancelled, and op finishes with this once the
  // transport has let go of the buffer (or cancel_deadline passed).
  ddlResult_t fail_code = ddlSuccess;
  std::string fail_why;
  std::optional<Deadline> cancel_deadline;
};

// active() and poll() are P2PProgress's (session.h), through which Sessions drive it.
class PointToPoint final : public P2PProgress {
 public:
  explicit PointToPoint(Channel& ch);
  ~PointToPoint();

  // Queues op for posting. Any thread.
  void submit(std::unique_ptr<P2POp> op);

  // After a failure, broken() holds the first one.
  bool poll() override;
  // The failure that broke point-to-point traffic: {ddlSuccess, ""} while there is none. Any thread.
  std::pair<ddlResult_t, std::string> broken() const;
  // Whether there is one: a lock-free load, for the paths every collective takes. Any thread.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Cancels everything still queued or posted (bounded wait for the transport to let go) and fails it with
  // code and why. For teardown and after the communicator broke.
  void shutdown(ddlResult_t code, const std::string& why);

 private:
  void post(P2POp& op);
  // Done, failed or late: finishes op's AsyncOp and returns true when op is over.
  bool settle(P2POp& op);
  void failOp(P2POp& op, ddlResult_t code, const std::string& why);
  void markBrokenLocked(ddlResult_t code, const std::string& why);  // mu_ held; keeps the first failure
  std::string describe(const P2POp& op) const;
  void updateActive();

  Channel& ch_;
  std::vector<uint16_t> send_seq_, recv_seq_;  // next sequence number per peer
  mutable std::mutex mu_;                      // guards incoming_ and broken_
  std::list<std::unique_ptr<P2POp>> incoming_;
  std::list<std::unique_ptr<P2POp>> posted_;   // only the transport's thread touches it
  // Operations finished (failed) while the transport still held their request: kept alive until teardown.
  std::list<std::unique_ptr<P2POp>> abandoned_;
  int polls_ = 0;
  std::atomic<bool> failed_{false};  // broken_code_ != ddlSuccess
  ddlResult_t broken_code_ = ddlSuccess;
  std::string broken_why_;
};

}  // namespace ddl
