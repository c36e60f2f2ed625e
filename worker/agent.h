// Agent: the heart of ddl-agent, one per node. It registers the node with the coordinator (its inventory and
// the ranks it already runs), holds one Connect stream, sends heartbeats with the state of every rank it
// holds and rank events the moment a rank starts or exits, and carries out commands: StartRanks launches each
// rank through the Supervisor with the environment the coordinator computed (plus CUDA_VISIBLE_DEVICES),
// StopJob stops a job's ranks (SIGTERM, then SIGKILL after the grace) and releases the ranks that have
// exited, and SignalJob sends a signal to the process groups of a job's running ranks
// (Supervisor::signalJob). When the stream breaks it registers again with backoff and jitter; the ranks keep
// running meanwhile and are reported on the new registration, so the coordinator reconciles instead of losing
// or orphaning them.
//
// Who ranks run as: an agent running as root runs every rank as the job's user (StartRanks.user) as this
// node knows it, never as uid 0 unless StartRanks.allow_root; a job without a user, with a user this node
// lacks, or a refused uid 0 has its ranks fail with that reason (RankStatus.error). An agent that is not root
// cannot switch users and runs every rank as its own user (a single-user development setup).
//
// Threads: run() blocks the calling thread (the session loop: register, then read commands); a heartbeat
// thread per session writes heartbeats; the Supervisor's thread reports exits. stop() may be called from any
// thread (the signal-waiting thread in main.cpp).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ddl/tls.h"
#include "ddl/v1/ddl.grpc.pb.h"
#include "worker/agent_config.h"
#include "worker/confinement.h"
#include "worker/gpu_health.h"
#include "worker/inventory.h"
#include "worker/supervisor.h"
#include "worker/telemetry_listener.h"

namespace ddl::worker {

// The node's TLS files in config.pki_dir: ca.crt, node.crt, node.key.
tls::Files tlsFiles(const AgentConfig& config);

class Agent {
 public:
  Agent(AgentConfig config, Inventory inventory);
  ~Agent();

  // Registers and serves until stop(). Reconnects with backoff when the coordinator goes away.
  void run();
  // Ends run(). With stop_ranks_on_exit, running ranks are stopped with the given grace first; otherwise they
  // keep running, recorded under DATA_DIR/ranks, and the next agent started on that data dir adopts them.
  void stop(int rank_grace_ms);

  const std::string& address() const { return address_; }

 private:
  // One registration and its stream; returns why it ended.
  std::string session(int* consecutive_failures);
  void handle(const v1::Command& command);
  void startRanks(const v1::StartRanks& start);
  void readLog(const v1::ReadLog& read);
  void signalJob(const v1::SignalJob& command);
  void onRankExit(const RankState& state);
  // Tells the running ranks' logs when the logs' disk warning changes (a heartbeat's work).
  void noteDiskInRankLogs(const std::string& warning);
  void forgetIfGone(const std::string& job);
  bool write(const v1::AgentMessage& message);
  v1::RankStatus toProto(const RankState& state) const;
  std::string logPath(const std::string& job, int attempt, int rank) const;
  // Where a preemption's deadline is written for the attempt's ranks (DDL_PREEMPT_DEADLINE_FILE).
  std::string preemptDeadlinePath(const std::string& job, int attempt) const;

  const AgentConfig config_;
  const Inventory inventory_;
  const Confinement confinement_;  // ranks' cgroups (or why there are none)
  // Whether ranks run as their job's user: only an agent running as root can switch users.
  const bool run_as_job_user_;
  const std::string agent_user_;  // the agent's own user, which ranks run as otherwise
  std::string address_;
  std::string instance_;  // random per process (RegisterRequest.instance)
  // The logs' disk, checked every few seconds by a thread of its own (detached: a hung file system must stop
  // neither heartbeats nor the agent's exit); the heartbeat sends the latest warning.
  struct DiskWatch {
    std::mutex mu;
    std::condition_variable cv;
    std::string warning;
    bool stop = false;
  };
  std::shared_ptr<DiskWatch> disk_watch_ = std::make_shared<DiskWatch>();
  std::string
      disk_noted_;  // the disk warning the running ranks' logs were told of, "" none (heartbeat thread)
  std::vector<std::string> coordinators_;  // config_.coordinator's addresses (several share an etcd store)
  std::vector<std::unique_ptr<v1::AgentService::Stub>> stubs_;  // per address, made by session()
  grpc::ChannelArguments channel_args_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  size_t current_ = 0;  // the one run() tries now; only run()'s thread touches it
  int grace_ms_ = 10000;  // the coordinator's heartbeat grace, from its last answer (run()'s thread)
  std::unique_ptr<Supervisor> supervisor_;
  std::unique_ptr<TelemetryListener> telemetry_;  // null when its socket could not be made
  // Null for virtual GPUs, or where NVML cannot be opened; shared with the thread that polls it every second
  // (stopped with the disk watch's flag).
  std::shared_ptr<GpuHealth> gpu_health_;
  std::unique_ptr<HealthCheck> health_check_;     // null without health_check_program
  // Deletes old rank logs (log_retention_hours, log_max_mb) every few minutes until stop(); see
  // worker/log_retention.h. Not started when both are 0.
  std::thread log_cleaner_;
  void cleanLogsUntilStopped();

  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  bool stopping_ = false;
  grpc::ClientContext* context_ = nullptr;  // the live stream's, for TryCancel
  grpc::ClientReaderWriter<v1::AgentMessage, v1::Command>* stream_ = nullptr;
  std::map<std::string, int> stopped_;  // job -> newest attempt told to stop: its exits are released at once

  std::mutex write_mu_;  // one Write at a time on the stream
};

}  // namespace ddl::worker
