"""Run: one execution of an arm — plan → preflight → start → stream → collect → validate → seal.

The pure steps (the job spec, the manifest, the status document, metrics lines) are functions over
documents; the shells (Docker, Ray, the in-process workload) live in ``kit.runtimes``. The run dir
is created only after preflight proved the software identity, so a refused image or cluster
consumes no run id. Example::

    outcome = execute(RunRequest(arm=catalog.arm("smoke"), workspace=Path(".workspace"), rollouts=3))
    outcome.status, outcome.sealed, outcome.run_dir     # ('succeeded', True, PosixPath('.workspace/runs/smoke-…'))
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from kit.evidence import bundle as E
from kit.model.documents import require_valid, schema_id, sha256_of_document, sha256_of_file
from kit.model.errors import BadInput, CheckFailed, KitError
from kit.gates.engine import GATE_SET_VERSION, evaluate
from kit.gates.rules import MISMATCH_KEY, RunEvidence, mismatch_count, step_global_batch_size
from kit.evidence.environment import record_host, record_job, secret_names
from kit.evidence.redact import Redactor
from kit.engines import gpu as gpu_engine
from kit.engines.vime.records import parse_records
from kit.run.monitors import Monitors

INTERRUPTED_EXIT = 130
KIT_ROOT = Path(__file__).resolve().parents[2]
REPO_PATHS = ("kit", "kernels", "manifests", "pyproject.toml")


@dataclass(frozen=True)
class RunRequest:
    arm: object                       # kit.arm.Arm
    workspace: Path
    overrides: object = None          # kit.plan.TopologyOverrides
    runtime: str = "local"
    image: str | None = None
    ray_address: str | None = None
    network: str | None = None
    run_id: str | None = None
    rollouts: int | None = None
    detach: bool = False
    dry_run: bool = False
    allow_dirty: bool = False
    sign_key: Path | None = None
    ray_head: bool = False            # local: run as a Ray job on a head the kit starts and stops
    model: Path | None = None         # VIME arms: Hugging Face checkpoint dir, mounted read-only
    checkpoint: Path | None = None    # VIME arms: Megatron torch_dist dir, mounted read-only
    prompt_data: Path | None = None   # VIME arms: prompt JSONL (default: kit prepare's output in the workspace)
    reproduces: str | None = None     # kit reproduce: the original run (id, dir, seal root), recorded in kit.log


@dataclass
class RunOutcome:
    run_id: str
    run_dir: Path | None
    status: str                        # planned | succeeded | failed | interrupted | detached
    job_status: str | None = None
    validation: dict | None = None
    seal: dict | None = None
    message: str = ""
    document: dict | None = None       # dry run: what would be written

    @property
    def sealed(self) -> bool:
        return self.seal is not None

    @property
    def exit_code(self) -> int:
        if self.status in ("planned", "detached"):
            return 0
        if self.status == "interrupted":
            return INTERRUPTED_EXIT
        return 0 if self.status == "succeeded" and self.validation and self.validation["passed"] else 1


# --- pure pieces -------------------------------------------------------------------------------------

def job_spec(plan: dict, argv: list[str], *, image_id: str | None, manifest_sha256: str, working_dir: str | None = None):
    """The Jobs API submission: submission id from the run id; metadata binds image, stack and manifest."""
    from kit.runtimes import JobSpec

    env = dict(plan["ray_job"]["runtime_env"]["env_vars"])
    entry = shlex.join(argv)
    wd = plan["ray_job"]["runtime_env"].get("working_dir")
    if plan["arm"]["engine"] == "vime" and wd:
        entry = f"cd {shlex.quote(wd)} && {entry}"   # an in-image directory: not uploadable as working_dir
    metadata = {"run_id": plan["run_id"], "arm": plan["arm"]["name"], "stack_sha256": plan["stack"]["sha256"],
                "image_id": image_id or "none", "manifest_sha256": manifest_sha256}
    return JobSpec(plan["ray_job"]["submission_id"], entry, list(argv), env, working_dir, metadata)


def smoke_inputs(arm_doc: dict) -> dict:
    """Hashes of the smoke workload's inputs: its built-in prompt set and its model (config, initial weights)."""
    import hashlib as _h

    from rlk_kernels.model import init_weights, weights_sha256
    from rlk_kernels.smoke import SmokeConfig, prompt_set

    config = SmokeConfig.from_arm(arm_doc)
    prompts, answers = prompt_set()
    digest = _h.sha256(prompts.contiguous().numpy().tobytes() + b"|" + answers.contiguous().numpy().tobytes()).hexdigest()
    return {"prompt_data": {"source": "rlk_kernels.smoke.prompt_set()", "sha256": digest, "count": int(prompts.shape[0])},
            "model": {"source": f"rlk_kernels.model.init_weights(seed={config.seed})", "name": config.model.name,
                      "config_sha256": config.model.config_sha256,
                      "weights_sha256": weights_sha256(init_weights(config.model, config.seed))},
            "checkpoint": None}


