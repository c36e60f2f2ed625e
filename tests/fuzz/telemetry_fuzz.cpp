// Fuzzes the agent's parser of the telemetry datagrams that ranks send to DDL_AGENT_SOCKET
// (worker/telemetry_listener.h), a socket every local user may write to. The listener reads at most 2047
// bytes of a datagram, so longer inputs are cut as it cuts them.
//
// Checks: what parses serialises to a RankProgress that parses back (as the coordinator parses the heartbeat
// that carries it) and is equal; the job id is printable ASCII.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <google/protobuf/util/message_differencer.h>

#include "worker/telemetry_listener.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 2047) size = 2047;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string job;
  int attempt = 0, rank = -1;
  ddl::v1::RankProgress progress;
  if (ddl::worker::TelemetryListener::parse(text, &job, &attempt, &rank, &progress)) {
    std::string wire;
    ddl::v1::RankProgress back;
    bool ok = progress.SerializeToString(&wire) && back.ParseFromString(wire) &&
              google::protobuf::util::MessageDifferencer::Equals(progress, back);
    for (unsigned char c : job) ok = ok && c >= 0x20 && c < 0x7f;
    if (!ok) {
      std::fprintf(stderr, "telemetry_fuzz: a parsed report does not survive the heartbeat's round trip\n");
      std::abort();
    }
  }
  return 0;
}
