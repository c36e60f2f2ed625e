"""Elastic training over torch_ddl: a lost rank no longer ends the job; the others go on, in memory.

When a rank dies, the collective in flight on the others fails (within the group's timeout, at once when the
process is gone). elastic.guard() turns that failure into torch_ddl.RankLost: the survivors have agreed on who
is gone (libddl's ddlCommShrink, one decision for all) and the default process group is already a group of the
survivors, numbered in the old order. elastic.sync() then brings every survivor to the last step any of them
finished, from that rank's model and optimizer (DDP replicas are identical, so no checkpoint is read), and the
loop goes on after re-wrapping the model in DDP, which holds the old group:

    import torch_ddl
    from torch_ddl import elastic

    dist.init_process_group("ddl")
    ddp, step = DDP(model), 0
    while step < steps:
        try:
            with elastic.guard():                    # a lost rank's failure becomes RankLost
                train_step(ddp, step)                # forward, backward (DDP's allreduce), optimizer.step()
            step += 1
        except torch_ddl.RankLost as lost:
            print("lost ranks", lost.ranks, "now", lost.world_size)
            step = elastic.sync(step, model, optimizer)   # every survivor at the same step and state
            ddp = DDP(model)                         # over the survivors' group; re-shard the data too

The ranks that go on keep their order; dist.get_rank() and get_world_size() answer for the new group. The
store the group was made with must outlive the lost rank (with MASTER_ADDR on rank 0, rank 0's loss cannot be
survived), and the launcher must leave the survivors running: ddl's coordinator does for an elastic job
(ddlctl submit --gpus MIN:MAX, which also starts the replacements below); ddlrun, a job of fixed size and
torchrun stop or restart every rank when one fails.

Growing back: start the job with elastic.init_process_group() instead of dist.init_process_group("ddl"), so
that its groups meet through a store that a process coming later can find (torchrun's variables: MASTER_ADDR,
MASTER_PORT). A process started with DDL_JOIN=1 calls the same elastic.init_process_group(), which waits until
the running ranks call elastic.grow() (at a step boundary, every rank); both sides then call sync(), which
gives the joiner the model, optimizer and loop state, and wrap the model in DDP again.
"""

import contextlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C

__all__ = ["RankLost", "init_process_group", "guard", "shrink", "grow", "sync", "backend"]


class RankLost(RuntimeError):
    """The group lost ranks and the survivors went on: ranks are the old group's ranks that are gone; rank and
    world_size are this process's in the new default group."""

    def __init__(self, ranks, rank, world_size, cause=""):
        self.ranks, self.rank, self.world_size = list(ranks), rank, world_size
        super().__init__("ddl: lost rank%s %s; going on as rank %d of %d%s" % (
            "s" if len(self.ranks) != 1 else "", ", ".join(map(str, self.ranks)), rank, world_size,
            (" (" + cause + ")") if cause else ""))


# Groups made by shrink() and grow() are handed to torch through init_process_group: _create_process_group
# (torch_ddl/__init__.py) returns the one waiting here instead of making a new communicator.
_pending = None
_generation = 0  # groups installed so far: the prefix of each one's torch store keys (rank 0's, on every member)
_root = None  # init_process_group's store: the job's groups meet under it, and joiners find them there


def init_process_group(timeout=timedelta(minutes=30)):
    """dist.init_process_group("ddl") for an elastic job, from torchrun's variables (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT; rank 0 serves the store on MASTER_PORT unless the launcher's agent does, as
    torchrun's c10d rendezvous: TORCHELASTIC_USE_AGENT_STORE). With DDL_JOIN=1 the process joins the running
    job instead: it waits (up to timeout) until the running ranks call grow(), then has its rank of the grown
    group. Returns this process's rank. torchrun's restarts (TORCHELASTIC_RESTART_COUNT) meet apart."""
    global _root
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    # torchrun restarts every worker when one fails, on the same store: each attempt's keys apart, as torch's.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    joining = os.environ.get("DDL_JOIN") == "1"
    serve = (not joining and int(os.environ.get("RANK", "0")) == 0
             and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True")
    store = dist.TCPStore(host, port, None, serve, timeout, wait_for_workers=False)
    _root = dist.PrefixStore("torch_ddl/%s/" % attempt, store)
    libddl_store = dist.PrefixStore("ddl/", _root)  # the job's communicators, joiners' too, meet here
    if joining:
        group = _C.ProcessGroupDDL.join(libddl_store, timeout)
    else:
        group = _C.ProcessGroupDDL(libddl_store, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), timeout)
    _install(group, timeout)
    return group.rank()


