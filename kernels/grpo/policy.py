"""The policy's passes: seeded initialisation, the full-sequence forward, log-probs, and the rollout engine.

Every pass goes through the modules of :mod:`rlk_kernels.ops` with a case letter per module: R runs
the strict kernels (Triton on CUDA, the CPU reference elsewhere), P the production formulas. The
residual stream is kept in the compute dtype (bf16 on CUDA), so a KV cache stores exactly the keys
and values the training pass computes. Production log-probs take the LM head's bf16 logits to fp32
before the log-softmax, as vLLM's sampler and Megatron's cross-entropy do. With the arm's ``production`` "fused", the P side's no-grad passes (rollout
prefill and decode, the log-prob recomputes) run the fused production kernels on CUDA instead
(:mod:`rlk_kernels.grpo.fused`); the CPU keeps the eager formula. Example::

    w = init_policy_weights(cfg, seed=1, device="cpu")
    lp = sequence_logprobs(cast(w, torch.float32), cfg, tokens, ALL_R, prompt_len=5)      # [B, R]
"""

from __future__ import annotations

from rlk_kernels import ops
from rlk_kernels.forward import sample_tokens
from rlk_kernels.model import init_weights, rope_table

ALL_P = {"attention": "P", "ffn": "P", "logp": "P"}


def compute_dtype(device: str):
    """bf16 on CUDA (the strict kernels' operand type), fp32 on the CPU (the reference)."""
    import torch
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def init_policy_weights(cfg, seed: int, device: str) -> dict:
    """Seeded fp32 master weights drawn on ``device``: :func:`rlk_kernels.model.init_weights` there."""
    return init_weights(cfg, seed, device=device)


def cast(weights: dict, dtype) -> dict:
    """The compute copy of the weights (differentiable when the masters require grad)."""
    return {k: v.to(dtype) for k, v in weights.items()}


def rope_for(cfg, dtype, device):
    return tuple(t.to(device, dtype) for t in rope_table(cfg))


def strict_rms_norm(x, weight, eps):
    """The strict RMSNorm ops uses: the Triton kernel on CUDA, the tree-summed reference elsewhere."""
    from rlk_kernels import primitives
    from rlk_kernels.gpu import use_gpu_path
    if use_gpu_path(x):
        from rlk_kernels.gpu.triton_pointwise import rms_norm
        return rms_norm(x, weight, eps)
    return primitives.rms_norm(x, weight, eps)


def layers_forward(weights, cfg, rope, h, impls):
    """Full-sequence decoder layers at TP1/CP1: h [B, L, H] -> [B, L, H] in h's dtype."""
    length = h.shape[1]
    positions = [list(range(length))]
    for index in range(cfg.layers):
        w = {k[len(f"layers.{index}."):]: v for k, v in weights.items() if k.startswith(f"layers.{index}.")}
        attn = ops.attention_module_train(impls["attention"], w, cfg, rope, [h], positions, 1)[0]
        h = h + attn.to(h.dtype)
        h = h + ops.ffn_module(impls["ffn"], w, cfg, h.reshape(-1, cfg.hidden), 1).view_as(h).to(h.dtype)
    return h


