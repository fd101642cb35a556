"""The run's documents before the job starts: the manifest, the job spec, the log's identity header, the
dry-run preview, and the kit checkout's state; plus metrics.jsonl from the job's records. Pure functions
over documents, except :func:`repository_state` (git). Example::

    header_line("r1", "smoke", "ab" * 32, None, "cd" * 32, "local")   # '# rlk-kit run r1 arm=smoke …'
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
import subprocess
from pathlib import Path

from kit import __version__
from kit.evidence import bundle as E
from kit.evidence.environment import record_host, record_job, secret_names
from kit.model.catalog import Catalog
from kit.model.documents import require_valid, schema_id, sha256_of_document
from kit.model.errors import BadInput
from kit.model.labels import LABEL_PREFIX
from kit.model.lock import lock_sha256
from kit.model.engine_traits import traits
from kit.run.inputs import input_mounts
from kit.run.request import RunRequest
from kit.runtimes import JobSpec

KIT_ROOT = Path(__file__).resolve().parents[2]
REPO_PATHS = ("kit", "kernels", "manifests", "pyproject.toml")


def job_spec(plan: dict, argv: list[str], *, image_id: str | None, manifest_sha256: str, working_dir: str | None = None):
    """The Jobs API submission: submission id from the run id; metadata binds image, stack and manifest."""

    env = dict(plan["ray_job"]["runtime_env"]["env_vars"])
    entry = shlex.join(argv)
    wd = plan["ray_job"]["runtime_env"].get("working_dir")
    if traits(plan["arm"]["engine"]).job_in_image_dir and wd:
        entry = f"cd {shlex.quote(wd)} && {entry}"   # an in-image directory: not uploadable as working_dir
    metadata = {"run_id": plan["run_id"], "arm": plan["arm"]["name"], "stack_sha256": plan["stack"]["sha256"],
                "image_id": image_id or "none", "manifest_sha256": manifest_sha256}
    return JobSpec(plan["ray_job"]["submission_id"], entry, list(argv), env, working_dir, metadata)


def lock_record(stack_name: str, stack_sha256: str, image: dict | None) -> dict | None:
    """Which lock the run's packages come from (run-manifest/v3 ``lock``): the image's lock label, or for a
    run without an image the committed lock of its stack (when the kit's catalog holds that very stack and
    exactly one lock of it); None when there is none. ``installed`` is true only for the image's lock: the
    image was built from it and the live container's probe was held to the stack and the lock before the
    job started (the runtime refuses a container that differs); a host run installs nothing."""
    if image is not None:
        labels = image.get("labels") or {}
        sha = labels.get(f"{LABEL_PREFIX}.lock.sha256")
        return {"sha256": sha, "stack": stack_name, "platform": labels.get(f"{LABEL_PREFIX}.platform") or "unknown",
                "source": "image-label", "installed": True} if sha else None
    catalog = Catalog.default()
    locks = [(platform, doc) for (stack, platform), (doc, _) in catalog.lock_docs.items() if stack == stack_name]
    try:
        same_stack = catalog.stack(stack_name).sha256 == stack_sha256
    except BadInput:
        same_stack = False
    if len(locks) != 1 or not same_stack:
        return None
    return {"sha256": lock_sha256(locks[0][1]), "stack": stack_name, "platform": locks[0][0], "source": "committed-lock",
            "installed": False}


def build_manifest(*, plan: dict, arm, described: dict, argv: list[str], env_job: dict, env_host: dict,
                   inputs: dict, repository: dict, allow_dirty: bool, runtime_kind: str,
                   submits_ray_job: bool, claim: dict | None = None) -> dict:

    redacted = secret_names(env_job, env_host)
    ray_job = dict(plan["ray_job"])
    ray_job["metadata"] = dict(ray_job["metadata"], manifest_sha256="<the sha256 of this manifest.json>",
                               image_id=(described.get("image") or {}).get("id") or "none")
    ray_job["entrypoint"] = shlex.join(argv)
    ray_job["runtime_env"] = {**ray_job["runtime_env"], "env_vars": record_job(env_job)}
    return {
        "schema": schema_id("run-manifest", 3),
        "run_id": plan["run_id"],
        "created_at": E.utc_now(),
        "kit_version": __version__,
        "arm": plan["arm"],
        "arm_sha256": sha256_of_document(plan["arm"]),
        "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256, "document": arm.stack.document},
        "runtime": described["runtime"] | {"kind": runtime_kind},
        "image": described.get("image"),
        "lock": lock_record(arm.stack.name, arm.stack.sha256, described.get("image")),
        "observed_identity": described.get("observed_identity"),
        "identity_differences": [list(d) for d in described.get("identity_differences", [])],
        "host": described["host"],
        "gpus": described["gpus"],
        "ray_cluster": described.get("ray_cluster"),
        "commands": {"train": list(argv), "shell": shlex.join(argv),
                     "entrypoint_appended": plan["command"]["entrypoint_appended"],
                     "ray_start": (described.get("ray_cluster") or {}).get("start_command")},
        "ray_job": ray_job if submits_ray_job else None,   # in-process local runs have no job
        "environment": {"job": record_job(env_job), "host": record_host(env_host), "redacted_names": redacted},
        "inputs": inputs,
        "repository": {"allow_dirty": allow_dirty, "state": repository},
        "topology": plan["topology"],
        "plan": {"capture_sizes": plan["capture_sizes"], "evidence_level": plan["evidence_level"],
                 "image_requirements": plan["image"]},
    } | ({"claim": dict(claim)} if claim else {})


METRICS_RECORD_SCHEMA = schema_id("metrics-record")


def metrics_lines(records) -> str:
    """metrics.jsonl: one metrics-record/v1 document a line, each validated; inf/nan (not JSON) become the
    strings "Infinity", "-Infinity", "NaN"."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if v is not None and not isinstance(v, (str, int, float, bool)):
            return repr(v)       # other Python literals (sets, bytes, complex) have no JSON form
        return v
    out = []
    for number, r in enumerate(records, start=1):
        doc = {"schema": METRICS_RECORD_SCHEMA, "kind": r.kind, "step": r.step, "job_log_line": r.line_number,
               "payload": clean(r.payload)}
        require_valid(doc, f"{E.METRICS} line {number}", METRICS_RECORD_SCHEMA)
        out.append(json.dumps(doc, sort_keys=True, allow_nan=False) + "\n")
    return "".join(out)


