"""Faults injected from outside a training program, for bench/accuracy (the accuracy matrix).

Put this folder on PYTHONPATH in ups-doctor's own environment: ups-doctor's sitecustomize runs
first in every Python process of the command and then this one, which it shadows. Nothing
happens unless ACC_FAULT names a fault. Variables:

- ACC_FAULT: the fault (below). ACC_RANK: the rank it hits (default 1). ACC_STEP: the optimizer
  step (1-based, counted over every `torch.optim.Optimizer.step` call of the process, through
  the global `register_optimizer_step_pre_hook`) at which it fires (default 3). ACC_CALL: for
  the collective faults, the K-th collective the rank issues through `torch.distributed.X`
  (outermost calls only). ACC_MS: the delay of a straggler (default 300).
- ACC_STAMP: a file; one JSON line is appended when the fault fires (`fault`, `rank`, `pid`,
  `t` = time.time()), so the runner knows it fired and when.
- ACC_COUNT_FILE: a file; at a normal exit (and as it destroys its process group) each process that trained appends its counts
  (optimizer steps, collectives, tensor collectives, DataLoader fetches): the runner calibrates
  ACC_CALL and ACC_STEP from the uninjected run.

Faults (all on rank ACC_RANK):
  segv         SIGSEGV raised in the process at step ACC_STEP (os.kill, as a native crash)
  exception    RuntimeError("accuracy-bench injected fault ...") raised from step ACC_STEP
  exit0        os._exit(0) at step ACC_STEP: a quiet exit with status 0 mid-training
  hang         asleep forever at step ACC_STEP, outside any collective
  skip-coll    the ACC_CALL-th collective returns at once without communicating
  size-coll    the ACC_CALL-th all_reduce/all_gather is given an input tensor 7 elements longer
  slow-step    ACC_MS of matrix products before every optimizer step (a compute straggler)
  slow-data    ACC_MS asleep in every DataLoader fetch (a data straggler; in workers too)
  leak         at step ACC_STEP, keeps allocating (and touching) 64 MiB blocks until killed (OOM)
  kill-worker  a DataLoader worker of the rank SIGKILLs itself at its ACC_STEP-th fetch
  exit-rdzv    the rank exits with status 3 as it calls init_process_group, once every other rank
               has called it (before rendezvous)
"""

import json
import os
import sys
import threading
import time

FAULT = os.environ.get("ACC_FAULT", "")
TARGET = int(os.environ.get("ACC_RANK", "1") or 1)
STEP = int(os.environ.get("ACC_STEP", "3") or 3)
CALL = int(os.environ.get("ACC_CALL", "1") or 1)
MS = float(os.environ.get("ACC_MS", "300") or 300)
STAMP = os.environ.get("ACC_STAMP")
COUNT_FILE = os.environ.get("ACC_COUNT_FILE")

_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "gather", "gather_object", "scatter",
    "scatter_object_list",
)
# The collectives size-coll may hit (and `tensor_colls` counts), with where their input tensor is.
_TENSOR_OPS = {"all_reduce": 0, "all_gather": 1, "all_gather_into_tensor": 1}
_WATCH = ("torch.distributed", "torch.optim.optimizer", "torch.utils.data._utils.fetch", "torch.utils.data.dataloader")

_patched = set()
_counts = {"steps": 0, "colls": 0, "tensor_colls": 0, "fetches": 0, "ops": {}}
_local = threading.local()


# The rank the process group last gave this process: at exit the group may be gone and `RANK`
# with it (PyTorch-Ignite destroys its group and restores the environment it had before it set
# `RANK`), and the counts must still say whose they are.
_group_rank = [None]


def _rank():
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            _group_rank[0] = dist.get_rank()
            return _group_rank[0]
    except Exception:
        pass
    r = os.environ.get("RANK")
    return int(r) if r not in (None, "") else _group_rank[0]


def _mine():
    return _rank() == TARGET


def _stamp(**extra):
    if not STAMP:
        return
    line = dict(fault=FAULT, rank=_rank(), pid=os.getpid(), t=time.time(), **extra)
    try:
        with open(STAMP, "a") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass


