"""ups-doctor's operator (src/trainer/model.rs) as a PyTorch module, layer for layer: the same
widths, depths, windowed attention, AdaLN conditioning, perceiver decoder and parameter count
(the benchmark checks the count against ups-doctor's own and stops if they differ).
Initial values are not ported (they do not change the step time).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

FREQS = 4


def fourier_features(x):
    k = torch.arange(1, FREQS + 1, dtype=torch.float32, device=x.device) * (2.0 * math.pi)
    arg = x.unsqueeze(-1) * k
    return torch.cat([arg.sin(), arg.cos()], -1)


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, self.tokens = cfg["hidden"], cfg["latent_tokens"]
        self.proj_in = nn.Linear(1 + 2 * FREQS, h)
        self.proj_out = nn.Linear(h, h)
        self.pos = nn.Parameter(torch.randn(self.tokens, h) * 0.02)

    def forward(self, u, x):
        b, g = u.shape
        feats = torch.cat([u.unsqueeze(-1), fourier_features(x).expand(b, g, 2 * FREQS)], -1)
        h = F.gelu(self.proj_in(feats))
        pooled = h.view(b, self.tokens, g // self.tokens, -1).mean(2)
        return self.proj_out(pooled) + self.pos


class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, t, w = cfg["hidden"], cfg["latent_tokens"], cfg["window"]
        self.qkv = nn.Linear(h, 3 * h)
        self.out = nn.Linear(h, h)
        self.heads = cfg["heads"]
        if w > 0 and w * 2 + 1 < t:
            idx = torch.arange(t)
            d = (idx.unsqueeze(1) - idx.unsqueeze(0)).abs()
            periodic = torch.minimum(d, t - d)
            self.register_buffer("mask", periodic.gt(w).float() * -1e9, persistent=False)
        else:
            self.mask = None

    def forward(self, x):
        b, t, h = x.shape
        dh = h // self.heads
        qkv = self.qkv(x).view(b, t, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = q.matmul(k.transpose(-2, -1)) / math.sqrt(dh)
        if self.mask is not None:
            scores = scores + self.mask
        y = scores.softmax(-1).matmul(v)
        return self.out(y.transpose(1, 2).contiguous().view(b, t, h))


class AdaNorm(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden"]
        self.norm = nn.LayerNorm(h, elementwise_affine=not cfg["conditioning"])
        self.modulation = None
        if cfg["conditioning"]:
            self.modulation = nn.Linear(h, 2 * h)
            nn.init.zeros_(self.modulation.weight)

    def forward(self, x, cond):
        y = self.norm(x)
        if self.modulation is not None and cond is not None:
            scale, shift = self.modulation(F.silu(cond)).unsqueeze(1).chunk(2, -1)
            y = y * (scale + 1.0) + shift
        return y


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden"]
        self.norm1 = AdaNorm(cfg) if cfg["attention"] else None
        self.attn = SelfAttention(cfg) if cfg["attention"] else None
        self.norm2 = AdaNorm(cfg)
        self.fc1 = nn.Linear(h, h * cfg["mlp_ratio"])
        self.fc2 = nn.Linear(h * cfg["mlp_ratio"], h)

    def forward(self, x, cond):
        if self.attn is not None:
            x = x + self.attn(self.norm1(x, cond))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x, cond))))


class Conditioner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden"]
        self.fc1 = nn.Linear(1, h)
        self.fc2 = nn.Linear(h, h)

    def forward(self, nu):
        return self.fc2(F.silu(self.fc1(nu.unsqueeze(-1))))


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden"]
        self.query = nn.Linear(2 * FREQS, h)
        self.norm = nn.LayerNorm(h)
        self.kv = nn.Linear(h, 2 * h)
        self.out = nn.Linear(h, h)
        self.fc1 = nn.Linear(h, h)
        self.fc2 = nn.Linear(h, 1)
        self.heads = cfg["heads"]

    def forward(self, tokens, xq):
        b, t, h = tokens.shape
        q_len = xq.shape[1]
        dh = h // self.heads
        q = self.query(fourier_features(xq))
        q_heads = q.view(b, q_len, self.heads, dh).transpose(1, 2)
        kv = self.kv(self.norm(tokens)).view(b, t, 2, self.heads, dh).permute(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        attn = (q_heads.matmul(k.transpose(-2, -1)) / math.sqrt(dh)).softmax(-1)
        y = attn.matmul(v).transpose(1, 2).contiguous().view(b, q_len, h)
        y = q + self.out(y)
        return self.fc2(F.gelu(self.fc1(y))).squeeze(-1)


class Operator(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.encoder = Encoder(cfg)
        self.conditioner = Conditioner(cfg) if cfg["conditioning"] else None
        self.blocks = nn.ModuleList(Block(cfg) for depth in cfg["depths"] for _ in range(depth))
        self.decoder = Decoder(cfg)

    def forward(self, u, x, nu, xq):
        cond = self.conditioner(nu) if self.conditioner is not None else None
        tokens = self.encoder(u, x)
        for block in self.blocks:
            tokens = block(tokens, cond)
        return self.decoder(tokens, xq)


DEFAULT_MODEL = {
    "depths": [1, 1], "hidden": 64, "heads": 4, "latent_tokens": 16, "window": 4,
    "attention": True, "conditioning": True, "mlp_ratio": 2,
}


def parameter_count(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
