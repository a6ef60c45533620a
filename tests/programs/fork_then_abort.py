"""A program that forks a helper child which ends through Python's own exit (`sys.exit`: its
exit handlers run, as they do in any child that does not `os._exit`), then trains on and aborts
in the middle of its own code. For ups-doctor's tests: the helper's exit is not the program's,
so the abort is not one "after the program had finished"."""

import os
import sys

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def steps(n):
    for _ in range(n):
        optimizer.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()


steps(5)
child = os.fork()
if child == 0:
    sys.exit(0)
os.waitpid(child, 0)
steps(5)
print("aborting in the middle of the program", flush=True)
os.abort()
