"""One rank of a torch_ddl test scenario (started by harness.run_ranks). Prints "OK <scenario>" when every check
passed; any failed check raises, so the process exits non-zero with the traceback in its output.

    worker.py collectives [DEV] every collective, op and dtype against torch's own results (DEV: cpu or cuda)
    worker.py async             async_op ordering, futures, then-callbacks, is_completed
    worker.py ddp               DDP over ddl and over gloo from the same start: the same weights; comm hooks
    worker.py init METHOD       init_process_group through env://, tcp://, file:// or an explicit store
    worker.py groups            new_group, with ranks outside the group, and destroy_process_group
    worker.py kill              rank WORLD-1 dies by SIGKILL mid-loop: the others raise, naming it, in time
    worker.py stall             rank 1 stops calling: the others raise a timeout within the group's timeout
    worker.py mismatch          rank 1 all_reduces another size: every rank raises a mismatch, fast
    worker.py errors            bad arguments raise ValueError and break nothing
    worker.py stop [EVERY]      torch_ddl.StopSignal: rank 0 sends SIGTERM to rank WORLD-1 alone mid-loop; every
                                rank stops after the same step (a multiple of EVERY), long before the loop's end
    worker.py fsdp              FSDP2 with mixed precision and a gradient divide factor (PREMUL_SUM) against a
                                single-process reference (torch 2.x; skipped, exit 77, elsewhere)
    worker.py cuda              CUDA tensors: every collective, no host synchronisation, a CUDA graph, DDP
                                against gloo (skipped, exit 77, without a GPU)
    worker.py kill cuda         the kill scenario with CUDA tensors (skipped, exit 77, without a GPU)
    worker.py elastic K N       DDP for N steps with torch_ddl.elastic; rank WORLD-1 dies by SIGKILL at step K:
                                the others raise RankLost naming it, sync and go on as WORLD-1 ranks to step N,
                                every step once, ending with equal weights
    worker.py elastic K N grow  the same through elastic.init_process_group, and the victim starts a process
                                (DDL_JOIN=1, its output in the victim's) before it dies; the survivors grow()
                                every 10th step until it is in, sync() gives it the state, and all WORLD end
                                with equal weights
"""

import datetime
import functools
import gc
import os
import signal
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist

import torch_ddl  # registers "ddl"

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
DEV = "cpu"  # the device the scenario's tensors live on (set by scenarios that take one)
torch.set_num_threads(1)


def check(cond, what):
    if not cond:
        raise AssertionError("rank %d: %s" % (RANK, what))


def init(timeout_s=60, **kwargs):
    dist.init_process_group("ddl", timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    check(dist.get_backend() == "ddl", "backend is %s" % dist.get_backend())
    # Once any rank is past this barrier, every rank has left init_process_group, whose last step polls the
    # store rank 0 hosts: the failure scenarios' ranks may then exit at once without cutting a slow rank's
    # init short (seen: "Connection reset by peer" in _store_based_barrier on rank 2 of the mismatch test).
    dist.barrier()


# ---- collectives against torch's own results ----

REDUCE_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                 torch.float32, torch.float64, torch.complex64]
OPS = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG, "PRODUCT": dist.ReduceOp.PRODUCT,
       "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX, "BAND": dist.ReduceOp.BAND, "BOR": dist.ReduceOp.BOR,
       "BXOR": dist.ReduceOp.BXOR}


def valid(dtype, op):
    if dtype == torch.bool:
        return op != "AVG"
    if dtype.is_complex:
        return op in ("SUM", "AVG")
    if dtype.is_floating_point:
        return op not in ("BAND", "BOR", "BXOR")
    return True


def value(dtype, op, rank, n=37):
    """Rank rank's input: small values that every op reduces exactly over up to 8 ranks."""
    i = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return ((i + rank) % 3 != 0)
    if op == "PRODUCT":
        v = torch.where((i + rank) % 4 == 0, torch.tensor(2), torch.tensor(1))
        if dtype in (torch.int8, torch.int32, torch.int64, torch.float32, torch.float64) and rank == 1:
            v = torch.where(i % 3 == 0, -v, v)
        return v.to(dtype)
    v = (i * 7 + rank * 5) % 11
    if dtype.is_floating_point or dtype.is_complex or dtype in (torch.int8, torch.int32, torch.int64):
        v = v - 5
    t = v.to(dtype)
    if dtype.is_complex:
        t = t + 1j * ((i + rank) % 3).to(torch.float32)
    return t


