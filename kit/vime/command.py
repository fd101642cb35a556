"""The VIME train.py command, its Ray runtime environment and the job submission (reference §2.3, §2.4).

The seed's entrypoint appended flags behind the launcher's back; here the complete command is
expanded up front, recorded as it runs, and the appended part is still listed separately so a
reader can match it against the seed's logs. Paths are the in-image ones (kit/image_layout.py).
Example::

    cmd = train_command(arm_doc, layout, run_dir="/workspace/runs/r1")
    cmd.argv[:3]   # ['/opt/rlk/venv/bin/python', 'train.py', '--train-backend']
"""

from __future__ import annotations

from dataclasses import dataclass

from kit import image_layout as L

MODEL_ARGS = [
    "--swiglu", "--num-layers", "{layers}", "--hidden-size", "{hidden}", "--ffn-hidden-size", "{ffn_hidden}",
    "--num-attention-heads", "{heads}", "--group-query-attention", "--num-query-groups", "{query_groups}",
    "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm",
    "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--vocab-size", "{vocab}", "--kv-channels", "{head_dim}",
    "--qk-layernorm", "--untie-embeddings-and-output-weights",
]
LOGP_PROVIDER = "rl_engine.integrations.orchestrators.vime.providers.linear_logp_provider.provider"
MEGATRON_INIT = "rl_engine.integrations.engines.train.megatron.runtime.initialize_from_environment"
TIS_HOOK = "rl_engine.integrations.orchestrators.vime.experiments.rocm_attention.tis_metrics.metrics_only_tis"
STRICT_CI_FLAGS = ["--ci-test", "--ci-disable-kl-checker", "--ci-train-rollout-logprob-abs-diff-threshold", "0"]
REAL_VOCAB = 151936


@dataclass(frozen=True)
class TrainCommand:
    argv: list[str]                 # complete, as it runs
    entrypoint_appended: list[str]  # the part the seed's aligned_python_entrypoint.sh used to append


def _fmt(x) -> str:
    return repr(float(x)) if isinstance(x, float) else str(x)


def capture_sizes_json(sizes: list[int]) -> str:
    return '{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[%s],"max_cudagraph_capture_size":%d}' % (
        ",".join(map(str, sizes)), max(sizes))


