// Test helper shared by device_path_test (an emulated GPU) and cuda_allreduce_test (a real one): the staged
// allreduce of three types x three ops, 10 chunks of 4 KiB with a short last one, in every placement of
// sendbuff and recvbuff (device to device, device in place, host to device, device to host), each against the
// host path's result on the same data. Runs inside a rank thread; throws ddl::Error naming the case.
#pragma once

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm.h"
#include "device/device_path.h"
#include "dtype.h"
#include "error.h"
#include "reduce.h"
#include "test_values.h"

namespace ddl::test_util {

// How a test reaches device memory.
struct DeviceMemory {
  std::function<void*(size_t bytes)> alloc;
  std::function<void(void*)> free;
  std::function<void(void* device, const void* host, size_t bytes)> put;
  std::function<std::vector<char>(const void* device, size_t bytes)> get;
};

// path: made with a 4096-byte chunk limit.
inline void checkStagedPlacements(Comm& comm, DevicePath& path, const DeviceMemory& mem) {
  for (ddlDataType_t t : {ddlFloat32, ddlInt64, ddlFloat16}) {
    for (ddlRedOp_t op : {ddlSum, ddlMax, ddlAvg}) {
      const size_t count = 10007;  // 40 KB of float32: 10 chunks, the last one short
      const size_t bytes = count * typeSize(t);
      auto host = [&](const void* s, void* d, size_t n) { comm.allReduce(s, d, n, t, op); };
      const auto in = makeInput(t, op, comm.rank(), count);
      std::vector<char> want(bytes);
      comm.allReduce(in.data(), want.data(), count, t, op);  // host path: the reference
      struct Buffers {
        const DeviceMemory& mem;
        void* send;
        void* recv;
        ~Buffers() {
          mem.free(send);
          mem.free(recv);
        }
      } d{mem, mem.alloc(bytes), mem.alloc(bytes)};
      const std::string what = std::string(typeName(t)) + " " + opName(op);
      auto expect = [&](const std::vector<char>& got, const char* placement) {
        if (got != want) fail(ddlInternalError, what + ": " + placement + ": differs from the host path");
      };
      mem.put(d.send, in.data(), bytes);
      path.stagedAllReduce(d.send, d.recv, count, t, host);
      expect(mem.get(d.recv, bytes), "device to device");
      path.stagedAllReduce(d.send, d.send, count, t, host);
      expect(mem.get(d.send, bytes), "device in place");
      const std::vector<char> zeros(bytes, 0);
      mem.put(d.recv, zeros.data(), bytes);
      path.stagedAllReduce(in.data(), d.recv, count, t, host);
      expect(mem.get(d.recv, bytes), "host to device");
      mem.put(d.send, in.data(), bytes);
      std::vector<char> out(bytes);
      path.stagedAllReduce(d.send, out.data(), count, t, host);
      expect(out, "device to host");
    }
  }
}

}  // namespace ddl::test_util
