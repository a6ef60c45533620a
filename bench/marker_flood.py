#!/usr/bin/env python3
"""ups-doctor's memory under a marker flood: a program writes N markers as fast as it can.

    bench/marker_flood.py [--bin target/release/ups-doctor] [--markers 10000000 30000000]

For each N, runs `ups-doctor run` on a command that writes N `progress` markers to its marker
pipe (in 10,000-line chunks) and then `done`, samples ups-doctor's own peak resident memory
(VmHWM of /proc/PID/status, read every 50 ms until it exits) and prints one line per N: peak RSS,
the markers taken in and dropped (from result.json), and the writer's time. Standard library only;
nothing here is asserted by the test suite: issue 32 measured 1.4 GiB at 10 million markers and
4.0 GiB at 30 million before the queue was bounded (src/harness/os/process.rs, `Sink`).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WRITER = r"""
import os, sys, time
fd = int(os.environ["UPS_DOCTOR_MARKER_FD"])
n = int(sys.argv[1])
chunk = 10_000
start = time.monotonic()
line = '{"t":"progress","phase":"flood","done":1,"total":2}\n'.encode()
block = line * chunk
for _ in range(n // chunk):
    os.write(fd, block)
os.write(fd, b'{"t":"done"}\n')
print(f"wrote {n} markers in {time.monotonic() - start:.2f} s")
"""


def peak_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ups-doctor")
    ap.add_argument("--markers", type=int, nargs="+", default=[10_000_000, 30_000_000])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        writer = os.path.join(tmp, "writer.py")
        with open(writer, "w") as f:
            f.write(WRITER)
        for n in args.markers:
            scenario = os.path.join(tmp, f"flood-{n}.json")
            with open(scenario, "w") as f:
                json.dump({"command": [sys.executable, writer, str(n)],
                           "expect": {"completes_when": "done"},
                           "limits": {"timeout_s": 600, "hang_after_s": 300}}, f)
            out = os.path.join(tmp, f"out-{n}")
            proc = subprocess.Popen([args.bin, "run", scenario, "--out", out, "--quiet"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            peak = 0
            while proc.poll() is None:
                peak = max(peak, peak_kib(proc.pid) or 0)
                time.sleep(0.05)
            stderr = proc.stderr.read().decode(errors="replace")
            with open(os.path.join(out, "result.json")) as f:
                result = json.load(f)
            rank = result["scenarios"][0]["ranks"][0]
            tail = " ".join(rank.get("log_tail", []))
            print(f"{n:>11,} markers: ups-doctor peak RSS {peak / 1024:7.1f} MiB; "
                  f"taken in {rank['markers']:,}, dropped {rank.get('dropped_markers', 0):,}; "
                  f"exit {proc.returncode}; {tail}", flush=True)
            if proc.returncode not in (0, 1):
                print(stderr, file=sys.stderr)


if __name__ == "__main__":
    main()
