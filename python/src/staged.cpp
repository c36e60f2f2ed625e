// staged.cpp: the staged path (staged.h): host bodies queued for the group's worker in call order, after the
// CUDA streams that produce their tensors, over contiguous (host) copies of the tensors where needed.
#include "staged.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstring>
#include <memory>
#include <utility>

#include "process_group_ddl.h"
#include "work.h"

namespace torch_ddl {

void syncDevice(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return;
  c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).synchronize();
}

Staged stage(const at::Tensor& t, bool device_ok, bool read_input) {
  Staged s{t, t, false};
  const bool on_device = !t.device().is_cpu();
  if (on_device && !device_ok) {
    s.buf = read_input ? t.to(at::kCPU).contiguous() : at::empty(t.sizes(), t.options().device(at::kCPU));
  } else if (!t.is_contiguous()) {
    s.buf = read_input ? t.contiguous() : at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
  }
  s.copy_back = !s.buf.is_same(t);
  return s;
}

void unstage(Staged& s) {
  if (!s.copy_back) return;
  s.user.copy_(s.buf);
  syncDevice(s.user);  // the data is on the device when the Work completes
}

at::Tensor flatBytes(const std::vector<at::Tensor>& tensors, std::vector<size_t>* offsets) {
  size_t total = 0;
  for (const auto& t : tensors) {
    offsets->push_back(total);
    total += t.nbytes();
  }
  at::Tensor flat = at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte));
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor src = tensors[i].to(at::kCPU).contiguous();
    std::memcpy(static_cast<char*>(flat.data_ptr()) + (*offsets)[i], src.data_ptr(), src.nbytes());
  }
  return flat;
}

void copyOut(at::Tensor& t, const at::Tensor& flat, size_t offset) {
  if (t.nbytes() == 0) return;
  at::Tensor bytes = flat.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(t.nbytes()));
  at::Tensor view = at::from_blob(bytes.data_ptr(), t.sizes(), t.options().device(at::kCPU));  // contiguous
  t.copy_(view);
  syncDevice(t);
}

std::vector<c10::Event> readyEvents(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Event> events;
  for (const auto& t : tensors) {
    if (!t.defined() || t.device().is_cpu()) continue;
    const auto* impl = c10::impl::getDeviceGuardImpl(t.device().type());
    events.emplace_back(t.device().type());
    events.back().record(impl->getStream(t.device()));
  }
  return events;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::submitHost(c10d::OpType type, const char* title, Call call) {
  auto work = c10::make_intrusive<CollectiveWork>(rank_, type, title, call.outputs,
                                                  c10::optional<std::vector<at::Tensor>>(call.inputs));
  Entry entry{std::move(call.host), [work](std::exception_ptr e) { work->complete(e); }};
  // CUDA producers: the worker first waits for what is queued on the tensors' streams now (CPU tensors: none).
  std::vector<at::Tensor> touched = call.inputs;  // outputs too: the caller's stream may still read them
  touched.insert(touched.end(), call.outputs.begin(), call.outputs.end());
  if (auto ready = readyEvents(touched); !ready.empty()) {
    auto events = std::make_shared<std::vector<c10::Event>>(std::move(ready));
    entry.run = [events, body = std::move(entry.run)] {
      for (const auto& ev : *events) waitEvent(ev);
      body();
    };
  }
  enqueue(std::move(entry), /*here_ok=*/false);
  return work;
}

}  // namespace torch_ddl
