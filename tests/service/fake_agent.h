// FakeAgent: an agent for tests that speaks the real AgentService protocol over gRPC but runs no processes.
// It registers, holds the Connect stream, records every command, and on StartRanks marks the ranks RUNNING
// (reporting them at once, as ddl-agent does); tests then make ranks exit, send heartbeats, or go silent.
//
// Threads: one reader thread per connection; every public method may be called from the test's thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddl/v1/ddl.grpc.pb.h"

namespace ddl::testing {

class FakeAgent {
 public:
  // pki_dir "": plaintext (an --insecure coordinator); else mutual TLS with PKI_DIR/ca.crt, node.crt, node.key.
  FakeAgent(std::string target, std::string node, int gpus, std::map<std::string, std::string> labels = {},
            const std::string& pki_dir = "");
  ~FakeAgent();

  // Register (reporting the ranks it holds) and open the stream. Returns "" or the error.
  std::string connect();
  // Ends the stream (as if the agent died or lost its network). Held ranks are kept.
  void disconnect();
  // Sends one heartbeat with every held rank; false when the stream is gone.
  bool heartbeat();
  // Sends heartbeats every interval_ms from a background thread until stopHeartbeats().
  void startHeartbeats(int interval_ms);
  void stopHeartbeats();

  // Waits for a StartRanks (or StopJob) for the job; false on timeout.
  bool waitStart(const std::string& job, v1::StartRanks* out, int timeout_ms = 5000);
  bool waitStop(const std::string& job, int timeout_ms = 5000);
  // Makes a held rank exit with a code (or signal when `signal` is true) and reports it at once.
  bool exitRank(const std::string& job, int rank, int code, bool signal = false,
                const std::string& error = "");
  // Every held rank of the job exits with code 0.
  bool exitAll(const std::string& job);
  // Ranks still held (running or exited but not yet released by a StopJob).
  std::vector<v1::RankStatus> held();
  const std::string& node() const { return node_; }
  const std::string& session() const { return session_; }
  // The status of the last stream once it ended (for checks of a refused session).
  grpc::Status lastStreamStatus();

 private:
  void readLoop();
  bool write(const v1::AgentMessage& msg);

  const std::string target_, node_;
  const int gpus_;
  const std::map<std::string, std::string> labels_;
  std::unique_ptr<v1::AgentService::Stub> stub_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::string session_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::Command>> stream_;
  std::mutex write_mu_;
  std::thread reader_;
  std::vector<v1::Command> commands_;
  std::map<std::pair<std::string, int>, v1::RankStatus> ranks_;  // (job, rank)
  grpc::Status last_status_;
  bool stream_done_ = true;

  std::thread heartbeater_;
  bool heartbeating_ = false;
};

}  // namespace ddl::testing
