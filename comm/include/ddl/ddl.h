/*
 * ddl.h — the public C API of libddl, ddl's collective communication library.
 *
 * NCCL-shaped: an opaque communicator, one result type, a versioned config struct. Every call returns a
 * ddlResult_t; no C++ exception ever crosses this boundary. Buffers are host memory; in a libddl built with the
 * CUDA Toolkit, ddlAllReduce and ddlIallReduce also take CUDA device memory (either buffer or both), staged
 * through pinned host memory. Device data must be complete (its stream synchronised) when the call is made;
 * the result is in recvbuff when the call (or ddlWait) returns.
 *
 * Threads: a communicator is used by one thread at a time, except ddlCommAbort and ddlCommGetAsyncError,
 * which any thread may call at any time (that is how a watchdog unblocks a stuck collective).
 */
#ifndef DDL_DDL_H_
#define DDL_DDL_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDL_MAJOR 0
#define DDL_MINOR 1
#define DDL_PATCH 0
#define DDL_VERSION_CODE (DDL_MAJOR * 10000 + DDL_MINOR * 100 + DDL_PATCH)

typedef struct ddlComm* ddlComm_t;
typedef struct ddlRequest* ddlRequest_t;

typedef enum {
  ddlSuccess = 0,
  ddlInvalidArgument = 1, /* bad pointer, type, op, count, topology, or ranks calling different collectives */
  ddlSystemError = 2,     /* an OS or UCX call failed (socket, memory, endpoint) */
  ddlRemoteError = 3,     /* a peer failed, died or aborted: the message names it */
  ddlTimeout = 4,         /* a wait passed DDL_TIMEOUT_MS */
  ddlInProgress = 5,      /* a non-blocking operation has not finished yet */
  ddlInternalError = 6,   /* a bug in libddl: please report it with the message */
  ddlCudaError = 7,       /* a CUDA call failed */
  ddlAborted = 8,         /* ddlCommAbort was called on this communicator */
  ddlNumResults = 9
} ddlResult_t;

typedef enum {
  ddlInt8 = 0,
  ddlUint8 = 1,
  ddlInt32 = 2,
  ddlUint32 = 3,
  ddlInt64 = 4,
  ddlUint64 = 5,
  ddlFloat16 = 6,
  ddlBfloat16 = 7,
  ddlFloat32 = 8,
  ddlFloat64 = 9,
  ddlNumTypes = 10
} ddlDataType_t;

/* ddlBand, ddlBor and ddlBxor (bitwise and, or, xor) take the integer types only. */
typedef enum {
  ddlSum = 0,
  ddlProd = 1,
  ddlMin = 2,
  ddlMax = 3,
  ddlAvg = 4,
  ddlBand = 5,
  ddlBor = 6,
  ddlBxor = 7,
  ddlNumOps = 8
} ddlRedOp_t;

/* Versioned configuration. Always start from DDL_CONFIG_INITIALIZER; fields left at 0/NULL fall back to the
 * environment (DDL_TIMEOUT_MS, DDL_TOPOLOGY, DDL_ALGO, DDL_SEGMENT_BYTES) and then to built-in defaults. */
#define DDL_CONFIG_VERSION 1
typedef struct {
  size_t size;           /* sizeof(ddlConfig_t), set by the initializer */
  unsigned int version;  /* DDL_CONFIG_VERSION, set by the initializer */
  int timeoutMs;         /* every blocking wait; <= 0: DDL_TIMEOUT_MS or 300000 */
  const char* topology;  /* "4x8x2": dims, fastest-varying first, product = nranks; NULL: DDL_TOPOLOGY or flat */
  const char* algorithm; /* "auto", "ring", "mdring", "rhd"; NULL: DDL_ALGO or "auto" */
  size_t segmentBytes;   /* pipeline segment size of the ring algorithms; 0: DDL_SEGMENT_BYTES or automatic */
} ddlConfig_t;
#define DDL_CONFIG_INITIALIZER \
  { sizeof(ddlConfig_t), DDL_CONFIG_VERSION, 0, NULL, NULL, 0 }

