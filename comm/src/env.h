// The environment's values (getEnv) and the number parsers every DDL_* variable goes through, shared by every
// floor of comm/src. The choices they name live with what they choose (Algo in algo/algo.h, DeviceScheme in
// device/stream_path.h); reading a communicator's whole Options from ddlConfig_t and the environment is
// options.h's, on the top floor. Threads: pure functions (getEnv reads the environment, which libddl never
// writes).
#pragma once

#include <string>

namespace ddl {

// Environment helpers: the value, or empty when unset.
std::string getEnv(const char* name);
// Parses a decimal integer in [lo, hi]; throws ddlInvalidArgument naming what and the text.
long long parseInt(const std::string& text, const char* what, long long lo, long long hi);
// A byte count, optionally with a K, M or G suffix (powers of 1024), in [lo, hi]; throws ddlInvalidArgument
// naming what.
long long parseByteCount(const std::string& text, const char* what, long long lo, long long hi);

}  // namespace ddl
