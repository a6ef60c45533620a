#!/usr/bin/env python3
"""The merge of nodes, the judge and the report at the scale real jobs reach (issue 59): runs the
`scale` bench binary (bench/scale.rs: a job simulated from a real run's recorded result) for each
case and size, each in a process of its own so that its peak memory (VmHWM) is that size's alone,
`--rounds` times, and prints a markdown table of medians for BENCHMARKS.md, with the date, the
machine's load and the command.

    bench/scale.py [--sizes 64:8,256:32,1024:128,4096:512] [--cases hang,crash] [--rounds 3]
                   [--out DIR]   # DIR/CASE-RANKS/{report.md,result.json,trace.json} of the last round

Needs the environment of `./x env` (cargo builds the bench in release). Times are the wall clock
of one thread doing the work, so a busy machine inflates them: the load is printed with them.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys


def build():
    out = subprocess.run(
        ["cargo", "bench", "--bench", "scale", "--no-run", "--message-format", "json"],
        check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "scale" and msg.get("executable"):
            return msg["executable"]
    sys.exit("scale.py: cargo built no `scale` bench executable")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64:8,256:32,1024:128,4096:512", help="RANKS:NODES,…")
    ap.add_argument("--cases", default="hang,crash")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    exe = build()
    sizes = [tuple(int(v) for v in s.split(":")) for s in a.sizes.split(",")]
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores; `bench/scale.py --sizes {a.sizes} --cases {a.cases} --rounds {a.rounds}`\n")
    print("| case | ranks | nodes | merge + judge | judge again | report.md | result.json | trace.json "
          "| peak RSS (input) | report chars | result.json | trace.json (events) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for case in a.cases.split(","):
        for ranks, nodes in sizes:
            rounds = []
            for i in range(a.rounds):
                cmd = [exe, "--case", case, "--ranks", str(ranks), "--nodes", str(nodes)]
                if a.out and i == a.rounds - 1:
                    cmd += ["--out", os.path.join(a.out, f"{case}-{ranks}")]
                rounds.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
            med = lambda k: statistics.median(r[k] for r in rounds)
            last = rounds[-1]
            print(
                f"| {case} | {ranks} | {nodes} | {med('merge_s') * 1e3:.0f} ms | {med('conclude_s') * 1e3:.0f} ms "
                f"| {med('markdown_s') * 1e3:.0f} ms | {med('result_json_s') * 1e3:.0f} ms | {med('trace_s') * 1e3:.0f} ms "
                f"| {med('peak_rss_mib'):.0f} MiB ({med('input_rss_mib'):.0f}) | {last['report_chars']:,} "
                f"| {last['result_json_bytes'] / 2**20:.1f} MiB | {last['trace_bytes'] / 2**20:.1f} MiB ({last['trace_events']:,}) |",
                flush=True,
            )
            print(f"<!-- {case} {ranks}: {last['headline'][:300]} -->", file=sys.stderr)


if __name__ == "__main__":
    main()