def expected(dtype, op, n=37):
    xs = [value(dtype, op, q, n) for q in range(WORLD)]
    if dtype == torch.bool:
        fn = {"SUM": torch.logical_or, "MAX": torch.logical_or, "PRODUCT": torch.logical_and,
              "MIN": torch.logical_and, "BAND": torch.logical_and, "BOR": torch.logical_or,
              "BXOR": torch.logical_xor}[op]
        return functools.reduce(fn, xs)
    wide = torch.complex128 if dtype.is_complex else (torch.float64 if dtype.is_floating_point else torch.int64)
    ws = [x.to(wide) for x in xs]
    if op in ("SUM", "AVG"):
        r = functools.reduce(torch.add, ws)
        if op == "AVG":
            r = r / WORLD if (dtype.is_floating_point or dtype.is_complex) else torch.div(r, WORLD, rounding_mode="trunc")
    elif op == "PRODUCT":
        r = functools.reduce(torch.mul, ws)
    elif op == "MIN":
        r = functools.reduce(torch.minimum, ws)
    elif op == "MAX":
        r = functools.reduce(torch.maximum, ws)
    else:
        r = functools.reduce({"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op], ws)
    return r.to(dtype)


def same(got, want, what):
    got, want = got.cpu(), want.cpu()
    if got.dtype.is_floating_point or got.dtype.is_complex:
        ok = torch.allclose(got.to(torch.complex128 if got.dtype.is_complex else torch.float64),
                            want.to(torch.complex128 if want.dtype.is_complex else torch.float64), rtol=1e-2, atol=1e-2)
    else:
        ok = torch.equal(got, want)
    check(ok, "%s: got %s, want %s" % (what, got.tolist()[:8], want.tolist()[:8]))


def noncontiguous(t):
    """The same values in a strided view (every other element of a buffer twice as long)."""
    big = torch.zeros(t.numel() * 2, dtype=t.dtype, device=t.device)
    view = big[::2]
    view.copy_(t)
    check(not view.is_contiguous() or t.numel() <= 1, "view is contiguous")
    return view


def on_dev(t):
    return t.to(DEV)


def scenario_collectives(device="cpu"):
    global DEV
    DEV = device
    if device == "cuda":
        torch.cuda.set_device(RANK % torch.cuda.device_count())
    init()
    collectives()
    dist.destroy_process_group()
    print("OK collectives")


def collectives():
    # all_reduce and reduce, every dtype and op, contiguous and not.
    for dtype in REDUCE_DTYPES:
        for name, op in OPS.items():
            if not valid(dtype, name):
                continue
            want = expected(dtype, name)
            for make in (lambda t: t.clone(), noncontiguous):
                t = make(on_dev(value(dtype, name, RANK)))
                dist.all_reduce(t, op=op)
                same(t, want, "all_reduce %s %s (%s)" % (dtype, name, "contiguous" if t.is_contiguous() else "strided"))
            for root in range(WORLD):
                t = on_dev(value(dtype, name, RANK))
                dist.reduce(t, dst=root, op=op)
                if RANK == root:
                    same(t, want, "reduce %s %s to %d" % (dtype, name, root))
    # all_reduce_coalesced
    ts = [on_dev(value(torch.float32, "SUM", RANK, n)) for n in (3, 17, 1)]
    dist.all_reduce_coalesced(ts)
    for t, n in zip(ts, (3, 17, 1)):
        same(t, expected(torch.float32, "SUM", n), "all_reduce_coalesced")
    # reduce_scatter (list and base)
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        full = [on_dev(value(dtype, "SUM", RANK, 37 * WORLD)[q * 37:(q + 1) * 37]) for q in range(WORLD)]
        want = expected(dtype, "SUM", 37 * WORLD)[RANK * 37:(RANK + 1) * 37]
        out = torch.empty(37, dtype=dtype, device=DEV)
        dist.reduce_scatter(out, full)
        same(out, want, "reduce_scatter %s" % dtype)
        out2 = torch.empty(37, dtype=dtype, device=DEV)
        dist._reduce_scatter_base(out2, torch.cat(full))
        same(out2, want, "_reduce_scatter_base %s" % dtype)
    # Collectives that only move data: every dtype, int16 and complex128 included.
    for dtype in REDUCE_DTYPES + [torch.int16, torch.complex128]:
        mine = on_dev(value(dtype, "SUM", RANK))
        for root in range(WORLD):
            t = mine.clone() if RANK == root else torch.zeros_like(mine)
            dist.broadcast(t, src=root)
            same(t, value(dtype, "SUM", root), "broadcast %s from %d" % (dtype, root))
        outs = [torch.zeros_like(mine) for _ in range(WORLD)]
        dist.all_gather(outs, mine)
        for q in range(WORLD):
            same(outs[q], value(dtype, "SUM", q), "all_gather %s block %d" % (dtype, q))
        flat = torch.zeros(37 * WORLD, dtype=dtype, device=DEV)
        dist._all_gather_base(flat, mine)
        same(flat, torch.cat([value(dtype, "SUM", q) for q in range(WORLD)]), "_all_gather_base %s" % dtype)
        root = WORLD - 1
        gl = [torch.zeros_like(mine) for _ in range(WORLD)] if RANK == root else None
        dist.gather(mine, gather_list=gl, dst=root)
        if RANK == root:
            for q in range(WORLD):
                same(gl[q], value(dtype, "SUM", q), "gather %s block %d" % (dtype, q))
        got = torch.zeros_like(mine)
        sl = [on_dev(value(dtype, "SUM", q)) for q in range(WORLD)] if RANK == 0 else None
        dist.scatter(got, scatter_list=sl, src=0)
        same(got, value(dtype, "SUM", RANK), "scatter %s" % dtype)
    # all_to_all_single: equal parts and uneven splits (rank i sends i + j + 1 rows to rank j).
    inp = on_dev(torch.arange(4 * WORLD, dtype=torch.float32) + 100 * RANK)
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    for q in range(WORLD):
        same(out[q * 4:(q + 1) * 4], torch.arange(4, dtype=torch.float32) + 4 * RANK + 100 * q, "all_to_all_single")
    in_splits = [RANK + j + 1 for j in range(WORLD)]
    out_splits = [q + RANK + 1 for q in range(WORLD)]
    inp = on_dev(torch.cat([torch.full((RANK + j + 1, 2), float(RANK * 10 + j)) for j in range(WORLD)]))
    out = torch.empty(sum(out_splits), 2, device=DEV)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    off = 0
    for q in range(WORLD):
        same(out[off:off + out_splits[q]], torch.full((out_splits[q], 2), float(q * 10 + RANK)), "uneven all_to_all")
        off += out_splits[q]
    # all_to_all (lists, different sizes per peer)
    ins = [torch.full((RANK + j + 1,), RANK * 10 + j, dtype=torch.int32, device=DEV) for j in range(WORLD)]
    outs = [torch.empty(q + RANK + 1, dtype=torch.int32, device=DEV) for q in range(WORLD)]
    dist.all_to_all(outs, ins)
    for q in range(WORLD):
        same(outs[q], torch.full((q + RANK + 1,), q * 10 + RANK, dtype=torch.int32), "all_to_all from %d" % q)
    # Objects: pickled, sizes gathered first.
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "pad": "x" * (RANK * 100)})
    check([o["rank"] for o in objs] == list(range(WORLD)), "all_gather_object %s" % objs)
    lst = [{"from": 0}, [1, 2, 3]] if RANK == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    check(lst == [{"from": 0}, [1, 2, 3]], "broadcast_object_list %s" % lst)
    # Point-to-point: a ring, blocking and not, and batch_isend_irecv.
    if WORLD > 1:
        right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
        got = torch.empty(1000, dtype=torch.float64, device=DEV)
        if RANK % 2 == 0:
            dist.send(torch.full((1000,), float(RANK), dtype=torch.float64, device=DEV), right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(torch.full((1000,), float(RANK), dtype=torch.float64, device=DEV), right)
        same(got, torch.full((1000,), float(left), dtype=torch.float64), "send/recv")
        got = torch.empty(5, dtype=torch.int64, device=DEV)
        ops = [dist.P2POp(dist.irecv, got, left), dist.P2POp(dist.isend, torch.full((5,), RANK, device=DEV), right)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        same(got, torch.full((5,), left), "batch_isend_irecv")
        strided = noncontiguous(torch.zeros(6, device=DEV))
        reqs = [dist.irecv(strided, left), dist.isend(noncontiguous(torch.arange(6., device=DEV) + RANK), right)]
        for w in reqs:
            w.wait()
        same(strided, torch.arange(6.) + left, "strided irecv")
    if WORLD > 1:
        tagged_point_to_point()
        monitored_barrier()
    premul_sum_collectives()
    sparse_all_reduce()
    sequence_numbers()
    if TORCH2:
        coalesced()
    dist.barrier()


def tagged_point_to_point():
    """Tags and receives from any source, as gloo has them: every other rank sends rank 0 two messages with
    tag 3 and one with tag 9; rank 0 takes the tag-9 ones first, from any source, then tag 3 per rank in order."""
    if RANK == 0:
        senders = set()
        for _ in range(WORLD - 1):
            got = torch.zeros(4, device=DEV)
            src = dist.recv(got, tag=9)  # any source: returns the sender
            same(got, torch.full((4,), 900. + src), "recv from any source with tag 9")
            senders.add(src)
        check(senders == set(range(1, WORLD)), "any-source senders %s" % senders)
        for q in range(1, WORLD):
            first, second = torch.zeros(2, device=DEV), torch.zeros(2, device=DEV)
            works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, first, q, tag=3),
                                            dist.P2POp(dist.irecv, second, q, tag=3)])
            for w in works:
                w.wait()
            same(first, torch.full((2,), 300. + q), "first tag-3 message from %d" % q)
            same(second, torch.full((2,), 310. + q), "second tag-3 message from %d" % q)
        # A receive from any source through the Work: its source rank.
        w = dist.irecv(torch.zeros(1, device=DEV), tag=11)
        w.wait()
        check(w._source_rank() in range(1, WORLD), "irecv source rank %s" % w._source_rank())
    else:
        reqs = [dist.isend(torch.full((2,), 300. + RANK, device=DEV), 0, tag=3),
                dist.isend(torch.full((2,), 310. + RANK, device=DEV), 0, tag=3),
                dist.isend(torch.full((4,), 900. + RANK, device=DEV), 0, tag=9)]
        if RANK == 1:
            reqs.append(dist.isend(torch.ones(1, device=DEV), 0, tag=11))
        for w in reqs:
            w.wait()


