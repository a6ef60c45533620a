"""A training step compiled with `torch.compile(fullgraph=True)` whose code branches on a tensor's
value (`loss.item() > 0`): TorchDynamo cannot put it into one graph and, with `fullgraph=True`,
raises instead of breaking the graph (CPU; the `eager` backend, so nothing is compiled to native
code). For ups-doctor's tests."""

import torch

model = torch.nn.Linear(4, 1)


@torch.compile(fullgraph=True, backend="eager")
def step(x):
    loss = model(x).pow(2).mean()
    if loss.item() > 0:
        loss = loss * 2
    return loss


for _ in range(3):
    step(torch.randn(8, 4)).backward()
print("finished", flush=True)
