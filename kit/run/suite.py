"""Suite: the module matrix M000..M111 run arm by arm through ``kit run``, with per-module attribution.

The pure part turns the catalog's module matrix into eight run specs, reads each run's mismatch
totals, and builds the attribution table and the ``rlk-kit/suite-summary/v1`` document. The shell
part (:func:`run_module_suite`) runs every arm through :func:`kit.run.execute` — the code path of
``kit run`` — so each arm gets the same manifest, gates and seal as a hand-started run, in
``<workspace>/runs/<suite-id>-<arm lower>/``. Everything that could make the suite bad input (the
suite id, the eight run ids, the stack, the runtime and its inputs — Docker engine and image, Ray
address —, a dirty checkout) is checked before the suite directory ``<workspace>/suites/<suite-id>/``
is created, so a refused suite leaves nothing behind.
A failing arm is recorded and the next one runs; Ctrl-C stops the suite after the current arm
stopped and writes the partial summary marked interrupted. Example::

    plan = plan_module_suite(SuiteRequest(suite_id="t1", rollouts=2, stack="smoke", workspace=Path(".workspace")))
    summary, code = run_module_suite(plan)
    summary["attribution"]["findings"]      # ['no module alone makes the mismatch vanish: ...', ...]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from kit.model.documents import write_new_document
from kit.model.engine_traits import traits
from kit.model.errors import BadInput, KitError
from kit.evidence.bundle import utc_now
import re
from kit.analysis.convergence import round_rows, run_identity, summarize
from kit.analysis.table import load_arm
from kit.gates.rules import whole_number
from kit.evidence import bundle as E
from kit.model.catalog import Catalog
from kit.run.request import RunRequest, check_request
from kit.run.logs import SignalFlag
from kit.run.execute import execute
from kit.runtimes import make_runtime
from kit.run.manifest import repository_state
from kit.run.attribution import MATRIX_NAME, MODULE_ORDER, MODULES, summary_document

SUITES_DIR = "suites"
SUMMARY_FILE = "summary.json"
ID_RE_TEXT = "[A-Za-z0-9][A-Za-z0-9._-]*"
RUNTIMES = ("local", "docker", "ray")


# --- the matrix --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MatrixBase:
    """One base arm of the module matrix: its generated arms are ``prefix + M<a><f><l>``."""

    arm: str
    prefix: str
    stack: str
    engine: str

    def arm_name(self, code: str) -> str:
        return f"{self.prefix}{code}"

    def runnable_on(self, runtime: str) -> bool:
        # the local runtime only has the embedded smoke workload; images and clusters run every engine
        return runtime != "local" or traits(self.engine).runs_on_host


@dataclass(frozen=True)
class SuiteArm:
    code: str            # M100
    arm: object          # kit.arm.Arm
    run_id: str          # <suite-id>-<arm lower>

    @property
    def name(self) -> str:
        return self.arm.name


@dataclass(frozen=True)
class SuiteRequest:
    suite_id: str
    rollouts: int
    workspace: Path
    stack: str | None = None
    runtime: str | None = None
    image: str | None = None
    ray_address: str | None = None
    allow_dirty: bool = False
    sign_key: Path | None = None


@dataclass(frozen=True)
class SuitePlan:
    request: SuiteRequest
    base: MatrixBase
    runtime: str
    specs: tuple[SuiteArm, ...]
    stack_name: str
    stack_sha256: str
    matrix: dict = field(hash=False, compare=False)
    matrix_source: str = ""
    image: str | None = None        # docker: the image every arm runs in, resolved once (its id pins it)
    image_id: str | None = None

    @property
    def workspace(self) -> Path:
        return self.request.workspace.resolve()

    @property
    def suite_dir(self) -> Path:
        return self.workspace / SUITES_DIR / self.request.suite_id


def matrix_bases(catalog, matrix_name: str = MATRIX_NAME) -> list[MatrixBase]:
    """The bases of the catalog's module matrix whose base arm exists, with their stack and engine."""
    entry = catalog.matrix_docs.get(matrix_name)
    if entry is None:
        raise BadInput(f"no arm matrix named {matrix_name!r} in {catalog.directory} (expected manifests/module-matrix.json)")
    out = []
    for base in entry[0].get("bases", []):
        doc = catalog.arm_docs.get(base["arm"])
        if doc is None:
            continue
        out.append(MatrixBase(base["arm"], base["prefix"], doc[0]["stack"]["name"], doc[0]["engine"]))
    return out


