// torch_compat.h: every difference between the torches torch_ddl builds for (Debian's 1.13, 2.x up to the
// venv's 2.11), decided here once from torch/version.h. The rest of python/src tests the features below by
// name, never a torch version:
//   TORCH_DDL_BACKEND        torch >= 2.0: c10d::Backend exists; ProcessGroupDDL is one (GroupBase), which
//                            torch's ProcessGroup routes CPU and CUDA tensors to, and takes the coalesced forms.
//                            torch 1.13: ProcessGroupDDL is the c10d::ProcessGroup itself.
//   TORCH_DDL_SPARSE_HOOK    torch >= 2.1 asks a backend for sparse all_reduce through allreduce_sparse.
//   TORCH_DDL_NAMED_GROUP    torch >= 2.1: NamedProcessGroup (process_group_ddl.h) can name the group "ddl".
//   TORCH_DDL_SHUTDOWN       torch >= 2.7: Backend::shutdown and abort (destroy_process_group, abort).
//   TORCH_DDL_STREAM_ORDERED torch >= 2.10 (c10::Stream::native_handle gives the cudaStream_t without CUDA
//                            headers) and a libddl that takes CUDA streams (DDL_LIBDDL_CUDA): CUDA tensors
//                            take the stream-ordered path (stream_ordered.cpp). Elsewhere they are staged.
// and two helpers for what the torches spell differently (premulFactorTensor, waitEvent).
#pragma once

#include <torch/version.h>

#define TORCH_DDL_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if TORCH_DDL_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define TORCH_DDL_BACKEND 1
#else
#define TORCH_DDL_BACKEND 0
#endif
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#define TORCH_DDL_SPARSE_HOOK TORCH_DDL_AT_LEAST(2, 1)
#define TORCH_DDL_NAMED_GROUP TORCH_DDL_AT_LEAST(2, 1)
#define TORCH_DDL_SHUTDOWN TORCH_DDL_AT_LEAST(2, 7)

#if TORCH_DDL_AT_LEAST(2, 10) && defined(DDL_LIBDDL_CUDA)
#define TORCH_DDL_STREAM_ORDERED 1
#include <c10/core/Stream.h>
#include <optional>
#else
#define TORCH_DDL_STREAM_ORDERED 0
#endif

#include <c10/core/Event.h>

#include <chrono>
#include <thread>

namespace torch_ddl {

#if TORCH_DDL_BACKEND
using GroupBase = c10d::Backend;
#else
using GroupBase = c10d::ProcessGroup;
#endif

// The factor tensor of a PREMUL_SUM's supplement (c10d::NCCLPreMulSumSupplement): torch 2.x keeps one tensor,
// torch 1.13 a list (one per device). Undefined where the factor is a number.
template <class S>
auto premulFactorTensor(const S& s, int) -> decltype(s.tensor_factor) {
  return s.tensor_factor;
}
template <class S>
at::Tensor premulFactorTensor(const S& s, long) {
  return s.tensor_factors.empty() ? at::Tensor() : s.tensor_factors[0];
}
template <class S>
at::Tensor premulFactorTensor(const S& s) {
  return premulFactorTensor(s, 0);
}

// Blocks until ev's stream has reached it (torch 1.13's Event has query() but no synchronize()).
inline void waitEvent(const c10::Event& ev) {
  while (!ev.query()) std::this_thread::sleep_for(std::chrono::microseconds(10));
}

}  // namespace torch_ddl
