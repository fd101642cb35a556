"""Arm: one experiment configuration — stack, operator cases, reuse, backend, graphs, topology, workload.

Arms name their stack by name and sha256, so two arms share software iff they name the same hash.
The module matrix M000..M111 is generated from one definition (an ``arm-matrix`` document).
Example::

    arm = catalog.arm("consistency")
    arm.all_strict        # True: every module R/R
    arm.stack.sha256 == arm.document["stack"]["sha256"]
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from kit.model.engine_traits import TRAITS, traits
from kit.model.stack import Stack
from kit.model.topology import Topology, accepted_capture_ceilings, evidence_level, topology_problems

MODULES = ("attention", "ffn", "logp")


@dataclass(frozen=True)
class Arm:
    name: str
    document: dict
    stack: Stack
    source_file: str = ""

    @property
    def engine(self) -> str:
        return self.document["engine"]

    @property
    def operators(self) -> dict[str, str]:
        return dict(self.document["operators"])

    @property
    def production(self) -> str:
        """Which production implementation the P modules run (arm/v5 ``production``; absent: "eager")."""
        return production_of(self.document)

    @property
    def all_strict(self) -> bool:
        return all(case == "R/R" for case in self.document["operators"].values())

    @property
    def topology(self) -> Topology:
        return Topology.from_document(self.document["topology"])

    @property
    def workload(self) -> dict:
        return self.document["workload"]

    @property
    def platform(self) -> str:
        """The image platform an arm runs on by default."""
        return traits(self.engine).platform


PRODUCTIONS = ("fused", "eager")


def production_of(doc: dict) -> str:
    """An arm document's ``production`` (arm/v5): "fused" or "eager"; an arm without it means "eager".

    >>> production_of({"engine": "gpu"}), production_of({"engine": "gpu", "production": "fused"})
    ('eager', 'fused')
    """
    return doc.get("production", "eager")


def mode_operators(mode: str) -> dict[str, str]:
    """``--mode native`` is all production, ``--mode consistency`` all strict."""
    case = {"native": "P/P", "consistency": "R/R"}[mode]
    return {m: case for m in MODULES}


def with_overrides(doc: dict, *, operators: dict | None = None, topology: dict | None = None,
                   rollouts: int | None = None, name: str | None = None) -> dict:
    """A derived arm document; the comparison declaration is dropped because the arm is no longer the declared one."""
    out = copy.deepcopy(doc)
    if operators:
        out["operators"] = dict(operators)
    if topology:
        out["topology"] = dict(topology)
    if rollouts is not None:
        out["workload"]["rollouts"] = rollouts
    if name:
        out["name"] = name
    if operators or topology or name:
        out.pop("comparison", None)
    return out


def algorithm_of(doc: dict) -> dict:
    """The arm's ``workload.algorithm``, or the default an older arm without it means."""
    return doc["workload"].get("algorithm") or {"advantage_estimator": "grpo", "reward_model": traits(doc["engine"]).reward_model}


def arm_rule_problems(doc: dict, stack: Stack | None) -> list[tuple[str, str]]:
    """Semantic rules over a schema-valid arm document (reference §1.5, §1.6, §2.3)."""
    out: list[tuple[str, str]] = []
    if stack is not None:
        if stack.abstract:
            out.append(("/stack/name", f"stack {stack.name!r} is abstract (a shared layer); reference a concrete stack"))
        if doc["stack"]["sha256"] != stack.sha256:
            out.append(("/stack/sha256", f"is {doc['stack']['sha256']}, but stack {stack.name!r} resolves to {stack.sha256}"))
        platform = traits(doc["engine"]).platform
        if stack.platform(platform) is None:
            out.append(("/stack/name", f"stack {stack.name!r} has no {platform} platform, which a {doc['engine']} arm runs on"))
    model = doc["model"]
    if model["padded_vocab"] < model["vocab"]:
        out.append(("/model/padded_vocab", f"{model['padded_vocab']} is smaller than the vocabulary {model['vocab']}"))
    if model["padded_vocab"] % model["canonical_tp"]:
        out.append(("/model/padded_vocab", f"must be a multiple of canonical_tp {model['canonical_tp']}"))
    if model["heads"] % model["query_groups"]:
        out.append(("/model/query_groups", f"{model['query_groups']} must divide the {model['heads']} heads"))
    topo = Topology.from_document(doc["topology"])
    vllm = stack.packages.get("vllm", "(none in the stack)") if stack is not None else "(unknown)"
    out += topology_problems(topo, model, vllm_version=vllm)
    wl = doc["workload"]
    if wl["global_batch_size"] != wl["rollout_batch_size"] * wl["samples_per_prompt"]:
        out.append(("/workload/global_batch_size",
                    f"{wl['global_batch_size']} must equal rollout_batch_size × samples_per_prompt = "
                    f"{wl['rollout_batch_size'] * wl['samples_per_prompt']} (one optimizer step per rollout)"))
    # each engine implements one reward: VIME's deepscaler math reward, the smoke workload's copy reward
    reward = traits(doc["engine"]).reward_model
    if "algorithm" in wl and wl["algorithm"]["reward_model"] != reward:
        out.append(("/workload/algorithm/reward_model", f"{wl['algorithm']['reward_model']!r}: a {doc['engine']} arm "
                                                        f"is rewarded by {reward!r}"))
    kl = wl["kl"]
    if kl["use_kl_loss"] != (kl["coef"] > 0):
        out.append(("/workload/kl", f"use_kl_loss is {str(kl['use_kl_loss']).lower()} but coef is {kl['coef']}: "
                                    "the KL loss is on if and only if its coefficient is > 0"))
    if wl["top_k"] == 0 or wl["top_k"] > model["vocab"]:
        out.append(("/workload/top_k", f"must be -1 or 1..{model['vocab']}"))
    graph = doc["graph"]
    if graph["mode"] == "NONE":
        if graph["capture_sizes"]:
            out.append(("/graph/capture_sizes", "must be empty when graph mode is NONE"))
    elif not any(p[0].startswith("/topology") for p in out):
        sizes = graph["capture_sizes"]
        ceilings = sorted(accepted_capture_ceilings(topo, wl))
        if sizes not in ([list(range(1, k + 1)) for k in ceilings]):
            shown = " or ".join(f"[1..{k}]" for k in ceilings)
            out.append(("/graph/capture_sizes", f"{sizes} is not consistent with the engines; expected {shown}"))
    if production_of(doc) != "eager" and not traits(doc["engine"]).production_choice:
        choosers = ", ".join(t.name for t in TRAITS.values() if t.production_choice)
        out.append(("/production", f"{production_of(doc)!r}: only the {choosers} engine has a fused production path; "
                                   f"a {doc['engine']} arm runs its framework's own (omit the field, or \"eager\")"))
    fixed_level = traits(doc["engine"]).fixed_evidence_level
    expected_level = fixed_level or evidence_level(topo)
    if not any(p[0].startswith("/topology") for p in out) and doc["evidence_level"] != expected_level:
        out.append(("/evidence_level", f"is {doc['evidence_level']!r}, the topology gives {expected_level!r} "
                                       "(reference only for TP4/CP2 with rollout TP4/CP1)"))
    if fixed_level and doc["evidence_level"] != fixed_level:
        out.append(("/evidence_level", f"a {doc['engine']} arm's evidence level is {fixed_level!r}"))
    return out


