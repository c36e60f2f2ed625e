// Test helper: runs a body on n ranks as threads of this process, each with its own Comm over one in-process
// LocalFabric, and collects how each rank ended. Shared by the algorithm and CUDA allreduce tests.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "comm.h"
#include "error.h"
#include "transport/local_transport.h"
#include "rendezvous/store.h"

namespace ddl::test_util {

// Each rank's error code (ddlSuccess when body returned normally) and message.
struct RankResult {
  ddlResult_t code = ddlSuccess;
  std::string what;
};

// With a store, the ranks also join their nodes (Comm::joinNode): shared memory among the ranks of a node.
inline std::vector<RankResult> runRanks(int nranks, const Options& opts, const std::function<void(Comm&)>& body,
                                        std::shared_ptr<LocalFabric> fabric = nullptr,
                                        std::shared_ptr<Store> store = nullptr) {
  if (!fabric) fabric = std::make_shared<LocalFabric>(nranks);
  std::vector<RankResult> results(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        Comm comm(std::make_unique<LocalTransport>(fabric, r), opts);
        if (store) comm.joinNode(*store, Deadline(opts.timeout_ms));
        body(comm);
      } catch (const Error& e) {
        results[r] = {e.code(), e.what()};
      } catch (const std::exception& e) {
        results[r] = {ddlInternalError, e.what()};
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// A fabric whose ranks are on nodes of per_node consecutive ranks ("node0", "node1", ...).
inline std::shared_ptr<LocalFabric> nodesOf(int nranks, int per_node) {
  auto fabric = std::make_shared<LocalFabric>(nranks);
  std::vector<std::string> nodes;
  for (int r = 0; r < nranks; ++r) nodes.push_back("node" + std::to_string(r / per_node));
  fabric->setNodes(nodes);
  return fabric;
}

inline void expectAllOk(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].code, ddlSuccess) << "rank " << r << ": " << results[r].what;
  }
}

}  // namespace ddl::test_util
