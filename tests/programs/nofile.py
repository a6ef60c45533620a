"""A DataLoader whose batches are many small tensors, all kept by the program (a list of every
batch, as code that collects outputs for a metric does), for ups-doctor's tests. With PyTorch's
default `file_descriptor` sharing strategy each tensor a worker hands over is one open file
descriptor in the receiving process: under a low `ulimit -n` the process runs out of them and
`multiprocessing` fails with `RuntimeError: received 0 items of ancdata`."""

import torch
from torch.utils.data import DataLoader, Dataset


class Pieces(Dataset):
    def __len__(self):
        return 10000

    def __getitem__(self, i):
        return [torch.zeros(2) for _ in range(64)]


if __name__ == "__main__":
    kept = []
    for i, batch in enumerate(DataLoader(Pieces(), batch_size=None, num_workers=2)):
        kept.append(batch)
        if i > 300:
            break
    print("finished", flush=True)
