// UcxTransport: the real transport, UCX's ucp tag API.
//
// One UCX context and worker per communicator. At start each rank publishes one record (host name, node key,
// worker address) to the rendezvous Store and gathers everyone's with one getMany: O(p) store traffic and one
// round trip, where a get per key and peer took 3(p-1) sequential round trips through rank 0's server.
// Endpoints are made lazily, the first time this rank sends to or receives from a peer: a ring connects to 2
// peers, not p-1 (making p-1 endpoints per rank at start cost more than the gather at hundreds of ranks). The
// receive side connects too because only an endpoint notices a dead peer (error handler, keepalive), and
// Session relies on peerError() of the peer it waits for. Endpoints use UCP_ERR_HANDLING_MODE_PEER, so a dead
// peer completes our requests with an error instead of hanging them. UCX picks the wire: InfiniBand
// (rc/ud/dc) where present, shared memory (posix, sysv, cma) between processes of one host, TCP otherwise;
// UCX_TLS and UCX_NET_DEVICES still apply, so falling back from IB to Ethernet needs no code change.
//
// Four UCX defaults are changed unless the user set them, through ucp_config_modify (libddl never touches the
// process environment): shared-memory transports get peer error handling (MM_ERROR_HANDLING=y; without it,
// error-handling endpoints would skip shared memory), 1 KiB FIFO elements (MM_FIFO_ELEM_SIZE), the keepalive
// interval drops to DDL_KEEPALIVE_MS (2000 ms) so a dead peer on shared memory is noticed quickly, and where
// UCX cannot use RDMA, messages up to 2 MiB go eager (RNDV_THRESH; TCP's rendezvous round trip waits behind
// the link's queued data).
//
// Threads: serialised access (UCS_THREAD_MODE_SERIALIZED): the communicator's calling thread or its async
// executor, never both at once.
#pragma once

#include <memory>
#include <string>

#include "deadline.h"
#include "rendezvous/store.h"
#include "transport/transport.h"

namespace ddl {

// Creates the transport and gathers every peer's record (it connects later, to the peers it uses); throws
// ddl::Error (ddlSystemError for UCX failures, ddlTimeout naming a rank's key when not every rank publishes
// its record before the deadline). wakeup: idle waits block on the worker's event fd (UCP_FEATURE_WAKEUP, for
// ddlWaitShare) instead of sleeping. Whether a UCX_TLS value may select an RDMA transport: unset, "all", an
// exclusion list ("^..."), "ib", or a token naming rc, ud or dc (rc_x, ud_verbs, dc_mlx5, ...).
bool ucxTlsMayUseRdma(const std::string& tls);

std::unique_ptr<Transport> createUcxTransport(int rank, int size, Store& store, const Deadline& deadline,
                                              bool wakeup);

}  // namespace ddl
