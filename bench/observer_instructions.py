#!/usr/bin/env python3
"""The observer's cost a training step in instructions, counted by valgrind's callgrind: the same
figure run after run on an idle machine, where time on a shared one is not (standard library in this script;
the child needs torch, and `valgrind` must be installed: `apt-get install valgrind`).

    python3 bench/observer_instructions.py --python PYTHON [--site DIR ...] [--steps 200] [--flight N]

A child process runs a 1-rank gloo group through the step of `tests/programs/observed_ddp.py` (a
DataLoader batch, DDP's forward and backward, an SGD step, an `all_gather` of the loss) under
callgrind, once with the observer off (`UPS_DOCTOR_OBSERVE=0`) and once per `--site` folder
(each holds a `sitecustomize.py`; the default is this tree's `python/site`), its markers going to
/dev/null through the file descriptor ups-doctor would give it. Counting starts when the loop
does (`callgrind_control -i on`: the start-up is not counted) and ends with the process.
PyTorch's Flight Recorder is off in these (`TORCH_FR_BUFFER_SIZE` unset, whatever this shell
has); `--flight N` counts each way again with it on at N entries (ups-doctor's own size is 2000,
set for every observed run: `FLIGHT_ENTRIES` in src/harness/plan/mod.rs), so the recorder's own
cost and the observer's as ups-doctor runs it are read in the same invocation.

Printed: instructions a step of the main thread (where the program and the observer's hooks
run: the same count run after run on an idle machine, to within a few hundred; on a loaded one the
observer's time-driven work, its once-a-second summary and its batches of step markers, falls on
fewer steps and the count grows, so compare versions in one invocation) and of the other threads (the
observer's sending thread wakes every 0.25 s of *wall* time, and under valgrind a step takes
about 50 times as long, so its share here is larger than in a real run), and the ratio of the
main thread's counts, off against on. About 75 s a run on this machine. Nothing here is asserted
by the test suite.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.abspath(__file__)).rsplit(os.sep, 1)[0]


def child(steps, ready_fd, go_fd):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32 * (steps + 1), 16), torch.randn(32 * (steps + 1), 1))
    loader = DataLoader(data, batch_size=32)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    os.write(ready_fd, b"ready\n")
    os.read(go_fd, 1)  # counting is on once this returns
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        dist.all_gather([torch.zeros(1)], loss.detach().reshape(1))
    dist.destroy_process_group()


def count(python, site, steps, workdir, label, flight=None):
    """Instructions of each thread of one counted child, the Flight Recorder on at `flight`
    entries or off: {thread number: count}."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29500 + os.getpid() % 1000), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               UPS_DOCTOR_MARKER_FD=str(devnull), PYTHONPATH=site or os.path.join(REPO, "python", "site"))
    env.pop("UPS_DOCTOR_MARKER_PATH", None)
    # Read when the process group is made: unset, the recorder is off.
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    if flight is not None:
        env["TORCH_FR_BUFFER_SIZE"] = str(flight)
    # The folder ups-doctor gives every run (the step count and the newest collectives go into
    # files the observer maps there): its writes are counted as a real run makes them.
    stacks = os.path.join(workdir, f"stacks.{label}")
    os.makedirs(stacks, exist_ok=True)
    env["UPS_DOCTOR_STOP_STACKS"] = stacks
    env["UPS_DOCTOR_OBSERVE"] = "1" if site else "0"
    out = os.path.join(workdir, f"callgrind.{label}")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
         f"--callgrind-out-file={out}", python, os.path.abspath(__file__), "--child", "--steps", str(steps),
         "--ready-fd", str(ready_w), "--go-fd", str(go_r)],
        env=env, pass_fds=(devnull, ready_w, go_r), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for fd in (devnull, ready_w, go_r):
        os.close(fd)
    with os.fdopen(ready_r) as ready:
        if ready.readline() != "ready\n":
            proc.kill()
            sys.exit(f"{label}: the child ended before its loop:\n{proc.communicate()[1][-3000:]}")
    subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, stdout=subprocess.DEVNULL)
    os.write(go_w, b"g")
    os.close(go_w)
    _, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{label}: the child failed ({proc.returncode}):\n{err[-3000:]}")
    threads = {}
    for path in sorted(glob.glob(out + "-*")):
        with open(path) as f:
            for line in f:
                if line.startswith("summary:"):
                    threads[int(path.rsplit("-", 1)[1])] = int(line.split()[1])
                    break
    return threads


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=os.environ.get("UPS_DOCTOR_PYTHON", "python3"))
    parser.add_argument("--site", action="append", help="a folder holding a sitecustomize.py (repeat to compare)")
    parser.add_argument("--steps", type=int, default=200, help="steps counted (default 200)")
    parser.add_argument("--flight", type=int, metavar="N",
                        help="also count each way with the Flight Recorder on at N entries (ups-doctor's: 2000)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--go-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.steps, args.ready_fd, args.go_fd)
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed: `apt-get install valgrind` (Debian) gives both")
    sites = [os.path.abspath(s) for s in (args.site or [os.path.join(REPO, "python", "site")])]
    for s in sites:
        if not os.path.isfile(os.path.join(s, "sitecustomize.py")):
            sys.exit(f"--site {s}: no sitecustomize.py there; give a folder that holds one (this tree's is python/site)")
    ways = [(site, None) for site in [None] + sites]
    if args.flight is not None:
        ways += [(site, args.flight) for site in [None] + sites]
    rows = []
    with tempfile.TemporaryDirectory(prefix="observer-instructions-") as workdir:
        for i, (site, flight) in enumerate(ways):
            label = ("off" if site is None else f"site{i}") + ("" if flight is None else f"-fr{flight}")
            threads = count(args.python, site, args.steps, workdir, label, flight)
            print(f"{label}: {threads}", file=sys.stderr, flush=True)
            rows.append((site, flight, threads))
    off_main = rows[0][2][1]
    print(f"Instructions a step (callgrind, {args.steps} steps counted, a 1-rank gloo group):\n")
    print("| observer | Flight Recorder | main thread | other threads | main thread, off / this |")
    print("| --- | --- | --- | --- | --- |")
    for site, flight, threads in rows:
        main_thread = threads[1]
        others = sum(n for t, n in threads.items() if t != 1)
        name = "off (`UPS_DOCTOR_OBSERVE=0`)" if site is None else f"on, `{os.path.relpath(site, REPO)}`"
        recorder = "off" if flight is None else f"{flight} entries"
        print(f"| {name} | {recorder} | {main_thread / args.steps:,.0f} | {others / args.steps:,.0f} | "
              f"{off_main / main_thread:.4f} |")
    for site, flight, threads in rows[1:]:
        who = "the recorder alone" if site is None else f"`{os.path.relpath(site, REPO)}`"
        if site is not None and flight is not None:
            who += f" with the recorder at {flight}"
        print(f"\n{who}: adds {(threads[1] - off_main) / args.steps:,.0f} instructions a step to the main thread "
              f"(all threads: {(sum(threads.values()) - sum(rows[0][2].values())) / args.steps:,.0f}).")


if __name__ == "__main__":
    main()
