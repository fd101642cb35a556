"""Replicates: one sealed run per seed of one arm, and the group document that ties them together.

Each seed gets the arm with ``workload.seed`` and ``workload.rollout_seed`` set to it (nothing else
changes, so kit compare calls two replicates controlled but for the seed) and its own run id
``<group>-s<seed>``. The group is written to ``<workspace>/groups/<group>.json``
(``rlk-kit/replicate-group/v1``) as each run ends, so an interrupted group still lists what ran.
Example::

    seeds = parse_seeds("1,2,3")
    group = run_replicates(request, seeds, execute)     # kit run --arm smoke --seeds 1,2,3
    [r["run_dir"] for r in group["runs"]]
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
