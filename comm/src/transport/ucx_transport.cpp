// UcxTransport (ucx_transport.h): UCX's context, worker and lazy endpoints, the bootstrap record gathered
// through the store, tagged sends and receives, peer errors, the wakeup fd, and libddl's UCX settings.
#include "transport/ucx_transport.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <sched.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "env.h"
#include "error.h"
#include "transport/node_key.h"

namespace ddl {
namespace {

struct Peer {
  int rank = -1;
  std::string host;
  std::string node;     // node_key.h
  std::string address;  // its UCX worker address, from the gather; the endpoint is made from it on first use
  ucp_ep_h ep = nullptr;
  std::string error;  // set by the endpoint error handler, or when the endpoint could not be made
};

// A rank's one record in the rendezvous store: its host name, node key and UCX worker address, each a u32
// length (network byte order, as the store's frames) and its bytes.
constexpr const char* kRecordPrefix = "boot/";

std::string encodeRecord(const std::vector<std::string>& fields) {
  std::string out;
  for (const std::string& f : fields) {
    const uint32_t len = htonl(static_cast<uint32_t>(f.size()));
    out.append(reinterpret_cast<const char*>(&len), sizeof len);
    out.append(f);
  }
  return out;
}

// False when record is not exactly n fields.
bool decodeRecord(std::string_view record, size_t n, std::vector<std::string>* fields) {
  fields->clear();
  for (size_t i = 0; i < n; ++i) {
    uint32_t len = 0;
    if (record.size() < sizeof len) return false;
    std::memcpy(&len, record.data(), sizeof len);
    len = ntohl(len);
    record.remove_prefix(sizeof len);
    if (record.size() < len) return false;
    fields->emplace_back(record.substr(0, len));
    record.remove_prefix(len);
  }
  return record.empty();
}

void complete(Request* r, ucs_status_t status) {
  if (status != UCS_OK) {
    r->ok = false;
    r->truncated = status == UCS_ERR_MESSAGE_TRUNCATED;
    r->error = ucs_status_string(status);
  }
  r->impl = nullptr;
  r->done.store(true, std::memory_order_release);
}

void sendDone(void* request, ucs_status_t status, void* user_data) {
  complete(static_cast<Request*>(user_data), status);
  ucp_request_free(request);
}

void recvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* r = static_cast<Request*>(user_data);
  if (status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED) {
    r->length = info->length;
    r->sender_tag = info->sender_tag;
  }
  complete(r, status);
  ucp_request_free(request);
}

void epFailed(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* p = static_cast<Peer*>(arg);
  if (p->error.empty()) p->error = ucs_status_string(status);
}

std::string hostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

[[noreturn]] void ucxFail(const std::string& what, ucs_status_t st) {
  fail(ddlSystemError, "UCX " + what + " failed: " + ucs_status_string(st));
}

class UcxTransport : public Transport {
 public:
  UcxTransport(int rank, int size) : rank_(rank), peers_(size) {}

  ~UcxTransport() override {
    // Flush-close every endpoint so our last messages reach peers that are still reading; force-close failed
    // ones. Bounded: a peer that is gone cannot hold us.
    std::vector<ucs_status_ptr_t> closing;
    for (auto& p : peers_) {
      if (!p.ep) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = p.error.empty() ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t sp = ucp_ep_close_nbx(p.ep, &param);
      if (sp && !UCS_PTR_IS_ERR(sp)) closing.push_back(sp);
      p.ep = nullptr;
    }
    Deadline d(2000);
    for (auto sp : closing) {
      while (ucp_request_check_status(sp) == UCS_INPROGRESS && !d.expired()) {
        if (!ucp_worker_progress(worker_)) sched_yield();
      }
      ucp_request_free(sp);
    }
    if (worker_) ucp_worker_destroy(worker_);
    if (context_) ucp_cleanup(context_);
  }

