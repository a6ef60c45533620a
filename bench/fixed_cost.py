#!/usr/bin/env python3
"""What ups-doctor costs around a program, side by side in one run (standard library only).

    python3 bench/fixed_cost.py [--binary target/release/ups-doctor] [--python VENV_PYTHON]
                                [--runs 15] [--pairs 7] [--steps 3000] [--hidden 64]
                                [--programs observed_ddp.py,ddp.py] [--no-unobserved] [--out FILE.md]

1. `ups-doctor --version`: the start of the binary alone (it links no libtorch).
2. `ups-doctor run` of a one-line scenario whose command is `true`: the fixed cost of a run
   (reading the machine, planning, supervising, judging, writing result.json and report.md).
3. Two real DDP programs under torchrun (2 CPU ranks, gloo, step count sets the length), bare,
   under `ups-doctor run`, and under `ups-doctor run --no-observe` (no observer in its Python
   processes), interleaved A B C A B C after one thrown-away warm-up round: wall time of each,
   bare/under per round (1.0 = no cost), and the observer's own cost, no-observe/observed per
   round (issue 29's goal: at least 0.99), and the same for the CPU time of every process of the
   run (ups-doctor's, torchrun's, the ranks'): the work ups-doctor and the observer add, apart
   from when the scheduler let it run:
   - tests/programs/observed_ddp.py, a program as users bring it (no ups-doctor import; a
     DataLoader, DDP, and an `all_gather` of the loss every step): what ups-doctor costs;
   - tests/programs/ddp.py, which marks four phases a step with python/ups_doctor.py: what the
     helper's markers cost besides (no-ops when the program runs bare).
   `--hidden` widens observed_ddp.py's model, to tell a cost per step from a cost per run (64 by
   default: steps of about 3 ms on a 2-core machine; 16384 is hardly slower; 65536: about 29 ms),
   and the median step time the observer measured (rank 0, from the observed runs' result.json)
   is printed beside the ratios. `--programs` runs only the named ones. `--no-unobserved` leaves
   out the `--no-observe` contender (issue 29's figure): two runs a round instead of three, so
   more rounds of bare against under in the same time.

Medians with min–max. Nothing here is asserted by the test suite.
"""

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wall(cmd, env=None, cwd=None):
    return measure(cmd, env, cwd)[0]


# Runs that trained to their end and then did not exit 0: PyTorch 2.11's gloo ranks abort at
# exit now and then (BENCHMARKS.md), bare too. Their time stands (the abort comes after the last
# step); they are counted and printed.
ENDED_BADLY = []


