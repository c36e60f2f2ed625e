// point_to_point.cpp: send, recv (from a rank or any source) and monitored_barrier, over libddl's tagged
// sends and receives (ddlIsendTagged, ddlIrecvTagged). A receive takes the first message of its tag from its
// peer, or from any rank (recv without src: the Work's source rank is the sender), as gloo's; messages of one
// pair and tag keep their order. They bypass the group's queue: libddl takes them from any thread and moves
// them on by itself; the group keeps each pending one (P2PState, work.h) until it is finished, so that no
// buffer is freed under libddl. CUDA tensors are staged through host memory (staged.h). monitored_barrier is
// gloo's protocol over tagged messages with tags of torch_ddl's own (kMonitoredBarrierTags, refused to users).
#include "process_group_ddl.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "arguments.h"
#include "staged.h"

namespace torch_ddl {

namespace {
// monitoredBarrier's messages: two tags per call, from the top of libddl's tag range down, kept from users.
constexpr int kMonitoredBarrierTags = 1 << 20;
constexpr int kFirstReservedTag = DDL_MAX_TAG - kMonitoredBarrierTags + 1;
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::p2p(std::vector<at::Tensor>& tensors, int peer, int tag,
                                                    bool is_recv) {
  const at::Tensor& t = single(tensors, is_recv ? "recv" : "send");
  if (closed_.load()) refuse("the process group was shut down");
  if (!(is_recv && peer == DDL_ANY_SOURCE) && (peer < 0 || peer >= size_ || peer == rank_)) {
    refuse(std::string(is_recv ? "recv: src " : "send: dst ") + std::to_string(peer) +
           " is not another rank of this group of " + std::to_string(size_));
  }
  if (tag < 0 || tag >= kFirstReservedTag) {
    refuse(std::string(is_recv ? "recv" : "send") + ": tag " + std::to_string(tag) + " is not between 0 and " +
           std::to_string(kFirstReservedTag - 1) + " (the tags above are torch_ddl's own)");
  }
  reapP2P(false);
  auto state = std::make_shared<P2PState>();
  state->tensor = t;
  state->is_recv = is_recv;
  syncDevice(t);
  Staged s = stage(t, /*device_ok=*/false, /*read_input=*/!is_recv);
  state->staged = s.buf;
  state->copy_back = is_recv && s.copy_back;
  ddlResult_t r = is_recv ? ddlIrecvTagged(s.buf.data_ptr(), s.buf.nbytes(), ddlUint8, peer, tag, comm_,
                                           &state->source, &state->request)
                          : ddlIsendTagged(s.buf.data_ptr(), s.buf.nbytes(), ddlUint8, peer, tag, comm_,
                                           &state->request);
  check(r, is_recv ? "recv" : "send");
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    p2p_pending_.push_back(state);
  }
  return c10::make_intrusive<P2PWork>(rank_, is_recv ? c10d::OpType::RECV : c10d::OpType::SEND, std::move(state));
}

std::shared_ptr<P2PState> ProcessGroupDDL::controlMessage(int peer, int tag, bool is_recv) {
  auto state = std::make_shared<P2PState>();
  state->is_recv = is_recv;
  state->tensor = at::full({1}, static_cast<int64_t>(rank_), at::TensorOptions().dtype(at::kLong));
  state->staged = state->tensor;
  void* buf = state->tensor.data_ptr();
  check(is_recv ? ddlIrecvTagged(buf, 1, ddlInt64, peer, tag, comm_, &state->source, &state->request)
                : ddlIsendTagged(buf, 1, ddlInt64, peer, tag, comm_, &state->request),
        "monitored_barrier");
  std::lock_guard<std::mutex> lk(p2p_mu_);
  p2p_pending_.push_back(state);
  return state;
}

void ProcessGroupDDL::reapP2P(bool wait_all) {
  std::lock_guard<std::mutex> lk(p2p_mu_);
  for (auto it = p2p_pending_.begin(); it != p2p_pending_.end();) {
    if ((*it)->settle(wait_all)) {
      it = p2p_pending_.erase(it);
    } else {
      ++it;
    }
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return p2p(tensors, dst_rank, tag, /*is_recv=*/false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return p2p(tensors, src_rank, tag, /*is_recv=*/true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return p2p(tensors, DDL_ANY_SOURCE, tag, /*is_recv=*/true);
}

// monitored_barrier: gloo's protocol and messages (torch's tests match them): every other rank sends rank 0 a message and waits
// for its answer; rank 0 waits for each rank's message within what is left of the timeout (or, waitAllRanks,
// the whole timeout for each, to name every rank that did not come), then answers them all. Only rank 0
// enforces the timeout, so that it is rank 0 that names the missing rank; the others wait up to the group's
// timeout (libddl's bound on every receive). A rank that fails leaves its receives posted: libddl fails them
// at the group's timeout or teardown, and the next call uses other tags.

namespace {
std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}
}  // namespace

void ProcessGroupDDL::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  if (closed_.load()) refuse("the process group was shut down");
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const uint32_t call = monitored_barriers_++;
  const int to_root = kFirstReservedTag + static_cast<int>((2 * call) % kMonitoredBarrierTags);
  const int from_root = to_root + 1;
  if (rank_ != 0) {
    try {
      auto sent = controlMessage(0, to_root, /*is_recv=*/false);
      auto answer = controlMessage(0, from_root, /*is_recv=*/true);
      for (auto* st : {&sent, &answer}) {
        (*st)->settle(/*wait=*/true);
        if ((*st)->result != ddlSuccess) throw std::runtime_error((*st)->error);
      }
    } catch (const std::exception& e) {
      throw std::runtime_error("Rank " + std::to_string(rank_) +
                               " successfully reached monitoredBarrier, but received errors while waiting for "
                               "send/recv from rank 0. Please check rank 0 logs for faulty rank.\n Original "
                               "exception: \n" + std::string(e.what()));
    }
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  // Waits for each message in rank order; returns the ranks that answered.
  auto waitLoop = [&](const std::vector<std::pair<int, std::shared_ptr<P2PState>>>& messages) {
    std::vector<int> answered;
    for (const auto& [peer, state] : messages) {
      const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                              start);
      const auto left = waitAllRanks ? timeout : timeout - spent;
      if (!waitAllRanks && left.count() <= 0) {  // gloo's rule: no time left is a timeout of rank 0
        throw std::runtime_error(
            "Rank 0 timed out in monitoredBarrier after " + std::to_string(timeout.count()) + " ms.\n" +
            (answered.empty() ? std::string("No ranks successfully processed in monitoredBarrier.")
                              : "Successfully processed ranks: " + joinRanks(answered)));
      }
      const auto end = std::chrono::steady_clock::now() + left;
      bool done = state->settle(false);
      while (!done && std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        done = state->settle(false);
      }
      if (done && state->result == ddlSuccess) {
        answered.push_back(peer);
        continue;
      }
      const std::string error = "[Rank 0]: Rank " + std::to_string(peer) + " failed to pass monitoredBarrier in " +
                                std::to_string(timeout.count()) + " ms";
      if (!waitAllRanks) {
        throw std::runtime_error(error + "\n Original exception: \n" +
                                 (done ? state->error : "ddl: no message within the timeout"));
      }
    }
    if (waitAllRanks && answered.size() != messages.size()) {
      std::vector<int> failed;
      for (const auto& m : messages) {
        if (std::find(answered.begin(), answered.end(), m.first) == answered.end()) failed.push_back(m.first);
      }
      throw std::runtime_error("[Rank 0]: Ranks " + joinRanks(failed) + " failed to pass monitoredBarrier in " +
                               std::to_string(timeout.count()) + " ms");
    }
  };
  std::vector<std::pair<int, std::shared_ptr<P2PState>>> arrivals, answers;
  for (int r = 1; r < size_; ++r) arrivals.emplace_back(r, controlMessage(r, to_root, /*is_recv=*/true));
  waitLoop(arrivals);
  // Everyone came: release them all, so that either every rank passes or none does.
  for (int r = 1; r < size_; ++r) answers.emplace_back(r, controlMessage(r, from_root, /*is_recv=*/false));
  waitLoop(answers);
}

}  // namespace torch_ddl
