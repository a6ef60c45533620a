"""Markers for ups-doctor from your own training program. Standard library only.

Copy this file next to your program (or put its folder on PYTHONPATH), then:

    import ups_doctor
    for step, batch in enumerate(loader):
        with ups_doctor.phase("forward", step=step):
            loss = model(batch)
        ...
        ups_doctor.step(step, loss=loss.item(), samples=len(batch))
    ups_doctor.done()

Everything here is a no-op when the program does not run under ups-doctor (neither
UPS_DOCTOR_MARKER_FD nor UPS_DOCTOR_MARKER_PATH is set), so it can stay in production code.

Under ups-doctor, importing this module also
- sends a `start` marker (pid, RANK, WORLD_SIZE);
- reports an uncaught exception's last line as the rank's `error` marker (the previous
  sys.excepthook still runs and prints the traceback);
- enables `faulthandler`, so a SIGSEGV/SIGBUS/SIGABRT prints the Python stack to stderr;
- under a launcher (torchrun), asks the kernel to kill this process when its parent dies, so no
  rank outlives ups-doctor even if ups-doctor itself is killed;
- under a launcher, tags each line with this process's pid and, once it knows it, its rank
  (`RANK`, or `torch.distributed.get_rank()` after `init_process_group`): the helper's markers
  tell ups-doctor which process is which rank even where the launcher sets no `RANK`
  (`torch.multiprocessing.spawn`).

Wire format (src/protocol.rs): one JSON object per line. With UPS_DOCTOR_MARKER_FD the harness
gave this process the write end of a pipe (checked against UPS_DOCTOR_MARKER_INO, so a process
that inherited the variable but not the fd writes nothing); with UPS_DOCTOR_MARKER_PATH (launcher
style, where torchrun closes inherited fds) every rank writes to one FIFO and each line carries its
`rank` and `pid`.
"""

import contextlib
import json
import os
import sys
import threading
import time

__all__ = ["mark", "end", "phase", "step", "done", "error", "worker_init_fn", "enabled"]

_lock = threading.Lock()
_fd = None
_owner_pid = None
_tagged = False
_first_loss = None
_last_loss = None
_steps = 0


def _env_int(name, default=None):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def _open():
    """The fd to write markers to in this process, or None."""
    global _fd, _owner_pid, _tagged
    pid = os.getpid()
    if _owner_pid == pid:
        return _fd
    # A forked child (a DataLoader worker) shares the parent's fd; a FIFO is opened again.
    _owner_pid, _fd, _tagged = pid, None, False
    number = _env_int("UPS_DOCTOR_MARKER_FD")
    inode = _env_int("UPS_DOCTOR_MARKER_INO")
    if number is not None:
        try:
            st = os.fstat(number)
            if inode is None or st.st_ino == inode:
                _fd = number
                return _fd
        except OSError:
            pass
    path = os.environ.get("UPS_DOCTOR_MARKER_PATH")
    if path:
        try:
            # Non-blocking open fails at once if nobody reads; writes then block as a pipe's do.
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.set_blocking(fd, True)
            _fd, _tagged = fd, True
        except OSError:
            _fd = None
    return _fd


def enabled():
    """Whether markers go anywhere (the program runs under ups-doctor)."""
    return _open() is not None


def _rank():
    """This process's rank when it knows it: `RANK` (as the launcher or the program set it), else
    `torch.distributed.get_rank()` once the process group is up (`torch.multiprocessing.spawn`
    passes the rank only as an argument); None before that."""
    rank = _env_int("RANK")
    if rank is not None:
        return rank
    dist = sys.modules.get("torch.distributed")
    with contextlib.suppress(Exception):
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    return None


