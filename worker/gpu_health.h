// The health of the node's GPUs and of the node, as the agent reports it with each heartbeat.
//
// GpuHealth watches NVML (nvml.h) for the faults that make a GPU unfit for
// work: an Xid event of the kinds NVIDIA's documentation says need a reset or service (48 double-bit ECC, 61
// and 62 micro-controller errors, 63 and 64 row remap or page retirement, 74 NVLink, 79 fallen off the bus,
// 92/94/95 ECC, 119/120 GSP, 140 unrecovered ECC), a rise in the volatile uncorrectable ECC count (past its
// first reading: a count from before the agent started is the GPU's history since its last reset), a row
// remap pending or failed, pages pending retirement, and a GPU NVML reports lost or gives no handle for; and,
// as a warning only, clocks slowed down by heat or a power brake. A fault is sticky: the agent keeps
// reporting it until an admin clears it (`ddlctl admin gpu-ok NODE GPU`, which the coordinator passes on); a
// condition that still holds then (a remap still pending) is raised again. Other Xids (13, 31, 43: a
// program's own error) are logged and nothing more.
//
// HealthCheck runs the site's health check program (Slurm's HealthCheckProgram, as sites run NHC) at start
// and every interval: exit 0 passes; anything else, or no exit within its timeout, fails with its last line
// of output, which the coordinator makes the node's drain reason.
//
// Threads: GpuHealth's calls may come from any threads (one poll() at a time; faults() never waits for NVML);
// HealthCheck runs its own thread and its failure() may be read from any.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"

namespace ddl::worker {

// Why an Xid makes its GPU unfit for work, or "" for one that does not (the program's error, not the GPU's).
std::string fatalXid(int xid);

class GpuHealth {
 public:
  // NVML's first `gpus` devices, watched for the agent's life; null where NVML cannot be loaded (virtual
  // GPUs are not watched). `library`: NVML's, or a test's stand-in.
  static std::unique_ptr<GpuHealth> open(int gpus, const std::string& library = "libnvidia-ml.so.1");
  ~GpuHealth();

  // Reads what happened since the last call and returns every fault not cleared, by GPU. One poller at a
  // time.
  std::vector<v1::GpuFault> poll(int64_t now_ms);
  // The faults not cleared, as the last poll() left them (no NVML call: for the heartbeat).
  std::vector<v1::GpuFault> faults();
  // What slows the GPUs down now, as the last poll() saw it (not a fault: the GPUs still work, slower):
  // "GPU 1 slowed down (HW thermal slowdown)"; "" when nothing does.
  std::string slowdown();
  // An admin cleared the GPU: its fault goes until a new event raises it again.
  void clear(int gpu);

 private:
  struct Nvml;
  explicit GpuHealth(std::unique_ptr<Nvml> nvml);
  void raise(int gpu, const std::string& reason, int xid, int64_t now_ms);  // mu_ held
  std::vector<v1::GpuFault> faultsLocked() const;

  std::unique_ptr<Nvml> nvml_;
  std::mutex poll_mu_;  // one poll() at a time (it reads NVML without mu_)
  std::mutex mu_;       // guards what follows
  std::map<int, v1::GpuFault> faults_;
  std::vector<unsigned long long> ecc_seen_;  // the highest uncorrectable count seen, per GPU
  bool ecc_primed_ = false;                   // the first reading was taken
  std::vector<bool> remap_seen_, retire_seen_, lost_seen_;
  std::string slowdown_;
};

class HealthCheck {
 public:
  // Runs `program` (a path, no arguments) now and every interval_s, each run at most timeout_s.
  HealthCheck(std::string program, double interval_s, double timeout_s);
  // Does not wait for a run in progress (its thread is detached and ends after it).
  ~HealthCheck();
  // "" when the last run passed, "exit 1: <its last line>" when it failed; nullopt until a run ended.
  std::optional<std::string> failure();

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
    std::optional<std::string> failure;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// One run of a health check program: "" when it exits 0 within timeout_s, else why not with its last line.
// It runs in a process group of its own, which is killed when it ends (or at the timeout).
std::string runHealthCheck(const std::string& program, double timeout_s);

}  // namespace ddl::worker
