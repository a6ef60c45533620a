"""ddp.py started by Slurm's `srun`, for ups-doctor's srun tests (tests/slurm.rs). Each task reads
its rank from SLURM_PROCID, the world size from SLURM_NTASKS and its local rank from
SLURM_LOCALID, exports them as RANK/WORLD_SIZE/LOCAL_RANK (as users' Slurm programs do) with
MASTER_ADDR from `--master-addr` (127.0.0.1 unless given: the first host of a job across hosts)
and MASTER_PORT from `--port` (or the environment), then runs ddp.py with
the other arguments (`--steps`, `--segv-rank/--segv-step`, `--skip-rank/--skip-step`).

    srun -N1 -n2 python srun_ddp.py --port 29731 --steps 6
"""

import argparse
import os
import runpy
import sys

parser = argparse.ArgumentParser(add_help=False)
parser.add_argument("--port", type=int, default=None)
parser.add_argument("--master-addr", default="127.0.0.1")
args, rest = parser.parse_known_args()

for need in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
    if need not in os.environ:
        sys.exit(f"srun_ddp.py: {need} is not set: start this program with srun")
os.environ["RANK"] = os.environ["SLURM_PROCID"]
os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
os.environ["MASTER_ADDR"] = args.master_addr
if args.port is not None:
    os.environ["MASTER_PORT"] = str(args.port)
if "MASTER_PORT" not in os.environ:
    sys.exit("srun_ddp.py: pass --port or set MASTER_PORT")

ddp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp.py")
sys.argv = [ddp, *rest]
runpy.run_path(ddp, run_name="__main__")
