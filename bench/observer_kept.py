#!/usr/bin/env python3
"""What keeping a collective in the file the observer maps costs (`_Observer.tail_issued` and
`tail_returned` in python/site/sitecustomize.py: the newest 32 collectives of a rank, read by
ups-doctor after the rank ended), a collective, in one process.

    python3 bench/observer_kept.py --python PYTHON [--site DIR ...] [--calls 200000] [--rounds 7]

Each `--site` folder holds a `sitecustomize.py` (default: this tree's `python/site`). A child
process per site loads it as a module (no observer starts: no marker pipe is given), makes an
observer whose file goes to a temporary folder, and times `--calls` pairs of calls with an entry
as the collective wrapper makes it (an `all_gather` of one float tensor from one call site) in
`--rounds` rounds; it prints the least and the median nanoseconds a pair. Timed on a loaded
machine the least is the figure to compare; versions are compared in one invocation. Nothing
here is asserted by the test suite.
"""
import argparse
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(site, calls, rounds):
    import importlib.util
    import time

    import torch

    folder = tempfile.mkdtemp(prefix="observer-kept-")
    os.environ["UPS_DOCTOR_STOP_STACKS"] = folder
    spec = importlib.util.spec_from_file_location("observer_under_test", os.path.join(site, "sitecustomize.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    observer = module._Observer(os.open(os.devnull, os.O_WRONLY), None)
    if not hasattr(observer, "tail_issued"):
        print(f"{site}: this observer keeps no collectives in a file")
        return
    entry = {"t": "collective", "op": "all_gather", "group": "default", "seq": 1, "shapes": [torch.Size([1])],
             "dtype": torch.float32, "site": "train.py:40", "pos": 7}
    took = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            n = observer.tail_issued(entry)
            observer.tail_returned(n, 0.5)
        took.append((time.perf_counter_ns() - start) / calls)
    took.sort()
    print(f"{site}: least {took[0]:,.0f} ns, median {took[len(took) // 2]:,.0f} ns a collective "
          f"({calls:,} calls, {rounds} rounds)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=os.environ.get("UPS_DOCTOR_PYTHON", "python3"))
    parser.add_argument("--site", action="append", help="a folder holding a sitecustomize.py (repeat to compare)")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.calls, args.rounds)
    sites = [os.path.abspath(s) for s in (args.site or [os.path.join(REPO, "python", "site")])]
    for s in sites:
        if not os.path.isfile(os.path.join(s, "sitecustomize.py")):
            sys.exit(f"--site {s}: no sitecustomize.py there; give a folder that holds one (this tree's is python/site)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPS_DOCTOR_MARKER")}
    for s in sites:
        out = subprocess.run([args.python, os.path.abspath(__file__), "--child", s, "--calls", str(args.calls),
                              "--rounds", str(args.rounds)], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"child with --site {s} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
