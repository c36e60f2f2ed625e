// Status and StatusOr<T>: the error values of ddl's control plane (coordinator, agent, ddlctl, their settings and
// the base library's parsers).
//
// Recoverable failures (a job that does not exist, an illegal state transition, a database that cannot be
// opened) are returned as values, never thrown across an interface; broken invariants are assertions. The
// codes are a subset of gRPC's so a handler can map them one to one. A message says what failed, for which
// job or node, and where it helps, what to do. Both types are copyable and may be passed between threads.
//
// Header-only and dependency-free (ddl_base). The coordinator's code names them state::Status, from before they
// moved here; the aliases at the end keep that spelling valid.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace ddl {

// Every refusal of a coordinator that cannot store its state (a full disk, etcd unreachable) is UNAVAILABLE
// and says this, so that a client tells the coordinator's answer ("not now, and nothing was done") from an
// outage (no answer: maybe done, ask again).
inline constexpr const char* kCannotStoreState = "cannot store the coordinator's state";

enum class StatusCode {
  kOk = 0,
  kInvalidArgument = 3,     // The request itself is malformed (empty command, bad failure info).
  kNotFound = 5,            // No such job or node.
  kPermissionDenied = 7,    // A known caller not allowed this call (another user's job, an admin verb).
  kFailedPrecondition = 9,  // Legal request, wrong state: e.g. RUNNING -> SCHEDULED, or a final job.
  kInternal = 13,           // A storage call failed (I/O, disk full, locked past the busy timeout).
  kUnavailable = 14,        // The store is closed or could not be opened.
  kDataLoss = 15,           // The file is not a database, or the database is corrupt or from a newer version.
  kUnauthenticated = 16,    // No valid identity: no token, a wrong one, no node certificate.
};

inline const char* toString(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case StatusCode::kUnauthenticated:
      return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK.
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  static Status invalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status notFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status failedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }
  static Status internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status dataLoss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
  static Status permissionDenied(std::string msg) { return {StatusCode::kPermissionDenied, std::move(msg)}; }
  static Status unauthenticated(std::string msg) { return {StatusCode::kUnauthenticated, std::move(msg)}; }

  bool isOk() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return isOk(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "FAILED_PRECONDITION: job j-000042: ..." — for logs and test failure output.
  std::string toString() const {
    if (isOk()) return "OK";
    return std::string(ddl::toString(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a T or a non-OK Status. Accessing value() of an error is a programming error (asserted).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT: implicit, so `return job;` works.
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit, so `return Status::...;` works.
    assert(!status_.isOk() && "StatusOr built from an OK Status without a value");
    if (status_.isOk()) status_ = Status::internal("StatusOr built from an OK Status without a value");
  }

  bool isOk() const { return status_.isOk(); }
  explicit operator bool() const { return isOk(); }
  const Status& status() const { return status_; }

  const T& value() const& {
    assert(isOk());
    return *value_;
  }
  T& value() & {
    assert(isOk());
    return *value_;
  }
  T&& value() && {
    assert(isOk());
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace ddl

namespace ddl::state {
using ddl::Status;
using ddl::StatusCode;
using ddl::StatusOr;
using ddl::toString;
}  // namespace ddl::state
