#!/usr/bin/env python3
"""Who reads a launcher's segfaulting rank's exit status: ups-doctor's watcher or the launcher's
own account (standard library only; nothing here is asserted by the test suite).

    python3 bench/exit_race.py LAUNCHER ROUNDS BINARY [BINARY ...]

LAUNCHER is `spawn` (torch.multiprocessing.spawn, which reaps a rank the moment it exits),
`torchrun` or `popen` (tests/programs/launchers.py's own launchers). Each round runs every
BINARY once, alternating, on rank 1 of a 2-rank DDP program segfaulting at step 4, and counts
rank 1's `exit_source` in result.json: `procfs` means the watcher read the status before the
launcher reaped the rank; `spawn` or `torchrun` means it lost and the launcher's own account
was used. Needs the venv's python (`$UPS_DOCTOR_PYTHON`).
"""
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("spawn", "torchrun", "popen"):
        sys.exit(__doc__)
    launcher, rounds, binaries = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    program = str(REPO / "tests" / "programs" / "launchers.py")
    venv = os.path.dirname(os.environ["UPS_DOCTOR_PYTHON"])
    env = dict(os.environ, PATH=venv + os.pathsep + os.environ["PATH"])
    if launcher == "torchrun":
        argv = ["torchrun", "--nproc_per_node", "2", program, "--launcher", "env"]
    else:
        argv = ["python", program, "--launcher", launcher, "--port-from", "own"]
    argv += ["--steps", "6", "--segv-rank", "1", "--segv-step", "4"]
    work = Path(tempfile.mkdtemp(prefix="ups-exit-race-"))
    scenario = work / "segv.json"
    scenario.write_text(json.dumps({"name": "segv", "command": argv, "launch": {"world_size": 2},
                                    "limits": {"timeout_s": 300, "hang_after_s": 120}}))
    counts = {b: collections.Counter() for b in binaries}
    for i in range(rounds):
        for n, binary in enumerate(binaries):
            out = work / f"{i}-{n}"
            subprocess.run([binary, "run", scenario, "--quiet", "--out", out], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                rank = json.loads((out / "result.json").read_text())["scenarios"][0]["ranks"][1]
                counts[binary][f"{rank.get('exit_source')} {rank.get('outcome')} {rank.get('signal')}"] += 1
            except (OSError, ValueError, KeyError, IndexError) as e:
                counts[binary][f"no result ({e})"] += 1
        print(i, {b: dict(c) for b, c in counts.items()}, flush=True)


if __name__ == "__main__":
    main()