def monitored_barrier():
    """gloo's monitored barrier: passes when every rank comes; rank 0 names the rank that does not."""
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(datetime.timedelta(seconds=30))
    pg.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)
    if RANK == 0:  # the others skip it (one that came would wait for rank 0's answer until the group's timeout)
        t0 = time.monotonic()
        try:
            pg.monitored_barrier(datetime.timedelta(seconds=1))
            raise AssertionError("a monitored barrier that the other ranks skipped passed")
        except RuntimeError as e:
            check("Rank 1 failed to pass monitoredBarrier in 1000 ms" in str(e), str(e))
        check(0.9 < time.monotonic() - t0 < 10, "the monitored barrier failed after %.1f s" % (time.monotonic() - t0))
    # The group still works after a failed monitored barrier (its messages do not match later ones).
    t = torch.ones(3, device=DEV)
    dist.all_reduce(t)
    same(t, torch.full((3,), float(WORLD)), "all_reduce after a monitored barrier")


def premul_sum(factor):
    if isinstance(factor, torch.Tensor) and not TORCH2:
        factor = [factor]  # torch 1.13 takes a list of tensors (one per device)
    return dist._make_nccl_premul_sum(factor)


def premul_sum_collectives():
    """ReduceOp.PREMUL_SUM, with a number and with a one-element tensor: each rank's input times the factor, summed."""
    for factor in (0.25, torch.tensor([3.0], device=DEV)):
        f = float(factor)
        mine = on_dev(value(torch.float32, "SUM", RANK))
        want = sum(value(torch.float32, "SUM", q) * f for q in range(WORLD))
        t = mine.clone()
        dist.all_reduce(t, op=premul_sum(factor))
        same(t, want, "all_reduce PREMUL_SUM %s" % f)
        t = mine.clone()
        dist.reduce(t, dst=0, op=premul_sum(factor))
        if RANK == 0:
            same(t, want, "reduce PREMUL_SUM %s" % f)
        else:
            same(t, mine, "reduce PREMUL_SUM leaves a non-root's input alone")
        ts = [mine.clone(), (mine * 2).clone()]
        dist.all_reduce_coalesced(ts, op=premul_sum(factor))
        same(ts[1], want * 2, "all_reduce_coalesced PREMUL_SUM %s" % f)
        full = on_dev(value(torch.float32, "SUM", RANK, 4 * WORLD))
        out = torch.zeros(4, device=DEV)
        dist.reduce_scatter_tensor(out, full, op=premul_sum(factor))
        want_rs = sum(value(torch.float32, "SUM", q, 4 * WORLD) * f for q in range(WORLD))[4 * RANK:4 * RANK + 4]
        same(out, want_rs, "reduce_scatter_tensor PREMUL_SUM %s" % f)
        same(full, on_dev(value(torch.float32, "SUM", RANK, 4 * WORLD)), "PREMUL_SUM leaves the input alone")
        out = torch.zeros(4, device=DEV)
        dist.reduce_scatter(out, list(full.chunk(WORLD)), op=premul_sum(factor))
        same(out, want_rs, "reduce_scatter PREMUL_SUM %s" % f)


