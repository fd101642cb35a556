"""The training side: fp32 master weights, a frozen reference, the log-prob recompute, GRPO, AdamW.

One optimizer step per rollout. The train-side recompute (no grad, the arm's train-side operators)
gives the current policy's log-probs; they are compared with the rollout's (the mismatch records)
and are the values the loss sees. The strict kernels have no backward, so the gradient comes from
the eager production formula's graph in every arm, fused production included (:class:`ValueOf` gives a
tensor the recompute's value and the production pass's gradient). Example::

    trainer = Trainer(config); result = trainer.train(tokens, rollout_logp, rewards)
    result["record"]["train/train_current_rollout_logprob_mismatch_count"]
"""

from __future__ import annotations

import time

from rlk_kernels.grpo.policy import (ALL_P, cast, compute_dtype, init_policy_weights, layers_forward, production_logp,
                                     rope_for, sequence_logprobs)
from rlk_kernels.grpo.task import PROMPT_LEN

PPO_CLIP_LOW, PPO_CLIP_HIGH = 0.2, 0.28
GRAD_CLIP = 1.0


def synchronize(device: str) -> None:
    """Wait for queued GPU work, so wall-clock timers measure it."""
    import torch
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def weights_sha256(weights: dict) -> str:
    """sha256 over (name, dtype, shape, raw bytes) in name order, hashed from the CPU copy of each tensor."""
    import hashlib

    import torch
    digest = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().contiguous().cpu()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(memoryview(t.view(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


def forward_flops(cfg, batch: int, seq_len: int, logp_rows: int) -> float:
    """Matmul FLOPs of one full-sequence forward: projections, causal attention, SwiGLU, and the LM head
    over the padded vocabulary for the ``logp_rows`` rows whose log-probs are taken."""
    h, d = cfg.hidden, cfg.head_dim
    per_token = 2 * (h * (cfg.heads + 2 * cfg.query_groups) * d + cfg.heads * d * h + 3 * h * cfg.ffn_hidden)
    attention = 2 * 2 * cfg.heads * d * (seq_len * (seq_len + 1) // 2)
    return float(batch * cfg.layers * (per_token * seq_len + attention) + 2 * h * cfg.padded_vocab * logp_rows)


def _value_of():
    import torch

    class ValueOf(torch.autograd.Function):
        """Forward: ``value``'s bits; backward: the gradient flows to ``differentiable``."""

        @staticmethod
        def forward(ctx, value, differentiable):
            return value.clone()

        @staticmethod
        def backward(ctx, grad):
            return None, grad

    return ValueOf


class Trainer:
    def __init__(self, config, log=None):
        import torch
        self.config = c = config
        self.dtype = compute_dtype(c.device)
        initial = init_policy_weights(c.model, c.seed, c.device)
        self.reference = {k: v.detach().to(self.dtype, copy=True) for k, v in initial.items()}   # frozen: the KL anchor
        self.weights_sha256 = weights_sha256(self.reference)
        self.params = {k: torch.nn.Parameter(v) for k, v in initial.items()}
        self.rope = rope_for(c.model, self.dtype, c.device)
        fused = {"fused": True} if str(c.device).startswith("cuda") else {"foreach": True}
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=c.lr, weight_decay=c.weight_decay,
                                           betas=(c.adam_beta1, c.adam_beta2), eps=1e-8, **fused)
        self.value_of = _value_of()
        # fused production (P pieces on CUDA): the frozen reference's merged weights built once, one SDPA choice
        from rlk_kernels.grpo.fused import FusedWeights, uses_fused
        fused = uses_fused(c.production, c.impls("train"), c.device)
        self.choice = self.reference_fused = None
        if fused["layers"] or fused["logp"]:
            from rlk_kernels.gpu.production import BackendChoice
            self.choice = BackendChoice(log=log)
            if c.kl_coef > 0:
                self.reference_fused = FusedWeights(self.reference, c.model)

    def identity(self) -> dict:
        return {"config_sha256": self.config.model.config_sha256, "weights_sha256": self.weights_sha256,
                "dtype": str(self.dtype).replace("torch.", "")}

    def train(self, tokens, rollout_logp, rewards) -> dict:
        import torch
        c, cfg = self.config, self.config.model
        sync = lambda: synchronize(c.device)  # noqa: E731
        started = time.perf_counter()
        groups = rewards.view(-1, c.group_size)
        advantages = ((groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, unbiased=False, keepdim=True) + 1e-6)).view(-1)
        sync()
        preprocess = time.perf_counter() - started

        # the train-side recompute with the arm's train operators: the mismatch and the loss's values
        t0 = time.perf_counter()
        current = cast(self.params, self.dtype)
        logp_now = sequence_logprobs(current, cfg, self.rope, tokens, c.impls("train"), prompt_len=PROMPT_LEN,
                                     chunk=c.micro_batch, temperature=c.temperature, production=c.production,
                                     choice=self.choice)
        del current
        sync()
        log_probs_time = time.perf_counter() - t0
        ref_time, ref_logp = None, None
        if c.kl_coef > 0:
            t0 = time.perf_counter()
            ref_logp = sequence_logprobs(self.reference, cfg, self.rope, tokens, c.impls("train"), prompt_len=PROMPT_LEN,
                                         chunk=c.micro_batch, temperature=c.temperature, production=c.production,
                                         fused_weights=self.reference_fused, choice=self.choice)
            sync()
            ref_time = time.perf_counter() - t0

        with torch.no_grad():
            diff = (logp_now.double() - rollout_logp.double()).abs()
            per_count = torch.ne(logp_now, rollout_logp).sum(-1).double()
            numel = logp_now.shape[1]

        # actor: the eager production graph for the gradient in every arm (the fused kernels have no backward),
        # micro-batch by micro-batch
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        tokens_n = float(tokens.shape[0] * numel)
        totals = {"pg": 0.0, "kl": 0.0, "entropy": 0.0, "clip": 0.0}
        for index in range(0, tokens.shape[0], c.micro_batch):
            part = slice(index, index + c.micro_batch)
            w16 = cast(self.params, self.dtype)
            inp = tokens[part, :-1]
            h = layers_forward(w16, cfg, self.rope, w16["embed"][inp], ALL_P)
            rows = h[:, PROMPT_LEN - 1:].reshape(-1, cfg.hidden)
            lp_grad, entropy = production_logp(w16, cfg, rows, tokens[part, PROMPT_LEN:].reshape(-1),
                                               temperature=c.temperature, entropy=True)
            old = logp_now[part].reshape(-1)
            logp = self.value_of.apply(old, lp_grad)
            ratio = torch.exp(logp - old)
            adv = advantages[part].repeat_interleave(numel)
            surrogate = torch.maximum(-ratio * adv, -ratio.clamp(1 - PPO_CLIP_LOW, 1 + PPO_CLIP_HIGH) * adv)
            pg = surrogate.sum() / tokens_n
            loss = pg
            if ref_logp is not None:
                log_ratio = ref_logp[part].reshape(-1) - logp
                kl = (torch.exp(log_ratio) - log_ratio - 1).sum() / tokens_n
                loss = loss + c.kl_coef * kl
                totals["kl"] += float(kl.detach())
            loss.backward()
            totals["pg"] += float(pg.detach())
            totals["entropy"] += float(entropy.sum()) / tokens_n
            totals["clip"] += float(((ratio < 1 - PPO_CLIP_LOW) | (ratio > 1 + PPO_CLIP_HIGH)).sum()) / tokens_n
            del w16, h, rows, lp_grad, entropy, logp, ratio, surrogate, loss
        grad_norm = float(torch.nn.utils.clip_grad_norm_(list(self.params.values()), GRAD_CLIP))
        self.optimizer.step()
        sync()
        actor_train = time.perf_counter() - t0

        seq = tokens.shape[1] - 1
        fwd_tflop = forward_flops(cfg, tokens.shape[0], seq, tokens.shape[0] * numel) / 1e12
        record = {
            "train/loss": totals["pg"] + c.kl_coef * totals["kl"], "train/pg_loss": totals["pg"],
            "train/pg_clipfrac": totals["clip"], "train/entropy_loss": totals["entropy"], "train/ppo_kl": 0.0,
            "train/grad_norm": grad_norm, "train/lr-pg_0": c.lr, "train/kl_loss": totals["kl"],
            "train/train_current_rollout_logprob_mismatch_count": float(per_count.mean()),
            "train/train_current_rollout_logprob_max_abs_diff": float(diff.amax(-1).mean()),
            "train/train_rollout_logprob_abs_diff": float(diff.mean()),
            "train/train_current_rollout_logprob_numel": float(numel),
            "train/global_batch_size": tokens.shape[0],
        }
        timers = {"data_preprocess_time": preprocess, "actor_train_time": actor_train,
                  "total_tokens": tokens.shape[0] * seq, "actor_train_tflops": 3.0 * fwd_tflop / max(actor_train, 1e-9),
                  "log_probs_time": log_probs_time, "log_probs_tflops": fwd_tflop / max(log_probs_time, 1e-9),
                  "mismatched_tokens": int(per_count.sum()), "compared_tokens": int(tokens.shape[0] * numel)}
        if ref_time is not None:
            timers.update(ref_log_probs_time=ref_time, ref_log_probs_tflops=fwd_tflop / max(ref_time, 1e-9))
        return {"record": record, "timers": timers}
