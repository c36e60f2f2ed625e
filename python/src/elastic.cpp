// elastic.cpp: ProcessGroupDDL's elastic side (process_group_ddl.h), behind torch_ddl/elastic.py: whether a
// peer is gone, and the groups made by libddl's ddlCommShrink, ddlCommGrow and ddlCommJoinWithStore, which
// meet through the store of the group they come from (store_adapter.h) with no new address.
#include <stdexcept>

#include "arguments.h"
#include "process_group_ddl.h"
#include "store_adapter.h"

namespace torch_ddl {
namespace {

// A group over comm (made from another's store, adapter), or none when comm is null. The communicator is
// destroyed if the group cannot be made.
c10::intrusive_ptr<ProcessGroupDDL> groupOver(ddlComm_t comm, std::shared_ptr<StoreAdapter> adapter,
                                              std::chrono::milliseconds timeout) {
  if (!comm) return {};
  int rank = 0, size = 0;
  ddlCommUserRank(comm, &rank);
  ddlCommCount(comm, &size);
  try {
    return c10::make_intrusive<ProcessGroupDDL>(comm, rank, size, std::move(adapter), timeout);
  } catch (...) {
    ddlCommDestroy(comm);
    throw;
  }
}

}  // namespace

bool ProcessGroupDDL::rankLost() const {
  if (closed_.load() || !comm_) return false;
  ddlResult_t r = ddlSuccess;
  ddlCommGetAsyncError(comm_, &r);
  return r == ddlRemoteError || r == ddlTimeout;
}

void ProcessGroupDDL::quiesce() {
  if (closed_.load()) refuse("the process group was shut down");
  std::unique_lock<std::mutex> lk(mu_);
  if (!idle_cv_.wait_for(lk, timeout_, [&] { return queue_.empty() && !busy_; })) {
    throw std::runtime_error("ddl: the group's queued calls did not finish within its timeout");
  }
}

c10::intrusive_ptr<ProcessGroupDDL> ProcessGroupDDL::shrink() {
  quiesce();
  ddlComm_t next = nullptr;
  check(ddlCommShrink(comm_, nullptr, 0, &next), "ddlCommShrink");
  return groupOver(next, adapter_, timeout_);
}

c10::intrusive_ptr<ProcessGroupDDL> ProcessGroupDDL::grow(int max_new) {
  quiesce();
  ddlComm_t next = nullptr;
  check(ddlCommGrow(comm_, max_new, &next), "ddlCommGrow");
  return groupOver(next, adapter_, timeout_);
}

c10::intrusive_ptr<ProcessGroupDDL> ProcessGroupDDL::join(const c10::intrusive_ptr<c10d::Store>& store,
                                                          std::chrono::milliseconds timeout) {
  auto adapter = std::make_shared<StoreAdapter>(StoreAdapter{store, {}});
  ddlStore_t api = adapter->api();
  const ddlConfig_t cfg = config(timeout);
  ddlComm_t comm = nullptr;
  if (ddlCommJoinWithStore(&comm, &api, &cfg) != ddlSuccess) {
    throw std::runtime_error(std::string("ddl: cannot join: ") + ddlGetLastError(nullptr));
  }
  return groupOver(comm, std::move(adapter), timeout);
}

std::vector<int> ProcessGroupDDL::excluded() const {
  if (closed_.load()) refuse("the process group was shut down");
  int count = 0;
  check(ddlCommGetExcluded(comm_, nullptr, 0, &count), "ddlCommGetExcluded");
  std::vector<int> ranks(count);
  if (count) check(ddlCommGetExcluded(comm_, ranks.data(), count, &count), "ddlCommGetExcluded");
  return ranks;
}

}  // namespace torch_ddl
