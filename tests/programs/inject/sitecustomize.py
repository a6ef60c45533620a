"""Faults injected from outside a program, for tests/observe.rs: put this folder on PYTHONPATH
(ups-doctor's sitecustomize runs first and then this one, which it shadows) and name the fault:

- INJECT_SKIP_RANK=R, INJECT_SKIP_CALL=K: on rank R, the K-th call (1-based) of
  `torch.distributed.all_gather` returns without gathering: the rank skips that collective.
- INJECT_SLOW_RANK=R, INJECT_SLOW_MS=M: on rank R every batch the DataLoader fetches takes M ms
  longer (a straggler in data loading).
- INJECT_BUSY_RANK=R, INJECT_BUSY_S=S, INJECT_BUSY_CALL=K: on rank R, before the K-th call of
  `torch.distributed.all_gather`, S seconds of computing (matrix products) without a word, as a
  long validation or a compile would; the other ranks wait in that gather meanwhile.
- INJECT_SLEEP_RANK=R, INJECT_SLEEP_S=S, INJECT_SLEEP_CALL=K: on rank R, before the K-th call of
  `torch.distributed.all_gather`, S seconds asleep (a rank waiting on a slow disk or a lock, not
  in any collective); the other ranks wait in that gather meanwhile.
- INJECT_STALL_RANK=R, INJECT_STALL_S=S, INJECT_STALL_STEP=K: on rank R, before the K-th optimizer
  step (any optimizer's), S seconds of computing without a word, as a long evaluation or a
  checkpoint written by one rank alone would; the other ranks wait in DDP's next gradient
  all-reduce meanwhile.
- INJECT_MISSING_RANK=R, INJECT_MISSING_MODULE=M: on rank R, the program's own `import M` fails
  with `ModuleNotFoundError: No module named 'M'` (a package missing from one node's image).
  With INJECT_MISSING_ATTEMPT=A, only in torchrun's attempt A (`TORCHELASTIC_RESTART_COUNT`): a
  transient fault (a filesystem mounted late) that a restart gets past.
- INJECT_EXIT_ABORT_RANK=R: on rank R, once the program has finished (an exit handler, which
  runs after the program's own ones), a daemon thread starts matrix products, which run in C++
  with the GIL let go. When Python then shuts down, the thread is ended as it takes the GIL back
  from inside C++, and the process dies of SIGABRT ("terminate called without an active
  exception"): a library thread still running at exit, as PyTorch's own sometimes are.
- INJECT_SIZE_RANK=R, INJECT_SIZE_CALL=K: before the K-th call of `torch.distributed.all_gather`,
  every rank all-reduces a metric of 8 floats, rank R one of 16 (a metric whose size depends on
  the rank): the sizes of one collective differ between the ranks.
- INJECT_RAISE_RANKS=R,R…|all, INJECT_RAISE_STEP=K: before the K-th optimizer step, each of those
  ranks raises `ValueError: injected: bad batch at step K` (the same error on every rank, within
  milliseconds, as a bad configuration or data file read by all would).
- INJECT_LAUNCHER_BUSY_S=S: in torchrun's own process (not its ranks), S seconds of computing
  without a word before it reads its arguments and starts any rank, as a slow `import torch` on a
  loaded machine or a network filesystem would.

- INJECT_LAUNCHER_READING_S=S: the same, but reading instead of computing: S seconds of reading
  256 KiB from `/dev/zero` every 0.25 s (1 MiB a second, a few milliseconds of CPU), as an
  `import torch` from a slow disk or a network filesystem waits on it.

- INJECT_FR_DUMP=PREFIX, INJECT_FR_DUMP_AFTER_S=S: on every rank, a watchdog thread that, once
  the rank has made no optimizer step for S seconds (default 20), writes PyTorch's Flight Recorder
  dump, `torch._C._distributed_c10d._dump_fr_trace(True, False)`, to PREFIX followed by the rank
  (`/dumps/nccl_trace_rank_1`): the bytes, and the file names, that PyTorch's own NCCL watchdog
  writes on a collective timeout with `TORCH_NCCL_DUMP_ON_TIMEOUT=1` and
  `TORCH_NCCL_DEBUG_INFO_TEMP_FILE=PREFIX`, which gloo does not do by itself.

- INJECT_XID_RANK=R, INJECT_XID_STEP=K, INJECT_XID_CODE=C (default 79): before the K-th optimizer
  step, rank R writes the NVIDIA driver's record of Xid C for its own process into the kernel log
  (`/dev/kmsg`, as root), as the driver does when the GPU under a process fails (`NVRM: Xid
  (PCI:0000:3b:00): 79, pid=PID, name=python, GPU has fallen off the bus.`, the format of NVIDIA's
  Xid catalogue), then raises `RuntimeError: injected: the GPU failed`. With INJECT_XID_PRINT=1 it
  only prints that line to stderr (a program quoting one is not a GPU fault) before raising.

Rank: the `RANK` the launcher set. Nothing happens without these variables."""

