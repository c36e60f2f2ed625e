#!/usr/bin/python3
"""Data-parallel training of a small CNN on Fashion-MNIST with DistributedDataParallel over torch.distributed.

An ordinary DDP script: the backend is a flag (ddl, or gloo to compare), ranks come from the torchrun
variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) that ddlrun and ddl-agent set, and nothing else about
ddl appears below but `import torch_ddl` and its StopSignal.

    ddlctl submit --nodes 2 --gpus-per-node 2 --max-restarts 2 -- \\
        /usr/bin/python3 examples/fashion_mnist/train.py --checkpoint-dir /shared/fmnist
    ddlrun -np 4 -- /usr/bin/python3 examples/fashion_mnist/train.py --epochs 2
    /usr/bin/python3 examples/fashion_mnist/train.py --backend gloo        # one process, no launcher
    ddlrun -np 2 -- .venv/torch2/bin/python examples/fashion_mnist/train.py --device cuda   # torch 2.x, GPUs

Every rank trains on its own shard of each epoch's shuffled training set; DDP averages the gradients. After
each epoch rank 0 prints the mean training loss, the test accuracy (the test set split over the ranks and
summed) and the samples per second of the whole job, and writes a checkpoint (model, optimizer, epoch)
atomically. Started again with the same --checkpoint-dir (as `ddlctl submit --max-restarts` does after a
failure), it resumes after the last finished epoch instead of starting over.

Preemption and time limits: SIGTERM or SIGUSR1 (what ddl sends before it preempts a job, and `--signal
USR1@60` before its `--time` limit) on any rank stops every rank after the same step (torch_ddl.StopSignal:
one one-element all_reduce per step); rank 0 writes a checkpoint of that step (model, optimizer, epoch, step
within the epoch, history, and each rank's partial loss sum and RNG states), and every rank exits 0 before the
preemption deadline, so ddl requeues the job. Started again, it resumes at the next step with the same data
order (each epoch's permutation is drawn from a generator seeded by the epoch), so a run interrupted any
number of times ends with the weights and test accuracy of an uninterrupted one: bit for bit at 2 ranks (as
tests/torch checks), at more up to the rounding of sums taken in another order (DDP's first step after a start
buckets the gradients anew). --step-log FILE (rank 0 appends "attempt epoch step loss" per finished step)
shows that no step was lost or repeated. A rank killed (SIGKILL, a crash) before such a checkpoint still
repeats the steps since the last one, and a run stopped without --checkpoint-dir starts over.

Elastic (--elastic, backend ddl): a rank lost (SIGKILL, a crash, its node gone) no longer ends the job. The
others raise torch_ddl.RankLost on the step in flight, go on as a smaller group from the last step any of them
finished, with the model and optimizer in memory (torch_ddl.elastic.sync: no checkpoint read), and deal the
rest of the epoch among themselves. Each step's global batch is the next batch-size x ranks images of the
epoch's permutation, so no image is skipped or seen twice; the per-rank batch stays, and the learning rate
follows the world size (lr x ranks / starting ranks: the linear scaling rule). --step-log lines are then
"epoch step ranks loss". Rank 0 serves the rendezvous store (MASTER_ADDR), so its loss still ends the job.
Growing back: every --grow-every steps the ranks admit whoever waits to join (torch_ddl.elastic.grow); a
process started with DDL_JOIN=1 (as ddl's coordinator starts the new ranks of an elastic job: ddlctl submit
--gpus MIN:MAX) joins there, takes the model, optimizer and place from the others and trains on from the same
step.

--device cuda trains on GPUs (torch 2.x with CUDA): rank LOCAL_RANK takes GPU LOCAL_RANK modulo the GPUs it
sees, so one GPU per rank where there are enough (ddl-agent's CUDA_VISIBLE_DEVICES shows each rank its own) and
ranks sharing GPUs otherwise. The data sit on the GPU, and nothing in a step waits for the GPU on the host:
DDP's gradient all-reduces are enqueued on a CUDA stream of ddl's and overlap the backward pass.

Data: Debian's dataset-fashion-mnist package (/usr/share/datasets/fashion-mnist), IDX files read with numpy.
"""

