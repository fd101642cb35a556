"""The embedded smoke workload: GRPO on a tiny Qwen3-shaped model, on CPU, with VIME-format records.

A rollout engine (prefill + KV-cache decode under rollout TP, seeded temperature/top-p/top-k
sampling) answers copy prompts ``<bos> d1 d2 d3 =`` and is rewarded per position for
``d1 d2 d3 <eos>``. A trainer recomputes log-probs under the training TP x CP layout, forms GRPO
advantages, minimises the PPO-clip loss (optional low-variance KL to the initial weights) with
AdamW and syncs weights back to the engine. Each module (attention, ffn, logp) runs P or R on each
side as the arm's ``operators`` say, so all-R/R gives bitwise-equal train and rollout log-probs
and every other case a measurable mismatch. Records are printed as VIME prints them::

    rollout 0: {'rollout/raw_reward': ..., ...}
    perf 0: {'perf/rollout_time': ..., 'perf/tokens_per_gpu_per_sec': ..., ...}
    step 0: {'train/loss': ..., 'train/train_current_rollout_logprob_mismatch_count': 0.0, ...}
    perf 0: {'perf/step_time': ..., 'perf/train_time': ..., ...}

The two ``perf`` lines carry the perf keys of reference section 4.1, split as VIME splits them: the
rollout-side line (it has ``perf/rollout_time``) holds the rollout throughputs, the train-side line
(it has ``perf/step_time``) the trainer's timers and the TFLOPS derived from them.

- Rollout throughputs use response tokens and the whole rollout time ``T``:
  ``perf/tokens_per_gpu_per_sec = sum(response lengths) / T / gpus``,
  ``perf/longest_sample_tokens_per_sec = max(response length) / T``, and the ``effective`` pair the
  same over each sample's loss-masked response tokens. The smoke trainer's loss mask
  (:func:`response_loss_mask`) covers every generated token, so the effective figures equal the raw ones.
- ``perf/log_probs_time`` times the trainer's log-prob recompute under the training TP x CP layout.
  The smoke trainer takes one optimizer step per rollout and reads the old log-probs off that same
  forward (old == current policy), so unlike VIME's separate no-grad phase this time is contained in
  ``perf/actor_train_time``.
- ``perf/ref_log_probs_time`` times the reference-model pass (no grad, initial weights) that the
  low-variance KL loss needs. It and ``perf/ref_log_probs_tflops`` are printed only when the arm sets
  ``/workload/kl/use_kl_loss``: with KL off the smoke trainer keeps no reference model and runs no
  reference pass, so there is nothing to time. The reference pass runs before the actor's training
  forward and is not part of ``perf/actor_train_time``.
- TFLOPS count the smoke model's matmul FLOPs (:func:`forward_flops`: q/k/v/o projections, causal
  attention scores and values, SwiGLU FFN, LM head over the padded vocabulary) over each sample's
  prompt + response length, per GPU of the arm's topology: ``log_probs`` and ``ref_log_probs`` one
  forward, ``actor_train`` three (forward + backward).

Entry points: ``SmokeConfig.from_arm(doc)``, ``run_smoke(config, emit=print)``,
``run_smoke_on_ray(config, emit=print)`` and ``python -m rlk_kernels.smoke --arm-file ARM.json``.

Example::

    config = SmokeConfig.from_arm(json.load(open("manifests/smoke.json")))
    run_smoke(config.with_rollouts(2), emit=print)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace

from rlk_kernels.layouts import PHYSICAL_SIZES, MAX_GPUS, TrainLayout
from rlk_kernels.model import ModelConfig, init_weights, weights_sha256
from rlk_kernels.ops import BACKEND_IDS

PAD, BOS, EOS, EQUALS, FIRST_DIGIT = 0, 1, 2, 3, 4
TASK_VOCAB = FIRST_DIGIT + 10
PROMPT_DIGITS = 3
PROMPT_SET_SIZE = 64
PPO_CLIP_LOW, PPO_CLIP_HIGH = 0.2, 0.28
GRAD_CLIP = 1.0
DEFAULT_OPTIMIZER = {"lr": 3e-3, "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.98}
MODULES = ("attention", "ffn", "logp")


# --- configuration -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SmokeConfig:
    arm_name: str
    cases: tuple            # (("attention", "R/R"), ("ffn", "R/R"), ("logp", "R/R"))
    tp: int
    cp: int
    rollout_tp: int
    gpus: int
    model: ModelConfig
    rollout_batch_size: int
    samples_per_prompt: int
    global_batch_size: int
    max_response_len: int
    seed: int
    rollout_seed: int
    rollouts: int
    temperature: float
    top_p: float
    top_k: int
    lr: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    use_kl_loss: bool
    kl_coef: float
    threads: int = 2

    @classmethod
    def from_arm(cls, arm_document: dict) -> "SmokeConfig":
        """Read an ``rlk-kit/arm/v1`` document; ValueError names the JSON pointer of a bad field."""
        def get(path):
            node = arm_document
            for part in path.strip("/").split("/"):
                if not isinstance(node, dict) or part not in node:
                    raise ValueError(f"{path}: missing in the arm document")
                node = node[part]
            return node

        cases = []
        for module in MODULES:
            case = get(f"/operators/{module}")
            if case not in ("P/P", "R/R", "P/R", "R/P"):
                raise ValueError(f"/operators/{module}: {case!r}; accepted: P/P, R/R, P/R, R/P")
            cases.append((module, case))
        try:
            model = ModelConfig.from_arm_model(get("/model"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"/model: {exc}") from None
        if model.vocab < TASK_VOCAB:
            raise ValueError(f"/model/vocab: {model.vocab} is smaller than the smoke task's {TASK_VOCAB} tokens")
        optimizer = get("/workload/optimizer") or DEFAULT_OPTIMIZER
        topo = get("/topology")
        config = cls(
            arm_name=str(arm_document.get("name", "smoke")), cases=tuple(cases),
            tp=int(get("/topology/tp")), cp=int(get("/topology/cp")), rollout_tp=int(get("/topology/rollout_tp")),
            gpus=int(topo.get("gpus", MAX_GPUS)), model=model,
            rollout_batch_size=int(get("/workload/rollout_batch_size")),
            samples_per_prompt=int(get("/workload/samples_per_prompt")),
            global_batch_size=int(get("/workload/global_batch_size")),
            max_response_len=int(get("/workload/max_response_len")),
            seed=int(get("/workload/seed")), rollout_seed=int(get("/workload/rollout_seed")),
            rollouts=int(get("/workload/rollouts")), temperature=float(get("/workload/temperature")),
            top_p=float(get("/workload/top_p")), top_k=int(get("/workload/top_k")),
            lr=float(optimizer["lr"]), weight_decay=float(optimizer["weight_decay"]),
            adam_beta1=float(optimizer["adam_beta1"]), adam_beta2=float(optimizer["adam_beta2"]),
            use_kl_loss=bool(get("/workload/kl/use_kl_loss")), kl_coef=float(get("/workload/kl/coef")),
        )
        if int(topo.get("rollout_cp", 1)) != 1:
            raise ValueError(f"/topology/rollout_cp: {topo.get('rollout_cp')}; the smoke engine accepts 1")
        return config.validated()

    def validated(self) -> "SmokeConfig":
        problems = []
        for field in ("tp", "cp", "rollout_tp"):
            if getattr(self, field) not in PHYSICAL_SIZES:
                problems.append(f"/topology/{field}: {getattr(self, field)}; accepted: 1, 2, 4, 8")
        if self.tp * self.cp > MAX_GPUS:
            problems.append(f"/topology: tp*cp = {self.tp * self.cp} is over {MAX_GPUS}")
        for field in ("tp", "rollout_tp"):
            if self.model.canonical_tp % getattr(self, field):
                problems.append(f"/topology/{field}: does not divide /model/canonical_tp {self.model.canonical_tp}")
        if self.global_batch_size != self.rollout_batch_size * self.samples_per_prompt:
            problems.append(f"/workload/global_batch_size: {self.global_batch_size} must equal rollout_batch_size x "
                            f"samples_per_prompt = {self.rollout_batch_size * self.samples_per_prompt}")
        if self.use_kl_loss != (self.kl_coef > 0):
            problems.append("/workload/kl: use_kl_loss must be true exactly when coef > 0")
        if self.max_response_len < 1 or self.rollouts < 1:
            problems.append("/workload: max_response_len and rollouts must be >= 1")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def with_rollouts(self, rollouts: int) -> "SmokeConfig":
        return replace(self, rollouts=rollouts).validated()

    def impls(self, side: str) -> dict:
        """{"attention": "R", ...} for side "train" (letter before the slash) or "rollout" (after)."""
        index = 0 if side == "train" else 1
        return {module: case.split("/")[index] for module, case in self.cases}

    @property
    def logp_case(self) -> str:
        return dict(self.cases)["logp"]


# --- task ------------------------------------------------------------------------------------------

def prompt_set(seed: int = 0):
    """The built-in copy prompts ``<bos> d1 d2 d3 =`` (a fixed, seeded list) and their answers."""
    import torch
    gen = torch.Generator().manual_seed(7919 + seed)
    digits = torch.randint(0, 10, (PROMPT_SET_SIZE, PROMPT_DIGITS), generator=gen) + FIRST_DIGIT
    prompts = torch.cat([torch.full((PROMPT_SET_SIZE, 1), BOS), digits, torch.full((PROMPT_SET_SIZE, 1), EQUALS)], dim=1)
    answers = torch.cat([digits, torch.full((PROMPT_SET_SIZE, 1), EOS)], dim=1)
    return prompts, answers


def response_loss_mask(lengths, width: int):
    """[B, width] float mask of the response tokens that enter the loss: every generated token."""
    import torch
    return (torch.arange(width)[None, :] < torch.as_tensor(lengths)[:, None]).float()


def forward_flops(cfg: ModelConfig, seqlens) -> float:
    """Matmul FLOPs of one forward pass of the model over sequences of the given lengths.

    Per layer and token: q/k/v and output projections, SwiGLU gate/up/down; per layer and sequence:
    causal attention scores and values (query i sees i+1 keys); then the LM head over the padded
    vocabulary. Element-wise work (norms, rotary, softmax, residuals) is not counted.

        >>> forward_flops(ModelConfig.smoke(), [1]) == 2 * (2 * (128 * (128 + 64 + 64) + 128 * 128 + 3 * 128 * 256
        ...                                                     + 2 * 16 * 8) + 128 * 16)
        True
    """
    h, d = cfg.hidden, cfg.head_dim
    per_token_layer = 2 * (h * (cfg.heads + 2 * cfg.query_groups) * d + cfg.heads * d * h + 3 * h * cfg.ffn_hidden)
    total = 0.0
    for length in seqlens:
        n = int(length)
        attention = 2 * 2 * cfg.heads * d * (n * (n + 1) // 2)
        total += cfg.layers * (per_token_layer * n + attention) + 2 * h * cfg.padded_vocab * n
    return float(total)


def copy_reward(response, length, answer) -> float:
    """Fraction of answer positions the response gets right (``d1 d2 d3 <eos>``)."""
    hits = sum(1 for i in range(min(int(length), answer.shape[0])) if int(response[i]) == int(answer[i]))
    return hits / answer.shape[0]


# --- workers -----------------------------------------------------------------------------------------

class RolloutWorker:
    """The rollout side: an engine under the rollout TP layout, fed weights by sync."""

    def __init__(self, config: SmokeConfig):
        import torch
        from rlk_kernels.forward import RolloutEngine
        torch.set_num_threads(config.threads)
        self.config = config
        self.engine = RolloutEngine(config.model, tp=config.rollout_tp, impls=config.impls("rollout"),
                                    temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
        self.prompts, self.answers = prompt_set()

    def load_weights(self, weights) -> None:
        self.engine.load_weights(weights)

    def generate(self, step: int) -> dict:
        import torch
        c = self.config
        started = time.perf_counter()
        index = torch.tensor([(step * c.rollout_batch_size + i) % PROMPT_SET_SIZE for i in range(c.rollout_batch_size)])
        index = index.repeat_interleave(c.samples_per_prompt)
        prompts = self.prompts[index]
        generator = torch.Generator().manual_seed(c.rollout_seed * 1_000_003 + step)
        out = self.engine.generate(prompts, max_new=c.max_response_len, eos=EOS, generator=generator)
        plen = prompts.shape[1]
        rewards = [copy_reward(out["tokens"][i, plen:], out["response_lengths"][i], self.answers[index[i]])
                   for i in range(len(index))]
        out.update(prompt_len=plen, rewards=torch.tensor(rewards), rollout_time=time.perf_counter() - started)
        return out


class TrainerWorker:
    """The training side: weights, AdamW, logp recompute under TP x CP, GRPO + PPO-clip."""

    def __init__(self, config: SmokeConfig):
        import torch
        torch.set_num_threads(config.threads)
        self.config = config
        torch.manual_seed(config.seed)
        initial = init_weights(config.model, config.seed)
        self.weights_sha256 = weights_sha256(initial)
        self.params = {k: torch.nn.Parameter(v.clone()) for k, v in initial.items()}
        self.reference = {k: v.clone() for k, v in initial.items()} if config.use_kl_loss else None
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=config.lr, weight_decay=config.weight_decay,
                                           betas=(config.adam_beta1, config.adam_beta2), eps=1e-8)

    def identity(self) -> dict:
        return {"config_sha256": self.config.model.config_sha256, "weights_sha256": self.weights_sha256}

    def state(self) -> dict:
        return {k: v.detach().clone() for k, v in self.params.items()}

    def train(self, batch: dict) -> dict:
        import torch
        from rlk_kernels.forward import train_logprobs
        c = self.config
        started = time.perf_counter()
        plen, lengths = batch["prompt_len"], batch["response_lengths"]
        width = int(lengths.max())
        tokens = batch["tokens"][:, :plen + width]
        rewards = batch["rewards"]
        groups = rewards.view(-1, c.samples_per_prompt)
        mean = groups.mean(-1, keepdim=True)
        std = groups.std(-1, unbiased=False, keepdim=True)
        advantages = ((groups - mean) / (std + 1e-6)).view(-1)
        mask = response_loss_mask(lengths, width)
        rollout_logp = batch["logprobs"][:, :width]
        layout = TrainLayout(c.tp, c.cp)
        preprocess = time.perf_counter() - started

        ref_time = None
        if c.use_kl_loss:
            ref_started = time.perf_counter()
            with torch.no_grad():
                ref_all, _ = train_logprobs(self.reference, c.model, tokens, layout, c.impls("train"), temperature=c.temperature)
            ref_time = time.perf_counter() - ref_started

        train_started = time.perf_counter()
        logp_all, logits_all = train_logprobs(self.params, c.model, tokens, layout, c.impls("train"), temperature=c.temperature)
        log_probs_time = time.perf_counter() - train_started
        logp = logp_all[:, plen - 1:plen - 1 + width]
        old = logp.detach()
        tokens_n = mask.sum()

        # train/rollout mismatch, per sample then averaged over samples (as VIME reports it)
        with torch.no_grad():
            active = mask.bool()
            diff = (old.double() - rollout_logp.double()).abs()
            per_count = (torch.ne(old, rollout_logp) & active).sum(-1).double()
            per_max = torch.where(active, diff, torch.zeros_like(diff)).amax(-1)
            per_numel = active.sum(-1).double()
            per_mean = torch.where(active, diff, torch.zeros_like(diff)).sum(-1) / per_numel.clamp(min=1)
            logits = logits_all[:, plen - 1:plen - 1 + width]
            logsm = torch.log_softmax(logits.double(), -1)
            entropy = -(logsm.exp() * logsm).sum(-1)
            entropy_loss = float((entropy * mask).sum() / tokens_n)

        ratio = torch.exp(logp - old)
        adv = advantages[:, None]
        surrogate = torch.maximum(-ratio * adv, -ratio.clamp(1 - PPO_CLIP_LOW, 1 + PPO_CLIP_HIGH) * adv)
        pg_loss = (surrogate * mask).sum() / tokens_n
        clipfrac = float((((ratio < 1 - PPO_CLIP_LOW) | (ratio > 1 + PPO_CLIP_HIGH)).float() * mask).sum() / tokens_n)
        ppo_kl = float(((old - logp.detach()) * mask).sum() / tokens_n)
        loss = pg_loss
        kl_loss = 0.0
        if c.use_kl_loss:
            log_ratio = ref_all[:, plen - 1:plen - 1 + width] - logp
            kl = torch.exp(log_ratio) - log_ratio - 1
            kl_term = (kl * mask).sum() / tokens_n
            loss = loss + c.kl_coef * kl_term
            kl_loss = float(kl_term.detach())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(list(self.params.values()), GRAD_CLIP))
        self.optimizer.step()
        actor_train = time.perf_counter() - train_started
        seqlens = [plen + int(n) for n in lengths]
        total_tokens = sum(seqlens)
        fwd_tflop_per_gpu = forward_flops(c.model, seqlens) / c.gpus / 1e12
        record = {
            "train/loss": float(loss.detach()), "train/pg_loss": float(pg_loss.detach()), "train/pg_clipfrac": clipfrac,
            "train/entropy_loss": entropy_loss, "train/ppo_kl": ppo_kl, "train/grad_norm": grad_norm,
            "train/lr-pg_0": c.lr, "train/kl_loss": kl_loss,
            "train/train_current_rollout_logprob_mismatch_count": float(per_count.mean()),
            "train/train_current_rollout_logprob_max_abs_diff": float(per_max.mean()),
            "train/train_rollout_logprob_abs_diff": float(per_mean.mean()),
            "train/train_current_rollout_logprob_numel": float(per_numel.mean()),
            "train/global_batch_size": c.global_batch_size,
        }
        timers = {"data_preprocess_time": preprocess, "actor_train_time": actor_train, "total_tokens": total_tokens,
                  "actor_train_tflops": 3.0 * fwd_tflop_per_gpu / max(actor_train, 1e-9),
                  "log_probs_time": log_probs_time, "log_probs_tflops": fwd_tflop_per_gpu / max(log_probs_time, 1e-9)}
        if ref_time is not None:
            timers.update(ref_log_probs_time=ref_time, ref_log_probs_tflops=fwd_tflop_per_gpu / max(ref_time, 1e-9))
        return {"record": record, "timers": timers, "advantages": float(advantages.mean())}


# --- driver --------------------------------------------------------------------------------------------

def _round(record: dict) -> dict:
    return {k: (round(v, 10) if isinstance(v, float) else v) for k, v in record.items()}


def route_lines(config: SmokeConfig) -> list[str]:
    lines = []
    for side, framework, target in (("train", "smoke-train", "training"), ("rollout", "smoke-rollout", "rollout")):
        for module, letter in config.impls(side).items():
            requested = "rl_kernel" if letter == "R" else "production"
            lines.append(f"[RL-Kernel][route] framework={framework} target={target} module={module} "
                         f"requested={requested} actual={BACKEND_IDS[(module, letter)]} fallback=false")
    return lines


def _drive(config: SmokeConfig, emit, should_stop, rollout, trainer, call) -> int:
    identity = call(trainer, "identity")
    emit(f"smoke model {config.model.name}: config_sha256={identity['config_sha256']} "
         f"weights_sha256={identity['weights_sha256']} seed={config.seed} rollout_seed={config.rollout_seed}")
    for line in route_lines(config):
        emit(line)
    emit(f"rlkernel mismatch sidecar active: logp_case={config.logp_case}")
    done = 0
    for step in range(config.rollouts):
        if should_stop():
            break
        step_started = time.perf_counter()
        sync_started = time.perf_counter()
        call(rollout, "load_weights", call(trainer, "state"))
        update_weights = time.perf_counter() - sync_started

        rollout_started = time.perf_counter()
        batch = call(rollout, "generate", step)
        rollout_time = time.perf_counter() - rollout_started
        lengths = [int(n) for n in batch["response_lengths"]]
        rewards = batch["rewards"]
        groups = rewards.view(-1, config.samples_per_prompt)
        normalized = ((groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, unbiased=False, keepdim=True) + 1e-6)).view(-1)
        truncated = [bool(t) for t in batch["truncated"]]
        totals = [batch["prompt_len"] + n for n in lengths]
        active = sum(lengths)
        rollout_logp = float(sum(float(batch["logprobs"][i, :n].sum()) for i, n in enumerate(lengths)) / max(active, 1))
        emit(f"rollout {step}: " + repr(_round({
            "rollout/raw_reward": float(rewards.mean()), "rollout/rewards": float(normalized.mean()),
            "rollout/advantages": float(normalized.mean()), "rollout/log_probs": rollout_logp,
            "rollout/rollout_log_probs": rollout_logp,
            "rollout/response_lengths": statistics.fmean(lengths), "rollout/total_lengths": statistics.fmean(totals),
            "rollout/truncated": statistics.fmean(truncated), "rollout/truncated_ratio": statistics.fmean(truncated),
            "rollout/response_len/mean": statistics.fmean(lengths), "rollout/response_len/max": max(lengths),
            "rollout/response_len/min": min(lengths), "rollout/response_len/median": statistics.median(lengths),
        })))
        effective = [int(n) for n in response_loss_mask(lengths, max(lengths)).sum(-1)]
        per_second = 1.0 / max(rollout_time, 1e-9)
        emit(f"perf {step}: " + repr(_round({
            "perf/rollout_time": rollout_time,
            "perf/tokens_per_gpu_per_sec": sum(lengths) * per_second / config.gpus,
            "perf/longest_sample_tokens_per_sec": max(lengths) * per_second,
            "perf/effective_tokens_per_gpu_per_sec": sum(effective) * per_second / config.gpus,
            "perf/longest_effective_sample_tokens_per_sec": max(effective) * per_second,
        })))

        train_started = time.perf_counter()
        result = call(trainer, "train", batch)
        train_time = time.perf_counter() - train_started
        record = dict(result["record"], **{"train/step": step})
        emit(f"step {step}: " + repr(_round(record)))
        timers = result["timers"]
        step_time = time.perf_counter() - step_started
        train_perf = {
            "perf/step_time": step_time, "perf/train_time": train_time,
            "perf/actor_train_time": timers["actor_train_time"], "perf/update_weights_time": update_weights,
            "perf/train_wait_time": rollout_time + update_weights, "perf/data_preprocess_time": timers["data_preprocess_time"],
            "perf/actor_train_tok_per_s": timers["total_tokens"] / max(timers["actor_train_time"], 1e-9),
            "perf/actor_train_tflops": timers["actor_train_tflops"],
            "perf/log_probs_time": timers["log_probs_time"], "perf/log_probs_tflops": timers["log_probs_tflops"],
            "perf/wait_time_ratio": (rollout_time + update_weights) / max(step_time, 1e-9),
        }
        if "ref_log_probs_time" in timers:  # only with a reference model (KL loss on)
            train_perf.update({"perf/ref_log_probs_time": timers["ref_log_probs_time"],
                               "perf/ref_log_probs_tflops": timers["ref_log_probs_tflops"]})
        emit(f"perf {step}: " + repr(_round(train_perf)))
        done += 1
    return done


def run_smoke(config: SmokeConfig, emit=print, should_stop=lambda: False) -> int:
    """Run in-process (rollout and trainer workers in this process); returns the number of steps run."""
    import torch
    previous = torch.get_num_threads()
    try:
        rollout, trainer = RolloutWorker(config), TrainerWorker(config)
        return _drive(config, emit, should_stop, rollout, trainer, lambda obj, method, *args: getattr(obj, method)(*args))
    finally:
        torch.set_num_threads(previous)


def node_identity_problems(expected: dict, declared: dict | None, versions: dict[str, str | None]) -> list[str]:
    """Fields where this node differs from what the job expects (pure): ``expected`` is the kit's
    RLK_EXPECTED_NODE_IDENTITY, ``declared`` the node's RLK_NODE_IDENTITY, ``versions`` installed packages."""
    out = []
    for field, want in sorted(expected.get("node", {}).items()):
        got = (declared or {}).get(field)
        if got != want:
            out.append(f"node_identity.{field} expected {want!r}, observed {got!r}")
    for name, want in sorted(expected.get("packages", {}).items()):
        if versions.get(name) != want:
            out.append(f"packages.{name} expected {want!r}, observed {versions.get(name)!r}")
    return out


