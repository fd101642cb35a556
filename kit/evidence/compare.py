"""Comparability: every difference between two arms (or runs), declared factor or uncontrolled.

Two arms are a controlled comparison when every field that differs is covered by a factor that
one of them declares in ``comparison`` naming the other. Example::

    result = compare_arms(catalog.arm("G10"), catalog.arm("G11"))
    result.controlled                 # False
    [d.path for d in result.uncontrolled]
    # ['attention_backend', 'stack.packages.transformer-engine', 'stack.sources.rl-kernel.commit', ...]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kit.evidence import bundle as E
from kit.model.buildability import buildability_findings
from kit.evidence.audit import verify_run_dir
from kit.evidence.pinning import PINNED, SAME_HOST, run_identity
from kit.model.arm import Arm, production_of
from kit.model.documents import read_json_file
from kit.model.engine_traits import TRAITS, traits
from kit.model.errors import BadInput, KitError
from kit.model.stack import stack_identity

# Fields that name or describe an arm, or are compared through the stack's content instead.
ARM_FIELDS_NOT_COMPARED = ("schema", "name", "description", "comparison", "stack")
# List-valued fields whose items are keyed by a name, so a diff names the item, not an index.
KEYED_LISTS = {"sources": "name"}

DECLARED = "declared"
UNCONTROLLED = "uncontrolled"
COMPARISON_SCHEMA = "rlk-kit/comparison/v4"
GATE_SET_PATH = "validation.gate_set_version"


@dataclass(frozen=True)
class Difference:
    path: str
    a: Any
    b: Any
    status: str       # "declared" | "uncontrolled"

    def to_json(self) -> dict:
        return {"path": self.path, "a": self.a, "b": self.b, "status": self.status}


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    differences: tuple[Difference, ...]
    declared_factors: tuple[str, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    # runs that are no evidence to compare (not completed and sealed): {"run", "status", "sealed", "reason"}
    not_comparable: tuple[dict, ...] = field(default_factory=tuple)
    # runs: each run dir re-verified now: {"run", "verified", "trust", "gate_set_version", "problems"}
    evidence: tuple[dict, ...] = field(default_factory=tuple)
    # runs: each run's identity against its stack's lock: {"run", "stack", "pinned", "reasons"}; () for arms
    identity: tuple[dict, ...] = field(default_factory=tuple)

    @property
    def uncontrolled(self) -> list[Difference]:
        return [d for d in self.differences if d.status == UNCONTROLLED]

    @property
    def controlled(self) -> bool:
        return not self.uncontrolled and not self.not_comparable

    @property
    def provenance(self) -> str | None:
        """``pinned`` when both runs ran their stack's lock, ``same-host`` when either did not; None for arms."""
        if not self.identity:
            return None
        return PINNED if all(r["pinned"] for r in self.identity) else SAME_HOST

    def scope(self) -> str:
        """What the verdict is evidence about, in one line (empty for arms)."""
        if self.provenance is None:
            return ""
        stacks = ", ".join(dict.fromkeys(r["stack"] for r in self.identity))
        if self.provenance == PINNED:
            return f"pinned: both runs ran the lock of stack {stacks} (image built from it, probe equal to it)"
        return (f"same-host: evidence about these two runs on this host, not about stack {stacks} "
                "(not both ran its pinned lock)")

    def to_json(self) -> dict:
        return {
            "schema": COMPARISON_SCHEMA,
            "a": self.a,
            "b": self.b,
            "controlled": self.controlled,
            "declared_factors": list(self.declared_factors),
            "differences": [d.to_json() for d in self.differences],
            "not_comparable": [dict(n) for n in self.not_comparable],
            "evidence": [dict(e) for e in self.evidence],
            "notes": list(self.notes),
            "provenance": self.provenance,
            "scope": self.scope() or None,
            "identity": [dict(r, reasons=list(r["reasons"])) for r in self.identity],
        }


