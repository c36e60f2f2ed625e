// DeviceAllReduce: allreduce of buffers the host collective cannot touch (CUDA device memory), behind a small
// interface so that Comm needs no CUDA header and a build without CUDA has none of it.
//
// The one implementation is comm/cuda/staged_allreduce.cpp (built with the CUDA Toolkit): it stages the data
// through pinned host memory and runs the host collective chunk by chunk. A communicator of a build without
// CUDA has no DeviceAllReduce at all.
//
// Threads: called by the thread that runs the communicator's collective (the caller, or the executor for
// ddlIallReduce), one call at a time.
#pragma once

#include <cstddef>
#include <functional>

#include "ddl/ddl.h"

namespace ddl {

class DeviceAllReduce {
 public:
  // The host collective: count elements from src into dst, both host memory (src == dst: in place).
  // Throws ddl::Error.
  using HostAllReduce = std::function<void(const void* src, void* dst, size_t count)>;

  virtual ~DeviceAllReduce() = default;

  // True when sendbuf or recvbuf is memory that only this path may touch.
  virtual bool handles(const void* sendbuf, const void* recvbuf) = 0;

  // The whole allreduce of count elements (count > 0, handles() true). The result is in recvbuf when it
  // returns. Throws ddl::Error: ddlCudaError for a failed CUDA call, or whatever the host collective threw.
  virtual void allReduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                         const HostAllReduce& host) = 0;
};

}  // namespace ddl
