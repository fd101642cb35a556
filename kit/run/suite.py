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

from kit.model.documents import schema_id, sha256_of_document, write_new_document
from kit.model.errors import BadInput, CheckFailed, KitError
from kit.evidence.bundle import utc_now

MODULES = ("attention", "ffn", "logp")
# reference §1.3: the pipeline order of the module suite
MODULE_ORDER = ("M000", "M100", "M010", "M001", "M110", "M101", "M011", "M111")
MATRIX_NAME = "module"
SUITES_DIR = "suites"
SUMMARY_FILE = "summary.json"
SUMMARY_SCHEMA = schema_id("suite-summary")
ID_RE_TEXT = "[A-Za-z0-9][A-Za-z0-9._-]*"
INTERRUPTED_EXIT = 130
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
        return runtime != "local" or self.engine == "smoke"


@dataclass(frozen=True)
class ArmSpec:
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
    specs: tuple[ArmSpec, ...]
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
    runtime = runtime or ("local" if base.engine == "smoke" else "docker")
    if not base.runnable_on(runtime):
        raise BadInput(f"--runtime {runtime}: stack {base.stack} runs {base.engine} arms, whose engines exist only in "
                       f"its image; use --runtime docker or --runtime ray")
    return base, runtime


def run_id_for(suite_id: str, arm_name: str) -> str:
    """``run_id_for("t1", "smoke-M100") == "t1-smoke-m100"``: the suite id and the arm, nothing else."""
    return f"{suite_id}-{arm_name.lower()}"


