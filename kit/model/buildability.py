"""Buildability: pins known not to build together, refused when a stack is planned or verified.

The rules are data (``buildability.v1.json`` beside this module: id, kind, condition, message, what
would be accepted, evidence); this module is the small engine that applies them to a resolved stack.
Example::

    findings = buildability_findings(stack_doc, "cuda")
    findings[0].rule      # "te-torch-symm-mem-header"
    findings[0].text()    # "buildability te-torch-symm-mem-header: Transformer Engine 2.18.0's … accepted: …"
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kit.model.errors import BadInput
from kit.model.lock import accelerator_of, cuda_major
from kit.model.stack import packages_for

RULES_FILE = Path(__file__).with_name("buildability.v1.json")
_CLAUSE_RE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")
_KINDS = ("versions", "cuda-major")


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str
    accept: str
    evidence: str
    stack_note: str | None = None

    def text(self) -> str:
        out = f"buildability {self.rule}: {self.message}; accepted: {self.accept} (evidence: {self.evidence})"
        return out + (f". {self.stack_note}" if self.stack_note else "")

    def to_json(self) -> dict:
        return {"rule": self.rule, "message": self.message, "accept": self.accept, "evidence": self.evidence,
                "stack_note": self.stack_note}


def release(version: str) -> tuple[int, ...]:
    """``release("2.9.1+cu128") == (2, 9, 1)``: the release numbers; a local or pre-release tail is ignored."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def in_range(version: str, spec: str) -> bool:
    """``in_range("2.18.0", ">=2.18.0,<2.19")`` is True; every comma-separated clause must hold."""
    v = release(version)
    ok = {">=": lambda c: c >= 0, ">": lambda c: c > 0, "<=": lambda c: c <= 0, "<": lambda c: c < 0,
          "==": lambda c: c == 0, "!=": lambda c: c != 0}
    for clause in spec.split(","):
        m = _CLAUSE_RE.match(clause)
        if not m:
            raise BadInput(f"{RULES_FILE}: range {spec!r}: clause {clause!r} is not OP VERSION "
                           "(accepted ops: >=, >, <=, <, ==, !=)")
        if not ok[m.group(1)](_cmp(v, release(m.group(2)))):
            return False
    return True


@lru_cache(maxsize=4)
def load_rules(path: str = str(RULES_FILE)) -> tuple[dict, ...]:
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != "rlk-kit/buildability-rules/v1":
        raise BadInput(f"{path}: /schema must be \"rlk-kit/buildability-rules/v1\"")
    for i, rule in enumerate(doc.get("rules", [])):
        missing = [k for k in ("id", "kind", "message", "accept", "evidence") if k not in rule]
        if missing or rule.get("kind") not in _KINDS:
            raise BadInput(f"{path}: /rules/{i} needs id, kind ({', '.join(_KINDS)}), message, accept, evidence; "
                           f"missing {', '.join(missing) or 'a known kind'}")
    return tuple(doc.get("rules", []))


def _fill(text: str, values: dict) -> str:
    return re.sub(r"\{([a-z0-9_.-]+)\}", lambda m: str(values.get(m.group(1), m.group(0))), text)


def _apply(rule: dict, stack_doc: dict, platform: str) -> list[Finding]:
    packages = packages_for(stack_doc, platform)
    note = (rule.get("stacks") or {}).get(stack_doc.get("name"))
    if rule["kind"] == "versions":
        when = rule.get("when") or {}
        if not when or any(name not in packages or not in_range(packages[name], spec) for name, spec in when.items()):
            return []
        return [Finding(rule["id"], _fill(rule["message"], packages), _fill(rule["accept"], packages),
                        rule["evidence"], note)]
    accel = accelerator_of(stack_doc, platform)
    if accel.get("kind") != "cuda" or "version" not in accel:
        return []
    want = int(accel["version"].split(".")[0])
    out = []
    for name, version in sorted(packages.items()):
        major, why = cuda_major(name, version)
        if major is not None and major != want:
            values = {"package": name, "version": version, "major": major, "why": why,
                      "platform_cuda": accel["version"], "platform_major": want}
            out.append(Finding(rule["id"], _fill(rule["message"], values), _fill(rule["accept"], values),
                               rule["evidence"], note))
    return out


def buildability_findings(stack_doc: dict, platform: str | None = None) -> list[Finding]:
    """The known-incompatible pins of a resolved stack on ``platform`` (every platform it names when None)."""
    platforms = [platform] if platform else sorted(stack_doc.get("platforms", {}))
    seen: dict[str, Finding] = {}
    for p in platforms:
        for rule in load_rules():
            if rule.get("platforms") and p not in rule["platforms"]:
                continue
            for f in _apply(rule, stack_doc, p):
                seen.setdefault(f.text(), f)
    return list(seen.values())
