"""A 2-rank DDP program (CPU, gloo, a tiny linear model, no ups-doctor markers) started the ways
users start DDP, for the tests of ups-doctor's rank discovery (tests/launchers.rs). `--launcher`:

- `env`: the ranks read `RANK` from their environment (torchrun, `accelerate launch`);
- `spawn`: `torch.multiprocessing.spawn(work, nprocs=2)`: the rank is only `work`'s argument;
- `fork`: `torch.multiprocessing.start_processes(work, nprocs=2, start_method="fork")`: the ranks
  are forks of this process (as Lightning's `ddp_fork` and notebooks start them), their command
  lines this one's;
- `lightning`: `Trainer(accelerator="cpu", devices=2, strategy="ddp")`, run as `python
  launchers.py`: Lightning runs rank 0 in this process and starts rank 1 with `LOCAL_RANK`;
- `popen`: a home-made launcher (as some clusters' wrappers are): this process starts two copies
  of itself with `subprocess`, each with its rank only as an argument (`--rank`), and polls them
  as torchrun does (every 0.5 s; on the first failure the other gets SIGTERM, and it exits 1).

`--port-from env` (spawn, fork, popen): the rendezvous port is ups-doctor's (`PET_MASTER_PORT`),
and a popen child gets it in `MASTER_PORT`; `own`: a free port of the program's own, which a popen child
gets only as an argument: nothing outside the program knows it.

`--helper`: the program imports python/ups_doctor.py and reports its steps (`ups_doctor.step`).
`--workers N`: each rank reads its batches through a DataLoader with N (forked) workers.
`--worker-start spawn`: the workers are spawned instead (`multiprocessing_context="spawn"`, as
programs that use CUDA in workers must): their queues' semaphores are then named files in
`/dev/shm` that Python's resource tracker unlinks once no process that uses them is left.
`--show-semaphores`: each rank prints the name of every semaphore it registers with the resource
tracker (`rank R semaphore sem.mp-…`, the file's name in `/dev/shm`).

`--segv-rank R --segv-step S`: rank R reads address 0 (a real SIGSEGV) at step S.
`--segv-wait PATH`: before that, rank R creates `PATH.waiting` and waits for `PATH.go` (a test
freezes ups-doctor in between).
`--raise-rank R --raise-step S`: rank R raises `ValueError` at step S (under `spawn`, whose
wrapper catches it in the child and relays its traceback to the launcher).
`--quiet-launcher` (spawn): the launcher exits 1 without printing the exception spawn raises (a
rank's relayed traceback is lost, as when a launcher is torn down before it raises it).
`--hang-rank R --hang-step S`: rank R skips step S's gradient all-reduce and waits in
`dist.barrier()`; the other rank waits in the all-reduce: both hang.
Rank 0 prints `training finished` at the end.
"""

import argparse
import ctypes
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True, choices=["env", "spawn", "fork", "lightning", "popen"])
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--segv-rank", type=int, default=-1)
parser.add_argument("--segv-step", type=int, default=-1)
parser.add_argument("--segv-wait", default="")
parser.add_argument("--raise-rank", type=int, default=-1)
parser.add_argument("--raise-step", type=int, default=-1)
parser.add_argument("--hang-rank", type=int, default=-1)
parser.add_argument("--hang-step", type=int, default=-1)
parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher (RANK is set too)")
parser.add_argument("--helper", action="store_true")
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--worker-start", choices=["fork", "spawn"], default="fork")
parser.add_argument("--show-semaphores", action="store_true")
parser.add_argument("--port-from", choices=["env", "own"], default="env")
parser.add_argument("--quiet-launcher", action="store_true")
parser.add_argument("--rank", type=int, default=-1, help="a popen child's rank")
parser.add_argument("--port", type=int, default=0, help="a popen child's rendezvous port")
args = parser.parse_args()

if args.helper:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import ups_doctor
else:
    ups_doctor = None


