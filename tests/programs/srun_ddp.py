"""A 2-task DDP program started by Slurm's `srun` (CPU, gloo, a tiny MLP), for ups-doctor's srun
tests (tests/slurm.rs). Each task reads its rank from SLURM_PROCID, the world size from
SLURM_NTASKS and its local rank from SLURM_LOCALID, exports them as RANK/WORLD_SIZE/LOCAL_RANK
(as users' Slurm programs do) and rendezvous at MASTER_ADDR=127.0.0.1, port `--port` (or
MASTER_PORT). Markers go through python/ups_doctor.py, imported after RANK is set.

    srun -N1 -n2 python srun_ddp.py --port 29731

`--segv-rank R --segv-step S`: rank R reads address 0 (a real SIGSEGV) at the beginning of step
S's forward. `--skip-rank R --skip-step S`: rank R skips step S's backward (its gradient
all-reduce) and waits in `dist.barrier()` while the other rank waits in that all-reduce: both
hang. Prints `training finished` on rank 0 at the end."""

import argparse
import ctypes
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--port", type=int, default=None)
parser.add_argument("--segv-rank", type=int, default=-1)
parser.add_argument("--segv-step", type=int, default=-1)
parser.add_argument("--skip-rank", type=int, default=-1)
parser.add_argument("--skip-step", type=int, default=-1)
args = parser.parse_args()

for need in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
    if need not in os.environ:
        sys.exit(f"srun_ddp.py: {need} is not set: start this program with srun")
rank = int(os.environ["SLURM_PROCID"])
os.environ["RANK"] = str(rank)
os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
os.environ["MASTER_ADDR"] = "127.0.0.1"
if args.port is not None:
    os.environ["MASTER_PORT"] = str(args.port)
if "MASTER_PORT" not in os.environ:
    sys.exit("srun_ddp.py: pass --port or set MASTER_PORT")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import ups_doctor  # noqa: E402

with ups_doctor.phase("dist.init"):
    dist.init_process_group("gloo")
torch.manual_seed(0)
with ups_doctor.phase("model.build"):
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
generator = torch.Generator().manual_seed(rank)
for step in range(args.steps):
    ups_doctor.mark("data.next", step)
    x = torch.randn(32, 16, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    ups_doctor.mark("forward", step)
    if rank == args.segv_rank and step == args.segv_step:
        ctypes.string_at(0)
    loss = torch.nn.functional.mse_loss(model(x), y)
    if rank == args.skip_rank and step == args.skip_step:
        ups_doctor.mark("barrier", step)
        dist.barrier()
        continue
    ups_doctor.mark("backward", step)
    optimizer.zero_grad()
    loss.backward()
    ups_doctor.mark("optimizer", step)
    optimizer.step()
    ups_doctor.step(step, loss=loss.item(), samples=len(x))
    print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
ups_doctor.done()
if rank == 0:
    print("training finished", flush=True)
