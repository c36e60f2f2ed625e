// Internal error handling of libddl. Recoverable failures (I/O, peers, timeouts, bad input) are thrown as
// ddl::Error carrying the ddlResult_t the C API returns; the C API boundary (api.cpp) catches them, so no
// exception crosses into the caller. Broken invariants are DDL_ASSERT: they abort loudly.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "ddl/ddl.h"

namespace ddl {

class Error : public std::runtime_error {
 public:
  Error(ddlResult_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ddlResult_t code() const { return code_; }

 private:
  ddlResult_t code_;
};

[[noreturn]] inline void fail(ddlResult_t code, const std::string& what) { throw Error(code, what); }

// What every call on a communicator broken by an earlier failure (why) says.
inline std::string brokenMessage(const std::string& why) {
  return "the communicator is unusable after an earlier error: " + why +
         " (destroy it with ddlCommDestroy and create a new one)";
}

}  // namespace ddl

#define DDL_ASSERT(cond)                                                                          \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "libddl: internal invariant failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                                        \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)