def file_inputs(paths: dict[str, Path | None], cache: Path, progress: TextIO | None = None) -> dict:
    """sha256 of prompt data / model / checkpoint files or trees, cached by path, size and mtime;
    a tree's hashing is reported on ``progress`` (a 16 GiB model takes minutes the first time)."""
    from kit.inputs.files import hash_file_cached, hash_tree, tree_sha256, HashCache

    out = {}
    for name, path in paths.items():
        if path is None:
            out[name] = None
        elif Path(path).is_dir():
            files = hash_tree(path, cache, progress=progress)
            out[name] = {"path": str(path), "sha256": tree_sha256(files), "files": len(files)}
        else:
            c = HashCache(cache)
            out[name] = {"path": str(path), "sha256": hash_file_cached(path, c)}
            c.save()
    return out


def vime_input_files(request: RunRequest) -> dict[str, Path]:
    """The files a VIME arm reads, from the flags or the workspace that ``kit prepare`` filled; each must exist."""
    from kit.inputs.prepare import Workspace, read_provenance, select_checkpoint

    ws = Workspace(request.workspace)
    # Without flags: the checkpoint kit prepare --convert-checkpoint made with this arm's stack, and
    # the model it was converted from, as the workspace's provenance records them. A default never
    # pairs a checkpoint with a model it was not converted from.
    checkpoint, model = request.checkpoint, request.model

    def model_of(checkpoint_record: dict) -> str | None:
        record = ws.model_provenance(checkpoint_record["model_tree_sha256"])
        return read_provenance(record, "model")["path"] if record.is_file() else None

    if checkpoint is None:
        arm = request.arm
        _, converted, _ = select_checkpoint(ws, arm.stack.name, arm.stack.sha256, arm.platform)
        if converted is not None and (model is None or _same_path(model_of(converted), model)):
            checkpoint = ws.root / converted["output"]
            model = model or model_of(converted)
    elif model is None and ws.checkpoint_provenance(Path(checkpoint)).is_file():
        model = model_of(read_provenance(ws.checkpoint_provenance(Path(checkpoint)), "checkpoint"))
    given = {"model": (model, "--model DIR (the Hugging Face checkpoint; default: the one the workspace's "
                              "converted checkpoint came from)"),
             "checkpoint": (checkpoint, "--checkpoint DIR (default: the torch_dist checkpoint kit prepare "
                                        "--convert-checkpoint wrote for this stack)"),
             "prompt_data": (request.prompt_data or ws.data, f"--prompt-data FILE (default {ws.data}, written by kit prepare)")}
    out = {}
    for name, (path, flag) in given.items():
        if path is None:
            raise BadInput(f"arm {request.arm.name} reads {name.replace('_', ' ')}: give {flag}")
        path = Path(path)
        if not path.exists():
            raise BadInput(f"{path}: not found; give {flag}")
        out[name] = path.resolve()
    return out


