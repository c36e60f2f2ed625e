// stream_ordered.cpp: the stream-ordered path (TORCH_DDL_STREAM_ORDERED: torch >= 2.10 and a libddl built
// with CUDA), which ProcessGroupDDL::submit takes where a Call has a stream body and all of its tensors are on
// one GPU; as ProcessGroupNCCL. The group's own CUDA stream (one from torch's pool, on the first call's
// device) waits for the caller's current stream through an event, the stream body runs with that stream
// current (so the contiguous copies and slices it makes are ordered there too) and enqueues libddl's *OnStream
// call on it, and the call returns a StreamWork (work.h); the host never waits for the GPU. Work.wait() and
// synchronize() make the caller's current stream wait for the group's; the Future is CUDA-aware (then()
// callbacks run on streams that wait for it). The tensors are kept by the Work and recorded on the group's
// stream in torch's caching allocator, so freeing them early is safe. Only torch's generic c10::Stream,
// c10::Event and DeviceGuardImpl are used, so no CUDA header or libc10_cuda is needed.
//
// The enqueue runs on the calling thread when nothing is queued ahead of it, else on the worker in call order
// (wait() then first waits on the host for that enqueue); where libddl runs the group host-paced (a call
// waits for its stream and runs the whole collective), always on the worker, so that the caller goes on
// queueing GPU work. TORCH_DDL_BLOCKING=1 makes the caller wait for the result. A failure found on the GPU
// later (a dead peer, a timeout) breaks the communicator: the next call, and wait(), raise it. A collective
// can be captured in a CUDA graph once the group has run one before the capture (libddl maps its peers at
// the first call); the capture must also take in the Work's wait().
#include "process_group_ddl.h"

#if TORCH_DDL_STREAM_ORDERED

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "arguments.h"

namespace torch_ddl {

c10::Stream ProcessGroupDDL::streamFor(c10::Device device) {
  std::lock_guard<std::mutex> lk(stream_mu_);
  if (stream_ && stream_->device() != device) {
    refuse("this group runs on " + stream_->device().str() + " and got tensors on " + device.str() +
           " (one device per process, as NCCL)");
  }
  if (!stream_) stream_ = c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device);
  return *stream_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::submitStream(c10d::OpType type, const char* title, Call call,
                                                             c10::Device device) {
  const c10::Stream own = streamFor(device);
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  // The group's stream starts where the caller's current stream is now.
  const c10::Stream caller = impl->getStream(device);
  auto ready = std::make_shared<c10::Event>(device.type());
  ready->record(caller);
  auto work = c10::make_intrusive<StreamWork>(rank_, type, title, call.outputs, call.inputs, device, comm_ref_,
                                              blocking_);
  std::vector<at::Tensor> tensors = call.inputs;
  tensors.insert(tensors.end(), call.outputs.begin(), call.outputs.end());
  Entry entry;
  entry.run = [this, own, caller, ready, tensors, body = std::move(call.stream), work] {
    // An earlier failure on the GPU breaks the communicator: say so here, naming the peer.
    if (std::string broken = comm_ref_->asyncError(); !broken.empty()) throw std::runtime_error("ddl: " + broken);
    c10::StreamGuard on_own(own);  // the copies the body makes run on the group's stream too
    ready->block(own);
    // The caching allocator must not hand the tensors' memory to others before the group's stream is done
    // with them (recorded first: a body that fails part-way may have enqueued work already).
    const auto* impl = c10::impl::getDeviceGuardImpl(own.device_type());
    for (const auto& t : tensors) {
      if (t.defined() && t.has_storage()) impl->recordDataPtrOnStream(t.storage().data_ptr(), own);
    }
    try {
      body(own.native_handle());
    } catch (...) {
      // The caller's stream joins the group's again, so that a CUDA graph capture it was in can still end.
      c10::Event joined(own.device_type());
      joined.record(own);
      joined.block(caller);
      throw;
    }
    work->launched(own);
  };
  entry.finish = [work](std::exception_ptr e) {
    if (e) work->failed(e);
  };
  // Host-paced (libddl's scheme where its node kernel cannot serve: several nodes, a GPU shared without MPS),
  // a call waits for its stream and runs the whole collective before it returns; across nodes
  // ("kernel+wire") an allreduce waits for its node's reduce-scatter and the network. The worker makes such
  // calls, so that the caller (under DDP, the autograd thread) goes on queueing GPU work meanwhile.
  // submit() refused a closed group.
  const std::string scheme = streamScheme();
  enqueue(std::move(entry), /*here_ok=*/scheme == "kernel" || scheme == "unset");
  if (blocking_) {
    try {
      work->synchronize();  // the host waits for the result; a failure is raised by wait()
    } catch (const std::exception&) {
    }
  }
  return work;
}

bool ProcessGroupDDL::hotBuffersOn() {
  const char* env = std::getenv("TORCH_DDL_REGISTER");
  const std::string v = env ? env : "";
  if (v.empty() || v == "1" || v == "on") return true;
  if (v == "0" || v == "off") return false;
  refuse("TORCH_DDL_REGISTER=" + v +
         ": say 1 (or on) to register DDP's buckets for zero-copy, 0 (or off) not to");
}

HotBufferOps ProcessGroupDDL::hotOps() {
  HotBufferOps ops;
  ops.max_all = [this](std::vector<int64_t>& v) {
    check(ddlAllReduce(v.data(), v.data(), v.size(), ddlInt64, ddlMax, comm_), "registering DDP's buckets");
  };
  ops.add = [this](void* data, size_t bytes, std::string* why) -> void* {
    void* handle = nullptr;
    const ddlResult_t r = ddlCommRegister(comm_, data, bytes, &handle);
    if (r == ddlInvalidArgument && comm_ref_->asyncError().empty()) {  // this buffer stays staged
      *why = ddlGetLastError(nullptr);
      return nullptr;
    }
    check(r, "ddlCommRegister");
    return handle;
  };
  ops.remove = [this](void* handle) { check(ddlCommDeregister(comm_, handle), "ddlCommDeregister"); };
  return ops;
}

void ProcessGroupDDL::noteHot(const at::Tensor& buf, ddlStream_t stream) {
  if (!hot_on_ || !buf.has_storage()) return;
  if (!hot_kernel_) {  // until it is "kernel" (host-paced calls, slow anyway, ask every time)
    const std::string scheme = streamScheme();
    if (scheme != "kernel") return;
    hot_kernel_ = true;
  }
  int capturing = 0;  // at every call: a captured call on a registered storage keeps it registered for good
  check(ddlCommStreamCapturing(comm_, stream, &capturing), "ddlCommStreamCapturing");
  hot_.note(buf.storage(), capturing != 0, hot_ops_);
  registered_buffers_.store(hot_.registered());
  if (!hot_refusal_told_ && hot_.refusals() > 0) {
    TORCH_WARN("ddl: a CUDA allreduce buffer could not be registered for zero-copy and stays staged (",
               hot_.lastRefusal(), "); torch_ddl stops trying after ", hot_.kMaxRefusals,
               " such refusals. TORCH_DDL_REGISTER=0 turns registration off.");
    hot_refusal_told_ = true;
  }
}

}  // namespace torch_ddl

#endif  // TORCH_DDL_STREAM_ORDERED
