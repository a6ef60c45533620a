#!/usr/bin/env python3
"""What the in-process observer costs a training step, read inside the process (standard library
in this script; the child needs torch).

    python3 bench/observer_hooks.py --python PYTHON [--site DIR ...] [--processes 6]

Whole runs under torchrun spread over ±10 % on a shared 2-core machine, far more than the 1 %
the observer may cost, so this measures the observer where it works: in one process, a 1-rank
gloo group running the step of `tests/programs/observed_ddp.py` (a DataLoader batch, DDP's
forward and backward, an SGD step, an `all_gather` of the loss), its markers going to /dev/null
through the same file descriptor ups-doctor would give it. Each child process measures, in
alternating blocks, CPU time (`time.process_time`: every thread, the observer's sending thread
included):

- each hooked call against the original beside it (`dist.all_gather` and its wrapper, the
  optimizer's step with and without the observer's post hook, DDP's forward and
  `DataLoader.__next__` with and without the timing wrapper): the median difference a call;
- whole steps with every hook in place against every hook taken out, and with each hook alone in
  place: the median difference a step, and the median step.

Several processes, alternating between `--site` folders (each holds a `sitecustomize.py`; the
default is this tree's `python/site`), so that a reading of one version sits beside the other's;
the figures printed are the medians over processes. Nothing here is asserted by the test suite.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(blocks, calls, steps, clock, hidden, batch):
    import time

    import sitecustomize as site
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim import optimizer as optim_module
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data import dataloader as loader_module

    obs = site._observer
    if obs is None:
        sys.exit("the observer is off in this child: is UPS_DOCTOR_MARKER_FD set and the site folder first on PYTHONPATH?")
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    n = batch * 512  # batches read round and round
    data = TensorDataset(torch.randn(n, 16), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=batch)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(loader)

    def next_of_loader():
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    x, _ = next_of_loader()
    loss = torch.zeros(1)
    gathered = [torch.zeros(1)]

    # Each hook as installed, and how to take it out and put it back.
    gather = dist.all_gather
    ddp_forward = DistributedDataParallel.forward
    next_batch = loader_module._BaseDataLoaderIter.__next__
    post_hooks = dict(optim_module._global_optimizer_post_hooks)
    if not (hasattr(gather, "__wrapped__") and hasattr(ddp_forward, "__wrapped__") and post_hooks):
        sys.exit("the observer's hooks are not in place in this child")

    def hooks(on, only=None):
        """Every hook in (`on`) or out; with `only`, that one alone in."""
        def want(name):
            return on and (only is None or only == name)

        dist.all_gather = gather if want("all_gather") else gather.__wrapped__
        DistributedDataParallel.forward = ddp_forward if want("DDP forward") else ddp_forward.__wrapped__
        loader_module._BaseDataLoaderIter.__next__ = (
            next_batch if want("DataLoader.__next__") else next_batch.__wrapped__
        )
        optim_module._global_optimizer_post_hooks.clear()
        if want("optimizer.step"):
            optim_module._global_optimizer_post_hooks.update(post_hooks)

    def step():
        xb, yb = next_of_loader()
        optimizer.zero_grad()
        out = torch.nn.functional.mse_loss(model(xb), yb)
        out.backward()
        optimizer.step()
        dist.all_gather([torch.zeros(1)], out.detach().reshape(1))

    now = {"cpu": time.process_time, "thread": time.thread_time, "wall": time.perf_counter}[clock]

    def block(fn, count):
        started = now()
        for _ in range(count):
            fn()
        return (now() - started) / count * 1e6

    calls_of = {
        "all_gather": lambda: dist.all_gather(gathered, loss),
        "optimizer.step": optimizer.step,
        "DDP forward": lambda: model(x),
        "DataLoader.__next__": next_of_loader,
    }
    result = {"hooks": {}}
    for name, fn in calls_of.items():
        extra = []
        for i in range(blocks):
            # Which goes first alternates: neither always follows the other.
            order = (True, False) if i % 2 else (False, True)
            took = {}
            for on in order:
                hooks(on)
                took[on] = block(fn, calls)
            extra.append(took[True] - took[False])
        result["hooks"][name] = statistics.median(extra)
    result["step_only"] = {}
    for only in [None] + list(calls_of):
        extra, whole, ratios = [], [], []
        for i in range(blocks):
            order = (True, False) if i % 2 else (False, True)
            took = {}
            for on in order:
                hooks(on, only)
                took[on] = block(step, steps)
            extra.append(took[True] - took[False])
            whole.append(took[False])
            ratios.append(took[False] / took[True])
        if only is None:
            result["step_extra"] = statistics.median(extra)
            result["step"] = statistics.median(whole)
            result["step_ratio"] = statistics.median(ratios)
        else:
            result["step_only"][only] = statistics.median(extra)
    hooks(True)
    result["steps_counted"] = obs.steps
    result["dropped"] = obs.dropped
    dist.destroy_process_group()
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=os.environ.get("UPS_DOCTOR_PYTHON", "python3"))
    parser.add_argument("--site", action="append", help="a folder holding a sitecustomize.py (repeat to compare)")
    parser.add_argument("--processes", type=int, default=6, help="child processes per site (default 6)")
    parser.add_argument("--blocks", type=int, default=30, help="alternating blocks per measurement (default 30)")
    parser.add_argument("--calls", type=int, default=200, help="calls per block of one hook (default 200)")
    parser.add_argument("--steps", type=int, default=100, help="steps per block of whole steps (default 100)")
    parser.add_argument("--clock", choices=("cpu", "thread", "wall"), default="cpu",
                        help="cpu: the process's CPU time, every thread (default); thread: the main "
                             "thread's alone; wall: elapsed time")
    parser.add_argument("--hidden", type=int, default=64,
                        help="the model's hidden width (default 64: observed_ddp.py's); wider makes a longer step")
    parser.add_argument("--batch", type=int, default=32, help="samples a batch (default 32: observed_ddp.py's)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.blocks, args.calls, args.steps, args.clock, args.hidden, args.batch)
    sites = [os.path.abspath(s) for s in (args.site or [os.path.join(REPO, "python", "site")])]
    for s in sites:
        if not os.path.isfile(os.path.join(s, "sitecustomize.py")):
            sys.exit(f"--site {s}: no sitecustomize.py there; give a folder that holds one (this tree's is python/site)")
    readings = {s: [] for s in sites}
    for p in range(args.processes):
        for s in sites if p % 2 == 0 else list(reversed(sites)):
            devnull = os.open(os.devnull, os.O_WRONLY)
            env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(29500 + os.getpid() % 1000), OMP_NUM_THREADS="1", PYTHONPATH=s,
                       GLOO_SOCKET_IFNAME="lo", UPS_DOCTOR_MARKER_FD=str(devnull))
            env.pop("UPS_DOCTOR_OBSERVE", None)
            env.pop("UPS_DOCTOR_MARKER_PATH", None)
            # The folder every run gives the observer (its step count and newest collectives go
            # into files it maps there), so that their writes are measured as a run makes them.
            stacks = tempfile.mkdtemp(prefix="observer-hooks-")
            env["UPS_DOCTOR_STOP_STACKS"] = stacks
            out = subprocess.run([args.python, os.path.abspath(__file__), "--child", "--blocks", str(args.blocks),
                                  "--calls", str(args.calls), "--steps", str(args.steps), "--clock", args.clock,
                                  "--hidden", str(args.hidden), "--batch", str(args.batch)],
                                 env=env, pass_fds=(devnull,), capture_output=True, text=True)
            os.close(devnull)
            shutil.rmtree(stacks, ignore_errors=True)
            if out.returncode != 0:
                sys.exit(f"child with --site {s} failed ({out.returncode}):\n{out.stderr[-3000:]}")
            readings[s].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"process {p + 1}/{args.processes} {s}: {readings[s][-1]}", file=sys.stderr, flush=True)

    def med(values):
        return statistics.median(values)

    what = {"cpu": "CPU µs (all threads)", "thread": "CPU µs of the main thread", "wall": "wall µs"}[args.clock]
    print(f"{what}, median over {args.processes} processes of the median of {args.blocks} "
          f"alternating blocks ({args.calls} calls or {args.steps} steps a block):\n")
    names = list(readings[sites[0]][0]["hooks"])
    print("| what | " + " | ".join(os.path.relpath(s, REPO) for s in sites) + " |")
    print("| --- |" + " --- |" * len(sites))
    def row(label, read):
        cells = []
        for s in sites:
            values = [read(r) for r in readings[s]]
            cells.append(f"{med(values):+.1f} ({min(values):+.1f} to {max(values):+.1f})")
        print(f"| {label} | " + " | ".join(cells) + " |")

    for name in names:
        row(f"`{name}`: the hooked call's extra", lambda r: r["hooks"][name])
    for name in names:
        row(f"a whole step with `{name}`'s hook alone in: the extra", lambda r: r["step_only"][name])
    for label, key in (("sum of the four", None), ("a whole step, hooks in against out: the extra", "step_extra"),
                       ("a whole step without the hooks", "step")):
        cells = []
        for s in sites:
            if key is None:
                values = [sum(r["hooks"].values()) for r in readings[s]]
            else:
                values = [r[key] for r in readings[s]]
            cells.append(f"{med(values):.1f} ({min(values):.1f} to {max(values):.1f})")
        print(f"| {label} | " + " | ".join(cells) + " |")
    cells = []
    for s in sites:
        step = med([r["step"] for r in readings[s]])
        hooks = med([sum(r["hooks"].values()) for r in readings[s]])
        whole = med([r["step_extra"] for r in readings[s]])
        cells.append(f"{step / (step + hooks):.4f} / {step / (step + whole):.4f}")
    print("| step / (step + extra): by the four hooks / by whole steps | " + " | ".join(cells) + " |")
    cells = []
    for s in sites:
        values = [r["step_ratio"] for r in readings[s]]
        cells.append(f"{med(values):.4f} ({min(values):.4f} to {max(values):.4f})")
    print("| a whole step, hooks out ÷ in, the median of the blocks' ratios (1.0: no cost) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
