"""Topology rules of the experiment (reference §1.5, §2.3) as pure functions.

Training runs TP×CP over all GPUs; rollout engines run TP×CP each; actor and rollout are colocated.
Example::

    derive_layout(Topology(gpus=8, tp=4, cp=2, rollout_tp=4, rollout_cp=1), model, workload)
    # -> engines 2, 4 GPUs per engine, offload_train False, evidence "reference", memory utilization 0.4
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kit.model.engine_traits import traits

REFERENCE_LAYOUT = (4, 2, 4, 1)   # (tp, cp, rollout_tp, rollout_cp) of the published runs
ROLLOUT_CP_REFUSAL = (
    "rollout CP > 1 is refused: the stack's vLLM {vllm} has no prefill-context-parallel support for "
    "RL-Kernel attention (vLLM asserts 'PCP requires attention impls' support' at run time); use rollout CP 1"
)


@dataclass(frozen=True)
class Topology:
    gpus: int
    tp: int
    cp: int
    rollout_tp: int
    rollout_cp: int

    @classmethod
    def from_document(cls, doc: dict) -> "Topology":
        return cls(doc["gpus"], doc["tp"], doc["cp"], doc["rollout_tp"], doc["rollout_cp"])

    def to_document(self) -> dict:
        return {"gpus": self.gpus, "tp": self.tp, "cp": self.cp, "rollout_tp": self.rollout_tp, "rollout_cp": self.rollout_cp}


def accepted_tp_sizes(gpus: int, model: dict) -> list[int]:
    return [t for t in range(1, gpus + 1)
            if gpus % t == 0 and model["heads"] % t == 0 and model["query_groups"] % t == 0 and model["padded_vocab"] % t == 0]


def topology_problems(topo: Topology, model: dict, *, vllm_version: str = "unknown") -> list[tuple[str, str]]:
    """Every violated rule as (pointer under the arm, message naming what is accepted)."""
    out: list[tuple[str, str]] = []
    accepted = ", ".join(map(str, accepted_tp_sizes(topo.gpus, model)))
    for key in ("gpus", "tp", "cp", "rollout_tp", "rollout_cp"):
        if getattr(topo, key) <= 0:
            out.append((f"/topology/{key}", "must be > 0"))
    if out:
        return out
    if topo.tp * topo.cp != topo.gpus:
        out.append(("/topology/cp", f"TP×CP = {topo.tp}×{topo.cp} = {topo.tp * topo.cp} must equal the {topo.gpus} GPUs"))
    for what, count in (("attention heads", model["heads"]), ("query groups", model["query_groups"]),
                        ("padded vocabulary", model["padded_vocab"])):
        if count % topo.tp:
            out.append(("/topology/tp", f"TP {topo.tp} does not divide the {count} {what}; accepted TP: {accepted}"))
    if topo.gpus % (topo.rollout_tp * topo.rollout_cp):
        out.append(("/topology/rollout_tp",
                    f"rollout TP×CP = {topo.rollout_tp * topo.rollout_cp} must divide the {topo.gpus} GPUs"))
    if model["heads"] % topo.rollout_tp or model["query_groups"] % topo.rollout_tp:
        out.append(("/topology/rollout_tp", f"rollout TP {topo.rollout_tp} must divide {model['heads']} heads and {model['query_groups']} query groups"))
    if topo.rollout_cp > 1:
        out.append(("/topology/rollout_cp", ROLLOUT_CP_REFUSAL.format(vllm=vllm_version)))
    return out


def rollout_engines(topo: Topology) -> int:
    return topo.gpus // (topo.rollout_tp * topo.rollout_cp)


def max_engine_decode_batch(topo: Topology, rollout_batch_size: int, samples_per_prompt: int, router_policy: str) -> int:
    """Per-engine decode concurrency: round-robin splits the samples over engines (reference §2.3)."""
    total = rollout_batch_size * samples_per_prompt
    engines = rollout_engines(topo)
    if router_policy == "round_robin" and engines > 1:
        return math.ceil(total / engines)
    return total


def accepted_capture_ceilings(topo: Topology, workload: dict) -> set[int]:
    """Capture sizes 1..k are consistent with the engines for k = per-engine ceiling or full concurrency
    (the historical launcher of the published runs captured the full product)."""
    total = workload["rollout_batch_size"] * workload["samples_per_prompt"]
    return {max_engine_decode_batch(topo, workload["rollout_batch_size"], workload["samples_per_prompt"],
                                    workload["router_policy"]), total}


def evidence_level(topo: Topology) -> str:
    return "reference" if (topo.tp, topo.cp, topo.rollout_tp, topo.rollout_cp) == REFERENCE_LAYOUT else "experimental"


def offload_train(topo: Topology) -> bool:
    return topo.tp == 1 and topo.rollout_tp == 1


def default_memory_utilization(topo: Topology) -> float:
    return 0.2 if topo.tp == 1 and topo.rollout_tp != 1 else 0.4


def derive_layout(topo: Topology, workload: dict, engine: str) -> dict:
    """What the plan shows for a topology: engines, GPUs per engine, offload, memory utilization."""
    explicit = workload.get("vllm_gpu_memory_utilization")
    return {
        **topo.to_document(),
        "pp": 1,
        "actor_gpus": topo.gpus,
        "rollout_gpus": topo.gpus,
        "colocate": True,
        "offload_train": offload_train(topo),
        "offload_rollout": True,
        "rollout_gpus_per_engine": topo.rollout_tp * topo.rollout_cp,
        "rollout_engines": rollout_engines(topo),
        "evidence_level": traits(engine).fixed_evidence_level or evidence_level(topo),
        "vllm_gpu_memory_utilization": explicit if explicit is not None else default_memory_utilization(topo),
        "offload_rule": "train offloaded only when training TP and rollout TP are both 1",
    }
