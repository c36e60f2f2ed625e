// MemoryStore: the Store for ranks that are threads of one process (algorithm tests, LocalTransport). A map
// under one mutex; get() sleeps on a condition variable that every set() and add() wakes, so a reader blocked
// on a key another rank has not published yet costs nothing while it waits, and gives up at its deadline with
// ddlTimeout; getMany() likewise, for all its keys at once. Semantics match TcpStore exactly (add() keeps the
// value as a decimal string, so get() of a counter works), so code tested over this store behaves the same over
// TCP.
//
// Threads: any thread may call any method at any time.
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "error.h"
#include "rendezvous/store.h"

namespace ddl {
namespace {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }

  std::string get(const std::string& key, const Deadline& deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = data_.find(key);
      if (it != data_.end()) return it->second;
      if (deadline.expired()) {
        fail(ddlTimeout, "timed out after " + std::to_string(deadline.timeoutMs()) + " ms waiting for key '" +
                             key + "' in the in-memory store (did every rank start and publish it?)");
      }
      // At least 1 ms: remainingMs() rounds down, and a 0 ms wait would spin until the deadline.
      int64_t wait_ms = deadline.remainingMs() > 0 ? deadline.remainingMs() : 1;
      cv_.wait_for(lock, std::chrono::milliseconds(wait_ms));
    }
  }

  std::vector<std::string> getMany(const std::vector<std::string>& keys, const Deadline& deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    size_t next = 0;  // keys before it exist (keys are never removed)
    for (;;) {
      while (next < keys.size() && data_.count(keys[next]) != 0) ++next;
      if (next == keys.size()) break;
      if (deadline.expired()) {
        size_t missing = 0;
        for (size_t i = next; i < keys.size(); ++i) missing += data_.count(keys[i]) == 0;
        fail(ddlTimeout, "timed out after " + std::to_string(deadline.timeoutMs()) + " ms waiting for key '" +
                             keys[next] + "'" +
                             (missing > 1 ? " and " + std::to_string(missing - 1) + " more" : std::string()) +
                             " in the in-memory store (did every rank start and publish it?)");
      }
      int64_t wait_ms = deadline.remainingMs() > 0 ? deadline.remainingMs() : 1;
      cv_.wait_for(lock, std::chrono::milliseconds(wait_ms));
    }
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const std::string& key : keys) values.push_back(data_.at(key));
    return values;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::string& value = data_[key];  // a missing key counts as 0
      int64_t current = 0;
      if (!value.empty()) {
        const char* end = value.data() + value.size();
        auto [ptr, ec] = std::from_chars(value.data(), end, current);
        if (ec != std::errc() || ptr != end) {
          fail(ddlInvalidArgument,
               "cannot add to store key '" + key + "': its value '" + value + "' is not a decimal integer");
        }
      }
      if (__builtin_add_overflow(current, delta, &result)) {
        fail(ddlInvalidArgument, "cannot add " + std::to_string(delta) + " to store key '" + key +
                                     "': the result overflows int64 (value " + value + ")");
      }
      value = std::to_string(result);
    }
    cv_.notify_all();
    return result;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::string> data_;  // guarded by mu_
};

}  // namespace

std::shared_ptr<Store> makeMemoryStore() { return std::make_shared<MemoryStore>(); }

}  // namespace ddl
