"""A DDP program (CPU, gloo) whose DataLoader workers hand their batches over through the
multiprocessing queue's own pickling: its `collate_fn` stacks the samples into a plain tensor, so
the queue's feeder thread (`multiprocessing.queues._feed`) moves each batch into `/dev/shm` as it
sends it. Where `/dev/shm` is too small for a batch (`--shm-size 6m`: a batch is 8 MiB), that thread
prints `RuntimeError: unable to allocate shared memory(shm) for file </torch_…>` and drops the
batch, raising nothing: the rank then waits for it forever (no DataLoader `timeout`). It knows
nothing of ups-doctor."""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Big(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.ones(1024, 1024)  # 4 MiB a sample


def collate(samples):
    return torch.stack(samples)


dist.init_process_group("gloo")
loader = DataLoader(Big(), batch_size=2, num_workers=2, collate_fn=collate)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, x in enumerate(loader):
    optimizer.zero_grad()
    model(x.mean(1)).sum().backward()
    optimizer.step()
    print("step", step, flush=True)
print("training finished", flush=True)