_MISSING = "<absent>"


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaf paths of a document: dicts by key, keyed lists by item name, other lists whole."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = {}
        for key, sub in value.items():
            out.update(flatten(sub, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list) and prefix.rsplit(".", 1)[-1] in KEYED_LISTS and all(isinstance(v, dict) for v in value):
        key = KEYED_LISTS[prefix.rsplit(".", 1)[-1]]
        for item in value:
            out.update(flatten({k: v for k, v in item.items() if k != key}, f"{prefix}.{item.get(key)}"))
    else:
        out[prefix] = value
    return out


def covered(path: str, factors: tuple[str, ...]) -> bool:
    return any(path == f or path.startswith(f + ".") for f in factors)


def classify(flat_a: dict, flat_b: dict, factors: tuple[str, ...]) -> list[Difference]:
    out = []
    for path in sorted(set(flat_a) | set(flat_b)):
        va, vb = flat_a.get(path, _MISSING), flat_b.get(path, _MISSING)
        if va != vb or type(va) is not type(vb):
            out.append(Difference(path, va, vb, DECLARED if covered(path, factors) else UNCONTROLLED))
    return out


def declared_between(doc_a: dict, doc_b: dict) -> tuple[tuple[str, ...], list[str]]:
    """Factors either arm declares for a comparison with the other, and notes on what is missing."""
    factors: list[str] = []
    notes = []
    for this, other in ((doc_a, doc_b), (doc_b, doc_a)):
        decl = this.get("comparison")
        if decl and decl["with"] == other["name"]:
            factors += [f for f in decl["factors"] if f not in factors]
    if not factors and doc_a["name"] == doc_b["name"]:
        notes.append(f"both are arm {doc_a['name']}: every difference is uncontrolled")
    elif not factors:
        notes.append(f"neither {doc_a['name']} nor {doc_b['name']} declares a comparison with the other; "
                     "every difference is uncontrolled")
    return tuple(factors), notes


def _with_production(view: dict, doc: dict) -> dict:
    """An arm of an engine with a production choice but without ``production`` (before arm/v5) runs the
    eager formula: compared as "eager"."""
    if doc.get("engine") in TRAITS and traits(doc["engine"]).production_choice:
        view["production"] = production_of(doc)
    return view


def arm_view(arm: Arm) -> dict:
    """The fields of an arm that define the experiment, with the resolved stack content under 'stack'."""
    view = _with_production({k: v for k, v in arm.document.items() if k not in ARM_FIELDS_NOT_COMPARED}, arm.document)
    view["stack"] = arm.stack.identity
    return view


def compare_arms(a: Arm, b: Arm) -> Comparison:
    factors, notes = declared_between(a.document, b.document)
    # what an audit of a published arm should say: software that ran but cannot be built again from source
    for arm in (a, b):
        for finding in buildability_findings(arm.stack.document, arm.platform):
            notes = [*notes, f"{arm.name}: stack {arm.stack.name} is not rebuildable from source: {finding.text()}"]
    diffs = classify(flatten(arm_view(a)), flatten(arm_view(b)), factors)
    return Comparison(a.name, b.name, tuple(diffs), factors, tuple(notes))


# --- runs ------------------------------------------------------------------------------------------

# Observed-identity fields that change from one run to the next without any software changing.
RUN_VOLATILE_KEYS = frozenset({
    "hostname", "host", "timestamp", "time", "created_at", "started_at", "finished_at", "observed_at", "probed_at",
    "pid", "node_id", "node_ip", "ip", "address", "uptime", "boot_id", "container_id", "run_id", "run_dir",
})
# Paths (in the run view) that name where software sits, not what it is: the interpreter of one venv is
# reached through different paths (a Ray worker resolves symlinks that the shell keeps); its version and
# implementation are compared.
RUN_VOLATILE_PATHS = frozenset({"observed.python.executable"})
# Distributions that a Ray worker has on sys.path in addition to the environment's own: the ray wheel
# vendors them in ray/thirdparty_files and prepends that directory for its workers. A probe that ran as
# a Ray task lists them in its freeze; the same environment probed outside Ray does not.
RAY_RUNTIME_ONLY_PACKAGES = frozenset({"psutil", "colorama", "setproctitle"})
FREEZE_PREFIX = "observed.freeze."
# Probe fields that some probes do not measure (the per-node probe on a Ray cluster runs without the
# conformance check). Absent on one side is "not measured", not a difference; two values are compared.
MEASURED_ONLY_SOMETIMES = frozenset({"observed.conformance_fingerprint"})


def _without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items() if k not in RUN_VOLATILE_KEYS}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


def freeze_versions(freeze: list) -> dict[str, str]:
    """``["Name==1.0", ...]`` as ``{"name": "1.0"}`` (names lower-cased), so a diff names the package."""
    out = {}
    for entry in freeze:
        name, sep, version = str(entry).partition("==")
        out[name.strip().lower()] = version.strip() if sep else str(entry)
    return out


