"""The training-step peer: ups-doctor's operator (upsmodel.py) trained the way src/trainer/train.rs
trains it, in PyTorch eager, printing the same `done:` line as `ups-doctor train`.

    python step.py --model '{"hidden": 64, ...}' --samples 64 --grid 128 --timesteps 10 \
        --queries 64 --batch 16 --steps 200 [--threads N]
    torchrun --standalone --nproc-per-node 2 step.py ... --batch 8 --parallel ddp
    python step.py ... --steps 3 --count-ops   # ATen ops a step: launch-bound or compute-bound?

Per step, like the trainer: build the batch in the process (timed as data), forward, MSE loss read
back to the host, backward, (DDP: gradients all-reduced by DistributedDataParallel's hooks and the
loss averaged over ranks), global-norm clipping at 1.0, AdamW (torch.optim.AdamW, lr 0.002 with
the trainer's linear warm-up, weight decay 0.01), gradients set to None. `--batch` is per rank, as
`data.batch_size` is; ranks take disjoint slices of one global batch.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import upsdata  # noqa: E402
import upsmodel  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    for name, default in [("samples", 64), ("grid", 128), ("timesteps", 10), ("queries", 64), ("batch", 16),
                          ("steps", 200), ("seed", 0), ("threads", 0)]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--model", default="{}", help="JSON object of model fields over ups-doctor's defaults")
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--parallel", choices=["single", "ddp"], default="single")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: model and batches on the GPU (copied "
                   "from pinned memory, like the trainer's `launch.device: cuda`)")
    p.add_argument("--count-ops", action="store_true", help="after the loop, count the ATen ops of one more "
                   "step (torch.profiler) and time a trivial op: is the step launch-bound or compute-bound?")
    a = p.parse_args()
    if a.count_ops and a.parallel != "single":
        p.error("--count-ops profiles one rank's step: use it with --parallel single")
    dev = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = dict(upsmodel.DEFAULT_MODEL, **json.loads(a.model))

    rank, world = 0, 1
    if a.parallel == "ddp":
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)
    data = upsdata.generate(a.samples, a.grid, a.timesteps)
    frames = data.u.reshape(a.samples * a.timesteps, a.grid)
    model = upsmodel.Operator(cfg).to(dev)
    params = upsmodel.parameter_count(model)
    if a.parallel == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    x = (torch.arange(a.grid, dtype=torch.float32) / a.grid).to(dev)
    gen = torch.Generator().manual_seed(a.seed)
    pairs = a.samples * (a.timesteps - 1)
    global_batch = a.batch * world
    order, cursor = torch.randperm(pairs, generator=gen), 0
    warmup = min(max(a.steps // 10, 1), 50)

    def compute(step, u, nu, xq, target):
        """One step after the batch: the part timed as compute."""
        pred = model(u, x, nu, xq)
        loss = F.mse_loss(pred, target)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            sys.exit(f"error: loss became non-finite ({loss_value}) at step {step}")
        loss.backward()
        if world > 1:
            reduced = torch.tensor([loss_value])
            dist.all_reduce(reduced)
            loss_value = reduced.item() / world
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = a.lr * min((step + 1) / warmup, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss_value

    first_loss = loss_value = float("nan")
    data_s = compute_s = 0.0
    loop_start = time.perf_counter()
    for step in range(a.steps):
        t0 = time.perf_counter()
        if cursor + global_batch > pairs:
            order, cursor = torch.randperm(pairs, generator=gen), 0
        picks = order[cursor + rank * a.batch: cursor + (rank + 1) * a.batch]
        cursor += global_batch
        u, nu, xq, target = upsdata.make_batch(frames, data.nu_feature, data.u_mean, data.u_std, a.timesteps,
                                               a.grid, a.queries, picks, gen)
        if dev.type == "cuda":
            u, nu, xq, target = (t.pin_memory().to(dev, non_blocking=True) for t in (u, nu, xq, target))
        t1 = time.perf_counter()
        loss_value = compute(step, u, nu, xq, target)
        t2 = time.perf_counter()
        data_s += t1 - t0
        compute_s += t2 - t1
        if step == 0:
            first_loss = loss_value
    if dev.type == "cuda":
        torch.cuda.synchronize()
    loop_s = time.perf_counter() - loop_start
    if rank == 0:
        print(f"parameters: {params}; intra-op threads: {torch.get_num_threads()}; ranks: {world}")
        if a.count_ops:
            count_ops(lambda: compute(a.steps, u, nu, xq, target))
        print(f"done: {a.steps} steps, loss {first_loss:.5f} -> {loss_value:.5f}; {a.steps} steps in "
              f"{loop_s:.3f} s, {a.steps / loop_s:.3f} steps/s (data {data_s:.3f} s, compute {compute_s:.3f} s)",
              flush=True)
    if world > 1:
        # Every rank past its last collective, then out without tearing Gloo down: on this machine
        # a rank sometimes aborted in Gloo's teardown ("terminate called without an active
        # exception", SIGABRT, with or without destroy_process_group) after its work was done.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def count_ops(step):
    """Prints how many ATen ops one more step issues (top-level ones: those the program or autograd
    called, not those inside other ops) and what a trivial op costs end to end from Python. The
    step time per op against that cost tells the two regimes apart: a launch-bound step spends a
    few times an empty op on each op, a compute-bound one many times it (its kernels dominate)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ops = sum(1 for e in prof.events()
              if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    a, b = torch.zeros(1), torch.zeros(1)
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        torch.add(a, b, out=a)
    print(f"ops per step: {ops}; a trivial op: {(time.perf_counter() - t) / n * 1e6:.2f} us", flush=True)


if __name__ == "__main__":
    main()