def measure(cmd, env=None, cwd=None, finished=None):
    """Wall seconds, and CPU seconds (user + system) of the command and every process below it
    that was waited for: ups-doctor's own, torchrun's and the ranks'. A command that fails stops
    the bench, unless `finished(stdout)` says it trained to its end (then it is counted in
    `ENDED_BADLY`)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        if finished is None or not finished(done.stdout.decode(errors="replace")):
            sys.exit(f"fixed_cost: {' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stderr.decode()[-2000:]}")
        ENDED_BADLY.append(f"{' '.join(map(str, cmd[:3]))} … exited {done.returncode} after training to its end")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def trained_bare(stdout):
    return "training finished" in stdout


def trained_under(out):
    """Whether the run in `out` trained to its end: its launcher's output says so."""
    return lambda _stdout: any(
        "training finished" in p.read_text(errors="replace") for p in Path(out).glob("*/launcher.stdout.log")
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def spread(values):
    """The mean and its 95 % interval (1.96 standard errors), from two values up."""
    if len(values) < 2:
        return "—"
    return f"{statistics.mean(values):.4f} ± {1.96 * statistics.stdev(values) / len(values) ** 0.5:.4f}"


def stat(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def ddp_rounds(binary, work, env, script, what, args):
    program = REPO / "tests" / "programs" / script
    argv = ["torchrun", "--nproc_per_node", "2", str(program), "--steps", str(args.steps)]
    if script == "observed_ddp.py":
        argv += ["--hidden", str(args.hidden)]
    scenario = work / f"{script}.json"
    scenario.write_text(
        json.dumps({"name": "ddp", "command": argv, "launch": {"world_size": 2, "style": "launcher"}})
    )
    bare, under, unobserved, steps = [], [], [], []
    bare_cpu, under_cpu, unobserved_cpu = [], [], []
    for i in range(args.pairs + 1):
        # A free port, as ups-doctor gives its runs: torchrun's default (29500) is shared with
        # whatever else runs on the machine (a bare run aborted on it beside the test suite).
        b = measure(argv, env=dict(env, PET_MASTER_PORT=free_port()), cwd=work, finished=trained_bare)
        out = work / f"{script}-{i}"
        u = measure([binary, "run", scenario, "--quiet", "--out", out], env=env, cwd=work, finished=trained_under(out))
        out = work / f"{script}-plain-{i}"
        n = (
            (float("nan"), float("nan"))
            if args.no_unobserved
            else measure(
                [binary, "run", scenario, "--quiet", "--no-observe", "--out", out],
                env=env,
                cwd=work,
                finished=trained_under(out),
            )
        )
        # Each round as it ends (stderr), so a long reading cut short keeps what it had.
        if args.no_unobserved:
            print(f"round {i}: bare {b[0]:.3f} s, under {u[0]:.3f} s; CPU {b[1]:.3f} / {u[1]:.3f} s",
                  file=sys.stderr, flush=True)
        else:
            print(f"round {i}: bare {b[0]:.3f} s, under {u[0]:.3f} s, no-observe {n[0]:.3f} s; "
                  f"CPU {b[1]:.3f} / {u[1]:.3f} / {n[1]:.3f} s", file=sys.stderr, flush=True)
        if i > 0:  # the first round warms the page cache
            bare.append(b[0])
            under.append(u[0])
            unobserved.append(n[0])
            bare_cpu.append(b[1])
            under_cpu.append(u[1])
            unobserved_cpu.append(n[1])
            step = observed_step_ms(work / f"{script}-{i}" / "result.json")
            if step is not None:
                steps.append(step)
    ratios = [b / u for b, u in zip(bare, under)]
    observer = [n / u for n, u in zip(unobserved, under)]
    cpu_ratios = [b / u for b, u in zip(bare_cpu, under_cpu)]
    cpu_observer = [n / u for n, u in zip(unobserved_cpu, under_cpu)]
    unobserved_rows = [] if args.no_unobserved else [
        f"| under `ups-doctor run --no-observe` | {stat(unobserved)} | {stat(unobserved_cpu)} |",
    ]
    observer_rows = [] if args.no_unobserved else [
        f"| no-observe / observed, per round: the observer's cost (1.0: none) | {stat(observer)} | {stat(cpu_observer)} |",
    ]
    observer_spread = [] if args.no_unobserved else [
        f"| no-observe / observed, the same | {spread(observer)} | {spread(cpu_observer)} |",
    ]
    return [
        "",
        f"`{' '.join(argv[3:]).replace(str(REPO) + '/', '')}` under torchrun (2 CPU ranks, gloo; {what}), "
        f"{args.pairs} interleaved rounds after one warm-up; a step (the observer's median, rank 0): "
        f"{stat(steps) + ' ms' if steps else 'not measured'}:",
        "",
        "| contender | wall s, median (min–max) | CPU s of every process, median (min–max) |",
        "| --- | --- | --- |",
        f"| bare `torchrun` | {stat(bare)} | {stat(bare_cpu)} |",
        f"| under `ups-doctor run` (observer on, the default) | {stat(under)} | {stat(under_cpu)} |",
        *unobserved_rows,
        f"| bare / under, per round (1.0: no cost) | {stat(ratios)} | {stat(cpu_ratios)} |",
        *observer_rows,
        f"| bare / under, mean of the rounds' ratios ± 1.96 standard errors | {spread(ratios)} | {spread(cpu_ratios)} |",
        *observer_spread,
    ]


def observed_step_ms(result):
    """Rank 0's median step time as the observer measured it, from a run's result.json."""
    try:
        ranks = json.loads(result.read_text())["scenarios"][0]["ranks"]
        step = next(r for r in ranks if r["rank"] == 0)["observed"]["step_ms"]
    except (OSError, ValueError, KeyError, IndexError, StopIteration, TypeError):
        return None
    return step or None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=str(REPO / "target" / "release" / "ups-doctor"))
    ap.add_argument("--python", default=os.environ.get("UPS_DOCTOR_PYTHON"))
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--hidden", type=int, default=64, help="observed_ddp.py's hidden width")
    ap.add_argument("--programs", default="observed_ddp.py,ddp.py", help="which of the two programs to run")
    ap.add_argument("--no-unobserved", action="store_true", help="leave out the --no-observe contender")
    ap.add_argument("--out")
    args = ap.parse_args()
    binary = Path(args.binary).resolve()
    if not binary.exists():
        sys.exit(f"fixed_cost: no binary at {binary}: run `./x release`")
    work = Path(tempfile.mkdtemp(prefix="ups-fixed-cost-"))
    lines = [f"`{' '.join(sys.argv)}`, binary `{binary}`", ""]

    version = [wall([binary, "--version"]) for _ in range(args.runs)]
    true_file = work / "true.json"
    true_file.write_text(json.dumps({"name": "true", "command": ["true"]}))
    runs = [
        wall([binary, "run", true_file, "--quiet", "--out", work / f"true-{i}"], cwd=work) for i in range(args.runs)
    ]
    lines += [
        "| what | wall s, median (min–max) | runs |",
        "| --- | --- | --- |",
        f"| `ups-doctor --version` | {stat(version)} | {args.runs} |",
        f"| `ups-doctor run` of `{{\"command\": [\"true\"]}}` | {stat(runs)} | {args.runs} |",
    ]

    if args.python:
        venv_bin = str(Path(args.python).parent)
        env = dict(os.environ, PATH=venv_bin + os.pathsep + os.environ.get("PATH", ""), OMP_NUM_THREADS="1")
        for script, what in (
            ("observed_ddp.py", "no ups-doctor import: a program as users bring it"),
            ("ddp.py", "four helper markers a step, no-ops when bare"),
        ):
            if script in args.programs.split(","):
                lines += ddp_rounds(binary, work, env, script, what, args)
    if ENDED_BADLY:
        lines += ["", f"{len(ENDED_BADLY)} run(s) trained to their end and then exited non-zero (counted, their times kept):"]
        lines += [f"- {e}" for e in ENDED_BADLY]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
