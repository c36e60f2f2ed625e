// The state of one non-blocking operation (ddlIallReduce, ddlIsend, ddlIrecv) that a ddlRequest_t points to.
//
// Threads: the thread that runs the operation (the communicator's executor, or whoever drives point-to-point
// progress) sets result and error, then done with release order and wakes the waiters; any thread may read
// result and error once it saw done with acquire order.
#pragma once

#include <atomic>
#include <string>

#include "ddl/ddl.h"

namespace ddl {

struct AsyncOp {
  std::atomic<bool> done{false};
  ddlResult_t result = ddlSuccess;
  std::string error;

  // Publishes the outcome, once.
  void finish(ddlResult_t code = ddlSuccess, std::string why = {}) {
    result = code;
    error = std::move(why);
    done.store(true, std::memory_order_release);
    done.notify_all();
  }
};

}  // namespace ddl
