"""Preemption and time limits: a signal that reaches some ranks becomes one agreed stop on every rank.

When ddl preempts a running job (a job of a higher QoS needs its GPUs), the agent writes the preemption
deadline (unix seconds) into the file named by each rank's DDL_PREEMPT_DEADLINE_FILE, then signals every
rank's process group: the job's `--signal` signal where it was submitted with `--signal SIG@SECONDS`, else
SIGTERM. Ranks still running at the deadline are killed (SIGKILL); a job whose ranks exit before it, with any
exit code, is requeued and later started again with the same command line (DDL_JOB_ATTEMPT one higher).
`--signal SIG@SECONDS` also sends SIG, without a deadline file, SECONDS before the job's `--time` limit.

    with torch_ddl.StopSignal() as stop:     # SIGTERM and SIGUSR1 (signals=...) now only set a flag
        for step in ...:
            train_step()
            if stop.agreed():                # every rank calls it after the same step
                save_checkpoint()            # one step's model and optimizer; resume after that step
                sys.exit(0)

Why agree: the signal reaches the ranks at different moments, each inside some step of its own. A rank that
saved and left on its own signal would leave the others blocked in the step's next collective until the
group's timeout, and ranks that each saved where they were would write states of different steps, which no
restart can continue from exactly. agreed() ORs the ranks' flags with one all_reduce (MAX) of a one-element
tensor: once any rank has recorded a signal, it returns True on every rank at the same call, so every rank
stops after the same step and the checkpoint written then is one consistent state. Its cost is that small
all_reduce per call (`every=N`: per Nth call, at the price of up to N - 1 more steps before the stop); a
signal is acted on at the first communicating call after its handler ran.

The handlers are installed when a StopSignal is made (Python installs handlers only from the main thread) and
record the signal, nothing else: a second signal while the checkpoint is written is recorded too, not fatal.
close(), or leaving the `with` block, puts back the handlers it replaced; keep it open until the checkpoint is
on disk. Nothing happens on `import torch_ddl`. Works over any process group (ddl, gloo, NCCL: there the flag
is a CUDA tensor), and without an initialised one (a single process) agreed() is the local flag.
"""

import os
import signal
import threading

import torch
import torch.distributed as dist

DEADLINE_ENV = "DDL_PREEMPT_DEADLINE_FILE"
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

__all__ = ["StopSignal", "DEADLINE_ENV", "DEFAULT_SIGNALS"]


def _as_signal(s):
    """A signal.Signals from a number, a Signals, or a name ("SIGUSR1" or "USR1")."""
    if isinstance(s, str):
        name = s.upper() if s.upper().startswith("SIG") else "SIG" + s.upper()
        if not hasattr(signal.Signals, name):
            raise ValueError("no signal named %r" % s)
        return signal.Signals[name]
    return signal.Signals(s)


def _read_deadline(environ):
    path = environ.get(DEADLINE_ENV)
    if not path:
        return None
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:  # no preemption (the file appears only with one), or unreadable: no deadline known
        return None
    try:
        return float(text)
    except ValueError:
        return None


class StopSignal:
    """Records the arrival of stop signals on this rank, and agrees across the group when to stop.

    Threads: made and closed on the main thread (signal handlers); the handler runs there too (Python runs
    handlers on the main thread). agreed() is a collective, called by the thread that runs the training loop,
    on every rank of the group the same number of times.
    """

    def __init__(self, signals=DEFAULT_SIGNALS, group=None, every=1):
        """signals: numbers, signal.Signals or names to record (SIGTERM and SIGUSR1 by default); group: the
        process group agreed() reduces over (None: the default group); every: agreed() communicates on every
        Nth call only, returning False on the others."""
        if int(every) < 1:
            raise ValueError("StopSignal(every=%r): every must be 1 or more" % (every,))
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("StopSignal must be made on the main thread: Python installs signal handlers only "
                               "there")
        self._group = group
        self._every = int(every)
        self._calls = 0
        self._agreed = False
        self._requested = False
        self._signum = None
        self._device = None
        self._previous = {}  # the handlers replaced, put back by close()
        wanted = []
        for s in signals:
            s = _as_signal(s)
            if s not in wanted:
                wanted.append(s)
        for s in wanted:
            if signal.getsignal(s) is None:
                raise ValueError("%s has a handler that was not installed from Python, which StopSignal could not "
                                 "put back on close(); leave it out of signals=" % s.name)
        self._handler = self._on_signal  # one object: close() recognises it as ours
        try:
            for s in wanted:
                self._previous[s] = signal.signal(s, self._handler)
        except BaseException:
            self.close()
            raise

    def _on_signal(self, signum, frame):
        if self._signum is None:
            self._signum = signal.Signals(signum)
        self._requested = True

    @property
    def requested(self):
        """Whether this rank has recorded a signal (or request()); no communication."""
        return self._requested

    @property
    def signum(self):
        """The first signal this rank recorded (a signal.Signals), or None."""
        return self._signum

    def request(self):
        """Records a stop as a signal would (for a program's own reasons, such as a time budget)."""
        self._requested = True

    def deadline(self):
        """The preemption deadline in unix seconds, read from the file DDL_PREEMPT_DEADLINE_FILE names, or None:
        no preemption (the signal came before a --time limit, or none came), or not run by ddl."""
        return _read_deadline(os.environ)

    def agreed(self):
        """Collective over the group: True on every rank once any rank had recorded a signal by its call. Every
        rank calls it at the same point of the loop; with every=N, only each Nth call communicates (all ranks
        count alike) and the others return False. Once True, it stays True without communicating."""
        if self._agreed:
            return True
        self._calls += 1
        if self._calls % self._every:
            return False
        if not (dist.is_available() and dist.is_initialized()):
            self._agreed = self._requested
            return self._agreed
        flag = torch.tensor([1 if self._requested else 0], dtype=torch.int32, device=self._flag_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        self._agreed = bool(flag.item())
        return self._agreed

    def _flag_device(self):
        if self._device is None:
            # NCCL reduces CUDA tensors only; every other backend (ddl, gloo, mpi) takes a CPU tensor, which is
            # what the host needs to read the answer anyway.
            nccl = str(dist.get_backend(self._group)) == "nccl"
            self._device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        return self._device

    def close(self):
        """Puts back the handlers this StopSignal replaced (where its own is still the one installed: close
        StopSignals in the reverse order of making them, as nested `with` blocks do). Main thread only."""
        if not self._previous:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("StopSignal.close() must run on the main thread: Python installs signal handlers "
                               "only there")
        previous, self._previous = self._previous, {}
        for s, handler in previous.items():
            if signal.getsignal(s) is self._handler:
                signal.signal(s, handler)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