def faults(rank, step):
    if rank == args.segv_rank and step == args.segv_step:
        if args.segv_wait:
            open(args.segv_wait + ".waiting", "w").close()
            while not os.path.exists(args.segv_wait + ".go"):
                time.sleep(0.05)
        print(f"rank {rank}: segfaulting at step {step}", flush=True)
        ctypes.string_at(0)
    if rank == args.raise_rank and step == args.raise_step:
        raise ValueError(f"bad shard on rank {rank}")
    if rank == args.hang_rank and step == args.hang_step:
        print(f"rank {rank}: skipping the all-reduce of step {step}", flush=True)
        dist.barrier()


def show_semaphores(rank):
    from multiprocessing import resource_tracker

    register = resource_tracker.register

    def shown(name, rtype):
        if rtype == "semaphore":
            # sem_open's "/mp-…" is /dev/shm/sem.mp-….
            print(f"rank {rank} semaphore sem.{name.lstrip('/')}", flush=True)
        register(name, rtype)

    resource_tracker.register = shown


def train(rank):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    data = torch.randn(16 * args.steps, 8, generator=generator)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data),
        batch_size=16,
        num_workers=args.workers,
        # Forked as on Linux by default (under mp.spawn the default would be spawn: slower).
        multiprocessing_context=args.worker_start if args.workers else None,
        worker_init_fn=ups_doctor.worker_init_fn if ups_doctor else None,
    )
    if args.show_semaphores:
        show_semaphores(rank)
    for step, (x,) in enumerate(loader):
        if ups_doctor:
            ups_doctor.mark("forward", step)
        faults(rank, step)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if ups_doctor:
            ups_doctor.step(step, loss=loss.item(), samples=len(x))
    dist.destroy_process_group()
    if ups_doctor:
        ups_doctor.done()
    if rank == 0:
        print("training finished", flush=True)


def work(rank, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=2)
    train(rank)


def lightning_main():
    import lightning as L

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, step):
            faults(self.global_rank, step)
            (x,) = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), x.sum(dim=1, keepdim=True))
            print(f"rank {self.global_rank} step {step} loss {loss.item():.4f}", flush=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=4)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=os.environ.get("TMPDIR", "/tmp"),
    )
    trainer.fit(Model(), data)
    if trainer.global_rank == 0:
        print("training finished", flush=True)


def rendezvous_port():
    if args.port_from == "env":
        return int(os.environ.get("PET_MASTER_PORT", "29500"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def popen_main():
    if args.rank >= 0:
        work(args.rank, str(args.port))
        return
    port = rendezvous_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "MASTER_PORT")}
    if args.port_from == "env":
        env["MASTER_PORT"] = str(port)
    argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
    children = [subprocess.Popen([*argv, "--rank", str(r), "--port", str(port)], env=env) for r in range(2)]
    while True:
        codes = [c.poll() for c in children]
        if any(code not in (None, 0) for code in codes):
            for c in children:
                if c.poll() is None:
                    c.terminate()
            for c in children:
                c.wait()
            sys.exit(1)
        if all(code == 0 for code in codes):
            return
        time.sleep(0.5)


def end_without_finalizing():
    """Without ups-doctor's observer (`launch.observe: false`), a rank ends here with `os._exit`
    once its output is flushed: PyTorch 2.11's gloo ranks abort now and then as Python finalizes
    (`terminate called without an active exception`, a gloo thread retaking the GIL; about one
    bare run in five under load, BENCHMARKS.md), which the rank-discovery tests that use this
    program are not about. With the observer its exit handler must run, so the program ends as
    programs do."""
    if os.environ.get("UPS_DOCTOR_OBSERVE") == "0":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    if args.launcher == "popen":
        popen_main()
    elif args.launcher == "env":
        dist.init_process_group("gloo")
        train(int(os.environ["RANK"]))
    elif args.launcher == "spawn":
        try:
            torch.multiprocessing.spawn(work, args=(str(rendezvous_port()),), nprocs=2)
        except Exception:
            if not args.quiet_launcher:
                raise
            sys.exit(1)
    elif args.launcher == "fork":
        torch.multiprocessing.start_processes(work, args=(str(rendezvous_port()),), nprocs=2, start_method="fork")
    else:
        lightning_main()
    end_without_finalizing()
