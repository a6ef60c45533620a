"""Read by Python at start-up in every process of a command ups-doctor runs: ups-doctor writes
this file into the scenario's log folder and puts that folder first on `PYTHONPATH` (unless you
set `PYTHONUNBUFFERED` yourself and turned the observer off). It is not the helper (`python/ups_doctor.py`); you never import
it.

It makes `sys.stdout` and `sys.stderr` line-buffered: each line reaches the pipe in one write as
soon as it ends, also where the user set `PYTHONUNBUFFERED` (most ML container images do). ups-doctor
also sets `PYTHONUNBUFFERED=1` (for a process started with `-I` or `-S`, which does not read this
file), and unbuffered alone sends `print`'s text and its newline in two writes: under a launcher
every rank shares one stdout, and another rank's line can land between the two (`rank 1 step 5 loss 2.7400training finished`), which a line-anchored completion pattern
then misses. Then it runs the `sitecustomize` it shadows, if there is one further on the path.
"""

import os
import sys
import time


def _line_buffered():
    if os.environ.get("UPS_DOCTOR_LINE_BUFFERED") != "1":  # not a command's Python under ups-doctor
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except Exception:  # None (no console), or not a TextIOWrapper: leave it as it is
            pass


def _chain():
    import importlib.machinery
    import importlib.util
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


# --- The observer ---------------------------------------------------------------------------
# Under ups-doctor (a marker pipe or FIFO is named in the environment, and not turned off with
# `--no-observe` / `launch.observe: false`, which sets UPS_DOCTOR_OBSERVE=0), once the program
# imports torch this records, without changing the program: the process group it forms
# (`init_process_group`: backend, rank, world size, store address), its optimizer steps and their
# time, the time each step waits in `DataLoader.__next__` and in DDP's forward, and a ledger of
# every `torch.distributed` collective it issues (op, sequence number per group, shapes, dtype,
# the call site), the DataLoader worker processes it starts (id, pid, start method), and a rank's
# uncaught exception (`sys.excepthook`, chained). Markers go on the wire the helper uses (src/protocol.rs): the program's thread
# only appends to a bounded queue; a daemon thread writes it in batches of whole lines of at most
# PIPE_BUF bytes (lines of several processes on one FIFO never mix). A full queue drops markers
# and counts them; the count goes out in every `observer` marker. Torch is never imported here.

_WATCH = ("torch", "torch.distributed", "torch.nn.parallel.distributed")
_QUEUE_MAX = 8192
_WORKERS_MAX = 64
_PIPE_BUF = 4096
# The collectives of a rank ups-doctor keeps (`LEDGER_KEPT`, crates/core/src/schema/observed.rs).
_LEDGER_KEPT = 32
_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "gather", "gather_object", "scatter",
    "scatter_object_list",
)


# How long a thread of the program's waits to send what it must say before it goes on: at exit
# (ups-doctor reads the pipe whenever it is not busy; a full pipe then drops the last markers),
# and an uncaught error or a `starts` (the run's verdict rests on them: longer).
_EXIT_WAIT_S = 1.0
_SAY_WAIT_S = 5.0


def _writable(fd, deadline):
    """Whether the pipe has room for a write of at most `_PIPE_BUF` bytes before `deadline`
    (a pipe with a free slot takes one whole without blocking). `poll`, not `select`: a program
    with many files open has descriptors past `select`'s 1024."""
    import select

    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        events = poller.poll(left * 1000.0)
        if events:
            return any(e & (select.POLLOUT | select.POLLERR | select.POLLHUP) for _, e in events)


