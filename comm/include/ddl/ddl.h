/*
 * ddl.h — the public C API of libddl, ddl's collective communication library.
 *
 * NCCL-shaped: an opaque communicator, one result type, a versioned config struct. Every call returns a
 * ddlResult_t; no C++ exception ever crosses this boundary. Buffers are host memory; in a libddl built with
 * the CUDA Toolkit, the collectives also take CUDA device memory:
 *  - stream-ordered (the *OnStream calls, as NCCL's): enqueued on a CUDA stream, they return at once (where
 *    libddl's node kernel serves; "host-paced" elsewhere, they return once done) and the stream's later work
 *    sees the result;
 *  - host-blocking (the others, either buffer or both on a device): device data must be complete (its stream
 *    synchronised) when the call is made; the result is in recvbuff when the call (or ddlWait) returns.
 * Point-to-point calls take host memory only.
 *
 * Threads: a communicator's collectives are called by one thread at a time. ddlCommAbort and
 * ddlCommGetAsyncError may be called from any thread at any time (that is how a watchdog unblocks a stuck
 * collective), and so may the point-to-point calls (ddlSend, ddlRecv, ddlIsend, ddlIrecv), also while another
 * thread runs a collective.
 */
#ifndef DDL_DDL_H_
#define DDL_DDL_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDL_MAJOR 0
#define DDL_MINOR 2
#define DDL_PATCH 0
#define DDL_VERSION_CODE (DDL_MAJOR * 10000 + DDL_MINOR * 100 + DDL_PATCH)

typedef struct ddlComm* ddlComm_t;
/* A CUDA stream (cudaStream_t) as an opaque pointer, so that this header needs no CUDA header. NULL is the
 * legacy default stream. */
typedef void* ddlStream_t;
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

/* How a blocking wait spends its idle time (waiting for a peer). */
typedef enum {
  ddlWaitAuto = 0,  /* DDL_WAIT if set, else spin; when the ranks on a host outnumber its cores, yield at once */
  ddlWaitSpin = 1,  /* poll for about 2 ms, then yield, then sleep: the lowest latency for a rank per core */
  ddlWaitShare = 2, /* poll for about 50 us, then block until data arrives (UCX's wakeup fd): for callers whose
                     * other threads compute on the same cores meanwhile (a framework's communication thread;
                     * torch_ddl's default). Where ranks outnumber cores, yield at once as ddlWaitAuto does. */
  ddlNumWaitModes = 3
} ddlWaitMode_t;

/* Versioned configuration. Always start from DDL_CONFIG_INITIALIZER; fields left at 0/NULL fall back to the
 * environment (DDL_TIMEOUT_MS, DDL_TOPOLOGY, DDL_ALGO, DDL_SEGMENT_BYTES, DDL_WAIT, DDL_JOB_SECRET) and
 * then to built-in defaults. Versions 1 (up to segmentBytes) and 2 (up to waitMode) are still accepted. */
#define DDL_CONFIG_VERSION 3
typedef struct {
  size_t size;           /* sizeof(ddlConfig_t), set by the initializer */
  unsigned int version;  /* DDL_CONFIG_VERSION, set by the initializer */
  int timeoutMs;         /* every blocking wait; <= 0: DDL_TIMEOUT_MS or 300000 */
  const char* topology;  /* "4x8x2": dims, fastest-varying first, product = nranks; NULL: DDL_TOPOLOGY or flat */
  const char* algorithm; /* "auto", "ring", "mdring", "rhd", "shm"; NULL: DDL_ALGO or "auto" */
  size_t segmentBytes;   /* pipeline segment size of the ring algorithms; 0: DDL_SEGMENT_BYTES or automatic */
  int waitMode;          /* a ddlWaitMode_t; ddlWaitAuto (0): DDL_WAIT (auto, spin, share) or automatic */
  /* Version 3. The job's secret, 1 to 4096 bytes, the same on every rank: rank 0's rendezvous store
   * (ddlCommInitRank, ddlCommInitFromEnv) then admits only ranks that prove they hold it, and each rank
   * checks that the store holds it too. NULL or "": DDL_JOB_SECRET (set by ddlrun and ddl-agent), or none:
   * the store answers anyone who can connect. ddlCommInitRankWithStore does not use it (the caller's store
   * is the caller's to guard). */
  const char* secret;
} ddlConfig_t;
#define DDL_CONFIG_INITIALIZER \
  { sizeof(ddlConfig_t), DDL_CONFIG_VERSION, 0, NULL, NULL, 0, ddlWaitAuto, NULL }

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

