"""A program without torch for ups-doctor's tests of the harness itself. `--mode`:
`finish` prints `training finished` and exits 0; `swallow` catches its own error and calls
os._exit(0) (a false success); `deadlock` takes a lock twice and blocks forever (a hang);
`markers` does `finish` with the helper's markers; `wait` prints `rank R waiting` and sleeps for 10
minutes, the rank `--deaf-rank` names ignoring SIGTERM (as a rank stuck in native code does). No
markers unless `markers`."""

import argparse
import os
import signal
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="finish")
parser.add_argument("--deaf-rank", type=int, default=-1)
args = parser.parse_args()

print(f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')} starting", flush=True)
if args.mode == "markers":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import ups_doctor
    ups_doctor.mark("forward", 0)
    ups_doctor.step(0, loss=1.5)
    ups_doctor.done()
elif args.mode == "swallow":
    try:
        raise ValueError("the dataset path does not exist")
    except ValueError as error:
        print(f"wrapper: ignoring {error}", file=sys.stderr, flush=True)
        os._exit(0)
elif args.mode == "deadlock":
    lock = threading.Lock()
    lock.acquire()
    print("taking the lock a second time", flush=True)
    lock.acquire()
elif args.mode == "wait":
    rank = int(os.environ.get("RANK", "0"))
    if rank == args.deaf_rank:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"rank {rank} waiting", flush=True)
    time.sleep(600)
print("training finished", flush=True)