def module_specs(catalog, base: MatrixBase, suite_id: str) -> tuple[ArmSpec, ...]:
    return tuple(ArmSpec(code, catalog.arm(base.arm_name(code), flag=None), run_id_for(suite_id, base.arm_name(code)))
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
    from kit.analysis.convergence import round_rows, run_identity, summarize
    from kit.analysis.table import load_arm
    from kit.gates.rules import whole_number

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

VERDICTS = ("passed", "gates_failed", "failed", "interrupted", "not_run")


def arm_entry(spec: ArmSpec, *, outcome=None, error: str | None = None, figures: dict | None = None,
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


# --- attribution -------------------------------------------------------------------------------------

def _total(entry: dict | None):
    return ((entry or {}).get("figures") or {}).get("bitwise_mismatch_count")


def attribution(arms: list[dict]) -> dict:
    """Per module: mismatch totals of its R/R and P/P arms, and its marginal effect P/P → R/R in each
    of the four pairs that hold the other two modules fixed; plus which modules alone make the
    mismatch vanish and whether the all-R/R arm is exactly zero.

    >>> arms = [{"code": c, "arm": c, "figures": {"bitwise_mismatch_count": 0 if c == "M111" else 5,
    ...          "max_abs_dlogp": 0.0 if c == "M111" else 1e-6}} for c in MODULE_ORDER]
    >>> attribution(arms)["modules"][0]["pairs"][3]["delta"]
    -5
    """
    by_code = {a["code"]: a for a in arms}
    modules = []
    for index, module in enumerate(MODULES):
        pairs = []
        for code in MODULE_ORDER:
            if code[1 + index] != "0":
                continue
            to_code = code[:1 + index] + "1" + code[2 + index:]
            src, dst = _total(by_code.get(code)), _total(by_code.get(to_code))
            pairs.append({"from": code, "to": to_code,
                          "from_arm": (by_code.get(code) or {}).get("arm"), "to_arm": (by_code.get(to_code) or {}).get("arm"),
                          "from_total": src, "to_total": dst,
                          "delta": (dst - src) if src is not None and dst is not None else None})
        rr = [c for c in MODULE_ORDER if c[1 + index] == "1"]
        pp = [c for c in MODULE_ORDER if c[1 + index] == "0"]
        rr_totals, pp_totals = [_total(by_code.get(c)) for c in rr], [_total(by_code.get(c)) for c in pp]
        deltas = [p["delta"] for p in pairs]
        alone = "M" + "".join("1" if i == index else "0" for i in range(3))
        alone_total = _total(by_code.get(alone))
        modules.append({
            "module": module,
            "rr_arms": rr, "pp_arms": pp,
            "rr_total": sum(rr_totals) if None not in rr_totals else None,
            "pp_total": sum(pp_totals) if None not in pp_totals else None,
            "pairs": pairs,
            "mean_marginal_effect": (sum(deltas) / len(deltas)) if None not in deltas else None,
            "alone_arm": alone,
            "alone_total": alone_total,
            "alone_makes_zero": (alone_total == 0) if alone_total is not None else None,
            # the mismatch is nonzero in every arm that leaves this module P/P
            "needed_for_zero": all(t != 0 for t in pp_totals) if None not in pp_totals else None,
        })
    zero_arms = [c for c in MODULE_ORDER if _total(by_code.get(c)) == 0]
    top = by_code.get("M111") or {}
    top_fig = top.get("figures") or {}
    exactly_zero = None
    if top_fig.get("bitwise_mismatch_count") is not None:
        exactly_zero = top_fig["bitwise_mismatch_count"] == 0 and top_fig.get("max_abs_dlogp") in (0, 0.0)
    out = {"modules": modules,
           "alone_make_zero": [m["module"] for m in modules if m["alone_makes_zero"]],
           "zero_arms": zero_arms,
           "all_rr_arm": "M111",
           "all_rr_exactly_zero": exactly_zero}
    out["findings"] = findings(out, by_code)
    return out


def findings(table: dict, by_code: dict) -> list[str]:
    """The attribution in plain sentences."""
    out = []
    name = lambda code: (by_code.get(code) or {}).get("arm") or code
    mods = table["modules"]
    if any(m["alone_makes_zero"] is None for m in mods):
        missing = [m["alone_arm"] for m in mods if m["alone_makes_zero"] is None]
        out.append(f"single-module attribution incomplete: no mismatch total for {', '.join(name(c) for c in missing)}")
    alone = table["alone_make_zero"]
    if alone:
        out.append("switching only " + " or only ".join(alone) + " to R/R makes the mismatch vanish ("
                   + ", ".join(f"{name(m['alone_arm'])}: 0" for m in mods if m["alone_makes_zero"]) + ")")
    elif all(m["alone_makes_zero"] is not None for m in mods):
        out.append("no module alone makes the mismatch vanish ("
                   + ", ".join(f"{name(m['alone_arm'])}: {m['alone_total']}" for m in mods) + " bitwise mismatches)")
    needed = [m["module"] for m in mods if m["needed_for_zero"]]
    if needed and table["zero_arms"]:
        out.append(f"zero mismatch needs {' and '.join(needed)} R/R: every arm leaving "
                   f"{'it' if len(needed) == 1 else 'one of them'} P/P mismatches")
    for m in mods:
        if m["mean_marginal_effect"] is not None:
            out.append(f"{m['module']} P/P → R/R changes the mismatch total by {m['mean_marginal_effect']:+g} on average "
                       f"over its four pairs (R/R arms {m['rr_total']}, P/P arms {m['pp_total']})")
    top = by_code.get("M111") or {}
    fig = top.get("figures") or {}
    if table["all_rr_exactly_zero"] is True:
        out.append(f"{name('M111')} is exactly zero: 0 bitwise mismatches over {fig.get('active_tokens')} active tokens, "
                   "max |Δlogp| 0")
    elif table["all_rr_exactly_zero"] is False:
        out.append(f"{name('M111')} is NOT zero: {fig.get('bitwise_mismatch_count')} bitwise mismatches, "
                   f"max |Δlogp| {fig.get('max_abs_dlogp')}")
    else:
        out.append(f"{name('M111')} has no mismatch total ({top.get('verdict', 'not run')}); whether it is zero is unknown")
    return out


# --- the summary document ---------------------------------------------------------------------------

def exit_code_for(arms: list[dict], interrupted: bool) -> int:
    if interrupted:
        return INTERRUPTED_EXIT
    return 0 if arms and all(a["verdict"] == "passed" for a in arms) else 1


def summary_document(plan: SuitePlan, arms: list[dict], *, started_at: str, finished_at: str, interrupted: bool,
                     elapsed_s: float) -> dict:
    code = exit_code_for(arms, interrupted)
    counts = {v: sum(1 for a in arms if a["verdict"] == v) for v in VERDICTS}
    req = plan.request
    return {
        "schema": SUMMARY_SCHEMA,
        "suite_id": req.suite_id,
        "kind": "module",
        "status": "interrupted" if interrupted else "complete",
        "interrupted": interrupted,
        "exit_code": code,
        "matrix": {"name": MATRIX_NAME, "source": plan.matrix_source, "sha256": sha256_of_document(plan.matrix),
                   "base_arm": plan.base.arm, "order": list(MODULE_ORDER)},
        "stack": {"name": plan.stack_name, "sha256": plan.stack_sha256},
        "runtime": {"kind": plan.runtime, "image": plan.image, "ray_address": req.ray_address},
        "rollouts": req.rollouts,
        "workspace": str(plan.workspace),
        "suite_dir": str(plan.suite_dir),
        "started_at": started_at,
        "finished_at": finished_at,
        "elapsed_s": round(elapsed_s, 3),
        "counts": counts,
        "arms": arms,
        "attribution": attribution(arms),
    }


def _fmt(value, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def render_table(summary: dict) -> str:
    """The readable form of a summary: arms, attribution, findings."""
    lines = [f"suite {summary['suite_id']}: module matrix on stack {summary['stack']['name']} "
             f"({summary['stack']['sha256'][:12]}), runtime {summary['runtime']['kind']}, "
             f"{summary['rollouts']} rollouts per arm"
             + (" — INTERRUPTED" if summary["interrupted"] else "")]
    head = ("arm", "attn", "ffn", "logp", "verdict", "mismatches", "tokens", "max|Δlogp|", "step s", "run dir / reason")
    rows = []
    for a in summary["arms"]:
        f = a["figures"] or {}
        rows.append((a["arm"], a["operators"]["attention"], a["operators"]["ffn"], a["operators"]["logp"],
                     a["verdict"] + (" (sealed)" if a["sealed"] and a["verdict"] != "passed" else ""),
                     _fmt(f.get("bitwise_mismatch_count")), _fmt(f.get("active_tokens")),
                     _fmt(f.get("max_abs_dlogp"), ".3g"), _fmt(f.get("mean_step_time_s"), ".3f"),
                     a["run_dir"] if a["verdict"] == "passed" else (a["reason"] or "-")))
    lines += _columns(head, rows)
    lines.append("")
    lines.append("attribution (bitwise mismatch totals; Δ = total after switching the module P/P → R/R, others fixed)")
    att = summary["attribution"]
    head = ("module", "P/P arms", "R/R arms", "pair 1", "pair 2", "pair 3", "pair 4", "mean Δ", "alone")
    rows = []
    for m in att["modules"]:
        pairs = [f"{p['from']}→{p['to']} {_fmt(p['delta'], '+g') if p['delta'] is not None else '-'}" for p in m["pairs"]]
        alone = {True: "zero", False: "nonzero", None: "-"}[m["alone_makes_zero"]]
        rows.append((m["module"], _fmt(m["pp_total"]), _fmt(m["rr_total"]), *pairs,
                     _fmt(m["mean_marginal_effect"], "+g"), f"{m['alone_arm']} {alone}"))
    lines += _columns(head, rows)
    lines.append("")
    lines += [f"- {text}" for text in att["findings"]]
    return "\n".join(lines)


def _columns(head, rows) -> list[str]:
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip()
    return [fmt(head)] + [fmt(r) for r in rows]


# --- shell ---------------------------------------------------------------------------------------------

def plan_module_suite(request: SuiteRequest, catalog=None) -> SuitePlan:
    """Every check that makes a suite bad input, before anything is written."""
    import re

    from kit.evidence import bundle as E
    from kit.model.catalog import Catalog

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
        from kit.run.execute import repository_state

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
    from kit.run.execute import check_request

    # kit run's own flag checks (--image without --runtime docker, ...): refused here, not eight times
    check_request(_run_request(request, runtime, workspace, specs[0]))
    image, image_id = check_runtime_inputs(request, runtime, specs[0])
    return SuitePlan(request, base, runtime, specs, stack_name, stack_sha, matrix, source, image, image_id)


def check_runtime_inputs(request: SuiteRequest, runtime: str, spec: ArmSpec) -> tuple[str | None, str | None]:
    """The runtime's input checks that hold for all eight arms, made once with the runtime's own code:
    docker: the engine answers, the image is present (``--image``, else the runtime's choice by stack
    label) and built for the stack; ray: the address is a dashboard URL that answers. Each arm's
    preflight still proves the live identity. Returns docker's ``(image ref, image id)``.

    Once and here, because inside the arms an absent image or a dead cluster fails all eight (for Ray
    after eight waits) only after the suite dir exists, using up the suite id.
    """
    arm = spec.arm
    if runtime == "docker":
        from kit.build.images import check_image, engine
        from kit.runtimes.docker import DockerRuntime

        client = engine()
        ref = request.image or DockerRuntime.image_for_arm(client, arm)
        try:
            check = check_image(ref, arm.stack, client=client)
        except BadInput:
            if not request.image:
                raise
            # absent: name the flag it came from and what would be accepted
            raise BadInput(f"--image {ref}: not on this engine; build the stack's image with `kit build "
                           f"{arm.platform} --arm {arm.name}`, or leave --image out to use it") from None
        if not check.matches:
            shown = "; ".join(f"{label}: expected {exp!r}, found {got!r}" for label, exp, got in check.differences[:12])
            raise CheckFailed(f"{'--image' if request.image else 'image'} {ref}: not built for stack {arm.stack.name} "
                              f"({arm.stack.sha256[:12]}); differing labels: {shown}")
        return ref, check.image_id
    if runtime == "ray":
        from kit.runtimes import NAMED_CLUSTER_TIMEOUT_S, wait_for_jobs_api
        from kit.runtimes.ray import RayRuntime

        address = RayRuntime(arm=arm, ray_address=request.ray_address, run_id=spec.run_id).address
        wait_for_jobs_api(address, timeout_s=NAMED_CLUSTER_TIMEOUT_S, unreachable=lambda m: BadInput(
            f"--ray-address {address}: cannot be reached ({m}); give the dashboard URL of a running cluster"))
    return None, None


def _run_request(request: SuiteRequest, runtime: str, workspace: Path, spec: ArmSpec, image: str | None = None):
    """The kit run request of one arm: every arm goes through the same path as a hand-started run."""
    from kit.run.execute import RunRequest

    return RunRequest(arm=spec.arm, workspace=workspace, runtime=runtime, image=image or request.image,
                      ray_address=request.ray_address, run_id=spec.run_id, rollouts=request.rollouts,
                      allow_dirty=request.allow_dirty, sign_key=request.sign_key)


def run_module_suite(plan: SuitePlan, *, progress: TextIO | None = None, log: Callable[[str], None] = lambda s: None,
                     before_arm: Callable[[ArmSpec], None] | None = None) -> tuple[dict, int]:
    """Run the eight arms in order through kit run's path; write summary.json; return it and the exit code.

    ``before_arm`` is called just before each arm starts (progress reporting; tests use it to
    make an arm fail for real).
    """
    from kit.run.execute import SignalFlag, execute

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