/* A key-value store the ranks already share, e.g. a framework's rendezvous store (torch.distributed's): with
 * ddlCommInitRankWithStore the ranks exchange their addresses through it instead of through a TCP port of
 * libddl's own, so no port is chosen and none can be taken by another process. Give each communicator a store
 * (or key prefix) of its own. libddl calls the functions from the calling thread only, and only during
 * ddlCommInitRankWithStore, ddlCommShrink, ddlCommGrow and ddlCommJoinWithStore (keep ctx valid while you may
 * shrink or grow; those need add); they return 0 on success. A joiner's store must reach the same keys as the
 * first communicator's. */
typedef struct {
  void* ctx; /* passed back to every function */
  /* Stores len bytes of value under key (overwriting). */
  int (*set)(void* ctx, const char* key, const void* value, size_t len);
  /* Waits up to timeoutMs for key to be set, then calls deliver(sink, value, len) once with its value. */
  int (*get)(void* ctx, const char* key, int timeoutMs,
             void (*deliver)(void* sink, const void* value, size_t len), void* sink);
  /* Optional (NULL: none): adds delta to the integer at key (missing: 0) and writes the sum to *result. With it
   * libddl refuses a second process that claims a rank already taken. */
  int (*add)(void* ctx, const char* key, long long delta, long long* result);
  /* Optional (NULL: none): why the store's last call failed, for libddl's error message; may return NULL. */
  const char* (*lastError)(void* ctx);
} ddlStore_t;

/* Creates a communicator of nranks ranks that meet through store (see ddlStore_t). Blocks until every rank
 * has joined or the timeout passes. config may be NULL. */
ddlResult_t ddlCommInitRankWithStore(ddlComm_t* comm, int nranks, int rank, const ddlStore_t* store,
                                     const ddlConfig_t* config);

/* Same as ddlCommInitRank, with the rank, the rank count and rank 0's address from the launcher's variables,
 * in this order (the first launcher whose rank and size are both set decides): DDL_RANK, DDL_WORLD_SIZE,
 * DDL_ROOT (ddlrun, ddl-agent); RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun): libddl's store on
 * MASTER_PORT + 1, or DDL_PORT; SLURM_PROCID, SLURM_NTASKS, the first host of SLURM_JOB_NODELIST (srun): port
 * DDL_PORT, else 29400 + SLURM_JOB_ID mod 500; OMPI_COMM_WORLD_RANK/SIZE (Open MPI) or PMI_RANK/SIZE (MPICH
 * hydra), with DDL_ROOT (mpirun -x DDL_ROOT=...). DDL_ROOT, where set, names rank 0's store under any
 * launcher. The optional DDL_* settings (DDL_JOB_SECRET among them) apply as always; outside ddlrun and
 * ddl-agent rank 0 warns on stderr when no secret is set. */
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
/* The topology in use, e.g. "2x2" (a flat communicator reports its rank count, "4"). Without DDL_TOPOLOGY (or
 * with a flat one), ranks on several nodes with the same number of consecutive ranks on each get
 * "(ranks per node)x(nodes)". */
ddlResult_t ddlCommGetTopology(ddlComm_t comm, char* buf, size_t len);
/* How the ranks of one node talk: "shm" (every rank on one node; collectives with a shared-memory form use
 * libddl's segment), "shm+ucx" (mdring's dim 0, the node, over shared memory, the other dims over UCX) or
 * "ucx" (UCX only: DDL_SHM=off, one rank per node, a layout whose dim 0 is not the node, a forced ring or
 * rhd, or a forced mdring among ranks that all share one node). */
