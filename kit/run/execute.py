"""Run: one execution of an arm — request → preflight → run dir → manifest → job → finish (finalize.py).

The pure steps live beside this module, one per step (request, inputs, manifest, logs, finalize,
attach); the shells (Docker, Ray, the in-process workload) live in ``kit.runtimes``. The run dir
is created only after preflight proved the software identity, so a refused image or cluster
consumes no run id. Example::

    outcome = execute(RunRequest(arm=catalog.arm("smoke"), workspace=Path(".workspace"), rollouts=3))
    outcome.status, outcome.sealed, outcome.run_dir     # ('succeeded', True, PosixPath('.workspace/runs/smoke-…'))
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, TextIO

from kit.evidence import bundle as E
from kit.evidence.redact import Redactor
from kit.engines import get_engine
from kit.model.documents import sha256_of_file
from kit.model.engine_traits import traits
from kit.model.errors import BadInput
from kit.model.holds import hold
from kit.model.workspace import Workspace
from kit.run.finalize import finish_run, run_ending, status_document, timing
from kit.run.inputs import check_pinned_inputs, file_inputs, input_mounts, vime_input_files
from kit.run.monitors import Monitors
from kit.run.readiness import missing_inputs_message, readiness
from kit.run.logs import Progress, RunLogs, SignalFlag
from kit.run.manifest import build_manifest, dry_run_document, header_line, job_spec, repository_state
from kit.run.request import RunOutcome, RunRequest, check_request, plan_for
from kit.runtimes import RayJobRuntime, make_runtime
from kit.runtimes.leases import Lease, reap_stale

__all__ = ["RunRequest", "RunOutcome", "execute"]


def execute(request: RunRequest, *, progress: TextIO | None = None, log: Callable[[str], None] = lambda s: None) -> RunOutcome:
    """The whole run; never raises for a job that fails or is interrupted (that is the outcome)."""

    check_request(request)
    # the signing key is read now: a bad key must not cost a run (nor its id) that then cannot be sealed
    private_key = E.load_private_key(request.sign_key) if request.sign_key is not None else None
    plan = plan_for(request)
    run_id = plan["run_id"]
    workspace = request.workspace.resolve()
    if request.dry_run:
        return RunOutcome(run_id, None, "planned", document=dry_run_document(request, plan, readiness(request, progress)))
    used = E.run_id_in_use(workspace, run_id) if workspace.exists() else None
    if used:
        raise BadInput(f"--run-id {run_id}: already used in this workspace ({used}); run ids are never reused, pick a new one")
    repo = repository_state()
    if repo.get("dirty") and not request.allow_dirty:
        shown = ", ".join(line[3:] for line in repo["status"][:5])
        raise BadInput(f"refusing a run from a dirty kit checkout ({repo['root']}: {len(repo['status'])} changed paths, "
                       f"e.g. {shown}); commit them, or pass --allow-dirty for a development run (recorded in the manifest)")

    try:
        files = vime_input_files(request) if traits(request.arm.engine).uses_input_files else {}
    except BadInput as missing:
        raise BadInput(missing_inputs_message(request, missing)) from None
    if files:
        check_pinned_inputs(request, files, progress)
    E.check_runs_writable(workspace)     # before anything is started: a read-only run root is one line
    for dead_run, stopped in reap_stale(workspace):
        log(f"run {dead_run} was killed and left {', '.join(stopped) or 'nothing running'}: stopped")
    started = time.monotonic()
    with SignalFlag() as signals:
        # what preflight starts is recorded in the lease first, so even SIGKILL leaves it named for the next command
        lease = Lease.take(workspace, run_id)
        try:
            runtime = make_runtime(request.runtime, arm=request.arm, image=request.image, workspace=workspace,
                                   run_id=run_id, ray_address=request.ray_address, network=request.network,
                                   ray_head=request.ray_head, input_mounts=input_mounts(files) if files else None)
            runtime.lease = lease
            try:
                log(f"preflight ({request.runtime})")
                hold("preflight")
                runtime.preflight()
                if signals.received:
                    return RunOutcome(run_id, None, "interrupted", message="interrupted during preflight; nothing was started")
                described = runtime.describe()
                run_dir = E.create_run_dir(workspace, run_id)
                hold("run-dir")
                outcome = _run_in_dir(request, plan, runtime, described, run_dir, repo, signals, started, progress, log,
                                      files, private_key)
                hold("sealed")
                return outcome
            finally:
                runtime.close()
        finally:
            lease.release()


def submits_ray_job(runtime) -> bool:
    """Docker, ray and the local runtime with --ray-head run the job through the Ray Jobs API."""
    return isinstance(runtime, RayJobRuntime)


def _run_in_dir(request, plan, runtime, described, run_dir: Path, repo, signals, started, progress, log,
                files: dict[str, Path], private_key) -> RunOutcome:
    run_id = plan["run_id"]
    arm_doc = plan["arm"]
    E.write_new_text(run_dir, E.ARM_FILE, json.dumps(arm_doc, indent=2, sort_keys=True) + "\n")
    argv = runtime.job_argv(plan, str(run_dir))
    env_job = dict(plan["ray_job"]["runtime_env"]["env_vars"])
    env_host = dict(os.environ)
    redactor = Redactor.from_recorded(env_host, env_job)
    engine = get_engine(arm_doc["engine"])
    if not engine.traits.uses_input_files:
        inputs = engine.workload_inputs(arm_doc)
    else:
        inputs = file_inputs(files, Workspace(request.workspace.resolve()).hash_cache, progress=progress)
    manifest = build_manifest(plan=plan, arm=request.arm, described=described, argv=argv, env_job=env_job,
                              env_host=env_host, inputs=inputs, repository=repo, allow_dirty=request.allow_dirty,
                              runtime_kind=request.runtime, submits_ray_job=submits_ray_job(runtime), claim=request.claim)
    E.write_document(run_dir, E.MANIFEST, redactor.document(manifest))
    manifest_sha = sha256_of_file(run_dir / E.MANIFEST)
    image_id = (described.get("image") or {}).get("id")
    spec = job_spec(plan, argv, image_id=image_id, manifest_sha256=manifest_sha)
    logs = RunLogs(run_dir, redactor, Progress(int(arm_doc["workload"]["rollouts"]), progress, arm_doc), log,
                   run_log=open(run_dir / E.RUN_LOG, "x", encoding="utf-8"))

    status, job_status, message = "failed", None, ""
    monitors = Monitors(run_dir, ray_address=getattr(runtime, "address", None))   # the dashboard, when on Ray
    monitors.start()
    workload_started = time.monotonic()
    try:
        logs.run_log.write(header_line(run_id, arm_doc["name"], request.arm.stack.sha256, image_id, manifest_sha,
                                       request.runtime))
        logs.run_log.flush()
        logs.kit_event(f"run dir {run_dir}")
        if request.reproduces:
            logs.kit_event(f"reproduction of {request.reproduces}")
        if request.reproduces:
            logs.kit_event(f"reproduction of {request.reproduces}")
        logs.kit_event(f"submit {spec.submission_id}: {spec.entrypoint}")
        runtime.set_arm_document(arm_doc)
        runtime.submit(spec)
        if request.detach:
            job_status = runtime.job_status() or "PENDING"
            status = "detached"
            message = (f"job {spec.submission_id} keeps running on {runtime.address or 'the cluster'}; "
                       f"finish the run with: kit run --attach {run_dir}")
            logs.kit_event(f"detached: {message}")
        else:
            job_status = runtime.follow(logs.emit, lambda: signals.received is not None)
            logs.kit_event(f"job {spec.submission_id} ended {job_status}")
            status, message = run_ending(job_status, signals.received)
    except Exception as exc:   # the shells' failures end the run as failed with evidence, never a traceback
        status, message = ("interrupted", "interrupted") if signals.received else ("failed", f"{type(exc).__name__}: {exc}")
        logs.kit_event(f"error: {message}")
    finally:
        workload_s = time.monotonic() - workload_started
        hold("logs")
        logs.close_run_log()
        _stop_monitors(monitors, logs)
        if status == "interrupted":
            runtime.stop_job()

    job_info = runtime.job_info()
    total_s = time.monotonic() - started
    run_timing = timing(total_s, workload_s)
    if status == "detached":
        # no metrics, no validation, no final status: the job is still running; --attach writes them
        logs.kit_event(f"status detached: {message}")
        logs.kit_log.close()
        E.write_document(run_dir, E.STATUS, status_document(run_id, status, job_status, spec.submission_id, message,
                                                            run_timing, job_info, redactor))
        return RunOutcome(run_id, run_dir, status, job_status, None, None, message)
    return finish_run(run_dir, logs, run_id=run_id, arm_doc=arm_doc, inputs=inputs, status=status,
                      job_status=job_status, message=message, submission_id=spec.submission_id, timing=run_timing,
                      job_info=job_info, private_key=private_key, replace_status=False)


def _stop_monitors(monitors: Monitors, logs: RunLogs) -> None:
    """Stop the samplers; a monitor's failure is noted in kit.log and never fails the run."""
    try:
        hold("monitors")
        doc = monitors.stop()
        logs.kit_event("monitors: " + ", ".join(f"{s['name']} {s['status']}" for s in doc["samplers"]))
    except Exception as exc:
        logs.kit_event(f"monitors: could not be stopped cleanly: {type(exc).__name__}: {exc}")
