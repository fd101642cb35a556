"""Plan: an arm resolved into what will run — topology, commands, Ray job, the image it needs.

Pure: no engine, no cluster, no files. ``kit plan`` prints it; ``kit run`` executes it.
Example::

    plan = resolve_plan(catalog.arm("consistency"), TopologyOverrides(tp=2, cp=4))
    plan["topology"]["vllm_gpu_memory_utilization"]   # 0.4
"""

from __future__ import annotations

import datetime as _dt
import re
import shlex
from dataclasses import dataclass

from kit.build import layout as L
from kit.model.arm import Arm, with_overrides
from kit.model.errors import BadInput
from kit.model.topology import Topology, accepted_tp_sizes, derive_layout, max_engine_decode_batch, topology_problems
from kit.engines import get_engine
from kit.engines.base import submission_id

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
FLAG_OF = {"tp": "--tp-size", "cp": "--cp-size", "rollout_tp": "--rollout-tp-size", "rollout_cp": "--rollout-cp-size",
           "gpus": "--tp-size"}


@dataclass(frozen=True)
class TopologyOverrides:
    tp: int | None = None
    cp: int | None = None
    rollout_tp: int | None = None
    rollout_cp: int | None = None

    def any(self) -> bool:
        return any(v is not None for v in (self.tp, self.cp, self.rollout_tp, self.rollout_cp))


