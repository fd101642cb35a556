"""Fused production ("P+") for the GRPO workload's no-grad passes on CUDA.

An arm's ``production`` field says which production formula its P modules run: ``"eager"`` (absent:
one GEMM per projection through :mod:`rlk_kernels.ops`, SDPA's default backend, fp32 logits over the
padded vocabulary) or ``"fused"``: what vLLM and Megatron run, with the kernels of
:mod:`rlk_kernels.gpu.production`:

- RMSNorm in one kernel, each residual add fused into the next norm (``fused_add_rms_norm``; the last
  one into the final norm);
- one GEMM for q/k/v and one for gate/up (merged weights), q/k RMSNorm + RoPE + the K/V cache write
  in one kernel, SwiGLU in one kernel (``silu_and_mul``);
- SDPA on the fastest backend per (batch, tokens, key length), timed once per shape and logged
  (:class:`~rlk_kernels.gpu.production.BackendChoice`);
- the selected-token log-prob from the bf16 logits in one pass (``logp_from_logits``), never an fp32
  copy of the 152,576-wide logits.

These kernels have no backward: the actor's gradient pass stays the eager production graph in every
arm. On a CPU (no Triton GPU path) fused production falls back to the eager formula, as the strict
path falls back to its reference. The fused path runs where a side's attention and FFN are both P (the
layers) and where its logp is P (the log-prob); a side that mixes P and R runs the eager formula for
its P layers. Example::

    fw = FusedWeights(weights, cfg)                               # merged qkv / gate_up, bf16
    normed, h = fused_layers(fw, cfg, rope, h, start=0, caches=None, choice=BackendChoice())
"""

from __future__ import annotations

PRODUCTIONS = ("eager", "fused")


def fused_available(device) -> bool:
    """The fused kernels run on CUDA devices with Triton; on the CPU only with ``TRITON_INTERPRET=1`` and
    ``RLK_TRITON_ON_CPU=1`` (the kernels interpreted: how the tests drive the fused path), as for the strict ones."""
    import os
    from rlk_kernels.gpu import available
    if str(device).startswith("cuda"):
        return available()
    return os.environ.get("RLK_TRITON_ON_CPU") == "1" and os.environ.get("TRITON_INTERPRET") == "1" and available()


def uses_fused(production: str, impls: dict, device) -> dict:
    """{"layers": bool, "logp": bool}: which P pieces of a side take the fused kernels."""
    on = production == "fused" and fused_available(device)
    return {"layers": on and impls["attention"] == "P" and impls["ffn"] == "P", "logp": on and impls["logp"] == "P"}


class FusedWeights:
    """The compute-dtype weights in the layouts fused production reads: per layer the merged q/k/v
    weight [(Hq + 2 Hkv) D, H] and gate/up weight [2 F, H] (heads in the global order the eager path
    uses), the norms, ``wo``, ``w_down``; and the embedding, final norm and LM head."""

    def __init__(self, weights: dict, cfg):
        import torch
        with torch.no_grad():
            self.layers = []
            for index in range(cfg.layers):
                p = f"layers.{index}."
                self.layers.append({
                    "qkv": torch.cat([weights[p + "wq"], weights[p + "wk"], weights[p + "wv"]], 0).detach(),
                    "gate_up": torch.cat([weights[p + "w_gate"], weights[p + "w_up"]], 0).detach(),
                    **{k: weights[p + k].detach() for k in ("input_norm", "post_norm", "q_norm", "k_norm", "wo", "w_down")},
                })
            self.embed = weights["embed"].detach()
            self.final_norm = weights["final_norm"].detach()
            self.lm_head = weights["lm_head"].detach()

    def refill(self, weights: dict) -> None:
        """Take ``weights`` updated in place: the merged layouts are refilled at their addresses (the
        other entries are views of those tensors already)."""
        import torch
        with torch.no_grad():
            for index, layer in enumerate(self.layers):
                p = f"layers.{index}."
                torch.cat([weights[p + "wq"], weights[p + "wk"], weights[p + "wv"]], 0, out=layer["qkv"])
                torch.cat([weights[p + "w_gate"], weights[p + "w_up"]], 0, out=layer["gate_up"])


