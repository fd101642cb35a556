"""The GRPO workload's configuration, read from an ``rlk-kit/arm`` document of engine ``gpu``.

One process, one device: training and rollout both run at TP1/CP1 (the strict operators' canonical
8 virtual shards still fix every reduction order), so the arm's topology must say so. Example::

    config = GrpoConfig.from_arm(json.load(open("manifests/gpu-consistency.json")))
    config.impls("rollout")      # {"attention": "R", "ffn": "R", "logp": "R"}
    config.production            # "fused" (the arm's production field; absent: "eager")
    config.decode_graph_sizes    # () for graph mode NONE; the capture sizes for FULL_DECODE_ONLY
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rlk_kernels.model import ModelConfig

MODULES = ("attention", "ffn", "logp")
GRAPH_MODES = ("NONE", "FULL_DECODE_ONLY")
CASES = ("P/P", "R/R", "P/R", "R/P")


def _get(document: dict, path: str):
    node = document
    for part in path.strip("/").split("/"):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"{path}: missing in the arm document")
        node = node[part]
    return node


@dataclass(frozen=True)
class GrpoConfig:
    arm_name: str
    cases: tuple                 # (("attention", "R/R"), ("ffn", "R/R"), ("logp", "R/R"))
    model: ModelConfig
    prompts_per_step: int        # rollout_batch_size
    group_size: int              # samples_per_prompt (>= 4)
    response_len: int            # every response is exactly this long: the task has no end token
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
    kl_coef: float
    micro_batch: int             # sequences per training micro-batch (max_tokens_per_gpu / sequence length)
    device: str = "cuda"
    production: str = "eager"    # which production formula the P modules run: "fused" or "eager" (rlk_kernels.grpo.fused)
    decode_graph_sizes: tuple = ()   # rollout batch sizes whose decode steps run as CUDA graphs (/graph, FULL_DECODE_ONLY)

    @classmethod
    def from_arm(cls, document: dict, device: str | None = None) -> "GrpoConfig":
        """Read an arm document; ValueError names the JSON pointer of a field this engine cannot run."""
        from rlk_kernels.grpo.fused import PRODUCTIONS
        production = document.get("production", "eager")
        if production not in PRODUCTIONS:
            raise ValueError(f"/production: {production!r}; accepted: {', '.join(PRODUCTIONS)} (absent: eager)")
        cases = []
        for module in MODULES:
            case = _get(document, f"/operators/{module}")
            if case not in CASES:
                raise ValueError(f"/operators/{module}: {case!r}; accepted: {', '.join(CASES)}")
            cases.append((module, case))
        try:
            model = ModelConfig.from_arm_model(_get(document, "/model"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"/model: {exc}") from None
        topology = _get(document, "/topology")
        for field in ("tp", "cp", "rollout_tp", "rollout_cp", "gpus"):
            if int(topology.get(field, 1)) != 1:
                raise ValueError(f"/topology/{field}: {topology.get(field)}; the gpu engine runs on one device (1)")
        graph = document.get("graph") or {"mode": "NONE", "capture_sizes": []}
        if graph.get("mode") not in GRAPH_MODES:
            raise ValueError(f"/graph/mode: {graph.get('mode')!r}; the gpu engine captures whole decode steps or "
                             f"nothing: {' or '.join(GRAPH_MODES)}")
        optimizer = _get(document, "/workload/optimizer") or {}
        wl = _get(document, "/workload")
        kl = _get(document, "/workload/kl")
        response_len = int(wl["max_response_len"])
        from rlk_kernels.grpo.task import PROMPT_LEN
        config = cls(
            arm_name=str(document.get("name", "gpu")), cases=tuple(cases), model=model,
            prompts_per_step=int(wl["rollout_batch_size"]), group_size=int(wl["samples_per_prompt"]),
            response_len=response_len, seed=int(wl["seed"]), rollout_seed=int(wl["rollout_seed"]),
            rollouts=int(wl["rollouts"]), temperature=float(wl["temperature"]), top_p=float(wl["top_p"]),
            top_k=int(wl["top_k"]), lr=float(optimizer.get("lr", 1e-4)),
            weight_decay=float(optimizer.get("weight_decay", 0.0)),
            adam_beta1=float(optimizer.get("adam_beta1", 0.9)), adam_beta2=float(optimizer.get("adam_beta2", 0.98)),
            kl_coef=float(kl["coef"]) if kl.get("use_kl_loss") else 0.0,
            micro_batch=max(1, int(wl["max_tokens_per_gpu"]) // (PROMPT_LEN + response_len)),
            device=device or ("cuda" if _cuda() else "cpu"), production=production,
            decode_graph_sizes=tuple(int(n) for n in graph.get("capture_sizes", [])) if graph["mode"] != "NONE" else (),
        )
        return config.validated()

    def validated(self) -> "GrpoConfig":
        from rlk_kernels.grpo.task import PROMPT_LEN, TASK_VOCAB
        problems = []
        if self.group_size < 4:
            problems.append(f"/workload/samples_per_prompt: {self.group_size}; GRPO groups here have at least 4")
        if self.model.vocab < TASK_VOCAB:
            problems.append(f"/model/vocab: {self.model.vocab} is smaller than the task's {TASK_VOCAB} tokens")
        if PROMPT_LEN + self.response_len > self.model.max_positions:
            problems.append(f"/workload/max_response_len: {self.response_len} + the {PROMPT_LEN}-token prompt is over "
                            f"{self.model.max_positions} positions")
        if self.rollouts < 1 or self.response_len < 1:
            problems.append("/workload: rollouts and max_response_len must be >= 1")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def with_rollouts(self, rollouts: int) -> "GrpoConfig":
        return replace(self, rollouts=rollouts).validated()

    @property
    def batch(self) -> int:
        return self.prompts_per_step * self.group_size

    def impls(self, side: str) -> dict:
        """{"attention": "R", ...} for side "train" (letter before the slash) or "rollout" (after)."""
        index = 0 if side == "train" else 1
        return {module: case.split("/")[index] for module, case in self.cases}

    @property
    def logp_case(self) -> str:
        return dict(self.cases)["logp"]


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()
