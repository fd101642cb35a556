"""Whole-model passes: the training recompute under TP x CP and the rollout engine (prefill + decode).

Both sides call the same three modules of :mod:`rlk_kernels.ops`, each with its own case letter
(``impls = {"attention": "R", "ffn": "P", "logp": "R"}``); everything outside the modules
(embedding lookup, residual adds) is exact element-wise work.

Example::

    >>> import torch
    >>> from rlk_kernels.model import ModelConfig, init_weights
    >>> from rlk_kernels.layouts import TrainLayout
    >>> cfg = ModelConfig.smoke(); w = init_weights(cfg, 1)
    >>> lp, _ = train_logprobs(w, cfg, torch.tensor([[1, 4, 5, 3, 4]]), TrainLayout(2, 2), ALL_R)
    >>> tuple(lp.shape)
    (1, 4)
"""

from __future__ import annotations

from rlk_kernels import ops
from rlk_kernels.layouts import TrainLayout, zigzag_positions
from rlk_kernels.model import layer_weights, rope_table

ALL_R = {"attention": "R", "ffn": "R", "logp": "R"}
ALL_P = {"attention": "P", "ffn": "P", "logp": "P"}
MODULES = ("attention", "ffn", "logp")


def train_logprobs(weights, cfg, tokens, layout: TrainLayout, impls, *, temperature=1.0, rope=None):
    """Log-probs of tokens[:, 1:] given their prefixes, recomputed over full sequences under ``layout``.

    Returns (logp [B, L-1], logits [B, L-1, vocab]). Sequences are right-padded (token 0) to a
    multiple of 2*cp so the zigzag placement is defined; causality keeps padding out of real rows.
    """
    import torch

    rope = rope or rope_table(cfg)
    batch, length = tokens.shape
    unit = 2 * layout.cp
    padded_len = -(-length // unit) * unit
    padded = torch.cat([tokens, tokens.new_zeros(batch, padded_len - length)], dim=1)
    positions = zigzag_positions(padded_len, layout.cp)
    embed = weights["embed"]
    xs = [embed[padded[:, pos]] for pos in positions]
    for index in range(cfg.layers):
        w = layer_weights(weights, index)
        outs = ops.attention_module_train(impls["attention"], w, cfg, rope, xs, positions, layout.tp)
        xs = [x + o for x, o in zip(xs, outs)]
        xs = [x + ops.ffn_module(impls["ffn"], w, cfg, x.reshape(-1, cfg.hidden), layout.tp).view_as(x) for x in xs]
    logp = torch.zeros(batch, padded_len, dtype=xs[0].dtype)
    logits = torch.zeros(batch, padded_len, cfg.vocab, dtype=xs[0].dtype)
    nxt = torch.cat([padded[:, 1:], padded.new_zeros(batch, 1)], dim=1)
    for x, pos in zip(xs, positions):
        targets = nxt[:, pos].reshape(-1)
        lp, lg = ops.logp_module(impls["logp"], weights, cfg, x.reshape(-1, cfg.hidden), targets, layout.tp,
                                 temperature=temperature, want_logits=True)
        index = torch.tensor(pos)
        logp = logp.index_copy(1, index, lp.view(batch, -1))
        logits = logits.index_copy(1, index, lg.view(batch, len(pos), -1))
    return logp[:, :length - 1], logits[:, :length - 1]


def sample_tokens(logits, generator, *, top_k=-1, top_p=1.0):
    """Seeded sampling from (temperature-scaled) logits [B, V] with top-k and top-p filtering."""
    import torch

    logits = logits.detach().double()
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        drop = (sorted_p.cumsum(-1) - sorted_p) > top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class RolloutEngine:
    """A vLLM-shaped engine: weights loaded by sync, prompt prefill, batched decode with a KV cache;
    finished sequences leave the decode batch (so decode batch sizes change as in continuous batching).

    Example::

        engine = RolloutEngine(cfg, tp=4, impls=ALL_R); engine.load_weights(weights)
        out = engine.generate(prompts, max_new=6, eos=2, generator=torch.Generator().manual_seed(0))
    """

    def __init__(self, cfg, *, tp: int, impls, temperature=1.0, top_p=1.0, top_k=-1):
        self.cfg, self.tp, self.impls = cfg, tp, dict(impls)
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.weights = None
        self.rope = rope_table(cfg)

    def load_weights(self, weights):
        self.weights = {k: v.detach().clone() for k, v in weights.items()}

    def _layers(self, h, pos, caches, phase):
        for index in range(self.cfg.layers):
            w = layer_weights(self.weights, index)
            h = h + ops.attention_module_cached(self.impls["attention"], w, self.cfg, self.rope, h, pos, self.tp,
                                                caches[index], phase=phase)
            flat = h.reshape(-1, self.cfg.hidden)
            h = h + ops.ffn_module(self.impls["ffn"], w, self.cfg, flat, self.tp).view_as(h)
        return h

    def _next(self, last_hidden, generator):
        impl = self.impls["logp"]
        dummy = last_hidden.new_zeros(last_hidden.shape[0], dtype=__import__("torch").long)
        _, logits = ops.logp_module(impl, self.weights, self.cfg, last_hidden, dummy, self.tp,
                                    temperature=self.temperature, want_logits=True, side="rollout")
        token = sample_tokens(logits, generator, top_k=self.top_k, top_p=self.top_p)
        logp = ops.logp_module(impl, self.weights, self.cfg, last_hidden, token, self.tp,
                               temperature=self.temperature, side="rollout")
        return token, logp

    def generate(self, prompts, *, max_new: int, eos: int, generator):
        """prompts [B, P] (same length). Returns dict(tokens [B, P+max_new] zero-padded, response_lengths [B],
        logprobs [B, max_new], truncated [B] bool)."""
        import torch

        with torch.no_grad():
            batch, plen = prompts.shape
            caches = [ops.KVCache(batch, self.cfg, plen + max_new) for _ in range(self.cfg.layers)]
            pos = torch.arange(plen).unsqueeze(0).expand(batch, -1)
            h = self._layers(self.weights["embed"][prompts], pos, caches, "prefill")
            tokens = torch.cat([prompts, prompts.new_zeros(batch, max_new)], dim=1)
            logps = torch.zeros(batch, max_new)
            lengths = torch.zeros(batch, dtype=torch.long)
            done = torch.zeros(batch, dtype=torch.bool)
            active = torch.arange(batch)
            last = h[:, -1]
            for step in range(max_new):
                token, logp = self._next(last, generator)
                tokens[active, plen + step] = token
                logps[active, step] = logp
                lengths[active] = step + 1
                finished = token == eos
                done[active[finished]] = True
                keep = ~finished
                if step == max_new - 1 or not bool(keep.any()):
                    break
                for cache in caches:
                    cache.select(keep)
                active, token = active[keep], token[keep]
                step_pos = torch.full((active.shape[0], 1), plen + step)
                h = self._layers(self.weights["embed"][token].unsqueeze(1), step_pos, caches, "decode")
                last = h[:, -1]
            return {"tokens": tokens, "response_lengths": lengths, "logprobs": logps, "truncated": ~done}
