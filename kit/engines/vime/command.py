"""The VIME train.py command, its Ray runtime environment and the job submission (reference §2.3, §2.4).

The seed's entrypoint appended flags behind the launcher's back; here the complete command is
expanded up front, recorded as it runs, and the appended part is still listed separately so a
reader can match it against the seed's logs. Paths are the in-image ones (kit/build/layout.py).

The command depends on the launcher revision (run_arm.py, part of RL-Kernel): the pinned code of the
published G10/G11 runs only accepts what the historical launcher passed, so a stack names the revision
its pins go with (its ``launcher`` field), and each revision is data (``LAUNCHERS``).
Example::

    launcher = launcher_for_stack(arm.stack)            # LAUNCHERS["current"] for vime-current
    cmd = train_command(arm_doc, layout, run_dir="/workspace/runs/r1", capture_sizes=[1, 2, 3, 4], launcher=launcher)
    cmd.argv[:3]   # ['/opt/rlk/venv/bin/python', 'train.py', '--train-backend']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kit.build import layout as L
from kit.model.arm import algorithm_of

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


CURRENT, HISTORICAL = "current", "historical"


@dataclass(frozen=True)
class LauncherRevision:
    """What one run_arm.py revision put into the train command and the job env (reference §2.1–§2.4).

    Every field is a difference between the revisions; ``LAUNCHERS`` holds the two the reference describes.
    """
    name: str
    source: str                         # where the reference read it
    logp_provider: str                  # §1.1: --linear-logp-provider for a strict training-side logp
    megatron_init: str                  # §2.4: --custom-megatron-init-path
    tis_hook: str                       # §2.4: --custom-tis-function-path
    pythonpath_examples: bool           # §2.3: <rlk>/examples first on PYTHONPATH (the historical hook lives there)
    sampling_from_arm: bool             # §2.4: --rollout-temperature/--rollout-top-p from the arm, else constant 1.0
    passes_top_k: bool                  # §2.1/§2.4 †: --rollout-top-k
    passes_optimizer: bool              # §2.4 †, §12.11: --optimizer adam --lr … --entropy-coef 0
    passes_vocab_divisor: bool          # §2.4 †: --make-vocab-size-divisible-by 128*canonical_tp/tp
    passes_logprobs_mode: bool          # §2.4 †: --vllm-logprobs-mode processed_logprobs
    offload_rule: bool                  # §1.5/§2.4: --offload-train iff TP1 and rollout TP1; else always --no-offload-train
    capture_per_engine: bool            # §2.3: capture 1..per-engine decode batch; else 1..rollout_batch_size×samples
    fixed_training_layout: tuple[int, int] | None  # §1.5: historical run_arm fixes training (TP, CP); rollout TP/CP free
    default_memory_utilization: float | None        # §1.5: historical default 0.4; None: the 0.2/0.4 rule
    env_absent: frozenset[str] = field(default_factory=frozenset)  # §2.3: env vars this revision did not set
    env_values: tuple[tuple[str, str], ...] = ()   # §2.3: env vars this revision set to a fixed value


LAUNCHERS = {
    CURRENT: LauncherRevision(
        name=CURRENT,
        source="rl_engine/integrations/orchestrators/vime/experiments/dense/run_arm.py (baa141a), reference §2",
        logp_provider=LOGP_PROVIDER, megatron_init=MEGATRON_INIT, tis_hook=TIS_HOOK, pythonpath_examples=False,
        sampling_from_arm=True, passes_top_k=True, passes_optimizer=True, passes_vocab_divisor=True,
        passes_logprobs_mode=True, offload_rule=True, capture_per_engine=True,
        fixed_training_layout=None, default_memory_utilization=None),
    HISTORICAL: LauncherRevision(
        name=HISTORICAL,
        source=("examples/vime_qwen3_8b_tp4_cp2_200/run_arm.py, the oldest version, which ran the published "
                "G10/G11 (reference §2.3); without the flags and env vars §2.1–§2.4 mark † (absent at 162875d)"),
        # §1.1: "The historical path was rl_engine.integrations.vime.linear_logp_provider.provider"
        logp_provider="rl_engine.integrations.vime.linear_logp_provider.provider",
        # §2.4 --custom-megatron-init-path, historical value
        megatron_init="rl_engine.integrations.megatron_runtime.initialize_from_environment",
        # §2.4 --custom-tis-function-path, "historical hook path"; the module is examples/vime_rocm_attention_ablation/
        # tis_metrics.py (§0), importable through <rlk>/examples on PYTHONPATH (§2.3)
        tis_hook="vime_rocm_attention_ablation.tis_metrics.metrics_only_tis",
        pythonpath_examples=True,
        sampling_from_arm=False,        # §2.4: "historical: constant 1.0, 1.0"
        passes_top_k=False,             # §2.4 † --rollout-top-k
        passes_optimizer=False,         # §2.4 †, §12.11: "historical: none, so VIME defaults applied"
        passes_vocab_divisor=False,     # §2.4 † --make-vocab-size-divisible-by
        passes_logprobs_mode=False,     # §2.4 † --vllm-logprobs-mode processed_logprobs
        offload_rule=False,             # §2.4: "historical: always --no-offload-train"
        capture_per_engine=False,       # §2.3: the oldest run_arm "used the full product, giving capture sizes 1..8"
        fixed_training_layout=(4, 2),   # §1.5: "Historical run_arm (162875d): training TP/CP fixed at 4/2"
        default_memory_utilization=0.4,  # §1.5: "Historical run_arm: default 0.4"
        env_absent=frozenset({
            "RL_KERNEL_COMPLETE_SAMPLING_SUPPORT",       # §2.3 †
            "RL_KERNEL_STRICT_CANONICAL_TP",             # §2.3 †
            "RL_KERNEL_STRICT_CANONICAL_VOCAB_SIZE",     # §2.3 †
            "RL_KERNEL_WEIGHT_AUDIT_DIR",                # §2.3 †
            "RL_KERNEL_CANONICAL_CP_GRAD",               # §2.3 †, §1.1 ("in the current version")
            "RL_KERNEL_MISMATCH_SIDECAR_DIR",            # §2.3: "absent in the oldest version"
        }),
        env_values=(
            ("RL_KERNEL_VLLM_PADDED_VOCAB_SIZE", "152064"),  # §2.3 "(historical: 152064)", §12.11
            ("RL_KERNEL_VLLM_TEMPERATURE", "1.0"),           # §2.3 '(historical: "1.0")'
        )),
}

def launcher_for_stack(stack) -> LauncherRevision:
    """The launcher revision the stack names (its ``launcher`` field; the current one when absent).

    ``launcher_for_stack(catalog.stack("vime-g10")).name == "historical"``. The launcher is RL-Kernel's
    run_arm.py, but the RL-Kernel commit alone does not decide it: vime-current pins G11's RL-Kernel
    commit with the companion-patched VIME that the current launcher drives, so the stack says which.
    """
    return LAUNCHERS[stack.document.get("launcher", CURRENT)]


def launcher_record(stack, launcher: LauncherRevision) -> dict:
    """What the plan records about the launcher revision its command follows: the stack that names it
    and that stack's RL-Kernel and VIME commits, which the revision goes with."""
    return {"revision": launcher.name, "source": launcher.source, "stack": stack.name,
            "pins": {name: (stack.source(name) or {}).get("commit") for name in ("rl-kernel", "vime")}}