def sparse_all_reduce():
    """Sparse COO tensors of different numbers of entries on each rank: summed and coalesced, as gloo does."""
    idx = torch.tensor([[RANK, RANK + 1, 0], [0, 1, RANK]])
    val = torch.tensor([[1., 2.], [3., 4.], [5., 6.]]) * (RANK + 1)
    t = torch.sparse_coo_tensor(idx[:, :1 + RANK % 3], val[:1 + RANK % 3], (WORLD + 1, WORLD, 2))
    want = functools.reduce(torch.add, [
        torch.sparse_coo_tensor(torch.tensor([[q, q + 1, 0], [0, 1, q]])[:, :1 + q % 3],
                                (torch.tensor([[1., 2.], [3., 4.], [5., 6.]]) * (q + 1))[:1 + q % 3],
                                (WORLD + 1, WORLD, 2)) for q in range(WORLD)]).coalesce()
    dist.all_reduce(t)
    check(t.is_sparse and t.is_coalesced(), "sparse all_reduce result is not a coalesced sparse tensor")
    same(t.to_dense(), want.to_dense(), "sparse all_reduce")


def sequence_numbers():
    """The group's sequence number counts its collectives (torch's desync checks read it)."""
    if not TORCH2:
        return
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device(DEV))
    before = backend._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(1, device=DEV))
    dist.barrier()
    check(backend._get_sequence_number_for_group() == before + 2, "sequence number did not count two collectives")
    # torch >= 2.1: the group torch holds is named ddl (torch names a plugin's group "custom") and answers
    # sequence numbers itself (torch refuses them for a plugin's group).
    pg = dist.distributed_c10d._get_default_group()
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 1):
        check(pg.name() == "ddl", "the group is named %r" % pg.name())
        check(pg._get_sequence_number_for_group() == before + 2, "the group's sequence number")



