// Allreduce of CUDA device buffers, staged through pinned host memory (see staged_allreduce.cpp).
#pragma once

#include <cstddef>
#include <memory>

#include "device_allreduce.h"

namespace ddl::cuda {

// The largest pipeline chunk: the pinned memory a communicator keeps is three chunks.
constexpr size_t kMaxChunkBytes = size_t{8} << 20;

// The chunk size for a message of bytes: a quarter of the message, so that even a few-MiB message has
// copies and wire overlapping, but at least 512 KiB (each chunk is one host collective and pays its latency)
// and at most max_chunk_bytes (rounded down to a multiple of 64 bytes, at least 64). A function of its
// arguments only: every rank cuts the message the same way, so every rank runs the same collectives.
size_t stagedChunkBytes(size_t bytes, size_t max_chunk_bytes = kMaxChunkBytes);

// The DeviceAllReduce of one rank of a communicator. Allocates nothing until the first device allreduce.
// transport_cuda: whether the transport could carry device memory itself (UCX built with CUDA); the staged
// path is used either way (the direct one is not written yet), and DDL_DEBUG=1 reports both.
std::unique_ptr<DeviceAllReduce> makeStagedAllReduce(int rank, bool transport_cuda,
                                                     size_t max_chunk_bytes = kMaxChunkBytes);

}  // namespace ddl::cuda