def launcher_problems(arm: dict, launcher: LauncherRevision) -> list[tuple[str, str]]:
    """Arm settings the launcher revision cannot pass to train.py, as (pointer under the arm, message)."""
    out, wl, topo = [], arm["workload"], arm["topology"]
    what = f"the {launcher.name} launcher"
    padded = dict(launcher.env_values).get("RL_KERNEL_VLLM_PADDED_VOCAB_SIZE")
    if padded is not None and str(arm["model"]["padded_vocab"]) != padded:
        out.append(("/model/padded_vocab", f"{arm['model']['padded_vocab']}: {what} sets "
                                           f"RL_KERNEL_VLLM_PADDED_VOCAB_SIZE={padded} (reference §2.3)"))
    if launcher.fixed_training_layout and (topo["tp"], topo["cp"]) != launcher.fixed_training_layout:
        tp, cp = launcher.fixed_training_layout
        out.append(("/topology/tp", f"training TP{topo['tp']}/CP{topo['cp']}: {what} fixes training at TP{tp}/CP{cp} "
                                    "(reference §1.5); only the rollout TP is free"))
    if not launcher.sampling_from_arm:
        for key in ("temperature", "top_p"):
            if float(wl[key]) != 1.0:
                out.append((f"/workload/{key}", f"{wl[key]}: {what} passes a constant 1.0 (reference §2.4)"))
    if not launcher.passes_top_k and wl["top_k"] != -1:
        out.append(("/workload/top_k", f"{wl['top_k']}: {what} has no --rollout-top-k (reference §2.4); only -1"))
    if not launcher.passes_optimizer and wl["optimizer"] is not None:
        out.append(("/workload/optimizer", f"{what} passes no optimizer flags, so VIME's defaults apply "
                                           "(reference §2.4, §12.11); only null"))
    return out


