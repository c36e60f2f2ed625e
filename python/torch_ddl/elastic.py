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
store the group was made with must outlive the lost rank (under torchrun's c10d rendezvous the agent serves
it; with MASTER_ADDR on rank 0, rank 0's loss cannot be survived). grow() admits processes waiting to join
(libddl's ddlCommGrow) the same way.
"""

import contextlib
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C

__all__ = ["RankLost", "guard", "shrink", "grow", "sync", "backend"]


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
_generation = 0  # groups installed so far: the prefix of each one's torch store keys (equal on every member)


def take_pending(rank, world_size):
    """The group waiting to be installed, if it is this rank's of world_size (else None): for the creator."""
    global _pending
    g, _pending = _pending, None
    if g is not None and (g.rank() != rank or g.size() != world_size):
        raise RuntimeError("ddl: the elastic group is rank %d of %d, init_process_group asked for %d of %d"
                           % (g.rank(), g.size(), rank, world_size))
    return g


def backend(group=None):
    """The ProcessGroupDDL behind group (default: the default group), or None when it is not ddl's."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, _C.ProcessGroupDDL):
        return pg
    get = getattr(pg, "_get_backend", None)
    if get is None:
        return None
    try:
        b = get(torch.device("cpu"))
    except RuntimeError:
        return None
    return b if isinstance(b, _C.ProcessGroupDDL) else None


def _install(group, timeout):
    """Makes group (a ProcessGroupDDL) the default process group."""
    global _pending, _generation
    store = dist.distributed_c10d._get_default_store()
    _generation += 1
    _pending = group
    dist.destroy_process_group()
    try:
        dist.init_process_group("ddl", store=dist.PrefixStore("torch_ddl/elastic/%d/" % _generation, store),
                                rank=group.rank(), world_size=group.size(), timeout=timeout)
    finally:
        _pending = None


def _timeout():
    t = getattr(dist.distributed_c10d, "default_pg_timeout", None)
    return t if isinstance(t, timedelta) else timedelta(minutes=30)


def shrink(cause=""):
    """Every survivor calls it once the default group lost a rank: agrees with the others on who is gone, makes
    the survivors' group the default one and returns the RankLost that says so."""
    old = backend()
    if old is None:
        raise RuntimeError("ddl: the default process group is not torch_ddl's")
    new = old.shrink()
    gone = new.excluded
    _install(new, _timeout())
    return RankLost(gone, new.rank(), new.size(), cause)


@contextlib.contextmanager
def guard():
    """Runs a training step; where it fails because a rank of the default group is gone, the survivors shrink
    the group (shrink()) and RankLost is raised instead. Every other failure passes through unchanged."""
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
    state from it) and re-wrap the model in DDP."""
    old = backend()
    if old is None:
        raise RuntimeError("ddl: the default process group is not torch_ddl's")
    new = old.grow(max_new)
    if new is None:
        return False
    _install(new, _timeout())
    return True


def sync(step, model, optimizer=None):
    """A collective of the default group: agrees on the last step any rank finished (step: this rank's count of
    finished steps) and sends that rank's model (parameters and buffers) and optimizer state to every other
    rank. Returns the agreed step count."""
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
    if optimizer is not None:
        box = [optimizer.state_dict() if rank == src else None]
        dist.broadcast_object_list(box, src)
        if rank != src:
            optimizer.load_state_dict(box[0])
    return top