import argparse
import datetime
import gzip
import json
import os
import signal
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # of the Fashion-MNIST training images


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="DDP training of a small CNN on Fashion-MNIST")
    p.add_argument("--backend", default="ddl", choices=["ddl", "gloo"], help="torch.distributed backend")
    p.add_argument("--model", default="cnn", choices=["cnn", "mlp"],
                   help="cnn: two conv layers and two dense ones (0.42 M parameters); mlp: three wide dense "
                        "layers (4.3 M parameters, little compute per parameter: communication-bound)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: one GPU per rank where there are enough, ranks sharing GPUs otherwise")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--train-samples", type=int, default=0, help="use the first N training images (0: all 60000)")
    p.add_argument("--test-samples", type=int, default=0, help="use the first N test images (0: all 10000)")
    p.add_argument("--data", default=DATA_DIR, help="directory of the IDX files (*-ubyte.gz)")
    p.add_argument("--checkpoint-dir", default="", help="save a checkpoint there after every epoch and resume "
                                                         "from the last one at start (shared by the ranks)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--timeout", type=float, default=300, help="process group timeout, seconds")
    p.add_argument("--json", default="", help="rank 0 writes the per-epoch results there")
    p.add_argument("--step-log", default="", help="rank 0 appends a line \"attempt epoch step loss\" per finished "
                                                   "step there (with CUDA, each step then waits for the GPU)")
    p.add_argument("--elastic", action="store_true",
                   help="go on without a lost rank (backend ddl; torch_ddl.elastic): see above")
    p.add_argument("--grow-every", type=int, default=20,
                   help="--elastic: admit the processes waiting to join every N steps (0: never)")
    p.add_argument("--crash-after-epoch", type=int, default=0,
                   help="testing: on the job's first attempt (DDL_JOB_ATTEMPT=1), the last rank exits with "
                        "status 3 right after epoch N's checkpoint, so that a restart has something to resume")
    args = p.parse_args(argv)
    if args.elastic and args.backend != "ddl":
        p.error("--elastic needs --backend ddl (torch_ddl.elastic)")
    return args


# ---- data ----

def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def load_split(data_dir, prefix, limit):
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"), 16).reshape(-1, 1, 28, 28)
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"), 8).astype(np.int64)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.copy())


def normalise(images_u8):
    return (images_u8.float() / 255.0 - MEAN) / STD


# ---- models ----

class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 2048), nn.ReLU(), nn.Linear(2048, 1024),
                                 nn.ReLU(), nn.Linear(1024, 10))

    def forward(self, x):
        return self.net(x)


def make_model(name):
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    return Cnn() if name == "cnn" else Mlp()


