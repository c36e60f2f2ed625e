// Whole job and node records as one value each, for stores that keep a record under one key (EtcdStore).
//
// The encoding is MessagePack of a JSON-shaped document: strings are length-prefixed bytes, so argv and env
// round-trip arbitrary bytes (NUL, '=', newlines, invalid UTF-8) as they do in SQLite's child tables; numbers
// keep their width. Every document carries "v" (the record version, 1) so a later layout can be told apart.
// The fields no query filters on are the same jobs.extra document SqliteStore keeps (sqlite_codec.h), under
// "extra", so both stores agree on them by construction. Decoding is strict about what identifies a record
// (DATA_LOSS naming the key for a value that is not a record, an unknown state) and tolerant about the rest,
// as sqlite_codec is. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"
#include "state/job.h"

namespace ddl::state::record_codec {

std::string encodeJob(const Job& job);
// `id` is the job's id (the key's); the record does not repeat it.
StatusOr<Job> decodeJob(const std::string& id, const std::string& bytes);

// Upper bounds of encodeJob's and encodeNode's sizes, from the records' own sizes without encoding them (a
// string inside "extra" counted six times over, as JSON may escape each byte as \u00XX).
size_t jobBytesBound(const Job& job);
size_t nodeBytesBound(const NodeRecord& node);

std::string encodeNode(const NodeRecord& node);
StatusOr<NodeRecord> decodeNode(const std::string& name, const std::string& bytes);

}  // namespace ddl::state::record_codec