def take_pending(rank, world_size):
    """The group waiting to be installed, if it is this rank's of world_size (else None): for the creator."""
    global _pending
    g, _pending = _pending, None
    if g is not None and (g.rank() != rank or g.size() != world_size):
        raise RuntimeError("ddl: the elastic group is rank %d of %d, init_process_group asked for %d of %d"
                           % (g.rank(), g.size(), rank, world_size))
    return g


def backend(group=None):
    """The ProcessGroupDDL behind group (default: the default group), or None when it is not ddl's. Under
    TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps it (wrapped_pg)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    candidates = [pg]
    get = getattr(pg, "_get_backend", None)
    if get is not None:
        try:
            candidates.append(get(torch.device("cpu")))
        except RuntimeError:
            pass
    for b in candidates:
        b = getattr(b, "wrapped_pg", b)
        if isinstance(b, _C.ProcessGroupDDL):
            return b
    return None


def _default_backend():
    """backend() of the default group; RuntimeError when that is not torch_ddl's."""
    b = backend()
    if b is None:
        raise RuntimeError("ddl: the default process group is not torch_ddl's")
    return b


def _install(group, timeout):
    """Makes group (a ProcessGroupDDL) the default process group (a collective of group), and closes the one it
    replaces now, on every rank at once (left to the garbage collector, a healthy old group's teardown meets the
    peers at different moments and makes them wait)."""
    global _pending, _generation
    old = backend() if dist.is_initialized() else None
    store = _root if _root is not None else dist.distributed_c10d._get_default_store()
    count = torch.tensor([_generation + 1], dtype=torch.int64)
    group.broadcast([count]).wait()  # rank 0's: a joiner learns it
    _generation = int(count.item())
    _pending = group
    if dist.is_initialized():
        dist.destroy_process_group()
    try:
        dist.init_process_group("ddl", store=dist.PrefixStore("torch_ddl/elastic/%d/" % _generation, store),
                                rank=group.rank(), world_size=group.size(), timeout=timeout)
    finally:
        _pending = None
    if old is not None:
        old.close()


def shrink(cause=""):
    """Every survivor calls it once the default group lost a rank: agrees with the others on who is gone, makes
    the survivors' group the default one and returns the RankLost that says so."""
    old = _default_backend()
    new = old.shrink()
    gone = new.excluded
    _install(new, old.timeout)
    return RankLost(gone, new.rank(), new.size(), cause)


@contextlib.contextmanager
def guard():
    """Runs a training step; where it fails because a rank of the default group is gone, the survivors shrink
    the group (shrink()) and RankLost is raised instead. Every other failure passes through unchanged. Count
    the step after the block, and put nothing collective after optimizer.step() inside it: a rank that stepped
    and then failed would count one step less than it took, and sync() would give it that step again."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, RankLost):
            raise
        b = backend()
        if b is None or not b.rank_lost:
            raise
        raise shrink(str(e).splitlines()[0][:300]) from e


def grow(max_new=0):
    """A collective of the default group, at a step boundary: admits up to max_new (0: all) processes waiting to
    join and makes the grown group the default one. True when it grew: then call sync() (the joiners take the
    state from it) and re-wrap the model in DDP. A rank lost meanwhile raises RankLost, as in guard()."""
    old = _default_backend()
    try:
        new = old.grow(max_new)
    except RuntimeError as e:  # a rank lost in the grow's own collective: as in a step
        if not old.rank_lost:
            raise
        raise shrink(str(e).splitlines()[0][:300]) from e
    if new is None:
        return False
    _install(new, old.timeout)
    return True


def sync(step, model, optimizer=None, state=None):
    """A collective of the default group: agrees on the last step any rank finished (step: this rank's count of
    finished steps) and sends that rank's model (parameters and buffers), optimizer state and state (a dict of
    the loop's own, such as the epoch and the samples used, updated in place) to every other rank. Returns the
    agreed step count."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([step], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    top = int(t.item())
    holder = torch.tensor([rank if step == top else world], dtype=torch.int64)
    dist.all_reduce(holder, op=dist.ReduceOp.MIN)
    src = int(holder.item())
    with torch.no_grad():
        for v in model.state_dict().values():
            if isinstance(v, torch.Tensor):
                dist.broadcast(v, src)
    if optimizer is not None or state is not None:
        box = [(optimizer.state_dict() if optimizer is not None else None, state) if rank == src else None]
        dist.broadcast_object_list(box, src)
        if rank != src:
            if optimizer is not None:
                optimizer.load_state_dict(box[0][0])
            if state is not None:
                state.clear()
                state.update(box[0][1])
    return top
