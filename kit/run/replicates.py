"""Replicates: one sealed run per seed of one arm, and the group document that ties them together.

Each seed gets the arm with ``workload.seed`` and ``workload.rollout_seed`` set to it (nothing else
changes, so kit compare calls two replicates controlled but for the seed) and its own run id
``<group>-s<seed>``. The group is written to ``<workspace>/groups/<group>.json``
(``rlk-kit/replicate-group/v1``) as each run ends, so an interrupted group still lists what ran.
Example::

    seeds = parse_seeds("1,2,3")
    group = run_replicates(request, seeds, execute)     # kit run --arm smoke --seeds 1,2,3
    [r["run_dir"] for r in group["runs"]]

``kit suite module --seeds`` runs one whole module suite per seed (suite ids ``<suite-id>-s<seed>``)
and keeps one group per arm (``<suite-id>-<arm lower>``) over the seeds: ``plan_seeded_suites`` and
``run_seeded_suites``.
"""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime, timezone
from pathlib import Path

from kit.model.arm import Arm
from kit.model.documents import replace_document, write_new_document
from kit.model.errors import BadInput
from kit.model.documents import read_json_file

SCHEMA = "rlk-kit/replicate-group/v1"
GROUPS = "groups"


def parse_seeds(text: str) -> list[int]:
    """``"1,2,3"`` -> [1, 2, 3]; BadInput names what is wrong."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BadInput(f"--seeds {text!r}: expected comma-separated non-negative integers, e.g. 1,2,3") from None
    if len(seeds) < 1 or any(s < 0 for s in seeds):
        raise BadInput(f"--seeds {text!r}: expected comma-separated non-negative integers, e.g. 1,2,3")
    if len(set(seeds)) != len(seeds):
        raise BadInput(f"--seeds {text!r}: a seed is given twice; each replicate needs its own")
    return seeds


def seeded(arm: Arm, seed: int) -> Arm:
    """The arm with its workload and rollout seeds set to ``seed``; same name, so replicates group."""
    doc = copy.deepcopy(arm.document)
    doc["workload"]["seed"] = seed
    doc["workload"]["rollout_seed"] = seed
    return Arm(arm.name, doc, arm.stack, arm.source_file)


def group_id(arm: Arm, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{arm.name.lower()}-g{now.strftime('%Y%m%dT%H%M%S%fZ')}"


def run_replicates(request, seeds: list[int], execute, *, group: str | None = None, progress=None,
                   log=lambda s: None) -> dict:
    """Run ``request`` once per seed through ``execute`` (kit.run.execute.execute); returns the group document."""
    if request.run_id is not None:
        raise BadInput("--run-id names one run; with --seeds each replicate is named <group>-s<seed>")
    if request.detach or request.dry_run:
        raise BadInput("--seeds runs each replicate to its seal; drop --detach / --dry-run")
    group = group or group_id(request.arm)
    workspace = request.workspace.resolve()
    path = workspace / GROUPS / f"{group}.json"
    doc = {"schema": SCHEMA, "group": group, "arm": request.arm.name, "seeds": list(seeds), "runs": []}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_new_document(path, doc, expected=SCHEMA)      # reserves the group id: an existing one is refused
    for seed in seeds:
        log(f"replicate seed {seed} ({len(doc['runs']) + 1}/{len(seeds)}) of group {group}")
        one = dataclasses.replace(request, arm=seeded(request.arm, seed), run_id=f"{group}-s{seed}")
        outcome = execute(one, progress=progress, log=log)
        doc["runs"].append({"seed": seed, "run_id": outcome.run_id,
                            "run_dir": str(outcome.run_dir) if outcome.run_dir else None,
                            "status": outcome.status, "sealed": outcome.sealed, "exit_code": outcome.exit_code})
        replace_document(path, doc, expected=SCHEMA)      # the group's own ledger, one run longer
        if outcome.status == "interrupted":
            break
    return doc


def group_runs(path: Path) -> tuple[list[Path], list[str]]:
    """The sealed run dirs a group document lists, in seed order, and a note per run left out."""

    doc = read_json_file(path)
    runs = [r for r in doc.get("runs", []) if r.get("run_dir")]
    skipped = [f"{path}: seed {r['seed']} ({r['run_id']}) left out: {r['status']}, not sealed"
               for r in doc.get("runs", []) if not r.get("sealed")]
    return [Path(r["run_dir"]) for r in runs if r.get("sealed")], skipped


# --- kit suite --seeds: one module suite per seed, one group per arm ------------------------------------

def plan_seeded_suites(request, seeds: list[int], plan_suite) -> list:
    """One suite plan per seed, all checked before anything runs: suite id ``<suite-id>-s<seed>``, every
    arm seeded (``seeded``); ``plan_suite`` is kit.run.suite.plan_module_suite. A group of the same
    name (``<suite-id>-<arm lower>``) already in the workspace is refused too."""
    plans = []
    for seed in seeds:
        plan = plan_suite(dataclasses.replace(request, suite_id=f"{request.suite_id}-s{seed}"))
        specs = tuple(dataclasses.replace(s, arm=seeded(s.arm, seed)) for s in plan.specs)
        plans.append(dataclasses.replace(plan, specs=specs))
    for spec in plans[0].specs:
        path = plans[0].workspace / GROUPS / f"{suite_group_id(request.suite_id, spec.name)}.json"
        if path.exists():
            raise BadInput(f"--suite-id {request.suite_id}: group {path} already exists; pick a new suite id")
    return plans


def suite_group_id(suite_id: str, arm_name: str) -> str:
    """``suite_group_id("t1", "smoke-M100") == "t1-smoke-m100"``: one arm's runs over the seeds."""
    return f"{suite_id}-{arm_name.lower()}"


def run_seeded_suites(suite_id: str, plans: list, seeds: list[int], run_suite, **kwargs) -> tuple[list[dict], int]:
    """Run the plans seed by seed through ``run_suite`` (kit.run.suite.run_module_suite); after each, add
    every arm's run to its group document. Returns the suite summaries and the exit code (130 when a
    suite was interrupted: the next seeds do not run; else 1 when any suite failed; else 0)."""
    workspace = plans[0].workspace
    (workspace / GROUPS).mkdir(parents=True, exist_ok=True)
    groups = {}
    for spec in plans[0].specs:
        doc = {"schema": SCHEMA, "group": suite_group_id(suite_id, spec.name), "arm": spec.name,
               "seeds": list(seeds), "runs": []}
        write_new_document(workspace / GROUPS / f"{doc['group']}.json", doc, expected=SCHEMA)
        groups[spec.name] = doc
    summaries, code = [], 0
    for seed, plan in zip(seeds, plans):
        summary, exit_code = run_suite(plan, **kwargs)
        summaries.append(summary)
        for entry in summary["arms"]:
            if entry["verdict"] == "not_run":
                continue
            doc = groups[entry["arm"]]
            doc["runs"].append({"seed": seed, "run_id": entry["run_id"], "run_dir": entry["run_dir"],
                                "status": entry["run_status"] or "failed", "sealed": entry["sealed"],
                                "exit_code": {"passed": 0, "interrupted": 130}.get(entry["verdict"], 1)})
            replace_document(workspace / GROUPS / f"{doc['group']}.json", doc, expected=SCHEMA)
        if summary["interrupted"]:
            return summaries, 130
        code = code or (1 if exit_code else 0)
    return summaries, code