def _describe_bases(bases: list[MatrixBase]) -> str:
    return "; ".join(f"--stack {b.stack} ({b.arm_name('M000')}..{b.arm_name('M111')}, {b.engine} engine"
                     f"{', local, docker or ray runtime' if b.runnable_on('local') else ', docker or ray runtime'})" for b in bases)


def select_base(bases: list[MatrixBase], stack: str | None, runtime: str | None) -> tuple[MatrixBase, str]:
    """The matrix base and runtime a suite runs on.

    ``--stack`` picks the base whose arm uses that stack. Without it, the base is the only one the
    chosen runtime can run (``--runtime local`` → the smoke stack); otherwise ``--stack`` is required,
    because a default would silently choose between a CPU smoke suite and an 8-GPU VIME one. The
    runtime defaults as in ``kit run``: local for smoke arms, docker for the others.

    >>> b = [MatrixBase("consistency", "", "vime-current", "vime"), MatrixBase("smoke", "smoke-", "smoke", "smoke")]
    >>> select_base(b, None, "local")[0].arm
    'smoke'
    """
    if not bases:
        raise BadInput("the module matrix has no base arm in the catalog (manifests/module-matrix.json 'bases')")
    if stack is not None:
        chosen = [b for b in bases if b.stack == stack]
        if not chosen:
            raise BadInput(f"--stack {stack}: no module-matrix base uses this stack; accepted: {_describe_bases(bases)}")
        if len(chosen) > 1:
            raise BadInput(f"--stack {stack}: several module-matrix bases use it ({', '.join(b.arm for b in chosen)}); "
                           "the matrix must name one base per stack")
        base = chosen[0]
    else:
        if runtime is None:
            raise BadInput(f"--stack is required (or --runtime local, which runs only the smoke stack); accepted: "
                           f"{_describe_bases(bases)}")
        chosen = [b for b in bases if b.runnable_on(runtime)]
        if len(chosen) != 1:
            raise BadInput(f"--stack is required: {len(chosen)} module-matrix bases run on --runtime {runtime}; "
                           f"accepted: {_describe_bases(chosen or bases)}")
        base = chosen[0]
    runtime = runtime or ("local" if traits(base.engine).runs_on_host else "docker")
    if not base.runnable_on(runtime):
        raise BadInput(f"--runtime {runtime}: stack {base.stack} runs {base.engine} arms, whose engines exist only in "
                       f"its image; use --runtime docker or --runtime ray")
    return base, runtime


def run_id_for(suite_id: str, arm_name: str) -> str:
    """``run_id_for("t1", "smoke-M100") == "t1-smoke-m100"``: the suite id and the arm, nothing else."""
    return f"{suite_id}-{arm_name.lower()}"


def module_specs(catalog, base: MatrixBase, suite_id: str) -> tuple[SuiteArm, ...]:
    return tuple(SuiteArm(code, catalog.arm(base.arm_name(code), flag=None), run_id_for(suite_id, base.arm_name(code)))
                 for code in MODULE_ORDER)


def module_bits(operators: dict) -> str:
    """``{"attention": "R/R", "ffn": "P/P", "logp": "P/P"} → "100"``; other cases are not in the matrix."""
    out = ""
    for module in MODULES:
        case = operators[module]
        if case not in ("P/P", "R/R"):
            raise ValueError(f"{module}: {case} is not a module-matrix case (P/P or R/R)")
        out += "1" if case == "R/R" else "0"
    return out


# --- figures of one run ------------------------------------------------------------------------------

def run_figures(run_dir: Path) -> dict | None:
    """Mismatch totals and mean step time of a run dir, through the analysis reader.

    VIME logs the mismatch count and the compared-token count as per-sample means, so each step's
    totals are those means × the global batch size (reference §4.2); the totals sum over steps.
    None when the run left no step records.
    """

    try:
        arm = load_arm(run_dir)
    except KitError:
        return None
    rows = round_rows(arm, run_identity(arm, phase="suite"))
    s = summarize(rows, "suite", arm.name, 1)
    mismatch = s["bitwise_mismatch_count"]
    return {
        "steps": len(rows),
        "bitwise_mismatch_count": whole_number(mismatch),
        "active_tokens": whole_number(s["active_token_exposure"]),
        "mismatch_rate": s["bitwise_mismatch_rate"],
        "max_abs_dlogp": s["max_abs_dlogp"],
        "mean_step_time_s": s["step_time_mean"],
    }


# --- one arm's entry ---------------------------------------------------------------------------------