def _say(text):
    try:
        sys.stderr.write(f"[accuracy-bench] {text}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _compute(seconds):
    import torch

    x, end = torch.randn(128, 128), time.monotonic() + seconds
    while time.monotonic() < end:
        x = torch.tanh(x @ x)


def _leak():
    import torch

    kept = []
    # Capped at 6 GiB (the machine's safety, should the memory limit not hold): then an error.
    for _ in range(96):
        kept.append(torch.ones(16 * 1024 * 1024))  # 64 MiB, every page touched
    raise MemoryError("accuracy-bench: 6 GiB leaked and no OOM kill came")


def _on_step(*_args):
    _counts["steps"] += 1
    n = _counts["steps"]
    if FAULT == "slow-step" and _mine():
        if n == STEP:
            _stamp(step=n)
        _compute(MS / 1000.0)
        return
    if n != STEP or not _mine():
        return
    if FAULT == "segv":
        import signal

        _stamp(step=n)
        _say(f"rank {TARGET}: SIGSEGV at step {n}")
        os.kill(os.getpid(), signal.SIGSEGV)
    elif FAULT == "exception":
        _stamp(step=n)
        raise RuntimeError(f"accuracy-bench injected fault on rank {TARGET} at step {n}")
    elif FAULT == "exit0":
        _stamp(step=n)
        os._exit(0)
    elif FAULT == "hang":
        _stamp(step=n)
        while True:
            time.sleep(3600)
    elif FAULT == "leak":
        _stamp(step=n)
        _leak()


def _wrap_collective(dist, op, original):
    tensor_arg = _TENSOR_OPS.get(op)

    def collective(*args, **kwargs):
        if getattr(_local, "depth", 0):
            return original(*args, **kwargs)
        _local.depth = 1
        try:
            if _group_rank[0] is None:
                _rank()
            _counts["colls"] += 1
            _counts["ops"][op] = _counts["ops"].get(op, 0) + 1
            if tensor_arg is not None:
                _counts["tensor_colls"] += 1
            if FAULT == "skip-coll" and _counts["colls"] == CALL and _mine():
                _stamp(op=op, call=CALL)
                _say(f"rank {TARGET} skips {op} (collective {CALL})")
                if kwargs.get("async_op"):
                    class _Done:
                        def wait(self, *a, **k):
                            return True

                        def is_completed(self):
                            return True

                    return _Done()
                return None
            if (FAULT == "size-coll" and tensor_arg is not None and _counts["tensor_colls"] == CALL
                    and _mine()):
                import torch

                args = list(args)
                t = args[tensor_arg] if len(args) > tensor_arg else kwargs.get("tensor")
                if isinstance(t, torch.Tensor):
                    bigger = torch.cat([t.reshape(-1), t.new_zeros(7)])
                    if len(args) > tensor_arg:
                        args[tensor_arg] = bigger
                    else:
                        kwargs["tensor"] = bigger
                    _stamp(op=op, call=CALL, numel=t.numel())
                    _say(f"rank {TARGET} gives {op} {t.numel() + 7} elements instead of {t.numel()}")
            return original(*args, **kwargs)
        finally:
            _local.depth = 0

    collective.__wrapped__ = original
    setattr(dist, op, collective)


def _wrap_init(dist):
    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        r = kwargs.get("rank")
        if r is None or r == -1:
            r = os.environ.get("RANK")
        if FAULT == "exit-rdzv" and r is not None:
            world = kwargs.get("world_size")
            if world is None or world == -1:
                world = os.environ.get("WORLD_SIZE")
            if int(r) == TARGET:
                _others_joining(int(r), int(world) if world is not None else None)
                _stamp()
                _say(f"rank {TARGET} exits with status 3 before the rendezvous")
                os._exit(3)
            _joining(int(r))
        return original(*args, **kwargs)

    init_process_group.__wrapped__ = original
    dist.init_process_group = init_process_group
    destroy = getattr(dist, "destroy_process_group", None)
    if destroy is None:
        return

    def destroy_process_group(*args, **kwargs):
        # The counts also as the group ends: a cluster's worker (Ray Train's) is ended by its
        # cluster, not by returning, and never reaches its exit handlers. The runner keeps the
        # larger of the two a process writes.
        _write_counts()
        return destroy(*args, **kwargs)

    destroy_process_group.__wrapped__ = destroy
    dist.destroy_process_group = destroy_process_group


def _joining(rank):
    """exit-rdzv: this rank is about to wait in the rendezvous (a file beside ACC_STAMP)."""
    if STAMP:
        try:
            open(f"{STAMP}.joining-{rank}", "w").close()
        except OSError:
            pass


def _others_joining(rank, world):
    """exit-rdzv: the fault is a rank that leaves while the others wait in the rendezvous, so it
    fires once every other rank has called init_process_group (at most 120 s), and 2 s later, by
    which time they are inside it. Without this, which the fault is depends on a race: a rank
    still importing its framework when the target exits is stopped by its launcher before it
    ever waits, and the run shows a rank that exited early, not a rendezvous left incomplete."""
    if not STAMP or not world:
        return
    deadline = time.time() + 120
    others = [f"{STAMP}.joining-{r}" for r in range(world) if r != rank]
    while time.time() < deadline and not all(os.path.exists(p) for p in others):
        time.sleep(0.05)
    time.sleep(2)


def _wrap_fetch(fetch):
    for name in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
        cls = getattr(fetch, name, None)
        if cls is None:
            continue
        original = cls.fetch

        def slowed(self, index, _original=original):
            _counts["fetches"] += 1
            if FAULT == "slow-data" and _mine():
                if _counts["fetches"] == 1:
                    _stamp()
                time.sleep(MS / 1000.0)
            if FAULT == "kill-worker" and _mine() and _counts["fetches"] == STEP:
                import torch.utils.data

                if torch.utils.data.get_worker_info() is not None:
                    import signal

                    _stamp(worker_pid=os.getpid())
                    os.kill(os.getpid(), signal.SIGKILL)
            return _original(self, index)

        cls.fetch = slowed


def _patch():
    dist = sys.modules.get("torch.distributed")
    if "dist" not in _patched and dist is not None and hasattr(dist, "init_process_group") \
            and hasattr(dist, "all_reduce"):
        _patched.add("dist")
        _wrap_init(dist)
        for op in _COLLECTIVES:
            if hasattr(dist, op):
                _wrap_collective(dist, op, getattr(dist, op))
    optim = sys.modules.get("torch.optim.optimizer")
    if "optim" not in _patched and hasattr(optim, "register_optimizer_step_pre_hook"):
        _patched.add("optim")
        optim.register_optimizer_step_pre_hook(_on_step)
    fetch = sys.modules.get("torch.utils.data._utils.fetch")
    if "fetch" not in _patched and hasattr(fetch, "_MapDatasetFetcher") and hasattr(fetch, "_IterableDatasetFetcher"):
        _patched.add("fetch")
        _wrap_fetch(fetch)


class _Finder:
    """Runs `_patch` after each watched torch module has loaded (as ups-doctor's observer does)."""

    def __init__(self):
        self.busy = False

    def find_spec(self, name, path, target=None):
        if name not in _WATCH or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
        finally:
            self.busy = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module):
            original(module)
            try:
                _patch()
            except Exception as e:  # never break the program because of the bench
                _say(f"patch failed: {e!r}")

        loader.exec_module = exec_module
        return spec


def _write_counts():
    if not COUNT_FILE or (_counts["steps"] == 0 and _counts["colls"] == 0):
        return
    try:
        with open(COUNT_FILE, "a") as f:
            f.write(json.dumps(dict(_counts, rank=_rank(), pid=os.getpid())) + "\n")
    except OSError:
        pass


if FAULT or COUNT_FILE:
    sys.meta_path.insert(0, _Finder())
    if any(m in sys.modules for m in _WATCH):
        _patch()
    import atexit

    atexit.register(_write_counts)