class _Observer:
    # Its attributes as slots, which the hooks read and write every step: an instance of more than
    # 30 attributes keeps them in a dict of its own, slower to read and write.
    __slots__ = ("fd", "fifo", "tagged", "lock", "write_lock", "pg_lock", "queue", "dropped", "skipped",
        "wake", "thread", "stopping", "forked", "rank", "world_size", "seq", "patched", "optimizer", "steps",
        "last_step_at", "data_ms", "forward_ms", "collective_ms", "backward_ms", "collective_total_ms",
        "in_backward", "samples", "history", "sched_base", "summary_sent_at", "summarised", "helper_steps",
        "workers_sent", "step_marker", "pg", "read_count", "one_count", "issued_at_step", "issued_sent", "spans",
        "spans_at_step", "issued_base", "stop_stacks", "count_steps", "counter", "tail", "tail_count",
        "tail_ms", "flight_answered", "backward_in_step")

    def __init__(self, fd, fifo):
        import collections
        import threading

        # The FIFO is opened on the first write: most Python processes of a run never send.
        self.fd, self.fifo, self.tagged = fd, fifo, fifo is not None
        # Held while markers are put in or taken from the queue: the program's hooks take it.
        self.lock = threading.Lock()
        # Held while taken markers are written, so that they go out in order: never by a hook of
        # the program's, which must not wait while ups-doctor reads the pipe slowly (a full pipe).
        self.write_lock = threading.Lock()
        # Held while the group's count is read, a C++ call that lets go of the GIL (see `at_exit`).
        self.pg_lock = threading.Lock()
        self.queue = collections.deque()
        self.dropped = 0
        # Returned collectives counted but not sent (`_take`), not yet told.
        self.skipped = 0
        self.wake = threading.Event()
        self.thread = None
        # Set at exit: the sending thread stops (`at_exit`).
        self.stopping = False
        # A process forked from the one that made this observer (`after_fork`): its exit is not
        # the program's (a helper child that ends through `sys.exit` runs the exit handlers too).
        self.forked = False
        self.rank = None
        self.world_size = None
        self.seq = {}
        self.patched = set()
        self.optimizer = None
        self.steps = 0
        # Whether the last step counted had a backward in it (see `on_step`).
        self.backward_in_step = False
        self.last_step_at = None
        self.data_ms = self.forward_ms = self.collective_ms = self.backward_ms = 0.0
        # Every timed collective's time over the whole run, in steps or between them (a
        # framework's syncs before a loop, an evaluation's gathers): where a rank waits for
        # another's work that no step holds.
        self.collective_total_ms = 0.0
        self.in_backward = False
        self.samples = 0
        self.history = collections.deque(maxlen=256)
        # The steps done, the main thread's time on a CPU and waiting for one (the kernel's
        # `schedstat`) and the pid, at the first timed step: a rank slowed by a crowded machine
        # waits for a CPU, one with more work of its own runs longer (`cpu_per_step`). False
        # where the kernel keeps none.
        self.sched_base = None
        self.summary_sent_at = 0.0
        self.summarised = None
        self.helper_steps = False
        self.workers_sent = 0
        # The step marker still in the queue (`on_step`), which `_take` lets go of.
        self.step_marker = None
        # The default group's own count of the collectives issued on it (its sequence number),
        # which counts those issued from C++ too (DDP's gradient reductions), read once a step
        # and by the sending thread; `spans` the part of it the Python collectives account for.
        self.pg = None
        # Its count's reader (`issued`), looked up once.
        self.read_count = None
        # Its one backend is gloo or NCCL, whose count moves by one with each collective of
        # `_ONE_ISSUE` (`_wrap_collective`); not a group of several backends, whose count is its
        # default one's (a CPU collective on a CUDA default does not move it).
        self.one_count = False
        self.issued_at_step = None
        self.issued_sent = None
        self.spans = 0
        self.spans_at_step = 0
        self.issued_base = 0
        # The file Python's stack goes to as SIGTERM stops this rank (`_stack_at_sigterm`).
        self.stop_stacks = None
        # Writes the step count into a file this process maps (`_step_counter`): None until the
        # first step, False where there is none.
        self.count_steps = None
        self.counter = None
        # The newest collectives, kept in a file this process maps (`_open_tail`): None until
        # the first, False where there is none; `tail_count` those written.
        self.tail = None
        self.tail_count = 0
        self.tail_ms = None
        # This process answered ups-doctor's request for its Flight Recorder entries
        # (`answer_flight`), or has none to give.
        self.flight_answered = False

    # -- the wire -------------------------------------------------------------------------
    def send(self, marker, urgent=False):
        if len(self.queue) >= _QUEUE_MAX:
            self.dropped += 1
            return False
        marker["mono_ns"] = time.monotonic_ns()
        self.queue.append(marker)
        if self.thread is None:
            self._start()
        if urgent:
            self.wake.set()
        return True

    def lost_group(self):
        """The group's count could not be read (a hook's read, without `pg_lock`): read no more."""
        with self.pg_lock:
            self.pg = self.read_count = None

    def _start(self):
        import threading

        self.thread = threading.Thread(target=self._run, name="ups-doctor-observer", daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping:
            self.wake.wait(0.25)
            self.wake.clear()
            if self.stopping:
                return
            # The once-a-second summary is made here only, never in the program's step hook (its
            # medians cost that hook about 17,000 instructions a step, counted with callgrind).
            try:
                self.summary()
            except RuntimeError:  # the history changed while it was read: next time
                pass
            self.send_issued()
            self.flush()
            self.answer_flight()

    def answer_flight(self):
        """PyTorch's Flight Recorder entries of this rank (every collective of every group, C++
        ones included: DDP's gradient all-reduces), once, when ups-doctor asks for them: it makes
        `$UPS_DOCTOR_STOP_STACKS/flight-request` as a rank fails or the ranks are found hung, and
        reads `flight-PID.json` after the run. From this thread, which a rank waiting in a
        collective (the GIL let go) leaves free; a look for the request file every 0.25 s costs
        one `stat`. Under `pg_lock`, as a read of the group's count: never under way at exit."""
        if self.flight_answered or self.pg is None or self.forked:
            return
        folder = os.environ.get(_STOP_STACKS)
        if not folder or not os.path.exists(os.path.join(folder, "flight-request")):
            return
        self.flight_answered = True
        with self.pg_lock:
            if self.pg is None:
                return
            try:
                from torch._C._distributed_c10d import _dump_fr_trace_json

                text = _dump_fr_trace_json(True, False)
            except Exception as e:  # an older torch, a backend that records nothing
                import json

                text = json.dumps({"error": f"{type(e).__name__}: {e}"})
        path = os.path.join(folder, f"flight-{os.getpid()}.json")
        try:
            with open(path + ".part", "w") as out:
                out.write(text if isinstance(text, str) else text.decode(errors="replace"))
            os.replace(path + ".part", path)
        except OSError:
            pass

    def _tag(self, marker):
        if marker.get("t") == "worker":
            # Names the worker's own pid; on a FIFO it goes to the rank of the worker's parent
            # (the rank that sent it), and claims no rank for the worker.
            return
        rank = self.rank
        if rank is None:
            rank = _env_int("RANK")
        if rank is None and self.tagged and marker.get("t") in ("step", "observer") and self.world_size is None:
            # Training with no process group and no RANK: the one process that trains is shown as
            # rank 0; its `observer` marker says it never formed a group.
            rank = 0
        if rank is not None:
            marker["rank"] = rank
        marker["pid"] = os.getpid()

    def flush(self, wait_s=None):
        """Sends what is queued. The markers are taken under `lock` and written under
        `write_lock` only, so a hook of the program's that queues one never waits for a write to a
        full pipe. From a thread of the program's (an error, `starts`, exit), `wait_s` bounds the
        wait for an earlier write and for room in the pipe: what cannot go by then is dropped (and
        counted), never the program held."""
        if wait_s is None:
            self.write_lock.acquire()
        elif not self.write_lock.acquire(timeout=wait_s):
            return
        try:
            deadline = None if wait_s is None else time.monotonic() + wait_s
            with self.lock:
                chunks = self._take()
            for chunk in chunks:
                self._write(chunk, deadline)
        finally:
            self.write_lock.release()

    def _take(self):
        """The queued markers, taken from the queue and encoded: chunks of at most `_PIPE_BUF`
        bytes (a pipe writes each whole)."""
        global _ENCODER
        if _ENCODER is None:
            import json

            # One encoder for every marker: `json.dumps` with options makes a new one each call.
            _ENCODER = json.JSONEncoder(allow_nan=False, default=str)
        chunks, chunk = [], b""
        # ups-doctor keeps a rank's newest `_LEDGER_KEPT` collectives: of a batch with more, the
        # older ones that have returned are counted (`skipped`, on the next one sent), not sent.
        # A program issuing hundreds a second spent more on encoding them than on the wrapper.
        # (Returns of ones sent before, `_again`, are always sent: they add no entry.)
        # A collective's entry is queued as a list (`_COLL_*`, made into its marker here).
        over = sum(1 for m in self.queue if m.__class__ is list and m[_COLL_STATE] != _AGAIN) - _LEDGER_KEPT
        skipped, self.skipped = self.skipped, 0
        while self.queue:
            marker = self.queue.popleft()
            if marker is self.step_marker:
                self.step_marker = None
            collective = marker.__class__ is list
            if collective:
                entry = marker
                if over > 0 and entry[_COLL_STATE] != _AGAIN:
                    over -= 1
                    if entry[_COLL_MS] is not None:
                        skipped += 1
                        continue
                marker = _collective_marker(entry)
                if skipped:
                    marker["skipped"], skipped = skipped, 0
                _describe(marker)
            if self.tagged:
                self._tag(marker)
            try:
                line = (_ENCODER.encode(marker) + "\n").encode()
            except ValueError:
                line = None
            if collective:
                # The count goes once: not again with this one's return, nor lost with a line
                # that could not go.
                carried = marker.pop("skipped", 0)
                if line is None or len(line) > _PIPE_BUF:
                    skipped += carried
                elif "ms" not in marker:
                    entry[_COLL_STATE] = _SENT  # still running: its wrapper sends its duration
            if line is None:
                continue
            if len(line) > _PIPE_BUF:
                self.dropped += 1
                continue
            if len(chunk) + len(line) > _PIPE_BUF:
                chunks.append(chunk)
                chunk = b""
            chunk += line
        if chunk:
            chunks.append(chunk)
        self.skipped = skipped  # none sent after them: with the next batch
        return chunks

    def _write(self, data, deadline=None):
        if self.fd is None:
            try:
                # Non-blocking open fails at once if nobody reads; then writes block as a pipe's do
                # (in this thread only).
                self.fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                os.set_blocking(self.fd, True)
            except OSError:
                self.dropped += data.count(b"\n")
                return
        try:
            if deadline is not None and not _writable(self.fd, deadline):
                self.dropped += data.count(b"\n")
                return
            os.write(self.fd, data)
        except OSError:
            self.dropped += data.count(b"\n")

    def at_exit(self):
        # The sending thread ends here, before the interpreter finalizes: a daemon thread that
        # runs on into finalizing is ended by `pthread_exit` when it next takes the GIL, which
        # aborts the process when a C++ frame is on its stack (see `forget_group`). Waited for
        # briefly: a write blocked on a full pipe must not hold the program's exit.
        thread = self.thread
        if thread is not None:
            self.stopping = True
            self.wake.set()
            thread.join(1.0)
        # `exiting`: the program's own code has finished (atexit handlers run once it returned or
        # called `sys.exit`); a crash after this marker is one of Python shutting down. Not from
        # a forked child: the rank it was forked from goes on.
        self.summary(force=True, exiting=not self.forked)
        self.send_issued()
        self.forget_group()
        self.flush(wait_s=_EXIT_WAIT_S)

    def forget_group(self):
        """No read of the group's count from here on, and none under way when it returns.

        At exit this keeps the program alive to its end: the sending thread is a daemon, and a
        daemon thread that takes the GIL back while the interpreter finalizes is ended with
        `pthread_exit`, whose unwinding through pybind11's GIL guard (a destructor, so noexcept)
        aborts the whole process: SIGABRT, "terminate called without an active exception". A read
        of the count lets go of the GIL, so one under way as the program ended did that (seen once,
        under load). atexit handlers run before finalizing starts."""
        with self.pg_lock:
            self.pg = self.read_count = None

    def after_fork(self):
        import collections
        import threading

        if self.stop_stacks is not None:
            # The parent's file is not the child's, and a DataLoader worker is not a rank.
            import faulthandler
            import signal

            try:
                faulthandler.unregister(signal.SIGTERM)
            except Exception:
                pass
            self.stop_stacks = None
        # The parent's step counter is mapped here too: the child never writes it, and makes its
        # own if it steps (a rank forked by its launcher; a DataLoader worker does not step).
        self.count_steps = self.counter = None
        self.tail, self.tail_count, self.tail_ms = None, 0, None

        # A forked child (a DataLoader worker) issues no collective; the parent's group may have
        # been mid-call at the fork, so the child never touches it.
        self.pg = self.read_count = None
        self.forked = True
        self.flight_answered = True
        # What the parent last summarised may still sit in its own queue, unsent (and lost if
        # it crashes): the child's summary at exit goes out whatever it holds.
        self.summarised = None
        self.sched_base = None if self.sched_base is not False else False
        self.queue = collections.deque()
        self.step_marker = None
        self.skipped = 0
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.pg_lock = threading.Lock()
        self.thread = None

    # -- what is recorded -----------------------------------------------------------------
    def use_group(self, pg):
        """The default group whose count `issued` reads, and its reader, looked up once."""
        with self.pg_lock:
            self.pg, self.read_count = pg, getattr(pg, "_get_sequence_number_for_group", None)

    def issued(self):
        """The default group's count of collectives issued on it so far; None without a group or
        where its backend keeps no count."""
        with self.pg_lock:
            read = self.read_count
            if read is None:
                return None
            try:
                return read()
            except Exception:
                self.pg = self.read_count = None
                return None

    def send_issued(self):
        """The group's count, when it moved: on a hang, how far each rank got, counting the
        collectives the ledger cannot see. `unseen`: those not issued through torch.distributed's
        Python functions (DDP's gradient reductions, from C++)."""
        n = self.issued()
        if n is None or n == self.issued_sent:
            return
        self.issued_sent = n
        self.send({"t": "issued", "n": n, "unseen": max(n - self.spans - self.issued_base, 0)})

    def summary(self, force=False, exiting=False):
        now = time.monotonic()
        if not force and now - self.summary_sent_at < 1.0:
            return
        state = (self.steps, self.world_size, sum(self.seq.values()), self.dropped)
        if self.steps == 0 and self.world_size is None and not self.seq or state == self.summarised and not exiting:
            return
        self.summary_sent_at, self.summarised = now, state

        # A copy, taken whole (the main thread appends to the history as it steps), by column
        # (in C: at exit this runs in the program's thread).
        history = list(self.history)
        columns = list(zip(*history)) if history else [()] * 6

        def median(i):
            values = columns[i]
            if i == 4:  # `unseen`, None where the count was not read; the times are never None
                values = [v for v in values if v is not None]
            values = sorted(values)
            return round(values[len(values) // 2], 3) if values else None

        marker = {"t": "observer", "steps": self.steps, "timed_steps": len(history),
                  "step_ms": median(0) or 0.0, "data_ms": median(1) or 0.0, "forward_ms": median(2) or 0.0,
                  "collective_ms": median(3) or 0.0, "distributed": self.world_size is not None,
                  "dropped": self.dropped}
        if self.collective_total_ms:
            marker["collective_total_ms"] = round(self.collective_total_ms, 3)
        backward = median(5)
        if backward:
            marker["backward_ms"] = backward
        unseen = median(4)
        if unseen is not None:
            marker["unseen_per_step"] = unseen
        cpu = self.cpu_per_step()
        if cpu is not None:
            marker["cpu_run_ms"], marker["cpu_wait_ms"], threads = cpu
            if threads is not None:
                marker["threads_run_ms"], marker["threads_wait_ms"] = threads
        # The intra-op threads its PyTorch computes with and the CPUs it may run on: ranks whose
        # threads together outnumber the CPUs wait for each other's (torchrun sets one a rank for it).
        torch = sys.modules.get("torch")
        get_num_threads = getattr(torch, "get_num_threads", None)
        if get_num_threads is not None:
            try:
                marker["intra_op_threads"] = int(get_num_threads())
                marker["cpus"] = len(os.sched_getaffinity(0))
            except Exception:
                pass
        # The main thread's nice value (`renice`, `nice`, Ray's workers at 15): where the CPUs are
        # shared, any process at a lower one runs first.
        try:
            marker["nice"] = os.getpriority(os.PRIO_PROCESS, os.getpid())
        except (AttributeError, OSError):
            pass
        if exiting:
            marker["exiting"] = True
        if self.forked:
            marker["forked"] = True
        self.send(marker)

    def _schedstat(self):
        """The main thread's time on a CPU and runnable but waiting for one so far, in ns, and
        this process's pid; None where the kernel keeps no `schedstat` (then never read again)."""
        if self.sched_base is False:
            return None
        pid = os.getpid()
        try:
            with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as f:
                run, wait = (int(v) for v in f.read().split()[:2])
        except (OSError, ValueError):
            self.sched_base = False
            return None
        return run, wait, pid

    @staticmethod
    def _threads_schedstat(pid):
        """Every other thread's time on a CPU and waiting for one so far, in ns, by thread id
        (PyTorch's intra-op threads, gloo's, DataLoader's pin-memory thread, this observer's)."""
        times = {}
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return times
        for tid in tids:
            if tid == str(pid):
                continue
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    run, wait = (int(v) for v in f.read().split()[:2])
            except (OSError, ValueError):
                continue
            times[tid] = (run, wait)
        return times

    def cpu_per_step(self):
        """The main thread's mean time a step on a CPU and runnable but waiting for one, in ms,
        since the first timed step (`on_step` reads the base then: a run of a few dozen fast
        steps is over within one summary), and the same summed over the process's other threads
        (those started since counted whole; None where they were not read); None before, or
        where the kernel keeps none."""
        base = self.sched_base
        if not base:
            return None
        now = self._schedstat()
        if now is None or now[2] != base[3] or self.steps <= base[0]:
            return None
        n = self.steps - base[0]
        threads = None
        if base[4] is not None:
            run = wait = 0
            for tid, (r, w) in self._threads_schedstat(now[2]).items():
                r0, w0 = base[4].get(tid, (0, 0))
                run, wait = run + max(r - r0, 0), wait + max(w - w0, 0)
            threads = round(run / n / 1e6, 3), round(wait / n / 1e6, 3)
        return round((now[0] - base[1]) / n / 1e6, 3), round((now[1] - base[2]) / n / 1e6, 3), threads

    def on_step(self, optimizer, args=None, kwargs=None):
        """The optimizer's step post hook (registered as it is: `optimizer, args, kwargs`). It runs
        once a training step in the program's thread, so what it does is written out here, not
        called (each Python call costs a few hundred instructions), with one clock read: the
        step's time, its marker's stamp and the step counter's are the same `CLOCK_MONOTONIC`
        reading (`perf_counter` is that clock too). The once-a-second summary is the sending
        thread's (`_run`)."""
        if self.optimizer != id(optimizer):
            if self.optimizer is not None:
                return
            self.optimizer = id(optimizer)
        # The same optimizer stepped again with no backward and no batch since, where the step
        # before had a backward: the same training step. DeepSpeed's ZeRO-1/2 optimizer steps the
        # optimizer it wraps once per parameter group (TRL's SFT script under ZeRO-2: two calls a
        # step, 40 "steps" for 20, each half a step).
        backward = self.backward_ms
        if backward == 0.0 and self.data_ms == 0.0 and self.backward_in_step:
            return
        self.backward_in_step = backward > 0.0
        now = time.monotonic_ns()
        step = self.steps
        self.steps = step + 1
        data, forward, collective, samples = self.data_ms, self.forward_ms, self.collective_ms, self.samples
        self.data_ms = self.forward_ms = self.collective_ms = self.backward_ms = 0.0
        self.samples = 0
        # Collectives of this step issued other than through the Python functions: DDP's. The
        # group's count read without `pg_lock` (`issued`), as the collective's own hooks read it:
        # a thread of the program's, which never runs while the program exits (`forget_group`).
        issued, spans, unseen = None, self.spans, None
        read = self.read_count
        if read is not None:
            try:
                issued = read()
            except Exception:
                self.lost_group()
            if issued is not None and self.issued_at_step is not None:
                unseen = issued - self.issued_at_step - (spans - self.spans_at_step)
        self.issued_at_step, self.spans_at_step = issued, spans
        last, self.last_step_at = self.last_step_at, now
        step_ms = 0.0
        if last is not None:
            step_ms = (now - last) / 1e6
            self.history.append((step_ms, data, forward, collective, unseen, backward))
            if self.sched_base is None:
                base = self._schedstat()
                if base is not None:
                    self.sched_base = (self.steps, *base, self._threads_schedstat(base[2]))
        if self.helper_steps:
            return
        if "ups_doctor" in sys.modules:
            self.helper_steps = True
            return
        # The step's marker; while the one of an earlier step still waits in the queue, that one
        # says this step too (its number, stamp and summed times), so a program stepping faster
        # than the queue is sent (every 0.25 s) sends one step marker per batch, not one a step
        # (each costs encoding here and reading in ups-doctor). Under `lock`: `_take` takes it
        # from the queue under it.
        compute = step_ms - data
        if compute < 0.0:
            compute = 0.0
        lock = self.lock
        lock.acquire()  # not `with`: its look-up of `__enter__` and `__exit__` costs more
        try:
            marker = self.step_marker
            if marker is not None:
                marker["step"] = step
                marker["data_ms"] += data
                marker["compute_ms"] += compute
                marker["samples"] += samples
                marker["mono_ns"] = now
            elif len(self.queue) >= _QUEUE_MAX:  # `send`, written out
                self.dropped += 1
            else:
                marker = {"t": "step", "step": step, "loss": None, "data_ms": data, "compute_ms": compute,
                          "samples": samples, "mono_ns": now}
                self.queue.append(marker)
                self.step_marker = marker
                if self.thread is None:
                    self._start()
        finally:
            lock.release()
        count = self.count_steps
        if count is None:
            count = self._step_counter()
        if count:
            count[0] = step + 1
            count[1] = now

    def _step_counter(self):
        """The steps done and when the last ended, kept in a 16-byte file this process maps in
        ups-doctor's folder for it (`$UPS_DOCTOR_STOP_STACKS/PID.steps`): the page outlives the
        process, so a rank that dies before its last step markers are sent (a segfault, the OOM
        killer's SIGKILL, within the 0.25 s the sending thread waits) still says how far it got.
        Two writes a step, into this process's own file (a forked child makes its own)."""
        self.count_steps = False
        folder = os.environ.get(_STOP_STACKS)
        if not folder:
            return False
        try:
            import mmap

            fd = os.open(os.path.join(folder, f"{os.getpid()}.steps"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, 16)
                self.counter = mmap.mmap(fd, 16)
            finally:
                os.close(fd)
            # Its two u64s, written one by one (a `pack_into` costs more).
            self.count_steps = _words(self.counter, "Q")
        except Exception:
            pass
        return self.count_steps

    def _open_tail(self):
        """The file this process keeps the collectives the program issued in
        (`$UPS_DOCTOR_STOP_STACKS/PID.colls`, `_TAIL_*` below), mapped, or False where there is
        none: the page outlives the process, so a rank that gloo aborts, a segfault or a SIGKILL
        stops in a collective before its ledger entries are sent (the sending thread waits 0.25 s)
        still says which it was in and which it issued before. The collective's wrapper
        (`_wrap_collective`) writes an entry's slot as it is issued, before it is queued (the
        sending thread makes the entry's sizes text in place), and marks it returned, unless newer
        ones took the slot since."""
        self.tail = False
        folder = os.environ.get(_STOP_STACKS)
        if not folder:
            return False
        try:
            import mmap

            if _TAIL_SLOT_PACK is None:
                _tail_structs()
            size = _TAIL_SLOTS * _TAIL_SLOT
            fd = os.open(os.path.join(folder, f"{os.getpid()}.colls"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, size)
                self.tail = mmap.mmap(fd, size)
                # Each slot's milliseconds, written as one f64 (a `pack_into` costs more).
                self.tail_ms = _words(self.tail, "d")
            finally:
                os.close(fd)
        except Exception:
            pass
        return self.tail


# The file a rank's newest collectives are kept in (`_Observer._open_tail`; read by
# `collective_tail` in src/harness/os/stacks.rs): `_TAIL_SLOTS` slots of `_TAIL_SLOT` bytes, the
# n-th entry in slot n % _TAIL_SLOTS, so their order is their stamps'. A slot: its state (u8: 0
# never written, 1 issued, 2 returned), 7 unused bytes, then little-endian u64s: the
# `CLOCK_MONOTONIC` nanoseconds it was issued at, its sequence number in its group, its place in
# the default group's own count (0: not known), an f64 of the milliseconds it took (once
# returned), and `_TAIL_TEXT` bytes of UTF-8, NUL-padded: op, group, sizes, dtype and call site,
# separated by U+001F.
_TAIL_SLOTS = 32
_TAIL_SLOT = 256
_TAIL_TEXT = _TAIL_SLOT - 40
_TAIL_TEXTS = {}
_TAIL_SLOT_PACK = None


def _tail_text(site, op, group, dtype, shapes):
    """A slot's text, worked out once for each call site, op, group, dtype and sizes."""
    text = "\x1f".join((op, group, _shapes_text(shapes), _dtype_text(dtype), site)).encode()[:_TAIL_TEXT]
    if len(_TAIL_TEXTS) < _CACHE_MAX:
        _TAIL_TEXTS[(site, op, group, dtype, *shapes)] = text
    return text


def _tail_structs():
    global _TAIL_SLOT_PACK
    import struct

    _TAIL_SLOT_PACK = struct.Struct(f"<B7xQQQd{_TAIL_TEXT}s").pack_into


class _Packed:
    """`memoryview(buf).cast(code)`'s item assignment, little-endian whatever the machine's order."""

    def __init__(self, buf, code):
        import struct

        self.buf, self.pack = buf, struct.Struct("<" + code).pack_into

    def __setitem__(self, i, value):
        self.pack(self.buf, i * 8, value)


def _words(buf, code):
    """`buf` (a mapped file) as little-endian 8-byte words that an item assignment writes, `code`
    `Q` (u64) or `d` (f64): a memoryview's is much cheaper than a `pack_into`."""
    return memoryview(buf).cast(code) if sys.byteorder == "little" else _Packed(buf, code)


_observer = None
_ENCODER = None


def _program_file(name):
    """Whether a frame's file is the program's own: not the standard library's, an installed
    package's or a `sitecustomize`'s (this file, or one it shadows)."""
    return (not name.startswith("<") and "-packages/" not in name and "/lib/python3" not in name
            and os.path.basename(name) != "sitecustomize.py")


def _innermost(tb, keep):
    """The innermost (code, line) of a traceback whose file `keep` accepts; None when none does."""
    found = None
    while tb is not None:
        if keep(tb.tb_frame.f_code.co_filename):
            found = (tb.tb_frame.f_code, tb.tb_lineno)
        tb = tb.tb_next
    return found


def _user_frame(tb):
    """`train.py:52 in train`: the innermost frame of a traceback in the program's own code; None
    when there is none."""
    found = _innermost(tb, _program_file)
    return found and f"{os.path.basename(found[0].co_filename)}:{found[1]} in {found[0].co_name}"


def _tensor_passing_frame(tb):
    """The function of the innermost frame in torch's `multiprocessing` package, where tensors pass
    between processes (`rebuild_storage_fd`: a batch a DataLoader worker put on the queue is taken
    by asking that worker for its shared memory): an error raised there is about the other
    process, not the program's line. None when the traceback does not pass through it."""
    found = _innermost(tb, lambda name: f"torch{os.sep}multiprocessing{os.sep}" in name)
    return found and found[0].co_name


_RANK_PID = "UPS_DOCTOR_RANK_PID"


def _frame_in_text(text):
    """The innermost program frame of a traceback quoted inside an exception's message (PyTorch
    re-raises a DataLoader worker's error with the worker's `Original Traceback` in it):
    `train.py:81 in __getitem__`."""
    import re

    found = None
    for m in re.finditer(r'File "([^"]+)", line (\d+), in (\S+)', text):
        if _program_file(m.group(1)):
            found = f"{os.path.basename(m.group(1))}:{m.group(2)} in {m.group(3)}"
    return found


def _report_uncaught(observer):
    """Chains `sys.excepthook`: a rank's uncaught exception becomes an `error` marker of that rank
    (type, message, the program's own frame), then the traceback prints as before. Under a
    launcher every rank's traceback goes to one shared stream, unprefixed: without this, which
    rank raised what cannot be told from the output. Only processes that are a rank (RANK set, or
    a process group formed) send, not a process a rank started; the launcher's own error is not a
    rank's."""
    previous = sys.excepthook
    # A process a rank starts (an evaluation script, a tokenizer server) inherits `RANK`: only the
    # first process that saw it is the rank. The variable is ups-doctor's own, named like the rest.
    if os.environ.get("RANK") is not None and _RANK_PID not in os.environ:
        os.environ[_RANK_PID] = str(os.getpid())

    def hook(kind, value, tb):
        _send_uncaught(observer, kind, value, tb)
        previous(kind, value, tb)

    sys.excepthook = hook


def _send_uncaught(observer, kind, value, tb, spawned=False):
    """A rank's uncaught exception as an `error` marker (see `_report_uncaught`); `spawned`: raised
    in a rank `torch.multiprocessing` started, which is a rank whatever its environment says."""
    try:
        by_env = _env_int("RANK") is not None and os.environ.get(_RANK_PID) == str(os.getpid())
        if "ups_doctor" not in sys.modules and (observer.rank is not None or by_env or spawned):
            # Raised while another was handled (clean-up code that failed too: no `from`, the
            # context kept): the first of the chain is where it began, said first.
            root = value
            while root.__cause__ is None and not root.__suppress_context__ and root.__context__ is not None:
                root = root.__context__
            message = _exception_words(type(root), root)
            if root is not value:
                message = f"{message}; while handling it: {_exception_words(kind, value)}"
            # A worker's error re-raised in the rank: where the worker's code failed, not
            # the rank's `for batch in loader` line.
            where = _frame_in_text(str(root)) if "Original Traceback" in str(root) else None
            where = where or _user_frame(root.__traceback__) or _user_frame(tb)
            passing = _tensor_passing_frame(root.__traceback__) or _tensor_passing_frame(tb)
            if passing:
                where = f"{where}; raised in torch's `{passing}`" if where else f"raised in torch's `{passing}`"
            observer.send({"t": "error", "message": f"{message} ({where})" if where else message}, urgent=True)
            observer.flush(wait_s=_SAY_WAIT_S)
    except Exception:  # the observer never changes how the program ends
        pass


def _exception_words(kind, value):
    """`RuntimeError: its message` (a message of several lines: its first … its last)."""
    lines = [line for line in str(value).strip().splitlines() if line.strip()]
    text = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1].strip()}" if lines else ""
    return f"{kind.__name__}: {text}" if text else kind.__name__


def _report_spawned_errors(observer, spawn):
    """`torch.multiprocessing`'s `spawn` and `start_processes` (`mp.spawn`, Lightning's
    `ddp_spawn`, Ignite's `Parallel`) run each rank's function inside `_wrap`, which catches its
    exception, pickles the traceback for the parent and exits 1: `sys.excepthook` never sees it,
    and the rank's own words reach the output only if the parent lives to raise them (a launcher
    torn down first loses them). `_wrap` is wrapped so that the rank's function's exception is
    sent as the rank's `error` marker first, then goes on as before. Wrapped in every process that
    imports torch, so that the parent hands the child the wrapped `_wrap` (pickled by name) and a
    child that unpickles it finds it."""
    import functools

    original = spawn._wrap

    @functools.wraps(original)
    def _wrap(fn, i, args, error_file):
        def rank_function(*a):
            try:
                return fn(*a)
            except Exception as e:
                _send_uncaught(observer, type(e), e, e.__traceback__, spawned=True)
                raise

        return original(rank_function, i, args, error_file)

    spawn._wrap = _wrap


def _report_own_ranks(observer, torch_mp, spawn):
    """A process ups-doctor started as one rank of a per-rank run (its marker pipe, its `RANK`)
    that starts processes of its own through `torch.multiprocessing` (`spawn` and
    `start_processes`: `mp.spawn`, Ignite's `Parallel`, Accelerate's `notebook_launcher`, a
    library's helper whose source ups-doctor never read) is a launcher, not a rank: the ranks are
    those processes, which the pipe does not reach. A `starts` marker says so (how many, how), so
    that no failure of theirs is taken for the watched process's own. Wrapped only in such a
    process: a launcher-style run's launcher is watched as one already."""
    original = spawn.start_processes

    def start_processes(fn, args=(), nprocs=1, *rest, **kwargs):
        try:
            if not observer.forked:
                method = kwargs.get("start_method", rest[2] if len(rest) > 2 else "spawn")
                observer.send({"t": "starts", "nprocs": int(nprocs), "start_method": str(method)}, urgent=True)
                observer.flush(wait_s=_SAY_WAIT_S)
        except Exception:  # the observer never changes what the program does
            pass
        return original(fn, args, nprocs, *rest, **kwargs)

    start_processes.__wrapped__ = original
    spawn.start_processes = start_processes
    if getattr(torch_mp, "start_processes", None) is original:
        torch_mp.start_processes = start_processes


def _env_int(name, default=None):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


_HERE = os.path.abspath(__file__)
# What the hot path works out once: a call site by the calling line, a shape's and a dtype's
# text. Bounded: a program that calls from or passes ever new ones stops adding, and works them
# out each time.
_SITES, _SHAPES, _DTYPES = {}, {}, {}
_CACHE_MAX = 4096


def _call_site(frame):
    """The innermost frame outside torch and this file from `frame` (the collective's caller)
    out: `train.py:40`; a frame of the user's own code (not in site-packages) is preferred. (The
    collective's wrapper looks a known calling instruction up in `_SITES` itself.)"""
    # Known by the calling instruction: a frame's line number is worked out from its code's
    # line table each time it is read, which for a long training function cost more than the
    # rest of the wrapper (about 12,000 instructions a call, counted with callgrind).
    # By the code's id, not the code: a code object's hash is worked out from its contents at
    # every lookup. The entry holds the code, so that id is not given to another while cached.
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    hit = _SITES.get(key)
    if hit is not None:
        return hit[1]
    first = None
    while frame is not None:
        name = frame.f_code.co_filename
        if name != _HERE and "/torch/" not in name and not name.startswith("<") and not name.endswith("sitecustomize.py"):
            if "-packages/" not in name:
                site = f"{os.path.basename(name)}:{frame.f_lineno}"
                if frame.f_code is code and len(_SITES) < _CACHE_MAX:
                    # The calling line is the user's own: it alone decides the site.
                    _SITES[key] = (code, site)
                return site
            first = first or frame
        frame = frame.f_back
    return f"{os.path.basename(first.f_code.co_filename)}:{first.f_lineno}" if first is not None else ""


def _describe(entry):
    """A collective's entry as it is sent: its tensors' sizes and dtype as text (`1x16,1x16`,
    `float32`), its duration rounded to the microsecond."""
    sizes = entry["shapes"]
    if sizes.__class__ is list:
        entry["shapes"] = _shapes_text(sizes)
        entry["dtype"] = _dtype_text(entry["dtype"])
    ms = entry.get("ms")
    if ms is not None:
        entry["ms"] = round(ms, 3)


def _shapes_text(sizes):
    """Tensors' sizes as torch gives them (a list of `torch.Size`), as text: `1x16,1x16`."""
    texts = []
    for size in sizes:
        text = _SHAPES.get(size)
        if text is None:
            text = "x".join(str(d) for d in size) or "scalar"
            if len(_SHAPES) < _CACHE_MAX:
                _SHAPES[size] = text
        texts.append(text)
    return ",".join(texts)


def _dtype_text(dtype):
    """A torch dtype as text (`float32`); "" stays "" (no tensor)."""
    if dtype == "":
        return ""
    text = _DTYPES.get(dtype)
    if text is None:
        text = _DTYPES[dtype] = str(dtype).replace("torch.", "")
    return text


def _tensors(value, out, tensor):
    """Up to 4 tensors of a collective's argument (`tensor`: torch's class): the argument, or
    those in lists or tuples of them."""
    if len(out) >= 4:
        return
    if isinstance(value, tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value[:4]:
            _tensors(v, out, tensor)


# A collective's entry as its wrapper queues it: a list of its op, group, sequence number in its
# group, tensors' sizes (a list of `torch.Size`) and dtype, call site, place in the default
# group's count (None: not known), stamp, milliseconds and span (None until it returns), and
# state: queued, sent without its duration (which its wrapper then queues again, as a copy in
# the state `_AGAIN`). `_take` makes its marker (`_collective_marker`).
_COLL_MS, _COLL_STATE = 8, 10
_QUEUED, _SENT, _AGAIN = 0, 1, 2


def _collective_marker(entry):
    """A collective's queued entry (`_COLL_*`) as its marker, the fields in the order the wrapper
    has always given them."""
    op, group, seq, shapes, dtype, site, pos, stamp, ms, span, _ = entry
    marker = {"t": "collective", "op": op, "group": group, "seq": seq, "shapes": shapes, "dtype": dtype,
              "site": site}
    if pos is not None:
        marker["pos"] = pos
    marker["mono_ns"] = stamp
    if ms is not None:
        marker["ms"] = ms
        if span is not None:
            marker["span"] = span
    return marker


_NOT_DATA = frozenset(("group", "async_op", "op", "src", "dst", "timeout", "group_src", "group_dst"))
# The collectives that issue exactly one on their group, so that its count moves by one: counted
# on torch 2.11's gloo, each alone in a 1-rank group (an uneven `all_gather` too); NCCL counts a
# call once as well, a coalesced one included (not counted here: no GPU). Not the `_object` ones
# (several: their sizes first), nor `monitored_barrier` (point-to-point, not counted).
_ONE_ISSUE = frozenset(("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "gather", "scatter"))
# The argument whose `__torch_function__` (or a torch function mode) takes a collective elsewhere:
# `relevant_args` in torch.distributed's functions.
_DISPATCHED_BY = ("tensor", "input_tensor", "input")


def _wrap_collective(dist, op, original):
    """Wraps one collective: its ledger entry is queued when the program issues it (what a hung
    rank waits in), without waking the observer's thread, which sends it within 0.25 s, while the
    rank waits (collectives release the GIL). One that returns before then is sent once, with its
    duration; one already sent is sent again when it returns. Measured on this 2-core machine, a
    wake per collective cost a 1-rank gloo loop of DDP steps with an `all_gather` each about 0.1
    ms a step (of 1.0 ms), and a second marker and `inspect`'s binding as much again."""
    import functools
    import inspect

    try:
        names = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        names = []
    # Where the arguments sit, worked out once: the group's position, and those that may hold the
    # tensors (not the group, the reduce op, a rank, a flag or a timeout).
    group_at = names.index("group") if "group" in names else None
    tensor = sys.modules["torch"].Tensor
    data_at = [i for i, name in enumerate(names) if name not in _NOT_DATA]
    # Its span known without a second read of the group's count (a pybind11 call that lets go of
    # the GIL: about 3,000 instructions): one of `_ONE_ISSUE`, on a group whose one backend counts
    # every collective (`one_count`), outside a coalescing manager (whose collectives are counted as
    # one at its end: 0 each inside), and not taken elsewhere by a torch function (a mode or a
    # tensor subclass: an export's tracing issues none). Anything else reads the count again.
    dispatched = getattr(getattr(sys.modules["torch"], "_C", None), "_has_torch_function_unary", None)
    coalescing = getattr(getattr(getattr(dist, "distributed_c10d", None), "_world", None), "pg_coalesce_state", None)
    one = op in _ONE_ISSUE and dispatched is not None and coalescing.__class__ is dict
    relevant = next((name for name in _DISPATCHED_BY if name in names), None)
    relevant_at = names.index(relevant) if relevant is not None else None

    mono, frame_at, sites = time.monotonic_ns, sys._getframe, _SITES

    # Runs for every collective the program issues, in its thread: what the observer does is
    # written out here, not called (each Python call costs a few hundred instructions), and one
    # clock read stamps the queued entry and its slot in the `.colls` file and starts its time
    # (`CLOCK_MONOTONIC`, `perf_counter`'s clock too, in ns: two reads a collective). The group's
    # count is read without `pg_lock` (`issued`): a thread of the program's, which never runs
    # while the program exits (`forget_group`).
    @functools.wraps(original)
    def collective(*args, **kwargs):
        obs = _observer
        try:
            group = kwargs.get("group") if kwargs else None
            n = len(args)
            if group is None and group_at is not None and group_at < n:
                group = args[group_at]
            name = "default" if group is None else str(getattr(group, "group_name", None) or id(group))
            seq = obs.seq.get(name, 0) + 1
            obs.seq[name] = seq
            tensors = []
            for i in data_at:
                if i >= n:
                    break
                value = args[i]
                # Told by its class first: `isinstance` of a list against torch's `Tensor` (through
                # its metaclass) costs about 200 ns, three times a tensor's; a subclass of either
                # still goes by `isinstance`.
                cls = value.__class__
                if cls is not list and cls is not tuple:
                    if cls is tensor or isinstance(value, tensor):
                        tensors.append(value)
                    elif isinstance(value, (list, tuple)):
                        _tensors(value, tensors, tensor)
                elif len(tensors) < 4:
                    # `_tensors`, its first level written out (a list of tensors, most often), not
                    # sliced where it holds no more than 4 (a slice is a new list).
                    for v in value if len(value) <= 4 else value[:4]:
                        if len(tensors) >= 4:
                            break
                        if v.__class__ is tensor or isinstance(v, tensor):
                            tensors.append(v)
                        elif isinstance(v, (list, tuple)):
                            _tensors(v, tensors, tensor)
            if kwargs:
                for key, value in kwargs.items():
                    if key not in _NOT_DATA:
                        _tensors(value, tensors, tensor)
            # Sizes and dtype as torch gives them: made text only for the entries sent (`_take`).
            k = len(tensors)
            if k == 1:
                shapes = [tensors[0].shape]
            elif k == 2:
                shapes = [tensors[0].shape, tensors[1].shape]
            else:
                shapes = [t.shape for t in tensors[:4]]
            dtype = tensors[0].dtype if k else ""
            # The call site (`_call_site`), known by the calling instruction.
            frame = frame_at(1)
            hit = sites.get((id(frame.f_code), frame.f_lasti))
            site = hit[1] if hit is not None else _call_site(frame)
            # Its place in the default group's own count (which DDP's collectives move too).
            before = pos = None
            sure = False
            if name == "default" or group is obs.pg:
                read = obs.read_count
                if read is not None:
                    try:
                        before = read()
                    except Exception:
                        obs.lost_group()
                if before is not None:
                    pos = before + 1
                    # Counted as one while it runs (a rank may hang in it), as many as it issued after.
                    obs.spans += 1
                    if one and obs.one_count and not coalescing:
                        if relevant_at is None:
                            sure = True
                        else:
                            value = args[relevant_at] if relevant_at < n else kwargs.get(relevant) if kwargs else None
                            sure = value is not None and not dispatched(value)
            now = mono()
            # Kept in the file this process maps (`_open_tail`), before it is queued: the
            # sending thread makes the entry's sizes text in place.
            tail = obs.tail
            if tail is None:
                tail = obs._open_tail()
            kept = None
            if tail:
                kept = obs.tail_count
                obs.tail_count = kept + 1
                text = _TAIL_TEXTS.get((site, op, name, dtype, *shapes))
                if text is None:
                    text = _tail_text(site, op, name, dtype, shapes)
                _TAIL_SLOT_PACK(tail, (kept % _TAIL_SLOTS) * _TAIL_SLOT, 1, now, seq, pos or 0, 0.0, text)
            # `send`, written out: queued without the lock (a deque's append is atomic), as a
            # list (`_COLL_*`), which costs less to make here than its marker's dict.
            entry = [op, name, seq, shapes, dtype, site, pos, now, None, None, _QUEUED]
            if len(obs.queue) >= _QUEUE_MAX:
                obs.dropped += 1
            else:
                obs.queue.append(entry)
                if obs.thread is None:
                    obs._start()
        except Exception:
            entry = before = kept = None
        result = original(*args, **kwargs) if kwargs else original(*args)
        if entry is not None:
            # From its stamp: the entry's slot and queueing come before (a microsecond or two).
            ms = (mono() - now) / 1e6
            obs.collective_ms += ms
            obs.collective_total_ms += ms
            span = None
            if sure:
                span = 1
            elif before is not None:
                read = obs.read_count
                if read is not None:
                    after = None
                    try:
                        after = read()
                    except Exception:
                        obs.lost_group()
                    if after is not None:
                        # `all_gather_object` and the like issue more than one.
                        span = after - before
                        obs.spans += span - 1
            # `returned`, written out: still queued, it goes out once with its duration; already
            # sent (`_take` marks it), it goes again with it.
            lock = obs.lock
            lock.acquire()
            try:
                if entry[10] == _SENT:  # `_COLL_STATE`: sent, without its duration
                    entry = [*entry[:7], mono(), ms, span, _AGAIN]
                    if len(obs.queue) >= _QUEUE_MAX:
                        obs.dropped += 1
                    else:
                        obs.queue.append(entry)
                else:
                    entry[8], entry[9] = ms, span  # `_COLL_MS`, and its span
            finally:
                lock.release()
            if kept is not None:
                # Its slot says it returned.
                tail = obs.tail
                if tail and obs.tail_count - kept <= _TAIL_SLOTS:
                    at = (kept % _TAIL_SLOTS) * _TAIL_SLOT
                    obs.tail_ms[(at + 32) >> 3] = ms
                    tail[at] = 2
        return result

    setattr(dist, op, collective)


_STOP_STACKS = "UPS_DOCTOR_STOP_STACKS"


def _stack_at_sigterm(obs):
    """A rank's Python stacks as SIGTERM stops it, written by the process itself into
    `$UPS_DOCTOR_STOP_STACKS/PID.txt` (Python's `faulthandler`, in the signal handler, at once,
    even while the rank waits in C++; then the signal does what it did before): where each rank
    was when its launcher stopped the others after one failed, which a launcher's teardown
    otherwise loses. A program's own SIGTERM handler (Lightning's, which runs only once the rank
    is back in Python) is kept: faulthandler's runs first and hands the signal on to it, whether
    the program set it before this or sets it later (`_keep_stack_at_sigterm`). Not where the
    program ignores SIGTERM; a forked child (a DataLoader worker) drops it. The file starts with
    the main thread's id, which faulthandler does not name."""
    import faulthandler
    import signal
    import threading

    folder = os.environ.get(_STOP_STACKS)
    if not folder or obs.stop_stacks is not None or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        return
    try:
        out = open(os.path.join(folder, f"{os.getpid()}.txt"), "w")
        out.write(f"main thread 0x{threading.main_thread().ident:016x}\n")
        out.flush()
        faulthandler.register(signal.SIGTERM, file=out, all_threads=True, chain=True)
        obs.stop_stacks = out
        _keep_stack_at_sigterm(obs, out.tell())
    except Exception:
        pass


def _keep_stack_at_sigterm(obs, header):
    """`signal.signal` wrapped so that a SIGTERM handler the program sets after
    `_stack_at_sigterm` does not replace faulthandler's, which would then never run: it is taken
    off (its saved action put back), the program's handler set as asked, and faulthandler's set
    again in front of it. Not once a stack was written (a handler that sets the default action
    and signals itself again, to die of it, would write a second), nor for SIG_IGN."""
    import faulthandler
    import functools
    import signal

    original = signal.signal
    if getattr(original, "_ups_doctor", False):
        return

    @functools.wraps(original)
    def set_handler(signum, handler):
        out = obs.stop_stacks
        if signum != signal.SIGTERM or out is None or obs.forked:
            return original(signum, handler)
        try:
            written = os.fstat(out.fileno()).st_size > header
        except Exception:
            written = True
        if written:
            return original(signum, handler)
        faulthandler.unregister(signal.SIGTERM)
        try:
            return original(signum, handler)
        finally:
            if handler != signal.SIG_IGN:
                faulthandler.register(signal.SIGTERM, file=out, all_threads=True, chain=True)
            else:
                obs.stop_stacks = None

    set_handler._ups_doctor = True
    signal.signal = set_handler


def _wrap_init(dist):
    import functools

    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        obs = _observer
        rank = kwargs.get("rank", -1)
        if isinstance(rank, int) and rank >= 0:
            obs.rank = rank
        # No `begin` marker: the rank's last phase would stay `dist.init` after it returned.
        # The stack at SIGTERM is set up before the rendezvous, not after it: a rank its launcher
        # stops while it waits there for a rank that never came (one that exited before it
        # joined) shows `init_process_group` as where it was.
        _stack_at_sigterm(obs)
        try:
            joining = {"t": "joining"}
            for key, var in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
                value = kwargs.get(key, os.environ.get(var))
                if value is not None and int(value) >= 0:
                    joining[key] = int(value)
            obs.send(joining, urgent=True)
        except Exception:
            pass
        result = original(*args, **kwargs)
        try:
            obs.rank, obs.world_size = int(dist.get_rank()), int(dist.get_world_size())
            obs.use_group(dist.distributed_c10d._get_default_group())
            obs.issued_base = obs.issued() or 0
            backend = str(dist.get_backend())
            obs.one_count = backend in ("gloo", "nccl")
            store = kwargs.get("init_method") or (args[1] if len(args) > 1 else None)
            if not store:
                store = "env://{}:{}".format(os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?"))
            if kwargs.get("store") is not None:
                store = type(kwargs["store"]).__name__
            group = {"t": "group", "backend": backend, "rank": obs.rank, "world_size": obs.world_size,
                     "store": str(store)}
            # Where this process sits on its node (what a launcher of several nodes says:
            # torchrun, Ray Train): the node's first rank is `rank - local_rank`.
            local = os.environ.get("LOCAL_RANK", "")
            if local.isdigit() and int(local) <= obs.rank:
                group["local_rank"] = int(local)
            obs.send(group, urgent=True)
        except Exception:
            pass
        return result

    dist.init_process_group = init_process_group
    destroy = getattr(dist, "destroy_process_group", None)
    if destroy is None:
        return

    @functools.wraps(destroy)
    def destroy_process_group(group=None, *args, **kwargs):
        # The default group (no argument, or the group itself) is let go before it is destroyed:
        # its count is read no more, and the observer holds no reference that keeps it alive.
        obs = _observer
        if obs is not None and (group is None or group is obs.pg):
            obs.forget_group()
        return destroy(group, *args, **kwargs)

    dist.destroy_process_group = destroy_process_group


def _batch_size(batch):
    """Samples in a batch as a DataLoader yields it: the first dimension of its first tensor
    (a tensor, or one inside a tuple, list or dict); 0 when it holds none."""
    if batch.__class__ is tuple or batch.__class__ is list:  # most often: (inputs, targets)
        shape = getattr(batch[0], "shape", None) if batch else None
        if shape is not None:
            return int(shape[0]) if len(shape) else 1
    for _ in range(3):
        shape = getattr(batch, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else 1
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        else:
            return 0
    return 0


def _timed(cls, name, field):
    """`cls.name` timed into the observer's `field`: `data_ms` (a DataLoader's `__next__`, whose
    batch's samples are counted too: `_batch_size`, its most frequent case written out) or
    `forward_ms`. One `perf_counter` on each side; the attribute read and written as such (a call
    of `getattr` and `setattr` costs more), as this runs in every step."""
    import functools

    original = getattr(cls, name)
    perf = time.perf_counter
    tensor = sys.modules["torch"].Tensor

    if field == "data_ms":

        @functools.wraps(original)
        def timed(self, *args, **kwargs):
            started = perf()
            batch = None
            try:
                # Without keywords (`next(it)`: most often) no dict of them is made for the call.
                batch = original(self, *args, **kwargs) if kwargs else original(self, *args)
                return batch
            finally:
                obs = _observer
                obs.data_ms += (perf() - started) * 1000.0
                if batch is not None:
                    try:
                        if (batch.__class__ is tuple or batch.__class__ is list) and batch \
                                and batch[0].__class__ is tensor:
                            shape = batch[0].shape
                            obs.samples += int(shape[0]) if len(shape) else 1
                        else:
                            obs.samples += _batch_size(batch)
                    except Exception:
                        pass

    else:

        @functools.wraps(original)
        def timed(self, *args, **kwargs):
            started = perf()
            try:
                return original(self, *args, **kwargs) if kwargs else original(self, *args)
            finally:
                obs = _observer
                obs.forward_ms += (perf() - started) * 1000.0

    setattr(cls, name, timed)


def _timed_backward(autograd):
    """`torch.autograd.backward` timed into the observer's `backward_ms`, the outermost call only
    (a backward inside a backward, as reentrant checkpointing runs, is counted once): one
    `perf_counter` on each side, and a depth count."""
    import functools

    original = autograd.backward
    obs = _observer
    perf = time.perf_counter

    @functools.wraps(original)
    def backward(*args, **kwargs):
        if obs.in_backward:
            return original(*args, **kwargs)
        obs.in_backward = True
        started = perf()
        try:
            return original(*args, **kwargs)
        finally:
            obs.in_backward = False
            obs.backward_ms += (perf() - started) * 1000.0

    autograd.backward = backward


def _announce_workers(cls):
    """A DataLoader's worker processes, announced by the rank that started them (`worker`
    markers: id, pid, start method), so that the run shows their memory as its workers' (PSS
    against USS: what each holds privately); at most `_WORKERS_MAX` per process, as a loader
    without persistent workers starts new ones every epoch."""
    import functools

    original = cls.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            obs = _observer
            ctx = getattr(self, "_multiprocessing_context", None)
            if ctx is None:
                import multiprocessing

                method = multiprocessing.get_start_method()
            else:
                method = ctx.get_start_method()
            for i, worker in enumerate(getattr(self, "_workers", ())):
                if obs.workers_sent >= _WORKERS_MAX:
                    break
                if worker.pid:
                    obs.workers_sent += 1
                    obs.send({"t": "worker", "id": i, "pid": int(worker.pid), "start_method": str(method)},
                             urgent=True)
        except Exception:
            pass

    cls.__init__ = init


def _patch():
    """Wraps what torch has loaded so far; each part once."""
    obs = _observer
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if "optim" not in obs.patched and "torch.optim.optimizer" in sys.modules:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            register_optimizer_step_post_hook(obs.on_step)
            obs.patched.add("optim")
    except Exception:
        pass
    # A module may be half-loaded here (torch.distributed loads while the DataLoader's module
    # does): what it has not defined yet is wrapped on a later call.
    try:
        spawn = sys.modules.get("torch.multiprocessing.spawn")
        if "spawn" not in obs.patched and hasattr(spawn, "_wrap"):
            obs.patched.add("spawn")
            _report_spawned_errors(obs, spawn)
        # After `torch.multiprocessing` has bound the name (its `from .spawn import`).
        torch_mp = sys.modules.get("torch.multiprocessing")
        by_env = _env_int("RANK") is not None and os.environ.get(_RANK_PID) == str(os.getpid())
        if "starts" not in obs.patched and obs.fd is not None and by_env \
                and hasattr(torch_mp, "start_processes") and hasattr(spawn, "start_processes"):
            obs.patched.add("starts")
            _report_own_ranks(obs, torch_mp, spawn)
    except Exception:
        pass
    try:
        loader = sys.modules.get("torch.utils.data.dataloader")
        if "data" not in obs.patched and hasattr(loader, "_BaseDataLoaderIter"):
            obs.patched.add("data")
            _timed(loader._BaseDataLoaderIter, "__next__", "data_ms")
    except Exception:
        pass
    try:
        loader = sys.modules.get("torch.utils.data.dataloader")
        if "workers" not in obs.patched and hasattr(loader, "_MultiProcessingDataLoaderIter"):
            obs.patched.add("workers")
            _announce_workers(loader._MultiProcessingDataLoaderIter)
    except Exception:
        pass
    try:
        version = getattr(torch, "version", None)
        if "facts" not in obs.patched and hasattr(version, "cuda") and hasattr(torch, "__version__"):
            obs.patched.add("facts")
            nccl = None
            read = getattr(getattr(torch, "_C", None), "_nccl_version", None)
            if read is not None:
                try:  # ncclGetVersion, as torch.cuda.nccl.version() decodes it: nothing initialised
                    n = read()
                    nccl = f"{n >> 32}.{(n >> 16) & 0xFFFF}.{n & 0xFFFF}"
                except Exception:
                    nccl = None
            obs.send({"t": "torch", "version": str(torch.__version__), "cuda": version.cuda, "nccl": nccl,
                      "python": sys.version.split()[0], "executable": sys.executable})
    except Exception:
        pass
    dist = sys.modules.get("torch.distributed")
    try:
        if "dist" not in obs.patched and dist is not None and hasattr(dist, "init_process_group"):
            obs.patched.add("dist")
            _wrap_init(dist)
            for op in _COLLECTIVES:
                if hasattr(dist, op):
                    _wrap_collective(dist, op, getattr(dist, op))
    except Exception:
        pass
    try:
        # Every way a program runs backward (`loss.backward()`, Lightning's, Accelerate's,
        # DeepSpeed's) goes through it; a DDP rank waits in it for the others' gradients.
        autograd = getattr(torch, "autograd", None)
        if "backward" not in obs.patched and callable(getattr(autograd, "backward", None)):
            obs.patched.add("backward")
            _timed_backward(autograd)
    except Exception:
        pass
    ddp = sys.modules.get("torch.nn.parallel.distributed")
    try:
        if "ddp" not in obs.patched and ddp is not None and hasattr(ddp, "DistributedDataParallel"):
            obs.patched.add("ddp")
            _timed(ddp.DistributedDataParallel, "forward", "forward_ms")
    except Exception:
        pass


class _TorchFinder:
    """Finds the watched torch modules through the rest of `sys.meta_path` and runs `_patch`
    after each has loaded."""

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
            except Exception:
                pass

        loader.exec_module = exec_module
        return spec


def _observe():
    global _observer
    _os = os
    if _os.environ.get("UPS_DOCTOR_OBSERVE", "1") == "0":
        return
    fd = None
    number, inode = _env_int("UPS_DOCTOR_MARKER_FD"), _env_int("UPS_DOCTOR_MARKER_INO")
    if number is not None:
        try:
            if inode is None or _os.fstat(number).st_ino == inode:
                fd = number
        except OSError:
            pass
    fifo = None if fd is not None else _os.environ.get("UPS_DOCTOR_MARKER_PATH") or None
    if fd is None and fifo is None:
        return
    import atexit

    _observer = _Observer(fd, fifo)
    _report_uncaught(_observer)
    atexit.register(_observer.at_exit)
    _os.register_at_fork(after_in_child=_observer.after_fork)
    sys.meta_path.insert(0, _TorchFinder())
    if "torch" in sys.modules:
        _patch()


_line_buffered()
try:
    _observe()
except Exception:  # the observer never stops the program
    _observer = None
_chain()
