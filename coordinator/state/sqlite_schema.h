// The SQLite state database's schema: an ordered list of migrations, each taking the schema from one version
// to the next. A fresh file runs all of them; SqliteStore::open runs those a file lacks, in one transaction,
// and refuses a file whose version is newer than kSchemaVersion. Append only: a released migration is never
// edited, since files out there were built by it.
#pragma once

#include <cstdint>

namespace ddl::state::sqlite_schema {

// The version this build writes; one migration per version.
inline constexpr int kSchemaVersion = 9;

// PRAGMA application_id marks the file as ours ("ddl1"), so an unrelated SQLite database is refused, not
// altered.
inline constexpr int32_t kApplicationId = 0x64646c31;

// The SQL that takes the schema from version `from_version` to from_version + 1 (0: the initial schema), or
// nullptr outside 0 .. kSchemaVersion - 1.
const char* migration(int64_t from_version);

}  // namespace ddl::state::sqlite_schema