  void init(Store& store, const Deadline& deadline, bool wakeup) {
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) ucxFail("config read", st);
    try {
      applySettings(config);
    } catch (...) {
      ucp_config_release(config);
      throw;
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
    params.features = UCP_FEATURE_TAG | (wakeup ? UCP_FEATURE_WAKEUP : 0);
    params.estimated_num_eps = peers_.size();
    st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (st != UCS_OK) ucxFail("init", st);

    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(context_, &wp, &worker_);
    if (st != UCS_OK) ucxFail("worker create", st);
    // The worker's event fd: idle waits block on it (ucp_worker_arm) instead of sleeping blind. Where UCX has
    // none, waits sleep as before.
    if (wakeup && ucp_worker_get_efd(worker_, &efd_) != UCS_OK) efd_ = -1;

    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    st = ucp_worker_get_address(worker_, &addr, &addr_len);
    if (st != UCS_OK) ucxFail("worker address", st);
    std::string my_addr(reinterpret_cast<const char*>(addr), addr_len);
    ucp_worker_release_address(worker_, addr);

    debug_ = !getEnv("DDL_DEBUG").empty();
    // One record per rank, one gather: the store sees p SETs and p GETMANYs in all, one round trip each.
    peers_[rank_].rank = rank_;
    peers_[rank_].host = hostName();
    peers_[rank_].node = localNodeKey();
    store.set(kRecordPrefix + std::to_string(rank_),
              encodeRecord({peers_[rank_].host, peers_[rank_].node, my_addr}));
    std::vector<std::string> keys;
    keys.reserve(peers_.size());
    for (int r = 0; r < size(); ++r) keys.push_back(kRecordPrefix + std::to_string(r));
    std::vector<std::string> records;
    try {
      records = store.getMany(keys, deadline);
    } catch (const Error& e) {
      // The store names the first missing key ('boot/N': rank N's record); say it as the rank.
      const std::string what = e.what(), mark = std::string("key '") + kRecordPrefix;
      std::string who = "not every rank";
      if (const size_t at = what.find(mark); at != std::string::npos) {
        const size_t from = at + mark.size(), to = what.find('\'', from);
        if (to != std::string::npos && to > from)
          who = "rank " + what.substr(from, to - from) + " (at least)";
      }
      fail(e.code(), who + " did not join the communicator of " + std::to_string(size()) +
                         " ranks (each rank publishes its record as " + kRecordPrefix + "<rank>): " + what);
    }
    DDL_ASSERT(records.size() == keys.size());
    std::vector<std::string> fields;
    for (int r = 0; r < size(); ++r) {
      if (r == rank_) continue;
      if (!decodeRecord(records[r], 3, &fields)) {
        fail(ddlRemoteError, "rank " + std::to_string(r) + " published a malformed record (" +
                                 std::to_string(records[r].size()) +
                                 " bytes) to the rendezvous store: is every rank running the same libddl?");
      }
      Peer& p = peers_[r];
      p.rank = r;
      p.host = std::move(fields[0]);
      p.node = std::move(fields[1]);
      p.address = std::move(fields[2]);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  std::string hostOf(int rank) const override {
    return rank >= 0 && rank < size() && !peers_[rank].host.empty() ? peers_[rank].host : "unknown host";
  }

  void send(Request& r, int peer, uint64_t tag, const void* buf, size_t len) override {
    r.is_recv = false;
    r.peer = peer;
    r.posted_len = len;
    ucp_ep_h ep = endpoint(peer);
    if (ep == nullptr) {
      r.ok = false;
      r.error = peers_[peer].error;
      r.done.store(true, std::memory_order_release);
      return;
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = sendDone;
    param.user_data = &r;
    ucs_status_ptr_t sp = ucp_tag_send_nbx(ep, buf, len, tag, &param);
    if (sp == nullptr) {
      complete(&r, UCS_OK);
    } else if (UCS_PTR_IS_ERR(sp)) {
      complete(&r, UCS_PTR_STATUS(sp));
    } else {
      r.impl = sp;
    }
  }

  void recv(Request& r, int peer, uint64_t tag, uint64_t mask, void* buf, size_t len) override {
    r.is_recv = true;
    r.peer = peer;
    r.posted_len = len;
    // A tag receive needs no endpoint, but only an endpoint notices that its peer died (see the header): the
    // first receive naming a peer connects to it.
    if (peer >= 0 && peer < size() && peer != rank_) endpoint(peer);
    // No immediate completion: UCX 1.13 does not fill recv_info on that path, and the sender's tag (signature)
    // and the length are what detect mismatched collectives. The callback always reports both.
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = recvDone;
    param.user_data = &r;
    ucs_status_ptr_t sp = ucp_tag_recv_nbx(worker_, buf, len, tag, mask, &param);
    if (sp == nullptr) {
      complete(&r, UCS_ERR_NO_MESSAGE);  // cannot happen with NO_IMM_CMPL; fail loudly rather than guess
    } else if (UCS_PTR_IS_ERR(sp)) {
      complete(&r, UCS_PTR_STATUS(sp));
    } else {
      r.impl = sp;
    }
  }

  void cancel(Request& r) override {
    if (!r.done.load(std::memory_order_acquire) && r.impl) ucp_request_cancel(worker_, r.impl);
  }

  bool progress() override { return ucp_worker_progress(worker_) != 0; }

  bool probe(uint64_t tag, uint64_t mask, uint64_t* sender_tag) override {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, tag, mask, 0, &info);
    if (!msg) return false;
    *sender_tag = info.sender_tag;
    return true;
  }

  std::string nodeOf(int rank) const override {
    return rank >= 0 && rank < size() ? peers_[rank].node : std::string();
  }

  std::string peerError(int peer) const override {
    if (peer < 0 || peer >= size()) return "";
    return peers_[peer].error;
  }

  bool connected(int peer) const override {
    return peer >= 0 && peer < size() && peers_[peer].ep != nullptr;
  }
  int connectedPeers() const override { return endpoints_; }

  void idleWait(int timeout_us) override {
    if (timeout_us <= 0) {
      sched_yield();
    } else if (efd_ >= 0) {
      // Armed, the fd becomes readable when anything arrives for the worker (or ucp_worker_signal is called);
      // UCS_ERR_BUSY: events are already pending, progress again at once.
      if (ucp_worker_arm(worker_) != UCS_OK) return;
      pollfd p{efd_, POLLIN, 0};
      const timespec ts{timeout_us / 1000000, (timeout_us % 1000000) * 1000L};
      ppoll(&p, 1, &ts, nullptr);
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(timeout_us));
    }
  }

  void wake() override {
    if (efd_ >= 0) ucp_worker_signal(worker_);  // only a worker with UCP_FEATURE_WAKEUP blocks in idleWait
  }

  bool deviceMemory() const override {
    ucp_context_attr_t attr{};
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    return context_ && ucp_context_query(context_, &attr) == UCS_OK &&
           (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }

 private:
  // libddl's changes to UCX's defaults, through ucp_config_modify: libddl lives inside other people's
  // processes (torch, the CUDA runtime) whose threads read the environment, so it never calls setenv. A user's
  // own UCX_* variable always wins. Names go without the UCX_ prefix, and a transport's setting takes the name
  // its table has (MM_ for posix and sysv shared memory alike): UCX 1.13 returns UCS_OK for any name and only
  // warns at worker creation about those no transport took, so the transport test checks the effect
  // (UcxTest.SharedMemoryServesErrorHandlingEndpoints: the lanes UCX picks, the inline size).
  static void applySettings(ucp_config_t* config) {
    const std::string tls = getEnv("UCX_TLS");
    // Only where shared memory may be used: UCX warns about settings no transport took.
    auto mentions = [&](std::initializer_list<const char*> names) {
      if (tls.empty()) return true;
      for (const char* n : names)
        if (tls.find(n) != std::string::npos) return true;
      return false;
    };
    auto noneSet = [](std::initializer_list<const char*> names) {
      for (const char* n : names)
        if (!getEnv(n).empty()) return false;
      return true;
    };
    std::vector<std::pair<const char*, std::string>> settings;
    const bool shm = mentions({"all", "sm", "shm", "posix", "sysv"});
    // Shared memory serves error-handling endpoints only with this on.
    if (shm && noneSet({"UCX_MM_ERROR_HANDLING", "UCX_POSIX_ERROR_HANDLING", "UCX_SYSV_ERROR_HANDLING"})) {
      settings.emplace_back("MM_ERROR_HANDLING", "y");
    }
    // Shared-memory FIFO elements of 1 KiB instead of 128 B: messages up to 989 B go inline (UCX's short
    // protocol) instead of through a copy buffer. 2 ranks, 5 shuffled runs of 500 calls: 128 B 0.88 -> 0.61
    // us, 512 B 0.92 -> 0.70 us, other sizes level. Costs 64 KiB of FIFO per transport and process. Every
    // rank must use the same size (they run the same libddl).
    if (shm && noneSet({"UCX_MM_FIFO_ELEM_SIZE", "UCX_POSIX_FIFO_ELEM_SIZE", "UCX_SYSV_FIFO_ELEM_SIZE"})) {
      settings.emplace_back("MM_FIFO_ELEM_SIZE", "1024");
    }
    // How fast a dead peer on shared memory is noticed.
    if (getEnv("UCX_KEEPALIVE_INTERVAL").empty()) {
      std::string ms = getEnv("DDL_KEEPALIVE_MS");
      if (ms.empty()) ms = "2000";
      parseInt(ms, "DDL_KEEPALIVE_MS", 1, 3600 * 1000);
      settings.emplace_back("KEEPALIVE_INTERVAL", ms + "ms");
    }
    // Eager up to 2 MiB where the network is TCP: every message libddl's built-in table sends across nodes
    // (ring and mdring segments of 64 and 256 KiB, rhd's halves up to 2 MiB for 2 ranks). UCX's own
    // rendezvous threshold for tcp is about 20 KiB; its rendezvous adds a request and an answer per message,
    // and an allreduce fills both directions of a link, so the answer waits behind data in the link's queue.
    // Over 1 Gbit/s links between network namespaces, 2 hosts x 1 rank: auto (rhd) took 1.5-1.9x the link's
    // time at 1-4 MiB that way, and ran at the link's time eager; 2 hosts x 2 ranks: mdring 0.65-1.18x the
    // flat ring at 256 KiB-4 MiB, 1.5x eager (docs/benchmarks.md). Bounded, so a large point-to-point message
    // that arrives before its receive still waits at the sender. Not where UCX may use an RDMA device: there
    // rendezvous is a zero-copy read and UCX knows best. UCX 1.13 has one threshold per context, so UCX's own
    // shared-memory lanes get it too (libddl's segment carries the collectives inside a node;
    // docs/benchmarks.md says what it costs the others).
    if (getEnv("UCX_RNDV_THRESH").empty() && (!hasRdmaDevice() || !ucxTlsMayUseRdma(tls))) {
      settings.emplace_back("RNDV_THRESH", "2097153");
    }
    for (const auto& [name, value] : settings) {
      ucs_status_t st = ucp_config_modify(config, name, value.c_str());
      if (st != UCS_OK) ucxFail(std::string("setting ") + name + "=" + value, st);
    }
  }

  // Whether the kernel lists an RDMA device (InfiniBand, RoCE, iWARP): /sys/class/infiniband has an entry.
  static bool hasRdmaDevice() {
    DIR* dir = opendir("/sys/class/infiniband");
    if (!dir) return false;
    bool any = false;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') {
        any = true;
        break;
      }
    }
    closedir(dir);
    return any;
  }

