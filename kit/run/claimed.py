"""``kit run --claim SEALED``: the runs a sealed claim declares, each bound to it.

Each declared run (arm x seed) runs under its declared run id, with the claim's rollouts and the seed
as workload and rollout seed; its manifest names the claim (``claim``: name, sha256, role, seed), and
the seal covers the manifest. A declared run whose id is already used in the workspace is not made
again (a failed one stays failed: the claim shows it as failed, never replaced). Example::

    outcomes = run_claim(claim, request, execute, select_arm)    # kit run --claim c.sealed.json
"""

from __future__ import annotations

import dataclasses

from kit.evidence import bundle as E
from kit.evidence.claims import Claim, binding_record, seed_free_arm_sha256
from kit.model.engine_traits import traits
from kit.model.errors import CheckFailed
from kit.run.plan import TopologyOverrides, resolve_plan
from kit.run.replicates import seeded


def resolved_arm(arm, rollouts: int) -> tuple[str, str]:
    """``(name, seed-free sha256)`` of the arm document a run of ``arm`` with ``rollouts`` records."""
    plan = resolve_plan(arm, TopologyOverrides(), run_id="claim", rollouts=rollouts, workspace="/claim")
    return plan["arm"]["name"], seed_free_arm_sha256(plan["arm"])


def claim_arms(claim: Claim, select_arm) -> dict:
    """role -> Arm, each held to the claim's name and sha256 (CheckFailed when the catalog's arm changed)."""
    arms = {}
    for role, entry in claim.arms.items():
        arm = select_arm(entry["arm"], entry.get("mode"))
        name, sha = resolved_arm(arm, claim.rollouts)
        if (name, sha) != (entry["name"], entry["sha256"]):
            raise CheckFailed(f"--claim {claim.path}: the {role} arm {entry['arm']} now resolves to {name} "
                              f"({sha[:12]}…), the claim sealed {entry['name']} ({entry['sha256'][:12]}…): the arm "
                              "changed since the claim was sealed")
        arms[role] = arm
    return arms


def run_claim(claim: Claim, request, execute, select_arm, *, progress=None, log=lambda s: None) -> list[dict]:
    """Run every declared run not yet in the workspace; one entry per declared run."""
    arms = claim_arms(claim, select_arm)
    workspace = request.workspace.resolve()
    out = []
    for declared in claim.runs:
        used = E.run_id_in_use(workspace, declared.run_id) if workspace.exists() else None
        if used:
            log(f"claim {claim.name}: run {declared.run_id} already made ({used}); not made again")
            out.append({"run_id": declared.run_id, "role": declared.role, "seed": declared.seed, "status": "exists",
                        "run_dir": used, "exit_code": 0})
            continue
        log(f"claim {claim.name}: run {declared.run_id} ({declared.role} {arms[declared.role].name}, seed {declared.seed})")
        arm = arms[declared.role]
        runtime = request.runtime or ("local" if traits(arm.engine).runs_on_host else "docker")
        one = dataclasses.replace(request, arm=seeded(arm, declared.seed), run_id=declared.run_id, runtime=runtime,
                                  rollouts=claim.rollouts, claim=binding_record(claim, declared.run_id))
        outcome = execute(one, progress=progress, log=log)
        out.append({"run_id": outcome.run_id, "role": declared.role, "seed": declared.seed, "status": outcome.status,
                    "run_dir": str(outcome.run_dir) if outcome.run_dir else None, "exit_code": outcome.exit_code})
        if outcome.status == "interrupted":
            break
    return out
