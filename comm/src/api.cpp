// The C ABI of libddl (include/ddl/ddl.h). Every entry point converts exceptions into a ddlResult_t and keeps
// the message for ddlGetLastError: no exception ever crosses into the caller.
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "comm.h"
#include "ddl/ddl.h"
#include "env.h"
#include "error.h"
#include "options.h"
#include "rendezvous/launch_env.h"

namespace {
// A communicator's last error, shared with its requests: a request may be finished (ddlWait, ddlTest) after
// ddlCommDestroy freed the communicator.
struct ErrorSink {
  std::mutex mu;
  std::string last_error;
};
}  // namespace

struct ddlComm {
  std::unique_ptr<ddl::Comm> impl;
  std::shared_ptr<ErrorSink> errors = std::make_shared<ErrorSink>();
};

struct ddlRequest {
  std::shared_ptr<ddl::AsyncOp> op;
  std::shared_ptr<ErrorSink> errors;  // the communicator's
  const char* fn;                     // the call that made it, for messages
};

namespace {

thread_local std::string t_last_error;
thread_local std::string t_returned;  // what ddlGetLastError handed out, valid until the next call

void recordIn(ErrorSink* sink, const std::string& msg) {
  t_last_error = msg;
  if (sink) {
    std::lock_guard<std::mutex> lk(sink->mu);
    sink->last_error = msg;
  }
}

void record(ddlComm* comm, const std::string& msg) { recordIn(comm ? comm->errors.get() : nullptr, msg); }

template <class F>
ddlResult_t guard(ddlComm* comm, const char* fn, F&& f) {
  try {
    f();
    return ddlSuccess;
  } catch (const ddl::Error& e) {
    record(comm, std::string(fn) + ": " + e.what());
    return e.code();
  } catch (const std::bad_alloc&) {
    record(comm, std::string(fn) + ": out of memory");
    return ddlSystemError;
  } catch (const std::exception& e) {
    record(comm, std::string(fn) + ": internal error: " + e.what());
    return ddlInternalError;
  } catch (...) {
    record(comm, std::string(fn) + ": internal error: unknown exception");
    return ddlInternalError;
  }
}

#define DDL_CHECK_COMM(fn, comm)                                  \
  do {                                                            \
    if (!(comm) || !(comm)->impl) {                               \
      record(nullptr, std::string(fn) + ": comm is NULL or destroyed"); \
      return ddlInvalidArgument;                                  \
    }                                                             \
  } while (0)

// create(options) makes the communicator once the settings are resolved.
template <class Create>
ddlResult_t initComm(ddlComm_t* out, int nranks, const ddlConfig_t* config, const char* fn, Create&& create) {
  if (!out) {
    record(nullptr, std::string(fn) + ": comm pointer is NULL");
    return ddlInvalidArgument;
  }
  *out = nullptr;
  return guard(nullptr, fn, [&] {
    ddl::Options opts = ddl::resolveOptions(config, nranks);
    auto c = std::make_unique<ddlComm>();
    c->impl = create(opts);
    *out = c.release();
  });
}

ddlResult_t initRank(ddlComm_t* out, int nranks, int rank, const std::string& root, const ddlConfig_t* config,
                     const char* fn) {
  return initComm(out, nranks, config, fn,
                  [&](const ddl::Options& opts) { return ddl::Comm::create(nranks, rank, root, opts); });
}

// The non-blocking calls: start returns the operation's state, which a new request then carries.
template <class F>
ddlResult_t startRequest(ddlComm* comm, const char* fn, ddlRequest_t* request, F&& start) {
  DDL_CHECK_COMM(fn, comm);
  if (!request) {
    record(comm, std::string(fn) + ": request pointer is NULL");
    return ddlInvalidArgument;
  }
  *request = nullptr;
  return guard(comm, fn, [&] { *request = new ddlRequest{start(), comm->errors, fn}; });
}

}  // namespace

