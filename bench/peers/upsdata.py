"""The data side of ups-doctor's trainer, written with PyTorch for the benchmark peers.

`generate` is a line-by-line port of src/trainer/burgers.rs (same torch ops, same order, same
generator calls after `torch.manual_seed(seed)`), so it yields the very same trajectories as
`ups-doctor train`; the benchmark checks that with `checksum`, which `ups-doctor train
--loader-only` prints for its own cache. `BurgersPairs` is the Dataset a PyTorch user would write
for the same samples and the same per-sample work as src/trainer/loader/batch.rs.
"""

import math

import numpy as np
import torch

NU_MIN = 3e-3
NU_MAX = 1e-1
T_END = 0.5
DT = 1e-3
INIT_MODES = 4


class Trajectories:
    def __init__(self, u, u_mean, u_std, nu_feature, nu):
        self.u = u  # (S, T, G) float32
        self.u_mean = u_mean
        self.u_std = u_std
        self.nu_feature = nu_feature  # (S,) float32
        self.nu = nu


def generate(samples, grid, timesteps):
    """burgers::generate, op for op."""
    f64 = torch.float64
    x = torch.arange(grid, dtype=f64) / grid
    k = torch.arange(1, INIT_MODES + 1, dtype=f64)
    amp = torch.randn(samples, INIT_MODES, dtype=f64) / k
    phase = torch.rand(samples, INIT_MODES, dtype=f64) * (2.0 * math.pi)
    arg = x.view(1, 1, grid) * k.view(1, INIT_MODES, 1) * (2.0 * math.pi) + phase.unsqueeze(-1)
    u = (amp.unsqueeze(-1) * arg.sin()).sum(1, dtype=f64)
    peak = u.abs().amax(-1, keepdim=True).clamp_min(1e-6)
    u /= peak

    log_nu = torch.rand(samples, dtype=f64) * (math.log10(NU_MAX) - math.log10(NU_MIN)) + math.log10(NU_MIN)
    nu = torch.tensor(10.0, dtype=f64).pow(log_nu)

    modes = grid // 2 + 1
    kw = torch.arange(modes, dtype=f64) * (2.0 * math.pi)
    dealias = kw.le(2.0 * math.pi * grid / 3.0).to(f64)
    ik = torch.complex(torch.zeros(modes, dtype=f64), kw)
    decay_full = (-(nu.view(samples, 1) * kw.square().view(1, modes)) * DT).exp()

    def advection(v):
        flux = torch.fft.rfft(v.square() * 0.5, dim=-1, norm="backward")
        return -(flux * ik) * dealias

    total_steps = round(T_END / DT)
    every = max(total_steps // (timesteps - 1), 1)
    snapshots = [u]
    uh = torch.fft.rfft(u, dim=-1, norm="backward")
    for step in range(1, every * (timesteps - 1) + 1):
        v0 = torch.fft.irfft(uh, grid, dim=-1, norm="backward")
        n0 = advection(v0)
        pred = (uh + n0 * DT) * decay_full
        v1 = torch.fft.irfft(pred, grid, dim=-1, norm="backward")
        n1 = advection(v1)
        uh = (uh + n0 * (DT / 2.0)) * decay_full + n1 * (DT / 2.0)
        if step % every == 0:
            snapshots.append(torch.fft.irfft(uh, grid, dim=-1, norm="backward"))
    u = torch.stack(snapshots, 1)
    # Summed left to right, like sequential_mean_std (np.cumsum is sequential, np.sum is not).
    values = u.flatten().numpy()
    mean = float(np.cumsum(values)[-1]) / max(values.size, 1)
    var = float(np.cumsum((values - mean) * (values - mean))[-1]) / max(values.size, 1)
    u = u.to(torch.float32)
    nu_feature = ((log_nu - log_nu.mean()) / log_nu.std(unbiased=False).clamp_min(1e-8)).to(torch.float32)
    return Trajectories(u, mean, max(math.sqrt(var), 1e-8), nu_feature, nu.to(torch.float32))


def checksum(data):
    """The cache's words weighted by position, mod 2^64: the f32 bits of the trajectories, then of
    the viscosity feature, as laid out in ups-doctor's cache file (trainer::loader::cache)."""
    words = np.concatenate([
        data.u.contiguous().numpy().reshape(-1).view(np.uint32),
        data.nu_feature.contiguous().numpy().view(np.uint32),
    ]).astype(np.uint64)
    weights = np.arange(words.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int(np.sum(words * weights, dtype=np.uint64))


class BurgersPairs(torch.utils.data.Dataset):
    """Training pair `i = sample * (timesteps - 1) + t`: the normalised snapshot t on the whole
    grid, the viscosity feature, `queries` random distinct grid points and the normalised snapshot
    t + 1 at those points (what src/trainer/loader/batch.rs builds per sample).

    `storage`: `tensor` keeps torch tensors (under `spawn`, torch's pickler moves them to shared
    memory, one copy for all workers); `numpy` keeps numpy arrays (pickled by value: every spawned
    worker holds its own copy, the duplication of the origin write-ups).
    """

    def __init__(self, data, queries, storage="tensor", augment_passes=0):
        s, t, g = data.u.shape
        self.timesteps, self.grid, self.queries = t, g, queries
        self.mean, self.std = data.u_mean, data.u_std
        self.augment_passes = augment_passes
        frames = data.u.reshape(s * t, g)
        if storage == "numpy":
            self.frames, self.nu = frames.numpy().copy(), data.nu_feature.numpy().copy()
        else:
            self.frames, self.nu = frames.clone(), data.nu_feature.clone()
        self.storage = storage
        self.pairs = s * (t - 1)

    def __len__(self):
        return self.pairs

    def __getitem__(self, i):
        s, t = divmod(i, self.timesteps - 1)
        row = s * self.timesteps + t
        if self.storage == "numpy":
            u, nxt = torch.from_numpy(self.frames[row]), torch.from_numpy(self.frames[row + 1])
            nu = torch.tensor(self.nu[s])
        else:
            u, nxt, nu = self.frames[row], self.frames[row + 1], self.nu[s]
        q = torch.randperm(self.grid)[: self.queries]
        if self.augment_passes:
            u, nxt = augment(u.unsqueeze(0), nxt.unsqueeze(0), self.augment_passes, self.grid)
            u, nxt = u.squeeze(0), nxt.squeeze(0)
        return (u - self.mean) / self.std, nu, q.to(torch.float32) / self.grid, (nxt[q] - self.mean) / self.std


class BurgersBatches(BurgersPairs):
    """The same samples and work, a batch at a time: `__getitems__` (which DataLoader calls with a
    whole batch of indices) does what make_batch does, vectorised over the batch, and `collate`
    passes the result through. Same storage rules as BurgersPairs (`tensor` storage only)."""

    def __getitems__(self, indices):
        pairs = torch.tensor(indices, dtype=torch.int64)
        n = pairs.shape[0]
        q = torch.rand(n, self.grid).argsort(dim=1)[:, : self.queries]
        s = torch.div(pairs, self.timesteps - 1, rounding_mode="floor")
        row = s * self.timesteps + pairs.remainder(self.timesteps - 1)
        frames = self.frames if self.storage == "tensor" else torch.from_numpy(self.frames)
        nu = self.nu if self.storage == "tensor" else torch.from_numpy(self.nu)
        now, nxt = frames.index_select(0, row), frames.index_select(0, row + 1)
        if self.augment_passes:
            now, nxt = augment(now, nxt, self.augment_passes, self.grid)
        target = (nxt.gather(1, q) - self.mean) / self.std
        return (now - self.mean) / self.std, nu.index_select(0, s), q.to(torch.float32) / self.grid, target


def collate_batch(batch):
    """The collate function for BurgersBatches: the batch is already made."""
    return batch


def translate(x, shift):
    """Rows of `x (n, G)` moved by `shift (n,)` grid points around the periodic grid through the
    Fourier series: trainer::loader::batch::translate."""
    g = x.shape[-1]
    k = torch.arange(g // 2 + 1, dtype=torch.float32)
    angle = shift.unsqueeze(1) * k.unsqueeze(0) * (-2.0 * math.pi / g)
    phase = torch.polar(torch.ones_like(angle), angle)
    return torch.fft.irfft(torch.fft.rfft(x, dim=-1, norm="backward") * phase, g, dim=-1, norm="backward")


def augment(now, nxt, passes, grid):
    """`data.augment_passes`: each pass moves input and next snapshot `(n, G)` by the same random
    sub-grid amount, per sample."""
    shifts = torch.rand(now.shape[0], passes) * grid
    for p in range(passes):
        now = translate(now, shifts[:, p])
        nxt = translate(nxt, shifts[:, p])
    return now, nxt


def make_batch(frames, nu, mean, std, timesteps, grid, queries, pairs, generator=None):
    """A whole batch at once, the way trainer::loader::batch::make_batch builds it (for the
    training-step peer, where batches are made in the trainer and not timed as compute)."""
    n = pairs.shape[0]
    q = torch.rand(n, grid, generator=generator).argsort(dim=1)[:, :queries]
    s = torch.div(pairs, timesteps - 1, rounding_mode="floor")
    row = s * timesteps + pairs.remainder(timesteps - 1)
    u = (frames.index_select(0, row) - mean) / std
    nxt = frames.index_select(0, row + 1).gather(1, q)
    return u, nu.index_select(0, s), q.to(torch.float32) / grid, (nxt - mean) / std
