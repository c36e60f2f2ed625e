"""torch.distributed backend "ddl": collectives over libddl (ddl's UCX collective library).

    import torch_ddl                       # registers the backend
    torch.distributed.init_process_group("ddl")   # env://, tcp://, file:// or store=..., as with gloo

Every collective runs asynchronously on the group's own thread, in call order, so DistributedDataParallel
overlaps gradient communication with the backward pass. Errors (a dead peer, a timeout, ranks calling
different collectives) raise RuntimeError naming the peer rank and host, within the group's timeout.
TORCH_DDL_BLOCKING=1 runs each collective on the calling thread instead.
"""

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as dist

from . import _C
from ._C import ProcessGroupDDL, libddl_version

__all__ = ["ProcessGroupDDL", "libddl_version", "BACKEND"]

BACKEND = "ddl"


def _create_process_group(store, rank, world_size, timeout):
    return ProcessGroupDDL(store, rank, world_size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create_process_group)