extern "C" {

ddlResult_t ddlGetVersion(int* version) {
  if (!version) return ddlInvalidArgument;
  *version = DDL_VERSION_CODE;
  return ddlSuccess;
}

const char* ddlGetErrorString(ddlResult_t result) {
  switch (result) {
    case ddlSuccess: return "no error";
    case ddlInvalidArgument: return "invalid argument";
    case ddlSystemError: return "system error";
    case ddlRemoteError: return "remote error (a peer failed)";
    case ddlTimeout: return "timeout";
    case ddlInProgress: return "operation in progress";
    case ddlInternalError: return "internal error";
    case ddlCudaError: return "CUDA error";
    case ddlAborted: return "communicator aborted";
    default: return "unknown result code";
  }
}

const char* ddlGetLastError(ddlComm_t comm) {
  if (comm) {
    std::lock_guard<std::mutex> lk(comm->errors->mu);
    t_returned = comm->errors->last_error;
  } else {
    t_returned = t_last_error;
  }
  return t_returned.c_str();
}

ddlResult_t ddlCommInitRank(ddlComm_t* comm, int nranks, int rank, const char* rootAddr,
                            const ddlConfig_t* config) {
  if (!rootAddr) {
    record(nullptr, "ddlCommInitRank: rootAddr is NULL (expected host:port of rank 0)");
    return ddlInvalidArgument;
  }
  return initRank(comm, nranks, rank, rootAddr, config, "ddlCommInitRank");
}

ddlResult_t ddlCommInitRankWithStore(ddlComm_t* comm, int nranks, int rank, const ddlStore_t* store,
                                     const ddlConfig_t* config) {
  if (!store) {
    if (comm) *comm = nullptr;
    record(nullptr, "ddlCommInitRankWithStore: store is NULL");
    return ddlInvalidArgument;
  }
  return initComm(comm, nranks, config, "ddlCommInitRankWithStore",
                  [&](const ddl::Options& opts) { return ddl::Comm::createWithStore(nranks, rank, *store, opts); });
}

ddlResult_t ddlCommInitFromEnv(ddlComm_t* comm, const ddlConfig_t* config) {
  if (ddl::getEnv("DDL_JOIN") == "1")
    return ddlCommJoin(comm, nullptr, config);  // a joiner of an elastic job
  ddl::LaunchEnv env;
  ddlResult_t r = guard(nullptr, "ddlCommInitFromEnv", [&] {
    env = ddl::launchEnvironment([](const char* name) { return ddl::getEnv(name); });
    // ddlrun and ddl-agent give every job a secret; under the other launchers the store is open unless the
    // user sets one (rank 0's store answers whoever reaches its port).
    const bool config_secret = config && config->version >= 3 &&
                               config->size >= offsetof(ddlConfig_t, secret) + sizeof(const char*) &&
                               config->secret && config->secret[0] != '\0';
    if (env.source != "ddl" && !config_secret && ddl::getEnv("DDL_JOB_SECRET").empty() && env.rank == 0) {
      std::fprintf(
          stderr,
          "ddl: started from %s's variables without DDL_JOB_SECRET: rank 0's rendezvous store at %s answers "
          "anyone who reaches it; set DDL_JOB_SECRET to the same random string on every rank "
          "(docs/user-guide.md, \"The job's secret\")\n",
          env.source.c_str(), env.root.c_str());
    }
  });
  if (r != ddlSuccess) {
    if (comm) *comm = nullptr;
    return r;
  }
  return initRank(comm, env.size, env.rank, env.root, config, "ddlCommInitFromEnv");
}

ddlResult_t ddlCommDestroy(ddlComm_t comm) {
  DDL_CHECK_COMM("ddlCommDestroy", comm);
  ddlResult_t r = guard(nullptr, "ddlCommDestroy", [&] { comm->impl->shutdown(); });
  delete comm;
  return r;
}

ddlResult_t ddlCommAbort(ddlComm_t comm) {
  DDL_CHECK_COMM("ddlCommAbort", comm);
  return guard(comm, "ddlCommAbort", [&] { comm->impl->abort(); });
}

ddlResult_t ddlCommGetAsyncError(ddlComm_t comm, ddlResult_t* asyncError) {
  DDL_CHECK_COMM("ddlCommGetAsyncError", comm);
  if (!asyncError) return ddlInvalidArgument;
  *asyncError = comm->impl->asyncError();
  return ddlSuccess;
}

ddlResult_t ddlCommCount(ddlComm_t comm, int* count) {
  DDL_CHECK_COMM("ddlCommCount", comm);
  if (!count) return ddlInvalidArgument;
  *count = comm->impl->size();
  return ddlSuccess;
}

ddlResult_t ddlCommUserRank(ddlComm_t comm, int* rank) {
  DDL_CHECK_COMM("ddlCommUserRank", comm);
  if (!rank) return ddlInvalidArgument;
  *rank = comm->impl->rank();
  return ddlSuccess;
}

namespace {
// The getters' answer copied into the caller's buffer, NUL included; too small a buffer is an argument error.
ddlResult_t copyOut(ddlComm* comm, const char* fn, const std::string& s, char* buf, size_t len) {
  if (!buf || len <= s.size()) {
    record(comm, std::string(fn) + ": buffer too small for '" + s + "'");
    return ddlInvalidArgument;
  }
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return ddlSuccess;
}
}  // namespace

ddlResult_t ddlCommGetTopology(ddlComm_t comm, char* buf, size_t len) {
  DDL_CHECK_COMM("ddlCommGetTopology", comm);
  return copyOut(comm, "ddlCommGetTopology", comm->impl->options().topology.str(), buf, len);
}

ddlResult_t ddlCommGetIntraNodePath(ddlComm_t comm, char* buf, size_t len) {
  DDL_CHECK_COMM("ddlCommGetIntraNodePath", comm);
  return copyOut(comm, "ddlCommGetIntraNodePath", comm->impl->intraNodePath(), buf, len);
}

ddlResult_t ddlCommGetStreamScheme(ddlComm_t comm, char* buf, size_t len) {
  DDL_CHECK_COMM("ddlCommGetStreamScheme", comm);
  return copyOut(comm, "ddlCommGetStreamScheme", comm->impl->streamScheme(), buf, len);
}

ddlResult_t ddlCommShrink(ddlComm_t comm, const int* excludeRanks, int excludeCount, ddlComm_t* newcomm) {
  DDL_CHECK_COMM("ddlCommShrink", comm);
  if (!newcomm || excludeCount < 0 || (excludeCount > 0 && !excludeRanks)) {
    record(comm, "ddlCommShrink: newcomm is NULL, or excludeRanks is NULL with a count above 0");
    return ddlInvalidArgument;
  }
  *newcomm = nullptr;
  return guard(comm, "ddlCommShrink", [&] {
    auto c = std::make_unique<ddlComm>();
    c->impl = comm->impl->shrink(std::vector<int>(excludeRanks, excludeRanks + excludeCount));
    *newcomm = c.release();
  });
}

ddlResult_t ddlCommGrow(ddlComm_t comm, int maxNewRanks, ddlComm_t* newcomm) {
  DDL_CHECK_COMM("ddlCommGrow", comm);
  if (!newcomm) {
    record(comm, "ddlCommGrow: newcomm is NULL");
    return ddlInvalidArgument;
  }
  *newcomm = nullptr;
  return guard(comm, "ddlCommGrow", [&] {
    auto grown = comm->impl->grow(maxNewRanks);
    if (!grown) return;
    auto c = std::make_unique<ddlComm>();
    c->impl = std::move(grown);
    *newcomm = c.release();
  });
}

ddlResult_t ddlCommJoin(ddlComm_t* comm, const char* rootAddr, const ddlConfig_t* config) {
  return initComm(comm, 0, config, "ddlCommJoin", [&](const ddl::Options& opts) {
    std::string root = rootAddr ? rootAddr : ddl::getEnv("DDL_ROOT");
    if (root.empty())
      ddl::fail(ddlInvalidArgument, "no rendezvous address: rootAddr is NULL and DDL_ROOT unset");
    return ddl::Comm::join(root, opts);
  });
}

ddlResult_t ddlCommJoinWithStore(ddlComm_t* comm, const ddlStore_t* store, const ddlConfig_t* config) {
  return initComm(comm, 0, config, "ddlCommJoinWithStore", [&](const ddl::Options& opts) {
    if (!store || !store->set || !store->get || !store->add) {
      ddl::fail(ddlInvalidArgument, "the store needs its set, get and add functions to join");
    }
    return ddl::Comm::join(std::shared_ptr<ddl::Store>(ddl::makeCallbackStore(*store)), opts);
  });
}

ddlResult_t ddlCommGetExcluded(ddlComm_t comm, int* ranks, int maxRanks, int* count) {
  DDL_CHECK_COMM("ddlCommGetExcluded", comm);
  if (!count || maxRanks < 0 || (maxRanks > 0 && !ranks)) {
    record(comm, "ddlCommGetExcluded: count is NULL, or ranks is NULL with maxRanks above 0");
    return ddlInvalidArgument;
  }
  const std::vector<int>& gone = comm->impl->excluded();
  *count = static_cast<int>(gone.size());
  for (size_t i = 0; i < gone.size() && i < static_cast<size_t>(maxRanks); ++i) ranks[i] = gone[i];
  return ddlSuccess;
}

ddlResult_t ddlCommRegister(ddlComm_t comm, void* buff, size_t size, void** handle) {
  DDL_CHECK_COMM("ddlCommRegister", comm);
  if (!handle) {
    record(comm, "ddlCommRegister: handle is NULL");
    return ddlInvalidArgument;
  }
  *handle = nullptr;
  return guard(comm, "ddlCommRegister", [&] { *handle = comm->impl->registerBuffer(buff, size); });
}

ddlResult_t ddlCommDeregister(ddlComm_t comm, void* handle) {
  DDL_CHECK_COMM("ddlCommDeregister", comm);
  return guard(comm, "ddlCommDeregister", [&] { comm->impl->deregisterBuffer(handle); });
}

ddlResult_t ddlCommStreamCapturing(ddlComm_t comm, ddlStream_t stream, int* capturing) {
  DDL_CHECK_COMM("ddlCommStreamCapturing", comm);
  if (!capturing) {
    record(comm, "ddlCommStreamCapturing: capturing is NULL");
    return ddlInvalidArgument;
  }
  *capturing = 0;
  return guard(comm, "ddlCommStreamCapturing",
               [&] { *capturing = comm->impl->streamCapturing(stream) ? 1 : 0; });
}

ddlResult_t ddlCommRegisterGraphBuffers(ddlComm_t comm) {
  DDL_CHECK_COMM("ddlCommRegisterGraphBuffers", comm);
  return guard(comm, "ddlCommRegisterGraphBuffers", [&] { comm->impl->registerGraphBuffers(); });
}

namespace {
// ddlMemAlloc's runtime: CUDA's, made once (null in builds without it).
ddl::DeviceRuntime* memRuntime() {
  static const std::unique_ptr<ddl::DeviceRuntime> rt = ddl::makeCudaRuntime();
  return rt.get();
}
}  // namespace

ddlResult_t ddlMemAlloc(void** ptr, size_t size) {
  return guard(nullptr, "ddlMemAlloc", [&] {
    if (!ptr || size == 0) ddl::fail(ddlInvalidArgument, "ddlMemAlloc: ptr is NULL or size is 0");
    *ptr = nullptr;
    ddl::DeviceRuntime* rt = memRuntime();
    if (!rt)
      ddl::fail(ddlInvalidArgument, "ddlMemAlloc: this libddl has no GPU runtime (built without CUDA)");
    *ptr = rt->allocDevice(size);
  });
}

ddlResult_t ddlMemFree(void* ptr) {
  return guard(nullptr, "ddlMemFree", [&] {
    ddl::DeviceRuntime* rt = memRuntime();
    if (ptr && !rt) ddl::fail(ddlInvalidArgument, "ddlMemFree: this libddl has no GPU runtime");
    if (ptr) rt->freeDevice(ptr);
  });
}

ddlResult_t ddlAllReduce(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                         ddlRedOp_t op, ddlComm_t comm) {
  DDL_CHECK_COMM("ddlAllReduce", comm);
  return guard(comm, "ddlAllReduce", [&] { comm->impl->allReduce(sendbuff, recvbuff, count, datatype, op); });
}

ddlResult_t ddlAllReduceOnStream(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                                 ddlRedOp_t op, ddlComm_t comm, ddlStream_t stream) {
  DDL_CHECK_COMM("ddlAllReduceOnStream", comm);
  return guard(comm, "ddlAllReduceOnStream",
               [&] { comm->impl->allReduceOnStream(sendbuff, recvbuff, count, datatype, op, stream); });
}

ddlResult_t ddlReduceScatterOnStream(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ddlDataType_t datatype, ddlRedOp_t op, ddlComm_t comm,
                                     ddlStream_t stream) {
  DDL_CHECK_COMM("ddlReduceScatterOnStream", comm);
  return guard(comm, "ddlReduceScatterOnStream", [&] {
    comm->impl->reduceScatterOnStream(sendbuff, recvbuff, recvcount, datatype, op, stream);
  });
}

ddlResult_t ddlAllGatherOnStream(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ddlDataType_t datatype, ddlComm_t comm, ddlStream_t stream) {
  DDL_CHECK_COMM("ddlAllGatherOnStream", comm);
  return guard(comm, "ddlAllGatherOnStream",
               [&] { comm->impl->allGatherOnStream(sendbuff, recvbuff, sendcount, datatype, stream); });
}

ddlResult_t ddlBroadcastOnStream(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                                 int root, ddlComm_t comm, ddlStream_t stream) {
  DDL_CHECK_COMM("ddlBroadcastOnStream", comm);
  return guard(comm, "ddlBroadcastOnStream",
               [&] { comm->impl->broadcastOnStream(sendbuff, recvbuff, count, datatype, root, stream); });
}

ddlResult_t ddlReduceOnStream(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                              ddlRedOp_t op, int root, ddlComm_t comm, ddlStream_t stream) {
  DDL_CHECK_COMM("ddlReduceOnStream", comm);
  return guard(comm, "ddlReduceOnStream",
               [&] { comm->impl->reduceOnStream(sendbuff, recvbuff, count, datatype, op, root, stream); });
}

ddlResult_t ddlBroadcast(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype, int root,
                         ddlComm_t comm) {
  DDL_CHECK_COMM("ddlBroadcast", comm);
  return guard(comm, "ddlBroadcast", [&] { comm->impl->broadcast(sendbuff, recvbuff, count, datatype, root); });
}

ddlResult_t ddlAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ddlDataType_t datatype,
                         ddlComm_t comm) {
  DDL_CHECK_COMM("ddlAllGather", comm);
  return guard(comm, "ddlAllGather", [&] { comm->impl->allGather(sendbuff, recvbuff, sendcount, datatype); });
}

