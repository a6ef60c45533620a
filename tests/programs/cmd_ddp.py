"""A 2-rank gloo program for `ups-doctor run -- CMD`'s tests: one all-reduce, then each rank
writes `wrote-rank<R>.txt` in its working folder holding `$CMD_TEST_VAR` (or `unset`), and rank
0 prints its end-of-run line on stderr, as Lightning does."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(2) * rank
dist.all_reduce(t)
assert t.tolist() == [1.0, 1.0], t
with open(f"wrote-rank{rank}.txt", "w") as f:
    f.write(os.environ.get("CMD_TEST_VAR", "unset"))
if rank == 0:
    print("training finished: all-reduce checked", file=sys.stderr)
dist.destroy_process_group()
