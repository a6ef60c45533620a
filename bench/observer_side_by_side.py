#!/usr/bin/env python3
"""The observer's cost on a 2-rank DDP program, read from two runs going at the same time.

    python3 bench/observer_side_by_side.py [--rounds 8] [--steps 2000] [--hidden 64]
                                           [--binary target/release/ups-doctor] [--control] [--pin]

Runs one after the other on this shared 2-core machine differ by up to 15 % (BENCHMARKS.md), far
more than the 1 % the observer may cost, because what else the machine does changes from one
run to the next. Here the two ways run at once, side by side, so whatever slows the machine
slows both: `ups-doctor run -- torchrun --nproc_per_node 2 tests/programs/observed_ddp.py` with
the observer (the default, which also turns PyTorch's Flight Recorder on at 2000 entries, as for
every observed run) and the same with `--no-observe` (neither), four ranks on two cores. Each run's
rank 0 writes a time stamp every 10 steps (`--times`, CLOCK_MONOTONIC); the reading is the time
each run took over the middle of its steps (from 25 % to 75 %), while both are in their training
loops, not the start-up or the end. Which run is started first alternates by round.

Printed per round: the two windows' seconds and their ratio no-observe / observed (1.0: the
observer costs nothing; 0.99: it makes a step 1 % longer), then the median and spread. With
`--control` each round also runs two observed runs side by side (the same comparison with no
difference between the two ways): its spread is this method's own noise. `--pin` gives each run a
core of its own (`taskset`, which its processes inherit; both of its ranks share that core), the
two swapped every other round, so the runs do not take time from each other. A window that ends
after the other run has finished is flagged (the two were not side by side for all of it).

The Python that runs the program is the one `torchrun` on `PATH` belongs to (`./x pytorch`'s
venv: `eval "$(./x env)"` puts it first). Nothing here is asserted by the test suite.
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

REPO = Path(__file__).resolve().parent.parent
PROGRAM = REPO / "tests" / "programs" / "observed_ddp.py"


def start(binary, observe, steps, hidden, times, out, core=None):
    cmd = [binary, "run", "--quiet", "--out", str(out)]
    if core is not None:
        # The whole run on one core (its processes inherit the affinity): the other run has the other.
        cmd = ["taskset", "-c", str(core)] + cmd
    if not observe:
        cmd.append("--no-observe")
    cmd += ["--", "torchrun", "--nproc_per_node", "2", str(PROGRAM), "--steps", str(steps),
            "--hidden", str(hidden), "--times", str(times)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stamps(path):
    out = {}
    for line in Path(path).read_text().splitlines():
        step, at = line.split()
        out[int(step)] = float(at)
    return out


def window(path, steps):
    """Seconds from the stamp at 25 % of the steps to the one at 75 %, and when that ended."""
    at = stamps(path)
    first, last = (steps // 4) // 10 * 10, (3 * steps // 4) // 10 * 10
    return at[last] - at[first], at[last], max(at.values())


def side_by_side(binary, ways, steps, hidden, tmp, label, cores=None):
    procs = []
    for i, observe in enumerate(ways):
        times = tmp / f"{label}-{i}.times"
        times.unlink(missing_ok=True)
        core = cores[i] if cores else None
        procs.append((start(binary, observe, steps, hidden, times, tmp / f"{label}-{i}", core), times))
    windows, failed = [], []
    for i, (proc, times) in enumerate(procs):
        _, err = proc.communicate()
        try:
            windows.append(window(times, steps))
        except (OSError, KeyError, ValueError):
            kept = Path(tempfile.mkdtemp(prefix="side-by-side-"))
            shutil.copytree(tmp / f"{label}-{i}", kept / "run", dirs_exist_ok=True)
            sys.exit(f"observer_side_by_side: a run ended ({proc.returncode}) before its window; its folder is kept "
                     f"in {kept}:\n{err[-2000:]}")
        if proc.returncode != 0:
            # Trained through its window but did not pass: PyTorch 2.11's gloo ranks abort at exit
            # now and then (BENCHMARKS.md); the window stands, the run's verdict is printed.
            failed.append(headline(tmp / f"{label}-{i}" / "report.md"))
    for i in range(len(procs)):
        shutil.rmtree(tmp / f"{label}-{i}", ignore_errors=True)
    # Both still training through both windows: each window ended before the other run's last stamp.
    overlapped = windows[0][1] <= windows[1][2] and windows[1][1] <= windows[0][2]
    return windows[0][0], windows[1][0], overlapped, failed


def headline(report):
    """The verdict's headline of a run's report (its first bold line after the scenario's heading)."""
    try:
        lines = report.read_text().splitlines()
    except OSError:
        return "no report"
    return next((l.strip("*") for l in lines if l.startswith("**") and l.endswith("**")), "no headline")


def summary(name, ratios):
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [min(ratios), None, max(ratios)]
    return (f"{name}: median {statistics.median(ratios):.4f} (quartiles {q[0]:.4f}–{q[-1]:.4f}, "
            f"min {min(ratios):.4f}, max {max(ratios):.4f}, {len(ratios)} rounds)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "ups-doctor"))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--hidden", type=int, default=64, help="observed_ddp.py's hidden width (65536: steps ~10x longer)")
    ap.add_argument("--control", action="store_true", help="also run two observed runs side by side each round")
    ap.add_argument("--pin", action="store_true", help="each run on a core of its own (taskset), swapped by round")
    a = ap.parse_args()
    if shutil.which("torchrun") is None:
        sys.exit("torchrun is not on PATH: run `eval \"$(./x env)\"` first (./x pytorch's venv)")
    if not Path(a.binary).is_file():
        sys.exit(f"no binary at {a.binary}: build it (`cargo build --release`) or pass --binary")
    ratios, control, flagged, ended_failed = [], [], 0, []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("round  observed s  no-observe s  no-observe/observed" + ("  control A/A" if a.control else ""))
        for i in range(a.rounds):
            # Which starts first alternates: the first to start gets the cores to itself for a moment.
            ways = [True, False] if i % 2 == 0 else [False, True]
            # With --pin, each run has a core of its own, the cores swapped every other round.
            cores = [(i // 2) % 2, 1 - (i // 2) % 2] if a.pin else None
            first, second, both, failed = side_by_side(a.binary, ways, a.steps, a.hidden, tmp, f"r{i}", cores)
            ended_failed += failed
            observed, plain = (first, second) if ways[0] else (second, first)
            ratio = plain / observed
            ratios.append(ratio)
            flagged += not both
            line = f"{i + 1:>5}  {observed:>10.3f}  {plain:>12.3f}  {ratio:>19.4f}" + ("" if both else "  (not side by side)")
            if a.control:
                one, two, both, failed = side_by_side(a.binary, [True, True], a.steps, a.hidden, tmp, f"c{i}", cores)
                ended_failed += failed
                control.append(one / two)
                flagged += not both
                line += f"  {one / two:>11.4f}" + ("" if both else " (not side by side)")
            print(line, flush=True)
    print(summary("no-observe / observed", ratios))
    if control:
        print(summary("control, observed / observed", control))
    if flagged:
        print(f"{flagged} window(s) not wholly side by side: read those rounds with care")
    for verdict in ended_failed:
        print(f"a run trained through its window, then did not pass: {verdict}")


if __name__ == "__main__":
    main()
