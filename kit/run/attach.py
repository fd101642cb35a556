"""Attach: finish a detached run by following its Ray job through the ray runtime, then collect, validate
and seal exactly as a waited run does. Example::

    execute(RunRequest(arm=arm, workspace=ws, runtime="ray", ray_address=url, detach=True, run_id="r1"))
    attach(ws / "runs" / "r1").status        # "succeeded"
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import io
import os
from pathlib import Path
from typing import Callable, TextIO

from kit.evidence import bundle as E
from kit.evidence.redact import Redactor
from kit.model.documents import read_json_file, sha256_of_file
from kit.model.errors import BadInput, CheckFailed, KitError
from kit.run.finalize import finish_run, run_ending, timing
from kit.run.logs import Progress, RunLogs, SignalFlag
from kit.run.request import RunOutcome
from kit.runtimes import make_runtime


def read_run_document(run_dir: Path, name: str) -> dict:

    try:
        return read_json_file(run_dir / name)
    except KitError as exc:
        raise BadInput(f"--attach {run_dir}: {exc}") from None


def attach(run_dir: Path, *, sign_key: Path | None = None, progress: TextIO | None = None,
           log: Callable[[str], None] = lambda s: None) -> RunOutcome:
    """Follow a detached run's Ray job by its submission id, then collect, validate and seal exactly as a
    waited run does. The job's whole log is streamed again from its start into run.log (after the
    identity header), so an attach that was cut off can simply be repeated. Example::

        execute(RunRequest(arm=arm, workspace=ws, runtime="ray", ray_address=url, detach=True, run_id="r1"))
        attach(ws / "runs" / "r1").status        # "succeeded"
    """


    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not (run_dir / E.MANIFEST).is_file():
        raise BadInput(f"--attach {run_dir}: not a run directory (no {E.MANIFEST}); give <workspace>/runs/<run-id>")
    if E.is_sealed(run_dir):
        raise BadInput(f"--attach {run_dir}: already sealed; a sealed run dir is never written again")
    before = read_run_document(run_dir, E.STATUS)
    if before.get("status") != "detached":
        raise BadInput(f"--attach {run_dir}: its status is {before.get('status')}, not detached; only a run started "
                       "with --detach is attached")
    private_key = E.load_private_key(sign_key) if sign_key is not None else None
    manifest = E.read_manifest(run_dir)
    arm_doc = read_run_document(run_dir, E.ARM_FILE)
    recorded = manifest.get("runtime") or {}
    address = recorded.get("address")
    submission_id = (manifest.get("ray_job") or {}).get("submission_id")
    if recorded.get("kind") != "ray" or not address or not submission_id:
        raise BadInput(f"--attach {run_dir}: the manifest records no Ray job on a cluster (runtime {recorded.get('kind')})")
    if before.get("submission_id") != submission_id:
        raise BadInput(f"--attach {run_dir}: status.json names job {before.get('submission_id')}, the manifest "
                       f"{submission_id}")
    run_id = manifest["run_id"]

    try:
        raw = open(run_dir / E.RUN_LOG, "r+b")
    except OSError as exc:
        raise BadInput(f"--attach {run_dir}: cannot open {E.RUN_LOG} for the job's log ({exc.strerror or exc})") from None
    try:
        try:
            fcntl.flock(raw, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(f"--attach {run_dir}: another kit run --attach is following this run") from None
        header = raw.readline()
        if not header.startswith(f"# rlk-kit run {run_id} ".encode()):
            raise CheckFailed(f"{run_dir / E.RUN_LOG}: does not begin with this run's identity header")
        runtime = make_runtime("ray", arm=None, ray_address=address, run_id=run_id)
        runtime.reach(unreachable=lambda m: BadInput(f"--attach {run_dir}: the cluster at {address} cannot be reached ({m})"))
        runtime.attach(submission_id)
        info = runtime.job_info()
        if "error" in info:
            raise CheckFailed(f"--attach {run_dir}: the cluster at {address} has no job {submission_id}: {info['error']}")
        manifest_sha = sha256_of_file(run_dir / E.MANIFEST)
        claimed = info.get("metadata") or {}
        if claimed.get("run_id") != run_id or claimed.get("manifest_sha256") != manifest_sha:
            raise CheckFailed(f"--attach {run_dir}: job {submission_id} on {address} is not this run's job (its metadata "
                              f"names run {claimed.get('run_id')!r}, manifest sha256 {claimed.get('manifest_sha256')!r}; "
                              f"this run's manifest is {manifest_sha})")
        # everything after the header is re-streamed from the job's own log: a cut-off attach leaves no duplicates
        raw.seek(len(header))
        raw.truncate()
        run_log = io.TextIOWrapper(raw, encoding="utf-8")
        logs = RunLogs(run_dir, Redactor.from_recorded(dict(os.environ), {}),
                        Progress(int(arm_doc["workload"]["rollouts"]), progress, arm_doc), log,
                        run_log=run_log, kit_log_mode="a")
        status, job_status, message = "failed", None, ""
        with SignalFlag() as signals:
            try:
                logs.kit_event(f"attach {submission_id} on {address}")
                job_status = runtime.follow(logs.emit, lambda: signals.received is not None)
                logs.kit_event(f"job {submission_id} ended {job_status}")
                status, message = run_ending(job_status, signals.received)
            except Exception as exc:   # as in a waited run: the evidence records the failure, no traceback
                status, message = (("interrupted", "interrupted") if signals.received
                                   else ("failed", f"{type(exc).__name__}: {exc}"))
                logs.kit_event(f"error: {message}")
            finally:
                logs.close_run_log()
                if status == "interrupted":
                    runtime.stop_job()
        job_info = runtime.job_info()
        timing = attached_timing(manifest, job_info)
        return finish_run(run_dir, logs, run_id=run_id, arm_doc=arm_doc, inputs=manifest.get("inputs"), status=status,
                       job_status=job_status, message=message, submission_id=submission_id, timing=timing,
                       job_info=job_info, private_key=private_key, replace_status=True)
    finally:
        if not raw.closed:
            raw.close()


def attached_timing(manifest: dict, job_info: dict) -> dict:
    """total: from the manifest's creation to now; workload: the job's own start-to-end as Ray recorded it."""

    try:
        total_s = (_dt.datetime.now(_dt.timezone.utc) - E.parse_utc(manifest["created_at"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        total_s = 0.0
    start, end = job_info.get("start_time_ms"), job_info.get("end_time_ms")
    workload_s = ((end - start) / 1000.0 if all(isinstance(t, int) and not isinstance(t, bool) for t in (start, end))
                  and end >= start else 0.0)
    return timing(max(total_s, workload_s), workload_s)