def run_view(manifest: dict) -> dict:
    """What defines a run for comparison: the arm's experiment fields, the stack content, the image id
    and the observed identity (volatile fields such as hostnames and times removed; the package freeze
    keyed by package name)."""

    arm = manifest["arm"]
    view = _with_production({k: v for k, v in arm.items() if k not in ARM_FIELDS_NOT_COMPARED}, arm)
    view["stack"] = stack_identity(manifest["stack"]["document"])
    image = manifest.get("image") or {}
    view["image"] = {"id": image.get("id")}
    lock = manifest.get("lock")   # run-manifest/v2: a different lock, different software, however installed
    view["lock"] = {"sha256": lock.get("sha256") if isinstance(lock, dict) else None}
    observed = _without_volatile(manifest.get("observed_identity") or {})
    if isinstance(observed.get("freeze"), list):
        observed["freeze"] = freeze_versions(observed["freeze"])
    view["observed"] = observed
    return view


def probed_under_ray(manifest: dict) -> bool:
    """Whether the recorded identity came from a probe that ran as a Ray task (ray runtime, local Ray head)
    rather than in a plain process (in-process local run, ``kit probe`` exec'd in a container)."""
    runtime = manifest.get("runtime") or {}
    return runtime.get("kind") == "ray" or runtime.get("ray_head") is True


def runtime_only(diff: Difference, manifest_a: dict, manifest_b: dict) -> str | None:
    """Why a difference is not a software difference of the workload, or None when it may be one.

    Only a package that Ray itself puts on a worker's path, present in the freeze of the run probed under
    Ray and absent from the other's, which was not: any other freeze difference (another package, another
    version of a vendored one, both or neither run under Ray) stays uncontrolled."""
    if not diff.path.startswith(FREEZE_PREFIX):
        return None
    name = diff.path[len(FREEZE_PREFIX):]
    if name not in RAY_RUNTIME_ONLY_PACKAGES:
        return None
    ray_a, ray_b = probed_under_ray(manifest_a), probed_under_ray(manifest_b)
    if ray_a == ray_b:
        return None
    in_ray, outside = (diff.a, diff.b) if ray_a else (diff.b, diff.a)
    if outside != _MISSING or in_ray == _MISSING:
        return None
    return (f"{diff.path} = {in_ray} only in the run probed as a Ray task: the ray wheel vendors {name} for its "
            "workers (ray/thirdparty_files); not part of the environment both runs share")


def compare_run_manifests(manifest_a: dict, manifest_b: dict) -> Comparison:
    """Every difference between two runs, declared factor or uncontrolled.

    Factors come from the arms' ``comparison`` declarations. When a factor names the stack, the image
    and the observed identity are expected to differ with it and are covered too. The interpreter's path
    is volatile, and a package that only Ray's workers carry is explained in a note (see
    :func:`runtime_only`). Example::

        result = compare_run_manifests(read_manifest(a), read_manifest(b))
        [d.path for d in result.uncontrolled]     # e.g. ['observed.packages.torch']
    """
    arm_a, arm_b = manifest_a["arm"], manifest_b["arm"]
    factors, notes = declared_between(arm_a, arm_b)
    if any(f == "stack" or f.startswith("stack.") for f in factors):
        factors = tuple(factors) + ("image", "lock", "observed")
        notes.append("the stack is a declared factor, so the image id, the lock and the observed identity may differ with it")
    diffs = []
    for d in classify(flatten(run_view(manifest_a)), flatten(run_view(manifest_b)), tuple(factors)):
        if d.path in RUN_VOLATILE_PATHS:
            continue
        if d.path in MEASURED_ONLY_SOMETIMES and _MISSING in (d.a, d.b):
            side = "B" if d.b == _MISSING else "A"
            notes.append(f"{d.path}: not measured by run {side}'s probe (the per-node probe on Ray skips the "
                         "conformance check); not compared")
            continue
        why = runtime_only(d, manifest_a, manifest_b) if d.status == UNCONTROLLED else None
        if why:
            notes.append(why)
            continue
        diffs.append(d)
    return Comparison(manifest_a["run_id"], manifest_b["run_id"], tuple(diffs), tuple(factors), tuple(notes),
                      identity=(run_identity(manifest_a), run_identity(manifest_b)))