def check_node_identity() -> None:
    """Inside an actor: refuse a node that differs from the probed ones (one that joined after the probe)."""
    expected = os.environ.get("RLK_EXPECTED_NODE_IDENTITY")
    if not expected:
        return
    import importlib.metadata as md
    import ray

    expected = json.loads(expected)
    declared = json.loads(os.environ.get("RLK_NODE_IDENTITY") or "null")
    versions = {}
    for name in expected.get("packages", {}):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    problems = node_identity_problems(expected, declared, versions)
    if problems:
        ctx = ray.get_runtime_context()
        name = f", {declared['name']}" if declared and declared.get("name") else ""
        raise RuntimeError(f"node {ctx.get_node_id()[:12]} ({ray.util.get_node_ip_address()}{name}): "
                           + "; ".join(problems))


def _checked(cls):
    """``cls`` whose actor checks its node's identity first and can say where it runs."""
    class Checked(cls):
        def __init__(self, config):
            check_node_identity()
            super().__init__(config)

        def node(self) -> str:
            import ray
            return ray.get_runtime_context().get_node_id()

    Checked.__name__ = Checked.__qualname__ = cls.__name__
    return Checked


def run_smoke_on_ray(config: SmokeConfig, emit=print, should_stop=lambda: False) -> int:
    """Run with a rollout actor and a trainer actor on the current Ray cluster (started locally if none).
    On a cluster of two or more nodes they go to different nodes (a STRICT_SPREAD placement group), so
    the weight sync and the batches cross nodes."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():
        ray.init(include_dashboard=False, ignore_reinit_error=True, log_to_driver=True)
    group = None
    options = [{}, {}]
    if sum(1 for n in ray.nodes() if n["Alive"] and n.get("Resources", {}).get("CPU", 0) >= 1) >= 2:
        group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
        ray.get(group.ready(), timeout=120)
        options = [{"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)}
                   for i in (0, 1)]
    rollout_cls = ray.remote(num_cpus=1)(_checked(RolloutWorker))
    trainer_cls = ray.remote(num_cpus=1)(_checked(TrainerWorker))
    rollout, trainer = rollout_cls.options(**options[0]).remote(config), trainer_cls.options(**options[1]).remote(config)
    try:
        emit(f"placement: rollout on node {ray.get(rollout.node.remote())}, "
             f"trainer on node {ray.get(trainer.node.remote())}")
        return _drive(config, emit, should_stop, rollout, trainer,
                      lambda handle, method, *args: ray.get(getattr(handle, method).remote(*args)))
    finally:
        ray.kill(rollout)
        ray.kill(trainer)
        if group is not None:
            remove_placement_group(group)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlk_kernels.smoke",
                                     description="Run the embedded smoke workload of an arm and print VIME-format records.")
    parser.add_argument("--arm-file", required=True, help="an rlk-kit/arm/v1 JSON document with engine 'smoke'")
    parser.add_argument("--rollouts", type=int, help="override /workload/rollouts")
    parser.add_argument("--ray", action="store_true", help="run rollout and trainer as Ray actors")
    args = parser.parse_args(argv)
    try:
        with open(args.arm_file, encoding="utf-8") as handle:
            document = json.load(handle)
        config = SmokeConfig.from_arm(document)
        if args.rollouts is not None:
            config = config.with_rollouts(args.rollouts)
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        print(f"smoke: {args.arm_file}: {exc}", file=sys.stderr)
        return 2
    emit = lambda line: print(line, flush=True)  # noqa: E731
    (run_smoke_on_ray if args.ray else run_smoke)(config, emit=emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