ddlResult_t ddlCommGetIntraNodePath(ddlComm_t comm, char* buf, size_t len);
/* How this communicator's stream-ordered collectives (the *OnStream calls below) run: "kernel" (one kernel
 * per collective and rank, enqueued; the call returns at once), "kernel+wire" (several nodes: an allreduce
 * runs the node kernel on each node and the call sends each rank's block across the nodes, the GPU reducing
 * what arrives, and returns once the blocks have crossed, with the node's last step enqueued; the other
 * collectives are host-paced), "host" (host-paced: the call waits for the stream and runs the collective
 * before it returns) or "unset" (no stream-ordered collective has run yet; the first decides). */
ddlResult_t ddlCommGetStreamScheme(ddlComm_t comm, char* buf, size_t len);

/* Elastic training: going on without the ranks that are gone. After a collective failed because a peer died
 * (ddlRemoteError, or ddlTimeout), every rank that goes on calls ddlCommShrink on the old communicator; they
 * agree on who is gone (the ranks in excludeRanks, which may be NULL with excludeCount 0, the ranks any of
 * them saw fail, and the ranks that do not call within the timeout) and *newcomm becomes a communicator of
 * the others, numbered in the old order, made through the old one's rendezvous (its store, or the caller's
 * ddlStore_t, which must then still work) with no new address. Every survivor gets the same set: the
 * agreement is one decision written once in the store. A rank the others left out gets ddlRemoteError. The
 * old communicator stays as it is: destroy it. Buffers and streams are the caller's and go on. The store must
 * outlive rank 0's death for this to survive it: with ddlCommInitRank rank 0 serves it, so a lost rank 0
 * fails the shrink with the store's error. */
ddlResult_t ddlCommShrink(ddlComm_t comm, const int* excludeRanks, int excludeCount, ddlComm_t* newcomm);
/* For a communicator made by ddlCommShrink: the old communicator's ranks it left out, ascending, into ranks
 * (up to maxRanks of them), and how many there are into *count (0 for any other communicator). */
ddlResult_t ddlCommGetExcluded(ddlComm_t comm, int* ranks, int maxRanks, int* count);
/* Growing: a process that comes to an elastic job (a replacement, or a new node's) calls ddlCommJoin with the
 * job's rendezvous (rootAddr, NULL: DDL_ROOT; the job's secret as for ddlCommInitRank) or
 * ddlCommJoinWithStore, and waits (up to the timeout) until the running ranks call ddlCommGrow, a collective
 * of theirs, at a point of their choosing (a step boundary). ddlCommGrow admits up to maxNewRanks (0: all) of
 * the processes waiting then, in the order they came, and *newcomm becomes a communicator of the old ranks,
 * which keep their numbers, and the joiners after them; NULL (and ddlSuccess) when none waits, on every rank
 * alike. The old communicator stays usable until destroyed; buffers and streams are the caller's and go on. A
 * joiner that times out gives its place up and is skipped; one that dies after it was admitted makes that
 * grow fail on every rank at the timeout (the old communicator goes on; grow again). A failure of rank 0's
 * store calls fails the grow on every rank alike. ddlCommInitFromEnv joins when DDL_JOIN=1, through DDL_ROOT
 * (set it to the job's root, also under torchrun or Slurm). */
ddlResult_t ddlCommGrow(ddlComm_t comm, int maxNewRanks, ddlComm_t* newcomm);
ddlResult_t ddlCommJoin(ddlComm_t* comm, const char* rootAddr, const ddlConfig_t* config);
ddlResult_t ddlCommJoinWithStore(ddlComm_t* comm, const ddlStore_t* store, const ddlConfig_t* config);

/* Collectives. sendbuff == recvbuff is in-place. Every rank must make the same calls in the same order with
 * the same count, type, op and root; a mismatch that libddl detects gives ddlInvalidArgument on the ranks
 * that see it and ddlRemoteError on the others. Every rank passes the same kind of buffers (host or device).
 * A count of 0 returns at once, on every rank. */
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
/* The reduction on root only: recvbuff is written (and needed) on the root alone. */
ddlResult_t ddlReduce(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype, ddlRedOp_t op,
                      int root, ddlComm_t comm);