def arm_entry(spec: SuiteArm, *, outcome=None, error: str | None = None, figures: dict | None = None,
              elapsed_s: float | None = None, verdict: str | None = None) -> dict:
    """The summary's record of one arm, from kit run's outcome, or the error that prevented one."""
    validation = getattr(outcome, "validation", None) or {}
    failed_gates = [g["id"] for g in validation.get("gates", []) if g["status"] == "failed"]
    if verdict is None:
        if outcome is None:
            verdict = "failed"
        elif outcome.status == "interrupted":
            verdict = "interrupted"
        elif outcome.status == "succeeded" and validation.get("passed") and outcome.sealed:
            verdict = "passed"
        elif outcome.status == "succeeded":
            verdict = "gates_failed"
        else:
            verdict = "failed"
    reason = error
    if reason is None and outcome is not None and verdict != "passed":
        reason = outcome.message or (f"gates failed: {', '.join(failed_gates)}" if failed_gates else outcome.status)
    run_dir = getattr(outcome, "run_dir", None)
    return {
        "arm": spec.name,
        "code": spec.code,
        "operators": {m: spec.arm.operators[m] for m in MODULES},
        "run_id": spec.run_id,
        "verdict": verdict,
        "reason": reason,
        "run_status": getattr(outcome, "status", None),
        "job_status": getattr(outcome, "job_status", None),
        "gates_passed": validation.get("passed"),
        "failed_gates": failed_gates,
        "sealed": bool(outcome is not None and outcome.sealed),
        "seal_root_sha256": outcome.seal.get("root_sha256") if outcome is not None and outcome.sealed else None,
        "run_dir": str(run_dir) if run_dir else None,
        "elapsed_s": round(elapsed_s, 3) if elapsed_s is not None else None,
        "figures": figures,
    }


# --- shell ---------------------------------------------------------------------------------------------

def plan_module_suite(request: SuiteRequest, catalog=None) -> SuitePlan:
    """Every check that makes a suite bad input, before anything is written."""


    if not re.fullmatch(ID_RE_TEXT, request.suite_id or ""):
        raise BadInput(f"--suite-id {request.suite_id!r}: must match {ID_RE_TEXT} (it prefixes the run ids)")
    if not isinstance(request.rollouts, int) or isinstance(request.rollouts, bool) or request.rollouts < 1:
        raise BadInput(f"--rollouts {request.rollouts!r}: must be a positive integer")
    if request.runtime is not None and request.runtime not in RUNTIMES:
        raise BadInput(f"--runtime {request.runtime}: accepted: {', '.join(RUNTIMES)}")
    if request.runtime == "ray" and not request.ray_address:
        raise BadInput("--runtime ray needs --ray-address (the cluster's dashboard URL, e.g. http://head:8265)")
    catalog = catalog or Catalog.default()
    base, runtime = select_base(matrix_bases(catalog), request.stack, request.runtime)
    specs = module_specs(catalog, base, request.suite_id)
    matrix, source = catalog.matrix_docs[MATRIX_NAME]
    workspace = request.workspace.resolve()
    suite_dir = workspace / SUITES_DIR / request.suite_id
    if suite_dir.exists():
        raise BadInput(f"--suite-id {request.suite_id}: {suite_dir} already exists; suite ids are never reused, "
                       "pick a new one")
    if workspace.exists():
        for spec in specs:
            used = E.run_id_in_use(workspace, spec.run_id)
            if used:
                raise BadInput(f"--suite-id {request.suite_id}: arm {spec.name}'s run id {spec.run_id} is already used "
                               f"in this workspace ({used}); run ids are never reused, pick a new suite id")
    if not request.allow_dirty:

        repo = repository_state()
        if repo.get("dirty"):
            shown = ", ".join(line[3:] for line in repo["status"][:5])
            raise BadInput(f"refusing a suite from a dirty kit checkout ({repo['root']}: {len(repo['status'])} changed "
                           f"paths, e.g. {shown}); commit them, or pass --allow-dirty for a development suite")
    if request.sign_key is not None:     # once, before any arm (each arm's run would refuse it again)
        E.load_private_key(request.sign_key)
    stacks = {(s.arm.stack.name, s.arm.stack.sha256) for s in specs}
    if len(stacks) != 1:
        raise BadInput(f"module matrix on {base.arm}: its arms name different stacks {sorted(stacks)}")
    (stack_name, stack_sha), = stacks

    # kit run's own flag checks (--image without --runtime docker, ...): refused here, not eight times
    check_request(_run_request(request, runtime, workspace, specs[0]))
    image, image_id = check_runtime_inputs(request, runtime, specs[0])
    return SuitePlan(request, base, runtime, specs, stack_name, stack_sha, matrix, source, image, image_id)