def launcher_capture_sizes(arm: dict, launcher: LauncherRevision) -> list[int] | None:
    """The capture sizes a revision fixes whatever the topology (§2.3: the oldest launcher captured
    1..rollout_batch_size×samples); None when they follow the per-engine rule."""
    if launcher.capture_per_engine or arm["graph"]["mode"] == "NONE":
        return None
    wl = arm["workload"]
    return list(range(1, wl["rollout_batch_size"] * wl["samples_per_prompt"] + 1))


@dataclass(frozen=True)
class TrainCommand:
    argv: list[str]                 # complete, as it runs
    entrypoint_appended: list[str]  # the part the seed's aligned_python_entrypoint.sh used to append


def _fmt(x) -> str:
    return repr(float(x)) if isinstance(x, float) else str(x)


def capture_sizes_json(sizes: list[int]) -> str:
    return '{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[%s],"max_cudagraph_capture_size":%d}' % (
        ",".join(map(str, sizes)), max(sizes))


def train_command(arm: dict, layout: dict, run_dir: str, *, capture_sizes: list[int],
                  launcher: LauncherRevision = LAUNCHERS[CURRENT]) -> TrainCommand:
    m, wl, ops = arm["model"], arm["workload"], arm["operators"]
    algorithm = algorithm_of(arm)
    tp, cp, rtp, rcp = layout["tp"], layout["cp"], layout["rollout_tp"], layout["rollout_cp"]
    argv = [L.PYTHON, "train.py",
            "--train-backend", "megatron", "--actor-num-nodes", "1",
            "--actor-num-gpus-per-node", str(layout["actor_gpus"]), "--rollout-num-gpus", str(layout["rollout_gpus"]),
            "--colocate", "--offload-train" if launcher.offload_rule and layout["offload_train"] else "--no-offload-train",
            "--offload-rollout"]
    argv += [a.format(**m) for a in MODEL_ARGS]
    argv += ["--hf-checkpoint", L.MODEL_DIR, "--ref-load", L.CHECKPOINT_DIR, "--load", f"{run_dir}/initial-load",
             "--prompt-data", f"{L.DATA_DIR}/dapo-math-17k.jsonl",
             "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--rollout-shuffle",
             "--rm-type", algorithm["reward_model"], "--advantage-estimator", algorithm["advantage_estimator"],
             "--num-rollout", str(wl["rollouts"]), "--rollout-batch-size", str(wl["rollout_batch_size"]),
             "--n-samples-per-prompt", str(wl["samples_per_prompt"]), "--rollout-max-response-len", str(wl["max_response_len"])]
    if launcher.sampling_from_arm:
        argv += ["--rollout-temperature", _fmt(float(wl["temperature"])), "--rollout-top-p", _fmt(float(wl["top_p"]))]
    else:
        argv += ["--rollout-temperature", "1.0", "--rollout-top-p", "1.0"]
    if launcher.passes_top_k:
        argv += ["--rollout-top-k", str(wl["top_k"])]
    opt = wl["optimizer"]
    if opt is not None and launcher.passes_optimizer:
        argv += ["--optimizer", opt["name"], "--lr", repr(float(opt["lr"])), "--lr-decay-style", "constant",
                 "--weight-decay", _fmt(float(opt["weight_decay"])), "--adam-beta1", _fmt(float(opt["adam_beta1"])),
                 "--adam-beta2", _fmt(float(opt["adam_beta2"])), "--entropy-coef", "0"]
    argv += ["--global-batch-size", str(wl["global_batch_size"]), "--balance-data",
             "--tensor-model-parallel-size", str(tp)]
    if launcher.passes_vocab_divisor:
        argv += ["--make-vocab-size-divisible-by", str(128 * m["canonical_tp"] // tp)]
    argv += ["--context-parallel-size", str(cp), "--cp-comm-type", "p2p",
             "--pipeline-model-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
             "--use-dynamic-batch-size", "--max-tokens-per-gpu", str(wl["max_tokens_per_gpu"]),
             "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
             "--custom-megatron-init-path", launcher.megatron_init,
             "--save-debug-train-data", f"{run_dir}/train-data/{{rollout_id}}.rank{{rank}}.pt",
             "--update-weight-mode", "full", "--update-weight-transport", "disk",
             "--update-weight-disk-dir", f"{run_dir}/weight-updates"]
    if ops["logp"][0] == "R":  # training-side logp strict: the provider; production must pass none
        argv += ["--linear-logp-provider", launcher.logp_provider, "--linear-logp-provider-mode", "strict"]
    argv += ["--no-save-optim", "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
             "--transformer-impl", "transformer_engine", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion",
             "--no-rope-fusion", "--attention-softmax-in-fp32",
             "--attention-backend", arm["attention_backend"],
             "--router-policy", wl["router_policy"],
             "--rollout-num-gpus-per-engine", str(rtp * rcp),
             "--vllm-prefill-context-parallel-size", str(rcp),
             "--vllm-gpu-memory-utilization", _fmt(float(layout["vllm_gpu_memory_utilization"]))]
    if launcher.passes_logprobs_mode:
        argv += ["--vllm-logprobs-mode", "processed_logprobs"]
    argv += ["--get-mismatch-metrics", "--custom-tis-function-path", launcher.tis_hook]
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


def runtime_env_vars(arm: dict, layout: dict, run_id: str, run_dir: str, *, capture_sizes: list[int],
                     launcher: LauncherRevision = LAUNCHERS[CURRENT]) -> dict[str, str]:
    """The job's environment (reference §2.3) with in-image paths; no caller PYTHONPATH leaks in."""
    m, wl, ops = arm["model"], arm["workload"], arm["operators"]
    strict = all(case == "R/R" for case in ops.values())
    rlk, vime, meg = L.source_dir("rl-kernel"), L.source_dir("vime"), L.source_dir("megatron-lm")
    pythonpath = ([f"{rlk}/examples"] if launcher.pythonpath_examples else []) + [rlk, vime, meg]
    env = {
        "RL_KERNEL_ROOT": rlk,
        "RL_KERNEL_REAL_PYTHON": L.PYTHON,
        "PYTHONPATH": ":".join(pythonpath),
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
    env.update(launcher.env_values)
    return {k: v for k, v in env.items() if k not in launcher.env_absent}