/* The root's recvbuff gets nranks * sendcount elements, rank r's at offset r * sendcount; recvbuff is used on
 * the root only. In place on the root: sendbuff == recvbuff + root * sendcount elements. */
ddlResult_t ddlGather(const void* sendbuff, void* recvbuff, size_t sendcount, ddlDataType_t datatype, int root,
                      ddlComm_t comm);
/* Rank r's recvbuff gets the root's sendbuff elements [r * recvcount, (r + 1) * recvcount); sendbuff is used on
 * the root only. In place on the root: recvbuff == sendbuff + root * recvcount elements. */
ddlResult_t ddlScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ddlDataType_t datatype, int root,
                       ddlComm_t comm);
/* Rank r's block j (count elements at offset j * count of sendbuff) goes to rank j's recvbuff at offset
 * r * count. Both buffers hold nranks * count elements; sendbuff may equal recvbuff. */
ddlResult_t ddlAllToAll(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                        ddlComm_t comm);
/* The same with a count and a displacement (both in elements) per rank: sendcounts[j] elements from
 * sendbuff + sdispls[j] go to rank j, recvcounts[j] elements from rank j land at recvbuff + rdispls[j].
 * sendcounts[j] on rank i must equal recvcounts[i] on rank j (a difference fails as a mismatch). Each array
 * holds nranks entries; the counts may differ from rank to rank and be 0. */
ddlResult_t ddlAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[], void* recvbuff,
                         const size_t recvcounts[], const size_t rdispls[], ddlDataType_t datatype,
                         ddlComm_t comm);

/* Stream-ordered collectives of CUDA device buffers (libddl built with the CUDA Toolkit). Arguments and
 * semantics as the blocking calls above; both buffers are device memory on the stream's device. The call
 * enqueues the collective on stream and returns at once (but see "host-paced" below): work queued on stream
 * after it sees the result, and the buffers must not be freed or rewritten until then. Every rank makes the
 * same calls in the same order, on whatever stream; a communicator runs its collectives in call order,
 * blocking and stream-ordered alike.
 *
 * Among ranks that all share one node (ddlCommGetIntraNodePath "shm") with CUDA IPC between their GPUs, and
 * each rank on a GPU of its own or several sharing one under the MPS daemon, a collective is one kernel per
 * rank with no host in the data path (the "kernel" scheme), and can be captured into a CUDA graph once the
 * communicator has run one stream-ordered collective uncaptured (the first sets its GPU memory up, a blocking
 * exchange among the ranks). Across nodes whose ranks share memory (ddlCommGetIntraNodePath "shm+ucx", a
 * topology of GPUs x nodes with no level above), an allreduce runs that kernel's reduce-scatter on each node,
 * waits for it on the host, sends each rank's block across the nodes through pinned memory with the GPU
 * reducing what arrives, and returns with the node's allgather enqueued ("kernel+wire"; it cannot be
 * captured). Elsewhere (one rank per node, racks above the nodes, the other collectives across nodes, ranks
 * sharing a GPU without MPS, DDL_DEVICE_SCHEME=host) the collective is "host-paced": the call waits until the
 * stream's earlier work is complete, runs the blocking collective and returns once the result is in place, so
 * it does not return at once and overlaps nothing; capture is refused. ddlCommGetStreamScheme and DDL_DEBUG=1
 * say which scheme runs; DDL_DEVICE_SCHEME=kernel makes a call the node kernel cannot run an error
 * (ddlInvalidArgument, saying why) instead of host-paced. A graph's collectives are ordered by the stream the
 * graph is launched on: launch it where the communicator's other stream-ordered calls are ordered (the same
 * stream), or order the streams with events. Two of a rank's kernels that run at once (a graph replayed on
 * one stream while a call on another, unordered, runs too) break the communicator with ddlInvalidArgument
 * rather than share its memory; so do calls that differ between the ranks (kind, count, type, op, root, or
 * one rank a call ahead), on every rank, with a message naming both calls.
 *
 * An error in the arguments is returned at once. A failure found later (a dead peer, a timeout, an abort, a
 * mismatch, also inside a replayed graph) breaks the communicator: ddlCommGetAsyncError returns it, and so
 * does every later call. ddlCommAbort also ends kernels already on the GPU that wait for a peer. */