def _same_path(a: str | Path | None, b: str | Path) -> bool:
    return a is not None and Path(a).resolve() == Path(b).resolve()


def check_pinned_inputs(request: RunRequest, files: dict[str, Path], progress: TextIO | None = None) -> None:
    """CheckFailed, before any run dir exists, when the arm pins an input hash (``inputs``) that its
    file does not have: the prompt data's sha256, the model's tree sha256."""
    pins = request.arm.document.get("inputs") or {}
    if not pins:
        return
    from kit.inputs.files import HashCache, hash_file_cached, hash_tree, tree_sha256
    from kit.inputs.prepare import Workspace

    cache_path = Workspace(request.workspace).hash_cache
    found = {}
    if "prompt_data_sha256" in pins:
        cache = HashCache(cache_path)
        found["prompt_data_sha256"] = (files["prompt_data"], hash_file_cached(files["prompt_data"], cache),
                                       "--prompt-data FILE")
        cache.save()
    if "model_tree_sha256" in pins:   # cached per file: the manifest's hashing later answers from it
        found["model_tree_sha256"] = (files["model"], tree_sha256(hash_tree(files["model"], cache_path,
                                                                             progress=progress)), "--model DIR")
    for field, (path, actual, flag) in found.items():
        if actual != pins[field]:
            raise CheckFailed(f"{path}: sha256 {actual} is not the {pins[field]} arm {request.arm.name} pins "
                              f"(inputs.{field}); prepare it with kit prepare, or give {flag} with that hash")


def input_mounts(files: dict[str, Path]) -> dict[str, str]:
    """Host path -> in-image path, all read-only (kit/build/layout.py)."""
    from kit.build import layout as L

    mounts = {str(files["model"]): L.MODEL_DIR, str(files["checkpoint"]): L.CHECKPOINT_DIR}
    mounts[str(files["prompt_data"])] = f"{L.DATA_DIR}/dapo-math-17k.jsonl"
    return mounts


def build_manifest(*, plan: dict, arm, described: dict, argv: list[str], env_job: dict, env_host: dict,
                   inputs: dict, repository: dict, allow_dirty: bool, runtime_kind: str,
                   submits_ray_job: bool) -> dict:
    from kit import __version__

    redacted = secret_names(env_job, env_host)
    ray_job = dict(plan["ray_job"])
    ray_job["metadata"] = dict(ray_job["metadata"], manifest_sha256="<the sha256 of this manifest.json>",
                               image_id=(described.get("image") or {}).get("id") or "none")
    ray_job["entrypoint"] = shlex.join(argv)
    ray_job["runtime_env"] = {**ray_job["runtime_env"], "env_vars": record_job(env_job)}
    return {
        "schema": schema_id("run-manifest"),
        "run_id": plan["run_id"],
        "created_at": E.utc_now(),
        "kit_version": __version__,
        "arm": plan["arm"],
        "arm_sha256": sha256_of_document(plan["arm"]),
        "stack": {"name": arm.stack.name, "sha256": arm.stack.sha256, "document": arm.stack.document},
        "runtime": described["runtime"] | {"kind": runtime_kind},
        "image": described.get("image"),
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
    }


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


# --- shells --------------------------------------------------------------------------------------------

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