import builtins
import os
import sys
import time

_import = builtins.__import__
_done = set()


def _rank_is(name):
    return os.environ.get(name) is not None and os.environ.get(name) == os.environ.get("RANK")


def _compute(seconds):
    """Matrix products without a word for `seconds`, as a long validation or a compile would."""
    import torch

    x, end = torch.randn(256, 256), time.monotonic() + seconds
    while time.monotonic() < end:
        x = torch.tanh(x @ x)


def _hold_before_gather(dist, at, hold, seconds):
    """Before the `at`-th call of `dist.all_gather`, `hold(seconds)`; the other ranks wait in it."""
    gather, calls = dist.all_gather, [0]

    def _held_first(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            hold(seconds)
        return gather(*args, **kwargs)

    dist.all_gather = _held_first


def optim_module():
    return sys.modules.get("torch.optim.optimizer")


def _fr_watchdog(prefix, after_s):
    """Writes this rank's Flight Recorder dump once it has made no optimizer step for `after_s`."""
    import threading

    steps = [0, time.monotonic()]

    def stepped(*_args):
        steps[0] += 1
        steps[1] = time.monotonic()

    optim_module().register_optimizer_step_pre_hook(stepped)

    def watch():
        while steps[0] == 0 or time.monotonic() - steps[1] < after_s:
            time.sleep(0.5)
        import torch._C._distributed_c10d as c10d

        with open(prefix + os.environ.get("RANK", "0"), "wb") as out:
            out.write(c10d._dump_fr_trace(True, False))

    threading.Thread(target=watch, name="inject-fr-watchdog", daemon=True).start()


def _xid_fault(at, code):
    steps = [0]

    def fault(*_args):
        steps[0] += 1
        if steps[0] != at:
            return
        line = f"NVRM: Xid (PCI:0000:3b:00): {code}, pid={os.getpid()}, name=python, GPU has fallen off the bus."
        if os.environ.get("INJECT_XID_PRINT") == "1":
            sys.stderr.write(line + "\n")
        else:
            with open("/dev/kmsg", "w") as kmsg:
                kmsg.write("<3>" + line + "\n")
        sys.stderr.flush()
        raise RuntimeError("injected: the GPU failed")

    optim_module().register_optimizer_step_pre_hook(fault)


def _inject():
    dist = sys.modules.get("torch.distributed")
    if "xid" not in _done and _rank_is("INJECT_XID_RANK") and hasattr(optim_module(), "register_optimizer_step_pre_hook"):
        _done.add("xid")
        _xid_fault(int(os.environ.get("INJECT_XID_STEP", "3")), int(os.environ.get("INJECT_XID_CODE", "79")))
    if "fr" not in _done and os.environ.get("INJECT_FR_DUMP") and hasattr(optim_module(), "register_optimizer_step_pre_hook"):
        _done.add("fr")
        _fr_watchdog(os.environ["INJECT_FR_DUMP"], float(os.environ.get("INJECT_FR_DUMP_AFTER_S", "20")))
    if "skip" not in _done and _rank_is("INJECT_SKIP_RANK") and hasattr(dist, "all_gather"):
        _done.add("skip")
        gather, calls, skip = dist.all_gather, [0], int(os.environ.get("INJECT_SKIP_CALL", "1"))

        def all_gather(*args, **kwargs):
            calls[0] += 1
            if calls[0] == skip:
                return None
            return gather(*args, **kwargs)

        dist.all_gather = all_gather
    if "size" not in _done and os.environ.get("INJECT_SIZE_RANK") is not None and hasattr(dist, "all_gather"):
        _done.add("size")
        import torch

        odd = os.environ.get("INJECT_SIZE_RANK") == os.environ.get("RANK")

        def metric(_seconds):
            dist.all_reduce(torch.ones(16 if odd else 8))

        _hold_before_gather(dist, int(os.environ.get("INJECT_SIZE_CALL", "1")), metric, 0)
    raising = os.environ.get("INJECT_RAISE_RANKS", "")
    mine = raising == "all" or os.environ.get("RANK") in raising.split(",")
    if "raise" not in _done and raising and mine and hasattr(optim_module(), "register_optimizer_step_pre_hook"):
        _done.add("raise")
        at, steps = int(os.environ.get("INJECT_RAISE_STEP", "1")), [0]

        def bad_batch(*_args):
            steps[0] += 1
            if steps[0] == at:
                raise ValueError(f"injected: bad batch at step {at}")

        optim_module().register_optimizer_step_pre_hook(bad_batch)
    for kind, hold, default_s in (("BUSY", _compute, "10"), ("SLEEP", time.sleep, "30")):
        if kind not in _done and _rank_is(f"INJECT_{kind}_RANK") and hasattr(dist, "all_gather"):
            _done.add(kind)
            at = int(os.environ.get(f"INJECT_{kind}_CALL", "1"))
            _hold_before_gather(dist, at, hold, float(os.environ.get(f"INJECT_{kind}_S", default_s)))
    optim = sys.modules.get("torch.optim.optimizer")
    if "stall" not in _done and _rank_is("INJECT_STALL_RANK") and hasattr(optim, "register_optimizer_step_pre_hook"):
        _done.add("stall")
        at, steps = int(os.environ.get("INJECT_STALL_STEP", "1")), [0]
        seconds = float(os.environ.get("INJECT_STALL_S", "30"))

        def stall(*_args):
            steps[0] += 1
            if steps[0] == at:
                _compute(seconds)

        optim.register_optimizer_step_pre_hook(stall)
    fetch = sys.modules.get("torch.utils.data._utils.fetch")
    if "slow" not in _done and _rank_is("INJECT_SLOW_RANK") and hasattr(fetch, "_MapDatasetFetcher"):
        _done.add("slow")
        cls, delay = fetch._MapDatasetFetcher, float(os.environ.get("INJECT_SLOW_MS", "50")) / 1000.0
        original = cls.fetch

        def slow_fetch(self, index):
            time.sleep(delay)
            return original(self, index)

        cls.fetch = slow_fetch


def _hooked(name, globals=None, *args, **kwargs):
    own = (globals or {}).get("__name__") == "__main__"
    attempt = os.environ.get("INJECT_MISSING_ATTEMPT")
    now = attempt is None or attempt == os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if own and now and _rank_is("INJECT_MISSING_RANK") and name == os.environ.get("INJECT_MISSING_MODULE"):
        raise ModuleNotFoundError(f"No module named '{name}'", name=name)
    module = _import(name, globals, *args, **kwargs)
    # Only at the program's own imports, once torch has loaded: the fault sits where the
    # program's code would, outside anything that wraps torch while it loads.
    if len(_done) < 7 and "torch" in sys.modules and (globals or {}).get("__name__") == "__main__":
        _inject()
    return module


def _launcher_busy(seconds):
    """Pure Python, so that the launcher imports nothing it would not have imported itself."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(10_000))


def _launcher_reading(seconds):
    end = time.monotonic() + seconds
    with open("/dev/zero", "rb", buffering=0) as f:
        while time.monotonic() < end:
            f.read(256 * 1024)
            time.sleep(0.25)


def _abort_at_exit():
    import threading

    import torch

    a, b, c = torch.randn(384, 384), torch.randn(384, 384), torch.empty(384, 384)
    running = threading.Event()

    def products():
        running.set()
        while True:
            torch.mm(a, b, out=c)

    threading.Thread(target=products, daemon=True).start()
    running.wait(10.0)
    _spinning.append(True)


class _HoldFinalization:
    """Freed when Python clears this module's globals, after it has begun to shut down: waits a
    second there (letting go of the GIL), so the products' thread, even on a loaded machine, gets
    out of its C++ call while Python shuts down, and the process aborts every time."""

    def __del__(self):
        if _spinning:
            time.sleep(1.0)


_spinning = []
if _rank_is("INJECT_EXIT_ABORT_RANK"):
    import atexit

    atexit.register(_abort_at_exit)
    _hold = _HoldFinalization()

if os.environ.get("INJECT_LAUNCHER_BUSY_S") and os.path.basename(sys.argv[0]) == "torchrun":
    _launcher_busy(float(os.environ["INJECT_LAUNCHER_BUSY_S"]))
if os.environ.get("INJECT_LAUNCHER_READING_S") and os.path.basename(sys.argv[0]) == "torchrun":
    _launcher_reading(float(os.environ["INJECT_LAUNCHER_READING_S"]))

_ANY = (
    "INJECT_SKIP_RANK",
    "INJECT_SLOW_RANK",
    "INJECT_BUSY_RANK",
    "INJECT_SLEEP_RANK",
    "INJECT_STALL_RANK",
    "INJECT_MISSING_RANK",
    "INJECT_SIZE_RANK",
    "INJECT_RAISE_RANKS",
    "INJECT_FR_DUMP",
    "INJECT_XID_RANK",
)
if any(os.environ.get(v) for v in _ANY):
    builtins.__import__ = _hooked