/* Version as DDL_VERSION_CODE of the library actually loaded. */
ddlResult_t ddlGetVersion(int* version);

/* Short static description of a result code. */
const char* ddlGetErrorString(ddlResult_t result);

/* The detailed message of the last failure on comm (what failed, which peer rank and host, what to do).
 * With comm == NULL: the last failure on this thread (useful when ddlCommInit* fails). Never NULL. */
const char* ddlGetLastError(ddlComm_t comm);

/* Creates a communicator of nranks ranks. rootAddr is "host:port" of rank 0's rendezvous store; rank 0 listens
 * on that port. Blocks until every rank has joined or the timeout passes. config may be NULL. */
ddlResult_t ddlCommInitRank(ddlComm_t* comm, int nranks, int rank, const char* rootAddr,
                            const ddlConfig_t* config);

/* Same, reading DDL_RANK, DDL_WORLD_SIZE and DDL_ROOT (and the optional DDL_* settings) from the environment,
 * as set by ddlrun and ddl-agent. */
ddlResult_t ddlCommInitFromEnv(ddlComm_t* comm, const ddlConfig_t* config);

/* Frees the communicator. Call it on every rank; it first waits (bounded by the timeout) for peers to finish. */
ddlResult_t ddlCommDestroy(ddlComm_t comm);

/* Any thread: makes every blocked and future call on comm return ddlAborted and tells the peers.
 * Free the communicator afterwards with ddlCommDestroy. */
ddlResult_t ddlCommAbort(ddlComm_t comm);

/* Any thread: ddlSuccess, or the error that broke the communicator (a dead peer, a timeout, an abort). */
ddlResult_t ddlCommGetAsyncError(ddlComm_t comm, ddlResult_t* asyncError);

ddlResult_t ddlCommCount(ddlComm_t comm, int* count);
ddlResult_t ddlCommUserRank(ddlComm_t comm, int* rank);
/* The topology in use, e.g. "2x2" (a flat communicator reports its rank count, "4"). */
ddlResult_t ddlCommGetTopology(ddlComm_t comm, char* buf, size_t len);

/* Collectives. sendbuff == recvbuff is in-place. Every rank must make the same calls in the same order with
 * the same count, type, op and root; a mismatch that libddl detects gives ddlInvalidArgument on the ranks that
 * see it and ddlRemoteError on the others. Only ddlAllReduce and ddlIallReduce take device buffers (CUDA
 * builds); the others return ddlInvalidArgument for them. */
ddlResult_t ddlAllReduce(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                         ddlRedOp_t op, ddlComm_t comm);
ddlResult_t ddlBroadcast(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype, int root,
                         ddlComm_t comm);
/* recvbuff holds nranks * sendcount elements, rank r's contribution at offset r * sendcount. */
ddlResult_t ddlAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ddlDataType_t datatype,
                         ddlComm_t comm);
/* sendbuff holds nranks * recvcount elements; rank r receives the reduction of block r. */
ddlResult_t ddlReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ddlDataType_t datatype,
                             ddlRedOp_t op, ddlComm_t comm);
ddlResult_t ddlBarrier(ddlComm_t comm);

/* Non-blocking allreduce: returns at once with a request; the buffers must stay valid until it completes.
 * Collectives on one communicator run in the order they were called, blocking or not. */
ddlResult_t ddlIallReduce(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                          ddlRedOp_t op, ddlComm_t comm, ddlRequest_t* request);
/* *done = 1 once the operation finished; the request is then freed and the operation's result returned.
 * *done = 0: returns ddlInProgress. */
ddlResult_t ddlTest(ddlRequest_t request, int* done);
/* Waits for the operation, frees the request and returns the operation's result. */
ddlResult_t ddlWait(ddlRequest_t request);

#ifdef __cplusplus
}
#endif

#endif /* DDL_DDL_H_ */
