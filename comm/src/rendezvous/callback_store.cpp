// CallbackStore: the Store over a caller's ddlStore_t (ddlCommInitRankWithStore), so that ranks meet through a
// store their framework already shares (torch.distributed's TCPStore, FileStore, ...) instead of a TCP port of
// libddl's own. Values are bytes both ways; add() is optional in ddlStore_t and throws here when missing (the
// bootstrap skips the check that needs it).
//
// Threads: used by the initialising thread only, during the bootstrap.
#include <algorithm>
#include <cstdint>
#include <string>

#include "error.h"
#include "rendezvous/store.h"

namespace ddl {
namespace {

class CallbackStore : public Store {
 public:
  explicit CallbackStore(const ddlStore_t& s) : s_(s) {}

  void set(const std::string& key, const std::string& value) override {
    if (s_.set(s_.ctx, key.c_str(), value.data(), value.size()) != 0) failed("set", key, ddlSystemError, 0);
  }

  std::string get(const std::string& key, const Deadline& deadline) override {
    std::string out;
    bool delivered = false;
    struct Sink {
      std::string* out;
      bool* delivered;
    } sink{&out, &delivered};
    auto deliver = [](void* p, const void* value, size_t len) {
      auto* k = static_cast<Sink*>(p);
      k->out->assign(static_cast<const char*>(value), len);
      *k->delivered = true;
    };
    const int64_t ms = std::max<int64_t>(1, deadline.remainingMs());
    if (s_.get(s_.ctx, key.c_str(), static_cast<int>(std::min<int64_t>(ms, INT32_MAX)), deliver, &sink) != 0) {
      failed("get", key, ddlTimeout, deadline.timeoutMs());
    }
    if (!delivered) fail(ddlInternalError, "the store's get of '" + key + "' returned 0 but gave no value");
    return out;
  }

  bool canAdd() const override { return s_.add != nullptr; }
  int64_t add(const std::string& key, int64_t delta) override {
    DDL_ASSERT(s_.add != nullptr);
    long long result = 0;
    if (s_.add(s_.ctx, key.c_str(), delta, &result) != 0) failed("add", key, ddlSystemError, 0);
    return result;
  }

 private:
  [[noreturn]] void failed(const char* what, const std::string& key, ddlResult_t code, int64_t timeout_ms) {
    const char* why = s_.lastError ? s_.lastError(s_.ctx) : nullptr;
    std::string msg = std::string("the rendezvous store's ") + what + " of key '" + key + "' failed";
    if (timeout_ms > 0) msg += " within " + std::to_string(timeout_ms) + " ms";
    if (why && *why) msg += ": " + std::string(why);
    if (code == ddlTimeout) msg += " (did every rank start and join the same store?)";
    fail(code, msg);
  }

  ddlStore_t s_;
};

}  // namespace

std::unique_ptr<Store> makeCallbackStore(const ddlStore_t& store) { return std::make_unique<CallbackStore>(store); }

}  // namespace ddl
