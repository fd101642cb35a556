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


def layers_forward(weights, cfg, rope, h, impls, layer_ws=None):
    """Full-sequence decoder layers at TP1/CP1: h [B, L, H] -> [B, L, H] in h's dtype. ``layer_ws``:
    the layers' weights from :func:`rlk_kernels.ops.layer_weights`, when the caller built them once."""
    length = h.shape[1]
    positions = [list(range(length))]
    for index in range(cfg.layers):
        w = layer_ws[index] if layer_ws is not None else ops.layer_weights(weights, cfg, index, strict=False)
        attn = ops.attention_module_train(impls["attention"], w, cfg, rope, [h], positions, 1)[0]
        h = ops.residual_add(h, attn)
        h = ops.residual_add(h, ops.ffn_module(impls["ffn"], w, cfg, h.reshape(-1, cfg.hidden), 1).view_as(h))
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


def _strict_layers(impls) -> bool:
    return "R" in (impls["attention"], impls["ffn"])


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
        layer_ws = None if fused["layers"] else [ops.layer_weights(weights, cfg, i, strict=_strict_layers(impls))
                                                 for i in range(cfg.layers)]
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
                h = layers_forward(weights, cfg, rope, weights["embed"][part[:, :-1]], impls, layer_ws)
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

    ``decode_graph_sizes`` (the arm's graph mode FULL_DECODE_ONLY, as vLLM's): on CUDA a decode step of a
    batch size listed there runs as a CUDA graph. The first rollout runs every step eagerly (kernels
    compile, vendor GEMMs are certified, SDPA backends chosen), the second captures one graph per step
    (its batch and cache length are fixed) and later rollouts replay them: the same kernels on the same
    shapes, so the same bits, without the host issuing every launch. Weights and caches keep their
    addresses for that (a sync copies into them). Prefill and sampling always run eagerly; a step that
    cannot be captured turns the graphs off with a log line.

    Example::

        engine = RolloutEngine(cfg, impls=ALL_R, dtype=torch.bfloat16, device="cuda")
        engine.load_weights(params)
        tokens, logp = engine.generate(prompts, response_len=24, generator=gen)
    """

    def __init__(self, cfg, *, impls, dtype, device, temperature=1.0, top_p=1.0, top_k=-1, production="eager",
                 log=None, decode_graph_sizes=()):
        from rlk_kernels.grpo.fused import uses_fused
        self.cfg, self.impls, self.dtype, self.device = cfg, dict(impls), dtype, device
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.rope = rope_for(cfg, dtype, device)
        self.weights = self.layer_ws = None
        self.fused = uses_fused(production, self.impls, device)
        self.fused_weights = self.choice = None
        self.log = log
        if self.fused["layers"] or self.fused["logp"]:
            from rlk_kernels.gpu.production import BackendChoice
            self.choice = BackendChoice(log=log)
        self.graph_sizes = frozenset(decode_graph_sizes) if str(device).startswith("cuda") else frozenset()
        self.graphs = bool(self.graph_sizes)
        self._caches = {}          # (batch, capacity) -> the layers' caches, reused by every rollout of that shape
        self._steps = {}           # (batch, capacity, start) -> "seen" after its eager run, then a _DecodeGraph
        self._pool = self._stream = None

    def load_weights(self, params: dict) -> None:
        import torch
        with torch.no_grad():
            fresh = {k: v.detach().to(self.dtype) for k, v in params.items()}
            same = self.weights is not None and self.weights.keys() == fresh.keys() and all(
                self.weights[k].shape == v.shape for k, v in fresh.items())
            if same:
                for k, v in fresh.items():
                    self.weights[k].copy_(v)
            else:
                self.weights = {k: v.clone() for k, v in fresh.items()}
                self._steps.clear()                           # graphs of the old tensors are dropped
            if not self.fused["layers"]:
                old = self.layer_ws if same else None
                self.layer_ws = [ops.layer_weights(self.weights, self.cfg, i, strict=_strict_layers(self.impls),
                                                   refill=old[i] if old else None) for i in range(self.cfg.layers)]
            if self.fused["layers"] or self.fused["logp"]:
                from rlk_kernels.grpo.fused import FusedWeights
                if same and self.fused_weights is not None:
                    self.fused_weights.refill(self.weights)
                else:
                    self.fused_weights = None                 # the previous copy freed first
                    self.fused_weights = FusedWeights(self.weights, self.cfg)

    def _layers(self, h, pos, caches, phase, keys):
        cfg = self.cfg
        for index in range(cfg.layers):
            w = self.layer_ws[index]
            h = ops.residual_add(h, ops.attention_module_cached(self.impls["attention"], w, cfg, self.rope, h, pos, 1,
                                                                caches[index], phase=phase, keys=keys))
            h = ops.residual_add(h, ops.ffn_module(self.impls["ffn"], w, cfg, h.reshape(-1, cfg.hidden), 1).view_as(h))
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

    def _caches_for(self, batch: int, capacity: int, device):
        key = (batch, capacity)
        if key not in self._caches:
            if self.fused["layers"]:
                from rlk_kernels.grpo.fused import new_caches
                self._caches[key] = new_caches(self.cfg, batch, capacity, self.dtype, device, self.cfg.layers)
            else:
                self._caches[key] = [ops.KVCache(batch, self.cfg, capacity, dtype=self.dtype)
                                     for _ in range(self.cfg.layers)]
        return self._caches[key]

    def generate(self, prompts, *, response_len: int, generator):
        """prompts [B, P] -> (tokens [B, P+response_len], logp [B, response_len] fp32)."""
        import torch
        with torch.no_grad():
            batch, plen = prompts.shape
            capacity = plen + response_len
            caches = self._caches_for(batch, capacity, prompts.device)
            captured = sum(isinstance(v, _DecodeGraph) for v in self._steps.values())
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
                last, normed = self._decode(token, plen + step, caches, (batch, capacity, plen + step))
            now = sum(isinstance(v, _DecodeGraph) for v in self._steps.values())
            if now > captured and self.log is not None:
                self.log(f"[RL-Kernel][cuda-graphs] rollout decode: {now - captured} steps captured "
                         f"(batch={batch} capacity={capacity}); later rollouts replay them")
            return tokens, logps

    def _decode(self, token, start: int, caches, key):
        """One decode step at position ``start``: eager the first time a (batch, capacity, start) is met,
        captured the second, replayed after (where graphs are on)."""
        import torch
        h = self.weights["embed"][token].unsqueeze(1)
        graphed = self.graphs and token.shape[0] in self.graph_sizes
        entry = self._steps.get(key) if graphed else None
        if entry == "seen":
            entry = self._steps[key] = self._capture(h, start, caches)
        if isinstance(entry, _DecodeGraph):
            entry.h.copy_(h)
            entry.graph.replay()
            return entry.last, entry.normed
        if graphed:
            self._steps[key] = "seen"
        step_pos = torch.full((token.shape[0], 1), start, device=token.device)
        return self._forward(h, step_pos, caches, "decode", start=start)

    def _capture(self, h, start: int, caches):
        import torch
        static_h = h.clone()
        step_pos = torch.full((h.shape[0], 1), start, device=h.device)
        if self._stream is None:
            # lazy per-stream state (library handles, workspaces) made outside any capture, on the capture stream
            self._pool, self._stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
            self._stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self._stream):
                self._forward(static_h, step_pos, caches, "decode", start=start)
            torch.cuda.current_stream().wait_stream(self._stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
                last, normed = self._forward(static_h, step_pos, caches, "decode", start=start)
        except Exception as exc:                               # an op this build cannot capture
            self.graphs = False
            if self.log is not None:
                self.log(f"[RL-Kernel][cuda-graphs] off: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}; "
                         f"every decode step runs eagerly")
            return None
        graph.replay()
        return _DecodeGraph(graph, static_h, step_pos, last, normed)

    def _forward(self, h, pos, caches, phase, *, start):
        """(last position's residual stream [B, H], its final-normed rows [B, H] or None)."""
        if not self.fused["layers"]:
            return self._layers(h, pos, caches, phase, start + h.shape[1])[:, -1], None
        from rlk_kernels.grpo.fused import fused_layers
        normed, out = fused_layers(self.fused_weights, self.cfg, self.rope, h, start=start, caches=caches,
                                   choice=self.choice)
        return out[:, -1], normed[:, -1]


class _DecodeGraph:
    """A captured decode step: the graph, every tensor made outside it that it reads (kept alive here:
    the graph holds their addresses, not references), and the outputs it writes."""

    def __init__(self, graph, h, pos, last, normed):
        self.graph, self.h, self.pos, self.last, self.normed = graph, h, pos, last, normed
