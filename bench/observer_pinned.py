#!/usr/bin/env python3
"""The observer's cost on a 2-rank DDP program, with the noise of a shared 2-core machine taken out
of the comparison as far as it can be: each rank pinned to a core of its own (`taskset -c
$LOCAL_RANK`, through torchrun's `--no-python`), one intra-op thread each (`OMP_NUM_THREADS=1`),
and the two ways run in pairs, alternating which goes first (ABBA), so a drift of the machine over
the reading falls on both.

    bench/observer_pinned.py [--pairs 10] [--steps 2000] [--binary target/release/ups-doctor]
                             [PROGRAM]          (default tests/programs/observed_ddp.py)

Each run is `ups-doctor run -- torchrun --nproc_per_node 2 --no-python PIN python PROGRAM --steps
N`, observed (the default) or with `--no-observe`; its wall time is read around the whole run.
Printed: each pair's two times and its ratio no-observe / observed (1.0: the observer costs
nothing; 0.99: it adds 1 %), then the median and the spread of the ratios.

The Python that runs the program is the one `torchrun` on `PATH` belongs to (`./x pytorch`'s
venv: `eval "$(./x env)"` puts it first).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(binary, observe, program, steps, pin, out):
    python = str(Path(shutil.which("torchrun")).with_name("python"))
    cmd = [binary, "run", "--quiet", "--out", out]
    if not observe:
        cmd.append("--no-observe")
    cmd += ["--", "torchrun", "--nproc_per_node", "2", "--no-python", pin, python, program, "--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.monotonic()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("program", nargs="?", default="tests/programs/observed_ddp.py")
    ap.add_argument("--binary", default="target/release/ups-doctor")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()
    if shutil.which("torchrun") is None:
        sys.exit("torchrun is not on PATH: run `eval \"$(./x env)\"` first (./x pytorch's venv)")
    if os.cpu_count() < 2:
        sys.exit("needs 2 cores: one per rank")
    program = str(Path(a.program).resolve())
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        pin = Path(tmp) / "pin_rank.sh"
        pin.write_text('#!/bin/sh\nexec taskset -c "$LOCAL_RANK" "$@"\n')
        pin.chmod(0o755)
        print("pair  observed s  no-observe s  no-observe/observed")
        for i in range(a.pairs):
            order = [True, False] if i % 2 == 0 else [False, True]
            walls = {}
            for observe in order:
                out = str(Path(tmp) / f"out-{i}-{int(observe)}")
                walls[observe] = one_run(a.binary, observe, program, a.steps, str(pin), out)
                shutil.rmtree(out, ignore_errors=True)
            ratio = walls[False] / walls[True]
            ratios.append(ratio)
            print(f"{i + 1:>4}  {walls[True]:>10.3f}  {walls[False]:>12.3f}  {ratio:>19.4f}", flush=True)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [min(ratios), None, max(ratios)]
    print(f"median {statistics.median(ratios):.4f}  (quartiles {q[0]:.4f}–{q[-1]:.4f}, "
          f"min {min(ratios):.4f}, max {max(ratios):.4f}, {len(ratios)} pairs)")


if __name__ == "__main__":
    main()