ddlResult_t ddlReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ddlDataType_t datatype,
                             ddlRedOp_t op, ddlComm_t comm) {
  DDL_CHECK_COMM("ddlReduceScatter", comm);
  return guard(comm, "ddlReduceScatter",
               [&] { comm->impl->reduceScatter(sendbuff, recvbuff, recvcount, datatype, op); });
}

ddlResult_t ddlBarrier(ddlComm_t comm) {
  DDL_CHECK_COMM("ddlBarrier", comm);
  return guard(comm, "ddlBarrier", [&] { comm->impl->barrier(); });
}

ddlResult_t ddlReduce(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype, ddlRedOp_t op,
                      int root, ddlComm_t comm) {
  DDL_CHECK_COMM("ddlReduce", comm);
  return guard(comm, "ddlReduce", [&] { comm->impl->reduce(sendbuff, recvbuff, count, datatype, op, root); });
}

ddlResult_t ddlGather(const void* sendbuff, void* recvbuff, size_t sendcount, ddlDataType_t datatype, int root,
                      ddlComm_t comm) {
  DDL_CHECK_COMM("ddlGather", comm);
  return guard(comm, "ddlGather", [&] { comm->impl->gather(sendbuff, recvbuff, sendcount, datatype, root); });
}

ddlResult_t ddlScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ddlDataType_t datatype, int root,
                       ddlComm_t comm) {
  DDL_CHECK_COMM("ddlScatter", comm);
  return guard(comm, "ddlScatter", [&] { comm->impl->scatter(sendbuff, recvbuff, recvcount, datatype, root); });
}

