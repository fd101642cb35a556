"""Qwen3-shaped decoder configuration, seeded weights and their identity.

Architecture: token embedding, per layer RMSNorm -> grouped-query attention (q/k per-head RMSNorm,
rotary embedding) -> residual, RMSNorm -> SwiGLU FFN -> residual; final RMSNorm and an untied
LM head over the padded vocabulary (padding rows are zero and masked out of every softmax).

Example::

    >>> cfg = ModelConfig.smoke()
    >>> cfg.padded_vocab % cfg.canonical_tp
    0
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelConfig:
    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    query_groups: int
    head_dim: int
    vocab: int
    padded_vocab: int
    canonical_tp: int
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6
    max_positions: int = 256

    @classmethod
    def smoke(cls) -> "ModelConfig":
        return cls(name="smoke-qwen3-tiny", layers=2, hidden=128, ffn_hidden=256, heads=16, query_groups=8,
                   head_dim=8, vocab=14, padded_vocab=16, canonical_tp=8)

    @classmethod
    def qwen3_8b(cls) -> "ModelConfig":
        # reference section 1.5: canonical TP 8, canonical vocabulary ceil(152064/1024)*1024
        return cls(name="qwen3-8b", layers=36, hidden=4096, ffn_hidden=12288, heads=32, query_groups=8,
                   head_dim=128, vocab=151936, padded_vocab=152576, canonical_tp=8, max_positions=4096)

    @classmethod
    def from_arm_model(cls, block: dict) -> "ModelConfig":
        keys = ("name", "layers", "hidden", "ffn_hidden", "heads", "query_groups", "head_dim", "vocab",
                "padded_vocab", "canonical_tp")
        missing = [k for k in keys if k not in block]
        if missing:
            raise ValueError(f"/model: missing {', '.join(missing)}")
        return cls(**{k: block[k] for k in keys}).validated()

    def validated(self) -> "ModelConfig":
        c = self.canonical_tp
        problems = []
        for field in ("heads", "query_groups", "ffn_hidden", "padded_vocab"):
            if getattr(self, field) % c:
                problems.append(f"{field} {getattr(self, field)} is not a multiple of canonical_tp {c}")
        if self.heads % self.query_groups:
            problems.append(f"heads {self.heads} is not a multiple of query_groups {self.query_groups}")
        if self.head_dim % 2:
            problems.append(f"head_dim {self.head_dim} must be even for rotary embedding")
        if self.padded_vocab < self.vocab:
            problems.append(f"padded_vocab {self.padded_vocab} is smaller than vocab {self.vocab}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def config_sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def init_weights(cfg: ModelConfig, seed: int, *, layers: int | None = None, dtype=None, device: str = "cpu") -> dict:
    """Seeded weights (normal, std 1/sqrt(fan_in)); ``layers`` overrides the layer count (the oracle uses 1);
    ``device`` is where they are drawn (its generator: a CUDA draw differs from the CPU one)."""
    import torch

    dtype = dtype or torch.float32
    gen = torch.Generator(device=device).manual_seed(seed)
    h, d = cfg.hidden, cfg.head_dim

    def normal(rows, cols, fan_in):
        return (torch.randn(rows, cols, generator=gen, device=device) / fan_in ** 0.5).to(dtype)

    def norm(size):
        return (1.0 + 0.1 * torch.randn(size, generator=gen, device=device)).to(dtype)

    weights = {"embed": torch.randn(cfg.padded_vocab, h, generator=gen, device=device).to(dtype)}
    weights["embed"][cfg.vocab:] = 0
    for i in range(cfg.layers if layers is None else layers):
        p = f"layers.{i}."
        weights[p + "input_norm"] = norm(h)
        weights[p + "wq"] = normal(cfg.heads * d, h, h)
        weights[p + "wk"] = normal(cfg.query_groups * d, h, h)
        weights[p + "wv"] = normal(cfg.query_groups * d, h, h)
        weights[p + "q_norm"] = norm(d)
        weights[p + "k_norm"] = norm(d)
        weights[p + "wo"] = normal(h, cfg.heads * d, cfg.heads * d)
        weights[p + "post_norm"] = norm(h)
        weights[p + "w_gate"] = normal(cfg.ffn_hidden, h, h)
        weights[p + "w_up"] = normal(cfg.ffn_hidden, h, h)
        weights[p + "w_down"] = normal(h, cfg.ffn_hidden, cfg.ffn_hidden)
    weights["final_norm"] = norm(h)
    lm = normal(cfg.padded_vocab, h, h)
    lm[cfg.vocab:] = 0
    weights["lm_head"] = lm
    return weights


def weight_shapes(cfg: ModelConfig, *, layers: int | None = None) -> dict:
    """{name: shape} of :func:`init_weights`' tensors, without drawing them (placeholders for a dry run).

    >>> weight_shapes(ModelConfig.smoke(), layers=1)["layers.0.wq"]
    (128, 128)
    """
    h, d = cfg.hidden, cfg.head_dim
    shapes = {"embed": (cfg.padded_vocab, h)}
    for i in range(cfg.layers if layers is None else layers):
        p = f"layers.{i}."
        shapes.update({p + "input_norm": (h,), p + "wq": (cfg.heads * d, h), p + "wk": (cfg.query_groups * d, h),
                       p + "wv": (cfg.query_groups * d, h), p + "q_norm": (d,), p + "k_norm": (d,),
                       p + "wo": (h, cfg.heads * d), p + "post_norm": (h,), p + "w_gate": (cfg.ffn_hidden, h),
                       p + "w_up": (cfg.ffn_hidden, h), p + "w_down": (h, cfg.ffn_hidden)})
    shapes["final_norm"] = (h,)
    shapes["lm_head"] = (cfg.padded_vocab, h)
    return shapes


def layer_weights(weights: dict, index: int) -> dict:
    prefix = f"layers.{index}."
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def weights_sha256(weights: dict) -> str:
    """sha256 over (name, dtype, shape, raw bytes) in name order."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().contiguous().cpu()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return digest.hexdigest()


def rope_table(cfg: ModelConfig, length: int | None = None):
    """(cos, sin), each [positions, head_dim/2], computed once so every caller reads the same bits."""
    import torch

    length = length or cfg.max_positions
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) * 2 / cfg.head_dim))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(angles).float(), torch.sin(angles).float()
