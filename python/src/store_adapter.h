// store_adapter.h: StoreAdapter, libddl's ddlStore_t over torch's store. A group's communicator meets through
// it (ddlCommInitRankWithStore), and so do the communicators made from it later (ddlCommShrink, ddlCommGrow,
// ddlCommJoinWithStore: elastic.cpp): every ProcessGroupDDL of that lineage holds it, since libddl calls it
// for as long as they live.
//
// Threads: libddl calls it from the thread that makes, shrinks or grows a communicator, one at a time.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "ddl/ddl.h"
#include "torch_compat.h"

namespace torch_ddl {

// Keys go under "ddl/" in the group's (prefix) store.
struct StoreAdapter {
  c10::intrusive_ptr<c10d::Store> store;
  std::string last_error;

  static StoreAdapter* of(void* ctx) { return static_cast<StoreAdapter*>(ctx); }
  static std::string key(const char* k) { return std::string("ddl/") + k; }

  template <class F>
  int guarded(F&& f) {
    try {
      f();
      return 0;
    } catch (const std::exception& e) {
      last_error = e.what();
      return 1;
    }
  }

  ddlStore_t api() {
    ddlStore_t s{};
    s.ctx = this;
    s.set = [](void* ctx, const char* k, const void* value, size_t len) {
      return of(ctx)->guarded([&] {
        const auto* p = static_cast<const uint8_t*>(value);
        of(ctx)->store->set(key(k), std::vector<uint8_t>(p, p + len));
      });
    };
    s.get = [](void* ctx, const char* k, int timeout_ms, void (*deliver)(void*, const void*, size_t),
               void* sink) {
      return of(ctx)->guarded([&] {
        of(ctx)->store->wait({key(k)}, std::chrono::milliseconds(timeout_ms));
        const std::vector<uint8_t> v = of(ctx)->store->get(key(k));
        deliver(sink, v.data(), v.size());
      });
    };
    s.add = [](void* ctx, const char* k, long long delta, long long* result) {
      return of(ctx)->guarded([&] { *result = of(ctx)->store->add(key(k), delta); });
    };
    s.lastError = [](void* ctx) -> const char* { return of(ctx)->last_error.c_str(); };
    return s;
  }
};

}  // namespace torch_ddl
