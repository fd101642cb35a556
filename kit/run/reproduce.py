"""``kit reproduce RUN_DIR``: run a sealed run again from its own manifest and compare the records bitwise.

The reproduction runs the manifest's arm document (its seeds, rollouts, operators and topology) on
the manifest's stack and runtime, as a new sealed run ``<run id>-r<UTC time>`` whose kit.log (a
sealed artifact) names the original run, its directory and its seal's root hash. Then every value
of every record of metrics.jsonl is compared with the original's, bit for bit (their JSON text),
except the wall-clock ones (perf/*: times and rates are never reproducible). The verdict is
"bitwise reproduced" or the first divergent step, record and field. Example::

    report = reproduce(Path("runs/smoke-s1"), workspace, execute)
    report["verdict"]
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from kit.model.arm import Arm
from kit.model.documents import read_json_file, write_new_document
from kit.model.errors import BadInput
from kit.model.stack import Stack

SCHEMA = "rlk-kit/reproduction/v1"
REPORTS = "reproductions"
UNREPRODUCIBLE_PREFIXES = ("perf/",)        # wall-clock times and the rates derived from them


def _records(path: Path) -> list[tuple[int, str, dict]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            out.append((rec["step"], rec["kind"], rec["payload"]))
    return out


def compare_records(original: Path, reproduced: Path) -> dict:
    """First difference between two metrics.jsonl files, comparing each value's JSON text."""
    a, b = _records(original), _records(reproduced)
    compared = 0
    for (sa, ka, pa), (sb, kb, pb) in zip(a, b):
        if (sa, ka) != (sb, kb):
            return {"reproduced": False, "compared_values": compared, "first_divergence": {
                "step": sa, "record": ka, "field": "(record order)", "original": f"{ka} {sa}", "reproduced": f"{kb} {sb}"}}
        for key in sorted(set(pa) | set(pb)):
            if key.startswith(UNREPRODUCIBLE_PREFIXES):
                continue
            va, vb = json.dumps(pa.get(key)), json.dumps(pb.get(key))
            if va != vb:
                return {"reproduced": False, "compared_values": compared, "first_divergence": {
                    "step": sa, "record": ka, "field": key, "original": va, "reproduced": vb}}
            compared += 1
    if len(a) != len(b):
        short = "reproduction" if len(b) < len(a) else "original"
        step, kind, _ = (a if len(a) > len(b) else b)[min(len(a), len(b))]
        return {"reproduced": False, "compared_values": compared, "first_divergence": {
            "step": step, "record": kind, "field": "(missing record)", "original": str(len(a)), "reproduced": str(len(b)),
            "note": f"the {short} has fewer records"}}
    return {"reproduced": True, "compared_values": compared, "first_divergence": None}


def reproduction_request(run_dir: Path, workspace: Path, request_type, **extra):
    """The RunRequest that re-runs ``run_dir`` as its manifest recorded it."""
    if not (run_dir / "seal.json").is_file():
        raise BadInput(f"{run_dir}: not a sealed run (no seal.json); only sealed evidence is reproduced")
    manifest = read_json_file(run_dir / "manifest.json")
    seal = read_json_file(run_dir / "seal.json")
    stack = Stack(manifest["stack"]["name"], manifest["stack"]["document"])
    if stack.sha256 != manifest["stack"]["sha256"]:
        raise BadInput(f"{run_dir}/manifest.json: the stack document does not hash to its recorded sha256")
    arm_doc = manifest["arm"]
    runtime = manifest["runtime"]
    kind = runtime.get("kind")
    if kind == "local":
        options = {"runtime": "local", "ray_head": bool(runtime.get("ray_head"))}
    elif kind == "docker":
        options = {"runtime": "docker", "image": (manifest.get("image") or {}).get("id")}
    else:
        raise BadInput(f"{run_dir}: runtime {kind!r}; kit reproduce re-runs local and docker runs")
    now = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    pointer = f"run {manifest['run_id']} ({run_dir.resolve()}, seal root sha256 {seal['root_sha256']})"
    return request_type(arm=Arm(arm_doc["name"], arm_doc, stack), workspace=workspace,
                        run_id=f"{manifest['run_id']}-r{now}", reproduces=pointer, **options, **extra), manifest, seal


def reproduce(run_dir: Path, workspace: Path, execute, request_type, *, progress=None, log=lambda s: None, **extra) -> dict:
    """Re-run, seal, compare; write and return the reproduction/v1 report."""
    request, manifest, seal = reproduction_request(run_dir, workspace, request_type, **extra)
    outcome = execute(request, progress=progress, log=log)
    report = {"schema": SCHEMA, "original": {"run_id": manifest["run_id"], "run_dir": str(run_dir.resolve()),
                                             "root_sha256": seal["root_sha256"]},
              "reproduction": {"run_id": outcome.run_id, "run_dir": str(outcome.run_dir) if outcome.run_dir else None,
                               "status": outcome.status, "sealed": outcome.sealed},
              "excluded_prefixes": list(UNREPRODUCIBLE_PREFIXES)}
    if outcome.sealed:
        cmp = compare_records(run_dir / "metrics.jsonl", Path(outcome.run_dir) / "metrics.jsonl")
    else:
        cmp = {"reproduced": False, "compared_values": 0, "first_divergence": None}
    report.update(cmp)
    d = cmp["first_divergence"]
    report["verdict"] = ("bitwise reproduced" if cmp["reproduced"] else
                         f"not reproduced: the reproduction ended {outcome.status}" if d is None else
                         f"diverged at step {d['step']} ({d['record']} record), field {d['field']}: "
                         f"{d['original']} then {d['reproduced']}")
    path = workspace.resolve() / REPORTS / f"{outcome.run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_new_document(path, report, expected=SCHEMA)
    return report