ddlResult_t ddlAllReduceOnStream(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                                 ddlRedOp_t op, ddlComm_t comm, ddlStream_t stream);
ddlResult_t ddlReduceScatterOnStream(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ddlDataType_t datatype, ddlRedOp_t op, ddlComm_t comm,
                                     ddlStream_t stream);
ddlResult_t ddlAllGatherOnStream(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ddlDataType_t datatype, ddlComm_t comm, ddlStream_t stream);
ddlResult_t ddlBroadcastOnStream(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                                 int root, ddlComm_t comm, ddlStream_t stream);
ddlResult_t ddlReduceOnStream(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                              ddlRedOp_t op, int root, ddlComm_t comm, ddlStream_t stream);

/* Registered buffers (as NCCL's ncclCommRegister): on the node kernel, an allreduce whose buffers every
 * member registered reads and writes the members' buffers in place, without copying them through libddl's
 * memory first (zero-copy). ddlCommRegister is a collective: every rank calls it, in the same order, with a
 * device buffer of its own (sizes may differ); each member shares the buffer's allocation with the others
 * over CUDA IPC. *handle is for ddlCommDeregister, also a collective in the same order, which waits for the
 * communicator's kernels. A call whose buffers lie inside a registered buffer on every member is zero-copy;
 * where any member's are not, it is staged as before, so mixing is never wrong. Register before capturing
 * a CUDA graph that uses the buffer (or see ddlCommRegisterGraphBuffers), and deregister only once the
 * graph's launches have completed and it will not be launched again: ddlCommDeregister waits for libddl's own
 * kernels, not for a graph's. Deregister before freeing the buffer on any rank (the peers map its memory); a
 * rank whose registered buffer was freed and allocated again at the same address has its calls on it staged
 * (CUDA's buffer id tells the allocations apart), so they stay right. An argument error on one rank (a NULL
 * or host buffer, size 0, a handle that is no registration) is returned at once on that rank, and the others'
 * call waits for it until the timeout, as in any collective one rank leaves out. Where the node kernel does
 * not serve (host-paced, across nodes) a registration succeeds and changes nothing. Memory that cannot be
 * shared over CUDA IPC (cuMemCreate's, as PyTorch's expandable segments) is refused on every rank with
 * ddlInvalidArgument naming the member and why; the buffer keeps working, staged. At most 4096
 * registrations per communicator. ddlMemAlloc and ddlMemFree allocate and free device memory on the current
 * device that ddlCommRegister accepts (cudaMalloc's). */
ddlResult_t ddlCommRegister(ddlComm_t comm, void* buff, size_t size, void** handle);
ddlResult_t ddlCommDeregister(ddlComm_t comm, void* handle);
/* Buffers of a CUDA graph registered after its capture (as vLLM's custom allreduce): a stream-ordered
 * allreduce captured on the node kernel reserves two registrations for its buffers (whatever they hold), so
 * a graph of k allreduces takes 2k of the 4096, until the communicator is destroyed. Its replays are staged
 * until ddlCommRegisterGraphBuffers, a collective in the same order on every rank, shares the buffers of
 * every allreduce captured since the last call; from then on they are zero-copy. A buffer a member cannot
 * share stays staged: the call returns ddlInvalidArgument saying how many and why, and nothing breaks. Do not
 * replay the graph during the call. */
ddlResult_t ddlCommRegisterGraphBuffers(ddlComm_t comm);
/* Whether work enqueued on stream now is being captured into a CUDA graph (*capturing = 1, else 0), as
 * comm's GPU runtime sees it; without one, 0. Asked in CUDA's relaxed capture mode, so that asking does not
 * invalidate a capture. For frameworks that run collectives of their own around the stream-ordered calls
 * (torch_ddl's registration rounds) and must not while a capture is under way. */