  // The endpoint to peer, made on first use and at most once (a failed attempt stays as the peer's error).
  // nullptr when it cannot be made; then peers_[peer].error says why.
  ucp_ep_h endpoint(int peer) {
    Peer& p = peers_[peer];
    if (p.ep != nullptr || !p.error.empty()) return p.ep;
    DDL_ASSERT(peer != rank_ && !p.address.empty());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(p.address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = epFailed;
    ep.err_handler.arg = &p;
    ucs_status_t st = ucp_ep_create(worker_, &ep, &p.ep);
    if (st != UCS_OK) {
      p.ep = nullptr;
      p.error = std::string("cannot connect: UCX endpoint create failed: ") + ucs_status_string(st) +
                " (check UCX_TLS / UCX_NET_DEVICES)";
      return nullptr;
    }
    ++endpoints_;
    if (debug_) {
      std::fprintf(stderr, "ddl: rank %d endpoint to rank %d (%s):\n", rank_, peer, p.host.c_str());
      ucp_ep_print_info(p.ep, stderr);
    }
    return p.ep;
  }

  int rank_;
  std::vector<Peer> peers_;  // fixed size: error handlers hold pointers into it
  int endpoints_ = 0;        // endpoints made so far
  bool debug_ = false;       // DDL_DEBUG: print each endpoint as it is made
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;  // the worker's event fd (UCP_FEATURE_WAKEUP); -1: none
};

}  // namespace

bool ucxTlsMayUseRdma(const std::string& tls) {
  if (tls.empty() || tls[0] == '^') return true;
  size_t start = 0;
  while (start <= tls.size()) {
    size_t end = tls.find(',', start);
    if (end == std::string::npos) end = tls.size();
    const std::string t = tls.substr(start, end - start);
    if (t == "all" || t == "ib") return true;
    for (const char* r : {"rc", "ud", "dc"}) {
      if (t == r || t.rfind(std::string(r) + "_", 0) == 0) return true;
    }
    start = end + 1;
  }
  return false;
}

std::unique_ptr<Transport> createUcxTransport(int rank, int size, Store& store, const Deadline& deadline,
                                              bool wakeup) {
  auto t = std::make_unique<UcxTransport>(rank, size);
  t->init(store, deadline, wakeup);
  return t;
}

}  // namespace ddl
