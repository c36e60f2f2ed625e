#include "ddl/messages.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>

namespace ddl {

std::string toJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Fails only for malformed messages (invalid UTF-8 in a string field), which a parsed message cannot hold.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

double lastBusBwGBps(const v1::RankProgress& p) {
  if (p.last_us() <= 0) return 0;
  const double algbw = static_cast<double>(p.last_bytes()) / p.last_us() / 1e3;
  const int n = std::max(1, p.world_size());
  return p.last_op() == "allreduce" ? algbw * 2 * (n - 1) / n : algbw;
}

int slowestRank(const v1::Job& job) {
  // Every rank waits inside each collective for the last to arrive, so the straggler is the rank that spent
  // the least time in collectives over the run; named only where it is clear (20% below the most).
  int straggler = -1, ranks = 0;
  double least = 0, most = 0;
  for (const auto& r : job.ranks()) {
    if (!r.has_progress() || r.progress().collectives() <= 0) continue;
    const double s = r.progress().seconds();
    if (ranks++ == 0 || s < least) {
      least = s;
      straggler = r.rank();
    }
    most = std::max(most, s);
  }
  return ranks >= 2 && least < 0.8 * most ? straggler : -1;
}

}  // namespace ddl