def new_caches(cfg, batch: int, capacity: int, dtype, device, count: int):
    """``count`` (k, v) pairs [B, Hkv, capacity, D]: the layout of :class:`rlk_kernels.ops.KVCache`."""
    import torch
    shape = (batch, cfg.query_groups, capacity, cfg.head_dim)
    return [(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))
            for _ in range(count)]


def fused_layers(fw: FusedWeights, cfg, rope, h, *, start: int, caches, choice):
    """Decoder layers over h [B, T, H] at positions start..start+T-1 (every sequence at the same positions:
    prefill and the training recompute start at 0, a decode step has T = 1). ``caches``: one (k, v) pair per
    layer holding positions < start (the rollout's cache), or None (a scratch pair reused by every layer: the
    full-sequence recompute). Returns (final-normed [B, T, H], residual stream [B, T, H])."""
    import torch
    import torch.nn.functional as F
    from rlk_kernels.gpu import production as P
    b, t, hidden = h.shape
    if t > 1 and start != 0:
        raise ValueError("a multi-token pass starts at position 0 (prefill or the full-sequence recompute)")
    cos, sin = rope
    eps = cfg.norm_eps
    pos = torch.arange(start, start + t, device=h.device, dtype=torch.int32).repeat(b)
    scratch = new_caches(cfg, b, t, h.dtype, h.device, 1)[0] if caches is None else None
    rows = h.reshape(b * t, hidden).contiguous()
    n = P.rms_norm(rows, fw.layers[0]["input_norm"], eps)
    for index, lw in enumerate(fw.layers):
        kc, vc = scratch if caches is None else caches[index]
        k, v = kc[:, :, :start + t], vc[:, :, :start + t]
        q = P.qk_norm_rope(F.linear(n, lw["qkv"]), b, t, cfg.heads, cfg.query_groups, cfg.head_dim,
                           lw["q_norm"], lw["k_norm"], cos, sin, pos, k, v, eps)
        core = P.sdpa(q, k, v, t > 1, choice.backend(q, k, v, t > 1))             # [B, Hq, T, D]
        attn = F.linear(core.transpose(1, 2).reshape(b * t, -1), lw["wo"])
        n, rows = P.fused_add_rms_norm(attn, rows, lw["post_norm"], eps)
        ffn = F.linear(P.silu_and_mul(F.linear(n, lw["gate_up"])), lw["w_down"])
        following = fw.layers[index + 1]["input_norm"] if index + 1 < len(fw.layers) else fw.final_norm
        n, rows = P.fused_add_rms_norm(ffn, rows, following, eps)
    return n.view(b, t, hidden), rows.view(b, t, hidden)


def fused_logp_normed(fw: FusedWeights, cfg, normed, targets, *, temperature=1.0):
    """Selected-token log-probs of final-normed rows [N, H]: bf16 LM head over the padded vocabulary, then
    one pass over the bf16 logits (the live ids only); fp32 [N]."""
    import torch.nn.functional as F
    from rlk_kernels.gpu.production import logp_from_logits
    logits = F.linear(normed, fw.lm_head)
    return logp_from_logits(logits, targets.contiguous(), cfg.vocab, temperature)


def fused_logp(fw: FusedWeights, cfg, x, targets, *, temperature=1.0):
    """Selected-token log-probs of residual-stream rows [N, H] (the final norm in one kernel first)."""
    from rlk_kernels.gpu.production import rms_norm
    return fused_logp_normed(fw, cfg, rms_norm(x.contiguous(), fw.final_norm, cfg.norm_eps), targets,
                             temperature=temperature)