def default_run_id(arm: Arm, now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    wl = arm.workload
    return f"{arm.name.lower()}-n{wl['rollouts']}-s{wl['seed']}-{now.strftime('%Y%m%dT%H%M%S%fZ')}"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id) or len(run_id) > 128:
        raise BadInput(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit (at most 128)")
    return run_id


def apply_topology_overrides(arm: Arm, ov: TopologyOverrides) -> Topology:
    """The arm's topology with flags applied; omitting --cp-size derives it from the GPU count."""
    base = arm.topology
    for flag, value in (("--tp-size", ov.tp), ("--cp-size", ov.cp), ("--rollout-tp-size", ov.rollout_tp),
                        ("--rollout-cp-size", ov.rollout_cp)):
        if value is not None and value <= 0:
            raise BadInput(f"{flag} {value}: must be a positive integer")
    tp = ov.tp if ov.tp is not None else base.tp
    if ov.cp is not None:
        cp = ov.cp
    elif ov.tp is not None:
        if base.gpus % tp:
            accepted = ", ".join(map(str, accepted_tp_sizes(base.gpus, arm.document["model"])))
            raise BadInput(f"--tp-size {tp}: does not divide the {base.gpus} GPUs; accepted: {accepted}")
        cp = base.gpus // tp
    else:
        cp = base.cp
    topo = Topology(base.gpus, tp, cp,
                    ov.rollout_tp if ov.rollout_tp is not None else base.rollout_tp,
                    ov.rollout_cp if ov.rollout_cp is not None else base.rollout_cp)
    problems = topology_problems(topo, arm.document["model"], vllm_version=arm.stack.packages.get('vllm', '(none in the stack)'))
    if problems:
        pointer, message = problems[0]
        key = pointer.rsplit("/", 1)[-1]
        value = getattr(topo, key)
        raise BadInput(f"{FLAG_OF.get(key, key)} {value}: {message}")
    return topo


def planned_capture_sizes(arm: Arm, topo: Topology) -> list[int]:
    """The arm's capture sizes; recomputed for a new topology by the same rule the arm used, or the
    ones the engine's revision fixes (VIME's historical launcher captured 1..rollout_batch_size×samples)."""
    graph = arm.document["graph"]
    if graph["mode"] == "NONE":
        return []
    fixed = get_engine(arm.engine).fixed_capture_sizes(arm.document, arm.stack)
    if fixed is not None:
        if graph["capture_sizes"] != fixed.sizes:
            raise BadInput(f"{arm.source_file}: /graph/capture_sizes {graph['capture_sizes']} cannot be run by "
                           f"{fixed.fixed_by}, which captures 1..{max(fixed.sizes)} (reference §2.3)")
        return fixed.sizes
    wl = arm.workload
    if topo == arm.topology:
        return list(graph["capture_sizes"])
    full = wl["rollout_batch_size"] * wl["samples_per_prompt"]
    per_engine_before = max_engine_decode_batch(arm.topology, wl["rollout_batch_size"], wl["samples_per_prompt"], wl["router_policy"])
    used_full = max(graph["capture_sizes"]) == full and full != per_engine_before
    k = full if used_full else max_engine_decode_batch(topo, wl["rollout_batch_size"], wl["samples_per_prompt"], wl["router_policy"])
    return list(range(1, k + 1))


def resolve_plan(arm: Arm, ov: TopologyOverrides = TopologyOverrides(), *, run_id: str | None = None,
                 rollouts: int | None = None, workspace: str = L.WORKSPACE) -> dict:
    if rollouts is not None and rollouts <= 0:
        raise BadInput(f"--rollouts {rollouts}: must be a positive integer")
    topo = apply_topology_overrides(arm, ov)
    doc = with_overrides(arm.document, topology=topo.to_document() if topo != arm.topology else None, rollouts=rollouts)
    engine = get_engine(arm.engine)
    problems = engine.plan_problems(doc, arm.stack)
    if problems:
        pointer, message = problems[0]
        flag = {"tp": ov.tp, "cp": ov.cp}
        given = [f"{FLAG_OF[k]} {v}" for k, v in flag.items() if v is not None] if pointer.startswith("/topology") else []
        where = ", ".join(given) if given else f"{arm.source_file}: {pointer}"
        raise BadInput(f"{where}: {message}")
    capture = planned_capture_sizes(arm, topo)
    doc["graph"] = {"mode": doc["graph"]["mode"], "capture_sizes": capture}
    layout = derive_layout(topo, doc["workload"], arm.engine)
    engine.adjust_layout(layout, doc, arm.stack)
    doc["evidence_level"] = layout["evidence_level"]
    run_id = check_run_id(run_id) if run_id else default_run_id(arm)
    run_dir = f"{workspace}/runs/{run_id}"
    cmd = engine.command(doc, layout, arm.stack, run_id=run_id, run_dir=run_dir, capture_sizes=capture)
    argv, appended, env, working_dir = cmd.argv, cmd.entrypoint_appended, cmd.env, cmd.working_dir
    platform = arm.platform
    command = {"argv": argv, "shell": shlex.join(argv), "entrypoint_appended": appended,
               "note": "complete command: nothing is appended behind it; entrypoint_appended lists the flags the "
                       "seed's aligned_python_entrypoint.sh used to add"}
    metadata = {"arm": doc["name"], "run_id": run_id, "stack_sha256": arm.stack.sha256,
                "image_id": "<set at run time>", "manifest_sha256": "<set at run time>"}
    command.update(cmd.record or {})
    metadata.update(cmd.metadata)
    return {
        "schema": "rlk-kit/plan/v1",
        "arm": doc,
        "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256},
        "run_id": run_id,
        "run_dir": run_dir,
        "topology": layout,
        "capture_sizes": capture,
        "evidence_level": layout["evidence_level"],
        "command": command,
        "ray_job": {
            "submission_id": submission_id(run_id),
            "entrypoint": shlex.join(argv),
            "runtime_env": {"working_dir": working_dir, "env_vars": env},
            "metadata": metadata,
        },
        "image": {
            "platform": platform,
            "repository": f"rlk-kit/{arm.stack.name}",
            "base_image": arm.stack.base_image(platform),
            "required_labels": {f"{L.LABEL_PREFIX}.stack.sha256": arm.stack.sha256, f"{L.LABEL_PREFIX}.platform": platform},
            "build": f"kit build {platform} --arm {arm.name}",
        },
    }