ddlResult_t ddlAllToAll(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                        ddlComm_t comm) {
  DDL_CHECK_COMM("ddlAllToAll", comm);
  return guard(comm, "ddlAllToAll", [&] { comm->impl->allToAll(sendbuff, recvbuff, count, datatype); });
}

ddlResult_t ddlAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[], void* recvbuff,
                         const size_t recvcounts[], const size_t rdispls[], ddlDataType_t datatype,
                         ddlComm_t comm) {
  DDL_CHECK_COMM("ddlAllToAllv", comm);
  return guard(comm, "ddlAllToAllv", [&] {
    comm->impl->allToAllv(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype);
  });
}

ddlResult_t ddlSend(const void* sendbuff, size_t count, ddlDataType_t datatype, int peer, ddlComm_t comm) {
  DDL_CHECK_COMM("ddlSend", comm);
  return guard(comm, "ddlSend", [&] { comm->impl->send(sendbuff, count, datatype, peer); });
}

ddlResult_t ddlRecv(void* recvbuff, size_t count, ddlDataType_t datatype, int peer, ddlComm_t comm) {
  DDL_CHECK_COMM("ddlRecv", comm);
  return guard(comm, "ddlRecv", [&] { comm->impl->recv(recvbuff, count, datatype, peer); });
}