def _send(marker):
    fd = _open()
    if fd is None:
        return
    if _tagged:
        # Each line says who wrote it; ups-doctor keeps the lines of a writer whose rank is not
        # known yet until it is, and takes a writer's rank as a sign of which process is which rank.
        rank = _rank()
        marker.pop("rank", None)
        if rank is not None:
            marker["rank"] = rank
        marker["pid"] = os.getpid()
    # When it was written (CLOCK_MONOTONIC, the clock ups-doctor converts from): ups-doctor reads
    # markers in batches, so the time it reads a line at is not when the line was written.
    marker["mono_ns"] = time.monotonic_ns()
    line = (json.dumps(marker, allow_nan=False, default=str) + "\n").encode()
    # One write per line: lines up to PIPE_BUF (4096 bytes) from several processes never mix.
    with _lock:
        try:
            os.write(fd, line)
        except OSError:
            pass


def _number(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def mark(name, step=None):
    """A phase begins (`forward`, `data.next`, …); `step` is the 0-based step of per-step phases."""
    marker = {"t": "begin", "phase": str(name)}
    if step is not None:
        marker["step"] = int(step)
    _send(marker)


def end(name, ms, step=None):
    """A phase ended after `ms` milliseconds."""
    marker = {"t": "end", "phase": str(name), "ms": float(ms)}
    if step is not None:
        marker["step"] = int(step)
    _send(marker)


@contextlib.contextmanager
def phase(name, step=None):
    """`begin` on entry, `end` with the measured duration on a normal exit."""
    mark(name, step)
    started = time.perf_counter()
    yield
    end(name, (time.perf_counter() - started) * 1000.0, step)


def step(step, loss=None, samples=0, data_ms=0.0, compute_ms=0.0):
    """One optimizer step finished (0-based `step`)."""
    global _first_loss, _last_loss, _steps
    loss = _number(loss)
    if loss is not None:
        _first_loss = loss if _first_loss is None else _first_loss
        _last_loss = loss
    _steps = max(_steps, int(step) + 1)
    _send({"t": "step", "step": int(step), "loss": loss, "data_ms": float(data_ms),
           "compute_ms": float(compute_ms), "samples": int(samples)})


def done(steps=None):
    """Training finished normally. Without it, `expect.completes_when: "done"` makes an exit
    status of 0 a false success."""
    _send({"t": "done", "steps": int(_steps if steps is None else steps),
           "first_loss": _first_loss, "final_loss": _last_loss})


def error(message):
    """The process is about to fail with this error (it caught it itself)."""
    _send({"t": "error", "message": str(message)})


def worker_init_fn(worker_id):
    """Pass as `DataLoader(worker_init_fn=ups_doctor.worker_init_fn)` to report each worker (its
    id and pid) to ups-doctor. Workers are recognised without it, from the process tree; with it,
    their ids are certain."""
    import multiprocessing
    method = multiprocessing.get_start_method(allow_none=True) or "fork"
    _send({"t": "worker", "id": int(worker_id), "pid": os.getpid(), "start_method": method})


def _install():
    if _open() is None:
        return
    import faulthandler
    if not faulthandler.is_enabled():
        faulthandler.enable()
    if os.environ.get("UPS_DOCTOR_MARKER_PATH"):
        _die_with_parent()
    previous = sys.excepthook

    def hook(kind, value, tb):
        # PyTorch re-raises a DataLoader worker's exception with the worker's traceback inside:
        # its first line names the worker, its last line is the worker's error.
        lines = [line for line in str(value).strip().splitlines() if line.strip()]
        text = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1].strip()}" if lines else ""
        error(f"{kind.__name__}: {text}" if text else kind.__name__)
        previous(kind, value, tb)

    sys.excepthook = hook
    torch = sys.modules.get("torch")
    threads = -1
    if torch is not None:
        with contextlib.suppress(Exception):
            threads = int(torch.get_num_threads())
    _send({"t": "start", "pid": os.getpid(), "rank": _env_int("RANK", 0),
           "world_size": _env_int("WORLD_SIZE", 1), "device": "python",
           "libtorch": getattr(torch, "__version__", "") if torch else "",
           "intra_op_threads": threads})


def _die_with_parent():
    """PR_SET_PDEATHSIG(SIGKILL): a launcher's rank dies with the launcher, which dies with
    ups-doctor."""
    with contextlib.suppress(Exception):
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)


_install()