def production_logp(weights, cfg, x, targets, *, temperature=1.0, entropy=False):
    """Final RMSNorm, bf16 LM head over the padded vocabulary, fp32 log-softmax; logp [N] (and entropy [N])."""
    import torch
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * weights["final_norm"]
    logits = (normed @ weights["lm_head"].t()).float()
    if temperature != 1.0:
        logits = logits / temperature
    live = torch.arange(cfg.padded_vocab, device=x.device) < cfg.vocab
    logp_all = torch.log_softmax(logits.masked_fill(~live, float("-inf")), dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return logp
    with torch.no_grad():
        live_logp = logp_all[:, :cfg.vocab]
        ent = -(live_logp.exp() * live_logp).sum(-1)
    return logp, ent


def token_logp(impl, weights, cfg, x, targets, *, temperature=1.0):
    """Selected-token log-probs of rows x [N, H]: the strict logp module (R) or the production formula (P)."""
    if impl == "R":
        return ops.logp_module("R", weights, cfg, x, targets, 1, temperature=temperature).float()
    return production_logp(weights, cfg, x, targets, temperature=temperature)


def sequence_logprobs(weights, cfg, rope, tokens, impls, *, prompt_len: int, chunk: int, temperature=1.0,
                      production: str = "eager", fused_weights=None, choice=None):
    """Training-side recompute (no grad) of the response tokens' log-probs over full sequences, ``chunk``
    sequences at a time: tokens [B, P+R] -> [B, R] fp32. ``production`` "fused" runs the P pieces with the
    fused kernels on CUDA (``fused_weights``: a prebuilt :class:`~rlk_kernels.grpo.fused.FusedWeights` of
    ``weights``, built here when None; ``choice``: the SDPA backend choice to reuse)."""
    import torch
    from rlk_kernels.grpo.fused import FusedWeights, fused_layers, fused_logp, fused_logp_normed, uses_fused
    fused = uses_fused(production, impls, tokens.device)
    if (fused["layers"] or fused["logp"]) and fused_weights is None:
        fused_weights = FusedWeights(weights, cfg)
    if fused["layers"] and choice is None:
        from rlk_kernels.gpu.production import BackendChoice
        choice = BackendChoice()
    out = []
    with torch.no_grad():
        for part in tokens.split(chunk):
            targets = part[:, prompt_len:].reshape(-1)
            if fused["layers"]:
                normed, h = fused_layers(fused_weights, cfg, rope, weights["embed"][part[:, :-1]], start=0,
                                         caches=None, choice=choice)
                if fused["logp"]:
                    rows = normed[:, prompt_len - 1:].reshape(-1, cfg.hidden)
                    out.append(fused_logp_normed(fused_weights, cfg, rows, targets,
                                                 temperature=temperature).view(part.shape[0], -1))
                    continue
            else:
                h = layers_forward(weights, cfg, rope, weights["embed"][part[:, :-1]], impls)
            rows = h[:, prompt_len - 1:].reshape(-1, cfg.hidden)
            if fused["logp"]:
                lp = fused_logp(fused_weights, cfg, rows, targets, temperature=temperature)
            else:
                lp = token_logp(impls["logp"], weights, cfg, rows, targets, temperature=temperature)
            out.append(lp.view(part.shape[0], -1))
    return torch.cat(out)


class RolloutEngine:
    """Rollout: weights loaded by sync (cast to the compute dtype), prompt prefill, then one decode step
    per response token over a KV cache, with seeded temperature/top-p/top-k sampling. The strict side
    samples from the strict LM-head GEMM over the live ids and reports the strict logp kernel's value.
    With ``production`` "fused" (on CUDA) the P side runs the fused production kernels over its own
    per-layer K/V buffers (the layout of ``ops.KVCache``), samples from the same bf16 LM-head logits over
    the live ids and reports the fused log-prob kernel's value of the sampled token; ``log`` receives
    the SDPA backend chosen per shape.

    Example::

        engine = RolloutEngine(cfg, impls=ALL_R, dtype=torch.bfloat16, device="cuda")
        engine.load_weights(params)
        tokens, logp = engine.generate(prompts, response_len=24, generator=gen)
    """

    def __init__(self, cfg, *, impls, dtype, device, temperature=1.0, top_p=1.0, top_k=-1, production="eager",
                 log=None):
        from rlk_kernels.grpo.fused import uses_fused
        self.cfg, self.impls, self.dtype, self.device = cfg, dict(impls), dtype, device
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.rope = rope_for(cfg, dtype, device)
        self.weights = None
        self.fused = uses_fused(production, self.impls, device)
        self.fused_weights = self.choice = None
        if self.fused["layers"] or self.fused["logp"]:
            from rlk_kernels.gpu.production import BackendChoice
            self.choice = BackendChoice(log=log)

    def load_weights(self, params: dict) -> None:
        import torch
        with torch.no_grad():
            self.weights = {k: v.detach().to(self.dtype).clone() for k, v in params.items()}
            if self.fused["layers"] or self.fused["logp"]:
                from rlk_kernels.grpo.fused import FusedWeights
                self.fused_weights = None                     # the previous step's copy freed first
                self.fused_weights = FusedWeights(self.weights, self.cfg)

    def _layers(self, h, pos, caches, phase):
        cfg = self.cfg
        for index in range(cfg.layers):
            w = {k[len(f"layers.{index}."):]: v for k, v in self.weights.items() if k.startswith(f"layers.{index}.")}
            h = h + ops.attention_module_cached(self.impls["attention"], w, cfg, self.rope, h, pos, 1, caches[index],
                                                phase=phase).to(h.dtype)
            h = h + ops.ffn_module(self.impls["ffn"], w, cfg, h.reshape(-1, cfg.hidden), 1).view_as(h).to(h.dtype)
        return h

    def _sample(self, last, generator, normed=None):
        cfg, w = self.cfg, self.weights
        if self.fused["logp"]:
            # fused production: the bf16 LM head over the padded vocabulary, sampled over the live ids from
            # the fp32 logits / temperature; the sampled token's log-prob from the fused kernel on the same logits
            import torch.nn.functional as F
            from rlk_kernels.gpu.production import logp_from_logits, rms_norm
            if normed is None:
                normed = rms_norm(last.contiguous(), w["final_norm"], cfg.norm_eps)
            logits = F.linear(normed.contiguous(), self.fused_weights.lm_head)
            live = logits[:, :cfg.vocab].float()
            if self.temperature != 1.0:
                live = live / self.temperature
            token = sample_tokens(live, generator, top_k=self.top_k, top_p=self.top_p)
            return token, logp_from_logits(logits, token.contiguous(), cfg.vocab, self.temperature)
        if self.impls["logp"] == "R":
            normed = strict_rms_norm(last, w["final_norm"], cfg.norm_eps)
            head = ops.lm_head_shards(w, cfg)[:1, :, :cfg.vocab]          # the live ids all lie in shard 0
            logits = ops.strict_linear_rows(normed, head)[0].float()
            if self.temperature != 1.0:
                logits = logits / self.temperature
            token = sample_tokens(logits, generator, top_k=self.top_k, top_p=self.top_p)
            return token, token_logp("R", w, cfg, last, token, temperature=self.temperature)
        import torch
        normed = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * w["final_norm"]
        logits = (normed @ w["lm_head"].t()).float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        logp_all = torch.log_softmax(logits[:, :cfg.vocab], dim=-1)   # ids >= vocab are masked: exp(-inf) = 0
        token = sample_tokens(logits[:, :cfg.vocab], generator, top_k=self.top_k, top_p=self.top_p)
        return token, logp_all.gather(-1, token.unsqueeze(-1)).squeeze(-1)

    def generate(self, prompts, *, response_len: int, generator):
        """prompts [B, P] -> (tokens [B, P+response_len], logp [B, response_len] fp32)."""
        import torch
        cfg = self.cfg
        with torch.no_grad():
            batch, plen = prompts.shape
            if self.fused["layers"]:
                from rlk_kernels.grpo.fused import new_caches
                caches = new_caches(cfg, batch, plen + response_len, self.dtype, prompts.device, cfg.layers)
            else:
                caches = [ops.KVCache(batch, cfg, plen + response_len, dtype=self.dtype) for _ in range(cfg.layers)]
            pos = torch.arange(plen, device=prompts.device).unsqueeze(0).expand(batch, -1)
            last, normed = self._forward(self.weights["embed"][prompts], pos, caches, "prefill", start=0)
            tokens = torch.cat([prompts, prompts.new_zeros(batch, response_len)], dim=1)
            logps = torch.zeros(batch, response_len, dtype=torch.float32, device=prompts.device)
            for step in range(response_len):
                token, logp = self._sample(last, generator, normed)
                tokens[:, plen + step] = token
                logps[:, step] = logp
                if step == response_len - 1:
                    break
                step_pos = torch.full((batch, 1), plen + step, device=prompts.device)
                last, normed = self._forward(self.weights["embed"][token].unsqueeze(1), step_pos, caches, "decode",
                                             start=plen + step)
            return tokens, logps

    def _forward(self, h, pos, caches, phase, *, start):
        """(last position's residual stream [B, H], its final-normed rows [B, H] or None)."""
        if not self.fused["layers"]:
            return self._layers(h, pos, caches, phase)[:, -1], None
        from rlk_kernels.grpo.fused import fused_layers
        normed, out = fused_layers(self.fused_weights, self.cfg, self.rope, h, start=start, caches=caches,
                                   choice=self.choice)
        return out[:, -1], normed[:, -1]
