#!/usr/bin/env python3
"""ups-doctor's own CPU time during a run, by thread name (standard library only).

    python3 bench/own_cpu.py target/release/ups-doctor run SCENARIO.json --quiet --out DIR

Starts the command and reads `/proc/PID/task/TID/stat` of that process (not of its children:
the ranks' CPU is not counted) every 50 ms; a thread's last reading before it ended is its
total. Threads of the same name are summed (`watch-PID`: one per found rank, each named after
the rank's pid). On a machine whose cores the ranks fill, this CPU is taken from them.
Nothing here is asserted by the test suite.
"""
import os
import subprocess
import sys
import time

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def threads(pid):
    """{tid: (name, user ticks, system ticks)} of the process's threads now."""
    found = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        found[tid] = (name, int(fields[11]), int(fields[12]))
    return found


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    started = time.monotonic()
    process = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = {}
    while process.poll() is None:
        last.update(threads(process.pid))
        time.sleep(0.05)
    wall = time.monotonic() - started
    by_name = {}
    for name, user, system in last.values():
        key = "watch-PID" if name.startswith("watch-") else name
        entry = by_name.setdefault(key, [0, 0, 0])
        entry[0] += 1
        entry[1] += user
        entry[2] += system
    total = sum((u + s) * TICK_MS for _, u, s in by_name.values())
    print(f"exit status {process.returncode}, wall {wall:.1f} s, own CPU {total:.0f} ms "
          f"({total / 10 / wall:.1f} % of one core; at most 50 ms late at each thread's end)")
    print("| thread | count | user ms | system ms |")
    print("| --- | --- | --- | --- |")
    for name, (count, user, system) in sorted(by_name.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
        print(f"| {name} | {count} | {user * TICK_MS:.0f} | {system * TICK_MS:.0f} |")


if __name__ == "__main__":
    main()