ddlResult_t ddlIallReduce(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                          ddlRedOp_t op, ddlComm_t comm, ddlRequest_t* request) {
  return startRequest(comm, "ddlIallReduce", request,
                      [&] { return comm->impl->iallReduce(sendbuff, recvbuff, count, datatype, op); });
}

ddlResult_t ddlIsend(const void* sendbuff, size_t count, ddlDataType_t datatype, int peer, ddlComm_t comm,
                     ddlRequest_t* request) {
  return startRequest(comm, "ddlIsend", request, [&] { return comm->impl->isend(sendbuff, count, datatype, peer); });
}

ddlResult_t ddlIrecv(void* recvbuff, size_t count, ddlDataType_t datatype, int peer, ddlComm_t comm,
                     ddlRequest_t* request) {
  return startRequest(comm, "ddlIrecv", request, [&] { return comm->impl->irecv(recvbuff, count, datatype, peer); });
}

ddlResult_t ddlIsendTagged(const void* sendbuff, size_t count, ddlDataType_t datatype, int peer, int tag,
                           ddlComm_t comm, ddlRequest_t* request) {
  return startRequest(comm, "ddlIsendTagged", request,
                      [&] { return comm->impl->isendTagged(sendbuff, count, datatype, peer, tag); });
}

ddlResult_t ddlIrecvTagged(void* recvbuff, size_t count, ddlDataType_t datatype, int peer, int tag,
                           ddlComm_t comm, int* source, ddlRequest_t* request) {
  return startRequest(comm, "ddlIrecvTagged", request,
                      [&] { return comm->impl->irecvTagged(recvbuff, count, datatype, peer, tag, source); });
}

static ddlResult_t finish(ddlRequest_t request) {
  ddlResult_t r = request->op->result;
  if (r != ddlSuccess) recordIn(request->errors.get(), std::string(request->fn) + ": " + request->op->error);
  delete request;
  return r;
}

ddlResult_t ddlTest(ddlRequest_t request, int* done) {
  if (!request || !done) {
    record(nullptr, "ddlTest: request or done is NULL");
    return ddlInvalidArgument;
  }
  if (!request->op->done.load(std::memory_order_acquire)) {
    *done = 0;
    return ddlInProgress;
  }
  *done = 1;
  return finish(request);
}

ddlResult_t ddlWait(ddlRequest_t request) {
  if (!request) {
    record(nullptr, "ddlWait: request is NULL");
    return ddlInvalidArgument;
  }
  // The executor finishes every operation within its timeout, then notifies.
  request->op->done.wait(false, std::memory_order_acquire);
  return finish(request);
}

}  // extern "C"