def header_line(run_id: str, arm: str, stack_sha256: str, image_id: str | None, manifest_sha256: str, runtime: str) -> str:
    return (f"# rlk-kit run {run_id} arm={arm} stack_sha256={stack_sha256} image_id={image_id or 'none'} "
            f"manifest_sha256={manifest_sha256} runtime={runtime} (the lines below are the job's own output)\n")


def repository_state(root: Path = KIT_ROOT) -> dict:
    """The kit checkout's revision and whether the paths that shape a run are dirty (reference §2.7)."""
    if not (root / ".git").exists():
        return {"git": False, "root": str(root), "dirty": False, "note": "not a git checkout (installed package)"}

    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)

    head = git("rev-parse", "HEAD").stdout.decode().strip() or None
    status = [l for l in git("status", "--porcelain=v1", "--untracked-files=all", "--", *REPO_PATHS)
              .stdout.decode(errors="replace").splitlines() if l.strip()]
    diff = git("diff", "--binary", "HEAD", "--", *REPO_PATHS).stdout
    return {"git": True, "root": str(root), "revision": head, "dirty": bool(status), "status": status[:200],
            "tracked_diff_sha256": hashlib.sha256(diff).hexdigest()}


def dry_run_document(request: RunRequest, plan: dict, checks: list | None = None) -> dict:
    """What ``--dry-run`` prints: the plan, what the run needs and its state (``checks``: kit/run/readiness.py),
    and the manifest fields known before anything starts."""
    env_job = dict(plan["ray_job"]["runtime_env"]["env_vars"])
    run_dir = str(request.workspace.resolve() / E.RUNS_DIR / plan["run_id"])
    checks = [c.to_json() for c in checks or []]
    found = {c["name"].split(".", 1)[1]: Path(c["details"]["path"]) for c in checks
             if c["name"].startswith("inputs.") and c["status"] == "PASS" and "path" in c.get("details", {})}
    return {
        "schema": schema_id("run-dry-run", 2),
        "status": "planned",
        "run_dir": run_dir,
        "runtime": request.runtime,
        "ready": all(c["status"] != "FAIL" for c in checks),
        "checks": checks,
        "plan": plan,
        "manifest_preview": {
            "run_id": plan["run_id"], "arm": plan["arm"]["name"], "arm_sha256": sha256_of_document(plan["arm"]),
            "stack": {"name": request.arm.stack.name, "sha256": request.arm.stack.sha256},
            "commands": {"train": plan["command"]["argv"], "entrypoint_appended": plan["command"]["entrypoint_appended"]},
            "environment": {"job": record_job(env_job)},
            "input_mounts": input_mounts(found) if len(found) == 3 else None,
            "determined_at_run_time": ["observed_identity", "image", "host", "gpus", "ray_cluster", "inputs",
                                       "repository", "created_at"],
        },
    }
