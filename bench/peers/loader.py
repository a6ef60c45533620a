"""The data-loader peer: the same Burgers samples and per-sample work as `ups-doctor train
--loader-only`, through torch.utils.data.DataLoader, printing the same summary line.

    python loader.py --samples 64 --grid 128 --timesteps 10 --queries 64 --batch 16 \
        --batches 200 --workers 2 --start-method fork [--storage tensor|numpy] \
        [--dataset per-sample|batched] [--augment-passes N]

Workers persist across epochs (`persistent_workers`, as ups-doctor's do), prefetch 2 batches
each (PyTorch's default, and ups-doctor's `data.prefetch` default), shuffle with drop_last.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import upsdata  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    for name, default in [("samples", 64), ("grid", 128), ("timesteps", 10), ("queries", 64), ("batch", 16),
                          ("batches", 200), ("workers", 0), ("prefetch", 2), ("seed", 0), ("threads", 0),
                          ("augment-passes", 0)]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--start-method", choices=["fork", "spawn"], default="fork")
    p.add_argument("--storage", choices=["tensor", "numpy"], default="tensor")
    p.add_argument("--dataset", choices=["per-sample", "batched"], default="per-sample",
                   help="per-sample: __getitem__ + default collate (what most users write); "
                        "batched: __getitems__ doing ups-doctor's vectorised batch work")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    torch.manual_seed(a.seed)
    data = upsdata.generate(a.samples, a.grid, a.timesteps)
    checksum = upsdata.checksum(data)
    kind = upsdata.BurgersBatches if a.dataset == "batched" else upsdata.BurgersPairs
    dataset = kind(data, a.queries, storage=a.storage, augment_passes=a.augment_passes)
    del data
    extra = {"collate_fn": upsdata.collate_batch} if a.dataset == "batched" else {}
    if a.workers > 0:
        extra.update(multiprocessing_context=a.start_method, prefetch_factor=a.prefetch, persistent_workers=True)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=a.workers,
        generator=torch.Generator().manual_seed(a.seed), **extra)
    warm = min(max(a.workers * a.prefetch, 1), max(a.batches - 1, 1))

    start = time.perf_counter()
    first = warm_at = None
    got = 0
    while got < a.batches:
        for batch in loader:
            got += 1
            now = time.perf_counter()
            first = first if first is not None else now
            if got == warm:
                warm_at = now
            del batch
            if got == a.batches:
                break
    end = time.perf_counter()
    steady = ((a.batches - warm) * a.batch) / max(end - warm_at, 1e-9)
    print(f"loader-only: {a.batches} batches of {a.batch} samples in {end - start:.3f} s, first batch after "
          f"{first - start:.3f} s, {steady:.1f} samples/s after the first {warm} batches; "
          f"dataset checksum {checksum:#018x}", flush=True)


if __name__ == "__main__":
    main()
