// staged.h: the staged path's buffers. A Call's host body (process_group_ddl.h) runs on the group's worker as
// one blocking libddl call over contiguous buffers: the tensor itself where it already is one (and, for a CUDA
// tensor, where libddl takes device memory for the call), else a contiguous copy, in host memory for CUDA
// tensors, copied back once the call is done. ProcessGroupDDL::submitHost (staged.cpp) queues such a body after
// the streams that produce its CUDA tensors. Point-to-point stages its buffers the same way. Any thread.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <cstddef>
#include <vector>

namespace torch_ddl {

// libddl built with CUDA takes device buffers in ddlAllReduce (python/CMakeLists.txt and setup.py define
// DDL_LIBDDL_CUDA then; the packages pin torch_ddl to the libddl built with it). Elsewhere CUDA tensors go
// through host memory.
#ifdef DDL_LIBDDL_CUDA
constexpr bool kLibddlTakesDeviceBuffers = true;
#else
constexpr bool kLibddlTakesDeviceBuffers = false;
#endif

// Blocks until the work queued so far on t's device's current stream has finished (no-op for CPU tensors).
void syncDevice(const at::Tensor& t);

// A contiguous buffer for t that libddl may read and write: t itself when it already is one (and, for CUDA
// tensors, when libddl takes device memory for this call), else a contiguous copy (host memory for CUDA
// tensors), which unstage() copies back.
struct Staged {
  at::Tensor user;
  at::Tensor buf;
  bool copy_back = false;
};

// read_input: the copy takes t's data (an input), else it is only allocated (an output).
Staged stage(const at::Tensor& t, bool device_ok, bool read_input);
// Copies the buffer back into the user's tensor where it is a copy; on the device by the time it returns.
void unstage(Staged& s);

// A contiguous host copy of tensors laid end to end (for list collectives), and its byte offsets.
at::Tensor flatBytes(const std::vector<at::Tensor>& tensors, std::vector<size_t>* offsets);

// Copies the bytes at flat + offset into t (any layout, any device).
void copyOut(at::Tensor& t, const at::Tensor& flat, size_t offset);

// An event recorded now on the current stream of each CUDA tensor's device (none for CPU tensors): the worker
// waits for them before its host body reads or writes the tensors.
std::vector<c10::Event> readyEvents(const std::vector<at::Tensor>& tensors);

}  // namespace torch_ddl