ddlResult_t ddlCommStreamCapturing(ddlComm_t comm, ddlStream_t stream, int* capturing);
ddlResult_t ddlMemAlloc(void** ptr, size_t size);
ddlResult_t ddlMemFree(void* ptr);

/* Point-to-point. A send to peer matches the receive that peer posts for this rank in the same position:
 * the k-th send from a to b meets the k-th receive on b from a, whatever collectives either calls in between.
 * Count and type must agree on both sides (a difference fails as a mismatch). peer is another rank of comm.
 * Any thread may call these, also while another thread runs a collective; they make progress inside a
 * running collective and otherwise on the communicator's own thread, so a send never waits for the caller to
 * call into libddl again. A failure (dead peer, timeout, mismatch) breaks the communicator, like a failed
 * collective. ddlSend and ddlRecv return when the buffer may be reused; the I-forms at once (ddlTest/ddlWait),
 * the buffer must stay valid until then. Operations still pending at ddlCommDestroy fail with ddlAborted; their
 * requests stay valid after it, to be freed with ddlWait or ddlTest. */
ddlResult_t ddlSend(const void* sendbuff, size_t count, ddlDataType_t datatype, int peer, ddlComm_t comm);
ddlResult_t ddlRecv(void* recvbuff, size_t count, ddlDataType_t datatype, int peer, ddlComm_t comm);
ddlResult_t ddlIsend(const void* sendbuff, size_t count, ddlDataType_t datatype, int peer, ddlComm_t comm,
                     ddlRequest_t* request);
ddlResult_t ddlIrecv(void* recvbuff, size_t count, ddlDataType_t datatype, int peer, ddlComm_t comm,
                     ddlRequest_t* request);

/* Tagged point-to-point (libddl >= 0.2, DDL_VERSION_CODE >= 200), as MPI's: a tagged send to peer matches the
 * first tagged receive that peer posts for this rank, or for DDL_ANY_SOURCE, with the same tag; messages of
 * one pair of ranks and one tag are matched in the order they were sent. Tagged and untagged (ddlIsend,
 * ddlIrecv) operations never match each other. tag is 0 to DDL_MAX_TAG. A receive from DDL_ANY_SOURCE takes
 * a message with its tag from whichever rank sends first; source, when not NULL, gets the rank the message
 * came from once the receive has finished (before ddlTest reports done or ddlWait returns), for either kind
 * of peer. Everything else (threads, progress, count and type checks, failures, teardown) as ddlIsend and
 * ddlIrecv; a receive from DDL_ANY_SOURCE is bounded by the timeout alone, not by any one peer's death. */
#define DDL_ANY_SOURCE (-1)
#define DDL_MAX_TAG 0x7FFFFFFF
ddlResult_t ddlIsendTagged(const void* sendbuff, size_t count, ddlDataType_t datatype, int peer, int tag,
                           ddlComm_t comm, ddlRequest_t* request);
ddlResult_t ddlIrecvTagged(void* recvbuff, size_t count, ddlDataType_t datatype, int peer, int tag,
                           ddlComm_t comm, int* source, ddlRequest_t* request);

/* Non-blocking allreduce: returns at once with a request; the buffers must stay valid until it completes.
 * Collectives on one communicator run in the order they were called, blocking or not. */
ddlResult_t ddlIallReduce(const void* sendbuff, void* recvbuff, size_t count, ddlDataType_t datatype,
                          ddlRedOp_t op, ddlComm_t comm, ddlRequest_t* request);
/* For every request (ddlIallReduce, ddlIsend, ddlIrecv):
 * *done = 1 once the operation finished; the request is then freed and the operation's result returned.
 * *done = 0: returns ddlInProgress. */
ddlResult_t ddlTest(ddlRequest_t request, int* done);
/* Waits for the operation, frees the request and returns the operation's result. */
ddlResult_t ddlWait(ddlRequest_t request);

#ifdef __cplusplus
}
#endif

#endif /* DDL_DDL_H_ */