def run_standing(run_dir: Path) -> dict | None:
    """Why a run dir is no comparable evidence, or None when its run succeeded, passed its gates and
    was sealed.

    An interrupted, failed, detached or unsealed run holds partial evidence, and a run sealed with
    failed gates holds evidence its own checks refused: a comparison with either is never a
    controlled one (``kit analyze`` holds runs to the same rule through ``kit verify``). Example::

        run_standing(Path("ws/runs/stop-me"))
        # {"run": "ws/runs/stop-me", "status": "interrupted", "sealed": False, "reason": "ws/runs/stop-me: status ..."}
    """
    run_dir = Path(run_dir)
    try:
        doc = read_json_file(run_dir / E.STATUS)
        status = doc.get("status") if isinstance(doc, dict) and isinstance(doc.get("status"), str) else None
    except KitError:
        status = None
    sealed = E.is_sealed(run_dir)
    gates_passed = None
    if sealed:
        try:
            seal = read_json_file(run_dir / E.SEAL)
            gates_passed = seal.get("validation_passed") if isinstance(seal, dict) else None
        except KitError:
            gates_passed = None
    if status == "succeeded" and sealed and gates_passed is True:
        return None
    if status is None:
        why = f"no readable {E.STATUS} with a status: the run did not finish"
    elif status != "succeeded":
        why = f"status {status}" + ("" if sealed else ", not sealed")
    elif not sealed:
        why = f"status succeeded but not sealed (no {E.SEAL})"
    else:
        why = f"sealed with failed gates (see its {E.VALIDATION})"
    return {"run": str(run_dir), "status": status, "sealed": sealed,
            "reason": f"{run_dir}: {why}; only a run that succeeded, passed its gates and was sealed is "
                      "comparable evidence"}


def gate_set_of(run_dir: Path) -> str | None:
    """The gate-set version a sealed run was judged by (its seal's), or None when unsealed or unreadable."""
    try:
        seal = read_json_file(Path(run_dir) / E.SEAL)
    except KitError:
        return None
    version = seal.get("gate_set_version") if isinstance(seal, dict) else None
    return version if isinstance(version, str) else None


def run_evidence(run_dir: Path, *, public_key: Path | None = None, require_signature: bool = False) -> dict:
    """``kit verify`` of one run dir, now: every artifact re-hashed, the seal cross-checked, its trust level."""
    verdict = verify_run_dir(Path(run_dir), public_key, require_signature=require_signature or public_key is not None)
    return {"run": str(run_dir), "verified": verdict.status == "ok", "trust": verdict.trust or "unsigned",
            "gate_set_version": gate_set_of(run_dir),
            "problems": [f"{p or '/'}: {m}" for p, m in verdict.problems]}


def gate_set_difference(evidence: tuple[dict, dict], accept: bool) -> Difference | None:
    """Two verdicts are comparable only under one gate set; a different one is uncontrolled unless accepted."""
    ga, gb = (e["gate_set_version"] for e in evidence)
    if None in (ga, gb) or ga == gb:       # an unsealed run is already not comparable, for its standing
        return None
    return Difference(GATE_SET_PATH, ga, gb, DECLARED if accept else UNCONTROLLED)


def compare_run_dirs(a: Path, b: Path, *, public_key: Path | None = None, require_signature: bool = False,
                     accept_gate_sets: bool = False) -> Comparison:
    """:func:`compare_run_manifests` over two run dirs, not controlled unless both runs succeeded, were
    sealed and verify now (re-hashed here, under the ``--key``/``--require-signature`` policy), and
    were judged by the same gate set (or ``accept_gate_sets``). Example::

        compare_run_dirs(Path("ws/runs/r1"), Path("ws/runs/r2")).controlled
    """
    manifests = []
    for label, run_dir in (("A", a), ("B", b)):
        try:
            manifests.append(E.read_manifest(Path(run_dir)))
        except BadInput as exc:
            raise BadInput(f"argument {label}: {exc}") from None
    result = compare_run_manifests(*manifests)
    evidence = (run_evidence(a, public_key=public_key, require_signature=require_signature),
                run_evidence(b, public_key=public_key, require_signature=require_signature))
    standing = []
    for run_dir, ev in zip((a, b), evidence):
        found = run_standing(Path(run_dir))
        if found is None and not ev["verified"]:
            listed = "; ".join(ev["problems"][:3]) + (f"; and {len(ev['problems']) - 3} more" if len(ev["problems"]) > 3 else "")
            found = {"run": str(run_dir), "status": "succeeded", "sealed": True,
                     "reason": f"{run_dir}: kit verify fails ({listed}); its seal vouches for nothing"}
        if found:
            standing.append(found)
    diffs = list(result.differences)
    notes = list(result.notes)
    gates = gate_set_difference(evidence, accept_gate_sets)
    if gates:
        diffs.append(gates)
        notes.append(f"judged by different gate sets ({gates.a} vs {gates.b}): "
                     + ("accepted with --accept-gate-sets" if accept_gate_sets else
                        "their verdicts are not comparable (pass --accept-gate-sets to accept it)"))
    notes += [f"{ev['run']}: evidence {ev['trust']}" for ev in evidence]
    identity = tuple(dict(r, run=str(d)) for r, d in zip(result.identity, (a, b)))
    return replace(result, a=str(a), b=str(b), differences=tuple(diffs), notes=tuple(notes),
                   not_comparable=tuple(standing), evidence=evidence, identity=identity)
