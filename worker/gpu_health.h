// The health of the node's GPUs and of the node, as the agent reports it with each heartbeat.
//
// GpuHealth watches NVML (loaded at run time, as inventory.cpp does) for the faults that make a GPU unfit for
// work: an Xid event of the kinds NVIDIA's documentation says need a reset or service (48 double-bit ECC, 62
// and 64 internal and remap errors, 63 row remap, 74 NVLink, 79 fallen off the bus, 92/94/95 ECC, 119/120
// GSP,
// ...), a rise in the volatile uncorrectable ECC count, a row remap pending or failed, pages pending
// retirement, and a GPU NVML reports lost; and, as a warning only, clocks slowed down by heat or a power
// brake. A fault is sticky: the agent keeps reporting it until an admin clears it (`ddlctl admin gpu-ok NODE
// GPU`, which the coordinator passes on), and only a new event raises it again. Other Xids (13, 31, 43: a
// program's own error) are logged and nothing more.
//
// HealthCheck runs the site's health check program (Slurm's HealthCheckProgram, as sites run NHC) at start
// and every interval: exit 0 passes; anything else, or no exit within its timeout, fails with its last line
// of output, which the coordinator makes the node's drain reason.
//
// Threads: GpuHealth's poll() and clear() may be called from any threads (a mutex); HealthCheck runs its
// own thread and its failure() may be read from any.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"

namespace ddl::worker {

// Why an Xid makes its GPU unfit for work, or "" for one that does not (the program's error, not the GPU's).
std::string fatalXid(int xid);

class GpuHealth {
 public:
  // NVML's first `gpus` devices, watched for the agent's life; null where NVML cannot be loaded or has
  // fewer (virtual GPUs are not watched).
  static std::unique_ptr<GpuHealth> open(int gpus);
  ~GpuHealth();

  // Reads what happened since the last call and returns every fault not cleared, by GPU.
  std::vector<v1::GpuFault> poll(int64_t now_ms);
  // What slows the GPUs down now, as the last poll() saw it (not a fault: the GPUs still work, slower):
  // "GPU 1 slowed down (HW thermal slowdown)"; "" when nothing does.
  std::string slowdown();
  // An admin cleared the GPU: its fault goes until a new event raises it again.
  void clear(int gpu);

 private:
  struct Nvml;
  explicit GpuHealth(std::unique_ptr<Nvml> nvml);
  void raise(int gpu, const std::string& reason, int xid, int64_t now_ms);

  std::unique_ptr<Nvml> nvml_;
  std::mutex mu_;
  std::map<int, v1::GpuFault> faults_;        // guarded by mu_
  std::vector<unsigned long long> ecc_seen_;  // the uncorrectable count last seen, per GPU
  std::vector<bool> remap_seen_, retire_seen_, lost_seen_;
  std::string slowdown_;  // guarded by mu_
};

class HealthCheck {
 public:
  // Runs `program` (a path, no arguments) now and every interval_s, each run at most timeout_s.
  HealthCheck(std::string program, double interval_s, double timeout_s);
  // Does not wait for a run in progress (its thread is detached and ends after it).
  ~HealthCheck();
  // "" while the last run passed (or none ended yet); else "exit 1: <its last line>".
  std::string failure();

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
    std::string failure;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// One run of a health check program: "" when it exits 0 within timeout_s, else why not with its last line.
std::string runHealthCheck(const std::string& program, double timeout_s);

}  // namespace ddl::worker