# ---- distributed set-up ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalStopSignal:
    """torch_ddl.StopSignal's agreed step, for --backend gloo where torch_ddl cannot be imported: SIGTERM and
    SIGUSR1 set a flag, and agreed() ORs the ranks' flags with one all_reduce, so that every rank stops after
    the same step. (It knows no preemption deadline.)"""

    def __init__(self):
        self.requested = False
        self._previous = {s: signal.signal(s, self._record) for s in (signal.SIGTERM, signal.SIGUSR1)}

    def _record(self, signum, frame):
        self.requested = True

    def agreed(self):
        flag = torch.tensor([int(self.requested)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def deadline(self):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def stop_signal(backend):
    """From here on SIGTERM and SIGUSR1 only ask for a stop: torch_ddl's StopSignal (any backend), or under gloo
    without torch_ddl the same step written out."""
    try:
        from torch_ddl import StopSignal
    except ImportError:
        if backend == "ddl":
            raise
        return LocalStopSignal()
    return StopSignal()


def init_distributed(backend, timeout_s, elastic=False):
    if "WORLD_SIZE" not in os.environ:  # run by hand: a job of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if backend == "ddl":
        import torch_ddl  # noqa: F401  registers the "ddl" backend
    if elastic:  # a store that joiners find (with DDL_JOIN=1 this process is one: it waits to be admitted)
        from torch_ddl import elastic as torch_ddl_elastic
        torch_ddl_elastic.init_process_group(datetime.timedelta(seconds=timeout_s))
    else:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


# ---- checkpoints ----

def checkpoint_path(directory):
    return os.path.join(directory, "checkpoint.pt")


def rank_state(loss_sum, seconds, device):
    """What differs between the ranks and a resumed step needs: this rank's loss sum and time so far in the
    epoch, and its RNG states (nothing below draws from them, but a model with dropout or an augmentation
    would, and would then resume with the numbers an uninterrupted run draws)."""
    state = {"loss_sum": loss_sum.cpu(), "seconds": seconds, "rng": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


def save_checkpoint(directory, model, optimizer, epoch, step, history, mine, rank, world):
    """Collective (every rank calls it at the same step; rank 0 writes). epoch: the last finished epoch; step:
    the steps done of the next one (0 at an epoch's end); mine: this rank's rank_state."""
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        tmp = checkpoint_path(directory) + ".tmp"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                    "step": step, "history": history, "world": world, "ranks": ranks}, tmp)
        os.replace(tmp, checkpoint_path(directory))  # a crash mid-write leaves the previous checkpoint whole
    dist.barrier()  # the checkpoint is on disk before any rank goes on (or fails, or exits)


def load_checkpoint(directory, model, optimizer, rank, world, device):
    """(last finished epoch, steps done of the next, history, this rank's state or None); (0, 0, [], None)
    without a checkpoint. Restores the model, the optimizer and this rank's RNG states."""
    path = checkpoint_path(directory) if directory else ""
    if not path or not os.path.exists(path):
        return 0, 0, [], None
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step, saved_world = state.get("step", 0), state.get("world", world)
    if saved_world != world:
        if step:
            raise SystemExit("the checkpoint in %s stopped at step %d of epoch %d on %d ranks; this run has %d, "
                             "which deal that epoch's batches otherwise: run it on %d ranks" %
                             (directory, step, state["epoch"] + 1, saved_world, world, saved_world))
        return state["epoch"], 0, state["history"], None
    mine = state["ranks"][rank] if "ranks" in state else None
    if mine is not None:
        torch.set_rng_state(mine["rng"])
        if "cuda_rng" in mine and device.type == "cuda":
            torch.cuda.set_rng_state(mine["cuda_rng"], device)
    return state["epoch"], step, state["history"], mine


# ---- training ----

def shard(n, epoch, rank, world, batch):
    """This rank's indices for an epoch: a permutation every rank draws alike, dealt round robin, cut to
    whole batches so that every rank runs the same number of steps."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1000 + epoch))
    per_rank = (n // world) // batch * batch
    return perm[rank::world][:per_rank]


def evaluate(model, images, labels, rank, world):
    model.eval()
    lo, hi = rank * len(images) // world, (rank + 1) * len(images) // world
    correct = torch.zeros(2, dtype=torch.int64, device=images.device)
    with torch.no_grad():
        for s in range(lo, hi, 1000):
            e = min(s + 1000, hi)
            pred = model(normalise(images[s:e])).argmax(1)
            correct[0] += (pred == labels[s:e]).sum()
            correct[1] += e - s
    dist.all_reduce(correct)  # the whole test set's counts
    model.train()
    return correct[0].item() / max(1, correct[1].item())


def pick_device(name):
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: this torch %s sees no CUDA GPU (torch.cuda.is_available() is False)" %
                         torch.__version__)
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)  # before the process group: its CUDA stream lives on this GPU
    return device


def main(argv=None):
    args = parse_args(argv)
    # First: a stop signal from here on is a request to stop after a step, not the end of the process.
    with stop_signal(args.backend) as stop:
        return train(args, stop)


def train(args, stop):
    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    # The data and model first: a joiner (DDL_JOIN=1) keeps the running ranks waiting from its admission on.
    train_x, train_y = (t.to(device) for t in load_split(args.data, "train", args.train_samples))
    test_x, test_y = (t.to(device) for t in load_split(args.data, "t10k", args.test_samples))
    model = make_model(args.model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    joining = args.elastic and os.environ.get("DDL_JOIN") == "1"
    rank, world = init_distributed(args.backend, args.timeout, args.elastic)
    log = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    if joining:
        print("joined as rank %d of %d" % (rank, world), flush=True)
        return train_elastic(args, model, optimizer, None, (train_x, train_y, test_x, test_y), rank, world, device,
                             joining=True)
    start_epoch, start_step, history, resumed = load_checkpoint(args.checkpoint_dir, model, optimizer, rank,
                                                                world, device)
    # Broadcasts rank 0's weights: every rank starts alike, resumed or not.
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None)
    if start_step:
        log("resuming after step %d of epoch %d from the checkpoint in %s" %
            (start_step, start_epoch + 1, args.checkpoint_dir))
    elif start_epoch:
        log("resuming from the checkpoint of epoch %d in %s" % (start_epoch, args.checkpoint_dir))
    log("training %s on %d images (%d per step) with backend %s on %d rank%s (%s)" %
        (args.model, len(train_x), args.batch_size * world, args.backend, world, "" if world == 1 else "s",
         args.device))

    if args.elastic:
        return train_elastic(args, model, optimizer, ddp, (train_x, train_y, test_x, test_y), rank, world, device)
    attempt = int(os.environ.get("DDL_JOB_ATTEMPT", "1"))
    for epoch in range(start_epoch + 1, args.epochs + 1):
        idx = shard(len(train_x), epoch, rank, world, args.batch_size).to(device)
        first = start_step if epoch == start_epoch + 1 else 0  # steps done before a stop: skipped, same order
        # Summed where the loss is: no host wait. Resumed mid-epoch, from this rank's sum at the stop.
        loss_sum = torch.zeros(2, dtype=torch.float64, device=device)
        seconds = 0.0
        if first and resumed is not None:
            loss_sum.copy_(resumed["loss_sum"])
            seconds = resumed["seconds"]
        t0 = time.monotonic()
        for step in range(first + 1, len(idx) // args.batch_size + 1):
            b = idx[(step - 1) * args.batch_size:step * args.batch_size]
            loss = F.cross_entropy(ddp(normalise(train_x[b])), train_y[b])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum[0] += loss.detach()
            loss_sum[1] += 1
            if args.step_log and rank == 0:  # opened per line: what a killed run did is on disk
                with open(args.step_log, "a") as f:
                    f.write("%d %d %d %r\n" % (attempt, epoch, step, loss.item()))
            if stop.agreed():  # every rank, after this same step
                stop_after(args, stop, model, optimizer, epoch, step, history,
                           rank_state(loss_sum, seconds + time.monotonic() - t0, device), rank, world, log)
                return 0
        dist.all_reduce(loss_sum)
        if device.type == "cuda":
            torch.cuda.synchronize()  # the epoch's time includes its GPU work
        seconds += time.monotonic() - t0
        accuracy = evaluate(model, test_x, test_y, rank, world)
        record = {"epoch": epoch, "loss": loss_sum[0].item() / max(1.0, loss_sum[1].item()),
                  "test_accuracy": accuracy, "samples_per_s": len(idx) * world / seconds, "seconds": seconds,
                  "attempt": attempt}
        history.append(record)
        log("epoch %d/%d: loss %.4f, test accuracy %.2f%%, %.0f samples/s (%.1f s)" %
            (epoch, args.epochs, record["loss"], 100 * accuracy, record["samples_per_s"], seconds))
        if args.checkpoint_dir:
            save_checkpoint(args.checkpoint_dir, model, optimizer, epoch, 0, history,
                            rank_state(torch.zeros(2, dtype=torch.float64), 0.0, device), rank, world)
        if epoch == args.crash_after_epoch and attempt == 1 and rank == world - 1:
            print("rank %d: exiting with status 3 after epoch %d, as --crash-after-epoch asks" % (rank, epoch),
                  flush=True)
            os._exit(3)

    result = {"backend": args.backend, "model": args.model, "device": args.device, "ranks": world,
              "epochs": history}
    if history:
        last = history[-1]
        log("done: test accuracy %.2f%%, %.0f samples/s (last epoch), %d ranks over %s" %
            (100 * last["test_accuracy"], last["samples_per_s"], world, args.backend))
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()
    return 0


def train_elastic(args, model, optimizer, ddp, data, rank, world, device, joining=False):
    """--elastic: the training loop of a job whose ranks may be lost; each step and each epoch's evaluation runs
    under torch_ddl.elastic.guard(), and a RankLost sends the survivors on from the same place. Every
    --grow-every steps the ranks admit whoever waits to join; a joiner (joining) starts from their state."""
    import torch_ddl
    from torch_ddl import elastic
    train_x, train_y, test_x, test_y = data
    history = []
    # The epoch, its images used so far, the job's steps finished, and the ranks it started with (the learning
    # rate's scale): the state a survivor or a joiner takes from the others (elastic.sync).
    where = {"epoch": 1, "used": 0, "step": 0, "first_world": world}
    loss_sum, t0, seconds = torch.zeros(2, dtype=torch.float64, device=device), time.monotonic(), 0.0

    def log(*a):
        if rank == 0:
            print(*a, flush=True)

    def regroup():
        """After the group changed: every rank at the same step and state, the model wrapped anew."""
        nonlocal rank, world, ddp
        rank, world = dist.get_rank(), dist.get_world_size()
        where["step"] = elastic.sync(where["step"], model, optimizer, state=where)
        ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None)

    def guarded(fn):
        """fn() under guard(); after a lost rank, the survivors agree on where they are and return None."""
        try:
            with elastic.guard():
                return fn()
        except torch_ddl.RankLost as lost:
            regroup_after(lost, "")
            return None

    def regroup_after(lost, when):
        regroup()
        log("lost rank%s %s%s after step %d: going on with %d ranks" %
            ("s" if len(lost.ranks) > 1 else "", ",".join(map(str, lost.ranks)), when, where["step"], world))

    def grow():
        """Admits whoever waits to join (a collective at a step boundary); True when the group changed."""
        try:
            if not elastic.grow():
                return False
        except torch_ddl.RankLost as lost:
            regroup_after(lost, " while growing,")
            return True
        regroup()
        log("grown after step %d: going on with %d ranks" % (where["step"], world))
        return True

    if joining:
        regroup()  # the running ranks call sync() right after admitting this one

    while where["epoch"] <= args.epochs:
        epoch = where["epoch"]
        perm = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(1000 + epoch)).to(device)
        while where["used"] + args.batch_size * world <= len(train_x):
            lo = where["used"] + rank * args.batch_size
            b = perm[lo:lo + args.batch_size]

            def step():
                for g in optimizer.param_groups:
                    g["lr"] = args.lr * world / where["first_world"]
                loss = F.cross_entropy(ddp(normalise(train_x[b])), train_y[b])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss.detach()
            loss = guarded(step)
            if loss is None:
                if where["epoch"] != epoch:
                    break  # the survivors' agreed place is in another epoch: its own permutation
                continue  # the survivors' agreed place
            where["used"] += args.batch_size * world
            where["step"] += 1
            loss_sum[0] += loss
            loss_sum[1] += 1
            if args.step_log and rank == 0:  # before a grow: the line says how many ranks ran the step
                with open(args.step_log, "a") as f:
                    f.write("%d %d %d %r\n" % (epoch, where["step"], world, loss.item()))
            if args.grow_every > 0 and where["step"] % args.grow_every == 0 and grow() and where["epoch"] != epoch:
                break
        if where["epoch"] != epoch:
            continue
        seconds += time.monotonic() - t0
        accuracy = guarded(lambda: evaluate(model, test_x, test_y, rank, world))
        if accuracy is None:
            continue  # evaluated again by the survivors
        record = {"epoch": epoch, "loss": loss_sum[0].item() / max(1.0, loss_sum[1].item()),
                  "test_accuracy": accuracy, "ranks": world, "steps": where["step"], "seconds": seconds}
        history.append(record)
        log("epoch %d/%d: loss %.4f (rank 0), test accuracy %.2f%%, %d rank%s, %d steps (%.1f s)" %
            (epoch, args.epochs, record["loss"], 100 * accuracy, world, "" if world == 1 else "s", where["step"],
             seconds))
        where["epoch"] += 1
        where["used"] = 0
        loss_sum.zero_()
        t0 = time.monotonic()
    if history:
        log("done: test accuracy %.2f%%, %d rank%s at the end, %d steps" %
            (100 * history[-1]["test_accuracy"], world, "" if world == 1 else "s", where["step"]))
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "model": args.model, "device": args.device, "elastic": True,
                       "ranks": world, "epochs": history}, f, indent=1)
    dist.destroy_process_group()
    return 0


def stop_after(args, stop, model, optimizer, epoch, step, history, mine, rank, world, log):
    """The ranks agreed to stop after this step: checkpoint it (collective), leave the group, and return, so
    the process exits 0 before the preemption deadline and ddl requeues the job."""
    deadline = stop.deadline()
    if deadline is None:  # not a preemption: a --time limit's --signal, or a signal by hand; nothing requeues it
        left = " (no preemption deadline: started again with the same --checkpoint-dir, it goes on from here)"
    else:
        left = ", %.1f s before the preemption deadline" % (deadline - time.time())
    if args.checkpoint_dir:
        save_checkpoint(args.checkpoint_dir, model, optimizer, epoch - 1, step, history, mine, rank, world)
        log("stopped by a signal after step %d of epoch %d; checkpoint in %s%s" %
            (step, epoch, args.checkpoint_dir, left))
    else:
        log("stopped by a signal after step %d of epoch %d%s; no --checkpoint-dir: a restart starts over" %
            (step, epoch, left))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