def train_command(arm: dict, layout: dict, run_dir: str, *, capture_sizes: list[int]) -> TrainCommand:
    m, wl, ops = arm["model"], arm["workload"], arm["operators"]
    tp, cp, rtp, rcp = layout["tp"], layout["cp"], layout["rollout_tp"], layout["rollout_cp"]
    argv = [L.PYTHON, "train.py",
            "--train-backend", "megatron", "--actor-num-nodes", "1",
            "--actor-num-gpus-per-node", str(layout["actor_gpus"]), "--rollout-num-gpus", str(layout["rollout_gpus"]),
            "--colocate", "--offload-train" if layout["offload_train"] else "--no-offload-train", "--offload-rollout"]
    argv += [a.format(**m) for a in MODEL_ARGS]
    argv += ["--hf-checkpoint", L.MODEL_DIR, "--ref-load", L.CHECKPOINT_DIR, "--load", f"{run_dir}/initial-load",
             "--prompt-data", f"{L.DATA_DIR}/dapo-math-17k.jsonl",
             "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--rollout-shuffle",
             "--rm-type", "deepscaler", "--advantage-estimator", "grpo",
             "--num-rollout", str(wl["rollouts"]), "--rollout-batch-size", str(wl["rollout_batch_size"]),
             "--n-samples-per-prompt", str(wl["samples_per_prompt"]), "--rollout-max-response-len", str(wl["max_response_len"]),
             "--rollout-temperature", _fmt(float(wl["temperature"])), "--rollout-top-p", _fmt(float(wl["top_p"])),
             "--rollout-top-k", str(wl["top_k"])]
    opt = wl["optimizer"]
    if opt is not None:
        argv += ["--optimizer", opt["name"], "--lr", repr(float(opt["lr"])), "--lr-decay-style", "constant",
                 "--weight-decay", _fmt(float(opt["weight_decay"])), "--adam-beta1", _fmt(float(opt["adam_beta1"])),
                 "--adam-beta2", _fmt(float(opt["adam_beta2"])), "--entropy-coef", "0"]
    argv += ["--global-batch-size", str(wl["global_batch_size"]), "--balance-data",
             "--tensor-model-parallel-size", str(tp),
             "--make-vocab-size-divisible-by", str(128 * m["canonical_tp"] // tp),
             "--context-parallel-size", str(cp), "--cp-comm-type", "p2p",
             "--pipeline-model-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
             "--use-dynamic-batch-size", "--max-tokens-per-gpu", str(wl["max_tokens_per_gpu"]),
             "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
             "--custom-megatron-init-path", MEGATRON_INIT,
             "--save-debug-train-data", f"{run_dir}/train-data/{{rollout_id}}.rank{{rank}}.pt",
             "--update-weight-mode", "full", "--update-weight-transport", "disk",
             "--update-weight-disk-dir", f"{run_dir}/weight-updates"]
    if ops["logp"][0] == "R":  # training-side logp strict: the provider; production must pass none
        argv += ["--linear-logp-provider", LOGP_PROVIDER, "--linear-logp-provider-mode", "strict"]
    argv += ["--no-save-optim", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
             "--transformer-impl", "transformer_engine", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion",
             "--no-rope-fusion", "--attention-softmax-in-fp32",
             "--attention-backend", arm["attention_backend"],
             "--router-policy", wl["router_policy"],
             "--rollout-num-gpus-per-engine", str(rtp * rcp),
             "--vllm-prefill-context-parallel-size", str(rcp),
             "--vllm-gpu-memory-utilization", _fmt(float(layout["vllm_gpu_memory_utilization"])),
             "--vllm-logprobs-mode", "processed_logprobs",
             "--get-mismatch-metrics", "--custom-tis-function-path", TIS_HOOK]
    if arm["use_rollout_logprobs"]:
        argv += ["--use-rollout-logprobs"]
    if wl["kl"]["use_kl_loss"]:
        argv += ["--use-kl-loss", "--kl-loss-coef", repr(float(wl["kl"]["coef"]))]
    if all(case == "R/R" for case in ops.values()):
        argv += STRICT_CI_FLAGS
    appended = ["--seed", str(wl["seed"]), "--rollout-seed", str(wl["rollout_seed"]),
                "--vllm-enable-deterministic-inference", "--vllm-attention-backend", "flash_attn",
                "--vllm-disable-custom-all-reduce", "--deterministic-mode", "--accumulate-allreduce-grads-in-fp32"]
    if arm["graph"]["mode"] == "NONE":
        appended += ["--vllm-enforce-eager"]
    else:
        appended += ["--vllm-optimization-level", "0", "--vllm-compilation-config", capture_sizes_json(capture_sizes)]
    return TrainCommand(argv + appended, appended)


def runtime_env_vars(arm: dict, layout: dict, run_id: str, run_dir: str, *, capture_sizes: list[int]) -> dict[str, str]:
    """The job's environment (reference §2.3) with in-image paths; no caller PYTHONPATH leaks in."""
    m, wl, ops = arm["model"], arm["workload"], arm["operators"]
    strict = all(case == "R/R" for case in ops.values())
    rlk, vime, meg = L.source_dir("rl-kernel"), L.source_dir("vime"), L.source_dir("megatron-lm")
    return {
        "RL_KERNEL_ROOT": rlk,
        "RL_KERNEL_REAL_PYTHON": L.PYTHON,
        "PYTHONPATH": ":".join([rlk, vime, meg]),
        "PYTHONUNBUFFERED": "1",
        "PYTHONHASHSEED": str(wl["seed"]),
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_ALGO": "Ring",
        "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
        "CUBLAS_WORKSPACE_CONFIG": ":16:8",
        "CUBLASLT_WORKSPACE_SIZE": "1",
        "VLLM_BATCH_INVARIANT": "1",
        "RL_KERNEL_VLLM_INTEGRATION": "1",
        "RL_KERNEL_CUDA_ONLY": "1",
        "VIME_RL_KERNEL_STRICT": "1",
        "RL_KERNEL_COMPLETE_SAMPLING_SUPPORT": "1",
        "RL_KERNEL_ATTENTION_CASE": ops["attention"],
        "RL_KERNEL_FFN_CASE": ops["ffn"],
        "RL_KERNEL_LOGP_CASE": ops["logp"],
        "RL_KERNEL_STRICT_CANONICAL_TP": str(m["canonical_tp"]),
        "RL_KERNEL_STRICT_CANONICAL_VOCAB_SIZE": str(m["padded_vocab"]),
        "RL_KERNEL_READBACK_DIR": f"{run_dir}/readbacks",
        "RL_KERNEL_MISMATCH_SIDECAR_DIR": f"{run_dir}/mismatch-sidecars",
        "RL_KERNEL_WEIGHT_AUDIT_DIR": f"{run_dir}/weight-audit",
        "RL_KERNEL_VLLM_REAL_VOCAB_SIZE": str(m["vocab"]),
        "RL_KERNEL_VLLM_PADDED_VOCAB_SIZE": str(m["padded_vocab"]),
        "RL_KERNEL_VLLM_TEMPERATURE": _fmt(float(wl["temperature"])),
        "RL_KERNEL_VLLM_CUDAGRAPH_MAX_CAPTURE_SIZE": str(max(capture_sizes) if capture_sizes else 0),
        "RL_KERNEL_SEED": str(wl["seed"]),
        "RL_KERNEL_ROLLOUT_SEED": str(wl["rollout_seed"]),
        "RL_KERNEL_CANONICAL_CP_GRAD": "1" if strict else "0",
        "RL_KERNEL_RUN_ID": run_id,
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def submission_id(run_id: str) -> str:
    """Ray submission id of a run: one per run id, never a fixed prefix tied to a rollout count."""
    return f"rlk-{run_id}"
