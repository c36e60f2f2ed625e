// BlockingCoordinator: the Coordinator with a synchronous form of every call, for tests, benches and the
// fuzzer.
//
// The daemon only uses the callback API (coordinator.h): a gRPC or HTTP handler never blocks its thread. Code
// that drives a coordinator step by step is simpler when a call returns its answer, so each form here starts
// the asynchronous call and waits for its `done`, which comes once every change the call made is durable:
// exactly what a remote caller would see. The callback forms stay visible beside these.
//
// Threads: any thread but the coordinator's own loop (a call from there would wait for itself); never from a
// `done`.
#pragma once

#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "service/coordinator.h"

namespace ddl::coordinator {

class BlockingCoordinator : public Coordinator {
 public:
  using Coordinator::Coordinator;

  using Coordinator::attachAgent;
  using Coordinator::cancel;
  using Coordinator::clearGpuFault;
  using Coordinator::drain;
  using Coordinator::getJob;
  using Coordinator::heartbeat;
  using Coordinator::hold;
  using Coordinator::listJobs;
  using Coordinator::listNodes;
  using Coordinator::logData;
  using Coordinator::metrics;
  using Coordinator::rankEvent;
  using Coordinator::readLog;
  using Coordinator::registerAgent;
  using Coordinator::removeNode;
  using Coordinator::requeue;
  using Coordinator::ring;
  using Coordinator::shares;
  using Coordinator::submit;
  using Coordinator::usage;

  // ---- Agents ----
  // attach, heartbeat and rankEvent also wait, after a success, until what they changed is durable and the
  // commands that waited for it are sent, so a test sees their effects when they return.
  StatusOr<v1::RegisterResponse> registerAgent(const v1::RegisterRequest& request) {
    return await<v1::RegisterResponse>([&](auto done) { registerAgent(request, std::move(done)); });
  }
  Status attachAgent(const std::string& node, const std::string& session, std::shared_ptr<AgentLink> link) {
    return durable(
        awaitStatus([&](auto done) { attachAgent(node, session, std::move(link), std::move(done)); }));
  }
  Status heartbeat(const std::string& node, const std::string& session, const v1::Heartbeat& heartbeat) {
    return durable(
        awaitStatus([&](auto done) { this->heartbeat(node, session, heartbeat, std::move(done)); }));
  }
  Status rankEvent(const std::string& node, const std::string& session, const v1::RankStatus& rank) {
    return durable(awaitStatus([&](auto done) { rankEvent(node, session, rank, std::move(done)); }));
  }
  Status logData(const std::string& node, const std::string& session, const v1::LogData& data) {
    return awaitStatus([&](auto done) { logData(node, session, data, std::move(done)); });
  }

  // ---- Users ----
  StatusOr<v1::Job> submit(const v1::JobSpec& spec) {
    return await<v1::Job>([&](auto done) { submit(spec, std::move(done)); });
  }
  StatusOr<v1::SubmitResponse> submit(const v1::SubmitRequest& request) {
    return await<v1::SubmitResponse>([&](auto done) { submit(request, std::move(done)); });
  }
  StatusOr<v1::Job> getJob(const std::string& id) {
    return await<v1::Job>([&](auto done) { getJob(id, std::move(done)); });
  }
  StatusOr<v1::ListJobsResponse> listJobs(const v1::ListJobsRequest& request) {
    return await<v1::ListJobsResponse>([&](auto done) { listJobs(request, std::move(done)); });
  }
  StatusOr<v1::Job> cancel(const std::string& id, int signal = 0) {
    return await<v1::Job>([&](auto done) { cancel(id, signal, std::move(done)); });
  }
  StatusOr<v1::Job> hold(const std::string& id, bool hold_it, bool by_admin = false) {
    return await<v1::Job>([&](auto done) { hold(id, hold_it, by_admin, std::move(done)); });
  }
  StatusOr<v1::Job> requeue(const std::string& id) {
    return await<v1::Job>([&](auto done) { requeue(id, std::move(done)); });
  }
  std::vector<v1::Node> listNodes() {
    auto nodes = await<std::vector<v1::Node>>([&](auto done) { listNodes(std::move(done)); });
    return nodes ? std::move(nodes).value() : std::vector<v1::Node>{};
  }
  StatusOr<v1::Node> drain(const std::string& node, bool drain_it, const std::string& reason = "") {
    return await<v1::Node>([&](auto done) { drain(node, drain_it, reason, std::move(done)); });
  }
  StatusOr<v1::Node> clearGpuFault(const std::string& node, int gpu) {
    return await<v1::Node>([&](auto done) { clearGpuFault(node, gpu, std::move(done)); });
  }
  StatusOr<v1::Node> removeNode(const std::string& node) {
    return await<v1::Node>([&](auto done) { removeNode(node, std::move(done)); });
  }
  StatusOr<v1::GetSharesResponse> shares() {
    return await<v1::GetSharesResponse>([&](auto done) { shares(std::move(done)); });
  }
  StatusOr<v1::GetUsageResponse> usage(const v1::GetUsageRequest& request) {
    return await<v1::GetUsageResponse>([&](auto done) { usage(request, std::move(done)); });
  }
  StatusOr<v1::RingLayout> ring(const std::string& id) {
    return await<v1::RingLayout>([&](auto done) { ring(id, std::move(done)); });
  }
  StatusOr<v1::GetLogsResponse> readLog(const v1::GetLogsRequest& request) {
    return await<v1::GetLogsResponse>([&](auto done) { readLog(request, std::move(done)); });
  }
  MetricsSnapshot metrics() {
    std::promise<MetricsSnapshot> promise;
    metrics([&](MetricsSnapshot m) { promise.set_value(std::move(m)); });
    return promise.get_future().get();
  }

 private:
  // After a success: waits for whenDurable().
  Status durable(Status st) {
    if (!st) return st;
    std::promise<void> promise;
    whenDurable([&] { promise.set_value(); });
    promise.get_future().get();
    return st;
  }
  // Starts a call with a `done` that hands its answer to this thread, and waits for it.
  template <class T, class Start>
  static StatusOr<T> await(Start start) {
    std::promise<StatusOr<T>> promise;
    start(Done<T>([&](StatusOr<T> answer) { promise.set_value(std::move(answer)); }));
    return promise.get_future().get();
  }
  template <class Start>
  static Status awaitStatus(Start start) {
    std::promise<Status> promise;
    start(StatusDone([&](Status st) { promise.set_value(std::move(st)); }));
    return promise.get_future().get();
  }
};

}  // namespace ddl::coordinator