def coalesced():
    """torch 2.x: the coalesced forms FSDP and _coalescing_manager call, and Futures that complete."""
    from torch.distributed.distributed_c10d import _coalescing_manager
    n = 5
    ins = [on_dev(value(torch.float32, "SUM", RANK, n + k)) for k in range(3)]
    outs = [torch.zeros((n + k) * WORLD, device=DEV) for k in range(3)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    for k, o in enumerate(outs):
        same(o, torch.cat([value(torch.float32, "SUM", q, n + k) for q in range(WORLD)]),
             "coalesced all_gather_into_tensor %d" % k)
    ins = [on_dev(value(torch.float32, "SUM", RANK, (n + k) * WORLD)) for k in range(3)]
    outs = [torch.zeros(n + k, device=DEV) for k in range(3)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    for k, o in enumerate(outs):
        want = expected(torch.float32, "SUM", (n + k) * WORLD)[RANK * (n + k):(RANK + 1) * (n + k)]
        same(o, want, "coalesced reduce_scatter_tensor %d" % k)
    ts = [on_dev(value(torch.float32, "SUM", RANK, n + k)) for k in range(3)]
    with _coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for k, t in enumerate(ts):
        same(t, expected(torch.float32, "SUM", n + k), "coalesced all_reduce %d" % k)
    # The Futures of the base forms complete with their outputs.
    out = torch.zeros(3 * WORLD, device=DEV)
    fut = dist.all_gather_into_tensor(out, torch.full((3,), float(RANK), device=DEV), async_op=True).get_future()
    got = fut.wait()[0]
    same(got, torch.arange(WORLD, dtype=torch.float32).repeat_interleave(3), "all_gather_into_tensor future")
    pg = dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device(DEV))
    check(type(backend).__name__ == "ProcessGroupDDL", "the %s backend is %s" % (DEV, type(backend).__name__))
    if DEV == "cpu":
        check(backend.stream_scheme == "unset", "CPU collectives chose a stream scheme: %r" % backend.stream_scheme)


def scenario_async():
    init()
    n = 24
    bufs = [torch.full((10000 + k,), float(k + RANK)) for k in range(n)]
    order = []
    works = []
    for k, b in enumerate(bufs):
        w = dist.all_reduce(b, async_op=True)
        w.get_future().then(lambda fut, k=k: order.append(k))
        works.append(w)
    for w in reversed(works):  # waiting out of order changes nothing
        w.wait()
    for k, b in enumerate(bufs):
        same(b, torch.full((10000 + k,), float(k * WORLD + WORLD * (WORLD - 1) // 2)), "async all_reduce %d" % k)
    deadline = time.monotonic() + 10
    while len(order) < n and time.monotonic() < deadline:  # then-callbacks may still be running
        time.sleep(0.001)
    check(order == list(range(n)), "futures completed out of call order: %s" % order)
    check(all(w.is_completed() and w.is_success() for w in works), "works not completed")
    # Once wait() returns, the Future holds the value.
    t = torch.ones(3)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    same(w.get_future().value()[0], torch.full((3,), float(WORLD)), "future value right after wait()")
    # A future's value is the output tensors; chained callbacks see them.
    t = torch.ones(4)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    same(fut.wait(), torch.full((4,), 2.0 * WORLD), "then() value")
    # Collectives of different kinds stay in order with blocking calls in between.
    a = torch.ones(100)
    w1 = dist.all_reduce(a, async_op=True)
    b = torch.full((3,), float(RANK))
    dist.broadcast(b, src=0)
    w2 = dist.barrier(async_op=True)
    w1.wait()
    w2.wait()
    same(a, torch.full((100,), float(WORLD)), "async before blocking")
    same(b, torch.zeros(3), "blocking broadcast between async calls")
    dist.destroy_process_group()
    print("OK async")


# ---- DDP ----

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def train(pg, steps=8, hook=None, device="cpu"):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = make_model().to(device)
    ids = [torch.cuda.current_device()] if device == "cuda" else None
    ddp = DDP(model, device_ids=ids, process_group=pg, bucket_cap_mb=0.002)  # several buckets: overlap, order
    if hook is not None:
        ddp.register_comm_hook(pg, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + RANK)
    for step in range(steps):
        x = torch.randn(16, 1, 8, 8, generator=gen).to(device)
        y = torch.randint(0, 10, (16,), generator=gen).to(device)
        if step % 3 == 2:
            with ddp.no_sync():  # accumulate locally, synchronise with the next step
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            continue
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def scenario_ddp():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    init()
    ddl_pg = dist.group.WORLD
    gloo_pg = dist.new_group(backend="gloo")
    w_ddl = train(ddl_pg)
    w_gloo = train(gloo_pg)
    if WORLD <= 2:
        # Two summands: every reduction order gives the same bits.
        check(torch.equal(w_ddl, w_gloo), "weights differ from gloo's: max |diff| %g" % (w_ddl - w_gloo).abs().max())
    else:
        check(torch.allclose(w_ddl, w_gloo, rtol=1e-5, atol=1e-6),
              "weights differ from gloo's: max |diff| %g" % (w_ddl - w_gloo).abs().max())
    # Every rank ends with the same weights.
    ref = w_ddl.clone()
    dist.broadcast(ref, src=0)
    check(torch.equal(ref, w_ddl), "ranks disagree on the weights")
    # A comm hook built on async all_reduce + futures.
    w_hook = train(ddl_pg, hook=default_hooks.allreduce_hook)
    check(torch.allclose(w_hook, w_ddl, rtol=1e-5, atol=1e-6), "allreduce_hook changed the result")
    w_fp16 = train(ddl_pg, hook=default_hooks.fp16_compress_hook)
    check(torch.allclose(w_fp16, w_ddl, rtol=1e-2, atol=1e-2), "fp16_compress_hook is far off")
    dist.destroy_process_group()
    print("OK ddp")


# ---- init methods, groups ----

def scenario_init(method):
    port = os.environ["MASTER_PORT"]
    shared = os.environ.get("DDL_TEST_SHARED_FILE", os.path.join(tempfile.gettempdir(), "torch-ddl-init-%s" % port))
    if method == "env":
        init()
    elif method == "tcp":
        init(init_method="tcp://127.0.0.1:%s" % port, rank=RANK, world_size=WORLD)
    elif method == "file":
        init(init_method="file://" + shared, rank=RANK, world_size=WORLD)
    elif method == "store":
        store = dist.TCPStore("127.0.0.1", int(port), WORLD, RANK == 0, timeout=datetime.timedelta(seconds=60))
        init(store=store, rank=RANK, world_size=WORLD)
    else:
        raise SystemExit("unknown init method " + method)
    t = torch.ones(3) * (RANK + 1)
    dist.all_reduce(t)
    same(t, torch.full((3,), float(WORLD * (WORLD + 1) // 2)), "all_reduce after %s init" % method)
    dist.destroy_process_group()
    # A second group after the first is gone (new store, new communicator).
    init(init_method="tcp://127.0.0.1:%s" % os.environ["DDL_TEST_SECOND_PORT"], rank=RANK, world_size=WORLD)
    t = torch.ones(2)
    dist.all_reduce(t)
    same(t, torch.full((2,), float(WORLD)), "all_reduce in a second process group")
    dist.destroy_process_group()
    print("OK init " + method)


def scenario_groups():
    init()
    evens = list(range(0, WORLD, 2))
    g = dist.new_group(evens)  # every rank calls new_group; the odd ones are not members
    if RANK in evens:
        t = torch.tensor([float(RANK)])
        dist.all_reduce(t, group=g)
        same(t, torch.tensor([float(sum(evens))]), "all_reduce in the even group")
        check(dist.get_world_size(g) == len(evens), "group size")
        objs = [None] * len(evens)
        dist.all_gather_object(objs, RANK, group=g)
        check(objs == evens, "all_gather_object in a group: %s" % objs)
    else:
        check(g == dist.GroupMember.NON_GROUP_MEMBER, "an odd rank got a group handle")
    solo = dist.new_group([RANK % WORLD]) if WORLD == 1 else None
    # The world still works, and a group can be destroyed alone.
    t = torch.ones(1)
    dist.all_reduce(t)
    same(t, torch.tensor([float(WORLD)]), "world all_reduce after new_group")
    if RANK in evens:
        dist.destroy_process_group(g)
    if TORCH2:
        # A group shut down from a Future callback, which runs on the group's own thread (or on this one, where
        # the Work completed before then()): it ends there and breaks nothing else. A second collective queued
        # behind it is not issued here: whether it had started decides how it fails, and in that race one rank
        # was once seen passing the world's barrier below while the others waited for it (a fault left open).
        g2 = dist.new_group(list(range(WORLD)))
        t = torch.ones(10)
        w = dist.all_reduce(t, group=g2, async_op=True)
        fut = w.get_future().then(lambda f: dist.destroy_process_group(g2))
        fut.wait()
        same(t, torch.full((10,), float(WORLD)), "all_reduce before a shutdown in its callback")
    dist.barrier()
    dist.destroy_process_group()
    del solo
    print("OK groups")


# ---- failures ----

def scenario_kill(device="cpu"):
    cuda = device == "cuda"
    if cuda:
        skip_without_cuda()
        torch.cuda.set_device(RANK % torch.cuda.device_count())
    timeout_s = 10
    init(timeout_s=timeout_s)
    victim = WORLD - 1
    t = torch.ones(1 << 16, device=device)
    for it in range(20):
        dist.all_reduce(t)
    if cuda:
        torch.cuda.synchronize()
    if RANK == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    # CUDA tensors: the call returns before the GPU ran it; a failure the GPU meets breaks the group, and the
    # next call raises it. Each wait on the GPU is bounded by the timeout.
    limit = 2 * timeout_s + 5 if cuda else timeout_s
    try:
        for it in range(100000):
            dist.all_reduce(t)
            if cuda:
                torch.cuda.synchronize()
            check(time.monotonic() - t0 < limit + 30, "no error %.0f s after rank %d died" % (limit + 30, victim))
        raise AssertionError("all_reduce never failed after rank %d died" % victim)
    except RuntimeError as e:
        elapsed = time.monotonic() - t0
        print("RAISED after %.2f s: %s" % (elapsed, e))
        check(elapsed < limit, "took %.1f s, the timeout is %d s" % (elapsed, timeout_s))
        check("rank " in str(e), "the message names no rank: %s" % e)
    print("OK kill")
    os._exit(0)  # the group is broken; skip its teardown


def scenario_elastic(kill_at="30", steps="60", grow=""):
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch_ddl import elastic
    import subprocess
    kill_at, steps, grow = int(kill_at), int(steps), grow == "grow"
    joining = os.environ.get("DDL_JOIN") == "1"
    if grow:
        elastic.init_process_group(timeout=datetime.timedelta(seconds=10))
        if not joining:
            dist.barrier()  # as init() does: every rank is past the store's first use
    else:
        init(timeout_s=10)
    victim = WORLD - 1
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, logged, lost_seen = 0, [], None
    if joining:
        step = elastic.sync(0, model, opt)
        print("JOINED as rank %d of %d at step %d" % (dist.get_rank(), dist.get_world_size(), step), flush=True)
    ddp = DDP(model, bucket_cap_mb=0.002)
    while step < steps:
        if RANK == victim and step == kill_at and not joining:
            if grow:  # its replacement, which waits until the survivors grow
                subprocess.Popen([sys.executable, os.path.abspath(__file__), "elastic", str(kill_at), str(steps),
                                  "grow"], env=dict(os.environ, DDL_JOIN="1"))
            print("KILL at %.6f" % time.time(), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if grow and lost_seen is not None and step % 10 == 0 and dist.get_world_size() < WORLD:
            # From 20 steps after the loss on, wait here (up to 30 s) for the replacement to start: every survivor
            # asks the same number of times, since grow() is a collective with one answer for all.
            for _ in range(300 if step >= kill_at + 20 else 1):
                if elastic.grow():
                    step = elastic.sync(step, model, opt)
                    ddp = DDP(model, bucket_cap_mb=0.002)
                    print("GREW to %d at step %d" % (dist.get_world_size(), step), flush=True)
                    break
                time.sleep(0.1)
        try:
            with elastic.guard():
                gen = torch.Generator().manual_seed(1000 * step + dist.get_rank())  # this step's and rank's data
                x = torch.randn(16, 1, 8, 8, generator=gen)
                y = torch.randint(0, 10, (16,), generator=gen)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
            logged.append(step)
            print("step %d world %d at %.6f" % (step, dist.get_world_size(), time.time()), flush=True)
            step += 1
        except torch_ddl.RankLost as lost:
            print("LOST at %.6f: %s" % (time.time(), lost), flush=True)
            check(lost_seen is None, "a second loss: %s" % lost)
            check(lost.ranks == [victim], "lost %s, not [%d]" % (lost.ranks, victim))
            check(lost.world_size == WORLD - 1 and dist.get_world_size() == WORLD - 1, "world %d" % lost.world_size)
            check(lost.rank == RANK and dist.get_rank() == RANK, "rank %d became %d" % (RANK, lost.rank))
            step = elastic.sync(step, model, opt)
            print("SYNC to step %d" % step, flush=True)
            ddp = DDP(model, bucket_cap_mb=0.002)
            lost_seen = lost
    check(lost_seen is not None or joining, "no rank was lost")
    # Every step once: none repeated, at most the one a survivor took from another by sync() missing here.
    check(logged == sorted(set(logged)), "steps repeated or out of order: %s" % logged)
    check(joining or steps - len(logged) <= 1, "steps missing: %s" % logged)
    check(logged[-1] == steps - 1, "did not reach the last step: %s" % logged)
    check(dist.get_world_size() == (WORLD if grow else WORLD - 1), "world %d at the end" % dist.get_world_size())
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = w.clone()
    dist.broadcast(ref, 0)
    check(torch.equal(ref, w), "the survivors' weights differ")
    dist.destroy_process_group()
    print("OK elastic")


def scenario_stall():
    timeout_s = 2
    init(timeout_s=timeout_s)
    t = torch.ones(100)
    dist.all_reduce(t)
    if RANK == 1:
        time.sleep(timeout_s * 2 + 1)  # never joins; exits once the others have given up
        os._exit(0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        raise AssertionError("all_reduce did not time out")
    except RuntimeError as e:
        elapsed = time.monotonic() - t0
        print("RAISED after %.2f s: %s" % (elapsed, e))
        check(elapsed < 2 * timeout_s + 2, "took %.1f s with a %d s timeout" % (elapsed, timeout_s))
        check("timed out" in str(e) or "rank" in str(e), "unexpected message: %s" % e)
    print("OK stall")
    os._exit(0)


def scenario_mismatch():
    init(timeout_s=60)
    t = torch.ones(1000 if RANK != 1 else 1200)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        dist.barrier()  # a rank whose own call happened to finish learns here
        raise AssertionError("no error for mismatched all_reduce sizes")
    except RuntimeError as e:
        print("RAISED after %.2f s: %s" % (time.monotonic() - t0, e))
        check(time.monotonic() - t0 < 30, "a mismatch must not wait for the timeout")
        check("mismatch" in str(e) or "failed" in str(e), "unexpected message: %s" % e)
    print("OK mismatch")
    os._exit(0)


def scenario_bad_setting():
    """A typo in TORCH_DDL_REGISTER (here "yes") is refused where the group is made, naming the variable."""
    if not torch_ddl.ProcessGroupDDL.stream_ordered:
        print("OK bad_setting (this build has no stream-ordered path and does not read TORCH_DDL_REGISTER)")
        return
    try:
        dist.init_process_group("ddl", timeout=datetime.timedelta(seconds=60))
    except ValueError as e:
        check("TORCH_DDL_REGISTER=yes" in str(e), "message %r lacks the variable" % str(e))
        print("OK bad_setting")
        return
    raise AssertionError("TORCH_DDL_REGISTER=yes was taken")


def scenario_errors():
    init()
    for call, needle in [
        (lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), "bitwise"),
        (lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG), "AVG"),
        (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), "cannot reduce tensors of dtype Short"),
        (lambda: dist.send(torch.ones(2), (RANK + 1) % max(WORLD, 2), tag=2 ** 31 - 1), "torch_ddl's own"),
        (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=premul_sum(0.5)), "PREMUL_SUM takes"),
        (lambda: dist.all_to_all_single(torch.ones(WORLD * 2 + 1), torch.ones(WORLD * 2 + 1)), "split"),
    ]:
        try:
            call()
        except (ValueError, RuntimeError) as e:
            check(needle in str(e), "message %r lacks %r" % (str(e), needle))
        else:
            if not (needle == "split" and WORLD == 1):
                raise AssertionError("no error (expected one about %s)" % needle)
    t = torch.ones(4)
    dist.all_reduce(t)  # nothing broke
    same(t, torch.full((4,), float(WORLD)), "all_reduce after refused calls")
    # A receive whose send never comes does not hold the group's teardown for its 60 s timeout.
    pending = dist.irecv(torch.ones(2), (RANK + 1) % WORLD) if WORLD > 1 else None
    t0 = time.monotonic()
    dist.destroy_process_group()
    import gc
    gc.collect()
    check(time.monotonic() - t0 < 20, "destroy_process_group took %.1f s" % (time.monotonic() - t0))
    if pending is not None:
        try:
            pending.wait()
            raise AssertionError("the unmatched irecv succeeded")
        except RuntimeError as e:
            check("destroyed" in str(e), "unexpected error for a receive cut short by destroy: %s" % e)
    print("OK errors")


# ---- preemption: torch_ddl.StopSignal ----

def scenario_stop(every="1"):
    every = int(every)
    init()
    victim, signal_at, limit = WORLD - 1, 20, 3000  # the loop's 3000 steps would take 10 s or more
    pids = [None] * WORLD
    dist.all_gather_object(pids, os.getpid())
    deadline_file = os.environ["DDL_PREEMPT_DEADLINE_FILE"]  # one for all ranks here; ddl gives each its own
    before = signal.getsignal(signal.SIGTERM)
    # Refused: from another thread (Python installs handlers only on the main one), and every < 1.
    refused = []

    def make():
        try:
            torch_ddl.StopSignal()
        except RuntimeError as e:
            refused.append(str(e))
    th = threading.Thread(target=make)
    th.start()
    th.join()
    check(refused and "main thread" in refused[0], "a StopSignal made on another thread: %s" % refused)
    try:
        torch_ddl.StopSignal(every=0)
        raise AssertionError("StopSignal(every=0) was taken")
    except ValueError:
        pass
    check(signal.getsignal(signal.SIGTERM) is before, "a refused StopSignal left a handler behind")

    t = torch.ones(1000)
    with torch_ddl.StopSignal(every=every) as stop:
        check(signal.getsignal(signal.SIGTERM) is not before, "no SIGTERM handler installed")
        check(stop.deadline() is None and not stop.requested, "a deadline or a stop before any signal")
        stopped = None
        for step in range(1, limit + 1):
            dist.all_reduce(t)  # the step's work: a collective, as a training step's gradients
            t.fill_(1)
            time.sleep(0.002)
            if step == signal_at and RANK == 0:
                with open(deadline_file + ".tmp", "w") as f:
                    f.write("1796600000.25\n")
                os.replace(deadline_file + ".tmp", deadline_file)  # written before the signal, as the agent does
                os.kill(pids[victim], signal.SIGTERM)
            if stop.agreed():
                stopped = step
                break
        check(stopped is not None, "no stop agreed in %d steps; SIGTERM went to rank %d at step %d" %
              (limit, victim, signal_at))
        print("stopped after step %d (rank %d got SIGTERM at rank 0's step %d)" % (stopped, victim, signal_at))
        steps = [None] * WORLD
        dist.all_gather_object(steps, stopped)
        check(len(set(steps)) == 1, "the ranks stopped after different steps: %s" % steps)
        check(stopped >= signal_at and stopped < signal_at + 200, "stopped after step %d" % stopped)
        check(stopped % every == 0, "stopped after step %d, not a multiple of every=%d" % (stopped, every))
        check(stop.requested == (RANK == victim), "requested is %s on rank %d" % (stop.requested, RANK))
        check(stop.signum == (signal.SIGTERM if RANK == victim else None), "signum %s" % stop.signum)
        # Once agreed, agreed() answers without communicating: rank 0 alone calls it, then every rank a barrier.
        if RANK == 0:
            check(stop.agreed(), "agreed() went back to False")
        dist.barrier()
        check(stop.deadline() == 1796600000.25, "deadline() is %s" % stop.deadline())
        # The "checkpoint": a second SIGTERM now is recorded, not fatal.
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        check(stop.requested, "a second SIGTERM was not recorded")
    check(signal.getsignal(signal.SIGTERM) is before, "close() left SIGTERM's handler %r" %
          signal.getsignal(signal.SIGTERM))
    dist.barrier()
    dist.destroy_process_group()
    print("OK stop")


def scenario_fsdp():
    """FSDP2 (fully_shard, torch 2.x) over ddl on CPU, parameters in bfloat16 and gradients reduced in float32
    (MixedPrecisionPolicy), with a gradient divide factor that is not the world size: FSDP reduce-scatters with
    ReduceOp.PREMUL_SUM(1 / factor). After a few SGD steps the weights equal those of a single-process reference
    that does the same arithmetic: each rank's batch through a bfloat16 copy of the model, the gradients in
    float32 times 1 / factor, summed."""
    import copy

    try:
        if not TORCH2:
            raise ImportError  # (importing torch 1.13's FSDP fails under Python 3.11)
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        print("SKIP this torch (%s) has no FSDP2 (torch.distributed.fsdp.fully_shard)" % torch.__version__)
        sys.exit(77)
    from torch.distributed.device_mesh import init_device_mesh

    init()
    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    ref = copy.deepcopy(model)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    factor = 3.0 * WORLD
    for layer in (model[0], model[2]):  # each FSDP unit reduces its own gradients
        layer.set_gradient_divide_factor(factor)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    for step in range(4):
        batches = [torch.randn(4, 16, generator=data) for _ in range(WORLD)]  # every rank draws all of them
        model(batches[RANK]).square().mean().backward()
        opt.step()
        opt.zero_grad()
        grads = None
        for q in range(WORLD):
            low = copy.deepcopy(ref).to(torch.bfloat16)
            low(batches[q].to(torch.bfloat16)).square().mean().backward()
            g = [p.grad.float() * (1 / factor) for p in low.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(ref.parameters(), grads):
            p.grad = g
        ref_opt.step()
        ref_opt.zero_grad()
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        full = p.full_tensor().detach()
        check(full.dtype == torch.float32, "%s is %s" % (name, full.dtype))
        check(torch.allclose(full, r.detach(), rtol=1e-5, atol=1e-6),
              "%s differs from the reference by %g" % (name, (full - r.detach()).abs().max()))
    # The steps did something: the weights left their start.
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    check(not torch.allclose(ref[0].weight, start[0].weight), "the reference did not train")
    dist.barrier()
    print("OK fsdp")


def skip_without_cuda():
    if not torch.cuda.is_available():
        print("SKIP this PyTorch has no CUDA device (torch.cuda.is_available() is False)")
        sys.exit(77)


def scenario_cuda():
    skip_without_cuda()
    global DEV
    DEV = "cuda"
    torch.cuda.set_device(RANK % torch.cuda.device_count())
    torch.backends.cudnn.deterministic = True
    init()
    collectives()  # every collective on CUDA tensors
    if torch_ddl.ProcessGroupDDL.stream_ordered:
        no_host_synchronisation()
        graph_capture()
    # DDP on CUDA tensors ends with gloo's weights (gloo takes CUDA tensors through host memory).
    gloo_pg = dist.new_group(backend="gloo")
    w_ddl = train(dist.group.WORLD, device="cuda")
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
    if torch_ddl.ProcessGroupDDL.stream_ordered and cuda_scheme() == "kernel":
        # DDP's buckets, hot after two steps, were registered at a round: these weights came zero-copy.
        print("registered buffers after DDP: %d" % backend.registered_buffers)
        check(backend.registered_buffers > 0, "DDP's buckets were never registered for zero-copy")
        # The DDP model is gone: its buckets are let go at a later round (at most 1,024 calls on), and the
        # one tensor all-reduced again and again is registered instead.
        gc.collect()  # DDP's module may sit in a reference cycle
        t = torch.full((4,), float(RANK), device="cuda")
        for _ in range(2048):
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        torch.cuda.synchronize()
        check(backend.registered_buffers == 1,
              "%d storages registered after DDP was deleted (want 1)" % backend.registered_buffers)
        same(t, torch.full((4,), float(WORLD - 1), device="cuda"), "2048 all_reduce MAX")
    w_gloo = train(gloo_pg, device="cuda")
    check(torch.allclose(w_ddl.cpu(), w_gloo.cpu(), rtol=1e-5, atol=1e-6),
          "CUDA weights differ from gloo's: max |diff| %g" % (w_ddl - w_gloo).abs().max())
    dist.destroy_process_group()
    print("OK cuda")


def cuda_scheme():
    """How libddl runs the default group's CUDA collectives: "kernel", "kernel+wire", "host" or "unset"."""
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda")).stream_scheme


def no_host_synchronisation():
    """A collective on CUDA tensors returns, and wait() too, before the GPU work it waits for has finished
    (the kernel scheme; host-paced, the call waits for the stream and returns with the result in place)."""
    scheme = cuda_scheme()
    check(scheme in ("kernel", "kernel+wire", "host"), "stream_scheme after CUDA collectives is %r" % scheme)
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # about a second of GPU time on the current stream, before x is ready
    t0 = time.monotonic()
    w = dist.all_reduce(x, async_op=True)
    w.wait()  # the current stream waits for the collective; the host does not
    returned = time.monotonic() - t0
    pending = not w.is_completed()
    torch.cuda.synchronize()
    total = time.monotonic() - t0
    print("%s scheme: all_reduce + wait() returned after %.4f s; the GPU finished after %.3f s"
          % (scheme, returned, total))
    if scheme == "kernel":
        check(pending, "the collective was complete before the GPU work it waits for had run")
        check(returned < total / 2, "the call waited for the GPU: %.3f s of %.3f s" % (returned, total))
    else:  # host-paced or across nodes: the group's worker waits for the stream, and wait() for the worker
        check(returned > total / 2, "host-paced, wait() returned before the stream's work: %.3f s of %.3f s"
              % (returned, total))
    same(x, torch.full((1 << 20,), float(WORLD)), "all_reduce after a busy stream")


def graph_capture():
    """An all_reduce captured in a CUDA graph (after a first call outside it) and replayed."""
    y = torch.ones(4096, device="cuda")
    dist.all_reduce(y)
    torch.cuda.synchronize()
    scheme = cuda_scheme()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            dist.all_reduce(y)
    except (ValueError, RuntimeError) as e:
        # The host-paced scheme (ranks sharing a GPU without MPS) cannot be captured: said so, nothing broken.
        # The kernel scheme must capture (a CUDA error that merely mentions capturing is a failure).
        check(scheme == "host" and "host-paced" in str(e),
              "unexpected error from a captured all_reduce (%s scheme): %s" % (scheme, e))
        print("NOTE capture refused by this scheme: %s" % e)
        t = torch.ones(3, device="cuda")
        dist.all_reduce(t)
        same(t, torch.full((3,), float(WORLD)), "all_reduce after a refused capture")
        return
    check(scheme == "kernel", "the %s scheme let a collective be captured" % scheme)
    y.fill_(1)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    same(y, torch.full((4096,), float(WORLD ** 3)), "3 replays of a captured all_reduce")


SCENARIOS = {
    "collectives": scenario_collectives, "async": scenario_async, "ddp": scenario_ddp, "init": scenario_init,
    "groups": scenario_groups, "kill": scenario_kill, "stall": scenario_stall, "mismatch": scenario_mismatch,
    "errors": scenario_errors, "bad_setting": scenario_bad_setting, "cuda": scenario_cuda,
    "fsdp": scenario_fsdp, "stop": scenario_stop, "elastic": scenario_elastic,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
