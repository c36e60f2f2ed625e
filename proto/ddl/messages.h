// Small facts derived from ddl.v1 messages that every reader of them (ddlctl, the dashboard) shows the same way.
// Pure functions; any thread.
#pragma once

#include <google/protobuf/message.h>

#include <string>

#include "ddl/v1/ddl.pb.h"

namespace ddl {

// The message as JSON in protobuf's mapping with the proto field names and default values printed (what
// `ddlctl -o json` and the dashboard's /api/v1 answer). No trailing newline.
std::string toJson(const google::protobuf::Message& message);

// Bus bandwidth of the rank's last collective in GB/s: for allreduce algbw x 2(n-1)/n as nccl-tests reports it,
// for other collectives algbw. 0 when nothing was timed.
double lastBusBwGBps(const v1::RankProgress& progress);

// The straggler: the rank that spent the least time in collectives over the run (every other rank waits for it
// inside each collective), where that is at least 20% below the most; -1 when fewer than two ranks ran
// collectives or none stands out.
int slowestRank(const v1::Job& job);

}  // namespace ddl