class Progress:
    """Steps done of N from the step records, ETA and the last step's mismatched-token count, on stderr.

    The engine logs the mismatch as a per-sample mean; the display shows the count (mean × global
    batch size, reference §4.2), the same figure the run summary and ``kit analyze`` report."""

    def __init__(self, total: int, stream: TextIO | None, arm: dict | None = None):
        self.total, self.stream, self.arm = total, stream, arm
        self.done, self.started, self.last_print = 0, time.monotonic(), 0.0
        self.mismatch = None
        self.tty = bool(stream) and hasattr(stream, "isatty") and stream.isatty()

    def record(self, rec) -> None:
        if self.stream is None or rec.kind != "step":
            return
        self.done += 1
        if MISMATCH_KEY in rec.payload:
            self.mismatch = mismatch_count(rec.payload[MISMATCH_KEY], step_global_batch_size(rec.payload, self.arm))
        now = time.monotonic()
        if self.tty or now - self.last_print >= 2.0 or self.done == self.total:
            self.last_print = now
            elapsed = now - self.started
            eta = elapsed / self.done * max(self.total - self.done, 0)
            shown = "-" if self.mismatch is None else f"{self.mismatch:g} tokens"
            text = f"step {self.done}/{self.total}  ETA {eta:5.0f} s  last step mismatched {shown}"
            self.stream.write(("\r" + text + ("\n" if self.done == self.total else "")) if self.tty else text + "\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.stream is not None and self.tty and self.done != self.total:
            self.stream.write("\n")


class SignalFlag:
    """Ctrl-C and SIGTERM set a flag the caller polls (the stream loop, the suite between arms): the job is
    stopped, evidence kept, no traceback. A context manager that restores the previous handlers."""

    def __init__(self):
        self.received: int | None = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:   # not the main thread: leave the handlers alone
                pass
        return self

    def _handle(self, signum, frame):
        self.received = signum

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def plan_for(request: RunRequest) -> dict:
    from kit.build import layout as L
    from kit.run.plan import TopologyOverrides, resolve_plan

    workspace = str(request.workspace.resolve()) if request.runtime == "local" else L.WORKSPACE
    run_id = request.run_id or default_run_id(request.arm, request.rollouts)
    return resolve_plan(request.arm, request.overrides or TopologyOverrides(), run_id=run_id,
                        rollouts=request.rollouts, workspace=workspace)


def default_run_id(arm, rollouts: int | None) -> str:
    """``kit.plan.default_run_id`` with the rollout count the run actually uses."""
    import datetime as _dt

    wl = arm.workload
    now = _dt.datetime.now(_dt.timezone.utc)
    return f"{arm.name.lower()}-n{rollouts or wl['rollouts']}-s{wl['seed']}-{now.strftime('%Y%m%dT%H%M%S%fZ')}"


# Flags that only one runtime reads: given to another, they would be silently ignored.
RUNTIME_ONLY_FLAGS = (("image", "--image", "docker"), ("network", "--network", "docker"),
                      ("ray_address", "--ray-address", "ray"))


def check_workspace(path: Path, source: str = "--workspace or KIT_WORKSPACE") -> None:
    """The workspace must be a directory or creatable as one: a file on its path is bad input."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "is a file" if candidate == path else f"lies under {candidate}, which is a file"
                raise BadInput(f"workspace {path} ({source}) {where}; give a directory (created when missing)")
            return


def check_request(request: RunRequest) -> None:
    """Refuse flag combinations that cannot mean what they say, before anything is planned or started."""
    for attr, flag, needs in RUNTIME_ONLY_FLAGS:
        if getattr(request, attr) and request.runtime != needs:
            raise BadInput(f"{flag} needs --runtime {needs}; the {request.runtime} runtime would ignore it "
                           f"(drop {flag} or add --runtime {needs})")
    if request.detach and request.runtime != "ray":
        raise BadInput("--detach needs --runtime ray: the local and docker runtimes stop what they started")
    if request.ray_head and request.runtime != "local":
        raise BadInput(f"--ray-head goes with --runtime local (the {request.runtime} runtime has its own Ray)")
    if request.runtime == "local" and request.arm.engine not in ("smoke", "gpu"):
        raise BadInput(f"--runtime local: arm {request.arm.name} is a {request.arm.engine} arm; its engines exist only "
                       f"in its image: use --runtime docker (kit build {request.arm.platform} --arm {request.arm.name}) "
                       "or --runtime ray")
    check_workspace(request.workspace)


def execute(request: RunRequest, *, progress: TextIO | None = None, log: Callable[[str], None] = lambda s: None) -> RunOutcome:
    """The whole run; never raises for a job that fails or is interrupted (that is the outcome)."""
    from kit.runtimes import make_runtime

    check_request(request)
    # the signing key is read now: a bad key must not cost a run (nor its id) that then cannot be sealed
    private_key = E.load_private_key(request.sign_key) if request.sign_key is not None else None
    plan = plan_for(request)
    run_id = plan["run_id"]
    workspace = request.workspace.resolve()
    if request.dry_run:
        return RunOutcome(run_id, None, "planned", document=dry_run_document(request, plan))
    used = E.run_id_in_use(workspace, run_id) if workspace.exists() else None
    if used:
        raise BadInput(f"--run-id {run_id}: already used in this workspace ({used}); run ids are never reused, pick a new one")
    repo = repository_state()
    if repo.get("dirty") and not request.allow_dirty:
        shown = ", ".join(line[3:] for line in repo["status"][:5])
        raise BadInput(f"refusing a run from a dirty kit checkout ({repo['root']}: {len(repo['status'])} changed paths, "
                       f"e.g. {shown}); commit them, or pass --allow-dirty for a development run (recorded in the manifest)")

    files = vime_input_files(request) if request.arm.engine == "vime" else {}
    if files:
        check_pinned_inputs(request, files, progress)
    runtime = make_runtime(request.runtime, arm=request.arm, image=request.image, workspace=workspace, run_id=run_id,
                           ray_address=request.ray_address, network=request.network, ray_head=request.ray_head,
                           input_mounts=input_mounts(files) if files else None)
    started = time.monotonic()
    with SignalFlag() as signals:
        try:
            log(f"preflight ({request.runtime})")
            runtime.preflight()
            if signals.received:
                return RunOutcome(run_id, None, "interrupted", message="interrupted during preflight; nothing was started")
            described = runtime.describe()
            run_dir = E.create_run_dir(workspace, run_id)
            return _run_in_dir(request, plan, runtime, described, run_dir, repo, signals, started, progress, log, files,
                               private_key)
        finally:
            runtime.close()


class _RunLogs:
    """The open logs of one run dir: kit.log (the kit's events, recorded secrets redacted) and run.log (the
    job's own lines as the engine wrote them, parsed for the progress display and kept for the gates)."""

    def __init__(self, run_dir: Path, redactor: Redactor, bar: "Progress", log: Callable[[str], None], *,
                 run_log: TextIO, kit_log_mode: str = "x"):
        self.run_dir, self.redactor, self.bar, self.log = run_dir, redactor, bar, log
        self.kit_log = open(run_dir / E.KIT_LOG, kit_log_mode, encoding="utf-8")
        self.run_log = run_log
        self.engine_lines: list[str] = []

    def kit_event(self, text: str) -> None:
        self.kit_log.write(f"{E.utc_now()} {self.redactor.text(text)}\n")
        self.kit_log.flush()
        self.log(text)

    def emit(self, line: str) -> None:
        line = line.rstrip("\n")            # the engine's output, byte for byte: redaction never rewrites it
        self.engine_lines.append(line)
        self.run_log.write(line + "\n")
        self.run_log.flush()
        for rec in parse_records([line]):
            self.bar.record(rec)

    def close_run_log(self) -> None:
        self.bar.finish()
        if not self.run_log.closed:
            self.run_log.close()


def submits_ray_job(runtime) -> bool:
    """Docker, ray and the local runtime with --ray-head run the job through the Ray Jobs API."""
    from kit.runtimes import RayJobRuntime

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
    if arm_doc["engine"] == "smoke":
        inputs = smoke_inputs(arm_doc)
    elif arm_doc["engine"] == "gpu":
        inputs = gpu_engine.workload_inputs(arm_doc)
    else:
        from kit.inputs.prepare import Workspace
        inputs = file_inputs(files, Workspace(request.workspace.resolve()).hash_cache, progress=progress)
    manifest = build_manifest(plan=plan, arm=request.arm, described=described, argv=argv, env_job=env_job,
                              env_host=env_host, inputs=inputs, repository=repo, allow_dirty=request.allow_dirty,
                              runtime_kind=request.runtime, submits_ray_job=submits_ray_job(runtime))
    E.write_document(run_dir, E.MANIFEST, redactor.document(manifest))
    manifest_sha = sha256_of_file(run_dir / E.MANIFEST)
    image_id = (described.get("image") or {}).get("id")
    spec = job_spec(plan, argv, image_id=image_id, manifest_sha256=manifest_sha)
    logs = _RunLogs(run_dir, redactor, Progress(int(arm_doc["workload"]["rollouts"]), progress, arm_doc), log,
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
        logs.kit_event(f"submit {spec.submission_id}: {spec.entrypoint}")
        if hasattr(runtime, "set_arm_document"):
            runtime.set_arm_document(arm_doc)
        runtime.submit(spec)
        if request.detach:
            job_status = runtime.job_status() if hasattr(runtime, "job_status") else "PENDING"
            status = "detached"
            message = (f"job {spec.submission_id} keeps running on {getattr(runtime, 'address', 'the cluster')}; "
                       f"finish the run with: kit run --attach {run_dir}")
            logs.kit_event(f"detached: {message}")
        else:
            job_status = runtime.follow(logs.emit, lambda: signals.received is not None)
            logs.kit_event(f"job {spec.submission_id} ended {job_status}")
            status, message = _ending(job_status, signals.received)
    except Exception as exc:   # the shells' failures end the run as failed with evidence, never a traceback
        status, message = ("interrupted", "interrupted") if signals.received else ("failed", f"{type(exc).__name__}: {exc}")
        logs.kit_event(f"error: {message}")
    finally:
        workload_s = time.monotonic() - workload_started
        logs.close_run_log()
        _stop_monitors(monitors, logs)
        if hasattr(runtime, "stop_job") and status == "interrupted":
            runtime.stop_job()

    job_info = runtime.job_info() if hasattr(runtime, "job_info") else {}
    total_s = time.monotonic() - started
    timing = _timing(total_s, workload_s)
    if status == "detached":
        # no metrics, no validation, no final status: the job is still running; --attach writes them
        logs.kit_event(f"status detached: {message}")
        logs.kit_log.close()
        E.write_document(run_dir, E.STATUS, _status_doc(run_id, status, job_status, spec.submission_id, message, timing,
                                                       job_info, redactor))
        return RunOutcome(run_id, run_dir, status, job_status, None, None, message)
    return _finish(run_dir, logs, run_id=run_id, arm_doc=arm_doc, inputs=inputs, status=status, job_status=job_status,
                   message=message, submission_id=spec.submission_id, timing=timing, job_info=job_info,
                   private_key=private_key, replace_status=False)


def _stop_monitors(monitors: Monitors, logs: _RunLogs) -> None:
    """Stop the samplers; a monitor's failure is noted in kit.log and never fails the run."""
    try:
        doc = monitors.stop()
        logs.kit_event("monitors: " + ", ".join(f"{s['name']} {s['status']}" for s in doc["samplers"]))
    except Exception as exc:
        logs.kit_event(f"monitors: could not be stopped cleanly: {type(exc).__name__}: {exc}")


def _ending(job_status: str, signal_received: int | None) -> tuple[str, str]:
    """(run status, message) from the job's terminal status and whether Ctrl-C/SIGTERM arrived."""
    if signal_received is not None:
        return "interrupted", f"stopped by signal {signal.Signals(signal_received).name}"
    if job_status == "SUCCEEDED":
        return "succeeded", ""
    return "failed", ("the cluster or container stopped answering" if job_status == "LOST" else f"job ended {job_status}")


def _status_doc(run_id, status, job_status, submission_id, message, timing, job_info, redactor) -> dict:
    return redact_status({
        "schema": schema_id("run-status"), "run_id": run_id, "status": status, "job_status": job_status,
        "submission_id": submission_id, "message": message, "finished_at": E.utc_now(), "timing": timing,
        "job_info": job_info}, redactor)


def _finish(run_dir: Path, logs: _RunLogs, *, run_id, arm_doc, inputs, status, job_status, message, submission_id,
            timing, job_info, private_key, replace_status: bool) -> RunOutcome:
    """collect → validate → status → seal: the same for a waited run and for an attached one."""
    E.write_new_text(run_dir, E.METRICS, metrics_lines(parse_records(logs.engine_lines)))
    ev = RunEvidence(arm=arm_doc, job_status=job_status or "", engine_lines=logs.engine_lines, inputs=inputs,
                     readbacks=tuple(_read_readbacks(run_dir)))
    report = evaluate(ev, run_id=run_id)
    E.write_document(run_dir, E.VALIDATION, report)
    if status == "succeeded" and not report["passed"]:
        message = "gates failed: " + ", ".join(g["id"] for g in report["gates"] if g["status"] == "failed")
    logs.kit_event(f"status {status}" + (f": {message}" if message else ""))
    logs.kit_log.close()
    doc = _status_doc(run_id, status, job_status, submission_id, message, timing, job_info, logs.redactor)
    if replace_status:
        E.replace_status(run_dir, doc)
    else:
        E.write_document(run_dir, E.STATUS, doc)
    seal = None
    if status == "succeeded":
        seal = E.seal_run_dir(run_dir, run_id=run_id, validation_passed=report["passed"],
                              gate_set_version=GATE_SET_VERSION, private_key=private_key)
    return RunOutcome(run_id, run_dir, status, job_status, report, seal, message)


# --- attach: finish a detached run ------------------------------------------------------------------

def _read_run_document(run_dir: Path, name: str) -> dict:
    from kit.model.documents import read_json_file

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
    import fcntl
    import io

    from kit.runtimes import NAMED_CLUSTER_TIMEOUT_S, RayJob, wait_for_jobs_api

    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not (run_dir / E.MANIFEST).is_file():
        raise BadInput(f"--attach {run_dir}: not a run directory (no {E.MANIFEST}); give <workspace>/runs/<run-id>")
    if E.is_sealed(run_dir):
        raise BadInput(f"--attach {run_dir}: already sealed; a sealed run dir is never written again")
    before = _read_run_document(run_dir, E.STATUS)
    if before.get("status") != "detached":
        raise BadInput(f"--attach {run_dir}: its status is {before.get('status')}, not detached; only a run started "
                       "with --detach is attached")
    private_key = E.load_private_key(sign_key) if sign_key is not None else None
    manifest = E.read_manifest(run_dir)
    arm_doc = _read_run_document(run_dir, E.ARM_FILE)
    runtime = manifest.get("runtime") or {}
    address = runtime.get("address")
    submission_id = (manifest.get("ray_job") or {}).get("submission_id")
    if runtime.get("kind") != "ray" or not address or not submission_id:
        raise BadInput(f"--attach {run_dir}: the manifest records no Ray job on a cluster (runtime {runtime.get('kind')})")
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
        wait_for_jobs_api(address, timeout_s=NAMED_CLUSTER_TIMEOUT_S, unreachable=lambda m: BadInput(
            f"--attach {run_dir}: the cluster at {address} cannot be reached ({m})"))
        job = RayJob.existing(address, submission_id)
        info = job.info()
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
        logs = _RunLogs(run_dir, Redactor.from_recorded(dict(os.environ), {}),
                        Progress(int(arm_doc["workload"]["rollouts"]), progress, arm_doc), log,
                        run_log=run_log, kit_log_mode="a")
        status, job_status, message = "failed", None, ""
        with SignalFlag() as signals:
            try:
                logs.kit_event(f"attach {submission_id} on {address}")
                job_status = job.follow(logs.emit, lambda: signals.received is not None)
                logs.kit_event(f"job {submission_id} ended {job_status}")
                status, message = _ending(job_status, signals.received)
            except Exception as exc:   # as in a waited run: the evidence records the failure, no traceback
                status, message = (("interrupted", "interrupted") if signals.received
                                   else ("failed", f"{type(exc).__name__}: {exc}"))
                logs.kit_event(f"error: {message}")
            finally:
                logs.close_run_log()
                if status == "interrupted":
                    job.stop()
        job_info = job.info()
        timing = _attached_timing(manifest, job_info)
        return _finish(run_dir, logs, run_id=run_id, arm_doc=arm_doc, inputs=manifest.get("inputs"), status=status,
                       job_status=job_status, message=message, submission_id=submission_id, timing=timing,
                       job_info=job_info, private_key=private_key, replace_status=True)
    finally:
        if not raw.closed:
            raw.close()


def _attached_timing(manifest: dict, job_info: dict) -> dict:
    """total: from the manifest's creation to now; workload: the job's own start-to-end as Ray recorded it."""
    import datetime as _dt

    try:
        total_s = (_dt.datetime.now(_dt.timezone.utc) - E.parse_utc(manifest["created_at"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        total_s = 0.0
    start, end = job_info.get("start_time_ms"), job_info.get("end_time_ms")
    workload_s = (end - start) / 1000.0 if isinstance(start, int) and isinstance(end, int) and end >= start else 0.0
    return _timing(max(total_s, workload_s), workload_s)


def _timing(total_s: float, workload_s: float) -> dict:
    """The status document's timing: the whole run, the job's own part, and the kit's (the rest)."""
    return {"total_s": round(total_s, 3), "workload_s": round(workload_s, 3), "kit_s": round(total_s - workload_s, 3)}


def redact_status(doc: dict, redactor: Redactor) -> dict:
    return redactor.document(json.loads(json.dumps(doc, default=str)))


def _read_readbacks(run_dir: Path) -> list[tuple[str, dict]]:
    out = []
    for path in sorted((run_dir / "readbacks").glob("*.json")) if (run_dir / "readbacks").is_dir() else []:
        try:
            out.append((path.name, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError):
            out.append((path.name, {"unreadable": True}))
    return out


def _inputs_given(request: RunRequest) -> bool:
    return request.model is not None and request.checkpoint is not None


def dry_run_document(request: RunRequest, plan: dict) -> dict:
    """What ``--dry-run`` prints: the plan and the manifest fields known before anything starts."""
    env_job = dict(plan["ray_job"]["runtime_env"]["env_vars"])
    run_dir = str(request.workspace.resolve() / E.RUNS_DIR / plan["run_id"])
    return {
        "schema": schema_id("run-dry-run"),
        "status": "planned",
        "run_dir": run_dir,
        "runtime": request.runtime,
        "plan": plan,
        "manifest_preview": {
            "run_id": plan["run_id"], "arm": plan["arm"]["name"], "arm_sha256": sha256_of_document(plan["arm"]),
            "stack": {"name": request.arm.stack.name, "sha256": request.arm.stack.sha256},
            "commands": {"train": plan["command"]["argv"], "entrypoint_appended": plan["command"]["entrypoint_appended"]},
            "environment": {"job": record_job(env_job)},
            "input_mounts": (input_mounts(vime_input_files(request)) if request.arm.engine == "vime" and
                             _inputs_given(request) else None),
            "determined_at_run_time": ["observed_identity", "image", "host", "gpus", "ray_cluster", "inputs",
                                       "repository", "created_at"],
        },
    }
