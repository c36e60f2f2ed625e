// WaitContext: what a wait outside the transport (the node's shared-memory segment, shm_node.h) asks of the
// collective it belongs to between its sleeps: one round of transport progress with the collective's checks
// (abort, peers' failure reports, the deadline), and the names its messages give. Session (session.h, a floor
// up) is the one implementation, so transport/ needs nothing from above it.
//
// Threads: the thread that runs the collective.
#pragma once

#include <string>

namespace ddl {

class WaitContext {
 public:
  // One round of transport progress and the checks, without idling; throws ddl::Error when the collective
  // must end. waiting_for names the awaited rank in a timeout's message.
  virtual void poll(int waiting_for) = 0;
  // "rank 3 (host-b)".
  virtual std::string peerName(int rank) const = 0;
  // "allreduce #12 (float32 sum, count 1024)".
  virtual std::string describe() const = 0;

 protected:
  ~WaitContext() = default;
};

}  // namespace ddl