def matrix_arm_documents(matrix: dict, base_docs: dict[str, dict]) -> list[dict]:
    """Expand an arm-matrix document: for each base arm, 8 arms named prefix+M<a><f><l>."""
    out = []
    for base in matrix["bases"]:
        base_doc = base_docs.get(base["arm"])
        if base_doc is None:
            continue
        for bits in range(8):
            a, f, l = (bits >> 2) & 1, (bits >> 1) & 1, bits & 1
            name = f"{base['prefix']}M{a}{f}{l}"
            ops = {"attention": matrix["cases"][str(a)], "ffn": matrix["cases"][str(f)], "logp": matrix["cases"][str(l)]}
            doc = with_overrides(base_doc, operators=ops, name=name)
            doc["description"] = f"module matrix {name}: attention {ops['attention']}, ffn {ops['ffn']}, logp {ops['logp']} on {base['arm']}"
            doc["use_rollout_logprobs"] = False  # attribution needs recomputed logprobs
            doc["comparison"] = {"with": f"{base['prefix']}M000", "factors": ["operators"]}
            out.append(doc)
    # keep pipeline order M000, M100, M010, M001, M110, M101, M011, M111 (reference §1.3)
    order = ["M000", "M100", "M010", "M001", "M110", "M101", "M011", "M111"]
    return sorted(out, key=lambda d: (d["name"][: -4], order.index(d["name"][-4:])))


def merge_arm(parent: dict, child: dict) -> dict:
    """The child's fields over the parent's: objects merge key by key, lists and values are replaced.

    >>> merge_arm({"operators": {"attention": "P/P", "ffn": "P/P"}, "seed": 1}, {"operators": {"ffn": "R/R"}})
    {'operators': {'attention': 'P/P', 'ffn': 'R/R'}, 'seed': 1}
    """
    out = copy.deepcopy(parent)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "comparison":
            out[key] = merge_arm(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_arm_document(doc: dict, lookup, _seen: tuple = ()) -> dict:
    """Follow ``extends`` through ``lookup(name) -> raw arm document``; ValueError names a loop or an unknown arm.

    A declared comparison is the arm's own: it is never inherited (consistency extends native, but
    native's comparison is with consistency).
    """
    if "extends" not in doc:
        return doc
    # Checked before the schema: a list or an object here would reach a dict look-up as an unhashable key.
    if not isinstance(doc["extends"], str) or not doc["extends"]:
        raise ValueError(f"/extends: {type(doc['extends']).__name__} {doc['extends']!r:.60} is not accepted; "
                         "expected the name of one arm (a string)")
    if not isinstance(doc.get("name"), str):
        raise ValueError("/name: an arm that extends another needs its own name (a string)")
    if doc["name"] in _seen:
        raise ValueError(f"/extends: arm inheritance loop through {doc['name']!r}")
    parent = lookup(doc["extends"])
    if parent is None:
        raise ValueError(f"/extends: extends unknown arm {doc['extends']!r}")
    base = resolve_arm_document(parent, lookup, _seen + (doc["name"],))
    base = {k: v for k, v in base.items() if k != "comparison"}
    return merge_arm(base, {k: v for k, v in doc.items() if k != "extends"})
