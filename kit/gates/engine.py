"""Gates as data: load a versioned gate set (``kit/gates/sets/<name>.v<N>.json``, schema gate-set/v1)
and apply it to a run's evidence.

Each gate names a rule kind (:data:`kit.gates.rules.RULES`), its parameters, a message and when it
applies (:data:`kit.gates.rules.CONDITIONS`). Changing a threshold is one edit in one data file,
with a new version when the meaning changes: the version is recorded in validation.json and the
seal, and two verdicts are comparable only under one version. Example::

    report = evaluate(RunEvidence(arm=arm_doc, job_status="SUCCEEDED", engine_lines=lines), run_id="r1")
    report["gate_set_version"], report["passed"]        # ('rlk-kit-gates/2', True)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from kit.gates.rules import CONDITIONS, RULES, RunEvidence, summarize
from kit.model.documents import parse_json_bytes, require_valid, schema_id
from kit.model.errors import BadInput

DEFAULT_SET = "rlk-kit-gates.v2.json"
REPORT_SCHEMA = schema_id("validation-report")


@dataclass(frozen=True)
class Gate:
    id: str
    rule: str
    parameters: dict
    message: str                                   # what passing means, in one line
    applies: str = "always"                        # a CONDITIONS name

    @property
    def applies_when(self) -> str:
        return CONDITIONS[self.applies][1]

    def check(self, ev: RunEvidence) -> list[str]:
        return RULES[self.rule](ev, self.parameters)


@dataclass(frozen=True)
class GateSet:
    version: str
    gates: tuple[Gate, ...]
    source: str


def gate_set_from_document(doc: dict, source: str) -> GateSet:
    """A validated gate set; an unknown rule, condition or a repeated id is bad input naming the gate."""
    require_valid(doc, source, "gate-set")
    seen = set()
    for i, g in enumerate(doc["gates"]):
        if g["id"] in seen:
            raise BadInput(f"{source}: /gates/{i}/id: {g['id']!r} appears twice; gate ids are unique")
        seen.add(g["id"])
    gates = tuple(Gate(g["id"], g["rule"], dict(g["parameters"]), g["message"], g["applies"]) for g in doc["gates"])
    return GateSet(doc["version"], gates, source)


@lru_cache(maxsize=None)
def shipped_gate_set(name: str = DEFAULT_SET) -> GateSet:
    ref = resources.files("kit.gates").joinpath("sets", name)
    return gate_set_from_document(parse_json_bytes(ref.read_bytes(), f"kit/gates/sets/{name}"), f"kit/gates/sets/{name}")


DEFAULT = shipped_gate_set()
GATE_SET_VERSION = DEFAULT.version
GATES = DEFAULT.gates


def evaluate(ev: RunEvidence, *, run_id: str, gates: tuple[Gate, ...] | None = None,
             gate_set: GateSet | None = None) -> dict:
    """Apply every gate; the report (validation-report/v1) lists each with its status and problems."""
    gate_set = gate_set or DEFAULT
    results = []
    for gate in gates if gates is not None else gate_set.gates:
        if not CONDITIONS[gate.applies][0](ev):
            results.append({"id": gate.id, "message": gate.message, "status": "not_applicable",
                            "applies_when": gate.applies_when, "problems": []})
            continue
        try:
            problems = gate.check(ev)
        except Exception as exc:  # a gate that cannot read its evidence fails; it never passes silently
            problems = [f"{type(exc).__name__}: {exc}"]
        results.append({"id": gate.id, "message": gate.message, "status": "failed" if problems else "passed",
                        "applies_when": gate.applies_when, "problems": [str(p) for p in problems]})
    return {
        "schema": REPORT_SCHEMA,
        "gate_set_version": gate_set.version,
        "run_id": run_id,
        "arm": ev.arm["name"],
        "passed": all(r["status"] != "failed" for r in results),
        "gates": results,
        "summary": summarize(ev),
    }

