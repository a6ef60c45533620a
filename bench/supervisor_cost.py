#!/usr/bin/env python3
"""The supervisor's own cost, independent of how busy the machine is: runs `ups-doctor run` on a
scenario and reads, from /proc, the CPU time (utime + stime) of the ups-doctor process itself (its
threads, not the ranks it reaps) and its threads' context switches (voluntary = wake-ups,
nonvoluntary = preemptions), per second of the run's steady part (from --skip seconds after the
start to --skip seconds before it ends), per training step (markers come with steps) and per
thread (the marker readers, the sampler, the supervisor loop, …).

    bench/supervisor_cost.py [--binary target/debug/ups-doctor] [--steps 300] [SCENARIO]

Wall-clock figures on a busy machine are noise; these are not: a supervisor that wakes 20 times a
second shows 20 wake-ups a second whatever else runs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def reading(pid, threads=None):
    """(cpu seconds of the process itself, voluntary, nonvoluntary switches over its live threads);
    `threads`, when given, gets each live thread's (name, cpu seconds, voluntary switches)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime: this process's threads only
    vol = nonvol = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            t_vol = 0
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        t_vol = int(line.split()[1])
                        vol += t_vol
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        nonvol += int(line.split()[1])
            if threads is not None:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    t = f.read().rsplit(")", 1)[1].split()
                threads[f"{name} ({tid})"] = ((int(t[11]) + int(t[12])) / TICKS, t_vol)
        except FileNotFoundError:
            pass
    return cpu, vol, nonvol


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", nargs="?", default="scenarios/train-cpu.json")
    ap.add_argument("--binary", default="target/debug/ups-doctor")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--skip", type=float, default=3.0, help="seconds of start-up and of teardown left out")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        cmd = [a.binary, "run", a.scenario, "--set", f"train.steps={a.steps}", "--set", "limits.timeout_s=3600", "--quiet", "--out", out]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        start = time.monotonic()
        readings = []
        while p.poll() is None:
            time.sleep(0.2)
            try:
                threads = {}
                readings.append((time.monotonic() - start, *reading(p.pid, threads), threads))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                break
        p.wait()
        end = time.monotonic() - start
        result = json.loads((Path(out) / "result.json").read_text())
        steps_per_s = result["scenarios"][0].get("steps_per_s") or float("nan")
    # Teardown (threads ending, leftovers swept) is left out with start-up.
    steady = [r for r in readings if a.skip <= r[0] <= end - a.skip]
    if len(steady) < 2:
        sys.exit("the run ended before a steady reading: raise --steps")
    first, last = steady[0], steady[-1]
    dt = last[0] - first[0]
    cpu, vol, nonvol = ((last[i] - first[i]) / dt for i in (1, 2, 3))
    # Per thread: which of the harness's threads the cost is (threads alive at both readings).
    for name, (t_cpu, t_vol) in sorted(last[4].items()):
        if name in first[4]:
            f_cpu, f_vol = first[4][name]
            print(f"  {name:28s} {1000 * (t_cpu - f_cpu) / dt:6.1f} ms/s CPU {(t_vol - f_vol) / dt:8.1f} wake-ups/s")
    # Markers come with steps, timers with seconds: per step as well, at the run's own pace.
    print(f"{a.binary}: {dt:.1f} s steady at {steps_per_s:.2f} steps/s: supervisor CPU {1000 * cpu:.1f} ms/s "
          f"({1000 * cpu / steps_per_s:.2f} ms/step), wake-ups {vol:.1f}/s ({vol / steps_per_s:.1f}/step), "
          f"preemptions {nonvol:.1f}/s")


if __name__ == "__main__":
    main()
