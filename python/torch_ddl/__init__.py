"""torch.distributed backend "ddl": collectives over libddl (ddl's UCX collective library).

    import torch_ddl                       # registers the backend
    torch.distributed.init_process_group("ddl")   # env://, tcp://, file:// or store=..., as with gloo

Works with torch 1.13 (a ProcessGroup) and torch 2.x (a Backend for CPU and CUDA tensors). Collectives on CPU
tensors run asynchronously on the group's own thread, in call order, so DistributedDataParallel overlaps
gradient communication with the backward pass. Collectives on CUDA tensors (torch 2.x) are stream-ordered, as
NCCL's: enqueued on a CUDA stream of the group's, they return at once, and Work.wait() makes the current stream
wait without blocking the host. Errors (a dead peer, a timeout, ranks calling different collectives) raise
RuntimeError naming the peer rank and host, within the group's timeout. TORCH_DDL_BLOCKING=1 runs each
collective on the calling thread and waits for its result instead.

torch_ddl.elastic (elastic.py): a lost rank raises torch_ddl.RankLost on the others, which go on as a smaller
group from the last step any of them finished, with no restart and no checkpoint read; grow() admits joiners.

torch_ddl.StopSignal (preemption.py, plain Python, for any process group) turns a preemption's or a time
limit's signal, which reaches the ranks at different moments, into one stop after the same step on every rank,
so that the checkpoint written then is consistent:

    with torch_ddl.StopSignal() as stop:          # SIGTERM and SIGUSR1 now only set a flag
        for step in ...:
            train_step()
            if stop.agreed():                      # collective: True on every rank once any rank got one
                save_checkpoint(); sys.exit(0)

A torch_ddl runs only in the torch it was built for: imported into another, it raises ImportError naming both
torches and the command that builds the right one (_abi.py).
"""

import inspect
import os
import sys

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as dist

from . import _abi

try:
    from . import _built_for
except ImportError:
    _built_for = None
# Before the extension loads: one built for another torch refuses here, naming both (it would crash later).
_abi.check(torch, _built_for, sys.executable, os.path.dirname(os.path.abspath(__file__)))

from . import _C  # noqa: E402
from ._C import ProcessGroupDDL, libddl_version
from .preemption import StopSignal
from . import elastic  # noqa: E402
from .elastic import RankLost  # noqa: E402

__all__ = ["ProcessGroupDDL", "libddl_version", "BACKEND", "StopSignal", "RankLost", "elastic"]

BACKEND = "ddl"


def _create_process_group(store, rank, world_size, timeout):
    # A group of survivors or a grown one (elastic.py) is made already: torch gets it instead of a new one.
    backend = elastic.take_pending(rank, world_size) or ProcessGroupDDL(store, rank, world_size, timeout)
    # torch >= 2.1: a ProcessGroup named "ddl" around the backend (torch names a plugin's group "custom", in
    # DDP's logging data too). Under TORCH_DISTRIBUTED_DEBUG=DETAIL the plain backend, which torch wraps in
    # its checking wrapper only when it builds the ProcessGroup itself.
    if _C.has_named_group and dist.get_debug_level() != dist.DebugLevel.DETAIL:
        return _C.NamedProcessGroup(store, rank, world_size, backend)
    return backend


def _register():
    if BACKEND.upper() in dist.Backend._plugins:
        return
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        # torch >= 2.0: one backend object serves the group's CPU and CUDA tensors.
        dist.Backend.register_backend(BACKEND, _create_process_group, devices=["cpu", "cuda"])
    else:  # torch 1.13
        dist.Backend.register_backend(BACKEND, _create_process_group)


_register()
