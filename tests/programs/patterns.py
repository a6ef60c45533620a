"""Small PyTorch programs (CPU, gloo) that each fail in one known way, for the tests of
ups-doctor's failure patterns (docs/patterns.md). No markers: ups-doctor must judge them from
what any program leaves (exit status, output, py-spy stacks). `--case`:

- `out_of_step`: DDP, rank 0 runs one step fewer and then calls `dist.barrier()`; rank 1 waits
  in the next step's gradient all-reduce. Both hang.
- `unused`: DDP over a model with a layer that never takes part in the loss; the second
  forward raises "Expected to have finished reduction in the prior iteration…".
- `fork_threads`: two intra-op threads run a big matmul, then the process forks and the child
  runs a big matmul: it deadlocks in libgomp; the parent waits for it.
- `early_exit`: rank 1 leaves with status 0 before `init_process_group`; rank 0 waits at the
  rendezvous until its short `timeout=` and fails.
- `uneven_steps`: DDP, rank 1's shard is shorter: it leaves the loop after 2 steps and exits
  with status 0 while rank 0 goes on; rank 0's next all-reduce loses its peer.
- `dataset_error`: a DataLoader worker's `__getitem__` raises for sample 5.
- `worker_kill`: a DataLoader worker SIGKILLs itself (a kill by hand, not the OOM killer).
- `worker_exit`: a DataLoader worker's `__getitem__` says why on stderr and calls `sys.exit(3)`
  for sample 5: the worker ends with status 3, no exception reaches the main process.
- `rank_kill`: DDP, rank 1 SIGKILLs itself in step 2; rank 0 loses its peer.
- `model_mismatch`: rank 1 builds its model with an extra layer; DDP's constructor refuses
  ("DDP expects same model across all ranks…").
- `nan_loss`: DDP, rank 1's batch of step 3 holds a NaN; its loss is NaN and it raises
  `FloatingPointError`; rank 0 loses its peer.
- `fsdp_inplace_view`: real FSDP on CPU (`device_id=cpu`, gloo); rank 1's forward scales a
  parameter in place, which FSDP has made a view of its flat parameter: autograd refuses.
- `reentrant_checkpoint`: DDP (`find_unused_parameters=True`) over a model whose first layer runs
  under `torch.utils.checkpoint(use_reentrant=True)`: the nested backward marks its parameters
  ready twice ("Expected to mark a variable ready only once"), on every rank.
- `input_bound`: a dataset that takes 0.2 s per sample and a tiny model; the loop reports its
  `data.next` waits and its steps through python/ups_doctor.py, then finishes normally.
"""

import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--case", required=True)
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()
rank = int(os.environ.get("RANK", "0"))


def ddp_model(unused=False):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(8, 1)
            self.unused = torch.nn.Linear(8, 1)

        def forward(self, x):
            return self.used(x)

    torch.manual_seed(0)
    net = Net() if unused else torch.nn.Linear(8, 1)
    return torch.nn.parallel.DistributedDataParallel(net)


def train(model, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        x = torch.randn(4, 8)
        if args.case == "nan_loss" and rank == 1 and step == 3:
            x[0, 0] = float("nan")
        loss = model(x).pow(2).mean()
        if torch.isnan(loss):
            raise FloatingPointError(f"loss is nan at step {step}")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        if args.case == "dataset_error" and index == 5:
            raise ValueError(f"corrupt sample at index {index}")
        if args.case == "worker_kill" and index == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.case == "worker_exit" and index == 5:
            # A library that gives up by exiting (SystemExit is no Exception: the DataLoader
            # worker does not catch it, and the worker process ends with that status).
            print(f"error: sample {index} is unreadable, giving up", file=sys.stderr, flush=True)
            sys.exit(3)
        if args.case == "input_bound":
            time.sleep(0.2)
        return torch.full((4,), float(index))


if args.case == "out_of_step":
    dist.init_process_group("gloo")
    train(ddp_model(), args.steps - 1 if rank == 0 else args.steps)
    dist.barrier()
elif args.case == "unused":
    dist.init_process_group("gloo")
    train(ddp_model(unused=True), args.steps)
elif args.case == "reentrant_checkpoint":
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = torch.nn.Linear(8, 8)
            self.last = torch.nn.Linear(8, 1)

        def forward(self, x):
            return self.last(checkpoint(self.first, x.requires_grad_(), use_reentrant=True))

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train(torch.nn.parallel.DistributedDataParallel(Checkpointed(), find_unused_parameters=True), args.steps)
elif args.case == "fork_threads":
    torch.set_num_threads(2)
    a = torch.randn(1024, 1024)
    (a @ a).sum()
    pid = os.fork()
    if pid == 0:
        print("child: multiplying", flush=True)
        (a @ a).sum()
        os._exit(0)
    os.waitpid(pid, 0)
elif args.case == "early_exit":
    if rank == 1:
        print("rank 1: no shard for me, leaving", flush=True)
        sys.exit(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
    train(ddp_model(), args.steps)
elif args.case == "uneven_steps":
    dist.init_process_group("gloo")
    train(ddp_model(), 2 if rank == 1 else 12)
    print(f"rank {rank}: my shard is done", flush=True)
elif args.case in ("dataset_error", "worker_kill", "worker_exit"):
    loader = torch.utils.data.DataLoader(Samples(), batch_size=2, num_workers=2)
    for batch in loader:
        print(f"batch {batch[:, 0].tolist()}", flush=True)
elif args.case == "rank_kill":
    dist.init_process_group("gloo")
    model = ddp_model()
    train(model, 2)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    train(model, args.steps)
elif args.case == "model_mismatch":
    dist.init_process_group("gloo")
    layers = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)]
    if rank == 1:
        layers.append(torch.nn.Linear(1, 1))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    train(model, args.steps)
elif args.case == "nan_loss":
    dist.init_process_group("gloo")
    train(ddp_model(), args.steps + 2)
elif args.case == "fsdp_inplace_view":
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            if rank == 1:
                self.lin.weight.mul_(0.5)
            return self.lin(x)

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train(FSDP(Scaled(), device_id=torch.device("cpu")), args.steps)
elif args.case == "input_bound":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import ups_doctor

    model = torch.nn.Linear(4, 1)
    batches = iter(torch.utils.data.DataLoader(Samples(), batch_size=2))
    for step in range(args.steps):
        started = time.perf_counter()
        with ups_doctor.phase("data.next", step):
            batch = next(batches)
        waited = time.perf_counter()
        with ups_doctor.phase("forward", step):
            loss = model(batch).pow(2).mean()
        ups_doctor.step(step, loss=loss.item(), samples=len(batch), data_ms=(waited - started) * 1000.0,
                        compute_ms=(time.perf_counter() - waited) * 1000.0)
    ups_doctor.done()
else:
    sys.exit(f"unknown --case {args.case}")
print("training finished", flush=True)