def check_runtime_inputs(request: SuiteRequest, runtime: str, spec: SuiteArm) -> tuple[str | None, str | None]:
    """The runtime's input checks that hold for all eight arms, made once with the runtime's own code:
    docker: the engine answers, the image is present (``--image``, else the runtime's choice by stack
    label) and built for the stack; ray: the address is a dashboard URL that answers. Each arm's
    preflight still proves the live identity. Returns docker's ``(image ref, image id)``.

    Once and here, because inside the arms an absent image or a dead cluster fails all eight (for Ray
    after eight waits) only after the suite dir exists, using up the suite id.
    """
    arm = spec.arm
    if runtime == "docker":
        # the run's own preflight step for the image: the same choice, the same checks, the same words as kit run
        docker = make_runtime("docker", arm=arm, image=request.image, workspace=request.workspace, run_id=spec.run_id)
        image_id = docker.resolve_image()
        return docker.image_ref, image_id
    if runtime == "ray":
        # the run's own preflight step for a named cluster: the same check and the same words as kit run
        make_runtime("ray", arm=arm, ray_address=request.ray_address, run_id=spec.run_id).reach()
    return None, None


def _run_request(request: SuiteRequest, runtime: str, workspace: Path, spec: SuiteArm, image: str | None = None):
    """The kit run request of one arm: every arm goes through the same path as a hand-started run."""

    return RunRequest(arm=spec.arm, workspace=workspace, runtime=runtime, image=image or request.image,
                      ray_address=request.ray_address, run_id=spec.run_id, rollouts=request.rollouts,
                      allow_dirty=request.allow_dirty, sign_key=request.sign_key)


def run_module_suite(plan: SuitePlan, *, progress: TextIO | None = None, log: Callable[[str], None] = lambda s: None,
                     before_arm: Callable[[SuiteArm], None] | None = None) -> tuple[dict, int]:
    """Run the eight arms in order through kit run's path; write summary.json; return it and the exit code.

    ``before_arm`` is called just before each arm starts (progress reporting; tests use it to
    make an arm fail for real).
    """

    req = plan.request
    plan.suite_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        plan.suite_dir.mkdir()      # exclusive: two suites with one id cannot both start
    except FileExistsError:
        raise BadInput(f"--suite-id {req.suite_id}: {plan.suite_dir} already exists; suite ids are never reused, "
                       "pick a new one") from None
    started_at, started = utc_now(), time.monotonic()
    arms: list[dict] = []
    interrupted = False
    with SignalFlag() as stop:  # between arms; during an arm kit run's own handler stops the job
        for index, spec in enumerate(plan.specs):
            if stop.received is not None or interrupted:
                interrupted = True
                arms.append(arm_entry(spec, verdict="not_run", error="the suite was interrupted before this arm"))
                continue
            log(f"suite {req.suite_id}: arm {index + 1}/{len(plan.specs)} {spec.name} → run {spec.run_id}")
            if before_arm is not None:
                before_arm(spec)
            t0 = time.monotonic()
            outcome, error = None, None
            try:
                outcome = execute(_run_request(req, plan.runtime, plan.workspace, spec, plan.image_id),
                                  progress=progress, log=lambda s, n=spec.name: log(f"{n}: {s}"))
            except KeyboardInterrupt:
                interrupted, error = True, "interrupted"
            except KitError as exc:            # refused by kit run (run id taken meanwhile, image missing, ...)
                error = str(exc)
            except Exception as exc:  # noqa: BLE001 -- a broken arm must not take the other seven with it
                error = f"{type(exc).__name__}: {exc}"
            figures = run_figures(outcome.run_dir) if outcome is not None and outcome.run_dir else None
            entry = arm_entry(spec, outcome=outcome, error=error, figures=figures, elapsed_s=time.monotonic() - t0,
                              verdict="interrupted" if interrupted and outcome is None else None)
            arms.append(entry)
            if entry["verdict"] == "interrupted" or stop.received is not None:
                interrupted = True
            log(f"suite {req.suite_id}: {spec.name} {entry['verdict']}"
                + (f" ({entry['reason']})" if entry["reason"] else ""))
        summary = summary_document(plan, arms, started_at=started_at, finished_at=utc_now(), interrupted=interrupted,
                                   elapsed_s=time.monotonic() - started)
        write_new_document(plan.suite_dir / SUMMARY_FILE, summary, expected="suite-summary")
    return summary, summary["exit_code"]
