"""The Flight Recorder's own cost per collective: one process, gloo, 20,000 all-reduces of 577 floats
(the DDP test program's gradient bucket), with the recorder off (`TORCH_FR_BUFFER_SIZE=0`) and at
ups-doctor's size (2000), alternating, each in a fresh process; prints microseconds per all-reduce
for each pair and the minimum and median of each side. Usage:
`python bench/flight_cost.py --python $UPS_DOCTOR_PYTHON --pairs 10`."""

import argparse
import os
import socket
import statistics
import subprocess
import sys

CHILD = r"""
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(577)
for _ in range(1000):
    dist.all_reduce(t)
t0 = time.perf_counter()
for _ in range(20000):
    dist.all_reduce(t)
print((time.perf_counter() - t0) / 20000 * 1e6, flush=True)
dist.destroy_process_group()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def once(python, size):
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    # The figure is printed before the process ends: PyTorch 2.11 sometimes aborts at exit
    # (BENCHMARKS.md), which does not change what was measured.
    out = subprocess.run([python, "-c", CHILD], env=env, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--pairs", type=int, default=10)
    a = p.parse_args()
    off, on = [], []
    for i in range(a.pairs):
        order = [(0, off), (2000, on)] if i % 2 == 0 else [(2000, on), (0, off)]
        for size, into in order:
            into.append(once(a.python, size))
        print(f"pair {i + 1}: off {off[-1]:.2f} us, on {on[-1]:.2f} us", flush=True)
    for name, xs in (("off", off), ("on (2000)", on)):
        print(f"{name}: min {min(xs):.2f} us, median {statistics.median(xs):.2f} us per all-reduce")


if __name__ == "__main__":
    main()
