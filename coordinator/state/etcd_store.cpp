// The Store in etcd (etcd_store.h): one transaction per batch within etcd's limits, fenced by the leader's
// reign; job and node records whole under their keys.
#include "state/etcd_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <utility>

#include "state/etcd_client.h"
#include "state/record_codec.h"

namespace ddl::state {
namespace {

namespace pb = etcdserverpb;

// The smallest key greater than every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    auto& c = prefix.back();
    if (static_cast<unsigned char>(c) < 0xff) {
      ++c;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace

EtcdStore::EtcdStore(Options options) : options_(std::move(options)) {}
EtcdStore::~EtcdStore() = default;

StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::open(Options options) {
  if (options.endpoints.empty()) return Status::invalidArgument("etcd store: give at least one endpoint");
  if (options.max_txn_ops < 2) return Status::invalidArgument("etcd store: max_txn_ops must be at least 2");
  if (options.max_txn_bytes < 64 * 1024)
    return Status::invalidArgument("etcd store: max_txn_bytes must be at least 65536");
  std::unique_ptr<EtcdStore> store(new EtcdStore(std::move(options)));
  auto client =
      EtcdClient::create(store->options_.endpoints, store->options_.tls, store->options_.timeout_ms);
  if (!client) return client.status();
  store->client_ = std::move(*client);
  if (store->options_.gate) store->client_->setGate(store->options_.gate);
  const std::string key = store->options_.prefix + "meta/schema";
  pb::RangeRequest get;
  get.set_key(key);
  pb::RangeResponse got;
  if (Status st = store->client_->kv(&pb::KV::Stub::Range, get, &got, "reading " + key); !st) return st;
  if (got.kvs_size() == 0) {
    // A new prefix: write the version unless another coordinator just did (create revision 0: absent).
    pb::TxnRequest txn;
    requireCreateRevision(&txn, key, 0);
    pb::RequestOp* put = txn.add_success();
    put->mutable_request_put()->set_key(key);
    put->mutable_request_put()->set_value(std::to_string(kSchemaVersion));
    pb::TxnResponse done;
    if (Status st = store->client_->kv(&pb::KV::Stub::Txn, txn, &done, "writing " + key); !st) return st;
    return store;
  }
  const std::string& value = got.kvs(0).value();
  int version = 0;
  if (std::sscanf(value.c_str(), "%d", &version) != 1 || version < 1) {
    return Status::dataLoss("etcd key " + key + " holds '" + value + "', not a ddl layout version");
  }
  if (version > kSchemaVersion) {
    return Status::dataLoss("the ddl state under " + store->options_.prefix + " in etcd has layout version " +
                            std::to_string(version) + ", newer than this coordinator's " +
                            std::to_string(kSchemaVersion) + "; run a newer ddl-coordinator");
  }
  return store;
}

void EtcdStore::fence(const std::string& key, int64_t revision) {
  std::lock_guard<std::mutex> lock(mu_);
  fence_key_ = key;
  fence_revision_ = revision;
  last_job_.reset();  // a new reign reads what the last one stored
}

namespace {

// Adds the fence's check to a transaction (the caller holds mu_).
void addFence(pb::TxnRequest* txn, const std::string& key, int64_t revision) {
  if (revision != 0) requireCreateRevision(txn, key, revision);
}

}  // namespace

Status EtcdStore::fenced() {
  Status refused =
      Status::failedPrecondition("not written: " + fence_key_ + " is no longer at revision " +
                                 std::to_string(fence_revision_) + ", so another coordinator leads now");
  if (options_.on_fenced) options_.on_fenced(refused.message());
  return refused;
}

int64_t EtcdStore::requests() const { return client_->requests(); }

std::string EtcdStore::jobKey(int64_t n) const {
  char digits[32];
  std::snprintf(digits, sizeof(digits), "%020lld", static_cast<long long>(n));
  return options_.prefix + "jobs/" + digits;
}

std::string EtcdStore::nodeKey(const std::string& name) const { return options_.prefix + "nodes/" + name; }

Store::BatchLimits EtcdStore::batchLimits() const {
  // One operation and some bytes of every transaction are the store's own: meta/last_job's put and the fence.
  return {static_cast<size_t>(options_.max_txn_ops - 1), options_.max_txn_bytes - kOwnBytes};
}

size_t EtcdStore::writeBytes(const Write& w) const {
  const size_t key = options_.prefix.size() + 32;
  switch (w.kind) {
    case Write::Kind::kPutJob:
      return key + record_codec::jobBytesBound(w.job);
    case Write::Kind::kPutNode:
      return key + w.node.name.size() + record_codec::nodeBytesBound(w.node);
    case Write::Kind::kDeleteNode:
      return key + w.name.size();
    case Write::Kind::kPutEntry:
    case Write::Kind::kDeleteEntry:
      return key + w.entry.table.size() + w.entry.key.size() + w.entry.value.size();
  }
  return key;
}

Status EtcdStore::applyBatch(const std::vector<Write>& batch) {
  if (batch.empty()) return Status::ok();
  pb::TxnRequest txn;
  int64_t highest = 0;
  size_t bytes = 0;
  for (const Write& w : batch) {
    pb::RequestOp* op = txn.add_success();
    switch (w.kind) {
      case Write::Kind::kPutJob: {
        std::optional<int64_t> n = jobIdNumber(w.job.id);
        if (!n) return Status::invalidArgument("cannot store job '" + w.job.id + "': not a job id");
        if (w.new_job) {
          if (Status st = validateJobSpec(w.job.spec); !st) return st;
        }
        highest = std::max(highest, *n);
        op->mutable_request_put()->set_key(jobKey(*n));
        op->mutable_request_put()->set_value(record_codec::encodeJob(w.job));
        break;
      }
      case Write::Kind::kPutNode:
        if (w.node.name.empty()) return Status::invalidArgument("node record has an empty name");
        op->mutable_request_put()->set_key(nodeKey(w.node.name));
        op->mutable_request_put()->set_value(record_codec::encodeNode(w.node));
        break;
      case Write::Kind::kDeleteNode:
        op->mutable_request_delete_range()->set_key(nodeKey(w.name));
        break;
      case Write::Kind::kPutEntry:
        if (Status st = entryRefused(w.entry); !st) return st;
        op->mutable_request_put()->set_key(entryKey(w.entry));
        op->mutable_request_put()->set_value(w.entry.value);
        break;
      case Write::Kind::kDeleteEntry:
        if (Status st = entryRefused(w.entry, false); !st) return st;
        op->mutable_request_delete_range()->set_key(entryKey(w.entry));
        break;
    }
    bytes += op->ByteSizeLong();
  }
  // One batch, one transaction: all of it or nothing, whatever happens to this process between requests. A
  // batch etcd would refuse is refused here, whole, before anything is sent.
  const BatchLimits limits = batchLimits();
  if (batch.size() > limits.max_writes || bytes > options_.max_txn_bytes - kOwnBytes) {
    return Status::invalidArgument(
        "a batch of " + std::to_string(batch.size()) + " writes (" + std::to_string(bytes) +
        " bytes) is more than one etcd transaction takes (" + std::to_string(limits.max_writes) +
        " writes, " + std::to_string(options_.max_txn_bytes - kOwnBytes) +
        " bytes: etcd's --max-txn-ops and --max-request-bytes, the coordinator's etcd_max_txn_ops and "
        "etcd_max_txn_bytes); a batch is never split");
  }
  std::lock_guard<std::mutex> lock(mu_);
  // meta/last_job: the leader is the only writer while its fence holds, so the number it last stored is
  // known here (read once per reign), and raising it costs no request of its own.
  if (highest > 0 && !last_job_) {
    StatusOr<int64_t> last = lastJobNumber();
    if (!last) return last.status();
    last_job_ = *last;
  }
  const bool raise = highest > 0 && highest > *last_job_;
  if (raise) {
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(options_.prefix + "meta/last_job");
    put->set_value(std::to_string(highest));
  }
  addFence(&txn, fence_key_, fence_revision_);
  pb::TxnResponse done;
  ++requests_;
  if (Status st = client_->kv(&pb::KV::Stub::Txn, txn, &done,
                              "storing a batch of " + std::to_string(batch.size()) + " writes");
      !st) {
    return st;
  }
  if (!done.succeeded()) return fenced();
  if (raise) last_job_ = highest;  // only once it is stored: a failed batch is tried again whole
  return Status::ok();
}

StatusOr<Job> EtcdStore::getJob(const std::string& id) {
  std::optional<int64_t> n = jobIdNumber(id);
  if (!n) return jobNotFound(id);
  pb::RangeRequest get;
  get.set_key(jobKey(*n));
  pb::RangeResponse got;
  if (Status st = client_->kv(&pb::KV::Stub::Range, get, &got, "reading job " + id); !st) return st;
  if (got.kvs_size() == 0) return jobNotFound(id);
  return record_codec::decodeJob(formatJobId(*n), got.kvs(0).value());
}

StatusOr<std::vector<NodeRecord>> EtcdStore::listNodes() {
  const std::string prefix = options_.prefix + "nodes/";
  pb::RangeRequest get;
  get.set_key(prefix);
  get.set_range_end(prefixEnd(prefix));
  pb::RangeResponse got;
  if (Status st = client_->kv(&pb::KV::Stub::Range, get, &got, "reading the nodes"); !st) return st;
  std::vector<NodeRecord> nodes;
  for (const auto& kv : got.kvs()) {
    auto node = record_codec::decodeNode(kv.key().substr(prefix.size()), kv.value());
    if (!node) return node.status();
    nodes.push_back(std::move(*node));
  }
  return nodes;  // etcd returns keys in byte order: by name
}

StatusOr<std::vector<Entry>> EtcdStore::listEntries(const std::string& table) {
  // Every table is a prefix of its own. "" reads them all a page at a time, stepping over the layout's own
  // jobs/ and nodes/ (a range each) and meta/.
  const std::string from = options_.prefix + (table.empty() ? "" : table + "/");
  const std::string end = prefixEnd(from);
  std::vector<Entry> out;
  std::string next = from;
  while (next < end) {
    pb::RangeRequest get;
    get.set_key(next);
    get.set_range_end(end);
    get.set_limit(options_.page_jobs);
    pb::RangeResponse got;
    if (Status st = client_->kv(&pb::KV::Stub::Range, get, &got,
                                "reading the entries of " + (table.empty() ? "every table" : table));
        !st) {
      return st;
    }
    if (got.kvs_size() == 0) break;
    next = got.kvs(got.kvs_size() - 1).key() + std::string(1, '\0');
    for (const auto& kv : got.kvs()) {
      const std::string rest = kv.key().substr(options_.prefix.size());
      const size_t slash = rest.find('/');
      Entry e{rest.substr(0, slash), slash == std::string::npos ? "" : rest.substr(slash + 1), kv.value()};
      if (!checkEntry(e, false).empty()) {
        // jobs/, nodes/, meta/: not entries. A page that ends in one jumps over the rest of its range.
        if (&kv == &got.kvs(got.kvs_size() - 1))
          next = std::max(next, prefixEnd(options_.prefix + e.table + "/"));
        continue;
      }
      out.push_back(std::move(e));
    }
    if (!got.more()) break;
  }
  return out;
}

Status EtcdStore::raiseLastJobNumber(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<int64_t> last = lastJobNumber();
  if (!last) return last.status();
  if (n <= *last) return Status::ok();
  pb::TxnRequest txn;
  addFence(&txn, fence_key_, fence_revision_);
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(options_.prefix + "meta/last_job");
  put->set_value(std::to_string(n));
  pb::TxnResponse done;
  if (Status st = client_->kv(&pb::KV::Stub::Txn, txn, &done, "raising meta/last_job"); !st) return st;
  if (!done.succeeded()) return fenced();
  last_job_ = n;
  return Status::ok();
}

StatusOr<int64_t> EtcdStore::lastJobNumber() {
  // meta/last_job is raised in the first transaction of every batch that stores a higher number, so it is
  // never behind a stored job (and stays when that job is purged).
  pb::RangeRequest meta;
  meta.set_key(options_.prefix + "meta/last_job");
  pb::RangeResponse got;
  if (Status st = client_->kv(&pb::KV::Stub::Range, meta, &got, "reading the last job number"); !st)
    return st;
  return got.kvs_size() > 0 ? std::strtoll(got.kvs(0).value().c_str(), nullptr, 10) : int64_t{0};
}

StatusOr<std::vector<Job>> EtcdStore::listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                                   bool newest_first) {
  std::vector<Job> out;
  if (limit <= 0) return out;
  // Reads [from, to), keeping the jobs that match until `enough`.
  auto scan = [&](const std::string& from, const std::string& to, std::vector<Job>* into, size_t enough) {
    Status decoded = Status::ok();
    Status read = scanJobs(from, to, [&](int64_t n, const std::string& value) {
      auto job = record_codec::decodeJob(formatJobId(n), value);
      if (!job) {
        decoded = job.status();
        return false;
      }
      if (matches(filter, *job)) into->push_back(std::move(*job));
      return into->size() < enough;
    });
    return read.isOk() ? decoded : read;
  };
  if (!newest_first) {
    if (Status st = scan(jobKey(after_number + 1), prefixEnd(options_.prefix + "jobs/"), &out,
                         static_cast<size_t>(limit));
        !st) {
      return st;
    }
    return out;
  }
  // Newest first: windows of page_jobs numbers going down from below after_number (or the newest), each read
  // in key order; the matches of a window come before those of the windows below it.
  int64_t hi = after_number;
  if (hi <= 0) {
    StatusOr<int64_t> last = lastJobNumber();
    if (!last) return last.status();
    hi = *last + 1;
  }
  std::vector<Job> newest;  // descending
  while (hi > 1 && static_cast<int>(newest.size()) < limit) {
    const int64_t lo = std::max<int64_t>(1, hi - options_.page_jobs);
    std::vector<Job> window;
    if (Status st = scan(jobKey(lo), jobKey(hi), &window, std::numeric_limits<size_t>::max()); !st) return st;
    for (auto it = window.rbegin(); it != window.rend() && static_cast<int>(newest.size()) < limit; ++it) {
      newest.push_back(std::move(*it));
    }
    hi = lo;
  }
  out.assign(std::make_move_iterator(newest.rbegin()), std::make_move_iterator(newest.rend()));
  return out;
}

Status EtcdStore::scanJobs(std::string from, const std::string& to,
                           const std::function<bool(int64_t number, const std::string& value)>& each) {
  const size_t digits = options_.prefix.size() + std::string("jobs/").size();
  while (from < to) {
    pb::RangeRequest get;  // never sorted: etcd 3.4 reads a sorted range whole before it applies the limit
    get.set_key(from);
    get.set_range_end(to);
    get.set_limit(options_.page_jobs);
    pb::RangeResponse got;
    if (Status st = client_->kv(&pb::KV::Stub::Range, get, &got, "reading jobs"); !st) return st;
    for (const auto& kv : got.kvs()) {
      if (!each(std::strtoll(kv.key().c_str() + digits, nullptr, 10), kv.value())) return Status::ok();
    }
    if (!got.more() || got.kvs_size() == 0) return Status::ok();
    from = got.kvs(got.kvs_size() - 1).key() + '\0';  // just above the last key read
  }
  return Status::ok();
}

StatusOr<int> EtcdStore::purgeFinished(int64_t ended_before_ms, int limit) {
  std::vector<std::string> victims;
  if (limit <= 0) return 0;
  const std::string prefix = options_.prefix + "jobs/";
  Status read = scanJobs(prefix, prefixEnd(prefix), [&](int64_t n, const std::string& value) {
    auto job = record_codec::decodeJob(formatJobId(n), value);
    const int64_t ended = job ? endedAtMs(*job) : 0;  // a damaged record is not purged by guesswork
    if (ended > 0 && ended < ended_before_ms) victims.push_back(jobKey(n));
    return static_cast<int>(victims.size()) < limit;
  });
  if (!read) return read;
  for (size_t at = 0; at < victims.size(); at += static_cast<size_t>(options_.max_txn_ops)) {
    pb::TxnRequest txn;
    std::lock_guard<std::mutex> lock(mu_);
    addFence(&txn, fence_key_, fence_revision_);
    for (size_t i = at; i < std::min(victims.size(), at + static_cast<size_t>(options_.max_txn_ops)); ++i) {
      txn.add_success()->mutable_request_delete_range()->set_key(victims[i]);
    }
    pb::TxnResponse done;
    if (Status st = client_->kv(&pb::KV::Stub::Txn, txn, &done, "purging old jobs"); !st) return st;
    if (!done.succeeded()) return fenced();
  }
  return static_cast<int>(victims.size());
}

}  // namespace ddl::state
