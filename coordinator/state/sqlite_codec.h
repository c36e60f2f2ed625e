// How SqliteStore encodes the parts of a record that are not plain columns.
//
//  - Index lists (a node's CPUs, an allocation's GPUs and CPUs) are decimal text, "0,1,2,3".
//  - jobs.extra (schema 6 on) holds, as one JSON object, every field no query filters on: the time limit,
//    dependencies, array membership, hold, the timestamps, each rank's last result. A key is written only
//    when its field differs from the default, and an absent key reads as the default, so a record written
//    before a field existed reads as it did and a new field needs no new table.
//
// Reading is tolerant by design: a field of the wrong type, or an extra record that is not JSON at all, reads
// as its default and is reported on stderr, so one damaged record cannot keep the coordinator from loading
// the rest. Pure functions; any thread may call.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "state/job.h"

namespace ddl::state::sqlite_codec {

std::string encodeIndices(const std::vector<int>& indices);
// nullopt for text that is not a comma-separated list of integers ("" is the empty list).
std::optional<std::vector<int>> decodeIndices(const std::string& text);

// A GPU's place in its node (GpuInfo's topology fields) as one JSON object, "" when all are unknown; the
// same text is node_gpus.topology in SQLite and "topology" in record_codec's node records.
std::string encodeGpuTopology(const GpuInfo& gpu);
// Sets gpu's topology fields from `text` ("" or damaged: left unknown).
void decodeGpuTopology(const std::string& text, GpuInfo& gpu);

// A node's GPU faults as one JSON list ("" for none): nodes.gpu_faults in SQLite, "gpu_faults" in
// record_codec's node records.
std::string encodeGpuFaults(const std::map<int, GpuFault>& faults);
// "" or damaged: none (a damaged list is reported on stderr).
std::map<int, GpuFault> decodeGpuFaults(const std::string& text);

// The jobs.extra document of `job`.
std::string encodeExtra(const Job& job);
// Sets the fields jobs.extra holds on `job` from `text`; fields absent from it keep their defaults.
void decodeExtra(const std::string& text, Job& job);

}  // namespace ddl::state::sqlite_codec
